/* Structured output (engine/grammar.h, engine/token_mask.h): schemas compile or fail naming what
 * is unsupported; random valid instances and their mutations are accepted exactly when an
 * independent recursive-descent reference (tests/grammar_ref.h) accepts them, and what is
 * accepted parses and validates; token masks equal a brute-force check of every token for
 * random reachable states of the llama3, llama2 and qwen3 tokenizers; sampling under the mask
 * gives valid JSON. Prints mask times (not asserted). */
#include "tests/test_common.h"
#include "tests/grammar_ref.h"

#include <time.h>

#include "engine/backend.h"
#include "engine/grammar.h"
#include "engine/sampler.h"
#include "engine/token_mask.h"
#include "engine/text/tokenizer.h"

static const char *const corpus[] = {
    /* 0: nested object, optional and nullable fields, bounded integer, fixed-length string */
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\","
    "\"minimum\":0,\"maximum\":150},\"email\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"null\"}]},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":6},\"maxItems\":4},"
    "\"address\":{\"type\":\"object\",\"properties\":{\"street\":{\"type\":\"string\"},\"zip\":{\"type\":"
    "\"string\",\"minLength\":5,\"maxLength\":5}},\"required\":[\"zip\"],\"additionalProperties\":false}},"
    "\"required\":[\"name\",\"age\",\"tags\"],\"additionalProperties\":false}",
    /* 1: enum and const literals, decimal bounds, exclusive integer bounds */
    "{\"type\":\"object\",\"properties\":{\"color\":{\"enum\":[\"red\",\"green\",\"bl\\\"ue\",1.5,null,true,"
    "[1,2],{\"k\":\"v\"}]},\"mode\":{\"const\":\"x\"},\"n\":{\"type\":\"number\",\"minimum\":-2.5,\"maximum\":0.25},"
    "\"k\":{\"type\":\"integer\",\"exclusiveMinimum\":-3,\"exclusiveMaximum\":7},\"m\":{\"type\":\"number\","
    "\"minimum\":10}},\"required\":[\"color\",\"n\"]}",
    /* 2: recursion through $defs */
    "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"value\":{\"type\":\"integer\"},\"children\":"
    "{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}}},\"required\":[\"value\"]}},\"$ref\":\"#/$defs/node\"}",
    /* 3: items of several types, bounded count */
    "{\"type\":\"array\",\"items\":{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"string\",\"maxLength\":3},"
    "{\"type\":\"boolean\"},{\"type\":\"number\",\"maximum\":-1}]},\"minItems\":1,\"maxItems\":5}",
    /* 4: any value */
    "{}",
    /* 5: a type list with keywords for some of its types */
    "{\"type\":[\"string\",\"null\",\"integer\"],\"maxLength\":4,\"minimum\":-5}",
    /* 6: arrays of arrays */
    "{\"type\":\"array\",\"items\":{\"type\":\"array\",\"items\":{\"type\":\"number\"},\"minItems\":2}}",
    /* 7: only optional properties */
    "{\"properties\":{\"a\":{\"type\":\"integer\"},\"ab\":{\"type\":\"boolean\"},\"c\":{\"enum\":[\"x\",\"xy\"]}},"
    "\"additionalProperties\":false}",
    /* 8: a map */
    "{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\",\"minimum\":0}}",
    /* 9: keys that need escapes or are not ASCII */
    "{\"type\":\"object\",\"properties\":{\"\\u043a\\u043b\\u044e\\u0447\":{\"type\":\"string\"},\"a\\\"b\":"
    "{\"type\":\"integer\"},\"t\\tab\":{\"type\":\"null\"}},\"required\":[\"\\u043a\\u043b\\u044e\\u0447\"]}",
    /* 10: anyOf of objects sharing a prefix (ambiguous until the key) */
    "{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"a\"},\"x\":{\"type\":\"integer\"}},"
    "\"required\":[\"kind\",\"x\"]},{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"b\"},\"y\":{\"type\":"
    "\"string\"}},\"required\":[\"kind\"]},{\"type\":\"object\",\"properties\":{\"kind\":{\"type\":\"string\"}}}]}",
    /* 11: wide integer bounds, draft-4 boolean exclusiveMaximum */
    "{\"type\":\"integer\",\"minimum\":-1000000,\"maximum\":123456789,\"exclusiveMaximum\":true}",
    /* 12: a top-level string with length bounds */
    "{\"type\":\"string\",\"minLength\":2,\"maxLength\":6}",
    /* 13: definitions, allOf with one schema, pointer into properties */
    "{\"definitions\":{\"p\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"number\"},\"y\":{\"type\":"
    "\"number\"}},\"required\":[\"x\",\"y\"]}},\"type\":\"object\",\"properties\":{\"a\":{\"allOf\":[{\"$ref\":"
    "\"#/definitions/p\"}],\"description\":\"d\"},\"b\":{\"$ref\":\"#/properties/a\"},\"c\":{\"type\":\"array\","
    "\"items\":{\"$ref\":\"#/definitions/p\"},\"maxItems\":2}},\"required\":[\"a\",\"b\"]}",
};
#define N_CORPUS (sizeof corpus / sizeof *corpus)

static struct grammar *compile_ok(const char *schema, const struct grammar_options *opt) {
    struct grammar *g = NULL;
    char err[256];
    int rc = schema ? grammar_compile_schema(&g, schema, strlen(schema), opt, err, sizeof err)
                    : grammar_compile_json_object(&g, opt, err, sizeof err);
    if (rc) fail_msg("compile %s: %s (%s)", schema ? schema : "json_object", err, grammar_strerror(rc));
    return g;
}

/* Whether the grammar accepts the whole text, fed in random pieces. */
static bool accepts(const struct grammar *g, const char *t, size_t n, uint64_t *rng) {
    struct grammar_state *s;
    assert_int_equal(grammar_state_init(&s, g), 0);
    bool ok = true;
    for (size_t i = 0; i < n && ok;) {
        *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
        size_t k = 1 + (*rng >> 33) % 7;
        if (k > n - i) k = n - i;
        int rc = grammar_state_advance(s, t + i, k);
        assert_true(rc == 0 || rc == GRAMMAR_REJECT);
        ok = rc == 0;
        i += k;
    }
    ok = ok && grammar_state_accepting(s);
    grammar_state_free(s);
    return ok;
}

static void test_compile_supported(void **state) {
    for (size_t i = 0; i < N_CORPUS; i++) {
        struct grammar *g = compile_ok(corpus[i], NULL);
        assert_true(grammar_num_nodes(g) > 0 && grammar_memory(g) > 0);
        grammar_free(g);
    }
    grammar_free(compile_ok(NULL, NULL));
    grammar_free(NULL);
}

static void test_compile_errors(void **state) {
    static const struct {
        const char *schema;
        int status;
        const char *msg;
    } bad[] = {
        {"{\"type\":\"string\",\"pattern\":\"^a+$\"}", GRAMMAR_ERR_UNSUPPORTED, "'pattern'"},
        {"{\"oneOf\":[{\"type\":\"string\"}]}", GRAMMAR_ERR_UNSUPPORTED, "'oneOf'"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"array\",\"uniqueItems\":true}}}",
         GRAMMAR_ERR_UNSUPPORTED, "'uniqueItems' (at #/properties/a)"},
        {"{\"type\":\"number\",\"exclusiveMinimum\":0}", GRAMMAR_ERR_UNSUPPORTED, "exclusiveMinimum"},
        {"{\"exclusiveMaximum\":0}", GRAMMAR_ERR_UNSUPPORTED, "exclusiveMinimum/exclusiveMaximum"},
        {"{\"type\":\"array\",\"items\":[{\"type\":\"string\"}]}", GRAMMAR_ERR_UNSUPPORTED, "tuples"},
        {"{\"allOf\":[{\"type\":\"string\"},{\"maxLength\":3}]}", GRAMMAR_ERR_UNSUPPORTED, "'allOf'"},
        {"{\"$ref\":\"#/$defs/a\",\"type\":\"string\",\"$defs\":{\"a\":{}}}", GRAMMAR_ERR_UNSUPPORTED, "'type'"},
        {"{\"$ref\":\"https://example.com/s.json\"}", GRAMMAR_ERR_UNSUPPORTED, "only local"},
        {"{\"type\":\"object\",\"required\":[\"a\"]}", GRAMMAR_ERR_UNSUPPORTED, "'required' without"},
        {"{\"$ref\":\"#/$defs/missing\"}", GRAMMAR_ERR_INVALID, "points to nothing"},
        {"{\"type\":\"strin\"}", GRAMMAR_ERR_INVALID, "'type'"},
        {"{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", GRAMMAR_ERR_INVALID, "minimum/maximum"},
        {"{\"type\":\"string\",\"minLength\":3,\"maxLength\":2}", GRAMMAR_ERR_INVALID, "minLength"},
        {"{\"type\":\"array\",\"minItems\":-1}", GRAMMAR_ERR_INVALID, "minItems"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{}},\"required\":[\"b\"]}", GRAMMAR_ERR_INVALID, "'b'"},
        {"{\"anyOf\":[{\"$ref\":\"#\"},{\"type\":\"null\"}]}", GRAMMAR_ERR_INVALID, "refers to itself"},
        {"{\"$defs\":{\"a\":{\"$ref\":\"#/$defs/b\"},\"b\":{\"$ref\":\"#/$defs/a\"}},\"$ref\":\"#/$defs/a\"}",
         GRAMMAR_ERR_INVALID, "$ref cycle"},
        {"{\"enum\":[\"a\"],\"type\":\"integer\"}", GRAMMAR_ERR_INVALID, "accepts no JSON value"},
        {"false", GRAMMAR_ERR_INVALID, "accepts no JSON value"},
        {"{\"type\":\"object\",\"properties\":{\"a\":false},\"required\":[\"a\"]}", GRAMMAR_ERR_INVALID, "no JSON"},
        {"[1]", GRAMMAR_ERR_INVALID, "object or a boolean"},
        {"{\"type\":", GRAMMAR_ERR_JSON, "not valid JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        struct grammar *g = (struct grammar *)1;
        char err[256] = "";
        int rc = grammar_compile_schema(&g, bad[i].schema, strlen(bad[i].schema), NULL, err, sizeof err);
        if (rc != bad[i].status || !strstr(err, bad[i].msg))
            fail_msg("%s: status %d (%s), want %d with \"%s\"", bad[i].schema, rc, err, bad[i].status, bad[i].msg);
        assert_null(g);
    }
    /* an optional property whose schema is false is just never written */
    struct grammar *g = compile_ok("{\"properties\":{\"a\":false,\"b\":{\"type\":\"null\"}}}", NULL);
    uint64_t rng = 1;
    assert_true(accepts(g, "{\"b\":null}", 10, &rng));
    assert_false(accepts(g, "{\"a\":1}", 7, &rng));
    grammar_free(g);
}

/* Size, depth and ambiguity limits end in a clear error, quickly. */
static void test_limits(void **state) {
    char err[256];
    struct grammar *g;
    double t0 = (double)clock() / CLOCKS_PER_SEC;
    const char *big = "{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":100000000}}";
    assert_int_equal(grammar_compile_schema(&g, big, strlen(big), NULL, err, sizeof err), GRAMMAR_ERR_LIMIT);
    assert_non_null(strstr(err, "larger than 262144 nodes"));
    const char *many = "{\"type\":\"array\",\"maxItems\":1000000000}";
    struct grammar_options small = {.max_nodes = 5000};
    assert_int_equal(grammar_compile_schema(&g, many, strlen(many), &small, err, sizeof err), GRAMMAR_ERR_LIMIT);
    assert_true((double)clock() / CLOCKS_PER_SEC - t0 < 2.0);
    /* nesting of the schema document */
    char deep[4096] = "";
    for (int i = 0; i < 100; i++) strcat(deep, "{\"type\":\"array\",\"items\":");
    strcat(deep, "{}");
    for (int i = 0; i < 100; i++) strcat(deep, "}");
    assert_int_equal(grammar_compile_schema(&g, deep, strlen(deep), NULL, err, sizeof err), GRAMMAR_ERR_LIMIT);
    assert_non_null(strstr(err, "deeper than 64"));
    /* output nesting: past max_stack frames, nothing opens another level */
    struct grammar_options shallow = {.max_stack = 24};
    g = compile_ok(NULL, &shallow);
    struct grammar_state *s;
    assert_int_equal(grammar_state_init(&s, g), 0);
    assert_int_equal(grammar_state_advance(s, "{\"a\":", 5), 0);
    int opened = 0;
    while (opened < 100 && grammar_state_advance(s, "[", 1) == 0) opened++;
    assert_true(opened > 3 && opened < 24);
    for (int i = 0; i < opened; i++) /* still completable */ assert_int_equal(grammar_state_advance(s, "]", 1), 0);
    assert_int_equal(grammar_state_advance(s, "}", 1), 0);
    assert_true(grammar_state_accepting(s));
    grammar_state_free(s);
    grammar_free(g);
    /* too many alternatives alive at once */
    const char *amb = "{\"anyOf\":[{\"type\":\"array\",\"items\":{\"$ref\":\"#\"}},{\"type\":\"array\",\"items\":"
                      "{\"$ref\":\"#\"}},{\"type\":\"null\"}]}";
    struct grammar_options few = {.max_alternatives = 64};
    g = compile_ok(amb, &few);
    assert_int_equal(grammar_state_init(&s, g), 0);
    int rc = 0, n = 0;
    while (n < 50 && (rc = grammar_state_advance(s, "[", 1)) == 0) n++;
    assert_int_equal(rc, GRAMMAR_ERR_LIMIT);
    grammar_state_free(s);
    grammar_free(g);
}

static void test_state_api(void **state) {
    struct grammar_options none = {.whitespace = GRAMMAR_WS_NONE};
    struct grammar *g = compile_ok("{\"type\":\"object\",\"properties\":{\"ok\":{\"type\":\"boolean\"}},"
                                   "\"required\":[\"ok\"]}", &none);
    struct grammar_state *s, *c;
    assert_int_equal(grammar_state_init(&s, g), 0);
    assert_ptr_equal(grammar_state_grammar(s), g);
    assert_false(grammar_state_accepting(s));
    assert_int_equal(grammar_state_advance(s, "{\"ok\":", 6), 0);
    assert_int_equal(grammar_state_clone(&c, s), 0);
    assert_true(grammar_state_try(s, "true}", 5));
    assert_false(grammar_state_try(s, "tru}", 4));
    assert_int_equal(grammar_state_advance(s, "tx", 2), GRAMMAR_REJECT); /* unchanged: "true" still fits */
    assert_int_equal(grammar_state_advance(s, "false}", 6), 0);
    assert_true(grammar_state_accepting(s));
    assert_false(grammar_state_can_continue(s)); /* no whitespace: finished */
    assert_int_equal(grammar_state_advance(s, " ", 1), GRAMMAR_REJECT);
    assert_int_equal(grammar_state_advance(c, "true", 4), 0); /* the clone went its own way */
    assert_false(grammar_state_accepting(c));
    assert_int_equal(grammar_state_advance(c, "}", 1), 0);
    assert_true(grammar_state_accepting(c));
    assert_int_equal(grammar_state_advance(c, "", 0), 0);
    grammar_state_free(s);
    grammar_state_free(c);
    grammar_state_free(NULL);
    grammar_free(g);
    /* a long output: frames are compacted as the text goes */
    g = compile_ok(NULL, NULL);
    assert_int_equal(grammar_state_init(&s, g), 0);
    assert_int_equal(grammar_state_advance(s, "{\"a\": [", 7), 0);
    for (int i = 0; i < 20000; i++) assert_int_equal(grammar_state_advance(s, i ? ", {\"b\": [1]}" : "{}", i ? 12 : 2), 0);
    assert_int_equal(grammar_state_advance(s, "]}", 2), 0);
    assert_true(grammar_state_accepting(s));
    grammar_state_free(s);
    grammar_free(g);
}

/* Whether text is a complete text of g, and whether then something could still follow. */
static bool whole(const struct grammar *g, const char *text, bool *more) {
    struct grammar_state *s;
    assert_int_equal(grammar_state_init(&s, g), 0);
    bool ok = grammar_state_advance(s, text, strlen(text)) == 0 && grammar_state_accepting(s);
    if (more) *more = grammar_state_can_continue(s);
    grammar_state_free(s);
    return ok;
}

/* Values between literal texts (tool calls in a model's syntax): counts, separators, the end. */
static void test_wrapped(void **state) {
    const char *call = "{\"type\":\"object\",\"properties\":{\"name\":{\"const\":\"f\"},\"arguments\":{\"type\":\"object\","
                       "\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}},\"required\":[\"name\","
                       "\"arguments\"]}";
    struct grammar_wrap hermes = {.item_begin = "<tool_call>\n", .item_end = "\n</tool_call>", .sep = "\n",
                                  .max_items = 2};
    struct grammar *g = NULL;
    char err[256];
    assert_int_equal(grammar_compile_wrapped(&g, call, strlen(call), &hermes, NULL, err, sizeof err), 0);
    const char *one = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>";
    bool more;
    assert_true(whole(g, one, &more));
    assert_true(more); /* a second call may follow */
    char two[256];
    snprintf(two, sizeof two, "%s\n%s", one, one);
    assert_true(whole(g, two, &more));
    assert_false(more); /* max_items reached: only EOS */
    char three[400];
    snprintf(three, sizeof three, "%s\n%s", two, one);
    assert_false(whole(g, three, NULL));
    assert_false(whole(g, "{\"name\": \"f\", \"arguments\": {\"a\": 1}}", NULL)); /* the wrapper is required */
    assert_false(whole(g, "<tool_call>\n{\"name\": \"g\", \"arguments\": {\"a\": 1}}\n</tool_call>", NULL));
    assert_false(whole(g, "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>", NULL));
    grammar_free(g);
    /* a JSON array of at least two, unbounded; outer begin/end */
    struct grammar_wrap arr = {.begin = "[", .end = "]", .sep = ", ", .min_items = 2};
    assert_int_equal(grammar_compile_wrapped(&g, call, strlen(call), &arr, NULL, err, sizeof err), 0);
    const char *item = "{\"name\": \"f\", \"arguments\": {\"a\": 2}}";
    char buf[2048] = "[";
    for (int k = 1; k <= 12; k++) {
        if (k > 1) strcat(buf, ", ");
        strcat(buf, item);
        char closed[2100];
        snprintf(closed, sizeof closed, "%s]", buf);
        assert_int_equal(whole(g, closed, &more), k >= 2);
        if (k >= 2) assert_false(more);
    }
    grammar_free(g);
    /* any JSON object, once, after a literal prefix */
    struct grammar_wrap pre = {.begin = "<|python_tag|>", .max_items = 1};
    assert_int_equal(grammar_compile_wrapped(&g, NULL, 0, &pre, NULL, err, sizeof err), 0);
    assert_true(whole(g, "<|python_tag|>{\"x\": [1, {}]}", NULL));
    assert_false(whole(g, "{\"x\": 1}", NULL));
    grammar_free(g);
    struct grammar_wrap bad = {.min_items = 3, .max_items = 2};
    assert_true(grammar_compile_wrapped(&g, call, strlen(call), &bad, NULL, err, sizeof err) < 0);
    assert_null(g);
    assert_int_equal(grammar_compile_wrapped(&g, "{\"type\":", 8, &pre, NULL, err, sizeof err), GRAMMAR_ERR_JSON);
}

static void test_whitespace_policy(void **state) {
    struct grammar *g = compile_ok(corpus[7], NULL);
    struct grammar_options none = {.whitespace = GRAMMAR_WS_NONE}, narrow = {.max_indent = 2};
    struct grammar *gn = compile_ok(corpus[7], &none), *g2 = compile_ok(corpus[7], &narrow);
    static const struct {
        const char *t;
        bool bounded, none, narrow;
    } cases[] = {
        {"{\"a\":1,\"ab\":true}", true, true, true},
        {"{\n  \"a\": 1,\n  \"ab\": true\n}\n", true, false, true},
        {" {\"a\" : 1 , \"c\" : \"xy\" } ", true, false, true},
        {"{\n\t\t\"a\": 1}", true, false, true},
        {"{\n   \"a\": 1}", true, false, false},          /* three spaces of indent */
        {"{  \"a\": 1}", false, false, false},            /* two spaces */
        {"{\n\n\"a\": 1}", false, false, false},          /* two newlines */
        {"{\r\n\"a\": 1}", false, false, false},
        {"{\"ab\":true,\"a\":1}", false, false, false},   /* declared order only */
        {"{\"a\":1,\"a\":2}", false, false, false},
        {"{\"d\":1}", false, false, false},
        {"{}", true, true, true},
        {"{\"a\":01}", false, false, false},
        {"{\"a\":1.0}", false, false, false},             /* integers have no fraction */
    };
    uint64_t rng = 7;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        size_t n = strlen(cases[i].t);
        if (accepts(g, cases[i].t, n, &rng) != cases[i].bounded || accepts(gn, cases[i].t, n, &rng) != cases[i].none ||
            accepts(g2, cases[i].t, n, &rng) != cases[i].narrow)
            fail_msg("case %zu: %s", i, cases[i].t);
    }
    char pad[64] = "{\n";
    memset(pad + 2, ' ', 20);
    strcpy(pad + 22, "\"a\":1}");
    assert_true(accepts(g, pad, strlen(pad), &rng));
    memmove(pad + 3, pad + 2, strlen(pad + 2) + 1); /* 21 spaces */
    assert_false(accepts(g, pad, strlen(pad), &rng));
    grammar_free(g);
    grammar_free(gn);
    grammar_free(g2);
}

/* One random edit of t (mostly making it invalid). */
static size_t mutate(char *t, size_t n, size_t cap, uint64_t *rng) {
    static const char alphabet[] = "{}[]\",:0123456789.eE+-truefalsn \n\t\\u/abcxyzA\xc3\xa9\xe2\x82\xac\x80\xff"
                                   "\x01\x1f\x7f\r\xed\xa0\xf4\x90";
    *rng = *rng * 6364136223846793005ull + 1442695040888963407ull;
    uint64_t x = *rng >> 17;
    size_t at = n ? (size_t)(x % n) : 0;
    char c = alphabet[(x >> 20) % (sizeof alphabet - 1)];
    switch ((x >> 28) % 6) {
    case 0: /* delete */
        if (n) memmove(t + at, t + at + 1, n - at - 1), n--;
        break;
    case 1: /* insert */
        if (n + 1 < cap) memmove(t + at + 1, t + at, n - at), t[at] = c, n++;
        break;
    case 2: /* replace */
        if (n) t[at] = c;
        break;
    case 3: /* truncate */
        n = at;
        break;
    case 4: { /* duplicate a piece */
        size_t len = 1 + (x >> 40) % 6;
        if (at + len <= n && n + len < cap) memmove(t + at + len, t + at, n - at), n += len;
        break;
    }
    default: /* swap two bytes */
        if (n) {
            size_t b = (size_t)((x >> 36) % n);
            char tmp = t[at];
            t[at] = t[b], t[b] = tmp;
        }
    }
    t[n] = 0;
    return n;
}

/* The grammar, the reference and, for accepted texts, JSON parsing plus schema validation agree. */
static void check_text(const struct grammar *g, const cJSON *schema, const char *t, size_t n, bool ws_none,
                       int indent, bool must_accept, uint64_t *rng, int *n_acc) {
    bool got = accepts(g, t, n, rng), want = ref_accepts(schema, t, (long)n, ws_none, indent);
    if (got != want || (must_accept && !got))
        fail_msg("grammar %d, reference %d, generated %d for %s\n  text: %.*s", got, want, must_accept,
                 schema ? cJSON_PrintUnformatted(schema) : "json_object", (int)n, t);
    if (!got) return;
    ++*n_acc;
    const char *end = NULL;
    cJSON *v = cJSON_ParseWithLengthOpts(t, n, &end, false);
    while (v && end < t + n && (*end == ' ' || *end == '\n' || *end == '\t')) end++;
    if (!v || end != t + n) fail_msg("accepted text is not JSON: %.*s", (int)n, t);
    static cJSON *object_schema;
    if (!object_schema) object_schema = cJSON_Parse("{\"type\":\"object\"}");
    if (!ref_valid(schema, schema ? schema : object_schema, v))
        fail_msg("accepted text does not validate: %.*s", (int)n, t);
    cJSON_Delete(v);
}

static void test_accepts_like_reference(void **state) {
    uint64_t rng = 12345;
    int n_checked = 0, n_acc = 0, n_mut_acc = 0;
    for (size_t i = 0; i <= N_CORPUS; i++) {
        const char *text = i < N_CORPUS ? corpus[i] : NULL;
        cJSON *schema = text ? cJSON_Parse(text) : NULL;
        for (int mode = 0; mode < 2; mode++) {
            bool ws_none = mode == 1;
            struct grammar_options opt = {.whitespace = ws_none ? GRAMMAR_WS_NONE : GRAMMAR_WS_BOUNDED, .max_indent = 6};
            struct grammar *g = compile_ok(text, &opt);
            for (int k = 0; k < 40; k++) {
                char *t = ref_gen(schema, i * 1000 + (size_t)k + (size_t)mode * 77, ws_none, 6);
                size_t n = strlen(t), cap = n + 64;
                char *buf = malloc(cap);
                memcpy(buf, t, n + 1);
                check_text(g, schema, buf, n, ws_none, 6, true, &rng, &n_acc);
                n_checked++;
                for (int m = 0; m < 8; m++) {
                    size_t mn = n;
                    memcpy(buf, t, n + 1);
                    for (int e = 0; e <= m % 2; e++) mn = mutate(buf, mn, cap, &rng);
                    int before = n_acc;
                    check_text(g, schema, buf, mn, ws_none, 6, false, &rng, &n_acc);
                    n_mut_acc += n_acc - before;
                    n_checked++;
                }
                free(buf);
                free(t);
            }
            grammar_free(g);
        }
        cJSON_Delete(schema);
    }
    print_message("checked %d texts: %d accepted (%d of them mutated)\n", n_checked, n_acc, n_mut_acc);
    assert_true(n_mut_acc > 50 && n_checked - n_acc > 1000); /* both verdicts well exercised */
}

/* ---- masks ------------------------------------------------------------------------------ */

/* A tokenizer from the shared fixtures with every token's bytes, loaded once. */
struct tok_fixture {
    const char *name;
    struct tokenizer *tok;
    struct token_mask_vocab *v;
    int n;
    char **bytes, **first; // tokenizer_token_bytes(id, false / true)
    size_t *len, *first_len;
    bool tried;
};
static struct tok_fixture fixtures[3] = {{.name = "llama3"}, {.name = "llama2"}, {.name = "qwen3"}};

static struct tok_fixture *load_fixture(int k) {
    struct tok_fixture *f = &fixtures[k];
    char path[512], rel[64], err[256];
    snprintf(rel, sizeof rel, "tokenizers/%s/tokenizer.json", f->name);
    TEST_REQUIRE_SHARED(path, rel);
    if (f->tried) return f;
    f->tried = true;
    snprintf(path, sizeof path, "%s/tokenizers/%s", test_shared_dir(), f->name);
    int rc = tokenizer_load(&f->tok, path, err, sizeof err);
    if (rc) fail_msg("tokenizer_load(%s): %s", path, err);
    assert_int_equal(token_mask_vocab_build(&f->v, f->tok, 0, err, sizeof err), 0);
    f->n = (int)tokenizer_vocab_size(f->tok);
    assert_int_equal(token_mask_vocab_size(f->v), f->n);
    f->bytes = calloc((size_t)f->n, sizeof *f->bytes);
    f->first = calloc((size_t)f->n, sizeof *f->first);
    f->len = calloc((size_t)f->n, sizeof *f->len);
    f->first_len = calloc((size_t)f->n, sizeof *f->first_len);
    for (int id = 0; id < f->n; id++) {
        char buf[1024];
        f->len[id] = tokenizer_token_bytes(f->tok, id, false, buf, sizeof buf);
        f->bytes[id] = malloc(f->len[id] + 1);
        memcpy(f->bytes[id], buf, f->len[id]);
        f->first_len[id] = tokenizer_token_bytes(f->tok, id, true, buf, sizeof buf);
        f->first[id] = malloc(f->first_len[id] + 1);
        memcpy(f->first[id], buf, f->first_len[id]);
    }
    return f;
}

static int free_fixtures(void **state) {
    for (int k = 0; k < 3; k++) {
        struct tok_fixture *f = &fixtures[k];
        for (int id = 0; id < f->n; id++) free(f->bytes[id]), free(f->first[id]);
        free(f->bytes), free(f->first), free(f->len), free(f->first_len);
        token_mask_vocab_free(f->v);
        tokenizer_free(f->tok);
        memset(f, 0, sizeof *f);
    }
    return 0;
}

static bool bit(const uint32_t *bits, int id) { return bits[id / 32] >> (id % 32) & 1; }

/* The mask by brute force: each token's bytes tried on the state. */
static void check_mask(const struct tok_fixture *f, struct grammar_state *s, bool at_start, const uint32_t *bits) {
    int bad = 0;
    for (int id = 0; id < f->n; id++) {
        bool want;
        if (tokenizer_is_eos(f->tok, id)) want = grammar_state_accepting(s);
        else if (tokenizer_is_special(f->tok, id)) want = false;
        else if (at_start) want = f->first_len[id] && grammar_state_try(s, f->first[id], f->first_len[id]);
        else want = f->len[id] && grammar_state_try(s, f->bytes[id], f->len[id]);
        if (want != bit(bits, id) && bad++ < 5)
            print_error("%s id %d \"%.*s\": mask %d, brute force %d\n", f->name, id, (int)f->len[id], f->bytes[id],
                        bit(bits, id), want);
    }
    if (bad) fail_msg("%d tokens differ", bad);
}

/* Walks from the start: first along the tokens of a generated instance, then random tokens the
 * mask allows; every state's mask is checked against brute force. Returns the states checked. */
static int walk_and_check(struct tok_fixture *f, const char *schema_text, const struct grammar_options *opt,
                          const struct token_mask_options *mopt, int max_states, uint64_t seed) {
    struct grammar *g = compile_ok(schema_text, opt);
    struct token_mask *m;
    assert_int_equal(token_mask_init(&m, g, f->v, mopt), 0);
    cJSON *schema = schema_text ? cJSON_Parse(schema_text) : NULL;
    uint32_t *bits = malloc(token_mask_words(f->v) * sizeof *bits);
    int checked = 0;
    uint64_t rng = seed;
    for (int run = 0; checked < max_states && run < 50; run++) {
        char *text = ref_gen(schema, seed * 31 + (uint64_t)run, opt && opt->whitespace == GRAMMAR_WS_NONE, 20);
        int32_t *ids;
        size_t n_ids;
        assert_int_equal(tokenizer_encode(f->tok, text, strlen(text), false, &ids, &n_ids), 0);
        struct grammar_state *s;
        assert_int_equal(grammar_state_init(&s, g), 0);
        bool follow = true;
        for (int step = 0; step < 40 && checked < max_states; step++) {
            bool at_start = step == 0 && run % 3 == 0;
            assert_int_equal(token_mask_fill(m, s, at_start, bits), 0);
            check_mask(f, s, at_start, bits);
            checked++;
            if (follow && (size_t)step < n_ids && token_mask_accept(m, s, ids[step], at_start) == 0) continue;
            follow = false;
            int allowed[4096], n = 0; /* a random allowed token that is not EOS */
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            int from = (int)((rng >> 33) % (uint64_t)f->n);
            for (int k = 0; k < f->n && n < 4096; k++) {
                int id = (from + k) % f->n;
                if (bit(bits, id) && !tokenizer_is_eos(f->tok, id)) allowed[n++] = id;
            }
            if (!n) break;
            int id = allowed[(rng >> 20) % (uint64_t)n];
            assert_int_equal(token_mask_accept(m, s, id, at_start), 0);
        }
        grammar_state_free(s);
        free(ids);
        free(text);
    }
    struct token_mask_stats st;
    token_mask_get_stats(m, &st);
    assert_true(st.fills >= (uint64_t)checked && st.node_walks > 0);
    free(bits);
    cJSON_Delete(schema);
    token_mask_free(m);
    grammar_free(g);
    return checked;
}

/* Masks along one text, token by token (deep nesting near max_stack, where node entries computed
 * without the stack below no longer apply). */
static int text_and_check(struct tok_fixture *f, const char *schema_text, const struct grammar_options *opt,
                          const char *text) {
    struct grammar *g = compile_ok(schema_text, opt);
    struct token_mask *m;
    assert_int_equal(token_mask_init(&m, g, f->v, NULL), 0);
    uint32_t *bits = malloc(token_mask_words(f->v) * sizeof *bits);
    int32_t *ids;
    size_t n_ids;
    assert_int_equal(tokenizer_encode(f->tok, text, strlen(text), false, &ids, &n_ids), 0);
    struct grammar_state *s;
    assert_int_equal(grammar_state_init(&s, g), 0);
    int checked = 0;
    for (size_t i = 0; i <= n_ids; i++, checked++) {
        assert_int_equal(token_mask_fill(m, s, false, bits), 0);
        check_mask(f, s, false, bits);
        if (i < n_ids && token_mask_accept(m, s, ids[i], false)) break;
    }
    struct token_mask_stats st;
    token_mask_get_stats(m, &st);
    assert_true(st.direct_walks > 0);
    grammar_state_free(s);
    free(ids);
    free(bits);
    token_mask_free(m);
    grammar_free(g);
    return checked;
}

static void masks_for(int k) {
    struct tok_fixture *f = load_fixture(k);
    static const struct token_mask_options tiny = {.node_cache_bytes = 4096, .state_cache_bytes = 1};
    struct grammar_options none = {.whitespace = GRAMMAR_WS_NONE}, shallow = {.max_stack = 14};
    int n = 0;
    n += walk_and_check(f, corpus[0], NULL, NULL, 50, 1);
    n += walk_and_check(f, corpus[1], NULL, NULL, 30, 2);
    n += walk_and_check(f, corpus[2], &none, &tiny, 25, 3); /* caches start over all the time */
    n += walk_and_check(f, corpus[9], NULL, NULL, 20, 4);
    n += walk_and_check(f, corpus[10], NULL, NULL, 20, 5);
    n += walk_and_check(f, NULL, &shallow, NULL, 25, 6); /* stacks near max_stack: direct walks */
    n += walk_and_check(f, corpus[3], NULL, NULL, 15, 7);
    n += walk_and_check(f, corpus[13], NULL, NULL, 15, 8);
    n += text_and_check(f, NULL, &shallow, "{\"a\": [[[ [[[[ [[ [[{\"b\":[{}]}]]]]]]]]]]]}");
    print_message("%s: %d states, every mask equal to brute force\n", f->name, n);
}

static void test_masks_llama3(void **state) { masks_for(0); }
static void test_masks_llama2(void **state) { masks_for(1); }
static void test_masks_qwen3(void **state) { masks_for(2); }

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Mask time per step for a nested schema on llama3, as a request would see it: tokens of
 * generated instances, a fresh token_mask for the first request (cold caches), the same one for
 * the next ones. Printed, not asserted. */
static void test_mask_time_llama3(void **state) {
    struct tok_fixture *f = load_fixture(0);
    struct grammar *g = compile_ok(corpus[0], NULL);
    struct token_mask *m;
    assert_int_equal(token_mask_init(&m, g, f->v, NULL), 0);
    cJSON *schema = cJSON_Parse(corpus[0]);
    uint32_t *bits = malloc(token_mask_words(f->v) * sizeof *bits);
    double t[4096], cold[1024];
    int n = 0, n_cold = 0;
    for (int req = 0; req < 60 && n < 4000; req++) {
        char *text = ref_gen(schema, 900 + (uint64_t)req, false, 20);
        int32_t *ids;
        size_t n_ids;
        assert_int_equal(tokenizer_encode(f->tok, text, strlen(text), false, &ids, &n_ids), 0);
        struct grammar_state *s;
        assert_int_equal(grammar_state_init(&s, g), 0);
        for (size_t i = 0; i <= n_ids && n < 4000; i++) {
            double t0 = now_s();
            assert_int_equal(token_mask_fill(m, s, false, bits), 0);
            double dt = now_s() - t0;
            if (req == 0) cold[n_cold++] = dt;
            else t[n++] = dt;
            if (i < n_ids) assert_int_equal(token_mask_accept(m, s, ids[i], false), 0);
        }
        assert_true(grammar_state_accepting(s));
        grammar_state_free(s);
        free(ids);
        free(text);
    }
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    qsort(cold, (size_t)n_cold, sizeof *cold, cmp_double);
    struct token_mask_stats st;
    token_mask_get_stats(m, &st);
    print_message("mask time, llama3 (%d tokens), nested schema: first request %d steps median %.1f us, max %.0f us; "
                  "next 59 requests %d steps median %.2f us, p99 %.1f us, max %.0f us (%lu of %lu fills from the "
                  "state cache, %lu node walks)\n",
                  f->n, n_cold, cold[n_cold / 2] * 1e6, cold[n_cold - 1] * 1e6, n, t[n / 2] * 1e6,
                  t[(int)(n * 0.99)] * 1e6, t[n - 1] * 1e6, (unsigned long)st.state_hits, (unsigned long)st.fills,
                  (unsigned long)st.node_walks);
    free(bits);
    cJSON_Delete(schema);
    token_mask_free(m);
    grammar_free(g);
}

/* Sampling with random logits under the mask (the sampler's allow bitset) ends in EOS with a text
 * that parses and validates. */
static void test_constrained_sampling_valid(void **state) {
    struct tok_fixture *f = load_fixture(0);
    const char *text = "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\",\"minimum\":1,"
                       "\"maximum\":999},\"label\":{\"type\":\"string\",\"maxLength\":8},\"ok\":{\"type\":"
                       "\"boolean\"},\"xs\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\",3]},\"maxItems\":3}},"
                       "\"required\":[\"id\",\"label\",\"xs\"]}";
    struct grammar *g = compile_ok(text, NULL);
    cJSON *schema = cJSON_Parse(text);
    struct token_mask *m;
    assert_int_equal(token_mask_init(&m, g, f->v, NULL), 0);
    int V = f->n;
    uint32_t *bits = malloc(token_mask_words(f->v) * sizeof *bits);
    float *l = malloc(sizeof *l * (size_t)V), *scratch = malloc(sizeof *scratch * SAMPLER_SCRATCH_ROWS * (size_t)V);
    uint64_t rng = 99;
    for (int req = 0; req < 8; req++) {
        struct grammar_state *s;
        assert_int_equal(grammar_state_init(&s, g), 0);
        int32_t out[400];
        int n = 0;
        bool eos = false;
        while (n < 400 && !eos) {
            assert_int_equal(token_mask_fill(m, s, false, bits), 0);
            for (int i = 0; i < V; i++) {
                rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
                l[i] = (float)(rng >> 40) / (float)(1 << 24) * 8.0f;
            }
            struct sample_row p = {.temperature = 1.0f, .top_p = 1.0f, .repetition_penalty = 1.0f,
                                   .u = (float)(rng >> 40) / (float)(1 << 24), .allow = bits};
            int id = sampler_run(&p, l, V, scratch);
            assert_true(bit(bits, id));
            eos = tokenizer_is_eos(f->tok, id);
            assert_int_equal(token_mask_accept(m, s, id, false), 0);
            if (!eos) out[n++] = id;
        }
        assert_true(eos);
        char *t;
        size_t len;
        assert_int_equal(tokenizer_decode(f->tok, out, (size_t)n, true, &t, &len), 0);
        cJSON *v = cJSON_ParseWithLength(t, len);
        if (!v || !ref_valid(schema, schema, v) || !ref_accepts(schema, t, (long)len, false, 20))
            fail_msg("sampled text does not validate: %s", t);
        cJSON_Delete(v);
        free(t);
        grammar_state_free(s);
    }
    free(l), free(scratch), free(bits);
    cJSON_Delete(schema);
    token_mask_free(m);
    grammar_free(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_compile_supported),
        cmocka_unit_test(test_compile_errors),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_state_api),
        cmocka_unit_test(test_whitespace_policy),
        cmocka_unit_test(test_wrapped),
        cmocka_unit_test(test_accepts_like_reference),
        cmocka_unit_test(test_masks_llama3),
        cmocka_unit_test(test_masks_llama2),
        cmocka_unit_test(test_masks_qwen3),
        cmocka_unit_test(test_mask_time_llama3),
        cmocka_unit_test(test_constrained_sampling_valid),
    };
    return cmocka_run_group_tests_name("grammar", tests, NULL, free_fixtures);
}
