/* jinja_eval: evaluates a parsed template. Python semantics for operators, Jinja's for
 * scoping (a for loop body is a fresh scope per iteration; if blocks are not scopes) and
 * for Undefined (falsey, "", empty iteration; an error when used as an object). Attribute,
 * item and slice access are in jinja_access.c. */
#include "engine/text/jinja_impl.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- scopes -------------------------------------------------------------------------- */

struct frame_ext {
    struct jinja_frame f;
    bool captured; // a macro closes over it: do not reuse it
};

static struct jinja_frame *frame_new(struct jinja_ctx *c, struct jinja_frame *parent) {
    struct frame_ext *x = jinja_alloc(c, sizeof *x);
    memset(x, 0, sizeof *x);
    x->f.parent = parent;
    return &x->f;
}

static bool frame_lookup(const struct jinja_frame *f, const char *name, struct jv *out) {
    for (; f; f = f->parent)
        for (size_t i = f->n; i-- > 0;)
            if (strcmp(f->k[i], name) == 0) {
                *out = f->v[i];
                return true;
            }
    return false;
}

static void frame_set(struct jinja_ctx *c, struct jinja_frame *f, const char *name, struct jv v) {
    for (size_t i = 0; i < f->n; i++)
        if (strcmp(f->k[i], name) == 0) {
            f->v[i] = v;
            return;
        }
    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 4;
        const char **k = jinja_alloc(c, cap * sizeof *k);
        struct jv *v2 = jinja_alloc(c, cap * sizeof *v2);
        if (f->n) {
            memcpy(k, f->k, f->n * sizeof *k);
            memcpy(v2, f->v, f->n * sizeof *v2);
        }
        f->k = k;
        f->v = v2;
        f->cap = cap;
    }
    f->k[f->n] = name;
    f->v[f->n++] = v;
}

/* ---- operators ----------------------------------------------------------------------- */

static int64_t num_int(struct jv v) { return v.t == JT_BOOL ? v.b : v.i; }
static bool is_intlike(struct jv v) { return v.t == JT_INT || v.t == JT_BOOL; }

_Noreturn static void fail_operands(struct jinja_ctx *c, const char *op, struct jv a, struct jv b) {
    if (a.t == JT_UNDEF) jinja_fail_undefined(c, a);
    if (b.t == JT_UNDEF) jinja_fail_undefined(c, b);
    jinja_fail(c, JINJA_ERR_RENDER, "unsupported operand type(s) for %s: '%s' and '%s'", op,
               jinja_type_name(a), jinja_type_name(b));
}

static struct jv repeat(struct jinja_ctx *c, struct jv seq, int64_t times) {
    if (times < 0) times = 0;
    if (seq.t == JT_STR) {
        if (seq.s.n && (uint64_t)times > c->lim.max_output / seq.s.n)
            jinja_fail(c, JINJA_ERR_LIMIT, "string repetition longer than %zu bytes",
                       c->lim.max_output);
        struct jinja_buf b = jinja_buf_tmp(c);
        for (int64_t i = 0; i < times; i++) jinja_buf_put(c, &b, seq.s.p, seq.s.n);
        return jinja_buf_value(&b);
    }
    if (seq.l->n && (uint64_t)times > (c->lim.max_memory / sizeof(struct jv)) / seq.l->n)
        jinja_fail(c, JINJA_ERR_LIMIT, "list repetition too large");
    struct jv r = jv_list_new(c, seq.l->n * (size_t)times, seq.l->tuple);
    for (int64_t i = 0; i < times; i++)
        memcpy(r.l->v + i * (int64_t)seq.l->n, seq.l->v, seq.l->n * sizeof(struct jv));
    return r;
}

/* a + b for strings, allocated to size (prompts are built by long chains of +). */
static struct jv concat(struct jinja_ctx *c, struct jv a, struct jv b) {
    if (a.s.n + b.s.n > c->lim.max_output)
        jinja_fail(c, JINJA_ERR_LIMIT, "string longer than %zu bytes", c->lim.max_output);
    if (b.s.n == 0) return a;
    if (a.s.n == 0) return b;
    char *p = jinja_alloc(c, a.s.n + b.s.n + 1);
    memcpy(p, a.s.p, a.s.n);
    memcpy(p + a.s.n, b.s.p, b.s.n);
    p[a.s.n + b.s.n] = 0;
    return jv_str(p, a.s.n + b.s.n);
}

static struct jv binop(struct jinja_ctx *c, enum jinja_binop op, struct jv a, struct jv b) {
    static const char *const names[] = {"+", "-", "*", "/", "//", "%", "**", "~"};
    if (op == JB_CONCAT) return concat(c, jinja_to_str(c, a), jinja_to_str(c, b));
    bool num = jinja_is_number(a) && jinja_is_number(b);
    bool ints = num && is_intlike(a) && is_intlike(b);
    int64_t x = num_int(a), y = num_int(b), r;
    double fx = jinja_as_double(a), fy = jinja_as_double(b);
    switch (op) {
    case JB_ADD:
        if (ints) {
            if (__builtin_add_overflow(x, y, &r)) goto overflow;
            return jv_int(r);
        }
        if (num) return jv_float(fx + fy);
        if (a.t == JT_STR && b.t == JT_STR) return concat(c, a, b);
        if (a.t == JT_LIST && b.t == JT_LIST && a.l->tuple == b.l->tuple) {
            struct jv l = jv_list_new(c, a.l->n + b.l->n, a.l->tuple);
            memcpy(l.l->v, a.l->v, a.l->n * sizeof(struct jv));
            memcpy(l.l->v + a.l->n, b.l->v, b.l->n * sizeof(struct jv));
            return l;
        }
        break;
    case JB_SUB:
        if (ints) {
            if (__builtin_sub_overflow(x, y, &r)) goto overflow;
            return jv_int(r);
        }
        if (num) return jv_float(fx - fy);
        break;
    case JB_MUL:
        if (ints) {
            if (__builtin_mul_overflow(x, y, &r)) goto overflow;
            return jv_int(r);
        }
        if (num) return jv_float(fx * fy);
        if ((a.t == JT_STR || a.t == JT_LIST) && is_intlike(b)) return repeat(c, a, num_int(b));
        if ((b.t == JT_STR || b.t == JT_LIST) && is_intlike(a)) return repeat(c, b, num_int(a));
        break;
    case JB_DIV:
        if (num) {
            if (fy == 0) jinja_fail(c, JINJA_ERR_RENDER, "division by zero");
            return jv_float(fx / fy);
        }
        break;
    case JB_FLOORDIV:
    case JB_MOD:
        if (ints) {
            if (y == 0) jinja_fail(c, JINJA_ERR_RENDER, "integer division or modulo by zero");
            if (x == INT64_MIN && y == -1) {
                if (op == JB_MOD) return jv_int(0);
                goto overflow;
            }
            int64_t q = x / y, m = x % y;
            if (m != 0 && ((m < 0) != (y < 0))) {
                q--;
                m += y;
            }
            return jv_int(op == JB_MOD ? m : q);
        }
        if (num) {
            if (fy == 0) jinja_fail(c, JINJA_ERR_RENDER, "float division by zero");
            double m = fmod(fx, fy);
            if (m != 0 && ((m < 0) != (fy < 0))) m += fy;
            if (op == JB_MOD) return jv_float(m);
            return jv_float(floor(fx / fy));
        }
        if (op == JB_MOD && a.t == JT_STR) return jinja_percent_format(c, a, b);
        break;
    case JB_POW:
        if (ints && y >= 0) {
            int64_t acc = 1, base = x;
            for (int64_t e = y; e > 0; e >>= 1) {
                if ((e & 1) && __builtin_mul_overflow(acc, base, &acc)) goto overflow;
                if (e > 1 && __builtin_mul_overflow(base, base, &base)) goto overflow;
            }
            return jv_int(acc);
        }
        if (num) {
            if (fx == 0 && fy < 0)
                jinja_fail(c, JINJA_ERR_RENDER, "0.0 cannot be raised to a negative power");
            return jv_float(pow(fx, fy));
        }
        break;
    case JB_CONCAT: break;
    }
    fail_operands(c, names[op], a, b);
overflow:
    jinja_fail(c, JINJA_ERR_RENDER, "integer overflow in '%s'", names[op]);
}

static bool contains(struct jinja_ctx *c, struct jv hay, struct jv needle) {
    switch (hay.t) {
    case JT_UNDEF: return false;
    case JT_STR:
        if (needle.t != JT_STR)
            jinja_fail(c, JINJA_ERR_RENDER, "'in <string>' requires string as left operand, not %s",
                       jinja_type_name(needle));
        return needle.s.n == 0 || memmem(hay.s.p, hay.s.n, needle.s.p, needle.s.n) != NULL;
    case JT_LIST:
        for (size_t i = 0; i < hay.l->n; i++)
            if (jinja_equal(hay.l->v[i], needle)) return true;
        return false;
    case JT_DICT: {
        size_t i;
        if ((needle.t == JT_LIST && !needle.l->tuple) || needle.t == JT_DICT)
            jinja_fail(c, JINJA_ERR_RENDER, "unhashable type: '%s'", jinja_type_name(needle));
        return jinja_dict_find(hay.d, needle, &i);
    }
    default:
        jinja_fail(c, JINJA_ERR_RENDER, "argument of type '%s' is not iterable",
                   jinja_type_name(hay));
    }
}

static bool compare_op(struct jinja_ctx *c, enum jinja_cmpop op, struct jv a, struct jv b) {
    switch (op) {
    case JC_EQ: return jinja_equal(a, b);
    case JC_NE: return !jinja_equal(a, b);
    case JC_IN: return contains(c, b, a);
    case JC_NOTIN: return !contains(c, b, a);
    default: break;
    }
    if (a.t == JT_UNDEF) jinja_fail_undefined(c, a);
    if (b.t == JT_UNDEF) jinja_fail_undefined(c, b);
    int r = jinja_compare(c, a, b);
    switch (op) {
    case JC_LT: return r < 0;
    case JC_LE: return r <= 0;
    case JC_GT: return r > 0;
    case JC_GE: return r >= 0;
    default: return false;
    }
}

/* ---- expressions --------------------------------------------------------------------- */

static struct jv eval(struct jinja_ctx *c, const struct jinja_expr *e, struct jinja_frame *f);

static void eval_args(struct jinja_ctx *c, const struct jinja_args *a, struct jinja_frame *f,
                      struct jinja_callargs *out) {
    out->n = (size_t)a->n;
    out->nkw = (size_t)a->nkw;
    out->pos = a->n ? jinja_alloc(c, (size_t)a->n * sizeof(struct jv)) : NULL;
    out->kw = a->kw;
    out->kwv = a->nkw ? jinja_alloc(c, (size_t)a->nkw * sizeof(struct jv)) : NULL;
    for (int i = 0; i < a->n; i++) out->pos[i] = eval(c, a->pos[i], f);
    for (int i = 0; i < a->nkw; i++) out->kwv[i] = eval(c, a->kwv[i], f);
}

static struct jv eval_name(struct jinja_ctx *c, const char *name, struct jinja_frame *f) {
    struct jv v;
    if (frame_lookup(f, name, &v)) return v;
    int g = jinja_find_global(name);
    if (g >= 0) return (struct jv){.t = JT_FUNC, .fn = g};
    return jv_undef(name);
}

static struct jv eval_inner(struct jinja_ctx *c, const struct jinja_expr *e,
                            struct jinja_frame *f) {
    switch (e->kind) {
    case JE_CONST: return e->konst;
    case JE_NAME: return eval_name(c, e->name, f);
    case JE_BLOCK: return c->block;
    case JE_LIST:
    case JE_TUPLE: {
        struct jv l = jv_list_new(c, (size_t)e->list.n, e->kind == JE_TUPLE);
        for (int i = 0; i < e->list.n; i++) l.l->v[i] = eval(c, e->list.v[i], f);
        return l;
    }
    case JE_DICT: {
        struct jv d = jv_dict_new(c, (size_t)e->dict.n);
        d.d->n = 0;
        for (int i = 0; i < e->dict.n; i++) {
            struct jv k = eval(c, e->dict.k[i], f), v = eval(c, e->dict.v[i], f);
            if ((k.t == JT_LIST && !k.l->tuple) || k.t == JT_DICT || k.t == JT_UNDEF)
                jinja_fail(c, JINJA_ERR_RENDER, "unhashable type: '%s'", jinja_type_name(k));
            size_t at;
            if (jinja_dict_find(d.d, k, &at)) {
                d.d->v[at] = v;
            } else {
                d.d->k[d.d->n] = k;
                d.d->v[d.d->n++] = v;
            }
        }
        return d;
    }
    case JE_ATTR: return jinja_getattr(c, eval(c, e->attr.obj, f), e->attr.name);
    case JE_ITEM: return jinja_getitem(c, eval(c, e->item.obj, f), eval(c, e->item.index, f));
    case JE_SLICE: {
        struct jv obj = eval(c, e->slice.obj, f);
        struct jv a = e->slice.start ? eval(c, e->slice.start, f) : jv_none();
        struct jv b = e->slice.stop ? eval(c, e->slice.stop, f) : jv_none();
        struct jv s = e->slice.step ? eval(c, e->slice.step, f) : jv_none();
        return jinja_slice(c, obj, a, b, s);
    }
    case JE_CALL: {
        struct jinja_callargs a;
        const struct jinja_expr *fn = e->call.fn;
        if (fn->kind == JE_ATTR) { // obj.method(...) without making a bound method
            struct jv obj = eval(c, fn->attr.obj, f);
            if (obj.t != JT_NS && obj.t != JT_LOOP && jinja_has_method(obj, fn->attr.name)) {
                eval_args(c, &e->call.args, f, &a);
                c->line = e->line;
                return jinja_call_method(c, obj, fn->attr.name, &a);
            }
            struct jv callee = jinja_getattr(c, obj, fn->attr.name);
            eval_args(c, &e->call.args, f, &a);
            c->line = e->line;
            return jinja_call(c, callee, &a);
        }
        struct jv callee = eval(c, fn, f);
        eval_args(c, &e->call.args, f, &a);
        c->line = e->line;
        return jinja_call(c, callee, &a);
    }
    case JE_FILTER: {
        struct jv v = eval(c, e->ft.obj, f);
        struct jinja_callargs a;
        eval_args(c, &e->ft.args, f, &a);
        c->line = e->line;
        if (!e->ft.filter) jinja_fail(c, JINJA_ERR_RENDER, "no filter named '%s'", e->ft.name);
        return e->ft.filter(c, v, &a);
    }
    case JE_TEST: {
        struct jv v = eval(c, e->ft.obj, f);
        struct jinja_callargs a;
        eval_args(c, &e->ft.args, f, &a);
        c->line = e->line;
        if (!e->ft.test) jinja_fail(c, JINJA_ERR_RENDER, "no test named '%s'", e->ft.name);
        return jv_bool(e->ft.test(c, v, &a) != e->ft.negate);
    }
    case JE_NOT: return jv_bool(!jinja_truthy(eval(c, e->un, f)));
    case JE_NEG:
    case JE_POS: {
        struct jv v = eval(c, e->un, f);
        if (v.t == JT_UNDEF) jinja_fail_undefined(c, v);
        if (is_intlike(v)) {
            int64_t x = num_int(v);
            if (e->kind == JE_POS) return jv_int(x);
            if (x == INT64_MIN) jinja_fail(c, JINJA_ERR_RENDER, "integer overflow in '-'");
            return jv_int(-x);
        }
        if (v.t == JT_FLOAT) return jv_float(e->kind == JE_NEG ? -v.f : v.f);
        jinja_fail(c, JINJA_ERR_RENDER, "bad operand type for unary %s: '%s'",
                   e->kind == JE_NEG ? "-" : "+", jinja_type_name(v));
    }
    case JE_BIN: {
        struct jv a = eval(c, e->bin.a, f), b = eval(c, e->bin.b, f);
        c->line = e->line;
        return binop(c, e->bin.op, a, b);
    }
    case JE_AND: {
        struct jv a = eval(c, e->bin.a, f);
        return jinja_truthy(a) ? eval(c, e->bin.b, f) : a;
    }
    case JE_OR: {
        struct jv a = eval(c, e->bin.a, f);
        return jinja_truthy(a) ? a : eval(c, e->bin.b, f);
    }
    case JE_CMP: {
        struct jv a = eval(c, e->cmp.first, f);
        for (int i = 0; i < e->cmp.n; i++) {
            struct jv b = eval(c, e->cmp.rest[i], f);
            c->line = e->line;
            if (!compare_op(c, e->cmp.ops[i], a, b)) return jv_bool(false);
            a = b;
        }
        return jv_bool(true);
    }
    case JE_COND:
        if (jinja_truthy(eval(c, e->cond.cond, f))) return eval(c, e->cond.then, f);
        return e->cond.els ? eval(c, e->cond.els, f) : jv_undef(NULL);
    }
    jinja_fail(c, JINJA_ERR_RENDER, "bad expression");
}

static struct jv eval(struct jinja_ctx *c, const struct jinja_expr *e, struct jinja_frame *f) {
    jinja_depth_enter(c);
    int line = c->line;
    c->line = e->line;
    struct jv v = eval_inner(c, e, f);
    c->line = line;
    jinja_depth_leave(c);
    return v;
}

/* ---- statements ---------------------------------------------------------------------- */

enum flow { FLOW_NORMAL, FLOW_BREAK, FLOW_CONTINUE };

static enum flow exec_body(struct jinja_ctx *c, const struct jinja_body *b, struct jinja_frame *f);

static void assign(struct jinja_ctx *c, const struct jinja_target *t, struct jinja_frame *f,
                   struct jv v) {
    switch (t->kind) {
    case JTG_NAME: frame_set(c, f, t->name, v); return;
    case JTG_TUPLE: {
        const struct jinja_list *l = jinja_iterate(c, v);
        if (l->n != (size_t)t->n)
            jinja_fail(c, JINJA_ERR_RENDER, "%s values to unpack (expected %d, got %zu)",
                       l->n > (size_t)t->n ? "too many" : "not enough", t->n, l->n);
        for (int i = 0; i < t->n; i++) frame_set(c, f, t->names[i], l->v[i]);
        return;
    }
    case JTG_ATTR: {
        struct jv ns = eval_name(c, t->name, f);
        if (ns.t != JT_NS)
            jinja_fail(c, JINJA_ERR_RENDER, "cannot assign attribute on non-namespace object");
        struct jinja_ns *n = ns.ns;
        size_t i;
        if (jinja_dict_find_str(&n->d, t->attr, &i)) {
            n->d.v[i] = v;
            return;
        }
        if (n->d.n == n->cap) {
            size_t cap = n->cap ? n->cap * 2 : 4;
            struct jv *k = jinja_alloc(c, cap * sizeof *k), *vv = jinja_alloc(c, cap * sizeof *vv);
            if (n->d.n) {
                memcpy(k, n->d.k, n->d.n * sizeof *k);
                memcpy(vv, n->d.v, n->d.n * sizeof *vv);
            }
            n->d.k = k;
            n->d.v = vv;
            n->cap = cap;
        }
        n->d.k[n->d.n] = jv_cstr(t->attr);
        n->d.v[n->d.n++] = v;
        return;
    }
    }
}

/* Renders body into a fresh buffer (macro calls, {% set %} blocks, {% filter %}). */
static struct jv capture(struct jinja_ctx *c, const struct jinja_body *body,
                         struct jinja_frame *f) {
    struct jinja_buf *saved = c->out;
    struct jinja_buf buf = jinja_buf_tmp(c);
    c->out = &buf;
    exec_body(c, body, f);
    c->out = saved;
    return jinja_buf_value(&buf);
}

static struct jv call_macro(struct jinja_ctx *c, const struct jinja_macro *m,
                            const struct jinja_callargs *a) {
    const struct jinja_stmt *d = m->def;
    jinja_step(c);
    struct jinja_frame *f = frame_new(c, m->closure);
    bool *used = jinja_alloc(c, (a->nkw ? a->nkw : 1) * sizeof *used);
    memset(used, 0, (a->nkw ? a->nkw : 1) * sizeof *used);
    for (int i = 0; i < d->macro.n; i++) {
        const char *p = d->macro.params[i];
        struct jv v;
        bool have = false;
        if ((size_t)i < a->n) {
            v = a->pos[i];
            have = true;
        }
        for (size_t k = 0; k < a->nkw; k++)
            if (!strcmp(a->kw[k], p)) {
                if (have)
                    jinja_fail(c, JINJA_ERR_RENDER,
                               "macro '%s' got multiple values for argument '%s'", d->macro.name,
                               p);
                v = a->kwv[k];
                used[k] = true;
                have = true;
            }
        if (!have) v = d->macro.defaults[i] ? eval(c, d->macro.defaults[i], f) : jv_undef(p);
        frame_set(c, f, p, v);
    }
    size_t extra = a->n > (size_t)d->macro.n ? a->n - (size_t)d->macro.n : 0;
    struct jv varargs = jv_list_new(c, extra, true);
    for (size_t i = 0; i < extra; i++) varargs.l->v[i] = a->pos[(size_t)d->macro.n + i];
    struct jv kwargs = jv_dict_new(c, a->nkw);
    kwargs.d->n = 0;
    for (size_t k = 0; k < a->nkw; k++)
        if (!used[k]) {
            kwargs.d->k[kwargs.d->n] = jv_cstr(a->kw[k]);
            kwargs.d->v[kwargs.d->n++] = a->kwv[k];
        }
    frame_set(c, f, "varargs", varargs);
    frame_set(c, f, "kwargs", kwargs);
    jinja_depth_enter(c);
    struct jv out = capture(c, &d->macro.body, f);
    jinja_depth_leave(c);
    return out;
}

struct jv jinja_call(struct jinja_ctx *c, struct jv fn, const struct jinja_callargs *a) {
    switch (fn.t) {
    case JT_FUNC: return jinja_call_global(c, fn.fn, a);
    case JT_METHOD: return jinja_call_method(c, fn.m->self, fn.m->name, a);
    case JT_MACRO: return call_macro(c, fn.macro, a);
    case JT_UNDEF: jinja_fail_undefined(c, fn);
    default: jinja_fail(c, JINJA_ERR_RENDER, "'%s' object is not callable", jinja_type_name(fn));
    }
}

static enum flow exec_for(struct jinja_ctx *c, const struct jinja_stmt *s, struct jinja_frame *f) {
    const struct jinja_list *items = jinja_iterate(c, eval(c, s->for_.iter, f));
    if (s->for_.filter) { // {% for x in xs if cond %}: loop.length counts the kept items
        struct jv kept = jv_list_new(c, items->n, false);
        size_t n = 0;
        struct jinja_frame *tf = frame_new(c, f);
        for (size_t i = 0; i < items->n; i++) {
            jinja_step(c);
            tf->n = 0;
            assign(c, &s->for_.tgt, tf, items->v[i]);
            if (jinja_truthy(eval(c, s->for_.filter, tf))) kept.l->v[n++] = items->v[i];
        }
        kept.l->n = n;
        items = kept.l;
    }
    if (items->n == 0) return exec_body(c, &s->for_.els, f);

    struct jinja_loop *loop = jinja_alloc(c, sizeof *loop);
    loop->items = items;
    loop->depth0 = 0;
    struct frame_ext *body = NULL;
    for (size_t i = 0; i < items->n; i++) {
        jinja_step(c);
        // A fresh scope per iteration (jinja semantics); reused unless a macro captured it.
        if (!body || body->captured) body = (struct frame_ext *)frame_new(c, f);
        body->f.n = 0;
        loop->index0 = (int64_t)i;
        c->line = s->line;
        assign(c, &s->for_.tgt, &body->f, items->v[i]);
        frame_set(c, &body->f, "loop", (struct jv){.t = JT_LOOP, .loop = loop});
        enum flow r = exec_body(c, &s->for_.body, &body->f);
        if (r == FLOW_BREAK) break;
    }
    return FLOW_NORMAL;
}

static enum flow exec_stmt(struct jinja_ctx *c, const struct jinja_stmt *s, struct jinja_frame *f) {
    jinja_step(c);
    c->line = s->line;
    switch (s->kind) {
    case JS_TEXT: jinja_buf_put(c, c->out, s->text.p, s->text.n); break;
    case JS_PRINT: {
        struct jv v = eval(c, s->expr, f);
        jinja_write_str(c, c->out, v);
        break;
    }
    case JS_IF:
        for (int i = 0; i < s->if_.n; i++)
            if (jinja_truthy(eval(c, s->if_.conds[i], f)))
                return exec_body(c, &s->if_.bodies[i], f);
        return exec_body(c, &s->if_.els, f);
    case JS_FOR: return exec_for(c, s, f);
    case JS_SET: assign(c, &s->set.tgt, f, eval(c, s->set.value, f)); break;
    case JS_SET_BLOCK: {
        struct jv v = capture(c, &s->set.body, frame_new(c, f));
        if (s->set.value) {
            struct jv saved = c->block;
            c->block = v;
            v = eval(c, s->set.value, f);
            c->block = saved;
        }
        assign(c, &s->set.tgt, f, v);
        break;
    }
    case JS_MACRO: {
        struct jinja_macro *m = jinja_alloc(c, sizeof *m);
        m->def = s;
        m->closure = f;
        ((struct frame_ext *)f)->captured = true;
        frame_set(c, f, s->macro.name, (struct jv){.t = JT_MACRO, .macro = m});
        break;
    }
    case JS_BREAK: return FLOW_BREAK;
    case JS_CONTINUE: return FLOW_CONTINUE;
    case JS_FILTER: {
        struct jv saved = c->block;
        c->block = capture(c, &s->filter.body, frame_new(c, f));
        struct jv v = eval(c, s->filter.chain, f);
        c->block = saved;
        jinja_write_str(c, c->out, v);
        break;
    }
    case JS_WITH: {
        struct jinja_frame *w = frame_new(c, f);
        for (int i = 0; i < s->with.n; i++)
            assign(c, &s->with.tgts[i], w, eval(c, s->with.vals[i], f));
        return exec_body(c, &s->with.body, w);
    }
    case JS_SCOPE: return exec_body(c, &s->scope, f);
    }
    return FLOW_NORMAL;
}

static enum flow exec_body(struct jinja_ctx *c, const struct jinja_body *b, struct jinja_frame *f) {
    jinja_depth_enter(c);
    enum flow r = FLOW_NORMAL;
    for (int i = 0; i < b->n && r == FLOW_NORMAL; i++) r = exec_stmt(c, b->v[i], f);
    jinja_depth_leave(c);
    return r;
}

/* ---- entry --------------------------------------------------------------------------- */

static struct jv from_json(struct jinja_ctx *c, const cJSON *j) {
    if (cJSON_IsBool(j)) return jv_bool(cJSON_IsTrue(j));
    if (cJSON_IsNumber(j)) {
        double d = j->valuedouble;
        if (d == floor(d) && fabs(d) <= 9007199254740992.0) return jv_int((int64_t)d);
        return jv_float(d);
    }
    if (cJSON_IsString(j) || cJSON_IsRaw(j))
        return j->valuestring ? jv_cstr(j->valuestring) : jv_str("", 0);
    if (cJSON_IsArray(j) || cJSON_IsObject(j)) {
        jinja_depth_enter(c);
        size_t n = 0;
        for (const cJSON *e = j->child; e; e = e->next) n++;
        struct jv r;
        if (cJSON_IsArray(j)) {
            r = jv_list_new(c, n, false);
            size_t i = 0;
            for (const cJSON *e = j->child; e; e = e->next) r.l->v[i++] = from_json(c, e);
        } else {
            r = jv_dict_new(c, n);
            size_t i = 0;
            for (const cJSON *e = j->child; e; e = e->next, i++) {
                r.d->k[i] = jv_cstr(e->string ? e->string : "");
                r.d->v[i] = from_json(c, e);
            }
        }
        jinja_depth_leave(c);
        return r;
    }
    return jv_none();
}

int jinja_render(const struct jinja_template *t, const cJSON *vars, const struct jinja_limits *lim,
                 char **out, size_t *out_len, char *err, size_t errlen) {
    *out = NULL;
    if (out_len) *out_len = 0;
    if (err && errlen) err[0] = 0;
    if (!t || (vars && !cJSON_IsObject(vars))) {
        if (err && errlen) snprintf(err, errlen, "jinja_render: vars must be a JSON object");
        return JINJA_ERR_INVALID;
    }
    struct jinja_ctx *c = calloc(1, sizeof *c);
    if (!c) return JINJA_ERR_NOMEM;
    c->err = err;
    c->errlen = errlen;
    c->lim = lim ? *lim : jinja_limits_default;
    c->arena.limit = c->lim.max_memory;
    c->block = jv_undef(NULL);

    int status = setjmp(c->jmp);
    if (status == 0) {
        struct jinja_frame *globals = frame_new(c, NULL);
        if (vars)
            for (const cJSON *e = vars->child; e; e = e->next)
                if (e->string) frame_set(c, globals, e->string, from_json(c, e));
        struct jinja_buf *buf = jinja_alloc(c, sizeof *buf);
        *buf = (struct jinja_buf){.limit = c->lim.max_output};
        c->out = buf;
        exec_body(c, &t->body, globals);
        char *s = malloc(buf->n + 1);
        if (!s) {
            status = JINJA_ERR_NOMEM;
        } else {
            if (buf->n) memcpy(s, buf->p, buf->n);
            s[buf->n] = 0;
            *out = s;
            if (out_len) *out_len = buf->n;
        }
    } else if (status == JINJA_ERR_NOMEM && err && errlen && !err[0]) {
        snprintf(err, errlen, "out of memory");
    }
    jinja_arena_free(&c->arena);
    free(c);
    return status;
}
