/* jinja_parse: recursive-descent parser over jinja_lex's tokens, following jinja2's
 * parser.py (3.1) so that operator precedence and statement forms match. */
#include "engine/text/jinja_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PARSE_MAX_DEPTH 200
#define SYNTAX(p, line, ...) jinja_parse_fail(p, JINJA_ERR_SYNTAX, line, __VA_ARGS__)

/* ---- parser: helpers ----------------------------------------------------------------- */

static const struct jinja_tok *peek(const struct jinja_parser *p) { return &p->toks[p->cur]; }
static const struct jinja_tok *peek_at(const struct jinja_parser *p, size_t k) {
    size_t i = p->cur + k;
    return &p->toks[i < p->ntok ? i : p->ntok - 1];
}
static const struct jinja_tok *advance(struct jinja_parser *p) {
    const struct jinja_tok *t = &p->toks[p->cur];
    if (t->t != JTK_EOF) p->cur++;
    return t;
}

static bool tok_is_op(const struct jinja_tok *t, const char *op) {
    return t->t == JTK_OP && t->n == strlen(op) && memcmp(t->p, op, t->n) == 0;
}
static bool tok_is_name(const struct jinja_tok *t, const char *name) {
    return t->t == JTK_NAME && t->n == strlen(name) && memcmp(t->p, name, t->n) == 0;
}
static bool is_op(const struct jinja_parser *p, const char *op) { return tok_is_op(peek(p), op); }
static bool is_name(const struct jinja_parser *p, const char *name) {
    return tok_is_name(peek(p), name);
}
static bool skip_op(struct jinja_parser *p, const char *op) {
    if (!is_op(p, op)) return false;
    advance(p);
    return true;
}
static bool skip_name(struct jinja_parser *p, const char *name) {
    if (!is_name(p, name)) return false;
    advance(p);
    return true;
}

static const char *describe(const struct jinja_tok *t, char *buf, size_t n) {
    switch (t->t) {
    case JTK_DATA: return "template data";
    case JTK_VAR_BEGIN: return "begin of print statement";
    case JTK_VAR_END: return "end of print statement";
    case JTK_BLOCK_BEGIN: return "begin of statement block";
    case JTK_BLOCK_END: return "end of statement block";
    case JTK_STRING: return "string";
    case JTK_INT: return "integer";
    case JTK_FLOAT: return "float";
    case JTK_EOF: return "end of template";
    default: snprintf(buf, n, "'%.*s'", (int)(t->n > 40 ? 40 : t->n), t->p); return buf;
    }
}

_Noreturn static void unexpected(struct jinja_parser *p, const char *wanted) {
    char b[64];
    const struct jinja_tok *t = peek(p);
    SYNTAX(p, t->line, "expected %s, got %s", wanted, describe(t, b, sizeof b));
}

static void expect_op(struct jinja_parser *p, const char *op) {
    if (skip_op(p, op)) return;
    char w[16];
    snprintf(w, sizeof w, "'%s'", op);
    unexpected(p, w);
}

static const char *expect_name(struct jinja_parser *p) {
    const struct jinja_tok *t = peek(p);
    if (t->t != JTK_NAME) unexpected(p, "a name");
    advance(p);
    return jinja_parse_strdup(p, t->p, t->n);
}

static void expect_block_end(struct jinja_parser *p) {
    if (peek(p)->t == JTK_BLOCK_END) {
        advance(p);
        return;
    }
    unexpected(p, "end of statement block");
}

static void enter(struct jinja_parser *p) {
    if (++p->depth > PARSE_MAX_DEPTH)
        SYNTAX(p, peek(p)->line, "template nested too deeply (more than %d levels)",
               PARSE_MAX_DEPTH);
}

static struct jinja_expr *new_expr(struct jinja_parser *p, enum jinja_expr_kind k, int line) {
    struct jinja_expr *e = jinja_parse_alloc(p, sizeof *e);
    e->kind = k;
    e->line = line;
    return e;
}

/* A growable array of pointers in the template arena. */
struct vec {
    void **v;
    int n, cap;
};

static void vec_push(struct jinja_parser *p, struct vec *v, void *x) {
    if (v->n == v->cap) {
        int cap = v->cap ? v->cap * 2 : 4;
        void **nv = jinja_parse_alloc(p, (size_t)cap * sizeof *nv);
        if (v->n) memcpy(nv, v->v, (size_t)v->n * sizeof *nv);
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = x;
}

/* ---- expressions --------------------------------------------------------------------- */

static struct jinja_expr *parse_expression(struct jinja_parser *p, bool with_condexpr);
static struct jinja_expr *parse_or(struct jinja_parser *p);
static struct jinja_expr *parse_unary(struct jinja_parser *p, bool with_filter);
static struct jinja_expr *parse_primary(struct jinja_parser *p);
static struct jinja_expr *parse_postfix(struct jinja_parser *p, struct jinja_expr *node);
static struct jinja_expr *parse_filter_expr(struct jinja_parser *p, struct jinja_expr *node);

static bool is_tuple_end(const struct jinja_parser *p, const char *extra_end) {
    const struct jinja_tok *t = peek(p);
    if (t->t == JTK_VAR_END || t->t == JTK_BLOCK_END || tok_is_op(t, ")")) return true;
    return extra_end && tok_is_name(t, extra_end);
}

/* parser.py parse_tuple: an expression, or a tuple when commas follow. */
static struct jinja_expr *parse_tuple(struct jinja_parser *p, bool with_condexpr,
                                      bool explicit_parens, const char *extra_end) {
    int line = peek(p)->line;
    struct vec items = {0};
    bool is_tuple = false;
    for (;;) {
        if (items.n) expect_op(p, ",");
        if (is_tuple_end(p, extra_end)) break;
        vec_push(p, &items, parse_expression(p, with_condexpr));
        if (is_op(p, ","))
            is_tuple = true;
        else
            break;
    }
    if (!is_tuple) {
        if (items.n) return items.v[0];
        if (!explicit_parens) unexpected(p, "an expression");
    }
    struct jinja_expr *e = new_expr(p, JE_TUPLE, line);
    e->list.n = items.n;
    e->list.v = (struct jinja_expr **)items.v;
    return e;
}

static struct jinja_expr *parse_condexpr(struct jinja_parser *p) {
    enter(p);
    struct jinja_expr *e1 = parse_or(p);
    while (is_name(p, "if")) {
        int line = advance(p)->line;
        struct jinja_expr *e = new_expr(p, JE_COND, line);
        e->cond.then = e1;
        e->cond.cond = parse_or(p);
        if (skip_name(p, "else")) e->cond.els = parse_condexpr(p);
        e1 = e;
    }
    p->depth--;
    return e1;
}

static struct jinja_expr *parse_expression(struct jinja_parser *p, bool with_condexpr) {
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
    while (is_name(p, "and")) {
        int line = advance(p)->line;
        l = binary(p, JE_AND, 0, line, l, parse_not(p));
    }
    return l;
}

static struct jinja_expr *parse_or(struct jinja_parser *p) {
    struct jinja_expr *l = parse_and(p);
    while (is_name(p, "or")) {
        int line = advance(p)->line;
        l = binary(p, JE_OR, 0, line, l, parse_and(p));
    }
    return l;
}

static struct jinja_expr *parse_math1(struct jinja_parser *p);
static struct jinja_expr *parse_compare(struct jinja_parser *p) {
    int line = peek(p)->line;
    struct jinja_expr *first = parse_math1(p);
    struct vec rest = {0};
    enum jinja_cmpop ops[64];
    int n = 0;
    for (;;) {
        enum jinja_cmpop op;
        if (is_op(p, "=="))
            op = JC_EQ;
        else if (is_op(p, "!="))
            op = JC_NE;
        else if (is_op(p, "<"))
            op = JC_LT;
        else if (is_op(p, "<="))
            op = JC_LE;
        else if (is_op(p, ">"))
            op = JC_GT;
        else if (is_op(p, ">="))
            op = JC_GE;
        else if (is_name(p, "in"))
            op = JC_IN;
        else if (is_name(p, "not") && tok_is_name(peek_at(p, 1), "in")) {
            advance(p);
            op = JC_NOTIN;
        } else
            break;
        advance(p);
        if (n == 64) SYNTAX(p, line, "comparison chain too long");
        ops[n++] = op;
        vec_push(p, &rest, parse_math1(p));
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
    if (is_name(p, "not")) {
        int line = advance(p)->line;
        enter(p);
        struct jinja_expr *e = new_expr(p, JE_NOT, line);
        e->un = parse_not(p);
        p->depth--;
        return e;
    }
    return parse_compare(p);
}

static struct jinja_expr *parse_pow(struct jinja_parser *p) {
    struct jinja_expr *l = parse_unary(p, true);
    while (is_op(p, "**")) {
        int line = advance(p)->line;
        l = binary(p, JE_BIN, JB_POW, line, l, parse_unary(p, true));
    }
    return l;
}

static struct jinja_expr *parse_math2(struct jinja_parser *p) {
    struct jinja_expr *l = parse_pow(p);
    for (;;) {
        int op;
        if (is_op(p, "*"))
            op = JB_MUL;
        else if (is_op(p, "/"))
            op = JB_DIV;
        else if (is_op(p, "//"))
            op = JB_FLOORDIV;
        else if (is_op(p, "%"))
            op = JB_MOD;
        else
            break;
        int line = advance(p)->line;
        l = binary(p, JE_BIN, op, line, l, parse_pow(p));
    }
    return l;
}

static struct jinja_expr *parse_concat(struct jinja_parser *p) {
    struct jinja_expr *l = parse_math2(p);
    while (is_op(p, "~")) {
        int line = advance(p)->line;
        l = binary(p, JE_BIN, JB_CONCAT, line, l, parse_math2(p));
    }
    return l;
}

static struct jinja_expr *parse_math1(struct jinja_parser *p) {
    struct jinja_expr *l = parse_concat(p);
    for (;;) {
        int op;
        if (is_op(p, "+"))
            op = JB_ADD;
        else if (is_op(p, "-"))
            op = JB_SUB;
        else
            break;
        int line = advance(p)->line;
        l = binary(p, JE_BIN, op, line, l, parse_concat(p));
    }
    return l;
}

static struct jinja_expr *parse_unary(struct jinja_parser *p, bool with_filter) {
    enter(p);
    struct jinja_expr *node;
    if (is_op(p, "-") || is_op(p, "+")) {
        const struct jinja_tok *t = advance(p);
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
    const struct jinja_tok *t = peek(p);
    int line = t->line;
    if (t->t == JTK_NAME) {
        advance(p);
        if (tok_is_name(t, "true") || tok_is_name(t, "True")) return konst(p, jv_bool(true), line);
        if (tok_is_name(t, "false") || tok_is_name(t, "False"))
            return konst(p, jv_bool(false), line);
        if (tok_is_name(t, "none") || tok_is_name(t, "None")) return konst(p, jv_none(), line);
        struct jinja_expr *e = new_expr(p, JE_NAME, line);
        e->name = jinja_parse_strdup(p, t->p, t->n);
        return e;
    }
    if (t->t == JTK_STRING) {
        // adjacent literals concatenate: "a" "b"
        size_t total = 0, k = 0;
        while (peek_at(p, k)->t == JTK_STRING) total += peek_at(p, k++)->n;
        char *s = jinja_parse_alloc(p, total + 1);
        size_t off = 0;
        while (peek(p)->t == JTK_STRING) {
            const struct jinja_tok *st = advance(p);
            memcpy(s + off, st->p, st->n);
            off += st->n;
        }
        return konst(p, jv_str(s, total), line);
    }
    if (t->t == JTK_INT) {
        advance(p);
        return konst(p, jv_int(t->i), line);
    }
    if (t->t == JTK_FLOAT) {
        advance(p);
        return konst(p, jv_float(t->f), line);
    }
    if (tok_is_op(t, "(")) {
        advance(p);
        struct jinja_expr *e = parse_tuple(p, true, true, NULL);
        expect_op(p, ")");
        return e;
    }
    if (tok_is_op(t, "[")) {
        advance(p);
        struct vec items = {0};
        while (!is_op(p, "]")) {
            if (items.n) expect_op(p, ",");
            if (is_op(p, "]")) break;
            vec_push(p, &items, parse_expression(p, true));
        }
        expect_op(p, "]");
        struct jinja_expr *e = new_expr(p, JE_LIST, line);
        e->list.n = items.n;
        e->list.v = (struct jinja_expr **)items.v;
        return e;
    }
    if (tok_is_op(t, "{")) {
        advance(p);
        struct vec keys = {0}, vals = {0};
        while (!is_op(p, "}")) {
            if (keys.n) expect_op(p, ",");
            if (is_op(p, "}")) break;
            vec_push(p, &keys, parse_expression(p, true));
            expect_op(p, ":");
            vec_push(p, &vals, parse_expression(p, true));
        }
        expect_op(p, "}");
        struct jinja_expr *e = new_expr(p, JE_DICT, line);
        e->dict.n = keys.n;
        e->dict.k = (struct jinja_expr **)keys.v;
        e->dict.v = (struct jinja_expr **)vals.v;
        return e;
    }
    unexpected(p, "an expression");
}

static void parse_call_args(struct jinja_parser *p, struct jinja_args *a) {
    expect_op(p, "(");
    struct vec pos = {0}, kw = {0}, kwv = {0};
    bool first = true;
    while (!is_op(p, ")")) {
        if (!first) {
            expect_op(p, ",");
            if (is_op(p, ")")) break;
        }
        first = false;
        if (is_op(p, "*") || is_op(p, "**"))
            SYNTAX(p, peek(p)->line, "*args and **kwargs in calls are not supported");
        if (peek(p)->t == JTK_NAME && tok_is_op(peek_at(p, 1), "=")) {
            const char *name = expect_name(p);
            advance(p);
            vec_push(p, &kw, (void *)name);
            vec_push(p, &kwv, parse_expression(p, true));
        } else {
            if (kw.n) SYNTAX(p, peek(p)->line, "positional argument follows keyword argument");
            vec_push(p, &pos, parse_expression(p, true));
        }
    }
    expect_op(p, ")");
    a->n = pos.n;
    a->pos = (struct jinja_expr **)pos.v;
    a->nkw = kw.n;
    a->kw = (const char **)kw.v;
    a->kwv = (struct jinja_expr **)kwv.v;
}

static struct jinja_expr *parse_subscribed(struct jinja_parser *p) {
    int line = peek(p)->line;
    struct jinja_expr *args[3] = {0};
    if (is_op(p, ":")) {
        advance(p);
    } else {
        struct jinja_expr *node = parse_expression(p, true);
        if (!is_op(p, ":")) return node;
        advance(p);
        args[0] = node;
    }
    if (!is_op(p, ":") && !is_op(p, "]") && !is_op(p, ",")) args[1] = parse_expression(p, true);
    if (skip_op(p, ":"))
        if (!is_op(p, "]") && !is_op(p, ",")) args[2] = parse_expression(p, true);
    struct jinja_expr *e = new_expr(p, JE_SLICE, line);
    e->slice.start = args[0];
    e->slice.stop = args[1];
    e->slice.step = args[2];
    return e;
}

static struct jinja_expr *parse_postfix(struct jinja_parser *p, struct jinja_expr *node) {
    for (;;) {
        const struct jinja_tok *t = peek(p);
        if (tok_is_op(t, ".")) {
            advance(p);
            const struct jinja_tok *a = peek(p);
            if (a->t == JTK_NAME) {
                advance(p);
                struct jinja_expr *e = new_expr(p, JE_ATTR, t->line);
                e->attr.obj = node;
                e->attr.name = jinja_parse_strdup(p, a->p, a->n);
                node = e;
            } else if (a->t == JTK_INT) {
                advance(p);
                struct jinja_expr *e = new_expr(p, JE_ITEM, t->line);
                e->item.obj = node;
                e->item.index = konst(p, jv_int(a->i), a->line);
                node = e;
            } else {
                unexpected(p, "a name or number after '.'");
            }
        } else if (tok_is_op(t, "[")) {
            advance(p);
            struct vec args = {0};
            while (!is_op(p, "]")) {
                if (args.n) expect_op(p, ",");
                if (is_op(p, "]")) break;
                vec_push(p, &args, parse_subscribed(p));
            }
            expect_op(p, "]");
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
        } else if (tok_is_op(t, "(")) {
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
    const char *name = expect_name(p);
    while (is_op(p, ".")) { // jinja allows dotted filter/test names
        advance(p);
        const char *more = expect_name(p);
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
    int line = peek(p)->line;
    struct jinja_expr *e = new_expr(p, JE_FILTER, line);
    e->ft.obj = node;
    e->ft.name = dotted_name(p);
    e->ft.filter = jinja_find_filter(e->ft.name);
    if (is_op(p, "(")) parse_call_args(p, &e->ft.args);
    return e;
}

static struct jinja_expr *parse_test(struct jinja_parser *p, struct jinja_expr *node) {
    int line = advance(p)->line; // 'is'
    struct jinja_expr *e = new_expr(p, JE_TEST, line);
    e->ft.obj = node;
    e->ft.negate = skip_name(p, "not");
    e->ft.name = dotted_name(p);
    e->ft.test = jinja_find_test(e->ft.name);
    const struct jinja_tok *t = peek(p);
    if (tok_is_op(t, "(")) {
        parse_call_args(p, &e->ft.args);
    } else if ((t->t == JTK_NAME || t->t == JTK_STRING || t->t == JTK_INT || t->t == JTK_FLOAT ||
                tok_is_op(t, "[") || tok_is_op(t, "{")) &&
               !tok_is_name(t, "else") && !tok_is_name(t, "or") && !tok_is_name(t, "and")) {
        if (tok_is_name(t, "is")) SYNTAX(p, t->line, "you cannot chain multiple tests with is");
        struct jinja_expr *arg = parse_postfix(p, parse_primary(p));
        e->ft.args.n = 1;
        e->ft.args.pos = jinja_parse_alloc(p, sizeof *e->ft.args.pos);
        e->ft.args.pos[0] = arg;
    }
    return e;
}

static struct jinja_expr *parse_filter_expr(struct jinja_parser *p, struct jinja_expr *node) {
    for (;;) {
        if (is_op(p, "|")) {
            advance(p);
            node = parse_filter(p, node);
        } else if (is_name(p, "is")) {
            node = parse_test(p, node);
        } else if (is_op(p, "(")) {
            struct jinja_expr *e = new_expr(p, JE_CALL, peek(p)->line);
            e->call.fn = node;
            parse_call_args(p, &e->call.args);
            node = e;
        } else {
            return node;
        }
    }
}

/* ---- statements ---------------------------------------------------------------------- */

static struct jinja_stmt *new_stmt(struct jinja_parser *p, enum jinja_stmt_kind k, int line) {
    struct jinja_stmt *s = jinja_parse_alloc(p, sizeof *s);
    s->kind = k;
    s->line = line;
    return s;
}

/* Names, optionally parenthesised and comma-separated: x | a, b | (a, b) | ns.attr */
static void parse_target(struct jinja_parser *p, struct jinja_target *tg, bool allow_attr) {
    if (allow_attr && peek(p)->t == JTK_NAME && tok_is_op(peek_at(p, 1), ".")) {
        tg->kind = JTG_ATTR;
        tg->name = expect_name(p);
        advance(p);
        tg->attr = expect_name(p);
        return;
    }
    bool paren = skip_op(p, "(");
    struct vec names = {0};
    bool comma = false;
    for (;;) {
        vec_push(p, &names, (void *)expect_name(p));
        if (!is_op(p, ",")) break;
        advance(p);
        comma = true;
        if (paren && is_op(p, ")")) break;
        if (!paren && (is_name(p, "in") || is_op(p, "="))) break;
    }
    if (paren) expect_op(p, ")");
    if (names.n == 1 && !comma) {
        tg->kind = JTG_NAME;
        tg->name = names.v[0];
    } else {
        tg->kind = JTG_TUPLE;
        tg->n = names.n;
        tg->names = (const char **)names.v;
    }
}

static int subparse(struct jinja_parser *p, struct jinja_body *body, const char *const *ends,
                    const char *block, int block_line);

static struct jinja_stmt *parse_for(struct jinja_parser *p, int line) {
    struct jinja_stmt *s = new_stmt(p, JS_FOR, line);
    parse_target(p, &s->for_.tgt, false);
    if (!skip_name(p, "in")) unexpected(p, "'in'");
    s->for_.iter = parse_tuple(p, false, false, "recursive");
    if (skip_name(p, "if")) s->for_.filter = parse_expression(p, true);
    if (is_name(p, "recursive")) SYNTAX(p, line, "recursive for loops are not supported");
    expect_block_end(p);
    static const char *const ends1[] = {"endfor", "else", NULL};
    static const char *const ends2[] = {"endfor", NULL};
    p->loop_depth++;
    int which = subparse(p, &s->for_.body, ends1, "for", line);
    p->loop_depth--;
    expect_block_end(p);
    if (which == 1) {
        subparse(p, &s->for_.els, ends2, "for", line);
        expect_block_end(p);
    }
    return s;
}

static struct jinja_stmt *parse_if(struct jinja_parser *p, int line) {
    static const char *const ends1[] = {"endif", "elif", "else", NULL};
    static const char *const ends2[] = {"endif", NULL};
    struct jinja_stmt *s = new_stmt(p, JS_IF, line);
    struct vec conds = {0}, bodies = {0};
    for (;;) {
        vec_push(p, &conds, parse_tuple(p, false, false, NULL));
        expect_block_end(p);
        struct jinja_body *b = jinja_parse_alloc(p, sizeof *b);
        vec_push(p, &bodies, b);
        int which = subparse(p, b, ends1, "if", line);
        if (which == 1) continue;
        expect_block_end(p);
        if (which == 2) {
            subparse(p, &s->if_.els, ends2, "if", line);
            expect_block_end(p);
        }
        break;
    }
    s->if_.n = conds.n;
    s->if_.conds = (struct jinja_expr **)conds.v;
    s->if_.bodies = jinja_parse_alloc(p, (size_t)conds.n * sizeof *s->if_.bodies);
    for (int i = 0; i < bodies.n; i++) s->if_.bodies[i] = *(struct jinja_body *)bodies.v[i];
    return s;
}

/* The filter chain of {% filter a|b(x) %} or {% set x | a %}, applied to JE_BLOCK. */
static struct jinja_expr *parse_block_filters(struct jinja_parser *p, int line) {
    struct jinja_expr *node = new_expr(p, JE_BLOCK, line);
    node = parse_filter(p, node);
    while (skip_op(p, "|")) node = parse_filter(p, node);
    return node;
}

static struct jinja_stmt *parse_set(struct jinja_parser *p, int line) {
    struct jinja_stmt *s = new_stmt(p, JS_SET, line);
    parse_target(p, &s->set.tgt, true);
    if (skip_op(p, "=")) {
        s->set.value = parse_tuple(p, true, false, NULL);
        expect_block_end(p);
        return s;
    }
    s->kind = JS_SET_BLOCK;
    if (skip_op(p, "|")) s->set.value = parse_block_filters(p, line);
    expect_block_end(p);
    static const char *const ends[] = {"endset", NULL};
    subparse(p, &s->set.body, ends, "set", line);
    expect_block_end(p);
    return s;
}

static struct jinja_stmt *parse_macro(struct jinja_parser *p, int line) {
    struct jinja_stmt *s = new_stmt(p, JS_MACRO, line);
    s->macro.name = expect_name(p);
    expect_op(p, "(");
    struct vec params = {0}, defs = {0};
    while (!is_op(p, ")")) {
        if (params.n) expect_op(p, ",");
        if (is_op(p, ")")) break;
        vec_push(p, &params, (void *)expect_name(p));
        struct jinja_expr *d = NULL;
        if (skip_op(p, "="))
            d = parse_expression(p, true);
        else if (defs.n && defs.v[defs.n - 1])
            SYNTAX(p, line, "non-default argument follows default argument");
        vec_push(p, &defs, d);
    }
    expect_op(p, ")");
    expect_block_end(p);
    s->macro.n = params.n;
    s->macro.params = (const char **)params.v;
    s->macro.defaults = (struct jinja_expr **)defs.v;
    static const char *const ends[] = {"endmacro", NULL};
    int saved = p->loop_depth;
    p->loop_depth = 0;
    subparse(p, &s->macro.body, ends, "macro", line);
    p->loop_depth = saved;
    expect_block_end(p);
    return s;
}

static struct jinja_stmt *parse_with(struct jinja_parser *p, int line) {
    struct jinja_stmt *s = new_stmt(p, JS_WITH, line);
    struct vec vals = {0}, tgts = {0};
    while (peek(p)->t != JTK_BLOCK_END) {
        if (vals.n) expect_op(p, ",");
        struct jinja_target *tg = jinja_parse_alloc(p, sizeof *tg);
        parse_target(p, tg, false);
        vec_push(p, &tgts, tg);
        expect_op(p, "=");
        vec_push(p, &vals, parse_expression(p, true));
    }
    expect_block_end(p);
    s->with.n = vals.n;
    s->with.vals = (struct jinja_expr **)vals.v;
    s->with.tgts = jinja_parse_alloc(p, (size_t)(vals.n ? vals.n : 1) * sizeof *s->with.tgts);
    for (int i = 0; i < tgts.n; i++) s->with.tgts[i] = *(struct jinja_target *)tgts.v[i];
    static const char *const ends[] = {"endwith", NULL};
    subparse(p, &s->with.body, ends, "with", line);
    expect_block_end(p);
    return s;
}

static struct jinja_stmt *parse_statement(struct jinja_parser *p) {
    const struct jinja_tok *t = peek(p);
    int line = t->line;
    if (t->t != JTK_NAME) unexpected(p, "a tag name");
    enter(p);
    advance(p);
    struct jinja_stmt *s;
    if (tok_is_name(t, "for")) {
        s = parse_for(p, line);
    } else if (tok_is_name(t, "if")) {
        s = parse_if(p, line);
    } else if (tok_is_name(t, "set")) {
        s = parse_set(p, line);
    } else if (tok_is_name(t, "macro")) {
        s = parse_macro(p, line);
    } else if (tok_is_name(t, "with")) {
        s = parse_with(p, line);
    } else if (tok_is_name(t, "break") || tok_is_name(t, "continue")) {
        bool brk = tok_is_name(t, "break");
        if (!p->loop_depth) SYNTAX(p, line, "'%s' outside of a loop", brk ? "break" : "continue");
        s = new_stmt(p, brk ? JS_BREAK : JS_CONTINUE, line);
        expect_block_end(p);
    } else if (tok_is_name(t, "filter")) {
        s = new_stmt(p, JS_FILTER, line);
        s->filter.chain = parse_block_filters(p, line);
        expect_block_end(p);
        static const char *const ends[] = {"endfilter", NULL};
        subparse(p, &s->filter.body, ends, "filter", line);
        expect_block_end(p);
    } else if (tok_is_name(t, "generation")) {
        s = new_stmt(p, JS_SCOPE, line);
        expect_block_end(p);
        static const char *const ends[] = {"endgeneration", NULL};
        subparse(p, &s->scope, ends, "generation", line);
        expect_block_end(p);
    } else {
        static const char *const unsupported[] = {
            "call", "include", "import", "from", "extends", "block", "do", "autoescape", NULL};
        for (int i = 0; unsupported[i]; i++)
            if (tok_is_name(t, unsupported[i]))
                SYNTAX(p, line, "the '%s' tag is not supported", unsupported[i]);
        SYNTAX(p, line, "unknown tag '%.*s'", (int)(t->n > 40 ? 40 : t->n), t->p);
    }
    p->depth--;
    return s;
}

/* Statements until one of the tags `ends` (NULL: until the end of the template). Returns the
 * index of the end tag found, with the tag name consumed. */
static int subparse(struct jinja_parser *p, struct jinja_body *body, const char *const *ends,
                    const char *block, int block_line) {
    struct vec v = {0};
    for (;;) {
        const struct jinja_tok *t = peek(p);
        if (t->t == JTK_EOF) {
            if (!ends) break;
            SYNTAX(p, block_line,
                   "unexpected end of template: the '%s' block opened here is "
                   "never closed (expected '%s')",
                   block, ends[0]);
        }
        if (t->t == JTK_DATA) {
            advance(p);
            struct jinja_stmt *s = new_stmt(p, JS_TEXT, t->line);
            s->text.p = jinja_parse_strdup(p, t->p, t->n);
            s->text.n = t->n;
            vec_push(p, &v, s);
        } else if (t->t == JTK_VAR_BEGIN) {
            advance(p);
            struct jinja_stmt *s = new_stmt(p, JS_PRINT, t->line);
            s->expr = parse_tuple(p, true, false, NULL);
            if (peek(p)->t != JTK_VAR_END) unexpected(p, "end of print statement");
            advance(p);
            vec_push(p, &v, s);
        } else if (t->t == JTK_BLOCK_BEGIN) {
            advance(p);
            const struct jinja_tok *name = peek(p);
            for (int i = 0; ends && ends[i]; i++) {
                if (tok_is_name(name, ends[i])) {
                    advance(p);
                    body->n = v.n;
                    body->v = (struct jinja_stmt **)v.v;
                    return i;
                }
            }
            if (name->t == JTK_NAME && ((name->n > 3 && memcmp(name->p, "end", 3) == 0) ||
                                        tok_is_name(name, "else") || tok_is_name(name, "elif")))
                SYNTAX(p, name->line, "unexpected '%.*s'%s%s%s", (int)name->n, name->p,
                       ends ? " (expected '" : "", ends ? ends[0] : "", ends ? "')" : "");
            vec_push(p, &v, parse_statement(p));
        } else {
            unexpected(p, "template data or a tag");
        }
    }
    body->n = v.n;
    body->v = (struct jinja_stmt **)v.v;
    return -1;
}

/* ---- entry --------------------------------------------------------------------------- */

int jinja_parse(const char *src, size_t len, const struct jinja_options *opt,
                struct jinja_template **out, char *err, size_t errlen) {
    *out = NULL;
    if (err && errlen) err[0] = 0;
    struct jinja_arena arena = {0};
    struct jinja_template *t = jinja_arena_alloc(&arena, sizeof *t);
    if (!t) return JINJA_ERR_NOMEM;
    memset(t, 0, sizeof *t);
    t->arena = arena;
    t->opt = opt ? *opt : jinja_options_hf;

    struct jinja_parser *p = calloc(1, sizeof *p);
    if (!p) {
        jinja_free(t);
        return JINJA_ERR_NOMEM;
    }
    p->t = t;
    p->err = err;
    p->errlen = errlen;
    p->line = 1;

    int status = setjmp(p->jmp);
    if (status == 0) {
        jinja_lex(p, src, len);
        p->line = 1;
        subparse(p, &t->body, NULL, NULL, 0);
    }
    jinja_arena_free(&p->tmp);
    free(p);
    if (status != 0) {
        jinja_free(t);
        return status;
    }
    *out = t;
    return JINJA_OK;
}
