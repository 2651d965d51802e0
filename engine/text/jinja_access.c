/* jinja_access: what a template reaches inside a value: attributes (methods first, then items,
 * as jinja's getattr does), items and slices, iteration; and the arguments of a call. The
 * evaluator, the filters and the methods all use it; it calls none of them (jinja_methods.c
 * implements the methods whose names are listed here). */
#include "engine/text/jinja_impl.h"

#include <string.h>

/* ---- attributes ---------------------------------------------------------------------- */

static const char *const str_methods[] = {
    "startswith", "endswith",     "strip",        "lstrip",  "rstrip",  "split",      "rsplit",
    "splitlines", "replace",      "upper",        "lower",   "title",   "capitalize", "swapcase",
    "casefold",   "find",         "rfind",        "index",   "rindex",  "count",      "join",
    "isdigit",    "isnumeric",    "isdecimal",    "isalpha", "isalnum", "isspace",    "islower",
    "isupper",    "removeprefix", "removesuffix", "format",  "center",  "ljust",      "rjust",
    "zfill",      "partition",    "rpartition",   NULL};
static const char *const list_methods[] = {"index",  "count",   "append", "extend", "insert", "pop",
                                           "remove", "reverse", "sort",   "clear",  NULL};
static const char *const dict_methods[] = {"items", "keys",    "values", "get",
                                           "copy",  "pop",     "update", "setdefault",
                                           "clear", "popitem", NULL};

static bool in_names(const char *const *names, const char *name) {
    for (int i = 0; names[i]; i++)
        if (!strcmp(names[i], name)) return true;
    return false;
}

bool jinja_has_method(struct jv self, const char *name) {
    switch (self.t) {
    case JT_STR: return in_names(str_methods, name);
    case JT_LIST: return in_names(list_methods, name);
    case JT_DICT: return in_names(dict_methods, name);
    case JT_LOOP: return !strcmp(name, "cycle");
    default: return false;
    }
}

static struct jv bound_method(struct jinja_ctx *c, struct jv self, const char *name) {
    struct jinja_method *m = jinja_alloc(c, sizeof *m);
    m->self = self;
    m->name = name;
    return (struct jv){.t = JT_METHOD, .m = m};
}

static struct jv loop_attr(struct jinja_ctx *c, struct jv v, const char *name) {
    const struct jinja_loop *l = v.loop;
    int64_t n = (int64_t)l->items->n, i = l->index0;
    if (!strcmp(name, "index")) return jv_int(i + 1);
    if (!strcmp(name, "index0")) return jv_int(i);
    if (!strcmp(name, "revindex")) return jv_int(n - i);
    if (!strcmp(name, "revindex0")) return jv_int(n - i - 1);
    if (!strcmp(name, "first")) return jv_bool(i == 0);
    if (!strcmp(name, "last")) return jv_bool(i == n - 1);
    if (!strcmp(name, "length")) return jv_int(n);
    if (!strcmp(name, "depth")) return jv_int(l->depth0 + 1);
    if (!strcmp(name, "depth0")) return jv_int(l->depth0);
    if (!strcmp(name, "previtem")) return i > 0 ? l->items->v[i - 1] : jv_undef("previtem");
    if (!strcmp(name, "nextitem")) return i + 1 < n ? l->items->v[i + 1] : jv_undef("nextitem");
    if (!strcmp(name, "cycle")) return bound_method(c, v, "cycle");
    return jv_undef(name);
}

/* obj.name: Python attributes (methods) first, then items, as jinja's getattr does. */
struct jv jinja_getattr(struct jinja_ctx *c, struct jv obj, const char *name) {
    size_t i;
    switch (obj.t) {
    case JT_UNDEF: jinja_fail_undefined(c, obj);
    case JT_DICT:
        if (jinja_has_method(obj, name)) return bound_method(c, obj, name);
        return jinja_dict_find_str(obj.d, name, &i) ? obj.d->v[i] : jv_undef(name);
    case JT_NS: return jinja_dict_find_str(&obj.ns->d, name, &i) ? obj.ns->d.v[i] : jv_undef(name);
    case JT_LOOP: return loop_attr(c, obj, name);
    default:
        if (jinja_has_method(obj, name)) return bound_method(c, obj, name);
        return jv_undef(name);
    }
}

/* ---- items and slices ---------------------------------------------------------------- */

/* Byte offset of code point index k in s (k <= count). */
static size_t cp_offset(const char *p, size_t n, size_t k) {
    size_t i = 0;
    uint32_t cp;
    while (k-- > 0 && i < n) i += jinja_utf8_decode(p + i, n - i, &cp);
    return i;
}

static bool as_index(struct jv key, int64_t *out) {
    if (key.t == JT_INT)
        *out = key.i;
    else if (key.t == JT_BOOL)
        *out = key.b;
    else
        return false;
    return true;
}

/* obj[key]: items first, then attributes (jinja's getitem). */
struct jv jinja_getitem(struct jinja_ctx *c, struct jv obj, struct jv key) {
    int64_t idx;
    size_t i;
    switch (obj.t) {
    case JT_UNDEF: jinja_fail_undefined(c, obj);
    case JT_LIST:
        if (as_index(key, &idx)) {
            int64_t n = (int64_t)obj.l->n;
            if (idx < 0) idx += n;
            return idx >= 0 && idx < n ? obj.l->v[idx] : jv_undef(NULL);
        }
        break;
    case JT_STR:
        if (as_index(key, &idx)) {
            int64_t n = (int64_t)jinja_utf8_count(obj.s.p, obj.s.n);
            if (idx < 0) idx += n;
            if (idx < 0 || idx >= n) return jv_undef(NULL);
            size_t a = cp_offset(obj.s.p, obj.s.n, (size_t)idx);
            uint32_t cp;
            size_t len = jinja_utf8_decode(obj.s.p + a, obj.s.n - a, &cp);
            return jv_str(obj.s.p + a, len);
        }
        break;
    case JT_DICT:
        if (jinja_dict_find(obj.d, key, &i)) return obj.d->v[i];
        break;
    default: break;
    }
    if (key.t == JT_STR) {
        char *name = jinja_alloc(c, key.s.n + 1);
        memcpy(name, key.s.p, key.s.n);
        name[key.s.n] = 0;
        if (strlen(name) == key.s.n) return jinja_getattr(c, obj, name);
    }
    return jv_undef(NULL);
}

/* Python's slice.indices(): normalised start, stop, step for a sequence of length n. */
static void slice_indices(struct jinja_ctx *c, struct jv vstart, struct jv vstop, struct jv vstep,
                          int64_t n, int64_t *start, int64_t *stop, int64_t *step) {
    int64_t st = 1;
    if (vstep.t != JT_NONE && vstep.t != JT_UNDEF) {
        if (!as_index(vstep, &st))
            jinja_fail(c, JINJA_ERR_RENDER, "slice indices must be integers");
        if (st == 0) jinja_fail(c, JINJA_ERR_RENDER, "slice step cannot be zero");
    }
    int64_t lo = st < 0 ? -1 : 0, hi = st < 0 ? n - 1 : n;
    int64_t a = st < 0 ? hi : lo, b = st < 0 ? lo : hi;
    struct jv bounds[2] = {vstart, vstop};
    int64_t *dst[2] = {&a, &b};
    for (int k = 0; k < 2; k++) {
        if (bounds[k].t == JT_NONE || bounds[k].t == JT_UNDEF) continue;
        int64_t x;
        if (!as_index(bounds[k], &x))
            jinja_fail(c, JINJA_ERR_RENDER, "slice indices must be integers");
        if (x < 0) {
            x += n;
            if (x < lo) x = lo;
        } else if (x > hi) {
            x = hi;
        }
        *dst[k] = x;
    }
    *start = a;
    *stop = b;
    *step = st;
}

/* obj[a:b:s]. jinja compiles slices to plain Python subscripts, so unlike obj[key] a bad
 * slice is an error, not Undefined. */
struct jv jinja_slice(struct jinja_ctx *c, struct jv obj, struct jv a, struct jv b, struct jv s) {
    int64_t start, stop, step;
    if (obj.t == JT_UNDEF) jinja_fail_undefined(c, obj);
    if (obj.t == JT_LIST) {
        slice_indices(c, a, b, s, (int64_t)obj.l->n, &start, &stop, &step);
        size_t cnt = 0;
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) cnt++;
        struct jv r = jv_list_new(c, cnt, obj.l->tuple);
        size_t k = 0;
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
            r.l->v[k++] = obj.l->v[i];
        return r;
    }
    if (obj.t == JT_STR) {
        bool ascii = jinja_is_ascii(obj.s.p, obj.s.n);
        size_t n = ascii ? obj.s.n : jinja_utf8_count(obj.s.p, obj.s.n);
        size_t *off = NULL; // code point offsets, for non-ASCII strings
        if (!ascii) {
            off = jinja_alloc(c, (n + 1) * sizeof *off);
            size_t i = 0, k = 0;
            uint32_t cp;
            while (i < obj.s.n) {
                off[k++] = i;
                i += jinja_utf8_decode(obj.s.p + i, obj.s.n - i, &cp);
            }
            off[k] = obj.s.n;
        }
        slice_indices(c, a, b, s, (int64_t)n, &start, &stop, &step);
        if (step == 1) {
            if (stop <= start) return jv_str("", 0);
            size_t x = ascii ? (size_t)start : off[start], y = ascii ? (size_t)stop : off[stop];
            return jv_str(obj.s.p + x, y - x);
        }
        struct jinja_buf buf = jinja_buf_tmp(c);
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
            size_t x = ascii ? (size_t)i : off[i], y = ascii ? (size_t)i + 1 : off[i + 1];
            jinja_buf_put(c, &buf, obj.s.p + x, y - x);
        }
        return jinja_buf_value(&buf);
    }
    if (obj.t == JT_DICT) jinja_fail(c, JINJA_ERR_RENDER, "unhashable type: 'slice'");
    jinja_fail(c, JINJA_ERR_RENDER, "'%s' object is not subscriptable", jinja_type_name(obj));
}

/* ---- iteration ----------------------------------------------------------------------- */

const struct jinja_list *jinja_iterate(struct jinja_ctx *c, struct jv v) {
    static const struct jinja_list empty = {0};
    switch (v.t) {
    case JT_UNDEF: return &empty;
    case JT_LIST: return v.l;
    case JT_DICT: {
        struct jv r = jv_list_new(c, v.d->n, false);
        memcpy(r.l->v, v.d->k, v.d->n * sizeof *r.l->v);
        return r.l;
    }
    case JT_STR: {
        size_t n = jinja_utf8_count(v.s.p, v.s.n);
        struct jv r = jv_list_new(c, n, false);
        size_t i = 0;
        for (size_t k = 0; k < n; k++) {
            uint32_t cp;
            size_t len = jinja_utf8_decode(v.s.p + i, v.s.n - i, &cp);
            r.l->v[k] = jv_str(v.s.p + i, len);
            i += len;
        }
        return r.l;
    }
    default: jinja_fail(c, JINJA_ERR_RENDER, "'%s' object is not iterable", jinja_type_name(v));
    }
}

/* ---- call arguments ------------------------------------------------------------------ */

const struct jv *jinja_arg(const struct jinja_callargs *a, int pos, const char *kw) {
    if (pos >= 0 && (size_t)pos < a->n) return &a->pos[pos];
    if (kw)
        for (size_t i = 0; i < a->nkw; i++)
            if (!strcmp(a->kw[i], kw)) return &a->kwv[i];
    return NULL;
}

struct jv jinja_need_str(struct jinja_ctx *c, const struct jv *v, const char *what) {
    if (!v || v->t != JT_STR)
        jinja_fail(c, JINJA_ERR_RENDER, "%s must be a string, not %s", what,
                   v ? jinja_type_name(*v) : "nothing");
    return *v;
}

int64_t jinja_need_int(struct jinja_ctx *c, const struct jv *v, const char *what) {
    if (v && v->t == JT_INT) return v->i;
    if (v && v->t == JT_BOOL) return v->b;
    jinja_fail(c, JINJA_ERR_RENDER, "%s must be an integer, not %s", what,
               v ? jinja_type_name(*v) : "nothing");
}

const struct jv *jinja_need_arg(struct jinja_ctx *c, const struct jinja_callargs *a, int pos,
                                const char *kw) {
    const struct jv *v = jinja_arg(a, pos, kw);
    if (!v) jinja_fail(c, JINJA_ERR_RENDER, "missing argument '%s'", kw);
    return v;
}

bool jinja_arg_bool(const struct jinja_callargs *a, int pos, const char *kw, bool def) {
    const struct jv *v = jinja_arg(a, pos, kw);
    return v ? jinja_truthy(*v) : def;
}

const char *jinja_cstr(struct jinja_ctx *c, struct jv s) {
    char *p = jinja_alloc(c, s.s.n + 1);
    memcpy(p, s.s.p, s.s.n);
    p[s.s.n] = 0;
    return p;
}
