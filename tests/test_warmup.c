/* The warm-up (engine/warmup.c) on the CPU backend, with the GPU's plan too (decode steps at
 * batch n..1): it runs the forward passes it promises and leaves no trace: counters zero, KV
 * free, and the requests that follow get exactly what they get from an engine that never
 * warmed up (greedy, seeded sampling with logprobs, a batch of two). */
#include <math.h>

#include "tests/test_common.h"

#include "engine/engine_core.h"
#include "engine/kv_cache.h"
#include "engine/warmup.h"

#define MAXG 64

struct out {
    int32_t ids[2][MAXG];
    float lps[2][MAXG];
    int n[2];
    char text[2][2048];
    int finished, errors;
};

static void emit(void *ud, const struct engine_event *ev) {
    struct out *o = ud;
    int k = ev->choice;
    assert_true(k >= 0 && k < 2);
    if (ev->type == ENGINE_EVENT_ERROR) {
        o->errors++;
        return;
    }
    if (ev->text) {
        assert_true(strlen(o->text[k]) + strlen(ev->text) < sizeof o->text[k]);
        strcat(o->text[k], ev->text);
        free(ev->text);
    }
    if (ev->type == ENGINE_EVENT_FINISH) {
        o->finished++;
        return;
    }
    assert_true(o->n[k] < MAXG);
    o->lps[k][o->n[k]] = ev->logprob;
    o->ids[k][o->n[k]++] = ev->token;
}

static struct core *make_core(const char *dir, int max_model_len) {
    struct engine_config cfg = {.model_dir = dir, .max_num_seqs = 16, .max_num_batched_tokens = 512,
                                .max_model_len = max_model_len, .kv_cache_memory = 16u << 20, .quiet = true};
    struct core *c = NULL;
    char err[512] = "";
    int rc = core_create(&c, &cfg, err, sizeof err);
    if (rc) print_error("core_create: %s\n", err);
    assert_int_equal(rc, 0);
    return c;
}

/* Three requests, the last two in one batch: greedy; sampled with a seed and logprobs; greedy
 * n = 2 choices (the second one sampled from the same prompt). */
static void run_requests(struct core *c, struct out out[3]) {
    static const int32_t p1[] = {1, 403, 407}, p2[] = {1, 17, 99, 250, 3};
    struct engine_sampling greedy = {.n = 1, .max_tokens = 40, .top_p = 1.0f, .repetition_penalty = 1.0f,
                                     .ignore_eos = true, .skip_special_tokens = true, .logprobs = -1};
    struct engine_sampling sampled = greedy;
    sampled.temperature = 0.8f, sampled.has_seed = true, sampled.seed = 7, sampled.logprobs = 2;
    struct engine_sampling two = sampled;
    two.n = 2, two.max_tokens = 24, two.logprobs = -1;
    struct engine_request reqs[3] = {{p1, 3, greedy}, {p2, 5, sampled}, {p1, 2, two}};
    char err[256];
    memset(out, 0, sizeof(struct out) * 3);
    for (int r = 0; r < 3; r++) {
        assert_int_equal(core_add(c, &reqs[r], emit, &out[r], NULL, err, sizeof err), ENGINE_OK);
        if (r == 1) continue; /* the last two share the steps */
        for (int guard = 0; core_has_work(c); guard++) {
            assert_true(guard < 10000);
            assert_true(core_step(c) >= 0);
        }
    }
    assert_int_equal(out[0].finished + out[1].finished + out[2].finished, 4);
}

static void assert_no_trace(struct core *c, const struct engine_stats *fresh) {
    struct engine_stats st;
    core_stats(c, &st);
    assert_false(core_has_work(c));
    assert_int_equal(st.num_running + st.num_waiting, 0);
    assert_true(st.kv_usage_full == 0.0 && st.kv_usage_streaming == 0.0);
    assert_int_equal(st.prompt_tokens_total, 0);
    assert_int_equal(st.generation_tokens_total, 0);
    assert_int_equal(st.preemptions_total, 0);
    assert_int_equal(st.finished_stop + st.finished_length + st.finished_abort, 0);
    assert_true(st.forward_seconds == 0.0 && st.sample_seconds == 0.0);
    assert_int_equal(st.kv_capacity_tokens, fresh->kv_capacity_tokens);
    /* nothing cached: a user's first request finds no prefix of the warm-up's */
    struct kv_prefix_stats ps;
    kv_cache_prefix_stats(core_kv(c), &ps);
    assert_int_equal(ps.cached_blocks, 0);
    assert_int_equal(ps.snapshots, 0);
    assert_true(st.prefix_cache_queries == 0 && st.prefix_cache_hits == 0 && st.prefix_cache_blocks == 0);
}

static void check_model(const char *dir) {
    struct core *cold = make_core(dir, 0);
    struct engine_stats fresh;
    core_stats(cold, &fresh);
    struct out want[3];
    run_requests(cold, want);
    struct engine_stats cold_after;
    core_stats(cold, &cold_after);
    for (int max_batch = 0; max_batch <= 8; max_batch += 8) {
        struct core *c = make_core(dir, 0);
        char err[256] = "";
        int steps = warmup_run(c, max_batch, err, sizeof err);
        /* one prefill, then max_batch decode steps (batch max_batch .. 1); the CPU's: one pass */
        assert_int_equal(steps, max_batch ? max_batch + 1 : 1);
        assert_no_trace(c, &fresh);
        struct out got[3];
        run_requests(c, got);
        struct engine_stats after; /* the same prefix-cache lookups and finds as the cold engine's */
        core_stats(c, &after);
        assert_true(after.prefix_cache_queries == cold_after.prefix_cache_queries);
        assert_true(after.prefix_cache_hits == cold_after.prefix_cache_hits);
        for (int r = 0; r < 3; r++) {
            assert_int_equal(got[r].errors, 0);
            for (int k = 0; k < 2; k++) {
                assert_int_equal(got[r].n[k], want[r].n[k]);
                assert_memory_equal(got[r].ids[k], want[r].ids[k], sizeof(int32_t) * want[r].n[k]);
                assert_memory_equal(got[r].lps[k], want[r].lps[k], sizeof(float) * want[r].n[k]);
                assert_string_equal(got[r].text[k], want[r].text[k]);
            }
        }
        core_free(c);
    }
    core_free(cold);
}

static void test_warmup_leaves_no_trace_fixture(void **state) {
    (void)state;
    check_model("tests/fixtures/hf/llama3");
}

static void test_warmup_leaves_no_trace_stories260k(void **state) {
    (void)state;
    char dir[512];
    TEST_REQUIRE_SHARED(dir, "models/stories260k/config.json");
    *strrchr(dir, '/') = 0;
    check_model(dir);
}

/* A context too short for the whole plan: fewer requests, still clean. */
static void test_warmup_short_context(void **state) {
    (void)state;
    struct core *c = make_core("tests/fixtures/hf/llama3", 6);
    struct engine_stats fresh;
    core_stats(c, &fresh);
    char err[256] = "";
    int steps = warmup_run(c, 64, err, sizeof err);
    assert_int_equal(steps, 4); /* 6 - 3 requests: one prefill, three decode steps */
    assert_no_trace(c, &fresh);
    core_free(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_warmup_leaves_no_trace_fixture),
        cmocka_unit_test(test_warmup_leaves_no_trace_stories260k),
        cmocka_unit_test(test_warmup_short_context),
    };
    return cmocka_run_group_tests_name("warmup", tests, NULL, NULL);
}
