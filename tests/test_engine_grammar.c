/* Structured output through the engine core (engine/engine.h struct engine_grammar) on the
 * built-in demo model (byte-level tokenizer, random weights: it would write noise) and on
 * stories260k: every choice's text parses and validates against its schema; a complete text ends
 * the choice whatever ignore_eos and min_tokens say; forks follow the grammar each on its own;
 * the ids do not depend on batching, preemption or the sampling path (sample op or host); bad
 * schemas are refused with the compile error; the grammar cache compiles a schema once. */
#include <cjson/cJSON.h>

#include "tests/test_common.h"
#include "tests/test_kv.h"
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function" /* the reference matcher and generator are not needed here */
#include "tests/grammar_ref.h"
#pragma GCC diagnostic pop

#include "engine/kv_cache_impl.h"
#include "engine/engine_core.h"
#include "engine/grammar_cache.h"
#include "engine/text/tokenizer.h"

#define MAXC 4
#define MAXG 600

struct out {
    int32_t ids[MAXC][MAXG];
    int n[MAXC];
    char text[MAXC][8192];
    size_t len[MAXC];
    enum engine_finish finish[MAXC];
    int n_finished, errors;
    char error[256];
};

static void emit(void *ud, const struct engine_event *ev) {
    struct out *o = ud;
    int k = ev->choice;
    if (ev->type == ENGINE_EVENT_ERROR) {
        o->errors++;
        snprintf(o->error, sizeof o->error, "%s", ev->message);
        return;
    }
    assert_true(k >= 0 && k < MAXC);
    if (ev->text) {
        size_t l = strlen(ev->text);
        assert_true(o->len[k] + l < sizeof o->text[k]);
        memcpy(o->text[k] + o->len[k], ev->text, l + 1);
        o->len[k] += l;
        free(ev->text);
    }
    if (ev->type == ENGINE_EVENT_TOKEN) {
        assert_true(o->n[k] < MAXG);
        o->ids[k][o->n[k]++] = ev->token;
    } else {
        o->finish[k] = ev->finish;
        o->n_finished++;
    }
}

static struct core *demo_core(int budget, size_t kv_bytes) {
    struct engine_config cfg = {.max_num_batched_tokens = budget, .max_num_seqs = 16, .kv_cache_memory = kv_bytes,
                                .block_size = 16, .quiet = true};
    struct core *c;
    char err[512] = "";
    int rc = core_create(&c, &cfg, err, sizeof err);
    if (rc) print_error("core_create: %s\n", err);
    assert_int_equal(rc, 0);
    return c;
}

static struct engine_sampling sampling(int max_tokens, float temperature, uint64_t seed) {
    return (struct engine_sampling){.n = 1, .max_tokens = max_tokens, .top_p = 1.0f, .repetition_penalty = 1.0f,
                                    .temperature = temperature, .has_seed = true, .seed = seed,
                                    .skip_special_tokens = true, .logprobs = -1};
}

static struct engine_grammar schema_grammar(const char *schema) {
    return (struct engine_grammar){.kind = ENGINE_GRAMMAR_JSON_SCHEMA, .schema = schema};
}

static int add(struct core *c, const int32_t *prompt, int n, struct engine_sampling sp, struct out *o, char *err,
               size_t errlen) {
    struct engine_request req = {prompt, n, sp};
    return core_add(c, &req, emit, o, NULL, err, errlen);
}

static void submit(struct core *c, const int32_t *prompt, int n, struct engine_sampling sp, struct out *o) {
    char err[256] = "";
    int rc = add(c, prompt, n, sp, o, err, sizeof err);
    if (rc) print_error("core_add: %s\n", err);
    assert_int_equal(rc, ENGINE_OK);
}

static void run_all(struct core *c) {
    for (int guard = 0; core_has_work(c); guard++) {
        assert_true(guard < 20000);
        assert_true(core_step(c) >= 0);
    }
}

/* Schemas whose instances stay short (bounded strings and arrays), so that a random model
 * finishes them well within the token limit. */
static const char *const schemas[] = {
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":8},\"age\":{\"type\":"
    "\"integer\",\"minimum\":0,\"maximum\":150},\"ok\":{\"type\":\"boolean\"}},\"required\":[\"name\",\"age\"]}",
    "{\"type\":\"array\",\"items\":{\"enum\":[\"red\",\"green\",7,null]},\"minItems\":1,\"maxItems\":4}",
    "{\"anyOf\":[{\"type\":\"integer\",\"minimum\":-5,\"maximum\":5},{\"type\":\"string\",\"maxLength\":3},"
    "{\"type\":\"null\"}]}",
    "{\"type\":\"object\",\"properties\":{\"p\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"number\","
    "\"minimum\":-1,\"maximum\":1},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":2},"
    "\"maxItems\":2}},\"required\":[\"x\",\"tags\"]}},\"required\":[\"p\"]}",
    "{\"$defs\":{\"t\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":"
    "9},\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/t\"},\"maxItems\":1}},\"required\":[\"v\"]}},"
    "\"$ref\":\"#/$defs/t\"}",
};
#define N_SCHEMAS (sizeof schemas / sizeof *schemas)

static void assert_valid(const char *schema_text, const char *text) {
    cJSON *schema = cJSON_Parse(schema_text), *v = cJSON_Parse(text);
    if (!v || !ref_valid(schema, schema, v)) fail_msg("output does not validate against %s: [%s]", schema_text, text);
    cJSON_Delete(v);
    cJSON_Delete(schema);
}

/* Seeded sampling at temperature 1 (and greedy) under every schema, n = 2: each choice ends by
 * itself (STOP, not LENGTH) with a text that parses and validates. */
static void test_outputs_validate(void **state) {
    struct core *c = demo_core(256, 0);
    int32_t prompt[4] = {1, 72, 105, 33};
    static struct out o[N_SCHEMAS][3];
    memset(o, 0, sizeof o);
    for (size_t s = 0; s < N_SCHEMAS; s++)
        for (int t = 0; t < 3; t++) {
            struct engine_sampling sp = sampling(MAXG, t == 2 ? 0.0f : 1.0f, 7 + s * 3 + (size_t)t);
            sp.n = t == 2 ? 1 : 2;
            sp.grammar = schema_grammar(schemas[s]);
            submit(c, prompt, 4, sp, &o[s][t]);
        }
    run_all(c);
    for (size_t s = 0; s < N_SCHEMAS; s++)
        for (int t = 0; t < 3; t++)
            for (int k = 0; k < (t == 2 ? 1 : 2); k++) {
                assert_int_equal(o[s][t].errors, 0);
                assert_int_equal(o[s][t].finish[k], ENGINE_FINISH_STOP);
                assert_valid(schemas[s], o[s][t].text[k]);
            }
    /* the two seeded choices of a request differ (each follows the grammar on its own) */
    int differ = 0;
    for (size_t s = 0; s < N_SCHEMAS; s++) differ += strcmp(o[s][0].text[0], o[s][0].text[1]) != 0;
    assert_true(differ >= 3);
    core_free(c);
}

/* json_object: any JSON object. With ignore_eos and min_tokens past the end of any short text,
 * the choice still ends when the text is complete: min_tokens never forces text past the end. */
static void test_complete_text_ends_the_choice(void **state) {
    struct core *c = demo_core(256, 0);
    int32_t prompt[2] = {1, 123};
    static struct out a, b, d;
    memset(&a, 0, sizeof a), memset(&b, 0, sizeof b), memset(&d, 0, sizeof d);
    struct engine_sampling sp = sampling(200, 0.0f, 1);
    sp.ignore_eos = true;
    sp.grammar = schema_grammar("{\"type\":\"boolean\"}");
    submit(c, prompt, 2, sp, &a);
    sp.ignore_eos = false;
    sp.min_tokens = 150;
    submit(c, prompt, 2, sp, &b);
    struct engine_sampling so = sampling(MAXG, 1.0f, 5);
    so.grammar = (struct engine_grammar){.kind = ENGINE_GRAMMAR_JSON_OBJECT};
    so.n = 3;
    submit(c, prompt, 2, so, &d);
    run_all(c);
    for (struct out *o = &a; o != &d; o = o == &a ? &b : &d) {
        assert_int_equal(o->finish[0], ENGINE_FINISH_STOP);
        assert_true(o->n[0] < 30);
        assert_valid("{\"type\":\"boolean\"}", o->text[0]);
    }
    for (int k = 0; k < 3; k++) {
        assert_int_equal(d.finish[k], ENGINE_FINISH_STOP);
        assert_valid("{\"type\":\"object\"}", d.text[k]);
    }
    /* a text that nothing may follow (a closing literal) ends at its last byte: no EOS is drawn */
    static struct out w;
    memset(&w, 0, sizeof w);
    struct engine_sampling sw = sampling(200, 1.0f, 3);
    sw.ignore_eos = true;
    sw.n = 2;
    sw.grammar = schema_grammar("{\"enum\":[1,22,333]}");
    sw.grammar.wrapped = true;
    sw.grammar.wrap = (struct grammar_wrap){.begin = "<", .end = ">", .sep = ",", .max_items = 3};
    submit(c, prompt, 2, sw, &w);
    run_all(c);
    for (int k = 0; k < 2; k++) {
        assert_int_equal(w.finish[k], ENGINE_FINISH_STOP);
        assert_true(w.n[k] > 0);
        assert_int_not_equal(w.ids[k][w.n[k] - 1], 2); /* the demo model's EOS */
        assert_int_equal(w.text[k][0], '<');
        assert_int_equal(w.text[k][w.len[k] - 1], '>');
    }
    core_free(c);
}

/* Greedy constrained requests give the same ids alone, batched with others under a small token
 * budget and a KV pool that forces preemption (the grammar state is kept while the KV is
 * recomputed), and with logprobs (the host sampling path) instead of the sample op. */
static void test_ids_invariant_batched_preempted_host(void **state) {
    int32_t prompts[4][80];
    for (int r = 0; r < 4; r++)
        for (int i = 0; i < 80; i++) prompts[r][i] = 3 + (r * 31 + i * 7) % 250;
    static struct out alone[4], mixed[4];
    for (int r = 0; r < 4; r++) {
        memset(&alone[r], 0, sizeof alone[r]);
        struct core *c = demo_core(256, 0);
        struct engine_sampling sp = sampling(100, 0.0f, 0);
        sp.grammar = schema_grammar(schemas[r % N_SCHEMAS]);
        submit(c, prompts[r], 50 + r * 10, sp, &alone[r]);
        run_all(c);
        assert_int_equal(alone[r].finish[0], ENGINE_FINISH_STOP);
        core_free(c);
    }
    for (int variant = 0; variant < 2; variant++) {
        /* variant 0: budget 7 and a pool of 12 blocks of 16 tokens (a block: K+V x 2 layers x 2 heads
         * x 16 tokens x 16 dims x 4 B) for prompts of 260 tokens in all: preemption; 1: logprobs */
        struct core *c = demo_core(variant ? 256 : 7, variant ? 0 : 12 * 8192);
        for (int r = 0; r < 4; r++) {
            memset(&mixed[r], 0, sizeof mixed[r]);
            struct engine_sampling sp = sampling(100, 0.0f, 0);
            sp.grammar = schema_grammar(schemas[r % N_SCHEMAS]);
            sp.logprobs = variant ? 2 : -1;
            submit(c, prompts[r], 50 + r * 10, sp, &mixed[r]);
        }
        run_all(c);
        struct engine_stats st;
        core_stats(c, &st);
        if (!variant) assert_true(st.preemptions_total > 0);
        for (int r = 0; r < 4; r++) {
            assert_int_equal(mixed[r].n[0], alone[r].n[0]);
            assert_memory_equal(mixed[r].ids[0], alone[r].ids[0], sizeof(int32_t) * (size_t)alone[r].n[0]);
            assert_string_equal(mixed[r].text[0], alone[r].text[0]);
        }
        assert_kv_idle(core_kv(c));
        core_free(c);
    }
}

/* A schema outside the subset is refused with the compile error; nothing is queued. The same
 * schema text is compiled once however many requests use it. */
static void test_bad_schema_refused_and_cache_reused(void **state) {
    struct core *c = demo_core(256, 0);
    int32_t prompt[2] = {1, 65};
    char err[256] = "";
    struct engine_sampling sp = sampling(8, 0.0f, 0);
    sp.grammar = schema_grammar("{\"type\":\"string\",\"pattern\":\"^a+$\"}");
    assert_int_equal(add(c, prompt, 2, sp, NULL, err, sizeof err), ENGINE_ERR_GRAMMAR);
    assert_non_null(strstr(err, "pattern"));
    sp.grammar = schema_grammar("{\"type\":");
    assert_int_equal(add(c, prompt, 2, sp, NULL, err, sizeof err), ENGINE_ERR_GRAMMAR);
    assert_non_null(strstr(err, "not valid JSON"));
    sp.grammar = (struct engine_grammar){.kind = (enum engine_grammar_kind)9};
    assert_true(add(c, prompt, 2, sp, NULL, err, sizeof err) < 0);
    assert_false(core_has_work(c));
    static struct out o[6];
    memset(o, 0, sizeof o);
    for (int i = 0; i < 6; i++) {
        struct engine_sampling s2 = sampling(100, 1.0f, (uint64_t)i);
        s2.grammar = schema_grammar(schemas[i % 2]);
        submit(c, prompt, 2, s2, &o[i]);
    }
    run_all(c);
    struct grammar_cache_stats st;
    grammar_cache_stats(core_grammar_cache(c), &st);
    assert_int_equal(st.entries, 2);
    assert_int_equal(st.misses, 2 + 2); /* the two bad schemas and the two good ones */
    assert_int_equal(st.hits, 4);
    assert_true(st.bytes > 0);
    core_free(c);
}

/* A wrapped grammar (tool calls in a model's syntax) on stories260k's SentencePiece vocabulary:
 * the text is exactly begin, items and end, and the values validate. */
static void test_wrapped_on_sentencepiece(void **state) {
    char dir[1024];
    TEST_REQUIRE_SHARED(dir, "models/stories260k/tokenizer.json");
    snprintf(dir, sizeof dir, "%s/models/stories260k", test_shared_dir());
    struct engine_config cfg = {.model_dir = dir, .max_num_batched_tokens = 128, .max_num_seqs = 8, .quiet = true};
    struct core *c;
    char err[256];
    assert_int_equal(core_create(&c, &cfg, err, sizeof err), 0);
    const char *item = "{\"type\":\"object\",\"properties\":{\"name\":{\"const\":\"go\"},\"arguments\":{\"type\":"
                       "\"object\",\"properties\":{\"n\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":99}},"
                       "\"required\":[\"n\"]}},\"required\":[\"name\",\"arguments\"]}";
    static struct out o;
    memset(&o, 0, sizeof o);
    int32_t bos = 1;
    struct engine_sampling sp = sampling(300, 0.8f, 11);
    sp.n = 2;
    sp.grammar = schema_grammar(item);
    sp.grammar.wrapped = true;
    sp.grammar.wrap = (struct grammar_wrap){.item_begin = "<tool_call>\n", .item_end = "\n</tool_call>", .sep = "\n",
                                            .max_items = 2};
    submit(c, &bos, 1, sp, &o);
    run_all(c);
    for (int k = 0; k < 2; k++) {
        assert_int_equal(o.finish[k], ENGINE_FINISH_STOP);
        const char *t = o.text[k];
        int calls = 0;
        while (*t) {
            assert_true(calls < 2);
            if (calls) assert_true(*t++ == '\n');
            assert_memory_equal(t, "<tool_call>\n", 12);
            t += 12;
            const char *end = strstr(t, "\n</tool_call>");
            assert_non_null(end);
            char v[512];
            snprintf(v, sizeof v, "%.*s", (int)(end - t), t);
            assert_valid(item, v);
            t = end + 13;
            calls++;
        }
        assert_true(calls >= 1);
    }
    core_free(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_outputs_validate),
        cmocka_unit_test(test_complete_text_ends_the_choice),
        cmocka_unit_test(test_ids_invariant_batched_preempted_host),
        cmocka_unit_test(test_bad_schema_refused_and_cache_reused),
        cmocka_unit_test(test_wrapped_on_sentencepiece),
    };
    return cmocka_run_group_tests_name("engine_grammar", tests, NULL, NULL);
}
