/* jinja_parse_expr: the expression half of the parser (jinja_parse.c holds the statements):
 * recursive descent over jinja_lex's tokens, one function per precedence level of jinja2's
 * parser.py (3.1), so that operator precedence matches. */
#include "engine/text/jinja_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SYNTAX(p, line, ...) jinja_parse_fail(p, JINJA_ERR_SYNTAX, line, __VA_ARGS__)

static struct jinja_expr *new_expr(struct jinja_parser *p, enum jinja_expr_kind k, int line) {
    struct jinja_expr *e = jinja_parse_alloc(p, sizeof *e);
    e->kind = k;
    e->line = line;
    return e;
}

static struct jinja_expr *parse_or(struct jinja_parser *p);
static struct jinja_expr *parse_unary(struct jinja_parser *p, bool with_filter);
static struct jinja_expr *parse_primary(struct jinja_parser *p);
static struct jinja_expr *parse_postfix(struct jinja_parser *p, struct jinja_expr *node);
static struct jinja_expr *parse_filter_expr(struct jinja_parser *p, struct jinja_expr *node);

static bool is_tuple_end(const struct jinja_parser *p, const char *extra_end) {
    const struct jinja_tok *t = jinja_peek(p);
    if (t->t == JTK_VAR_END || t->t == JTK_BLOCK_END || jinja_tok_is_op(t, ")")) return true;
    return extra_end && jinja_tok_is_name(t, extra_end);
}

/* parser.py parse_tuple: an expression, or a tuple when commas follow. */
struct jinja_expr *jinja_parse_tuple(struct jinja_parser *p, bool with_condexpr,
                                     bool explicit_parens, const char *extra_end) {
    int line = jinja_peek(p)->line;
    struct jinja_parse_vec items = {0};
    bool is_tuple = false;
    for (;;) {
        if (items.n) jinja_expect_op(p, ",");
        if (is_tuple_end(p, extra_end)) break;
        jinja_parse_push(p, &items, jinja_parse_expression(p, with_condexpr));
        if (jinja_is_op(p, ","))
            is_tuple = true;
        else
            break;
    }
    if (!is_tuple) {
        if (items.n) return items.v[0];
        if (!explicit_parens) jinja_unexpected(p, "an expression");
    }
    struct jinja_expr *e = new_expr(p, JE_TUPLE, line);
    e->list.n = items.n;
    e->list.v = (struct jinja_expr **)items.v;
    return e;
}

static struct jinja_expr *parse_condexpr(struct jinja_parser *p) {
    jinja_parse_enter(p);
    struct jinja_expr *e1 = parse_or(p);
    while (jinja_is_name(p, "if")) {
        int line = jinja_advance(p)->line;
        struct jinja_expr *e = new_expr(p, JE_COND, line);
        e->cond.then = e1;
        e->cond.cond = parse_or(p);
        if (jinja_skip_name(p, "else")) e->cond.els = parse_condexpr(p);
        e1 = e;
    }
    p->depth--;
    return e1;
}

struct jinja_expr *jinja_parse_expression(struct jinja_parser *p, bool with_condexpr) {
    return with_condexpr ? parse_condexpr(p) : parse_or(p);
}

static struct jinja_expr *binary(struct jinja_parser *p, enum jinja_expr_kind k, int op, int line,
                                 struct jinja_expr *a, struct jinja_expr *b) {
    struct jinja_expr *e = new_expr(p, k, line);
    e->bin.op = (enum jinja_binop)op;
    e->bin.a = a;
    e->bin.b = b;
    return e;
}

static struct jinja_expr *parse_not(struct jinja_parser *p);
static struct jinja_expr *parse_and(struct jinja_parser *p) {
    struct jinja_expr *l = parse_not(p);
    while (jinja_is_name(p, "and")) {
        int line = jinja_advance(p)->line;
        l = binary(p, JE_AND, 0, line, l, parse_not(p));
    }
    return l;
}

static struct jinja_expr *parse_or(struct jinja_parser *p) {
    struct jinja_expr *l = parse_and(p);
    while (jinja_is_name(p, "or")) {
        int line = jinja_advance(p)->line;
        l = binary(p, JE_OR, 0, line, l, parse_and(p));
    }
    return l;
}

static struct jinja_expr *parse_math1(struct jinja_parser *p);
static struct jinja_expr *parse_compare(struct jinja_parser *p) {
    int line = jinja_peek(p)->line;
    struct jinja_expr *first = parse_math1(p);
    struct jinja_parse_vec rest = {0};
    enum jinja_cmpop ops[64];
    int n = 0;
    for (;;) {
        enum jinja_cmpop op;
        if (jinja_is_op(p, "=="))
            op = JC_EQ;
        else if (jinja_is_op(p, "!="))
            op = JC_NE;
        else if (jinja_is_op(p, "<"))
            op = JC_LT;
        else if (jinja_is_op(p, "<="))
            op = JC_LE;
        else if (jinja_is_op(p, ">"))
            op = JC_GT;
        else if (jinja_is_op(p, ">="))
            op = JC_GE;
        else if (jinja_is_name(p, "in"))
            op = JC_IN;
        else if (jinja_is_name(p, "not") && jinja_tok_is_name(jinja_peek_at(p, 1), "in")) {
            jinja_advance(p);
            op = JC_NOTIN;
        } else
            break;
        jinja_advance(p);
        if (n == 64) SYNTAX(p, line, "comparison chain too long");
        ops[n++] = op;
        jinja_parse_push(p, &rest, parse_math1(p));
    }
    if (n == 0) return first;
    struct jinja_expr *e = new_expr(p, JE_CMP, line);
    e->cmp.n = n;
    e->cmp.first = first;
    e->cmp.ops = jinja_parse_alloc(p, (size_t)n * sizeof *e->cmp.ops);
    memcpy(e->cmp.ops, ops, (size_t)n * sizeof *ops);
    e->cmp.rest = (struct jinja_expr **)rest.v;
    return e;
}

static struct jinja_expr *parse_not(struct jinja_parser *p) {
    if (jinja_is_name(p, "not")) {
        int line = jinja_advance(p)->line;
        jinja_parse_enter(p);
        struct jinja_expr *e = new_expr(p, JE_NOT, line);
        e->un = parse_not(p);
        p->depth--;
        return e;
    }
    return parse_compare(p);
}

static struct jinja_expr *parse_pow(struct jinja_parser *p) {
    struct jinja_expr *l = parse_unary(p, true);
    while (jinja_is_op(p, "**")) {
        int line = jinja_advance(p)->line;
        l = binary(p, JE_BIN, JB_POW, line, l, parse_unary(p, true));
    }
    return l;
}

static struct jinja_expr *parse_math2(struct jinja_parser *p) {
    struct jinja_expr *l = parse_pow(p);
    for (;;) {
        int op;
        if (jinja_is_op(p, "*"))
            op = JB_MUL;
        else if (jinja_is_op(p, "/"))
            op = JB_DIV;
        else if (jinja_is_op(p, "//"))
            op = JB_FLOORDIV;
        else if (jinja_is_op(p, "%"))
            op = JB_MOD;
        else
            break;
        int line = jinja_advance(p)->line;
        l = binary(p, JE_BIN, op, line, l, parse_pow(p));
    }
    return l;
}

static struct jinja_expr *parse_concat(struct jinja_parser *p) {
    struct jinja_expr *l = parse_math2(p);
    while (jinja_is_op(p, "~")) {
        int line = jinja_advance(p)->line;
        l = binary(p, JE_BIN, JB_CONCAT, line, l, parse_math2(p));
    }
    return l;
}

static struct jinja_expr *parse_math1(struct jinja_parser *p) {
    struct jinja_expr *l = parse_concat(p);
    for (;;) {
        int op;
        if (jinja_is_op(p, "+"))
            op = JB_ADD;
        else if (jinja_is_op(p, "-"))
            op = JB_SUB;
        else
            break;
        int line = jinja_advance(p)->line;
        l = binary(p, JE_BIN, op, line, l, parse_concat(p));
    }
    return l;
}

static struct jinja_expr *parse_unary(struct jinja_parser *p, bool with_filter) {
    jinja_parse_enter(p);
    struct jinja_expr *node;
    if (jinja_is_op(p, "-") || jinja_is_op(p, "+")) {
        const struct jinja_tok *t = jinja_advance(p);
        node = new_expr(p, *t->p == '-' ? JE_NEG : JE_POS, t->line);
        node->un = parse_unary(p, false);
    } else {
        node = parse_primary(p);
    }
    node = parse_postfix(p, node);
    if (with_filter) node = parse_filter_expr(p, node);
    p->depth--;
    return node;
}

static struct jinja_expr *konst(struct jinja_parser *p, struct jv v, int line) {
    struct jinja_expr *e = new_expr(p, JE_CONST, line);
    e->konst = v;
    return e;
}

static struct jinja_expr *parse_primary(struct jinja_parser *p) {
    const struct jinja_tok *t = jinja_peek(p);
    int line = t->line;
    if (t->t == JTK_NAME) {
        jinja_advance(p);
        if (jinja_tok_is_name(t, "true") || jinja_tok_is_name(t, "True"))
            return konst(p, jv_bool(true), line);
        if (jinja_tok_is_name(t, "false") || jinja_tok_is_name(t, "False"))
            return konst(p, jv_bool(false), line);
        if (jinja_tok_is_name(t, "none") || jinja_tok_is_name(t, "None"))
            return konst(p, jv_none(), line);
        struct jinja_expr *e = new_expr(p, JE_NAME, line);
        e->name = jinja_parse_strdup(p, t->p, t->n);
        return e;
    }
    if (t->t == JTK_STRING) {
        // adjacent literals concatenate: "a" "b"
        size_t total = 0, k = 0;
        while (jinja_peek_at(p, k)->t == JTK_STRING) total += jinja_peek_at(p, k++)->n;
        char *s = jinja_parse_alloc(p, total + 1);
        size_t off = 0;
        while (jinja_peek(p)->t == JTK_STRING) {
            const struct jinja_tok *st = jinja_advance(p);
            memcpy(s + off, st->p, st->n);
            off += st->n;
        }
        return konst(p, jv_str(s, total), line);
    }
    if (t->t == JTK_INT) {
        jinja_advance(p);
        return konst(p, jv_int(t->i), line);
    }
    if (t->t == JTK_FLOAT) {
        jinja_advance(p);
        return konst(p, jv_float(t->f), line);
    }
    if (jinja_tok_is_op(t, "(")) {
        jinja_advance(p);
        struct jinja_expr *e = jinja_parse_tuple(p, true, true, NULL);
        jinja_expect_op(p, ")");
        return e;
    }
    if (jinja_tok_is_op(t, "[")) {
        jinja_advance(p);
        struct jinja_parse_vec items = {0};
        while (!jinja_is_op(p, "]")) {
            if (items.n) jinja_expect_op(p, ",");
            if (jinja_is_op(p, "]")) break;
            jinja_parse_push(p, &items, jinja_parse_expression(p, true));
        }
        jinja_expect_op(p, "]");
        struct jinja_expr *e = new_expr(p, JE_LIST, line);
        e->list.n = items.n;
        e->list.v = (struct jinja_expr **)items.v;
        return e;
    }
    if (jinja_tok_is_op(t, "{")) {
        jinja_advance(p);
        struct jinja_parse_vec keys = {0}, vals = {0};
        while (!jinja_is_op(p, "}")) {
            if (keys.n) jinja_expect_op(p, ",");
            if (jinja_is_op(p, "}")) break;
            jinja_parse_push(p, &keys, jinja_parse_expression(p, true));
            jinja_expect_op(p, ":");
            jinja_parse_push(p, &vals, jinja_parse_expression(p, true));
        }
        jinja_expect_op(p, "}");
        struct jinja_expr *e = new_expr(p, JE_DICT, line);
        e->dict.n = keys.n;
        e->dict.k = (struct jinja_expr **)keys.v;
        e->dict.v = (struct jinja_expr **)vals.v;
        return e;
    }
    jinja_unexpected(p, "an expression");
}

static void parse_call_args(struct jinja_parser *p, struct jinja_args *a) {
    jinja_expect_op(p, "(");
    struct jinja_parse_vec pos = {0}, kw = {0}, kwv = {0};
    bool first = true;
    while (!jinja_is_op(p, ")")) {
        if (!first) {
            jinja_expect_op(p, ",");
            if (jinja_is_op(p, ")")) break;
        }
        first = false;
        if (jinja_is_op(p, "*") || jinja_is_op(p, "**"))
            SYNTAX(p, jinja_peek(p)->line, "*args and **kwargs in calls are not supported");
        if (jinja_peek(p)->t == JTK_NAME && jinja_tok_is_op(jinja_peek_at(p, 1), "=")) {
            const char *name = jinja_expect_name(p);
            jinja_advance(p);
            jinja_parse_push(p, &kw, (void *)name);
            jinja_parse_push(p, &kwv, jinja_parse_expression(p, true));
        } else {
            if (kw.n)
                SYNTAX(p, jinja_peek(p)->line, "positional argument follows keyword argument");
            jinja_parse_push(p, &pos, jinja_parse_expression(p, true));
        }
    }
    jinja_expect_op(p, ")");
    a->n = pos.n;
    a->pos = (struct jinja_expr **)pos.v;
    a->nkw = kw.n;
    a->kw = (const char **)kw.v;
    a->kwv = (struct jinja_expr **)kwv.v;
}

static struct jinja_expr *parse_subscribed(struct jinja_parser *p) {
    int line = jinja_peek(p)->line;
    struct jinja_expr *args[3] = {0};
    if (jinja_is_op(p, ":")) {
        jinja_advance(p);
    } else {
        struct jinja_expr *node = jinja_parse_expression(p, true);
        if (!jinja_is_op(p, ":")) return node;
        jinja_advance(p);
        args[0] = node;
    }
    if (!jinja_is_op(p, ":") && !jinja_is_op(p, "]") && !jinja_is_op(p, ","))
        args[1] = jinja_parse_expression(p, true);
    if (jinja_skip_op(p, ":"))
        if (!jinja_is_op(p, "]") && !jinja_is_op(p, ",")) args[2] = jinja_parse_expression(p, true);
    struct jinja_expr *e = new_expr(p, JE_SLICE, line);
    e->slice.start = args[0];
    e->slice.stop = args[1];
    e->slice.step = args[2];
    return e;
}

static struct jinja_expr *parse_postfix(struct jinja_parser *p, struct jinja_expr *node) {
    for (;;) {
        const struct jinja_tok *t = jinja_peek(p);
        if (jinja_tok_is_op(t, ".")) {
            jinja_advance(p);
            const struct jinja_tok *a = jinja_peek(p);
            if (a->t == JTK_NAME) {
                jinja_advance(p);
                struct jinja_expr *e = new_expr(p, JE_ATTR, t->line);
                e->attr.obj = node;
                e->attr.name = jinja_parse_strdup(p, a->p, a->n);
                node = e;
            } else if (a->t == JTK_INT) {
                jinja_advance(p);
                struct jinja_expr *e = new_expr(p, JE_ITEM, t->line);
                e->item.obj = node;
                e->item.index = konst(p, jv_int(a->i), a->line);
                node = e;
            } else {
                jinja_unexpected(p, "a name or number after '.'");
            }
        } else if (jinja_tok_is_op(t, "[")) {
            jinja_advance(p);
            struct jinja_parse_vec args = {0};
            while (!jinja_is_op(p, "]")) {
                if (args.n) jinja_expect_op(p, ",");
                if (jinja_is_op(p, "]")) break;
                jinja_parse_push(p, &args, parse_subscribed(p));
            }
            jinja_expect_op(p, "]");
            if (args.n == 0) SYNTAX(p, t->line, "empty subscript");
            struct jinja_expr *sub = args.v[0];
            if (args.n > 1) {
                for (int i = 0; i < args.n; i++)
                    if (((struct jinja_expr *)args.v[i])->kind == JE_SLICE)
                        SYNTAX(p, t->line, "slices inside a tuple subscript are not supported");
                sub = new_expr(p, JE_TUPLE, t->line);
                sub->list.n = args.n;
                sub->list.v = (struct jinja_expr **)args.v;
            }
            if (sub->kind == JE_SLICE) {
                sub->slice.obj = node;
                node = sub;
            } else {
                struct jinja_expr *e = new_expr(p, JE_ITEM, t->line);
                e->item.obj = node;
                e->item.index = sub;
                node = e;
            }
        } else if (jinja_tok_is_op(t, "(")) {
            struct jinja_expr *e = new_expr(p, JE_CALL, t->line);
            e->call.fn = node;
            parse_call_args(p, &e->call.args);
            node = e;
        } else {
            return node;
        }
    }
}

static const char *dotted_name(struct jinja_parser *p) {
    const char *name = jinja_expect_name(p);
    while (jinja_is_op(p, ".")) { // jinja allows dotted filter/test names
        jinja_advance(p);
        const char *more = jinja_expect_name(p);
        size_t a = strlen(name), b = strlen(more);
        char *s = jinja_parse_alloc(p, a + b + 2);
        memcpy(s, name, a);
        s[a] = '.';
        memcpy(s + a + 1, more, b);
        name = s;
    }
    return name;
}

static struct jinja_expr *parse_filter(struct jinja_parser *p, struct jinja_expr *node) {
    int line = jinja_peek(p)->line;
    struct jinja_expr *e = new_expr(p, JE_FILTER, line);
    e->ft.obj = node;
    e->ft.name = dotted_name(p);
    e->ft.filter = jinja_find_filter(e->ft.name);
    if (jinja_is_op(p, "(")) parse_call_args(p, &e->ft.args);
    return e;
}

static struct jinja_expr *parse_test(struct jinja_parser *p, struct jinja_expr *node) {
    int line = jinja_advance(p)->line; // 'is'
    struct jinja_expr *e = new_expr(p, JE_TEST, line);
    e->ft.obj = node;
    e->ft.negate = jinja_skip_name(p, "not");
    e->ft.name = dotted_name(p);
    e->ft.test = jinja_find_test(e->ft.name);
    const struct jinja_tok *t = jinja_peek(p);
    if (jinja_tok_is_op(t, "(")) {
        parse_call_args(p, &e->ft.args);
    } else if ((t->t == JTK_NAME || t->t == JTK_STRING || t->t == JTK_INT || t->t == JTK_FLOAT ||
                jinja_tok_is_op(t, "[") || jinja_tok_is_op(t, "{")) &&
               !jinja_tok_is_name(t, "else") && !jinja_tok_is_name(t, "or") &&
               !jinja_tok_is_name(t, "and")) {
        if (jinja_tok_is_name(t, "is"))
            SYNTAX(p, t->line, "you cannot chain multiple tests with is");
        struct jinja_expr *arg = parse_postfix(p, parse_primary(p));
        e->ft.args.n = 1;
        e->ft.args.pos = jinja_parse_alloc(p, sizeof *e->ft.args.pos);
        e->ft.args.pos[0] = arg;
    }
    return e;
}

static struct jinja_expr *parse_filter_expr(struct jinja_parser *p, struct jinja_expr *node) {
    for (;;) {
        if (jinja_is_op(p, "|")) {
            jinja_advance(p);
            node = parse_filter(p, node);
        } else if (jinja_is_name(p, "is")) {
            node = parse_test(p, node);
        } else if (jinja_is_op(p, "(")) {
            struct jinja_expr *e = new_expr(p, JE_CALL, jinja_peek(p)->line);
            e->call.fn = node;
            parse_call_args(p, &e->call.args);
            node = e;
        } else {
            return node;
        }
    }
}

/* The filter chain of {% filter a|b(x) %} or {% set x | a %}, applied to JE_BLOCK. */
struct jinja_expr *jinja_parse_block_filters(struct jinja_parser *p, int line) {
    struct jinja_expr *node = new_expr(p, JE_BLOCK, line);
    node = parse_filter(p, node);
    while (jinja_skip_op(p, "|")) node = parse_filter(p, node);
    return node;
}
