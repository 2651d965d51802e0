/* jinja_globals: the global functions templates may call (range, namespace, dict,
 * raise_exception, strftime_now), behaving as in jinja2's sandbox and transformers. */
#include "engine/text/jinja_impl.h"

#include <string.h>
#include <time.h>

#define SANDBOX_MAX_RANGE 100000 // jinja2.sandbox.MAX_RANGE

/* ---- globals ------------------------------------------------------------------------- */

static const char *const global_names[] = {
    [JG_RANGE] = "range",
    [JG_NAMESPACE] = "namespace",
    [JG_DICT] = "dict",
    [JG_RAISE_EXCEPTION] = "raise_exception",
    [JG_STRFTIME_NOW] = "strftime_now",
};

int jinja_find_global(const char *name) {
    for (size_t i = 0; i < sizeof global_names / sizeof *global_names; i++)
        if (!strcmp(global_names[i], name)) return (int)i;
    return -1;
}

/* dict(mapping_or_pairs, **kw) and namespace(...) share this. */
static struct jinja_dict *build_dict(struct jinja_ctx *c, const struct jinja_callargs *a) {
    struct jinja_vec k = {0}, v = {0};
    if (a->n > 1) jinja_fail(c, JINJA_ERR_RENDER, "expected at most 1 positional argument");
    if (a->n == 1) {
        struct jv src = a->pos[0];
        if (src.t == JT_DICT) {
            for (size_t i = 0; i < src.d->n; i++) {
                jinja_vec_push(c, &k, src.d->k[i]);
                jinja_vec_push(c, &v, src.d->v[i]);
            }
        } else {
            const struct jinja_list *l = jinja_iterate(c, src);
            for (size_t i = 0; i < l->n; i++) {
                const struct jinja_list *kv = jinja_iterate(c, l->v[i]);
                if (kv->n != 2)
                    jinja_fail(c, JINJA_ERR_RENDER,
                               "dict sequence element has length %zu; 2 is required", kv->n);
                jinja_vec_push(c, &k, kv->v[0]);
                jinja_vec_push(c, &v, kv->v[1]);
            }
        }
    }
    for (size_t i = 0; i < a->nkw; i++) {
        jinja_vec_push(c, &k, jv_cstr(a->kw[i]));
        jinja_vec_push(c, &v, a->kwv[i]);
    }
    // later keys replace earlier ones, keeping the first position (Python dict)
    struct jinja_dict *d = jinja_alloc(c, sizeof *d);
    d->k = jinja_alloc(c, (k.n ? k.n : 1) * sizeof(struct jv));
    d->v = jinja_alloc(c, (k.n ? k.n : 1) * sizeof(struct jv));
    d->n = 0;
    for (size_t i = 0; i < k.n; i++) {
        size_t j = 0;
        while (j < d->n && !jinja_equal(d->k[j], k.v[i])) j++;
        if (j == d->n) d->k[d->n++] = k.v[i];
        d->v[j] = v.v[i];
    }
    return d;
}

struct jv jinja_call_global(struct jinja_ctx *c, int fn, const struct jinja_callargs *a) {
    switch ((enum jinja_global)fn) {
    case JG_RANGE: {
        int64_t start = 0, stop, step = 1;
        if (a->n == 1) {
            stop = jinja_need_int(c, &a->pos[0], "range argument");
        } else if (a->n == 2 || a->n == 3) {
            start = jinja_need_int(c, &a->pos[0], "range argument");
            stop = jinja_need_int(c, &a->pos[1], "range argument");
            if (a->n == 3) step = jinja_need_int(c, &a->pos[2], "range argument");
        } else {
            jinja_fail(c, JINJA_ERR_RENDER, "range expected 1 to 3 arguments, got %zu", a->n);
        }
        if (step == 0) jinja_fail(c, JINJA_ERR_RENDER, "range() arg 3 must not be zero");
        int64_t n = 0;
        if (step > 0 && stop > start) n = (stop - start - 1) / step + 1;
        if (step < 0 && start > stop) n = (start - stop - 1) / -step + 1;
        if (n > SANDBOX_MAX_RANGE)
            jinja_fail(c, JINJA_ERR_LIMIT,
                       "range too big: the sandbox blocks ranges larger than %d",
                       SANDBOX_MAX_RANGE);
        struct jv l = jv_list_new(c, (size_t)n, false);
        for (int64_t i = 0; i < n; i++) l.l->v[i] = jv_int(start + i * step);
        return l;
    }
    case JG_NAMESPACE: {
        struct jinja_ns *ns = jinja_alloc(c, sizeof *ns);
        ns->d = *build_dict(c, a);
        ns->cap = ns->d.n;
        return (struct jv){.t = JT_NS, .ns = ns};
    }
    case JG_DICT: return (struct jv){.t = JT_DICT, .d = build_dict(c, a)};
    case JG_RAISE_EXCEPTION: {
        const struct jv *m = jinja_arg(a, 0, NULL);
        struct jv s = m ? jinja_to_str(c, *m) : jv_str("", 0);
        jinja_fail(c, JINJA_ERR_RAISED, "%.*s", (int)(s.s.n > 4000 ? 4000 : s.s.n), s.s.p);
    }
    case JG_STRFTIME_NOW: {
        const char *fmt =
            jinja_cstr(c, jinja_need_str(c, jinja_arg(a, 0, "format"), "strftime format"));
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        size_t cap = 64 + 4 * strlen(fmt);
        for (int tries = 0; tries < 8; tries++, cap *= 4) {
            char *buf = jinja_alloc(c, cap);
            size_t n = strftime(buf, cap, fmt, &tm);
            if (n > 0 || fmt[0] == 0) return jv_str(buf, n);
        }
        return jv_str("", 0);
    }
    }
    jinja_fail(c, JINJA_ERR_RENDER, "unknown function");
}
