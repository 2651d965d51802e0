/* Test helpers for tests/test_grammar.c, written apart from engine/grammar so they can check it:
 * - ref_accepts: a recursive-descent matcher of the text engine/grammar.h says a schema accepts
 *   (JSON syntax, schema keywords, and the generation policy: whitespace, property order, digit
 *   limits, enum literals as cJSON prints them);
 * - ref_valid: a JSON Schema validator for the subset (standard semantics) on parsed values;
 * - ref_gen: random instances that ref_accepts, in random allowed formatting. */
#ifndef DUO_TEST_GRAMMAR_REF_H
#define DUO_TEST_GRAMMAR_REF_H

#include <cjson/cJSON.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ref {
    const char *t;
    long n;
    const cJSON *doc;
    bool ws_none;
    int max_indent;
};

/* A set of end positions (anyOf and type lists may end a value at several places). */
#define REF_MAX_ENDS 16
struct ends {
    long e[REF_MAX_ENDS];
    int n;
};

static void ends_add(struct ends *s, long e) {
    for (int i = 0; i < s->n; i++)
        if (s->e[i] == e) return;
    if (s->n < REF_MAX_ENDS) s->e[s->n++] = e;
}

static const cJSON *ref_get(const cJSON *s, const char *k) { return cJSON_IsObject(s) ? cJSON_GetObjectItemCaseSensitive(s, k) : NULL; }

/* $ref (local JSON pointers) and one-element allOf, followed to the schema they stand for. */
static const cJSON *ref_deref(const cJSON *doc, const cJSON *s) {
    for (int guard = 0; guard < 64; guard++) {
        const cJSON *r = ref_get(s, "$ref"), *a = ref_get(s, "allOf");
        if (a) {
            s = a->child;
            continue;
        }
        if (!r) return s;
        const char *p = r->valuestring + 1;
        const cJSON *cur = doc;
        while (*p == '/') {
            char seg[128];
            int n = 0;
            for (p++; *p && *p != '/'; p++) {
                char c = *p;
                if (c == '~') c = *++p == '0' ? '~' : '/';
                seg[n++] = c;
            }
            seg[n] = 0;
            cur = cJSON_IsArray(cur) ? cJSON_GetArrayItem(cur, atoi(seg)) : cJSON_GetObjectItemCaseSensitive(cur, seg);
        }
        s = cur;
    }
    return s;
}

static long ref_ws(const struct ref *r, long p) {
    if (r->ws_none || p >= r->n) return p;
    if (r->t[p] == ' ') return p + 1;
    if (r->t[p] != '\n') return p;
    p++;
    for (int k = 0; k < r->max_indent && p < r->n && (r->t[p] == ' ' || r->t[p] == '\t'); k++) p++;
    return p;
}

static bool ref_lit(const struct ref *r, long p, const char *s) {
    long n = (long)strlen(s);
    return p + n <= r->n && !memcmp(r->t + p, s, (size_t)n);
}

/* Type names as bits, as the schema says or its keywords imply; 0: any value. */
enum { RT_NULL = 1, RT_BOOL = 2, RT_OBJECT = 4, RT_ARRAY = 8, RT_NUMBER = 16, RT_STRING = 32, RT_INTEGER = 64 };
static int ref_types(const cJSON *s) {
    static const char *const names[] = {"null", "boolean", "object", "array", "number", "string", "integer"};
    const cJSON *t = ref_get(s, "type");
    int bits = 0;
    for (const cJSON *x = cJSON_IsArray(t) ? t->child : t; x; x = cJSON_IsArray(t) ? x->next : NULL)
        for (int k = 0; k < 7; k++)
            if (!strcmp(x->valuestring, names[k])) bits |= 1 << k;
    if (!t) {
        if (ref_get(s, "properties") || ref_get(s, "required") || ref_get(s, "additionalProperties")) bits = RT_OBJECT;
        else if (ref_get(s, "items") || ref_get(s, "minItems") || ref_get(s, "maxItems")) bits = RT_ARRAY;
        else if (ref_get(s, "minLength") || ref_get(s, "maxLength")) bits = RT_STRING;
        else if (ref_get(s, "minimum") || ref_get(s, "maximum") || ref_get(s, "exclusiveMinimum") ||
                 ref_get(s, "exclusiveMaximum"))
            bits = RT_NUMBER;
    }
    if ((bits & RT_NUMBER) && (bits & RT_INTEGER)) bits &= ~RT_INTEGER;
    return bits;
}

static long ref_num(const cJSON *s, const char *k, long dflt) {
    const cJSON *v = ref_get(s, k);
    return cJSON_IsNumber(v) ? (long)v->valuedouble : dflt;
}

/* A JSON string at p per the policy; its end, or -1. *chars gets its length in characters. */
static long ref_string(const struct ref *r, long p, long *chars) {
    const unsigned char *t = (const unsigned char *)r->t;
    if (p >= r->n || t[p] != '"') return -1;
    long n = 0;
    for (p++; p < r->n; n++) {
        unsigned c = t[p];
        if (c == '"') {
            *chars = n;
            return p + 1;
        }
        if (c < 0x20) return -1;
        if (c == '\\') {
            if (p + 1 >= r->n) return -1;
            char e = (char)t[p + 1];
            if (strchr("\"\\/bfnrt", e) && e) {
                p += 2;
                continue;
            }
            if (e != 'u' || p + 6 > r->n) return -1;
            unsigned u = 0;
            for (int k = 2; k < 6; k++) {
                char h = (char)t[p + k];
                if (!((h >= '0' && h <= '9') || (h >= 'a' && h <= 'f') || (h >= 'A' && h <= 'F'))) return -1;
                u = u * 16 + (unsigned)(h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
            }
            p += 6;
            if (u >= 0xdc00 && u <= 0xdfff) return -1;
            if (u >= 0xd800 && u <= 0xdbff) { /* needs its low half */
                if (p + 6 > r->n || t[p] != '\\' || t[p + 1] != 'u') return -1;
                unsigned w = 0;
                for (int k = 2; k < 6; k++) {
                    char h = (char)t[p + k];
                    if (!((h >= '0' && h <= '9') || (h >= 'a' && h <= 'f') || (h >= 'A' && h <= 'F'))) return -1;
                    w = w * 16 + (unsigned)(h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
                }
                if (w < 0xdc00 || w > 0xdfff) return -1;
                p += 6;
            }
            continue;
        }
        /* UTF-8: the length from the lead byte, then a scalar value in range */
        int len = c < 0x80 ? 1 : c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
        if (!len || p + len > r->n) return -1;
        uint32_t cp = len == 1 ? c : c & (0xff >> (len + 1));
        for (int k = 1; k < len; k++) {
            if ((t[p + k] & 0xc0) != 0x80) return -1;
            cp = cp << 6 | (t[p + k] & 0x3f);
        }
        if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) || (cp >= 0xd800 && cp <= 0xdfff))
            return -1;
        p += len;
    }
    return -1;
}

/* A decimal as sign, significant digits and exponent: value = 0.d[0]d[1]... * 10^exp. */
struct refdec {
    int sign; /* 0 for zero */
    char d[64];
    int nd, exp;
};

static void refdec_parse(const char *s, struct refdec *x) {
    memset(x, 0, sizeof *x);
    int neg = *s == '-', point = -1, n = 0;
    if (neg) s++;
    for (; (*s >= '0' && *s <= '9') || *s == '.'; s++) {
        if (*s == '.') {
            point = n;
            continue;
        }
        if (n < 63) x->d[n++] = *s;
    }
    if (point < 0) point = n;
    int e = (*s == 'e' || *s == 'E') ? atoi(s + 1) : 0, lead = 0;
    while (lead < n && x->d[lead] == '0') lead++;
    memmove(x->d, x->d + lead, (size_t)(n - lead));
    n -= lead;
    while (n && x->d[n - 1] == '0') n--;
    x->nd = n;
    x->exp = point - lead + e;
    x->sign = n ? (neg ? -1 : 1) : 0;
}

/* Exact comparison of two decimal texts (plain or with an exponent): -1, 0, 1. */
static int ref_deccmp(const char *a, const char *b) {
    struct refdec x, y;
    refdec_parse(a, &x);
    refdec_parse(b, &y);
    if (x.sign != y.sign) return x.sign < y.sign ? -1 : 1;
    if (!x.sign) return 0;
    int c = x.exp != y.exp ? (x.exp < y.exp ? -1 : 1) : 0;
    for (int i = 0; !c && (i < x.nd || i < y.nd); i++) {
        char p = i < x.nd ? x.d[i] : '0', q = i < y.nd ? y.d[i] : '0';
        c = p < q ? -1 : p > q ? 1 : 0;
    }
    return x.sign * c;
}

/* A bound as the grammar compares it: the shortest decimal that reads back as v. */
static void ref_bound(double v, char *buf, size_t n) {
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, n, "%.*e", prec - 1, v);
        if (strtod(buf, NULL) == v) return;
    }
}

/* A number at p per the policy and the bounds; its end or -1. */
static long ref_number(const struct ref *r, const cJSON *s, long p, bool integer) {
    const char *t = r->t;
    long q = p;
    if (q < r->n && t[q] == '-') q++;
    long i0 = q;
    if (q < r->n && t[q] == '0') q++;
    else
        while (q < r->n && t[q] >= '0' && t[q] <= '9') q++;
    long ni = q - i0, nf = 0, ne = -1;
    if (!ni) return -1;
    if (q + 1 < r->n && t[q] == '.' && t[q + 1] >= '0' && t[q + 1] <= '9') {
        long f0 = ++q;
        while (q < r->n && t[q] >= '0' && t[q] <= '9') q++;
        nf = q - f0;
    }
    long before_exp = q;
    if (q < r->n && (t[q] == 'e' || t[q] == 'E')) {
        long e = q + 1;
        if (e < r->n && (t[e] == '+' || t[e] == '-')) e++;
        long e0 = e;
        while (e < r->n && t[e] >= '0' && t[e] <= '9') e++;
        if (e > e0) ne = e - e0, q = e;
    }
    const cJSON *mn = ref_get(s, "minimum"), *mx = ref_get(s, "maximum");
    bool bounded = mn || mx;
    if (ni > 20 || nf > 20) return -1;
    if (integer && (nf || ne >= 0)) return -1;
    if (ne >= 0 && (bounded || ne > 2)) return -1;
    char num[64], bnd[64];
    snprintf(num, sizeof num, "%.*s", (int)(before_exp - p), t + p);
    const cJSON *xmn = ref_get(s, "exclusiveMinimum"), *xmx = ref_get(s, "exclusiveMaximum");
    if (mn) { /* draft 4: exclusiveMinimum true makes minimum exclusive (integers only here) */
        ref_bound(integer ? (cJSON_IsTrue(xmn) ? floor(mn->valuedouble) + 1 : ceil(mn->valuedouble)) : mn->valuedouble,
                  bnd, sizeof bnd);
        if (ref_deccmp(num, bnd) < 0) return -1;
    }
    if (mx) {
        ref_bound(integer ? (cJSON_IsTrue(xmx) ? ceil(mx->valuedouble) - 1 : floor(mx->valuedouble)) : mx->valuedouble,
                  bnd, sizeof bnd);
        if (ref_deccmp(num, bnd) > 0) return -1;
    }
    if (cJSON_IsNumber(xmn) && strtold(num, NULL) <= (long double)xmn->valuedouble) return -1;
    if (cJSON_IsNumber(xmx) && strtold(num, NULL) >= (long double)xmx->valuedouble) return -1;
    return q;
}

static long utf8_count(const char *s) {
    long n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xc0) != 0x80;
    return n;
}

/* Whether an enum/const value meets the schema's type and bounds (so it is generated). */
static bool ref_literal_fits(const cJSON *s, const cJSON *v) {
    int types = cJSON_GetObjectItemCaseSensitive(s, "type") ? ref_types(s) : 0;
    if (cJSON_IsNumber(v)) {
        bool integral = v->valuedouble == floor(v->valuedouble);
        if (types && !(types & RT_NUMBER) && !((types & RT_INTEGER) && integral)) return false;
        const cJSON *mn = ref_get(s, "minimum"), *mx = ref_get(s, "maximum");
        return !(mn && v->valuedouble < mn->valuedouble) && !(mx && v->valuedouble > mx->valuedouble);
    }
    if (cJSON_IsString(v)) {
        long n = utf8_count(v->valuestring);
        return (!types || (types & RT_STRING)) && n >= ref_num(s, "minLength", 0) && n <= ref_num(s, "maxLength", 1L << 40);
    }
    int t = cJSON_IsNull(v) ? RT_NULL : cJSON_IsBool(v) ? RT_BOOL : cJSON_IsObject(v) ? RT_OBJECT : RT_ARRAY;
    return !types || (types & t);
}

static void ref_match(const struct ref *r, const cJSON *s, long p, struct ends *out);

static void ref_any(const struct ref *r, long p, struct ends *out) {
    static cJSON *any;
    if (!any) any = cJSON_CreateTrue();
    ref_match(r, any, p, out);
}

/* Members of an object without properties from p (after '{' ws): ends after the '}'. */
static void ref_map(const struct ref *r, const cJSON *val, long p, struct ends *out, int depth) {
    if (p < r->n && r->t[p] == '}') ends_add(out, p + 1);
    if (!val || depth > 200) return;
    long ch;
    long k = ref_string(r, p, &ch);
    if (k < 0) return;
    k = ref_ws(r, k);
    if (k >= r->n || r->t[k] != ':') return;
    struct ends v = {0};
    if (val == (const cJSON *)1) ref_any(r, ref_ws(r, k + 1), &v);
    else ref_match(r, val, ref_ws(r, k + 1), &v);
    for (int i = 0; i < v.n; i++) {
        long q = ref_ws(r, v.e[i]);
        if (q < r->n && r->t[q] == '}') ends_add(out, q + 1);
        if (q < r->n && r->t[q] == ',') ref_map(r, val, ref_ws(r, q + 1), out, depth + 1);
    }
}

/* Declared properties from index i of props (nodes in order) at p; emitted: one was written. */
static void ref_props(const struct ref *r, const cJSON *s, const cJSON *prop, long p, bool emitted, struct ends *out) {
    if (!prop) {
        if (p < r->n && r->t[p] == '}') ends_add(out, p + 1);
        return;
    }
    bool required = false;
    for (const cJSON *q = ref_get(s, "required") ? ref_get(s, "required")->child : NULL; q; q = q->next)
        required |= !strcmp(q->valuestring, prop->string);
    if (!required) ref_props(r, s, prop->next, p, emitted, out);
    long k = p;
    if (emitted) {
        if (k >= r->n || r->t[k] != ',') return;
        k = ref_ws(r, k + 1);
    }
    cJSON *key = cJSON_CreateString(prop->string);
    char *kt = cJSON_PrintUnformatted(key);
    bool ok = ref_lit(r, k, kt);
    k += (long)strlen(kt);
    free(kt);
    cJSON_Delete(key);
    if (!ok) return;
    k = ref_ws(r, k);
    if (k >= r->n || r->t[k] != ':') return;
    struct ends v = {0};
    ref_match(r, prop, ref_ws(r, k + 1), &v);
    for (int i = 0; i < v.n; i++) ref_props(r, s, prop->next, ref_ws(r, v.e[i]), true, out);
}

static void ref_items(const struct ref *r, const cJSON *item, long k, long min, long max, long p, struct ends *out) {
    if (k >= min && p < r->n && r->t[p] == ']') ends_add(out, p + 1);
    if ((max >= 0 && k >= max) || k > 1000) return;
    if (k > 0) {
        if (p >= r->n || r->t[p] != ',') return;
        p = ref_ws(r, p + 1);
    }
    struct ends v = {0};
    if (item) ref_match(r, item, p, &v);
    else ref_any(r, p, &v);
    for (int i = 0; i < v.n; i++) ref_items(r, item, k + 1, min, max, ref_ws(r, v.e[i]), out);
}

static void ref_typed(const struct ref *r, const cJSON *s, int type, long p, struct ends *out) {
    long e, ch;
    switch (type) {
    case RT_NULL:
        if (ref_lit(r, p, "null")) ends_add(out, p + 4);
        break;
    case RT_BOOL:
        if (ref_lit(r, p, "true")) ends_add(out, p + 4);
        if (ref_lit(r, p, "false")) ends_add(out, p + 5);
        break;
    case RT_STRING:
        e = ref_string(r, p, &ch);
        if (e >= 0 && ch >= ref_num(s, "minLength", 0) && ch <= ref_num(s, "maxLength", 1L << 40)) ends_add(out, e);
        break;
    case RT_NUMBER:
    case RT_INTEGER:
        e = ref_number(r, s, p, type == RT_INTEGER);
        if (e >= 0) ends_add(out, e);
        break;
    case RT_ARRAY:
        if (p < r->n && r->t[p] == '[')
            ref_items(r, ref_get(s, "items"), 0, ref_num(s, "minItems", 0), ref_num(s, "maxItems", -1), ref_ws(r, p + 1), out);
        break;
    case RT_OBJECT: {
        if (p >= r->n || r->t[p] != '{') break;
        const cJSON *props = ref_get(s, "properties"), *ap = ref_get(s, "additionalProperties");
        if (props) ref_props(r, s, props->child, ref_ws(r, p + 1), false, out);
        else ref_map(r, cJSON_IsFalse(ap) ? NULL : cJSON_IsObject(ap) ? ap : (const cJSON *)1, ref_ws(r, p + 1), out, 0);
        break;
    }
    }
}

static void ref_match(const struct ref *r, const cJSON *s, long p, struct ends *out) {
    s = ref_deref(r->doc, s);
    if (cJSON_IsFalse(s)) return;
    const cJSON *any = ref_get(s, "anyOf"), *en = ref_get(s, "enum"), *cn = ref_get(s, "const");
    if (any) {
        for (const cJSON *a = any->child; a; a = a->next) ref_match(r, a, p, out);
        return;
    }
    if (en || cn) {
        for (const cJSON *v = en ? en->child : cn; v; v = en ? v->next : NULL) {
            if ((en && cn && !cJSON_Compare(v, cn, true)) || !ref_literal_fits(s, v)) continue;
            char *t = cJSON_PrintUnformatted(v);
            if (ref_lit(r, p, t)) ends_add(out, p + (long)strlen(t));
            free(t);
        }
        return;
    }
    int types = cJSON_IsTrue(s) ? 0 : ref_types(s);
    if (!types) types = RT_NULL | RT_BOOL | RT_OBJECT | RT_ARRAY | RT_NUMBER | RT_STRING;
    for (int t = 1; t <= RT_INTEGER; t <<= 1)
        if (types & t) ref_typed(r, cJSON_IsTrue(s) ? NULL : s, t, p, out);
}

/* Whether text[0..n) is what the grammar of schema (NULL: any JSON object) accepts. */
static bool ref_accepts(const cJSON *schema, const char *text, long n, bool ws_none, int max_indent) {
    struct ref r = {text, n, schema, ws_none, max_indent};
    struct ends e = {0};
    static cJSON *obj;
    if (!obj) obj = cJSON_Parse("{\"type\":\"object\"}");
    ref_match(&r, schema ? schema : obj, ref_ws(&r, 0), &e);
    for (int i = 0; i < e.n; i++)
        if (ref_ws(&r, e.e[i]) == n) return true;
    return false;
}

/* ---- JSON Schema semantics ---------------------------------------------------------------- */

static bool ref_valid(const cJSON *doc, const cJSON *s, const cJSON *v) {
    s = ref_deref(doc, s);
    if (cJSON_IsBool(s)) return cJSON_IsTrue(s);
    const cJSON *any = ref_get(s, "anyOf"), *en = ref_get(s, "enum"), *cn = ref_get(s, "const");
    if (any) {
        for (const cJSON *a = any->child; a; a = a->next)
            if (ref_valid(doc, a, v)) return true;
        return false;
    }
    if (cn && !cJSON_Compare(cn, v, true)) return false;
    if (en) {
        bool found = false;
        for (const cJSON *e = en->child; e && !found; e = e->next) found = cJSON_Compare(e, v, true);
        if (!found) return false;
    }
    const cJSON *t = ref_get(s, "type");
    if (t) {
        int types = ref_types(s);
        bool integral = cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble);
        bool ok = (cJSON_IsNull(v) && (types & RT_NULL)) || (cJSON_IsBool(v) && (types & RT_BOOL)) ||
                  (cJSON_IsObject(v) && (types & RT_OBJECT)) || (cJSON_IsArray(v) && (types & RT_ARRAY)) ||
                  (cJSON_IsString(v) && (types & RT_STRING)) || (cJSON_IsNumber(v) && (types & RT_NUMBER)) ||
                  (integral && (types & RT_INTEGER));
        if (!ok) return false;
    }
    if (cJSON_IsObject(v)) {
        const cJSON *props = ref_get(s, "properties"), *ap = ref_get(s, "additionalProperties");
        for (const cJSON *q = ref_get(s, "required") ? ref_get(s, "required")->child : NULL; q; q = q->next)
            if (!cJSON_GetObjectItemCaseSensitive(v, q->valuestring)) return false;
        for (const cJSON *m = v->child; m; m = m->next) {
            const cJSON *ps = props ? cJSON_GetObjectItemCaseSensitive(props, m->string) : NULL;
            if (ps && !ref_valid(doc, ps, m)) return false;
            if (!ps && ap && !ref_valid(doc, ap, m)) return false;
        }
    }
    if (cJSON_IsArray(v)) {
        long n = cJSON_GetArraySize(v);
        if (n < ref_num(s, "minItems", 0) || n > ref_num(s, "maxItems", 1L << 40)) return false;
        const cJSON *items = ref_get(s, "items");
        for (const cJSON *x = v->child; x && items; x = x->next)
            if (!ref_valid(doc, items, x)) return false;
    }
    if (cJSON_IsString(v)) {
        long n = utf8_count(v->valuestring);
        if (n < ref_num(s, "minLength", 0) || n > ref_num(s, "maxLength", 1L << 40)) return false;
    }
    if (cJSON_IsNumber(v)) {
        const cJSON *mn = ref_get(s, "minimum"), *mx = ref_get(s, "maximum");
        const cJSON *xmn = ref_get(s, "exclusiveMinimum"), *xmx = ref_get(s, "exclusiveMaximum");
        if (mn && (cJSON_IsTrue(xmn) ? v->valuedouble <= mn->valuedouble : v->valuedouble < mn->valuedouble)) return false;
        if (mx && (cJSON_IsTrue(xmx) ? v->valuedouble >= mx->valuedouble : v->valuedouble > mx->valuedouble)) return false;
        if (cJSON_IsNumber(xmn) && v->valuedouble <= xmn->valuedouble) return false;
        if (cJSON_IsNumber(xmx) && v->valuedouble >= xmx->valuedouble) return false;
    }
    return true;
}

/* ---- random instances ----------------------------------------------------------------------- */

struct gen {
    char *buf;
    size_t n, cap;
    uint64_t rng;
    const cJSON *doc;
    bool ws_none;
    int max_indent;
    int depth;
};

static uint32_t gen_rand(struct gen *g) {
    g->rng ^= g->rng << 13;
    g->rng ^= g->rng >> 7;
    g->rng ^= g->rng << 17;
    return (uint32_t)(g->rng >> 16);
}

static long gen_range(struct gen *g, long lo, long hi) { return lo + (long)(gen_rand(g) % (uint32_t)(hi - lo + 1)); }

static void gen_put(struct gen *g, const char *s, size_t n) {
    if (g->n + n + 1 > g->cap) {
        g->cap = (g->n + n + 1) * 2;
        g->buf = realloc(g->buf, g->cap);
    }
    memcpy(g->buf + g->n, s, n);
    g->n += n;
    g->buf[g->n] = 0;
}
static void gen_puts(struct gen *g, const char *s) { gen_put(g, s, strlen(s)); }

static void gen_ws(struct gen *g) {
    if (g->ws_none) return;
    int k = (int)gen_range(g, 0, 9);
    if (k >= 6 && k <= 7) gen_puts(g, " ");
    if (k < 8) return;
    gen_puts(g, "\n");
    for (long i = gen_range(g, 0, g->max_indent); i > 0; i--) gen_puts(g, gen_rand(g) % 4 ? " " : "\t");
}

static void gen_utf8(struct gen *g, uint32_t cp) {
    char b[4];
    size_t n;
    if (cp < 0x80) b[0] = (char)cp, n = 1;
    else if (cp < 0x800) b[0] = (char)(0xc0 | cp >> 6), b[1] = (char)(0x80 | (cp & 63)), n = 2;
    else if (cp < 0x10000)
        b[0] = (char)(0xe0 | cp >> 12), b[1] = (char)(0x80 | (cp >> 6 & 63)), b[2] = (char)(0x80 | (cp & 63)), n = 3;
    else
        b[0] = (char)(0xf0 | cp >> 18), b[1] = (char)(0x80 | (cp >> 12 & 63)), b[2] = (char)(0x80 | (cp >> 6 & 63)),
        b[3] = (char)(0x80 | (cp & 63)), n = 4;
    gen_put(g, b, n);
}

static void gen_string(struct gen *g, long min, long max) {
    long n = max >= 0 ? gen_range(g, min, max) : min + gen_range(g, 0, 6);
    char tmp[16];
    gen_puts(g, "\"");
    for (long i = 0; i < n; i++) {
        int k = (int)gen_range(g, 0, 99);
        if (k < 55) {
            char c = (char)gen_range(g, 0x20, 0x7e);
            if (c == '"' || c == '\\') c = 'q';
            gen_put(g, &c, 1);
        } else if (k < 65) {
            static const char *const esc[] = {"\\n", "\\t", "\\\"", "\\\\", "\\/", "\\b", "\\f", "\\r"};
            gen_puts(g, esc[gen_range(g, 0, 7)]);
        } else if (k < 71) {
            uint32_t u = (uint32_t)gen_range(g, 1, 0xffff - 0x800);
            if (u >= 0xd800) u += 0x800; /* skip the surrogates */
            snprintf(tmp, sizeof tmp, gen_rand(g) % 2 ? "\\u%04x" : "\\u%04X", u);
            gen_puts(g, tmp);
        } else if (k < 75) {
            snprintf(tmp, sizeof tmp, "\\u%04x\\u%04x", (unsigned)gen_range(g, 0xd800, 0xdbff),
                     (unsigned)gen_range(g, 0xdc00, 0xdfff));
            gen_puts(g, tmp);
        } else if (k < 84) {
            gen_utf8(g, (uint32_t)gen_range(g, 0x80, 0x7ff));
        } else if (k < 93) {
            uint32_t cp = (uint32_t)gen_range(g, 0x800, 0xffff - 0x800);
            gen_utf8(g, cp >= 0xd800 ? cp + 0x800 : cp);
        } else {
            gen_utf8(g, (uint32_t)gen_range(g, 0x10000, 0x10ffff));
        }
    }
    gen_puts(g, "\"");
}

static void gen_number(struct gen *g, const cJSON *s, bool integer) {
    const cJSON *mn = ref_get(s, "minimum"), *mx = ref_get(s, "maximum");
    const cJSON *xmn = ref_get(s, "exclusiveMinimum"), *xmx = ref_get(s, "exclusiveMaximum");
    char tmp[64];
    if (integer) {
        long lo = mn ? (long)ceil(mn->valuedouble) + cJSON_IsTrue(xmn) : -100000;
        long hi = mx ? (long)floor(mx->valuedouble) - cJSON_IsTrue(xmx) : 100000;
        if (cJSON_IsNumber(xmn) && (long)floor(xmn->valuedouble) + 1 > lo) lo = (long)floor(xmn->valuedouble) + 1;
        if (cJSON_IsNumber(xmx) && (long)ceil(xmx->valuedouble) - 1 < hi) hi = (long)ceil(xmx->valuedouble) - 1;
        long v = gen_rand(g) % 4 == 0 ? (gen_rand(g) % 2 ? lo : hi) : gen_range(g, lo, hi);
        snprintf(tmp, sizeof tmp, "%ld", v);
    } else if (mn || mx) {
        double lo = mn ? mn->valuedouble : mx->valuedouble - 1000, hi = mx ? mx->valuedouble : lo + 1000;
        double x = lo + (hi - lo) * (gen_rand(g) % 10001) / 10000.0;
        snprintf(tmp, sizeof tmp, "%.*f", (int)gen_range(g, 0, 4), x);
        char b[64];
        ref_bound(lo, b, sizeof b);
        if (ref_deccmp(tmp, b) < 0) snprintf(tmp, sizeof tmp, "%.6f", lo);
        ref_bound(hi, b, sizeof b);
        if (ref_deccmp(tmp, b) > 0) snprintf(tmp, sizeof tmp, "%.6f", hi);
    } else {
        static const char *const forms[] = {"%.0f", "%.3f", "%.2e", "%.1E", "%.0e"};
        double x = (gen_range(g, 0, 200000) - 100000) / 7.0;
        snprintf(tmp, sizeof tmp, forms[gen_range(g, 0, 4)], x);
        if (gen_rand(g) % 20 == 0) snprintf(tmp, sizeof tmp, "-0");
    }
    gen_puts(g, tmp);
}

static void gen_value(struct gen *g, const cJSON *s);

static int gen_pick_type(struct gen *g, int types) {
    int opts[8], n = 0;
    for (int t = 1; t <= RT_INTEGER; t <<= 1)
        if ((types & t) && !(g->depth >= 5 && (t == RT_OBJECT || t == RT_ARRAY) && (types & ~(RT_OBJECT | RT_ARRAY))))
            opts[n++] = t;
    return opts[gen_range(g, 0, n - 1)];
}

static void gen_typed(struct gen *g, const cJSON *s, int type) {
    bool deep = g->depth >= 5;
    switch (type) {
    case RT_NULL: gen_puts(g, "null"); break;
    case RT_BOOL: gen_puts(g, gen_rand(g) % 2 ? "true" : "false"); break;
    case RT_STRING: gen_string(g, ref_num(s, "minLength", 0), ref_num(s, "maxLength", -1)); break;
    case RT_NUMBER:
    case RT_INTEGER: gen_number(g, s, type == RT_INTEGER); break;
    case RT_ARRAY: {
        long mn = ref_num(s, "minItems", 0), mx = ref_num(s, "maxItems", -1);
        long n = deep ? mn : gen_range(g, mn, mx >= 0 ? mx : mn + 3);
        const cJSON *items = ref_get(s, "items");
        gen_puts(g, "[");
        gen_ws(g);
        for (long i = 0; i < n; i++) {
            if (i) gen_puts(g, ","), gen_ws(g);
            if (items) gen_value(g, items);
            else gen_value(g, NULL);
            gen_ws(g);
        }
        gen_puts(g, "]");
        break;
    }
    case RT_OBJECT: {
        const cJSON *props = ref_get(s, "properties"), *ap = ref_get(s, "additionalProperties");
        gen_puts(g, "{");
        gen_ws(g);
        bool emitted = false;
        for (const cJSON *p = props ? props->child : NULL; p; p = p->next) {
            bool required = false;
            for (const cJSON *q = ref_get(s, "required") ? ref_get(s, "required")->child : NULL; q; q = q->next)
                required |= !strcmp(q->valuestring, p->string);
            if (!required && (deep || gen_rand(g) % 2)) continue;
            if (emitted) gen_puts(g, ","), gen_ws(g);
            cJSON *key = cJSON_CreateString(p->string);
            char *kt = cJSON_PrintUnformatted(key);
            gen_puts(g, kt);
            free(kt);
            cJSON_Delete(key);
            gen_ws(g);
            gen_puts(g, ":");
            gen_ws(g);
            gen_value(g, p);
            gen_ws(g);
            emitted = true;
        }
        long n = props || cJSON_IsFalse(ap) || deep ? 0 : gen_range(g, 0, 2);
        for (long i = 0; i < n; i++) {
            if (i) gen_puts(g, ","), gen_ws(g);
            gen_string(g, 0, 5);
            gen_ws(g);
            gen_puts(g, ":");
            gen_ws(g);
            gen_value(g, cJSON_IsObject(ap) ? ap : NULL);
            gen_ws(g);
        }
        gen_puts(g, "}");
        break;
    }
    }
}

/* A random instance of s (NULL: any JSON value) appended to g->buf. */
static void gen_value(struct gen *g, const cJSON *s) {
    g->depth++;
    s = s ? ref_deref(g->doc, s) : NULL;
    const cJSON *any = ref_get(s, "anyOf"), *en = ref_get(s, "enum"), *cn = ref_get(s, "const");
    if (any) {
        int n = cJSON_GetArraySize(any), k = (int)gen_range(g, 0, n - 1);
        if (g->depth >= 5) /* deep: the first alternative that is not an object or array */
            for (k = n - 1; k > 0; k--) {
                int t = ref_types(ref_deref(g->doc, cJSON_GetArrayItem(any, k)));
                if (t && !(t & (RT_OBJECT | RT_ARRAY))) break;
            }
        gen_value(g, cJSON_GetArrayItem(any, k));
    } else if (en || cn) {
        const cJSON *fit[64];
        int n = 0;
        for (const cJSON *v = en ? en->child : cn; v && n < 64; v = en ? v->next : NULL)
            if ((!en || !cn || cJSON_Compare(v, cn, true)) && ref_literal_fits(s, v)) fit[n++] = v;
        char *t = cJSON_PrintUnformatted(fit[gen_range(g, 0, n - 1)]);
        gen_puts(g, t);
        free(t);
    } else {
        int types = s && !cJSON_IsTrue(s) ? ref_types(s) : 0;
        if (!types) types = RT_NULL | RT_BOOL | RT_OBJECT | RT_ARRAY | RT_NUMBER | RT_STRING;
        gen_typed(g, s && !cJSON_IsTrue(s) ? s : NULL, gen_pick_type(g, types));
    }
    g->depth--;
}

/* A random accepted text of schema (NULL: any JSON object), malloc'd. */
static char *ref_gen(const cJSON *schema, uint64_t seed, bool ws_none, int max_indent) {
    struct gen g = {.rng = seed * 0x9e3779b97f4a7c15ull + 1, .doc = schema, .ws_none = ws_none, .max_indent = max_indent};
    gen_ws(&g);
    if (schema) gen_value(&g, schema);
    else gen_typed(&g, NULL, RT_OBJECT);
    gen_ws(&g);
    if (!g.buf) gen_puts(&g, "");
    return g.buf;
}

#endif
