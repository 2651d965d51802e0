/* jinja: arena, values and their Python-compatible text forms (str, repr, json.dumps).
 * Parsing is in jinja_lex.c and jinja_parse.c, evaluation in jinja_eval.c, access to
 * attributes, items and arguments in jinja_access.c, str/list/dict methods in jinja_methods.c,
 * filters and tests in jinja_builtins.c, global functions in jinja_globals.c. */
#include "engine/text/jinja_impl.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const struct jinja_options jinja_options_hf = {
    .trim_blocks = true,
    .lstrip_blocks = true,
    .keep_trailing_newline = false,
};

const struct jinja_limits jinja_limits_default = {
    .max_output = 16u << 20,
    .max_memory = 256u << 20,
    .max_depth = 500,
    .max_steps = 10000000,
};

void jinja_free(struct jinja_template *t) {
    if (!t) return;
    struct jinja_arena a = t->arena; // t itself lives in its arena
    jinja_arena_free(&a);
}

/* ---- arena --------------------------------------------------------------------------- */

struct jinja_chunk {
    struct jinja_chunk *next;
    size_t size, used; // bytes of data
};

#define JINJA_CHUNK_HDR ((sizeof(struct jinja_chunk) + 15) & ~(size_t)15)
#define JINJA_CHUNK_SIZE ((size_t)64 << 10)

void *jinja_arena_alloc(struct jinja_arena *a, size_t n) {
    if (n > SIZE_MAX / 2) return NULL;
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    struct jinja_chunk *h = a->head;
    if (h && h->size - h->used >= n) {
        void *p = (char *)h + JINJA_CHUNK_HDR + h->used;
        h->used += n;
        return p;
    }
    // Big requests get a chunk of their own, kept behind the head so its free space stays
    // in use; small ones start a new head chunk.
    bool big = n > JINJA_CHUNK_SIZE / 4;
    size_t size = big ? n : JINJA_CHUNK_SIZE;
    if (a->limit && (a->total + size + JINJA_CHUNK_HDR > a->limit)) return NULL;
    struct jinja_chunk *k = malloc(JINJA_CHUNK_HDR + size);
    if (!k) return NULL;
    a->total += JINJA_CHUNK_HDR + size;
    k->size = size;
    k->used = n;
    if (big && h) {
        k->next = h->next;
        h->next = k;
    } else {
        k->next = h;
        a->head = k;
    }
    return (char *)k + JINJA_CHUNK_HDR;
}

void jinja_arena_free(struct jinja_arena *a) {
    struct jinja_chunk *k = a->head;
    while (k) {
        struct jinja_chunk *next = k->next;
        free(k);
        k = next;
    }
    a->head = NULL;
    a->total = 0;
}

/* ---- render context basics ----------------------------------------------------------- */

void jinja_fail(struct jinja_ctx *c, int status, const char *fmt, ...) {
    if (c->err && c->errlen) {
        int off = 0;
        if (status != JINJA_ERR_RAISED && c->line > 0)
            off = snprintf(c->err, c->errlen, "line %d: ", c->line);
        if (off < 0 || (size_t)off >= c->errlen) off = 0;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->err + off, c->errlen - (size_t)off, fmt, ap);
        va_end(ap);
    }
    longjmp(c->jmp, status);
}

void jinja_fail_undefined(struct jinja_ctx *c, struct jv v) {
    if (v.undef) jinja_fail(c, JINJA_ERR_RENDER, "'%s' is undefined", v.undef);
    jinja_fail(c, JINJA_ERR_RENDER, "undefined value used");
}

void *jinja_alloc(struct jinja_ctx *c, size_t n) {
    void *p = jinja_arena_alloc(&c->arena, n);
    if (!p) {
        if (c->arena.limit && c->arena.total + n + JINJA_CHUNK_SIZE > c->arena.limit)
            jinja_fail(c, JINJA_ERR_LIMIT, "template used more than %zu bytes of memory",
                       c->arena.limit);
        jinja_fail(c, JINJA_ERR_NOMEM, "out of memory");
    }
    return p;
}

void jinja_depth_enter(struct jinja_ctx *c) {
    if (++c->depth > c->lim.max_depth)
        jinja_fail(c, JINJA_ERR_LIMIT, "template nesting deeper than %d (runaway recursion?)",
                   c->lim.max_depth);
}

void jinja_step(struct jinja_ctx *c) {
    if (++c->steps > c->lim.max_steps)
        jinja_fail(c, JINJA_ERR_LIMIT, "template ran more than %" PRIu64 " steps",
                   c->lim.max_steps);
}

/* ---- buffers ------------------------------------------------------------------------- */

void jinja_buf_put(struct jinja_ctx *c, struct jinja_buf *b, const char *p, size_t n) {
    if (n == 0) return;
    if (b->limit && (n > b->limit || b->n > b->limit - n))
        jinja_fail(c, JINJA_ERR_LIMIT, "template output longer than %zu bytes", b->limit);
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 64;
        while (cap < b->n + n + 1) cap *= 2;
        char *q = jinja_alloc(c, cap);
        if (b->n) memcpy(q, b->p, b->n);
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = 0;
}

void jinja_buf_puts(struct jinja_ctx *c, struct jinja_buf *b, const char *s) {
    jinja_buf_put(c, b, s, strlen(s));
}

void jinja_buf_printf(struct jinja_ctx *c, struct jinja_buf *b, const char *fmt, ...) {
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n >= sizeof tmp) n = sizeof tmp - 1; // callers format numbers only
    jinja_buf_put(c, b, tmp, (size_t)n);
}

struct jinja_buf jinja_buf_tmp(struct jinja_ctx *c) {
    return (struct jinja_buf){.limit = c->lim.max_output};
}

struct jv jinja_buf_value(struct jinja_buf *b) {
    return jv_str(b->p ? b->p : "", b->n);
}

/* ---- values -------------------------------------------------------------------------- */

struct jv jv_str_copy(struct jinja_ctx *c, const char *p, size_t n) {
    char *q = jinja_alloc(c, n + 1);
    if (n) memcpy(q, p, n);
    q[n] = 0;
    return jv_str(q, n);
}

struct jv jv_cstr(const char *s) {
    return jv_str(s, strlen(s));
}

struct jv jv_list_new(struct jinja_ctx *c, size_t n, bool tuple) {
    if (n > SIZE_MAX / sizeof(struct jv) / 2) jinja_fail(c, JINJA_ERR_LIMIT, "list too long");
    struct jinja_list *l = jinja_alloc(c, sizeof *l);
    l->n = n;
    l->tuple = tuple;
    l->v = jinja_alloc(c, (n ? n : 1) * sizeof(struct jv));
    return (struct jv){.t = JT_LIST, .l = l};
}

struct jv jv_dict_new(struct jinja_ctx *c, size_t n) {
    if (n > SIZE_MAX / sizeof(struct jv) / 2) jinja_fail(c, JINJA_ERR_LIMIT, "dict too large");
    struct jinja_dict *d = jinja_alloc(c, sizeof *d);
    d->n = n;
    d->k = jinja_alloc(c, (n ? n : 1) * sizeof(struct jv));
    d->v = jinja_alloc(c, (n ? n : 1) * sizeof(struct jv));
    return (struct jv){.t = JT_DICT, .d = d};
}

void jinja_vec_push(struct jinja_ctx *c, struct jinja_vec *v, struct jv x) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 8;
        struct jv *nv = jinja_alloc(c, cap * sizeof *nv);
        if (v->n) memcpy(nv, v->v, v->n * sizeof *nv);
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = x;
}

struct jv jinja_vec_list(struct jinja_ctx *c, struct jinja_vec *v, bool tuple) {
    struct jv l = jv_list_new(c, 0, tuple);
    l.l->n = v->n;
    l.l->v = v->v ? v->v : l.l->v;
    return l;
}

struct jv jinja_pair(struct jinja_ctx *c, struct jv a, struct jv b) {
    struct jv t = jv_list_new(c, 2, true);
    t.l->v[0] = a;
    t.l->v[1] = b;
    return t;
}

bool jinja_dict_find(const struct jinja_dict *d, struct jv key, size_t *idx) {
    for (size_t i = 0; i < d->n; i++)
        if (jinja_equal(d->k[i], key)) {
            *idx = i;
            return true;
        }
    return false;
}

bool jinja_dict_find_str(const struct jinja_dict *d, const char *name, size_t *idx) {
    size_t n = strlen(name);
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t == JT_STR && d->k[i].s.n == n && memcmp(d->k[i].s.p, name, n) == 0) {
            *idx = i;
            return true;
        }
    return false;
}

const char *jinja_type_name(struct jv v) {
    switch (v.t) {
    case JT_UNDEF: return "Undefined";
    case JT_NONE: return "NoneType";
    case JT_BOOL: return "bool";
    case JT_INT: return "int";
    case JT_FLOAT: return "float";
    case JT_STR: return "str";
    case JT_LIST: return v.l->tuple ? "tuple" : "list";
    case JT_DICT: return "dict";
    case JT_NS: return "Namespace";
    case JT_LOOP: return "LoopContext";
    case JT_MACRO: return "Macro";
    case JT_FUNC: return "function";
    case JT_METHOD: return "method";
    }
    return "object";
}

bool jinja_truthy(struct jv v) {
    switch (v.t) {
    case JT_UNDEF:
    case JT_NONE: return false;
    case JT_BOOL: return v.b;
    case JT_INT: return v.i != 0;
    case JT_FLOAT: return v.f != 0.0;
    case JT_STR: return v.s.n > 0;
    case JT_LIST: return v.l->n > 0;
    case JT_DICT: return v.d->n > 0;
    default: return true;
    }
}

bool jinja_is_number(struct jv v) { return v.t == JT_INT || v.t == JT_FLOAT || v.t == JT_BOOL; }

double jinja_as_double(struct jv v) {
    if (v.t == JT_FLOAT) return v.f;
    if (v.t == JT_INT) return (double)v.i;
    if (v.t == JT_BOOL) return v.b;
    return 0;
}

static int64_t as_int(struct jv v) { return v.t == JT_BOOL ? v.b : v.i; }

bool jinja_equal(struct jv a, struct jv b) {
    if (jinja_is_number(a) && jinja_is_number(b)) {
        if (a.t != JT_FLOAT && b.t != JT_FLOAT) return as_int(a) == as_int(b);
        return jinja_as_double(a) == jinja_as_double(b);
    }
    if (a.t != b.t) return false;
    switch (a.t) {
    case JT_UNDEF:
    case JT_NONE: return true;
    case JT_STR: return a.s.n == b.s.n && memcmp(a.s.p, b.s.p, a.s.n) == 0;
    case JT_LIST:
        if (a.l->tuple != b.l->tuple || a.l->n != b.l->n) return false;
        for (size_t i = 0; i < a.l->n; i++)
            if (!jinja_equal(a.l->v[i], b.l->v[i])) return false;
        return true;
    case JT_DICT:
        if (a.d->n != b.d->n) return false;
        for (size_t i = 0; i < a.d->n; i++) {
            size_t j = 0;
            while (j < b.d->n && !jinja_equal(a.d->k[i], b.d->k[j])) j++;
            if (j == b.d->n || !jinja_equal(a.d->v[i], b.d->v[j])) return false;
        }
        return true;
    case JT_NS: return a.ns == b.ns;
    case JT_LOOP: return a.loop == b.loop;
    case JT_MACRO: return a.macro == b.macro;
    case JT_FUNC: return a.fn == b.fn;
    case JT_METHOD: return a.m == b.m;
    default: return false;
    }
}

int jinja_compare(struct jinja_ctx *c, struct jv a, struct jv b) {
    if (jinja_is_number(a) && jinja_is_number(b)) {
        if (a.t != JT_FLOAT && b.t != JT_FLOAT) {
            int64_t x = as_int(a), y = as_int(b);
            return (x > y) - (x < y);
        }
        double x = jinja_as_double(a), y = jinja_as_double(b);
        return (x > y) - (x < y);
    }
    if (a.t == JT_STR && b.t == JT_STR) {
        size_t n = a.s.n < b.s.n ? a.s.n : b.s.n;
        int r = n ? memcmp(a.s.p, b.s.p, n) : 0;
        if (r) return r;
        return (a.s.n > b.s.n) - (a.s.n < b.s.n);
    }
    if (a.t == JT_LIST && b.t == JT_LIST && a.l->tuple == b.l->tuple) {
        size_t n = a.l->n < b.l->n ? a.l->n : b.l->n;
        for (size_t i = 0; i < n; i++) {
            if (jinja_equal(a.l->v[i], b.l->v[i])) continue;
            jinja_depth_enter(c);
            int r = jinja_compare(c, a.l->v[i], b.l->v[i]);
            jinja_depth_leave(c);
            return r;
        }
        return (a.l->n > b.l->n) - (a.l->n < b.l->n);
    }
    jinja_fail(c, JINJA_ERR_RENDER, "cannot order '%s' and '%s'", jinja_type_name(a),
               jinja_type_name(b));
}

/* ---- UTF-8 --------------------------------------------------------------------------- */

size_t jinja_utf8_decode(const char *p, size_t n, uint32_t *cp) {
    const unsigned char *s = (const unsigned char *)p;
    unsigned char c0 = s[0];
    if (c0 < 0x80) {
        *cp = c0;
        return 1;
    }
    size_t len;
    uint32_t v, min;
    if ((c0 & 0xe0) == 0xc0)
        len = 2, v = c0 & 0x1f, min = 0x80;
    else if ((c0 & 0xf0) == 0xe0)
        len = 3, v = c0 & 0x0f, min = 0x800;
    else if ((c0 & 0xf8) == 0xf0)
        len = 4, v = c0 & 0x07, min = 0x10000;
    else
        goto bad;
    if (len > n) goto bad;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) goto bad;
        v = (v << 6) | (s[i] & 0x3f);
    }
    if (v < min || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff)) goto bad;
    *cp = v;
    return len;
bad:
    *cp = 0xdc00 + c0; // like Python's surrogateescape: one code point per bad byte
    return 1;
}

size_t jinja_utf8_last(const char *p, size_t n, uint32_t *cp) {
    size_t start = n - 1;
    while (start > 0 && n - start < 4 && ((unsigned char)p[start] & 0xc0) == 0x80) start--;
    if (start + jinja_utf8_decode(p + start, n - start, cp) == n) return n - start;
    return jinja_utf8_decode(p + n - 1, 1, cp); // an invalid byte stands alone
}

size_t jinja_utf8_count(const char *p, size_t n) {
    size_t count = 0, i = 0;
    uint32_t cp;
    while (i < n) {
        i += jinja_utf8_decode(p + i, n - i, &cp);
        count++;
    }
    return count;
}

bool jinja_is_ascii(const char *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)p[i] >= 0x80) return false;
    return true;
}

bool jinja_is_space(uint32_t cp) {
    if (cp < 0x80) return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20);
    return cp == 0x85 || cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) ||
           cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

size_t jinja_utf8_encode(uint32_t cp, char out[4]) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xc0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xe0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        out[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (char)(0xf0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    out[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* ---- text forms ---------------------------------------------------------------------- */

/* Python's float repr: the shortest digits that round-trip, positional when the decimal
 * exponent is in [-4, 16), scientific otherwise ("1e+16", "1e-05"); always a '.' or 'e'. */
void jinja_write_float(struct jinja_ctx *c, struct jinja_buf *b, double f) {
    if (isnan(f) || isinf(f)) {
        jinja_buf_puts(c, b, isnan(f) ? "nan" : f < 0 ? "-inf" : "inf");
        return;
    }
    char tmp[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, f);
        if (strtod(tmp, NULL) == f) break;
    }
    // tmp: [-]d[.ddd]e[+-]xx
    char digits[24];
    int nd = 0, exp10 = 0;
    const char *s = tmp;
    bool neg = *s == '-';
    if (neg) s++;
    for (; *s && *s != 'e'; s++)
        if (*s >= '0' && *s <= '9') digits[nd++] = *s;
    if (*s == 'e') exp10 = atoi(s + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    char out[64];
    int o = 0;
    if (neg) out[o++] = '-';
    if (exp10 >= -4 && exp10 < 16) {
        if (exp10 < 0) {
            out[o++] = '0';
            out[o++] = '.';
            for (int i = 0; i < -exp10 - 1; i++) out[o++] = '0';
            for (int i = 0; i < nd; i++) out[o++] = digits[i];
        } else {
            for (int i = 0; i <= exp10; i++) out[o++] = i < nd ? digits[i] : '0';
            out[o++] = '.';
            if (nd > exp10 + 1)
                for (int i = exp10 + 1; i < nd; i++) out[o++] = digits[i];
            else
                out[o++] = '0';
        }
        out[o] = 0;
    } else {
        out[o++] = digits[0];
        if (nd > 1) {
            out[o++] = '.';
            for (int i = 1; i < nd; i++) out[o++] = digits[i];
        }
        snprintf(out + o, sizeof out - (size_t)o, "e%c%02d", exp10 < 0 ? '-' : '+',
                 exp10 < 0 ? -exp10 : exp10);
    }
    jinja_buf_puts(c, b, out);
}

static void write_str_repr(struct jinja_ctx *c, struct jinja_buf *b, const char *p, size_t n) {
    bool has_sq = memchr(p, '\'', n) != NULL, has_dq = memchr(p, '"', n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    jinja_buf_put(c, b, &q, 1);
    size_t i = 0, run = 0;
    while (i < n) {
        uint32_t cp;
        size_t len = jinja_utf8_decode(p + i, n - i, &cp);
        char esc[12];
        esc[0] = 0;
        if (cp == (uint32_t)q || cp == '\\')
            snprintf(esc, sizeof esc, "\\%c", (char)cp);
        else if (cp == '\n')
            strcpy(esc, "\\n");
        else if (cp == '\r')
            strcpy(esc, "\\r");
        else if (cp == '\t')
            strcpy(esc, "\\t");
        else if (cp < 0x20 || cp == 0x7f || (cp >= 0x80 && cp <= 0xa0) || cp == 0xad)
            snprintf(esc, sizeof esc, "\\x%02x", (unsigned)cp);
        else if (cp >= 0xdc80 && cp <= 0xdcff) // an invalid byte
            snprintf(esc, sizeof esc, "\\udc%02x", (unsigned)(cp & 0xff));
        else if (cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200f) || (cp >= 0x2028 && cp <= 0x202f) ||
                 (cp >= 0x205f && cp <= 0x2064) || cp == 0x3000 || cp == 0xfeff)
            snprintf(esc, sizeof esc, "\\u%04x", (unsigned)cp);
        if (esc[0]) {
            jinja_buf_put(c, b, p + i - run, run);
            run = 0;
            jinja_buf_puts(c, b, esc);
        } else {
            run += len;
        }
        i += len;
    }
    jinja_buf_put(c, b, p + i - run, run);
    jinja_buf_put(c, b, &q, 1);
}

void jinja_write_repr(struct jinja_ctx *c, struct jinja_buf *b, struct jv v) {
    jinja_depth_enter(c);
    switch (v.t) {
    case JT_STR: write_str_repr(c, b, v.s.p, v.s.n); break;
    case JT_UNDEF: jinja_buf_puts(c, b, "Undefined"); break;
    case JT_LIST:
        jinja_buf_puts(c, b, v.l->tuple ? "(" : "[");
        for (size_t i = 0; i < v.l->n; i++) {
            if (i) jinja_buf_puts(c, b, ", ");
            jinja_write_repr(c, b, v.l->v[i]);
        }
        if (v.l->tuple && v.l->n == 1) jinja_buf_puts(c, b, ",");
        jinja_buf_puts(c, b, v.l->tuple ? ")" : "]");
        break;
    case JT_DICT:
        jinja_buf_puts(c, b, "{");
        for (size_t i = 0; i < v.d->n; i++) {
            if (i) jinja_buf_puts(c, b, ", ");
            jinja_write_repr(c, b, v.d->k[i]);
            jinja_buf_puts(c, b, ": ");
            jinja_write_repr(c, b, v.d->v[i]);
        }
        jinja_buf_puts(c, b, "}");
        break;
    default: jinja_write_str(c, b, v); break;
    }
    jinja_depth_leave(c);
}

void jinja_write_str(struct jinja_ctx *c, struct jinja_buf *b, struct jv v) {
    switch (v.t) {
    case JT_UNDEF: break;
    case JT_NONE: jinja_buf_puts(c, b, "None"); break;
    case JT_BOOL: jinja_buf_puts(c, b, v.b ? "True" : "False"); break;
    case JT_INT: jinja_buf_printf(c, b, "%" PRId64, v.i); break;
    case JT_FLOAT: jinja_write_float(c, b, v.f); break;
    case JT_STR: jinja_buf_put(c, b, v.s.p, v.s.n); break;
    case JT_LIST:
    case JT_DICT: jinja_write_repr(c, b, v); break;
    case JT_NS: {
        jinja_buf_puts(c, b, "<Namespace ");
        struct jv d = {.t = JT_DICT, .d = &v.ns->d};
        jinja_write_repr(c, b, d);
        jinja_buf_puts(c, b, ">");
        break;
    }
    case JT_LOOP:
        jinja_buf_printf(c, b, "<LoopContext %" PRId64 "/%zu>", v.loop->index0 + 1,
                         v.loop->items->n);
        break;
    case JT_MACRO:
        jinja_buf_puts(c, b, "<Macro '");
        jinja_buf_puts(c, b, v.macro->def->macro.name);
        jinja_buf_puts(c, b, "'>");
        break;
    case JT_FUNC: jinja_buf_puts(c, b, "<function>"); break;
    case JT_METHOD:
        jinja_buf_puts(c, b, "<built-in method ");
        jinja_buf_puts(c, b, v.m->name);
        jinja_buf_puts(c, b, ">");
        break;
    }
}

struct jv jinja_to_str(struct jinja_ctx *c, struct jv v) {
    if (v.t == JT_STR) return v;
    if (v.t == JT_UNDEF) return jv_str("", 0);
    struct jinja_buf b = jinja_buf_tmp(c);
    jinja_write_str(c, &b, v);
    return jinja_buf_value(&b);
}

static void write_json_str(struct jinja_ctx *c, struct jinja_buf *b, const char *p, size_t n,
                           bool ensure_ascii) {
    jinja_buf_put(c, b, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)p[i];
        char esc[16];
        esc[0] = 0;
        if (ch >= 0x80 && ensure_ascii) { // \uXXXX, surrogate pairs above the BMP
            uint32_t cp;
            size_t len = jinja_utf8_decode(p + i, n - i, &cp);
            jinja_buf_put(c, b, p + i - run, run);
            run = 0;
            if (cp >= 0x10000) {
                cp -= 0x10000;
                snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xd800 + (unsigned)(cp >> 10),
                         0xdc00 + (unsigned)(cp & 0x3ff));
            } else {
                snprintf(esc, sizeof esc, "\\u%04x", (unsigned)cp);
            }
            jinja_buf_puts(c, b, esc);
            i += len - 1;
            continue;
        }
        switch (ch) {
        case '"': strcpy(esc, "\\\""); break;
        case '\\': strcpy(esc, "\\\\"); break;
        case '\n': strcpy(esc, "\\n"); break;
        case '\r': strcpy(esc, "\\r"); break;
        case '\t': strcpy(esc, "\\t"); break;
        case '\b': strcpy(esc, "\\b"); break;
        case '\f': strcpy(esc, "\\f"); break;
        default:
            if (ch < 0x20) snprintf(esc, sizeof esc, "\\u%04x", ch);
        }
        if (esc[0]) {
            jinja_buf_put(c, b, p + i - run, run);
            run = 0;
            jinja_buf_puts(c, b, esc);
        } else {
            run++;
        }
    }
    jinja_buf_put(c, b, p + n - run, run);
    jinja_buf_put(c, b, "\"", 1);
}

static void json_newline(struct jinja_ctx *c, struct jinja_buf *b, int indent, int level) {
    jinja_buf_put(c, b, "\n", 1);
    for (int i = 0; i < indent * level; i++) jinja_buf_put(c, b, " ", 1);
}

static void write_json_key(struct jinja_ctx *c, struct jinja_buf *b, struct jv k,
                           const struct jinja_json_opts *o) {
    switch (k.t) {
    case JT_STR: write_json_str(c, b, k.s.p, k.s.n, o->ensure_ascii); return;
    case JT_NONE: jinja_buf_puts(c, b, "\"null\""); return;
    case JT_BOOL: jinja_buf_puts(c, b, k.b ? "\"true\"" : "\"false\""); return;
    case JT_INT:
    case JT_FLOAT: {
        struct jinja_buf t = jinja_buf_tmp(c);
        jinja_write_json(c, &t, k, o, 0);
        write_json_str(c, b, t.p, t.n, false);
        return;
    }
    default:
        jinja_fail(c, JINJA_ERR_RENDER, "keys must be str, int, float, bool or None, not %s",
                   jinja_type_name(k));
    }
}

void jinja_write_json(struct jinja_ctx *c, struct jinja_buf *b, struct jv v,
                      const struct jinja_json_opts *o, int level) {
    jinja_depth_enter(c);
    switch (v.t) {
    case JT_NONE: jinja_buf_puts(c, b, "null"); break;
    case JT_BOOL: jinja_buf_puts(c, b, v.b ? "true" : "false"); break;
    case JT_INT: jinja_buf_printf(c, b, "%" PRId64, v.i); break;
    case JT_FLOAT:
        if (isnan(v.f))
            jinja_buf_puts(c, b, "NaN");
        else if (isinf(v.f))
            jinja_buf_puts(c, b, v.f < 0 ? "-Infinity" : "Infinity");
        else
            jinja_write_float(c, b, v.f);
        break;
    case JT_STR: write_json_str(c, b, v.s.p, v.s.n, o->ensure_ascii); break;
    case JT_LIST:
        if (v.l->n == 0) {
            jinja_buf_puts(c, b, "[]");
            break;
        }
        jinja_buf_puts(c, b, "[");
        for (size_t i = 0; i < v.l->n; i++) {
            if (i) jinja_buf_puts(c, b, o->item_sep);
            if (o->indent >= 0) json_newline(c, b, o->indent, level + 1);
            jinja_write_json(c, b, v.l->v[i], o, level + 1);
        }
        if (o->indent >= 0) json_newline(c, b, o->indent, level);
        jinja_buf_puts(c, b, "]");
        break;
    case JT_DICT: {
        const struct jinja_dict *d = v.d;
        if (d->n == 0) {
            jinja_buf_puts(c, b, "{}");
            break;
        }
        size_t *order = jinja_alloc(c, d->n * sizeof *order);
        for (size_t i = 0; i < d->n; i++) order[i] = i;
        if (o->sort_keys) // insertion sort: stable, and dicts in templates are small
            for (size_t i = 1; i < d->n; i++)
                for (size_t j = i;
                     j > 0 && jinja_compare(c, d->k[order[j - 1]], d->k[order[j]]) > 0; j--) {
                    size_t t = order[j];
                    order[j] = order[j - 1];
                    order[j - 1] = t;
                }
        jinja_buf_puts(c, b, "{");
        for (size_t i = 0; i < d->n; i++) {
            if (i) jinja_buf_puts(c, b, o->item_sep);
            if (o->indent >= 0) json_newline(c, b, o->indent, level + 1);
            write_json_key(c, b, d->k[order[i]], o);
            jinja_buf_puts(c, b, o->key_sep);
            jinja_write_json(c, b, d->v[order[i]], o, level + 1);
        }
        if (o->indent >= 0) json_newline(c, b, o->indent, level);
        jinja_buf_puts(c, b, "}");
        break;
    }
    default:
        jinja_fail(c, JINJA_ERR_RENDER, "Object of type %s is not JSON serializable",
                   jinja_type_name(v));
    }
    jinja_depth_leave(c);
}
