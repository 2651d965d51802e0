/* jinja_impl: types shared by the jinja_*.c files (values, syntax tree, render context).
 * Not a public header: the rest of the tree uses engine/jinja.h.
 *
 * Memory: a parsed template lives in one arena (syntax tree, literal strings); one render
 * allocates everything it makes (values, frames, output) from its own arena, freed at once
 * at the end. Render errors unwind with longjmp to jinja_render (as Lua does): nothing is
 * malloc'd outside the arena during a render, so an unwound render leaks nothing. Parse
 * errors unwind the same way to jinja_parse.
 *
 * Internal enums use short prefixes (JT_ value types, JE_ expressions, JS_ statements, ...):
 * they appear on most lines of the interpreter. */
#ifndef DUO_JINJA_IMPL_H
#define DUO_JINJA_IMPL_H

#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/text/jinja.h"

/* ---- arena --------------------------------------------------------------------------- */

struct jinja_chunk;

struct jinja_arena {
    struct jinja_chunk *head;
    size_t total; // bytes malloc'd so far
    size_t limit; // 0 = none
};

/* 16-byte aligned; NULL when malloc fails or the limit would be passed. */
void *jinja_arena_alloc(struct jinja_arena *a, size_t n);
void jinja_arena_free(struct jinja_arena *a);

/* ---- values -------------------------------------------------------------------------- */

enum jinja_type {
    JT_UNDEF,  // Jinja Undefined: falsey, renders as "", iterates as empty
    JT_NONE,
    JT_BOOL,
    JT_INT,
    JT_FLOAT,
    JT_STR,    // UTF-8 bytes, not NUL-terminated
    JT_LIST,   // also tuples (list->tuple)
    JT_DICT,   // insertion-ordered, like Python's
    JT_NS,     // namespace(): the only mutable object
    JT_LOOP,   // the `loop` variable of a for loop
    JT_MACRO,
    JT_FUNC,   // a global function (range, namespace, raise_exception, ...)
    JT_METHOD, // a bound method such as 'abc'.strip, made by attribute access
};

struct jinja_list;
struct jinja_dict;
struct jinja_ns;
struct jinja_loop;
struct jinja_macro;
struct jinja_method;

struct jv {
    enum jinja_type t;
    union {
        bool b;
        int64_t i;
        double f;
        struct {
            const char *p;
            size_t n;
        } s;
        struct jinja_list *l;
        struct jinja_dict *d;
        struct jinja_ns *ns;
        struct jinja_loop *loop;
        struct jinja_macro *macro;
        int fn; // enum jinja_global
        struct jinja_method *m;
        const char *undef; // JT_UNDEF: the missing name, for messages; may be NULL
    };
};

struct jinja_list {
    size_t n;
    bool tuple;
    struct jv *v;
};

struct jinja_dict {
    size_t n;
    struct jv *k;
    struct jv *v;
};

struct jinja_ns {
    struct jinja_dict d;
    size_t cap;
};

struct jinja_loop {
    int64_t index0;
    const struct jinja_list *items;
    int depth0;
};

struct jinja_method {
    struct jv self;
    const char *name;
};

enum jinja_global {
    JG_RANGE,
    JG_NAMESPACE,
    JG_DICT,
    JG_RAISE_EXCEPTION,
    JG_STRFTIME_NOW,
};

/* ---- syntax tree --------------------------------------------------------------------- */

enum jinja_expr_kind {
    JE_CONST,  // literal
    JE_NAME,
    JE_LIST,
    JE_TUPLE,
    JE_DICT,
    JE_ATTR,   // obj.name
    JE_ITEM,   // obj[index]
    JE_SLICE,  // obj[start:stop:step]
    JE_CALL,
    JE_FILTER, // obj | name(args)
    JE_TEST,   // obj is [not] name(args)
    JE_NOT,
    JE_NEG,
    JE_POS,
    JE_BIN,    // arithmetic and ~
    JE_AND,
    JE_OR,
    JE_CMP,    // chained comparison a < b < c
    JE_COND,   // then if cond else els
    JE_BLOCK,  // the captured body of {% filter %} / {% set x | f %}
};

enum jinja_binop {
    JB_ADD, JB_SUB, JB_MUL, JB_DIV, JB_FLOORDIV, JB_MOD, JB_POW, JB_CONCAT,
};

enum jinja_cmpop {
    JC_EQ, JC_NE, JC_LT, JC_LE, JC_GT, JC_GE, JC_IN, JC_NOTIN,
};

struct jinja_expr;
struct jinja_ctx;

/* Evaluated arguments of a call, a filter or a test. */
struct jinja_callargs {
    size_t n;
    struct jv *pos;
    size_t nkw;
    const char **kw;
    struct jv *kwv;
};

typedef struct jv (*jinja_filter_fn)(struct jinja_ctx *c, struct jv v,
                                     const struct jinja_callargs *a);
typedef bool (*jinja_test_fn)(struct jinja_ctx *c, struct jv v, const struct jinja_callargs *a);

struct jinja_args {
    int n;
    struct jinja_expr **pos;
    int nkw;
    const char **kw;
    struct jinja_expr **kwv;
};

struct jinja_expr {
    enum jinja_expr_kind kind;
    int line;
    union {
        struct jv konst;
        const char *name;
        struct {
            int n;
            struct jinja_expr **v;
        } list; // JE_LIST, JE_TUPLE
        struct {
            int n;
            struct jinja_expr **k, **v;
        } dict;
        struct {
            struct jinja_expr *obj;
            const char *name;
        } attr;
        struct {
            struct jinja_expr *obj, *index;
        } item;
        struct {
            struct jinja_expr *obj, *start, *stop, *step; // each may be NULL
        } slice;
        struct {
            struct jinja_expr *fn;
            struct jinja_args args;
        } call;
        struct {
            struct jinja_expr *obj;
            const char *name;
            struct jinja_args args;
            jinja_filter_fn filter; // NULL: unknown, an error if evaluated
            jinja_test_fn test;
            bool negate; // is not
        } ft; // JE_FILTER, JE_TEST
        struct jinja_expr *un; // JE_NOT, JE_NEG, JE_POS
        struct {
            enum jinja_binop op;
            struct jinja_expr *a, *b;
        } bin; // JE_BIN, JE_AND, JE_OR
        struct {
            int n;
            struct jinja_expr *first;
            enum jinja_cmpop *ops;
            struct jinja_expr **rest;
        } cmp;
        struct {
            struct jinja_expr *cond, *then, *els; // els may be NULL
        } cond;
    };
};

enum jinja_stmt_kind {
    JS_TEXT,
    JS_PRINT,     // {{ expr }}
    JS_IF,
    JS_FOR,
    JS_SET,       // {% set target = expr %}
    JS_SET_BLOCK, // {% set target [| filters] %}...{% endset %}
    JS_MACRO,
    JS_BREAK,
    JS_CONTINUE,
    JS_FILTER,    // {% filter f %}...{% endfilter %}
    JS_WITH,
    JS_SCOPE,     // {% generation %}: renders its body as is
};

struct jinja_stmt;

struct jinja_body {
    int n;
    struct jinja_stmt **v;
};

enum jinja_target_kind { JTG_NAME, JTG_TUPLE, JTG_ATTR };

struct jinja_target {
    enum jinja_target_kind kind;
    const char *name;   // JTG_NAME, JTG_ATTR (the namespace variable)
    const char *attr;   // JTG_ATTR
    int n;              // JTG_TUPLE
    const char **names; // JTG_TUPLE
};

struct jinja_stmt {
    enum jinja_stmt_kind kind;
    int line;
    union {
        struct {
            const char *p;
            size_t n;
        } text;
        struct jinja_expr *expr; // JS_PRINT
        struct {
            int n; // if + elifs
            struct jinja_expr **conds;
            struct jinja_body *bodies;
            struct jinja_body els;
        } if_;
        struct {
            struct jinja_target tgt;
            struct jinja_expr *iter, *filter; // filter may be NULL
            struct jinja_body body, els;
        } for_;
        struct {
            struct jinja_target tgt;
            struct jinja_expr *value; // JS_SET; JS_SET_BLOCK: a filter chain on JE_BLOCK or NULL
            struct jinja_body body;   // JS_SET_BLOCK
        } set;
        struct {
            const char *name;
            int n;
            const char **params;
            struct jinja_expr **defaults; // entries may be NULL
            struct jinja_body body;
        } macro;
        struct {
            struct jinja_expr *chain; // filters applied to JE_BLOCK
            struct jinja_body body;
        } filter;
        struct {
            int n;
            struct jinja_target *tgts;
            struct jinja_expr **vals;
            struct jinja_body body;
        } with;
        struct jinja_body scope;
    };
};

struct jinja_template {
    struct jinja_arena arena;
    struct jinja_options opt;
    struct jinja_body body;
};

/* ---- render context ------------------------------------------------------------------ */

struct jinja_buf {
    char *p;
    size_t n, cap;
    size_t limit; // max bytes; 0 = none
};

struct jinja_frame {
    struct jinja_frame *parent;
    size_t n, cap;
    const char **k;
    struct jv *v;
};

struct jinja_macro {
    const struct jinja_stmt *def;
    struct jinja_frame *closure;
};

struct jinja_ctx {
    struct jinja_arena arena;
    jmp_buf jmp;
    char *err;
    size_t errlen;
    struct jinja_limits lim;
    int line;       // line being evaluated, for messages
    int depth;      // current nesting (see jinja_limits.max_depth)
    uint64_t steps; // statements + iterations + calls so far
    struct jinja_buf *out;
    struct jv block; // value of JE_BLOCK while a {% filter %} applies
};

/* Stops the render: status, and a message (prefixed "line N: " unless JINJA_ERR_RAISED). */
_Noreturn void jinja_fail(struct jinja_ctx *c, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void *jinja_alloc(struct jinja_ctx *c, size_t n);
void jinja_depth_enter(struct jinja_ctx *c);
static inline void jinja_depth_leave(struct jinja_ctx *c) { c->depth--; }
void jinja_step(struct jinja_ctx *c);
/* Fails for an undefined value used as an object or operand, naming it when known. */
_Noreturn void jinja_fail_undefined(struct jinja_ctx *c, struct jv v);

/* jinja.c: value helpers */
static inline struct jv jv_undef(const char *name) {
    return (struct jv){.t = JT_UNDEF, .undef = name};
}
static inline struct jv jv_none(void) { return (struct jv){.t = JT_NONE}; }
static inline struct jv jv_bool(bool b) { return (struct jv){.t = JT_BOOL, .b = b}; }
static inline struct jv jv_int(int64_t i) { return (struct jv){.t = JT_INT, .i = i}; }
static inline struct jv jv_float(double f) { return (struct jv){.t = JT_FLOAT, .f = f}; }
static inline struct jv jv_str(const char *p, size_t n) {
    return (struct jv){.t = JT_STR, .s = {p, n}};
}
struct jv jv_str_copy(struct jinja_ctx *c, const char *p, size_t n);
struct jv jv_cstr(const char *s); // borrowed, static or arena-lived
struct jv jv_list_new(struct jinja_ctx *c, size_t n, bool tuple); // n items, set by caller
struct jv jv_dict_new(struct jinja_ctx *c, size_t n);

/* A growable array of values, in the render arena. */
struct jinja_vec {
    struct jv *v;
    size_t n, cap;
};
void jinja_vec_push(struct jinja_ctx *c, struct jinja_vec *v, struct jv x);
struct jv jinja_vec_list(struct jinja_ctx *c, struct jinja_vec *v, bool tuple);
struct jv jinja_pair(struct jinja_ctx *c, struct jv a, struct jv b); // a 2-tuple
/* The index of key (by ==) or of the string name among d's keys. */
bool jinja_dict_find(const struct jinja_dict *d, struct jv key, size_t *idx);
bool jinja_dict_find_str(const struct jinja_dict *d, const char *name, size_t *idx);

const char *jinja_type_name(struct jv v);
bool jinja_truthy(struct jv v);
bool jinja_equal(struct jv a, struct jv b);
/* <0, 0, >0 like Python's ordering; fails with a TypeError-like message when unorderable. */
int jinja_compare(struct jinja_ctx *c, struct jv a, struct jv b);
bool jinja_is_number(struct jv v); // int, float or bool
double jinja_as_double(struct jv v);

void jinja_buf_put(struct jinja_ctx *c, struct jinja_buf *b, const char *p, size_t n);
void jinja_buf_puts(struct jinja_ctx *c, struct jinja_buf *b, const char *s);
void jinja_buf_printf(struct jinja_ctx *c, struct jinja_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
struct jinja_buf jinja_buf_tmp(struct jinja_ctx *c); // limited to lim.max_output
struct jv jinja_buf_value(struct jinja_buf *b);      // a string viewing the buffer

void jinja_write_str(struct jinja_ctx *c, struct jinja_buf *b, struct jv v); // str(v)
void jinja_write_repr(struct jinja_ctx *c, struct jinja_buf *b, struct jv v);
void jinja_write_float(struct jinja_ctx *c, struct jinja_buf *b, double f); // Python repr
/* Python's json.dumps arguments. */
struct jinja_json_opts {
    int indent; // < 0: None (one line)
    const char *item_sep, *key_sep;
    bool sort_keys, ensure_ascii;
};
void jinja_write_json(struct jinja_ctx *c, struct jinja_buf *b, struct jv v,
                      const struct jinja_json_opts *o, int level);
struct jv jinja_to_str(struct jinja_ctx *c, struct jv v); // str(v) as a value

/* UTF-8, Python-style (code points). Invalid bytes count as one code point each. */
size_t jinja_utf8_decode(const char *p, size_t n, uint32_t *cp); // bytes used (>=1)
size_t jinja_utf8_last(const char *p, size_t n, uint32_t *cp); // the last code point (n > 0)
size_t jinja_utf8_count(const char *p, size_t n);
bool jinja_is_ascii(const char *p, size_t n);
bool jinja_is_space(uint32_t cp); // Python str.isspace
size_t jinja_utf8_encode(uint32_t cp, char out[4]);

/* jinja_eval.c */
struct jv jinja_call(struct jinja_ctx *c, struct jv fn, const struct jinja_callargs *a);

/* jinja_builtins.c: filters and tests by name; NULL when unknown. */
jinja_filter_fn jinja_find_filter(const char *name);
jinja_test_fn jinja_find_test(const char *name);

/* jinja_globals.c */
int jinja_find_global(const char *name); // enum jinja_global or -1
struct jv jinja_call_global(struct jinja_ctx *c, int fn, const struct jinja_callargs *a);

/* jinja_access.c: attributes, items, slices, iteration; call arguments. */
struct jv jinja_getattr(struct jinja_ctx *c, struct jv obj, const char *name);
struct jv jinja_getitem(struct jinja_ctx *c, struct jv obj, struct jv key);
/* obj[a:b:s] (each bound may be none/undefined); a bad slice fails. */
struct jv jinja_slice(struct jinja_ctx *c, struct jv obj, struct jv a, struct jv b, struct jv s);
/* The items of an iterable (list, tuple, str, dict keys; undefined = empty). */
const struct jinja_list *jinja_iterate(struct jinja_ctx *c, struct jv v);
/* True when name is a method of self's type (jinja_methods.c implements it). */
bool jinja_has_method(struct jv self, const char *name);

/* jinja_arg gives the argument at position pos or keyword kw (either may be -1/NULL), NULL if
 * absent; the need_ forms fail with a message instead. */
const struct jv *jinja_arg(const struct jinja_callargs *a, int pos, const char *kw);
const struct jv *jinja_need_arg(struct jinja_ctx *c, const struct jinja_callargs *a, int pos,
                                const char *kw);
struct jv jinja_need_str(struct jinja_ctx *c, const struct jv *v, const char *what);
int64_t jinja_need_int(struct jinja_ctx *c, const struct jv *v, const char *what);
bool jinja_arg_bool(const struct jinja_callargs *a, int pos, const char *kw, bool def);
static inline bool jinja_given(const struct jv *v) { return v && v->t != JT_NONE; }
const char *jinja_cstr(struct jinja_ctx *c, struct jv s); // NUL-terminated copy

/* jinja_methods.c: methods of str, list, dict and loop values */
struct jv jinja_call_method(struct jinja_ctx *c, struct jv self, const char *name,
                            const struct jinja_callargs *a);

/* jinja_methods.c: Python str operations */
enum jinja_case {
    JINJA_CASE_UPPER, JINJA_CASE_LOWER, JINJA_CASE_SWAP, JINJA_CASE_CAPITALIZE, JINJA_CASE_TITLE,
};
enum jinja_chars {
    JINJA_CHARS_DIGIT, JINJA_CHARS_ALPHA, JINJA_CHARS_ALNUM, JINJA_CHARS_SPACE,
    JINJA_CHARS_LOWER, JINJA_CHARS_UPPER,
};
/* chars NULL: whitespace */
struct jv jinja_str_strip(struct jv s, const struct jv *chars, bool left, bool right);
const struct jv *jinja_strip_chars(struct jinja_ctx *c, const struct jinja_callargs *a);
struct jv jinja_str_replace(struct jinja_ctx *c, struct jv s, struct jv old, struct jv new_,
                            int64_t count); // count < 0: all
struct jv jinja_str_recase(struct jinja_ctx *c, struct jv s, enum jinja_case m);
struct jv jinja_str_title_words(struct jinja_ctx *c, struct jv s); // jinja's title filter
struct jv jinja_str_splitlines(struct jinja_ctx *c, struct jv s, bool keepends);
/* Pads s to width code points with fill: where 0 centres, 1 pads on the left, -1 the right. */
struct jv jinja_str_pad(struct jinja_ctx *c, struct jv s, int64_t width, int where,
                        const char *fill);
bool jinja_str_all(struct jv s, enum jinja_chars kind); // str.isdigit() and friends
const char *jinja_rmemmem(const char *h, size_t hn, const char *n, size_t nn);
/* Python's fmt % args (printf-style formatting). */
struct jv jinja_percent_format(struct jinja_ctx *c, struct jv fmt, struct jv args);

/* ---- parser internals (jinja_lex.c, jinja_parse_expr.c, jinja_parse.c) -------------- */

enum jinja_tok_type {
    JTK_DATA,
    JTK_VAR_BEGIN,
    JTK_VAR_END,
    JTK_BLOCK_BEGIN,
    JTK_BLOCK_END,
    JTK_NAME,
    JTK_STRING,
    JTK_INT,
    JTK_FLOAT,
    JTK_OP,
    JTK_EOF,
};

struct jinja_tok {
    enum jinja_tok_type t;
    int line;
    const char *p; // DATA, NAME, OP: source text; STRING: decoded value
    size_t n;
    int64_t i;
    double f;
};

/* One jinja_parse call: the lexer fills toks from src, the parser builds t->body. */
struct jinja_parser {
    struct jinja_template *t;
    struct jinja_arena tmp; // normalized source and tokens, freed after parsing
    jmp_buf jmp;
    char *err;
    size_t errlen;
    // lexer
    const char *src;
    size_t len;
    int line;
    struct jinja_tok *toks;
    size_t ntok, captok;
    // parser
    size_t cur;
    int depth;
    int loop_depth; // for break/continue
};

/* Stops the parse: status and "line N: message" in p->err. */
_Noreturn void jinja_parse_fail(struct jinja_parser *p, int status, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void *jinja_parse_alloc(struct jinja_parser *p, size_t n); // zeroed, in the template's arena
char *jinja_parse_strdup(struct jinja_parser *p, const char *s, size_t n);
/* Tokenises src[0..len) into p->toks (p->src keeps the newline-normalised copy), applying
 * jinja's whitespace rules. */
void jinja_lex(struct jinja_parser *p, const char *src, size_t len);

/* jinja_lex.c: the token cursor. peek: the current token (EOF at the end); advance: returns it
 * and moves on; is_: whether the current token is that operator / name; skip_: the same, and
 * consumes it when it is; expect_: consumes it or fails with a syntax error. */
const struct jinja_tok *jinja_peek(const struct jinja_parser *p);
const struct jinja_tok *jinja_peek_at(const struct jinja_parser *p, size_t k); // k tokens on
const struct jinja_tok *jinja_advance(struct jinja_parser *p);
bool jinja_tok_is_op(const struct jinja_tok *t, const char *op);
bool jinja_tok_is_name(const struct jinja_tok *t, const char *name);
bool jinja_is_op(const struct jinja_parser *p, const char *op);
bool jinja_is_name(const struct jinja_parser *p, const char *name);
bool jinja_skip_op(struct jinja_parser *p, const char *op);
bool jinja_skip_name(struct jinja_parser *p, const char *name);
_Noreturn void jinja_unexpected(struct jinja_parser *p, const char *wanted); // "expected W, got T"
void jinja_expect_op(struct jinja_parser *p, const char *op);
const char *jinja_expect_name(struct jinja_parser *p); // the name, in the template's arena
void jinja_expect_block_end(struct jinja_parser *p);
/* One level deeper (the caller decrements p->depth on the way out); fails past the limit. */
void jinja_parse_enter(struct jinja_parser *p);

/* A growable array of pointers in the template arena. */
struct jinja_parse_vec {
    void **v;
    int n, cap;
};
void jinja_parse_push(struct jinja_parser *p, struct jinja_parse_vec *v, void *x);

/* jinja_parse_expr.c: expressions. parse_tuple: an expression, or a tuple when commas follow
 * (parser.py parse_tuple; extra_end: a name that also ends it); parse_expression: with or
 * without a trailing `x if c else y`; parse_block_filters: the filter chain of {% filter a|b %}
 * or {% set x | a %}, applied to JE_BLOCK. */
struct jinja_expr *jinja_parse_tuple(struct jinja_parser *p, bool with_condexpr,
                                     bool explicit_parens, const char *extra_end);
struct jinja_expr *jinja_parse_expression(struct jinja_parser *p, bool with_condexpr);
struct jinja_expr *jinja_parse_block_filters(struct jinja_parser *p, int line);

#endif
