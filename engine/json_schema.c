/* JSON Schema -> grammar rules (engine/grammar.h says which subset and what text is accepted).
 * Each schema becomes a rule (memoized by its node, so $ref cycles become recursive calls);
 * strings, numbers, whitespace and "any JSON" are shared rules built once per grammar. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/grammar_impl.h"

struct js {
    struct gb b;
    struct grammar_options opt;
    const cJSON *doc; // the root schema, for $ref
    int depth;
    char path[256];   // where we are in the schema, for messages ("#/properties/a")
    /* shared rules, -1 until first used */
    int32_t ws, string, number, integer, value, object_any, array_any;
    /* schema node -> rule; -3 while a $ref node is being resolved */
    const cJSON **memo_key;
    int32_t *memo_val;
    size_t memo_cap, memo_n;
};

static int32_t compile(struct js *j, const cJSON *s);

/* ---- small helpers ---------------------------------------------------------------------- */

static int32_t rule_of(struct js *j, int32_t node) { return node >= 0 ? j->b.nodes[node].rule : -1; }
static int32_t next(struct js *j, int32_t node) { return gb_node(&j->b, rule_of(j, node)); }

/* A node after calling rule from `from`. */
static int32_t call(struct js *j, int32_t from, int32_t rule) {
    int32_t n = next(j, from);
    gb_call(&j->b, from, rule, n);
    return n;
}

static int32_t lit(struct js *j, int32_t from, const char *s) { return gb_lit(&j->b, from, s, strlen(s)); }

static int32_t byte(struct js *j, int32_t from, char c) {
    int32_t n = next(j, from);
    gb_bytes(&j->b, from, (uint8_t)c, (uint8_t)c, n);
    return n;
}

static int32_t ws_rule(struct js *j);
/* A node after optional whitespace (the same node under GRAMMAR_WS_NONE). */
static int32_t ws(struct js *j, int32_t from) {
    return j->opt.whitespace == GRAMMAR_WS_NONE ? from : call(j, from, ws_rule(j));
}

static int fail(struct js *j, int status, const char *what) {
    return gb_fail(&j->b, status, "%s (at %s)", what, j->path);
}

static size_t path_push(struct js *j, const char *seg) {
    size_t n = strlen(j->path);
    snprintf(j->path + n, sizeof j->path - n, "/%s", seg);
    return n;
}

static uint64_t ptr_hash(const void *p) {
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 29;
    x *= 0xbf58476d1ce4e5b9ull;
    return x ^ (x >> 32);
}

static int32_t *memo_slot(struct js *j, const cJSON *s, bool *found) {
    if ((j->memo_n + 1) * 2 > j->memo_cap) {
        size_t nc = j->memo_cap ? j->memo_cap * 2 : 64;
        const cJSON **k = calloc(nc, sizeof *k);
        int32_t *v = malloc(nc * sizeof *v);
        if (!k || !v) {
            free(k);
            free(v);
            return NULL;
        }
        for (size_t i = 0; i < j->memo_cap; i++) {
            if (!j->memo_key[i]) continue;
            size_t h = ptr_hash(j->memo_key[i]) & (nc - 1);
            while (k[h]) h = (h + 1) & (nc - 1);
            k[h] = j->memo_key[i];
            v[h] = j->memo_val[i];
        }
        free(j->memo_key);
        free(j->memo_val);
        j->memo_key = k;
        j->memo_val = v;
        j->memo_cap = nc;
    }
    size_t h = ptr_hash(s) & (j->memo_cap - 1);
    while (j->memo_key[h] && j->memo_key[h] != s) h = (h + 1) & (j->memo_cap - 1);
    *found = j->memo_key[h] != NULL;
    if (!*found) {
        j->memo_key[h] = s;
        j->memo_val[h] = -1;
        j->memo_n++;
    }
    return &j->memo_val[h];
}

/* ---- shared rules ----------------------------------------------------------------------- */

/* "" | " " | "\n" [ \t]{0,max_indent} */
static int32_t ws_rule(struct js *j) {
    if (j->ws >= 0 || j->b.status) return j->ws;
    int32_t r = gb_rule(&j->b), s = gb_start(&j->b, r);
    gb_final(&j->b, s);
    gb_final(&j->b, byte(j, s, ' '));
    int32_t n = byte(j, s, '\n');
    gb_final(&j->b, n);
    for (int k = 0; k < j->opt.max_indent; k++) {
        int32_t m = next(j, n);
        gb_bytes(&j->b, n, '\t', '\t', m);
        gb_bytes(&j->b, n, ' ', ' ', m);
        gb_final(&j->b, m);
        n = m;
    }
    return j->ws = r;
}

/* A JSON string of min..max characters (max < 0: no limit) from `from`; returns its end. */
static int32_t string_body(struct js *j, int32_t from, long min, long max) {
    int32_t end = next(j, from), c = byte(j, from, '"');
    long n = max >= 0 ? max : min;
    for (long k = 0; k <= n && !j->b.status; k++) {
        if (k >= min) gb_bytes(&j->b, c, '"', '"', end);
        if (k == n) {
            if (max < 0) gb_string_char(&j->b, c, c);
            break;
        }
        int32_t d = next(j, c);
        gb_string_char(&j->b, c, d);
        c = d;
    }
    return end;
}

static int32_t string_rule(struct js *j) {
    if (j->string >= 0 || j->b.status) return j->string;
    int32_t r = gb_rule(&j->b);
    gb_final(&j->b, string_body(j, gb_start(&j->b, r), 0, -1));
    return j->string = r;
}

static int32_t number_rule(struct js *j, bool integer) {
    int32_t *r = integer ? &j->integer : &j->number;
    if (*r >= 0 || j->b.status) return *r;
    *r = gb_rule(&j->b);
    int32_t s = gb_start(&j->b, *r), end = next(j, s);
    gb_final(&j->b, end);
    gb_number(&j->b, s, end, NULL, NULL, integer);
    return *r;
}

/* ---- any JSON --------------------------------------------------------------------------- */

static int32_t value_rule(struct js *j);

/* from -> to through optional whitespace. */
static void ws_to(struct js *j, int32_t from, int32_t to) {
    if (j->opt.whitespace == GRAMMAR_WS_NONE) gb_eps(&j->b, from, to);
    else gb_call(&j->b, from, ws_rule(j), to);
}

/* '{' ws (key ws ':' ws value ws (',' ws key ws ':' ws value ws)*)? '}' with any keys, values of
 * rule val (val < 0: an empty object only). */
static void object_map(struct js *j, int32_t from, int32_t to, int32_t val) {
    int32_t o = ws(j, byte(j, from, '{')), m = next(j, from);
    gb_bytes(&j->b, o, '}', '}', to);
    if (val < 0) return;
    for (int k = 0; k < 2; k++) {
        int32_t at = k == 0 ? o : ws(j, byte(j, m, ','));
        int32_t v = call(j, ws(j, byte(j, ws(j, call(j, at, string_rule(j))), ':')), val);
        ws_to(j, v, m);
    }
    gb_bytes(&j->b, m, '}', '}', to);
}

/* '[' ws (item ws (',' ws item ws)*)? ']' with between min and max items (max < 0: no limit). */
static void array_items(struct js *j, int32_t from, int32_t to, int32_t item, long min, long max) {
    int32_t c = ws(j, byte(j, from, '['));
    long n = max >= 0 ? max : (min > 1 ? min : 1);
    for (long k = 0; k <= n && !j->b.status; k++) {
        if (k >= min) gb_bytes(&j->b, c, ']', ']', to);
        if (k == n && max >= 0) break;
        int32_t at = k == 0 ? c : ws(j, byte(j, c, ','));
        int32_t d = k == n ? c : next(j, c); /* past the minimum with no maximum: loop */
        ws_to(j, call(j, at, item), d);
        c = d;
        if (k == n) break;
    }
}

static int32_t object_any_rule(struct js *j) {
    if (j->object_any >= 0 || j->b.status) return j->object_any;
    int32_t r = j->object_any = gb_rule(&j->b), end = next(j, gb_start(&j->b, r));
    gb_final(&j->b, end);
    object_map(j, gb_start(&j->b, r), end, value_rule(j));
    return r;
}

static int32_t array_any_rule(struct js *j) {
    if (j->array_any >= 0 || j->b.status) return j->array_any;
    int32_t r = j->array_any = gb_rule(&j->b), end = next(j, gb_start(&j->b, r));
    gb_final(&j->b, end);
    array_items(j, gb_start(&j->b, r), end, value_rule(j), 0, -1);
    return r;
}

static int32_t value_rule(struct js *j) {
    if (j->value >= 0 || j->b.status) return j->value;
    int32_t r = j->value = gb_rule(&j->b), s = gb_start(&j->b, r), end = next(j, s);
    gb_final(&j->b, end);
    gb_call(&j->b, s, object_any_rule(j), end);
    gb_call(&j->b, s, array_any_rule(j), end);
    gb_call(&j->b, s, string_rule(j), end);
    gb_call(&j->b, s, number_rule(j, false), end);
    gb_final(&j->b, lit(j, s, "true"));
    gb_final(&j->b, lit(j, s, "false"));
    gb_final(&j->b, lit(j, s, "null"));
    return r;
}

/* ---- keywords --------------------------------------------------------------------------- */

static bool in_list(const char *k, const char *const *list) {
    for (; *list; list++)
        if (!strcmp(k, *list)) return true;
    return false;
}

/* Keywords that change nothing we generate: annotations, and definitions used through $ref.
 * "format" is an annotation by default in JSON Schema 2020-12 and is not enforced. */
static const char *const annotations[] = {"title",    "description", "default",   "examples", "$schema", "$id",
                                          "$comment", "deprecated",  "readOnly",  "writeOnly", "format", "$defs",
                                          "definitions", NULL};
static const char *const supported[] = {"type",      "enum",      "const",     "anyOf",
                                        "$ref",      "allOf",     "properties", "required",
                                        "additionalProperties", "items", "minItems", "maxItems",
                                        "minLength", "maxLength", "minimum",   "maximum",
                                        "exclusiveMinimum", "exclusiveMaximum", NULL};

/* Fails on a keyword outside the subset; with only_annotations, on anything but annotations
 * (the siblings of $ref and anyOf). */
static int check_keywords(struct js *j, const cJSON *s, const char *owner) {
    for (const cJSON *c = s->child; c; c = c->next) {
        const char *k = c->string ? c->string : "";
        char msg[160];
        if (in_list(k, annotations) || (owner && !strcmp(k, owner))) continue;
        if (owner && in_list(k, supported)) {
            snprintf(msg, sizeof msg, "unsupported: '%s' together with '%.40s' in one schema", owner, k);
            return fail(j, GRAMMAR_ERR_UNSUPPORTED, msg);
        }
        if (owner || !in_list(k, supported)) {
            snprintf(msg, sizeof msg, "unsupported JSON Schema keyword '%.60s'", k);
            return fail(j, GRAMMAR_ERR_UNSUPPORTED, msg);
        }
    }
    return 0;
}

/* A keyword's value as a non-negative integer; -1 when absent, -2 (after failing) when bad. */
static long count_kw(struct js *j, const cJSON *s, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, k);
    if (!v) return -1;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble != floor(v->valuedouble)) {
        char msg[96];
        snprintf(msg, sizeof msg, "'%s' must be a non-negative integer", k);
        fail(j, GRAMMAR_ERR_INVALID, msg);
        return -2;
    }
    return v->valuedouble > 1e9 ? 1000000000L : (long)v->valuedouble;
}

/* Type bits from "type" (a name or a list of names); 0 without one, -1 after failing. */
enum { T_NULL = 1, T_BOOL = 2, T_OBJECT = 4, T_ARRAY = 8, T_NUMBER = 16, T_STRING = 32, T_INTEGER = 64 };
static int type_bits(struct js *j, const cJSON *s) {
    static const char *const names[] = {"null", "boolean", "object", "array", "number", "string", "integer", NULL};
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (!t) return 0;
    int bits = 0;
    const cJSON *one = cJSON_IsArray(t) ? t->child : t;
    for (; one; one = cJSON_IsArray(t) ? one->next : NULL) {
        int k = 0;
        while (names[k] && !(cJSON_IsString(one) && !strcmp(one->valuestring, names[k]))) k++;
        if (!names[k]) return fail(j, GRAMMAR_ERR_INVALID, "'type' must be a type name or a list of them"), -1;
        bits |= 1 << k;
    }
    if (!bits) return fail(j, GRAMMAR_ERR_INVALID, "'type' is an empty list"), -1;
    return bits;
}

/* ---- objects, literals, numbers with bounds --------------------------------------------- */

/* cJSON's compact text of v (malloc'd), as enum/const literals and keys are written. */
static char *print_json(struct js *j, const cJSON *v) {
    char *t = cJSON_PrintUnformatted(v);
    if (!t) fail(j, GRAMMAR_ERR_NOMEM, "out of memory");
    return t;
}

/* Declared properties in order, the required ones always, optional ones possibly skipped. Node
 * at[i * 2 + f] is where property i may start, f: whether one was written (a ',' comes first). */
static void object_props(struct js *j, const cJSON *s, const cJSON *props, int32_t from, int32_t to) {
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    if (req && !cJSON_IsArray(req)) return (void)fail(j, GRAMMAR_ERR_INVALID, "'required' must be an array");
    for (const cJSON *r = req ? req->child : NULL; r; r = r->next) {
        if (!cJSON_IsString(r)) return (void)fail(j, GRAMMAR_ERR_INVALID, "'required' must list strings");
        if (!cJSON_GetObjectItemCaseSensitive(props, r->valuestring)) {
            char msg[128];
            snprintf(msg, sizeof msg, "required property '%.60s' is not in 'properties'", r->valuestring);
            return (void)fail(j, GRAMMAR_ERR_INVALID, msg);
        }
    }
    int n = cJSON_GetArraySize(props);
    int32_t *at = malloc(sizeof *at * (size_t)(2 * n + 2));
    if (!at) return (void)fail(j, GRAMMAR_ERR_NOMEM, "out of memory");
    for (int i = 0; i < 2 * n + 2; i++) at[i] = -1;
    at[0] = ws(j, byte(j, from, '{'));
    int i = 0;
    for (const cJSON *p = props->child; p && !j->b.status; p = p->next, i++) {
        for (const cJSON *q = props->child; q != p; q = q->next)
            if (!strcmp(q->string, p->string)) {
                fail(j, GRAMMAR_ERR_INVALID, "a property is declared twice");
                goto out;
            }
        bool required = false;
        for (const cJSON *r = req ? req->child : NULL; r; r = r->next) required |= !strcmp(r->valuestring, p->string);
        size_t mark = path_push(j, "properties/");
        snprintf(j->path + mark + 12, sizeof j->path - mark - 12, "%s", p->string);
        int32_t val = compile(j, p);
        j->path[mark] = 0;
        cJSON *key = cJSON_CreateString(p->string);
        char *kt = key ? print_json(j, key) : NULL;
        cJSON_Delete(key);
        if (!kt) {
            fail(j, GRAMMAR_ERR_NOMEM, "out of memory");
            goto out;
        }
        for (int f = 0; f < 2; f++) {
            int32_t x = at[i * 2 + f];
            if (x < 0) continue;
            if (!required) {
                if (at[(i + 1) * 2 + f] < 0) at[(i + 1) * 2 + f] = next(j, from);
                gb_eps(&j->b, x, at[(i + 1) * 2 + f]);
            }
            if (f) x = ws(j, byte(j, x, ','));
            int32_t v = call(j, ws(j, byte(j, ws(j, lit(j, x, kt)), ':')), val);
            if (at[(i + 1) * 2 + 1] < 0) at[(i + 1) * 2 + 1] = next(j, from);
            ws_to(j, v, at[(i + 1) * 2 + 1]);
        }
        free(kt);
    }
    for (int f = 0; f < 2; f++)
        if (at[n * 2 + f] >= 0) gb_bytes(&j->b, at[n * 2 + f], '}', '}', to);
out:
    free(at);
}

static void object(struct js *j, const cJSON *s, int32_t from, int32_t to) {
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *ap = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    if (props && !cJSON_IsObject(props)) return (void)fail(j, GRAMMAR_ERR_INVALID, "'properties' must be an object");
    if (ap && !cJSON_IsBool(ap) && !cJSON_IsObject(ap))
        return (void)fail(j, GRAMMAR_ERR_INVALID, "'additionalProperties' must be a boolean or a schema");
    if (props) return object_props(j, s, props, from, to);
    if (cJSON_GetObjectItemCaseSensitive(s, "required"))
        return (void)fail(j, GRAMMAR_ERR_UNSUPPORTED, "unsupported: 'required' without 'properties'");
    int32_t val = value_rule(j);
    if (cJSON_IsFalse(ap)) val = -1;
    if (cJSON_IsObject(ap)) {
        size_t mark = path_push(j, "additionalProperties");
        val = compile(j, ap);
        j->path[mark] = 0;
    }
    object_map(j, from, to, val);
}

static long utf8_chars(const char *s) {
    long n = 0;
    for (; *s; s++) n += ((uint8_t)*s & 0xc0) != 0x80;
    return n;
}

/* Whether an enum/const value also meets the schema's type and bounds. */
static bool literal_fits(const cJSON *s, const cJSON *v, int types) {
    const cJSON *mn = cJSON_GetObjectItemCaseSensitive(s, "minimum"), *mx = cJSON_GetObjectItemCaseSensitive(s, "maximum");
    long minl = -1, maxl = -1;
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(s, "minLength"), *b = cJSON_GetObjectItemCaseSensitive(s, "maxLength");
    if (cJSON_IsNumber(a)) minl = (long)a->valuedouble;
    if (cJSON_IsNumber(b)) maxl = (long)b->valuedouble;
    if (cJSON_IsNumber(v)) {
        bool integral = v->valuedouble == floor(v->valuedouble);
        if (types && !(types & T_NUMBER) && !((types & T_INTEGER) && integral)) return false;
        if (cJSON_IsNumber(mn) && v->valuedouble < mn->valuedouble) return false;
        if (cJSON_IsNumber(mx) && v->valuedouble > mx->valuedouble) return false;
        return true;
    }
    if (cJSON_IsString(v)) {
        long n = utf8_chars(v->valuestring);
        return (!types || (types & T_STRING)) && (minl < 0 || n >= minl) && (maxl < 0 || n <= maxl);
    }
    int t = cJSON_IsNull(v) ? T_NULL : cJSON_IsBool(v) ? T_BOOL : cJSON_IsObject(v) ? T_OBJECT : T_ARRAY;
    return !types || (types & t);
}

/* enum / const: the literals, as a trie from `from`. */
static void literals(struct js *j, const cJSON *s, int types, int32_t from, int32_t to) {
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum"), *cn = cJSON_GetObjectItemCaseSensitive(s, "const");
    if (en && !cJSON_IsArray(en)) return (void)fail(j, GRAMMAR_ERR_INVALID, "'enum' must be an array");
    for (const cJSON *v = en ? en->child : cn; v && !j->b.status; v = en ? v->next : NULL) {
        if (en && cn && !cJSON_Compare(v, cn, true)) continue;
        if (!literal_fits(s, v, types)) continue;
        char *t = print_json(j, v);
        if (t) gb_eps(&j->b, lit(j, from, t), to);
        free(t);
    }
}

/* minimum / maximum (exclusive ones on integers) as decimals; *lo / *hi NULL when absent. */
static int bounds(struct js *j, const cJSON *s, bool integer, struct gr_dec *dlo, struct gr_dec *dhi,
                  struct gr_dec **lo, struct gr_dec **hi) {
    *lo = *hi = NULL;
    const cJSON *k[4] = {cJSON_GetObjectItemCaseSensitive(s, "minimum"), cJSON_GetObjectItemCaseSensitive(s, "maximum"),
                         cJSON_GetObjectItemCaseSensitive(s, "exclusiveMinimum"),
                         cJSON_GetObjectItemCaseSensitive(s, "exclusiveMaximum")};
    for (int i = 0; i < 4; i++)
        if (k[i] && !cJSON_IsNumber(k[i]) && !(i >= 2 && cJSON_IsBool(k[i])))
            return fail(j, GRAMMAR_ERR_INVALID, "minimum/maximum must be numbers");
    if (!integer && (cJSON_IsNumber(k[2]) || cJSON_IsNumber(k[3]) || cJSON_IsTrue(k[2]) || cJSON_IsTrue(k[3])))
        return fail(j, GRAMMAR_ERR_UNSUPPORTED, "unsupported: exclusiveMinimum/exclusiveMaximum on a number "
                    "(supported on integers)");
    double l = -INFINITY, h = INFINITY;
    if (k[0]) l = integer ? (cJSON_IsTrue(k[2]) ? floor(k[0]->valuedouble) + 1 : ceil(k[0]->valuedouble)) : k[0]->valuedouble;
    if (k[1]) h = integer ? (cJSON_IsTrue(k[3]) ? ceil(k[1]->valuedouble) - 1 : floor(k[1]->valuedouble)) : k[1]->valuedouble;
    if (cJSON_IsNumber(k[2]) && floor(k[2]->valuedouble) + 1 > l) l = floor(k[2]->valuedouble) + 1;
    if (cJSON_IsNumber(k[3]) && ceil(k[3]->valuedouble) - 1 < h) h = ceil(k[3]->valuedouble) - 1;
    if (l > h) return fail(j, GRAMMAR_ERR_INVALID, "no number fits minimum/maximum");
    *lo = *hi = NULL;
    if (isfinite(l) && gr_dec_from_double(dlo, l) == 0) *lo = dlo;
    if (isfinite(h) && gr_dec_from_double(dhi, h) == 0) *hi = dhi;
    if ((isfinite(l) && !*lo) || (isfinite(h) && !*hi)) return fail(j, GRAMMAR_ERR_LIMIT, "a bound has too many digits");
    return 0;
}

/* ---- schemas ---------------------------------------------------------------------------- */

/* One type's values from `from` to `to`. */
static void typed(struct js *j, const cJSON *s, int type, int32_t from, int32_t to) {
    struct gr_dec dlo, dhi, *lo, *hi;
    switch (type) {
    case T_NULL: gb_eps(&j->b, lit(j, from, "null"), to); break;
    case T_BOOL:
        gb_eps(&j->b, lit(j, from, "true"), to);
        gb_eps(&j->b, lit(j, from, "false"), to);
        break;
    case T_OBJECT: object(j, s, from, to); break;
    case T_ARRAY: {
        const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
        long mn = count_kw(j, s, "minItems"), mx = count_kw(j, s, "maxItems");
        if (mn < -1 || mx < -1) return;
        if (items && !cJSON_IsObject(items) && !cJSON_IsBool(items))
            return (void)fail(j, GRAMMAR_ERR_UNSUPPORTED, "unsupported: 'items' as a list (tuples)");
        if (mx >= 0 && mn > mx) return (void)fail(j, GRAMMAR_ERR_INVALID, "minItems is greater than maxItems");
        int32_t item = value_rule(j);
        if (items) {
            size_t mark = path_push(j, "items");
            item = compile(j, items);
            j->path[mark] = 0;
        }
        array_items(j, from, to, item, mn < 0 ? 0 : mn, mx);
        break;
    }
    case T_STRING: {
        long mn = count_kw(j, s, "minLength"), mx = count_kw(j, s, "maxLength");
        if (mn < -1 || mx < -1) return;
        if (mx >= 0 && mn > mx) return (void)fail(j, GRAMMAR_ERR_INVALID, "minLength is greater than maxLength");
        if (mn <= 0 && mx < 0) gb_call(&j->b, from, string_rule(j), to);
        else gb_eps(&j->b, string_body(j, from, mn < 0 ? 0 : mn, mx), to);
        break;
    }
    case T_NUMBER:
    case T_INTEGER:
        if (bounds(j, s, type == T_INTEGER, &dlo, &dhi, &lo, &hi)) return;
        if (!lo && !hi) gb_call(&j->b, from, number_rule(j, type == T_INTEGER), to);
        else gb_number(&j->b, from, to, lo, hi, type == T_INTEGER);
        break;
    }
}

/* Resolves a local $ref ("#", "#/$defs/a", any JSON pointer into the document). */
static const cJSON *resolve(struct js *j, const char *ref) {
    char msg[200];
    if (ref[0] != '#' || (ref[1] && ref[1] != '/')) {
        snprintf(msg, sizeof msg, "unsupported $ref '%.80s' (only local references '#/...')", ref);
        fail(j, GRAMMAR_ERR_UNSUPPORTED, msg);
        return NULL;
    }
    const cJSON *cur = j->doc;
    for (const char *p = ref + 1; *p == '/' && cur;) {
        char seg[256];
        size_t n = 0;
        for (p++; *p && *p != '/'; p++) {
            char c = *p;
            if (c == '~' && (p[1] == '0' || p[1] == '1')) c = *++p == '0' ? '~' : '/';
            if (n + 1 < sizeof seg) seg[n++] = c;
        }
        seg[n] = 0;
        if (cJSON_IsArray(cur)) {
            char *end;
            long i = strtol(seg, &end, 10);
            cur = *seg && !*end && i >= 0 ? cJSON_GetArrayItem(cur, (int)i) : NULL;
        } else {
            cur = cJSON_IsObject(cur) ? cJSON_GetObjectItemCaseSensitive(cur, seg) : NULL;
        }
    }
    if (!cur) {
        snprintf(msg, sizeof msg, "$ref '%.80s' points to nothing in the schema", ref);
        fail(j, GRAMMAR_ERR_INVALID, msg);
    }
    return cur;
}

/* The body of rule r for schema s (not a $ref, not a shared rule). */
static void body(struct js *j, const cJSON *s, int32_t r, int types) {
    int32_t start = gb_start(&j->b, r), end = next(j, start);
    gb_final(&j->b, end);
    const cJSON *any = cJSON_GetObjectItemCaseSensitive(s, "anyOf");
    if (any) {
        if (!cJSON_IsArray(any) || !any->child) return (void)fail(j, GRAMMAR_ERR_INVALID, "'anyOf' must be a non-empty array");
        if (check_keywords(j, s, "anyOf")) return;
        int i = 0;
        for (const cJSON *a = any->child; a && !j->b.status; a = a->next, i++) {
            char seg[32];
            snprintf(seg, sizeof seg, "anyOf/%d", i);
            size_t mark = path_push(j, seg);
            gb_call(&j->b, start, compile(j, a), end);
            j->path[mark] = 0;
        }
        return;
    }
    if (cJSON_GetObjectItemCaseSensitive(s, "enum") || cJSON_GetObjectItemCaseSensitive(s, "const"))
        return literals(j, s, types, start, end);
    if (!types) { /* no "type": what the keywords imply, else any value */
        if (cJSON_GetObjectItemCaseSensitive(s, "properties") || cJSON_GetObjectItemCaseSensitive(s, "required") ||
            cJSON_GetObjectItemCaseSensitive(s, "additionalProperties"))
            types = T_OBJECT;
        else if (cJSON_GetObjectItemCaseSensitive(s, "items") || cJSON_GetObjectItemCaseSensitive(s, "minItems") ||
                 cJSON_GetObjectItemCaseSensitive(s, "maxItems"))
            types = T_ARRAY;
        else if (cJSON_GetObjectItemCaseSensitive(s, "minLength") || cJSON_GetObjectItemCaseSensitive(s, "maxLength"))
            types = T_STRING;
        else if (cJSON_GetObjectItemCaseSensitive(s, "minimum") || cJSON_GetObjectItemCaseSensitive(s, "maximum") ||
                 cJSON_GetObjectItemCaseSensitive(s, "exclusiveMinimum") ||
                 cJSON_GetObjectItemCaseSensitive(s, "exclusiveMaximum"))
            types = T_NUMBER;
        else
            return gb_call(&j->b, start, value_rule(j), end);
    }
    if ((types & T_INTEGER) && (types & T_NUMBER)) types &= ~T_INTEGER; /* numbers include integers */
    for (int t = 1; t <= T_INTEGER && !j->b.status; t <<= 1)
        if (types & t) typed(j, s, t, start, end);
}

/* The rule of schema s. */
static int32_t compile(struct js *j, const cJSON *s) {
    if (j->b.status) return -1;
    bool found;
    int32_t *slot = memo_slot(j, s, &found);
    if (!slot) return fail(j, GRAMMAR_ERR_NOMEM, "out of memory"), -1;
    if (found && *slot == -3) return fail(j, GRAMMAR_ERR_INVALID, "a $ref cycle that never reaches a schema"), -1;
    if (found) return *slot;
    if (++j->depth > j->opt.max_schema_depth) {
        char msg[80];
        snprintf(msg, sizeof msg, "the schema nests deeper than %d levels", j->opt.max_schema_depth);
        return fail(j, GRAMMAR_ERR_LIMIT, msg), -1;
    }
    *slot = -3;
    int32_t r = -1;
    int types;
    const cJSON *ref = cJSON_IsObject(s) ? cJSON_GetObjectItemCaseSensitive(s, "$ref") : NULL;
    const cJSON *all = cJSON_IsObject(s) ? cJSON_GetObjectItemCaseSensitive(s, "allOf") : NULL;
    if (cJSON_IsTrue(s)) {
        r = value_rule(j);
    } else if (cJSON_IsFalse(s)) {
        r = gb_rule(&j->b); /* no path: a property with it can only be left out */
    } else if (!cJSON_IsObject(s)) {
        fail(j, GRAMMAR_ERR_INVALID, "a schema must be an object or a boolean");
    } else if (ref) {
        const cJSON *t = cJSON_IsString(ref) ? resolve(j, ref->valuestring) : NULL;
        if (!cJSON_IsString(ref)) fail(j, GRAMMAR_ERR_INVALID, "'$ref' must be a string");
        if (t && !check_keywords(j, s, "$ref")) r = compile(j, t);
    } else if (all) {
        if (!cJSON_IsArray(all) || cJSON_GetArraySize(all) != 1)
            fail(j, GRAMMAR_ERR_UNSUPPORTED, "unsupported: 'allOf' with other than one schema");
        else if (!check_keywords(j, s, "allOf")) {
            size_t mark = path_push(j, "allOf/0");
            r = compile(j, all->child);
            j->path[mark] = 0;
        }
    } else if (!check_keywords(j, s, NULL) && (types = type_bits(j, s)) >= 0) {
        /* the shared rules where nothing constrains them */
        bool plain = !cJSON_GetObjectItemCaseSensitive(s, "enum") && !cJSON_GetObjectItemCaseSensitive(s, "const");
        for (const cJSON *c = s->child; c && plain; c = c->next)
            plain = in_list(c->string, annotations) || !strcmp(c->string, "type");
        if (plain && types == T_STRING) r = string_rule(j);
        else if (plain && types == T_NUMBER) r = number_rule(j, false);
        else if (plain && types == T_INTEGER) r = number_rule(j, true);
        else if (plain && types == 0) r = value_rule(j);
        else {
            r = gb_rule(&j->b);
            slot = memo_slot(j, s, &found); /* the map may have moved */
            if (slot) *slot = r;      /* before the body: a $ref back to s calls r */
            if (r >= 0) body(j, s, r, types);
        }
    }
    j->depth--;
    slot = memo_slot(j, s, &found);
    if (slot) *slot = j->b.status ? -1 : r;
    return j->b.status ? -1 : r;
}

static void options(struct grammar_options *o, const struct grammar_options *in) {
    *o = in ? *in : (struct grammar_options){0};
    if (o->max_indent <= 0) o->max_indent = 20;
    if (!o->max_nodes) o->max_nodes = 262144;
    if (o->max_schema_depth <= 0) o->max_schema_depth = 64;
    if (o->max_stack <= 0) o->max_stack = 512;
    if (o->max_alternatives <= 0) o->max_alternatives = 1024;
}

static const char *or_empty(const char *s) { return s ? s : ""; }

/* The root rule of a wrapped sequence: begin item (sep item)* end with min..max items, where an
 * item is item_begin ws value ws item_end (grammar_wrap). Returns the rule. */
static int32_t wrapped_root(struct js *j, const struct grammar_wrap *w, int32_t val) {
    int32_t item = gb_rule(&j->b), is = gb_start(&j->b, item);
    gb_final(&j->b, lit(j, ws(j, call(j, ws(j, lit(j, is, or_empty(w->item_begin))), val)), or_empty(w->item_end)));
    int32_t root = gb_rule(&j->b), at = lit(j, gb_start(&j->b, root), or_empty(w->begin));
    int min = w->min_items > 1 ? w->min_items : 1, max = w->max_items;
    if (max > 0 && max < min) {
        gb_fail(&j->b, GRAMMAR_ERR_INVALID, "max_items %d is below min_items %d", max, min);
        return -1;
    }
    int unrolled = max > 0 ? max : min;
    for (int k = 1; k <= unrolled && !j->b.status; k++) {
        if (k > 1) at = lit(j, at, or_empty(w->sep));
        at = call(j, at, item);
        if (k >= min && (max > 0 || k == unrolled)) gb_final(&j->b, lit(j, at, or_empty(w->end)));
    }
    if (max == 0 && !j->b.status) gb_call(&j->b, lit(j, at, or_empty(w->sep)), item, at); /* any number more */
    return root;
}

/* Builds the root rule (ws value ws, or the wrapped sequence) around the schema's value rule
 * (any JSON object when schema is NULL), and finishes. */
static int build(struct grammar **out, const cJSON *schema, const struct grammar_wrap *wrap,
                 const struct grammar_options *opt, char *err, size_t errlen) {
    struct js j = {.ws = -1, .string = -1, .number = -1, .integer = -1, .value = -1, .object_any = -1, .array_any = -1};
    options(&j.opt, opt);
    gb_init(&j.b, &j.opt, err, errlen);
    strcpy(j.path, "#");
    j.doc = schema;
    int32_t val = schema ? compile(&j, schema) : object_any_rule(&j);
    int32_t root;
    if (wrap) {
        root = wrapped_root(&j, wrap, val);
    } else {
        root = gb_rule(&j.b);
        gb_final(&j.b, ws(&j, call(&j, ws(&j, gb_start(&j.b, root)), val)));
    }
    int rc = gb_finish(&j.b, root, &j.opt, out);
    gb_free(&j.b);
    free(j.memo_key);
    free(j.memo_val);
    return rc;
}

int grammar_compile_schema_json(struct grammar **out, const cJSON *schema, const struct grammar_options *opt,
                                char *err, size_t errlen) {
    *out = NULL;
    if (!schema) {
        if (err && errlen) snprintf(err, errlen, "no schema");
        return GRAMMAR_ERR_INVALID;
    }
    return build(out, schema, NULL, opt, err, errlen);
}

int grammar_compile_wrapped(struct grammar **out, const char *text, size_t len, const struct grammar_wrap *wrap,
                            const struct grammar_options *opt, char *err, size_t errlen) {
    *out = NULL;
    cJSON *schema = text ? cJSON_ParseWithLength(text, len) : NULL;
    if (text && !schema) {
        if (err && errlen) snprintf(err, errlen, "the schema is not valid JSON");
        return GRAMMAR_ERR_JSON;
    }
    int rc = build(out, schema, wrap, opt, err, errlen);
    cJSON_Delete(schema);
    return rc;
}

int grammar_compile_schema(struct grammar **out, const char *text, size_t len, const struct grammar_options *opt,
                           char *err, size_t errlen) {
    *out = NULL;
    if (!text) {
        if (err && errlen) snprintf(err, errlen, "no schema");
        return GRAMMAR_ERR_INVALID;
    }
    return grammar_compile_wrapped(out, text, len, NULL, opt, err, errlen);
}

int grammar_compile_json_object(struct grammar **out, const struct grammar_options *opt, char *err, size_t errlen) {
    *out = NULL;
    return build(out, NULL, NULL, opt, err, errlen);
}
