/* jinja_parse: the parser's entry and its statement half, following jinja2's parser.py (3.1) so
 * that statement forms match; expressions are jinja_parse_expr.c's, the tokens and the cursor
 * over them jinja_lex.c's. */
#include "engine/text/jinja_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SYNTAX(p, line, ...) jinja_parse_fail(p, JINJA_ERR_SYNTAX, line, __VA_ARGS__)

static struct jinja_stmt *new_stmt(struct jinja_parser *p, enum jinja_stmt_kind k, int line) {
    struct jinja_stmt *s = jinja_parse_alloc(p, sizeof *s);
    s->kind = k;
    s->line = line;
    return s;
}

/* Names, optionally parenthesised and comma-separated: x | a, b | (a, b) | ns.attr */
static void parse_target(struct jinja_parser *p, struct jinja_target *tg, bool allow_attr) {
    if (allow_attr && jinja_peek(p)->t == JTK_NAME && jinja_tok_is_op(jinja_peek_at(p, 1), ".")) {
        tg->kind = JTG_ATTR;
        tg->name = jinja_expect_name(p);
        jinja_advance(p);
        tg->attr = jinja_expect_name(p);
        return;
    }
    bool paren = jinja_skip_op(p, "(");
    struct jinja_parse_vec names = {0};
    bool comma = false;
    for (;;) {
        jinja_parse_push(p, &names, (void *)jinja_expect_name(p));
        if (!jinja_is_op(p, ",")) break;
        jinja_advance(p);
        comma = true;
        if (paren && jinja_is_op(p, ")")) break;
        if (!paren && (jinja_is_name(p, "in") || jinja_is_op(p, "="))) break;
    }
    if (paren) jinja_expect_op(p, ")");
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
    if (!jinja_skip_name(p, "in")) jinja_unexpected(p, "'in'");
    s->for_.iter = jinja_parse_tuple(p, false, false, "recursive");
    if (jinja_skip_name(p, "if")) s->for_.filter = jinja_parse_expression(p, true);
    if (jinja_is_name(p, "recursive")) SYNTAX(p, line, "recursive for loops are not supported");
    jinja_expect_block_end(p);
    static const char *const ends1[] = {"endfor", "else", NULL};
    static const char *const ends2[] = {"endfor", NULL};
    p->loop_depth++;
    int which = subparse(p, &s->for_.body, ends1, "for", line);
    p->loop_depth--;
    jinja_expect_block_end(p);
    if (which == 1) {
        subparse(p, &s->for_.els, ends2, "for", line);
        jinja_expect_block_end(p);
    }
    return s;
}

static struct jinja_stmt *parse_if(struct jinja_parser *p, int line) {
    static const char *const ends1[] = {"endif", "elif", "else", NULL};
    static const char *const ends2[] = {"endif", NULL};
    struct jinja_stmt *s = new_stmt(p, JS_IF, line);
    struct jinja_parse_vec conds = {0}, bodies = {0};
    for (;;) {
        jinja_parse_push(p, &conds, jinja_parse_tuple(p, false, false, NULL));
        jinja_expect_block_end(p);
        struct jinja_body *b = jinja_parse_alloc(p, sizeof *b);
        jinja_parse_push(p, &bodies, b);
        int which = subparse(p, b, ends1, "if", line);
        if (which == 1) continue;
        jinja_expect_block_end(p);
        if (which == 2) {
            subparse(p, &s->if_.els, ends2, "if", line);
            jinja_expect_block_end(p);
        }
        break;
    }
    s->if_.n = conds.n;
    s->if_.conds = (struct jinja_expr **)conds.v;
    s->if_.bodies = jinja_parse_alloc(p, (size_t)conds.n * sizeof *s->if_.bodies);
    for (int i = 0; i < bodies.n; i++) s->if_.bodies[i] = *(struct jinja_body *)bodies.v[i];
    return s;
}

static struct jinja_stmt *parse_set(struct jinja_parser *p, int line) {
    struct jinja_stmt *s = new_stmt(p, JS_SET, line);
    parse_target(p, &s->set.tgt, true);
    if (jinja_skip_op(p, "=")) {
        s->set.value = jinja_parse_tuple(p, true, false, NULL);
        jinja_expect_block_end(p);
        return s;
    }
    s->kind = JS_SET_BLOCK;
    if (jinja_skip_op(p, "|")) s->set.value = jinja_parse_block_filters(p, line);
    jinja_expect_block_end(p);
    static const char *const ends[] = {"endset", NULL};
    subparse(p, &s->set.body, ends, "set", line);
    jinja_expect_block_end(p);
    return s;
}

static struct jinja_stmt *parse_macro(struct jinja_parser *p, int line) {
    struct jinja_stmt *s = new_stmt(p, JS_MACRO, line);
    s->macro.name = jinja_expect_name(p);
    jinja_expect_op(p, "(");
    struct jinja_parse_vec params = {0}, defs = {0};
    while (!jinja_is_op(p, ")")) {
        if (params.n) jinja_expect_op(p, ",");
        if (jinja_is_op(p, ")")) break;
        jinja_parse_push(p, &params, (void *)jinja_expect_name(p));
        struct jinja_expr *d = NULL;
        if (jinja_skip_op(p, "="))
            d = jinja_parse_expression(p, true);
        else if (defs.n && defs.v[defs.n - 1])
            SYNTAX(p, line, "non-default argument follows default argument");
        jinja_parse_push(p, &defs, d);
    }
    jinja_expect_op(p, ")");
    jinja_expect_block_end(p);
    s->macro.n = params.n;
    s->macro.params = (const char **)params.v;
    s->macro.defaults = (struct jinja_expr **)defs.v;
    static const char *const ends[] = {"endmacro", NULL};
    int saved = p->loop_depth;
    p->loop_depth = 0;
    subparse(p, &s->macro.body, ends, "macro", line);
    p->loop_depth = saved;
    jinja_expect_block_end(p);
    return s;
}

static struct jinja_stmt *parse_with(struct jinja_parser *p, int line) {
    struct jinja_stmt *s = new_stmt(p, JS_WITH, line);
    struct jinja_parse_vec vals = {0}, tgts = {0};
    while (jinja_peek(p)->t != JTK_BLOCK_END) {
        if (vals.n) jinja_expect_op(p, ",");
        struct jinja_target *tg = jinja_parse_alloc(p, sizeof *tg);
        parse_target(p, tg, false);
        jinja_parse_push(p, &tgts, tg);
        jinja_expect_op(p, "=");
        jinja_parse_push(p, &vals, jinja_parse_expression(p, true));
    }
    jinja_expect_block_end(p);
    s->with.n = vals.n;
    s->with.vals = (struct jinja_expr **)vals.v;
    s->with.tgts = jinja_parse_alloc(p, (size_t)(vals.n ? vals.n : 1) * sizeof *s->with.tgts);
    for (int i = 0; i < tgts.n; i++) s->with.tgts[i] = *(struct jinja_target *)tgts.v[i];
    static const char *const ends[] = {"endwith", NULL};
    subparse(p, &s->with.body, ends, "with", line);
    jinja_expect_block_end(p);
    return s;
}

static struct jinja_stmt *parse_statement(struct jinja_parser *p) {
    const struct jinja_tok *t = jinja_peek(p);
    int line = t->line;
    if (t->t != JTK_NAME) jinja_unexpected(p, "a tag name");
    jinja_parse_enter(p);
    jinja_advance(p);
    struct jinja_stmt *s;
    if (jinja_tok_is_name(t, "for")) {
        s = parse_for(p, line);
    } else if (jinja_tok_is_name(t, "if")) {
        s = parse_if(p, line);
    } else if (jinja_tok_is_name(t, "set")) {
        s = parse_set(p, line);
    } else if (jinja_tok_is_name(t, "macro")) {
        s = parse_macro(p, line);
    } else if (jinja_tok_is_name(t, "with")) {
        s = parse_with(p, line);
    } else if (jinja_tok_is_name(t, "break") || jinja_tok_is_name(t, "continue")) {
        bool brk = jinja_tok_is_name(t, "break");
        if (!p->loop_depth) SYNTAX(p, line, "'%s' outside of a loop", brk ? "break" : "continue");
        s = new_stmt(p, brk ? JS_BREAK : JS_CONTINUE, line);
        jinja_expect_block_end(p);
    } else if (jinja_tok_is_name(t, "filter")) {
        s = new_stmt(p, JS_FILTER, line);
        s->filter.chain = jinja_parse_block_filters(p, line);
        jinja_expect_block_end(p);
        static const char *const ends[] = {"endfilter", NULL};
        subparse(p, &s->filter.body, ends, "filter", line);
        jinja_expect_block_end(p);
    } else if (jinja_tok_is_name(t, "generation")) {
        s = new_stmt(p, JS_SCOPE, line);
        jinja_expect_block_end(p);
        static const char *const ends[] = {"endgeneration", NULL};
        subparse(p, &s->scope, ends, "generation", line);
        jinja_expect_block_end(p);
    } else {
        static const char *const unsupported[] = {
            "call", "include", "import", "from", "extends", "block", "do", "autoescape", NULL};
        for (int i = 0; unsupported[i]; i++)
            if (jinja_tok_is_name(t, unsupported[i]))
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
    struct jinja_parse_vec v = {0};
    for (;;) {
        const struct jinja_tok *t = jinja_peek(p);
        if (t->t == JTK_EOF) {
            if (!ends) break;
            SYNTAX(p, block_line,
                   "unexpected end of template: the '%s' block opened here is "
                   "never closed (expected '%s')",
                   block, ends[0]);
        }
        if (t->t == JTK_DATA) {
            jinja_advance(p);
            struct jinja_stmt *s = new_stmt(p, JS_TEXT, t->line);
            s->text.p = jinja_parse_strdup(p, t->p, t->n);
            s->text.n = t->n;
            jinja_parse_push(p, &v, s);
        } else if (t->t == JTK_VAR_BEGIN) {
            jinja_advance(p);
            struct jinja_stmt *s = new_stmt(p, JS_PRINT, t->line);
            s->expr = jinja_parse_tuple(p, true, false, NULL);
            if (jinja_peek(p)->t != JTK_VAR_END) jinja_unexpected(p, "end of print statement");
            jinja_advance(p);
            jinja_parse_push(p, &v, s);
        } else if (t->t == JTK_BLOCK_BEGIN) {
            jinja_advance(p);
            const struct jinja_tok *name = jinja_peek(p);
            for (int i = 0; ends && ends[i]; i++) {
                if (jinja_tok_is_name(name, ends[i])) {
                    jinja_advance(p);
                    body->n = v.n;
                    body->v = (struct jinja_stmt **)v.v;
                    return i;
                }
            }
            if (name->t == JTK_NAME &&
                ((name->n > 3 && memcmp(name->p, "end", 3) == 0) ||
                 jinja_tok_is_name(name, "else") || jinja_tok_is_name(name, "elif")))
                SYNTAX(p, name->line, "unexpected '%.*s'%s%s%s", (int)name->n, name->p,
                       ends ? " (expected '" : "", ends ? ends[0] : "", ends ? "')" : "");
            jinja_parse_push(p, &v, parse_statement(p));
        } else {
            jinja_unexpected(p, "template data or a tag");
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
