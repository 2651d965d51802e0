/* jinja_builtins: tests and filters, each named and behaving as in jinja2 (HF's tojson for
 * tojson). The global functions are in jinja_globals.c. */
#include "engine/text/jinja_impl.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The signatures of jinja_test_fn and jinja_filter_fn: the value v, arguments a. */
#define TEST(name) \
    static bool name(struct jinja_ctx *c, struct jv v, const struct jinja_callargs *a)
#define FILTER(name) \
    static struct jv name(struct jinja_ctx *c, struct jv v, const struct jinja_callargs *a)

/* ---- tests --------------------------------------------------------------------------- */

static const struct jv *test_arg(struct jinja_ctx *c, const struct jinja_callargs *a) {
    const struct jv *x = jinja_arg(a, 0, NULL);
    if (!x) jinja_fail(c, JINJA_ERR_RENDER, "this test takes an argument");
    return x;
}

TEST(t_defined) { return v.t != JT_UNDEF; }
TEST(t_undefined) { return v.t == JT_UNDEF; }
TEST(t_none) { return v.t == JT_NONE; }
TEST(t_boolean) { return v.t == JT_BOOL; }
TEST(t_true) { return v.t == JT_BOOL && v.b; }
TEST(t_false) { return v.t == JT_BOOL && !v.b; }
TEST(t_integer) { return v.t == JT_INT; }
TEST(t_float) { return v.t == JT_FLOAT; }
TEST(t_number) { return jinja_is_number(v); }
TEST(t_string) { return v.t == JT_STR; }
TEST(t_mapping) { return v.t == JT_DICT; }
TEST(t_iterable) { return v.t == JT_STR || v.t == JT_LIST || v.t == JT_DICT || v.t == JT_UNDEF; }
TEST(t_sequence) { return v.t == JT_STR || v.t == JT_LIST || v.t == JT_DICT || v.t == JT_UNDEF; }
TEST(t_callable) {
    // jinja's Undefined has a __call__ (that raises), so Python calls it callable
    return v.t == JT_MACRO || v.t == JT_FUNC || v.t == JT_METHOD || v.t == JT_UNDEF;
}
TEST(t_sameas) {
    struct jv o = *test_arg(c, a);
    if (v.t != o.t) return false;
    switch (v.t) {
    case JT_LIST: return v.l == o.l;
    case JT_DICT: return v.d == o.d;
    case JT_STR: return v.s.p == o.s.p && v.s.n == o.s.n;
    default: return jinja_equal(v, o);
    }
}
TEST(t_eq) { return jinja_equal(v, *test_arg(c, a)); }
TEST(t_ne) { return !jinja_equal(v, *test_arg(c, a)); }
TEST(t_lt) { return jinja_compare(c, v, *test_arg(c, a)) < 0; }
TEST(t_le) { return jinja_compare(c, v, *test_arg(c, a)) <= 0; }
TEST(t_gt) { return jinja_compare(c, v, *test_arg(c, a)) > 0; }
TEST(t_ge) { return jinja_compare(c, v, *test_arg(c, a)) >= 0; }
TEST(t_in) {
    struct jv hay = *test_arg(c, a);
    if (hay.t == JT_STR) {
        if (v.t != JT_STR)
            jinja_fail(c, JINJA_ERR_RENDER, "'in <string>' requires string as left operand");
        return v.s.n == 0 || memmem(hay.s.p, hay.s.n, v.s.p, v.s.n);
    }
    if (hay.t == JT_DICT) {
        for (size_t i = 0; i < hay.d->n; i++)
            if (jinja_equal(hay.d->k[i], v)) return true;
        return false;
    }
    const struct jinja_list *l = jinja_iterate(c, hay);
    for (size_t i = 0; i < l->n; i++)
        if (jinja_equal(l->v[i], v)) return true;
    return false;
}
/* value % d == 0 with Python's modulo, for ints and floats (jinja's odd/even/divisibleby). */
static bool divisible(struct jinja_ctx *c, struct jv v, struct jv d) {
    if (!jinja_is_number(v) || !jinja_is_number(d))
        jinja_fail(c, JINJA_ERR_RENDER, "unsupported operand type(s) for %%: '%s' and '%s'",
                   jinja_type_name(v), jinja_type_name(d));
    if (v.t != JT_FLOAT && d.t != JT_FLOAT) {
        int64_t x = v.t == JT_BOOL ? v.b : v.i, y = d.t == JT_BOOL ? d.b : d.i;
        if (y == 0) jinja_fail(c, JINJA_ERR_RENDER, "integer division or modulo by zero");
        return y == -1 || x % y == 0;
    }
    double y = jinja_as_double(d);
    if (y == 0) jinja_fail(c, JINJA_ERR_RENDER, "float modulo");
    return fmod(jinja_as_double(v), y) == 0;
}
TEST(t_odd) { return !divisible(c, v, jv_int(2)); }
TEST(t_even) { return divisible(c, v, jv_int(2)); }
TEST(t_divisibleby) { return divisible(c, v, *test_arg(c, a)); }
TEST(t_lower) {
    struct jv s = jinja_to_str(c, v);
    return jinja_str_all(s, JINJA_CHARS_LOWER);
}
TEST(t_upper) {
    struct jv s = jinja_to_str(c, v);
    return jinja_str_all(s, JINJA_CHARS_UPPER);
}
TEST(t_escaped) { return false; }
TEST(t_filter) { return v.t == JT_STR && jinja_find_filter(jinja_cstr(c, v)) != NULL; }
TEST(t_test) { return v.t == JT_STR && jinja_find_test(jinja_cstr(c, v)) != NULL; }

static const struct {
    const char *name;
    jinja_test_fn fn;
} tests[] = {
    {"defined", t_defined},
    {"undefined", t_undefined},
    {"none", t_none},
    {"boolean", t_boolean},
    {"true", t_true},
    {"false", t_false},
    {"integer", t_integer},
    {"float", t_float},
    {"number", t_number},
    {"string", t_string},
    {"mapping", t_mapping},
    {"iterable", t_iterable},
    {"sequence", t_sequence},
    {"callable", t_callable},
    {"sameas", t_sameas},
    {"eq", t_eq},
    {"equalto", t_eq},
    {"==", t_eq},
    {"ne", t_ne},
    {"!=", t_ne},
    {"lt", t_lt},
    {"lessthan", t_lt},
    {"<", t_lt},
    {"le", t_le},
    {"<=", t_le},
    {"gt", t_gt},
    {"greaterthan", t_gt},
    {">", t_gt},
    {"ge", t_ge},
    {">=", t_ge},
    {"in", t_in},
    {"odd", t_odd},
    {"even", t_even},
    {"divisibleby", t_divisibleby},
    {"lower", t_lower},
    {"upper", t_upper},
    {"escaped", t_escaped},
    {"filter", t_filter},
    {"test", t_test},
};

jinja_test_fn jinja_find_test(const char *name) {
    for (size_t i = 0; i < sizeof tests / sizeof *tests; i++)
        if (!strcmp(tests[i].name, name)) return tests[i].fn;
    return NULL;
}

/* ---- filters ------------------------------------------------------------------------- */

/* attribute= paths of sort/map/...: "a.b.0" */
static struct jv attr_path(struct jinja_ctx *c, struct jv v, struct jv path) {
    size_t i = 0;
    while (i <= path.s.n) {
        const char *dot = memchr(path.s.p + i, '.', path.s.n - i);
        size_t end = dot ? (size_t)(dot - path.s.p) : path.s.n;
        struct jv part = jv_str(path.s.p + i, end - i);
        bool digits = part.s.n > 0;
        for (size_t k = 0; k < part.s.n; k++) digits &= part.s.p[k] >= '0' && part.s.p[k] <= '9';
        v = digits ? jinja_getitem(c, v, jv_int(atoll(jinja_cstr(c, part))))
                   : jinja_getitem(c, v, part);
        if (!dot) break;
        i = end + 1;
    }
    return v;
}

static struct jv attr_of(struct jinja_ctx *c, struct jv v, const struct jv *attr) {
    if (!jinja_given(attr)) return v;
    if (attr->t == JT_INT) return jinja_getitem(c, v, *attr);
    return attr_path(c, v, jinja_need_str(c, attr, "attribute"));
}

/* Sort key: case-folded strings unless case_sensitive (jinja's ignore_case). */
static struct jv sort_key(struct jinja_ctx *c, struct jv v, bool case_sensitive) {
    return (!case_sensitive && v.t == JT_STR) ? jinja_str_recase(c, v, JINJA_CASE_LOWER) : v;
}

struct sort_item {
    struct jv key, val;
};

static void merge_sort(struct jinja_ctx *c, struct sort_item *v, struct sort_item *tmp, size_t n,
                       bool reverse) {
    if (n < 2) return;
    size_t h = n / 2;
    merge_sort(c, v, tmp, h, reverse);
    merge_sort(c, v + h, tmp, n - h, reverse);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        int r = jinja_compare(c, v[j].key, v[i].key);
        if (reverse ? r > 0 : r < 0)
            tmp[k++] = v[j++]; // stable: ties keep the left one
        else
            tmp[k++] = v[i++];
    }
    while (i < h) tmp[k++] = v[i++];
    while (j < n) tmp[k++] = v[j++];
    memcpy(v, tmp, n * sizeof *v);
}

static struct jv sorted(struct jinja_ctx *c, const struct jinja_list *l, bool reverse,
                        bool case_sensitive, const struct jv *attr) {
    struct sort_item *items = jinja_alloc(c, (l->n + 1) * sizeof *items);
    struct sort_item *tmp = jinja_alloc(c, (l->n + 1) * sizeof *tmp);
    for (size_t i = 0; i < l->n; i++) {
        items[i].val = l->v[i];
        items[i].key = sort_key(c, attr_of(c, l->v[i], attr), case_sensitive);
    }
    merge_sort(c, items, tmp, l->n, reverse);
    struct jv out = jv_list_new(c, l->n, false);
    for (size_t i = 0; i < l->n; i++) out.l->v[i] = items[i].val;
    return out;
}

FILTER(f_abs) {
    if (v.t == JT_INT) return jv_int(v.i < 0 && v.i != INT64_MIN ? -v.i : v.i);
    if (v.t == JT_BOOL) return jv_int(v.b);
    if (v.t == JT_FLOAT) return jv_float(fabs(v.f));
    jinja_fail(c, JINJA_ERR_RENDER, "bad operand type for abs(): '%s'", jinja_type_name(v));
}

FILTER(f_attr) {
    return jinja_getattr(
        c, v, jinja_cstr(c, jinja_need_str(c, jinja_arg(a, 0, "name"), "attribute name")));
}

FILTER(f_batch) {
    int64_t n = jinja_need_int(c, jinja_arg(a, 0, "linecount"), "batch size");
    if (n <= 0) jinja_fail(c, JINJA_ERR_RENDER, "batch size must be positive");
    const struct jv *fill = jinja_arg(a, 1, "fill_with");
    const struct jinja_list *l = jinja_iterate(c, v);
    struct jinja_vec out = {0};
    for (size_t i = 0; i < l->n; i += (size_t)n) {
        size_t k = l->n - i < (size_t)n ? l->n - i : (size_t)n;
        struct jv row = jv_list_new(c, jinja_given(fill) ? (size_t)n : k, false);
        for (size_t j = 0; j < row.l->n; j++) row.l->v[j] = j < k ? l->v[i + j] : *fill;
        jinja_vec_push(c, &out, row);
    }
    return jinja_vec_list(c, &out, false);
}

FILTER(f_capitalize) { return jinja_str_recase(c, jinja_to_str(c, v), JINJA_CASE_CAPITALIZE); }

FILTER(f_center) {
    const struct jv *w = jinja_arg(a, 0, "width");
    return jinja_str_pad(c, jinja_to_str(c, v), w ? jinja_need_int(c, w, "width") : 80, 0, " ");
}

FILTER(f_length) {
    switch (v.t) {
    case JT_UNDEF: return jv_int(0);
    case JT_STR: return jv_int((int64_t)jinja_utf8_count(v.s.p, v.s.n));
    case JT_LIST: return jv_int((int64_t)v.l->n);
    case JT_DICT: return jv_int((int64_t)v.d->n);
    default:
        jinja_fail(c, JINJA_ERR_RENDER, "object of type '%s' has no len()", jinja_type_name(v));
    }
}

FILTER(f_default) {
    const struct jv *d = jinja_arg(a, 0, "default_value");
    bool boolean = jinja_arg_bool(a, 1, "boolean", false);
    if (v.t == JT_UNDEF || (boolean && !jinja_truthy(v))) return d ? *d : jv_str("", 0);
    return v;
}

FILTER(f_dictsort) {
    if (v.t != JT_DICT)
        jinja_fail(c, JINJA_ERR_RENDER, "dictsort needs a dict, not %s", jinja_type_name(v));
    bool cs = jinja_arg_bool(a, 0, "case_sensitive", false);
    const struct jv *by = jinja_arg(a, 1, "by");
    bool by_value = by && by->t == JT_STR && by->s.n == 5 && !memcmp(by->s.p, "value", 5);
    bool rev = jinja_arg_bool(a, 2, "reverse", false);
    struct jv pairs = jv_list_new(c, v.d->n, false);
    for (size_t i = 0; i < v.d->n; i++) pairs.l->v[i] = jinja_pair(c, v.d->k[i], v.d->v[i]);
    struct jv idx = jv_int(by_value ? 1 : 0);
    return sorted(c, pairs.l, rev, cs, &idx);
}

FILTER(f_escape) {
    struct jv s = jinja_to_str(c, v);
    struct jinja_buf b = jinja_buf_tmp(c);
    for (size_t i = 0; i < s.s.n; i++) {
        switch (s.s.p[i]) {
        case '&': jinja_buf_puts(c, &b, "&amp;"); break;
        case '<': jinja_buf_puts(c, &b, "&lt;"); break;
        case '>': jinja_buf_puts(c, &b, "&gt;"); break;
        case '"': jinja_buf_puts(c, &b, "&#34;"); break;
        case '\'': jinja_buf_puts(c, &b, "&#39;"); break;
        default: jinja_buf_put(c, &b, s.s.p + i, 1);
        }
    }
    return jinja_buf_value(&b);
}

FILTER(f_first) {
    const struct jinja_list *l = jinja_iterate(c, v);
    return l->n ? l->v[0] : jv_undef("first");
}

FILTER(f_last) {
    const struct jinja_list *l = jinja_iterate(c, v);
    return l->n ? l->v[l->n - 1] : jv_undef("last");
}

FILTER(f_float) {
    const struct jv *d = jinja_arg(a, 0, "default");
    if (jinja_is_number(v)) return jv_float(jinja_as_double(v));
    if (v.t == JT_STR) {
        const char *s = jinja_cstr(c, jinja_str_strip(v, NULL, true, true));
        char *end;
        double x = strtod(s, &end);
        if (*s && !*end) return jv_float(x);
    }
    return d ? *d : jv_float(0.0);
}

FILTER(f_int) {
    const struct jv *d = jinja_arg(a, 0, "default");
    const struct jv *base = jinja_arg(a, 1, "base");
    if (v.t == JT_INT) return v;
    if (v.t == JT_BOOL) return jv_int(v.b);
    if (v.t == JT_FLOAT && isfinite(v.f) && fabs(v.f) < 9.2e18) return jv_int((int64_t)v.f);
    if (v.t == JT_STR) {
        const char *s = jinja_cstr(c, jinja_str_strip(v, NULL, true, true));
        char *end;
        long long x = strtoll(s, &end, base ? (int)jinja_need_int(c, base, "base") : 10);
        if (*s && !*end) return jv_int(x);
        double f = strtod(s, &end);
        if (*s && !*end && isfinite(f) && fabs(f) < 9.2e18) return jv_int((int64_t)f);
    }
    return d ? *d : jv_int(0);
}

FILTER(f_format) {
    struct jv s = jinja_to_str(c, v);
    if (a->nkw) {
        struct jv d = jv_dict_new(c, a->nkw);
        for (size_t i = 0; i < a->nkw; i++) {
            d.d->k[i] = jv_cstr(a->kw[i]);
            d.d->v[i] = a->kwv[i];
        }
        return jinja_percent_format(c, s, d);
    }
    struct jv t = jv_list_new(c, a->n, true);
    if (a->n) memcpy(t.l->v, a->pos, a->n * sizeof *a->pos);
    return jinja_percent_format(c, s, t);
}

/* jinja's indent: s + "\n" split into lines; lines after the first (and the first with
 * first=True) get the prefix, empty ones only with blank=True. */
FILTER(f_indent) {
    struct jv s = jinja_need_str(c, &v, "indent's input");
    const struct jv *w = jinja_arg(a, 0, "width");
    bool first = jinja_arg_bool(a, 1, "first", false), blank = jinja_arg_bool(a, 2, "blank", false);
    struct jinja_buf pre = jinja_buf_tmp(c);
    if (w && w->t == JT_STR) {
        jinja_buf_put(c, &pre, w->s.p, w->s.n);
    } else {
        int64_t n = w ? jinja_need_int(c, w, "width") : 4;
        if (n > 4096) jinja_fail(c, JINJA_ERR_LIMIT, "indent width too large");
        for (int64_t i = 0; i < n; i++) jinja_buf_put(c, &pre, " ", 1);
    }
    struct jinja_buf t = jinja_buf_tmp(c);
    jinja_buf_put(c, &t, s.s.p, s.s.n);
    jinja_buf_put(c, &t, "\n", 1);
    const struct jinja_list *lines = jinja_str_splitlines(c, jinja_buf_value(&t), false).l;
    struct jinja_buf b = jinja_buf_tmp(c);
    if (first) jinja_buf_put(c, &b, pre.p, pre.n);
    for (size_t i = 0; i < lines->n; i++) {
        struct jv line = lines->v[i];
        if (i) {
            jinja_buf_put(c, &b, "\n", 1);
            if (blank || line.s.n) jinja_buf_put(c, &b, pre.p, pre.n);
        }
        jinja_buf_put(c, &b, line.s.p, line.s.n);
    }
    return jinja_buf_value(&b);
}

FILTER(f_items) {
    if (v.t == JT_UNDEF) return jv_list_new(c, 0, false);
    if (v.t != JT_DICT) jinja_fail(c, JINJA_ERR_RENDER, "can only get item pairs from a mapping");
    return jinja_call_method(c, v, "items", a);
}

FILTER(f_join) {
    const struct jv *d = jinja_arg(a, 0, "d");
    const struct jv *attr = jinja_arg(a, 1, "attribute");
    struct jv sep = d ? jinja_to_str(c, *d) : jv_str("", 0);
    const struct jinja_list *l = jinja_iterate(c, v);
    struct jinja_buf b = jinja_buf_tmp(c);
    for (size_t i = 0; i < l->n; i++) {
        if (i) jinja_buf_put(c, &b, sep.s.p, sep.s.n);
        jinja_write_str(c, &b, attr_of(c, l->v[i], attr));
    }
    return jinja_buf_value(&b);
}

FILTER(f_list) {
    const struct jinja_list *l = jinja_iterate(c, v);
    struct jv out = jv_list_new(c, l->n, false);
    if (l->n) memcpy(out.l->v, l->v, l->n * sizeof *l->v);
    return out;
}

FILTER(f_lower) { return jinja_str_recase(c, jinja_to_str(c, v), JINJA_CASE_LOWER); }

FILTER(f_upper) { return jinja_str_recase(c, jinja_to_str(c, v), JINJA_CASE_UPPER); }

FILTER(f_title) { return jinja_str_title_words(c, jinja_to_str(c, v)); }

/* The arguments after the first n positional ones (for map/select with a filter name). */
static struct jinja_callargs rest_args(const struct jinja_callargs *a, size_t skip) {
    struct jinja_callargs r = *a;
    r.n = a->n > skip ? a->n - skip : 0;
    r.pos = a->n > skip ? a->pos + skip : NULL;
    return r;
}

FILTER(f_map) {
    const struct jinja_list *l = jinja_iterate(c, v);
    struct jv out = jv_list_new(c, l->n, false);
    const struct jv *attr = jinja_arg(a, -1, "attribute");
    if (attr) {
        const struct jv *def = jinja_arg(a, -1, "default");
        for (size_t i = 0; i < l->n; i++) {
            struct jv x = attr_of(c, l->v[i], attr);
            out.l->v[i] = (x.t == JT_UNDEF && def) ? *def : x;
        }
        return out;
    }
    const char *name = jinja_cstr(c, jinja_need_str(c, jinja_arg(a, 0, NULL), "map filter name"));
    jinja_filter_fn fn = jinja_find_filter(name);
    if (!fn) jinja_fail(c, JINJA_ERR_RENDER, "no filter named '%s'", name);
    struct jinja_callargs r = rest_args(a, 1);
    for (size_t i = 0; i < l->n; i++) out.l->v[i] = fn(c, l->v[i], &r);
    return out;
}

/* select/reject/selectattr/rejectattr */
static struct jv select_common(struct jinja_ctx *c, struct jv v, const struct jinja_callargs *a,
                               bool want, bool by_attr) {
    const struct jinja_list *l = jinja_iterate(c, v);
    size_t skip = by_attr ? 1 : 0;
    const struct jv *attr = by_attr ? jinja_arg(a, 0, NULL) : NULL;
    if (by_attr && !attr) jinja_fail(c, JINJA_ERR_RENDER, "missing attribute argument");
    const struct jv *tname = jinja_arg(a, (int)skip, NULL);
    jinja_test_fn fn = NULL;
    if (tname) {
        const char *name = jinja_cstr(c, jinja_need_str(c, tname, "test name"));
        fn = jinja_find_test(name);
        if (!fn) jinja_fail(c, JINJA_ERR_RENDER, "no test named '%s'", name);
    }
    struct jinja_callargs r = rest_args(a, skip + 1);
    struct jinja_vec out = {0};
    for (size_t i = 0; i < l->n; i++) {
        struct jv x = by_attr ? attr_of(c, l->v[i], attr) : l->v[i];
        bool ok = fn ? fn(c, x, &r) : jinja_truthy(x);
        if (ok == want) jinja_vec_push(c, &out, l->v[i]);
    }
    return jinja_vec_list(c, &out, false);
}

FILTER(f_select) { return select_common(c, v, a, true, false); }
FILTER(f_reject) { return select_common(c, v, a, false, false); }
FILTER(f_selectattr) { return select_common(c, v, a, true, true); }
FILTER(f_rejectattr) { return select_common(c, v, a, false, true); }

static struct jv minmax(struct jinja_ctx *c, struct jv v, const struct jinja_callargs *a,
                        bool max) {
    const struct jinja_list *l = jinja_iterate(c, v);
    bool cs = jinja_arg_bool(a, 0, "case_sensitive", false);
    const struct jv *attr = jinja_arg(a, 1, "attribute");
    if (l->n == 0) return jv_undef(max ? "max" : "min");
    size_t best = 0;
    struct jv bk = sort_key(c, attr_of(c, l->v[0], attr), cs);
    for (size_t i = 1; i < l->n; i++) {
        struct jv k = sort_key(c, attr_of(c, l->v[i], attr), cs);
        int r = jinja_compare(c, k, bk);
        if (max ? r > 0 : r < 0) {
            best = i;
            bk = k;
        }
    }
    return l->v[best];
}

FILTER(f_max) { return minmax(c, v, a, true); }
FILTER(f_min) { return minmax(c, v, a, false); }

FILTER(f_pprint) {
    struct jinja_buf b = jinja_buf_tmp(c);
    jinja_write_repr(c, &b, v);
    return jinja_buf_value(&b);
}

FILTER(f_replace) {
    struct jv s = jinja_to_str(c, v);
    const struct jv *cnt = jinja_arg(a, 2, "count");
    return jinja_str_replace(c, s, jinja_to_str(c, *jinja_need_arg(c, a, 0, "old")),
                             jinja_to_str(c, *jinja_need_arg(c, a, 1, "new")),
                             jinja_given(cnt) ? jinja_need_int(c, cnt, "count") : -1);
}

FILTER(f_reverse) {
    if (v.t == JT_STR) {
        const struct jinja_list *chars = jinja_iterate(c, v);
        struct jinja_buf b = jinja_buf_tmp(c);
        for (size_t i = chars->n; i-- > 0;) jinja_buf_put(c, &b, chars->v[i].s.p, chars->v[i].s.n);
        return jinja_buf_value(&b);
    }
    const struct jinja_list *l = jinja_iterate(c, v);
    struct jv out = jv_list_new(c, l->n, false);
    for (size_t i = 0; i < l->n; i++) out.l->v[i] = l->v[l->n - 1 - i];
    return out;
}

FILTER(f_round) {
    const struct jv *p = jinja_arg(a, 0, "precision");
    const struct jv *m = jinja_arg(a, 1, "method");
    int64_t prec = p ? jinja_need_int(c, p, "precision") : 0;
    if (!jinja_is_number(v))
        jinja_fail(c, JINJA_ERR_RENDER, "round needs a number, not %s", jinja_type_name(v));
    double x = jinja_as_double(v), scale = pow(10.0, (double)prec);
    const char *method = m ? jinja_cstr(c, jinja_need_str(c, m, "method")) : "common";
    if (!strcmp(method, "common") && v.t != JT_FLOAT && prec >= 0)
        return jv_int(v.t == JT_BOOL ? v.b : v.i);
    double r;
    if (!strcmp(method, "common")) {
        // Python's round() rounds half to even on the decimal value
        char buf[64];
        snprintf(buf, sizeof buf, "%.*f", prec < 0 ? 0 : (int)(prec > 30 ? 30 : prec), x);
        r = prec >= 0 ? strtod(buf, NULL) : nearbyint(x * scale) / scale;
    } else if (!strcmp(method, "ceil")) {
        r = ceil(x * scale) / scale;
    } else if (!strcmp(method, "floor")) {
        r = floor(x * scale) / scale;
    } else {
        jinja_fail(c, JINJA_ERR_RENDER, "method must be common, ceil or floor");
    }
    return jv_float(r);
}

FILTER(f_safe) { return v; }

FILTER(f_sort) {
    return sorted(c, jinja_iterate(c, v), jinja_arg_bool(a, 0, "reverse", false),
                  jinja_arg_bool(a, 1, "case_sensitive", false), jinja_arg(a, 2, "attribute"));
}

FILTER(f_string) { return jinja_to_str(c, v); }

FILTER(f_sum) {
    const struct jv *attr = jinja_arg(a, 0, "attribute");
    const struct jv *start = jinja_arg(a, 1, "start");
    const struct jinja_list *l = jinja_iterate(c, v);
    bool is_float = start && start->t == JT_FLOAT;
    int64_t si = start && start->t != JT_FLOAT ? jinja_need_int(c, start, "start") : 0;
    double sf = is_float ? start->f : 0;
    for (size_t i = 0; i < l->n; i++) {
        struct jv x = attr_of(c, l->v[i], attr);
        if (!jinja_is_number(x))
            jinja_fail(c, JINJA_ERR_RENDER, "unsupported operand type(s) for +: 'int' and '%s'",
                       jinja_type_name(x));
        if (x.t == JT_FLOAT && !is_float) {
            is_float = true;
            sf = (double)si;
        }
        if (is_float)
            sf += jinja_as_double(x);
        else if (__builtin_add_overflow(si, x.t == JT_BOOL ? x.b : x.i, &si))
            jinja_fail(c, JINJA_ERR_RENDER, "integer overflow in sum");
    }
    return is_float ? jv_float(sf) : jv_int(si);
}

/* HF's tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
 * json.dumps with those arguments, not jinja's HTML-safe filter. */
FILTER(f_tojson) {
    const struct jv *ind = jinja_arg(a, 1, "indent");
    const struct jv *seps = jinja_arg(a, 2, "separators");
    struct jinja_json_opts o = {
        .indent = jinja_given(ind) ? (int)jinja_need_int(c, ind, "indent") : -1,
        .ensure_ascii = jinja_arg_bool(a, 0, "ensure_ascii", false),
        .sort_keys = jinja_arg_bool(a, 3, "sort_keys", false),
    };
    if (o.indent > 64) jinja_fail(c, JINJA_ERR_LIMIT, "tojson indent too large");
    o.item_sep = o.indent >= 0 ? "," : ", ";
    o.key_sep = ": ";
    if (jinja_given(seps)) {
        const struct jinja_list *l = jinja_iterate(c, *seps);
        if (l->n != 2) jinja_fail(c, JINJA_ERR_RENDER, "separators must be a pair of strings");
        o.item_sep = jinja_cstr(c, jinja_need_str(c, &l->v[0], "separator"));
        o.key_sep = jinja_cstr(c, jinja_need_str(c, &l->v[1], "separator"));
    }
    struct jinja_buf b = jinja_buf_tmp(c);
    jinja_write_json(c, &b, v, &o, 0);
    return jinja_buf_value(&b);
}

FILTER(f_trim) { return jinja_str_strip(jinja_to_str(c, v), jinja_strip_chars(c, a), true, true); }

FILTER(f_truncate) {
    const struct jv *lenv = jinja_arg(a, 0, "length");
    int64_t length = lenv ? jinja_need_int(c, lenv, "length") : 255;
    const struct jv *levv = jinja_arg(a, 3, "leeway");
    int64_t leeway = levv ? jinja_need_int(c, levv, "leeway") : 5;
    if (v.t != JT_STR) { // jinja only needs len() until it has to cut
        if (v.t == JT_UNDEF) return v;
        if ((v.t == JT_LIST && (int64_t)v.l->n <= length + leeway) ||
            (v.t == JT_DICT && (int64_t)v.d->n <= length + leeway))
            return v;
        jinja_need_str(c, &v, "truncate's input");
    }
    struct jv s = v;
    bool killwords = jinja_arg_bool(a, 1, "killwords", false);
    const struct jv *endv = jinja_arg(a, 2, "end");
    struct jv end = endv ? jinja_need_str(c, endv, "end") : jv_cstr("...");
    int64_t n = (int64_t)jinja_utf8_count(s.s.p, s.s.n),
            endn = (int64_t)jinja_utf8_count(end.s.p, end.s.n);
    if (n <= length + leeway) return s;
    int64_t keep = length - endn;
    if (keep < 0) keep = 0;
    size_t off = 0;
    uint32_t cp;
    for (int64_t i = 0; i < keep && off < s.s.n; i++)
        off += jinja_utf8_decode(s.s.p + off, s.s.n - off, &cp);
    struct jv head = jv_str(s.s.p, off);
    if (!killwords) { // drop the last partial word: rsplit(" ", 1)[0]
        const char *sp = jinja_rmemmem(head.s.p, head.s.n, " ", 1);
        if (sp) head.s.n = (size_t)(sp - head.s.p);
    }
    struct jinja_buf b = jinja_buf_tmp(c);
    jinja_buf_put(c, &b, head.s.p, head.s.n);
    jinja_buf_put(c, &b, end.s.p, end.s.n);
    return jinja_buf_value(&b);
}

FILTER(f_unique) {
    const struct jinja_list *l = jinja_iterate(c, v);
    bool cs = jinja_arg_bool(a, 0, "case_sensitive", false);
    const struct jv *attr = jinja_arg(a, 1, "attribute");
    struct jinja_vec seen = {0}, out = {0};
    for (size_t i = 0; i < l->n; i++) {
        struct jv k = sort_key(c, attr_of(c, l->v[i], attr), cs);
        bool dup = false;
        for (size_t j = 0; j < seen.n && !dup; j++) dup = jinja_equal(seen.v[j], k);
        if (dup) continue;
        jinja_vec_push(c, &seen, k);
        jinja_vec_push(c, &out, l->v[i]);
    }
    return jinja_vec_list(c, &out, false);
}

/* jinja counts runs of \w; non-ASCII bytes count as word characters here. */
FILTER(f_wordcount) {
    struct jv s = jinja_to_str(c, v);
    int64_t n = 0;
    bool in_word = false;
    for (size_t i = 0; i < s.s.n; i++) {
        unsigned char ch = (unsigned char)s.s.p[i];
        bool w = ch >= 0x80 || ch == '_' || (ch >= '0' && ch <= '9') ||
                 ((ch | 0x20) >= 'a' && (ch | 0x20) <= 'z');
        n += w && !in_word;
        in_word = w;
    }
    return jv_int(n);
}

static const struct {
    const char *name;
    jinja_filter_fn fn;
} filters[] = {
    {"abs", f_abs},
    {"attr", f_attr},
    {"batch", f_batch},
    {"capitalize", f_capitalize},
    {"center", f_center},
    {"count", f_length},
    {"d", f_default},
    {"default", f_default},
    {"dictsort", f_dictsort},
    {"e", f_escape},
    {"escape", f_escape},
    {"forceescape", f_escape},
    {"first", f_first},
    {"float", f_float},
    {"format", f_format},
    {"indent", f_indent},
    {"int", f_int},
    {"items", f_items},
    {"join", f_join},
    {"last", f_last},
    {"length", f_length},
    {"list", f_list},
    {"lower", f_lower},
    {"map", f_map},
    {"max", f_max},
    {"min", f_min},
    {"pprint", f_pprint},
    {"reject", f_reject},
    {"rejectattr", f_rejectattr},
    {"replace", f_replace},
    {"reverse", f_reverse},
    {"round", f_round},
    {"safe", f_safe},
    {"select", f_select},
    {"selectattr", f_selectattr},
    {"sort", f_sort},
    {"string", f_string},
    {"sum", f_sum},
    {"title", f_title},
    {"tojson", f_tojson},
    {"trim", f_trim},
    {"truncate", f_truncate},
    {"unique", f_unique},
    {"upper", f_upper},
    {"wordcount", f_wordcount},
};

jinja_filter_fn jinja_find_filter(const char *name) {
    for (size_t i = 0; i < sizeof filters / sizeof *filters; i++)
        if (!strcmp(filters[i].name, name)) return filters[i].fn;
    return NULL;
}
