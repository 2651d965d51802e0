/* Prefix caching through the engine core (tests/fixtures/hf/llama3, the CPU reference): a request
 * that repeats an earlier one's prefix gets exactly the bits of a cache miss (ids, logprobs, top
 * logprobs), with and without a DuoAttention head pattern, with an f32 or fp8 KV cache, for a
 * prefix that ends mid-block and reaches past sink + recent; usage reports the cached tokens; off
 * means off. */
#include "tests/test_common.h"
#include "tests/test_kv.h"

#include "engine/engine_core.h"
#include "engine/util.h"

#define MAXC 4
#define MAXG 64
#define TOPK 5

struct collect {
    int32_t ids[MAXC][MAXG];
    float lps[MAXC][MAXG];
    float top_lps[MAXC][MAXG][TOPK];
    int32_t top_ids[MAXC][MAXG][TOPK];
    int n[MAXC];
    int cached[MAXC];
    int n_finished, errors;
};

static void collect_emit(void *ud, const struct engine_event *ev) {
    struct collect *c = ud;
    int k = ev->choice;
    assert_true(k >= 0 && k < MAXC);
    free(ev->text);
    if (ev->type == ENGINE_EVENT_ERROR) {
        c->errors++;
    } else if (ev->type == ENGINE_EVENT_TOKEN) {
        assert_true(c->n[k] < MAXG);
        c->ids[k][c->n[k]] = ev->token;
        c->lps[k][c->n[k]] = ev->logprob;
        memcpy(c->top_lps[k][c->n[k]], ev->top_lps, sizeof c->top_lps[k][0]);
        memcpy(c->top_ids[k][c->n[k]], ev->top_ids, sizeof c->top_ids[k][0]);
        c->n[k]++;
    } else {
        c->cached[k] = ev->cached_tokens;
        c->n_finished++;
    }
}

static char *write_pattern(void) {
    char *d = test_mkdtemp(), *p;
    assert_true(asprintf(&p, "%s/full_attention_heads.tsv", d) > 0);
    test_write_text(p, "0.9\t0.1\n0.2\t0.8\n"); /* sparsity 0.5: one streaming head a layer */
    free(d);
    return p;
}

/* --kv-cache-dtype of the cores make_core makes (NULL: auto, f32 on the CPU) */
static const char *kv_dtype;

/* DUO_TEST_TP=N: the model split over N tensor-parallel ranks (CPU threads), as tests/run_all.sh
 * runs it a second time. */
static int test_tp(void) {
    const char *v = getenv("DUO_TEST_TP");
    return v && atoi(v) > 1 ? atoi(v) : 1;
}

static struct core *make_core(const char *pattern, bool caching, int budget) {
    struct engine_config cfg = {.model_dir = "tests/fixtures/hf/llama3", .max_num_batched_tokens = budget,
                                .max_num_seqs = 8, .block_size = 16, .duo_pattern = pattern,
                                .duo_sparsity = 0.5f, .sink_tokens = 4, .recent_tokens = 8,
                                .no_prefix_caching = !caching, .tensor_parallel_size = test_tp(),
                                .kv_cache_dtype = kv_dtype, .quiet = true};
    struct core *c;
    char err[512] = "";
    int rc = core_create(&c, &cfg, err, sizeof err);
    if (rc) print_error("core_create: %s\n", err);
    assert_int_equal(rc, 0);
    return c;
}

/* Runs one request of n greedy choices with top-5 logprobs to its end. */
static void run(struct core *c, const int32_t *prompt, int len, int n, int max_tokens, struct collect *out) {
    memset(out, 0, sizeof *out);
    struct engine_sampling sp = {.n = n, .max_tokens = max_tokens, .top_p = 1.0f, .repetition_penalty = 1.0f,
                                 .ignore_eos = true, .skip_special_tokens = true, .logprobs = TOPK};
    struct engine_request req = {prompt, len, sp};
    char err[256];
    int rc = core_add(c, &req, collect_emit, out, NULL, err, sizeof err);
    if (rc) print_error("core_add: %s\n", err);
    assert_int_equal(rc, ENGINE_OK);
    for (int guard = 0; core_has_work(c); guard++) {
        assert_true(guard < 10000);
        assert_true(core_step(c) >= 0);
    }
    assert_int_equal(out->n_finished, n);
    assert_int_equal(out->errors, 0);
}

static void assert_same_bits(const struct collect *a, const struct collect *b, int n) {
    for (int k = 0; k < n; k++) {
        assert_int_equal(a->n[k], b->n[k]);
        assert_memory_equal(a->ids[k], b->ids[k], sizeof(int32_t) * (size_t)a->n[k]);
        assert_memory_equal(a->lps[k], b->lps[k], sizeof(float) * (size_t)a->n[k]);
        assert_memory_equal(a->top_lps[k], b->top_lps[k], sizeof a->top_lps[k][0] * (size_t)a->n[k]);
        assert_memory_equal(a->top_ids[k], b->top_ids[k], sizeof a->top_ids[k][0] * (size_t)a->n[k]);
    }
}

/* prompt = head + tail */
static int cat(int32_t *out, const int32_t *head, int n_head, const int32_t *tail, int n_tail) {
    memcpy(out, head, sizeof(int32_t) * (size_t)n_head);
    memcpy(out + n_head, tail, sizeof(int32_t) * (size_t)n_tail);
    return n_head + n_tail;
}

/* Three turns of a chat and a request sharing only the first turn's start, on a core with the
 * cache and on one without: the same bits; the hits where the design says. */
static void check_turns(const char *pattern, int budget) {
    struct core *on = make_core(pattern, true, budget), *off = make_core(pattern, false, budget);
    int32_t a[45], extra[7] = {11, 12, 13, 14, 15, 16, 17}, more[3] = {21, 22, 23}, other[13];
    for (int i = 0; i < 45; i++) a[i] = 3 + (i * 37) % 500;
    for (int i = 0; i < 13; i++) other[i] = 400 + i;
    static struct collect r_on, r_off;
    int32_t p2[128], p3[160], p4[64];

    run(on, a, 45, 1, 12, &r_on); /* turn 1: nothing cached yet */
    run(off, a, 45, 1, 12, &r_off);
    assert_same_bits(&r_on, &r_off, 1);
    assert_int_equal(r_on.cached[0], 0);

    /* turn 2: the first turn, its answer, a new message. The first turn's sequence left at 45 + 12
     * - 1 = 56 tokens computed (its last token never was): 3 full blocks and 8 tokens into the 4th */
    int n2 = cat(p2, a, 45, r_on.ids[0], 12);
    n2 = cat(p2, p2, n2, extra, 7);
    run(on, p2, n2, 1, 12, &r_on);
    run(off, p2, n2, 1, 12, &r_off);
    assert_same_bits(&r_on, &r_off, 1);
    assert_int_equal(r_on.cached[0], 56);
    assert_int_equal(r_off.cached[0], 0);

    /* turn 3, two choices: from turn 2's snapshot (64 + 12 - 1 = 75 tokens) */
    int n3 = cat(p3, p2, n2, r_on.ids[0], 12);
    n3 = cat(p3, p3, n3, more, 3);
    run(on, p3, n3, 2, 10, &r_on);
    run(off, p3, n3, 2, 10, &r_off);
    assert_same_bits(&r_on, &r_off, 2);
    assert_int_equal(r_on.cached[0], 75);
    assert_int_equal(r_on.cached[1], 75);

    /* the first 37 tokens of turn 1 and something else: whole blocks only (2 of them) without
     * streaming heads; with them no snapshot stands there, so nothing */
    int n4 = cat(p4, a, 37, other, 13);
    run(on, p4, n4, 1, 8, &r_on);
    run(off, p4, n4, 1, 8, &r_off);
    assert_same_bits(&r_on, &r_off, 1);
    assert_int_equal(r_on.cached[0], pattern ? 0 : 32);

    /* turn 2's prompt and another answer than the model's (a client that edits the history): the
     * snapshot kept at the end of turn 2's prompt (64 tokens, 4 whole blocks) */
    int32_t p5[96];
    int n5 = cat(p5, p2, n2, other, 13);
    run(on, p5, n5, 1, 8, &r_on);
    run(off, p5, n5, 1, 8, &r_off);
    assert_same_bits(&r_on, &r_off, 1);
    assert_int_equal(r_on.cached[0], n2);

    /* turn 1's prompt (45 tokens, 13 into its third block) and something else: with streaming
     * heads the snapshot at the end of that prompt, mid-block; without, its 2 whole blocks */
    int32_t p6[64];
    int n6 = cat(p6, a, 45, other, 13);
    run(on, p6, n6, 1, 8, &r_on);
    run(off, p6, n6, 1, 8, &r_off);
    assert_same_bits(&r_on, &r_off, 1);
    assert_int_equal(r_on.cached[0], pattern ? 45 : 32);

    struct engine_stats st;
    core_stats(on, &st);
    assert_true(st.prefix_cache_hits == (uint64_t)(56 + 75 + (pattern ? 0 : 32) + n2 + (pattern ? 45 : 32)));
    assert_true(st.prefix_cache_queries == (uint64_t)(45 + n2 + n3 + n4 + n5 + n6));
    assert_true(st.prefix_cache_blocks > 0);
    core_stats(off, &st);
    assert_true(st.prefix_cache_queries == 0 && st.prefix_cache_hits == 0 && st.prefix_cache_blocks == 0);
    assert_kv_idle(core_kv(on));
    assert_kv_idle(core_kv(off));
    core_free(on);
    core_free(off);
}

/* Prompts shorter than sink + recent (4 + 8: the streaming ring never wrapped), at and just past
 * it, ending mid-block and at a block edge: the next turn (prompt, answer, a new message) finds
 * the earlier sequence's computed tokens; a request that leaves the earlier answer inside its
 * recent window (prompt, all but the answer's last token, something else) finds no more than it
 * shares with the cached turns; every request gives the bits of an engine without the cache. */
static void check_short_prefixes(const char *pattern, int budget) {
    static const int lens[] = {2, 5, 9, 11, 12, 13, 16, 17};
    static const int32_t tail[5] = {301, 302, 303, 304, 305};
    static struct collect first, r_on, r_off;
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        struct core *on = make_core(pattern, true, budget), *off = make_core(pattern, false, budget);
        const int L = lens[li], G = 3;
        int32_t a[32], p2[48], p3[48];
        for (int i = 0; i < L; i++) a[i] = 3 + (i * 41 + L) % 500;
        run(on, a, L, 1, G, &first);
        run(off, a, L, 1, G, &r_off);
        assert_same_bits(&first, &r_off, 1);
        int n2 = cat(p2, a, L, first.ids[0], G); /* the next turn */
        n2 = cat(p2, p2, n2, tail, 5);
        run(on, p2, n2, 1, 6, &r_on);
        run(off, p2, n2, 1, 6, &r_off);
        assert_same_bits(&r_on, &r_off, 1);
        assert_int_equal(r_on.cached[0], L + G - 1); /* the first sequence's computed tokens */
        int n3 = cat(p3, a, L, first.ids[0], G - 1); /* diverges inside the earlier recent window */
        n3 = cat(p3, p3, n3, tail + 2, 3);
        run(on, p3, n3, 1, 6, &r_on);
        run(off, p3, n3, 1, 6, &r_off);
        assert_same_bits(&r_on, &r_off, 1);
        assert_true(r_on.cached[0] <= L + G - 1); /* at most what it shares with turn 2 */
        assert_kv_idle(core_kv(on));
        core_free(on);
        core_free(off);
    }
}

static void test_short_prefixes(void **state) {
    (void)state;
    char *p = write_pattern();
    check_short_prefixes(NULL, 4096);
    check_short_prefixes(p, 4096);
    check_short_prefixes(p, 3); /* chunks of 3 */
    unlink(p);
    free(p);
}

static void test_hit_equals_miss_full_attention(void **state) {
    (void)state;
    check_turns(NULL, 4096);
    check_turns(NULL, 7); /* chunks of 7: the cached prefix and the chunk edges do not line up */
}

static void test_hit_equals_miss_with_streaming_heads(void **state) {
    (void)state;
    char *p = write_pattern();
    check_turns(p, 4096);
    check_turns(p, 7);
    unlink(p);
    free(p);
}

/* With an fp8 KV cache: a hit still finds the bytes a miss computes. */
static void test_hit_equals_miss_fp8(void **state) {
    (void)state;
    char *p = write_pattern();
    kv_dtype = "fp8";
    check_turns(NULL, 7);
    check_turns(p, 7);
    kv_dtype = NULL;
    unlink(p);
    free(p);
}

/* Many conversations at once on a pool too small for all: the cache evicts, preemption retires
 * sequences into it, and every answer is still the miss's. */
static void test_pressure_keeps_bits(void **state) {
    (void)state;
    char *p = write_pattern();
    for (int with = 0; with < 2; with++) {
        const char *pat = with ? p : NULL;
        struct engine_config cfg = {.model_dir = "tests/fixtures/hf/llama3", .max_num_batched_tokens = 32,
                                    .max_num_seqs = 4, .block_size = 16, .duo_pattern = pat, .duo_sparsity = 0.5f,
                                    .sink_tokens = 4, .recent_tokens = 8, .kv_cache_memory = (size_t)with ? 90000 : 120000,
                                    .tensor_parallel_size = test_tp(), .quiet = true};
        struct core *on;
        char err[512] = "";
        assert_int_equal(core_create(&on, &cfg, err, sizeof err), 0);
        struct core *off = make_core(pat, false, 4096);
        static struct collect got[6], want;
        int32_t prompts[6][80];
        for (int r = 0; r < 6; r++)
            for (int i = 0; i < 80; i++) prompts[r][i] = i < 40 ? 5 + i : 3 + (r * 53 + i * 29) % 500; /* shared start */
        for (int round = 0; round < 2; round++) {
            char e2[256];
            for (int r = 0; r < 6; r++) {
                memset(&got[r], 0, sizeof got[r]);
                struct engine_sampling sp = {.n = 1, .max_tokens = 9, .top_p = 1.0f, .repetition_penalty = 1.0f,
                                             .ignore_eos = true, .skip_special_tokens = true, .logprobs = TOPK};
                struct engine_request req = {prompts[r], 50 + r * 5, sp};
                assert_int_equal(core_add(on, &req, collect_emit, &got[r], NULL, e2, sizeof e2), ENGINE_OK);
            }
            for (int guard = 0; core_has_work(on); guard++) {
                assert_true(guard < 10000);
                assert_true(core_step(on) >= 0);
            }
            for (int r = 0; r < 6; r++) {
                run(off, prompts[r], 50 + r * 5, 1, 9, &want);
                assert_same_bits(&got[r], &want, 1);
            }
        }
        struct engine_stats st;
        core_stats(on, &st);
        assert_true(st.prefix_cache_hits > 0);
        assert_kv_idle(core_kv(on));
        core_free(on);
        core_free(off);
    }
    unlink(p);
    free(p);
}

/* A pool of exactly 4 blocks of 16 (64 tokens) and one request of 62 prompt tokens + 2 out: the
 * snapshot at the prompt's end shares the sequence's partial block, and a copy on the first decode
 * would need a fifth block. It runs to its end with the cache as without it (once, the engine spun
 * planning nothing). Returns the steps that computed nothing. */
static int full_pool_idle_steps(const char *pattern, bool caching) {
    size_t slot_bytes = pattern ? 3072 : 0, block_bytes = pattern ? 4096 : 8192; /* llama3 fixture, f32 */
    int n_slots = pattern ? 4 + (caching ? 2 : 0) : 0;
    struct engine_config cfg = {.model_dir = "tests/fixtures/hf/llama3", .max_num_batched_tokens = 256,
                                .max_num_seqs = 4, .block_size = 16, .duo_pattern = pattern, .duo_sparsity = 0.5f,
                                .sink_tokens = 4, .recent_tokens = 8, .no_prefix_caching = !caching,
                                .kv_cache_memory = n_slots * slot_bytes + 4 * block_bytes, .quiet = true};
    struct core *c;
    char err[512] = "";
    int rc = core_create(&c, &cfg, err, sizeof err);
    if (rc) print_error("core_create: %s\n", err);
    assert_int_equal(rc, 0);
    struct engine_stats st;
    core_stats(c, &st);
    assert_int_equal(st.kv_capacity_tokens, 64);
    int32_t prompt[62];
    for (int i = 0; i < 62; i++) prompt[i] = 3 + (i * 37) % 500;
    static struct collect out;
    memset(&out, 0, sizeof out);
    struct engine_sampling sp = {.n = 1, .max_tokens = 2, .top_p = 1.0f, .repetition_penalty = 1.0f,
                                 .ignore_eos = true, .skip_special_tokens = true, .logprobs = -1};
    struct engine_request req = {prompt, 62, sp};
    assert_int_equal(core_add(c, &req, collect_emit, &out, NULL, err, sizeof err), ENGINE_OK);
    int idle = 0;
    for (int guard = 0; core_has_work(c) && guard < 100; guard++) {
        int r = core_step(c);
        assert_true(r >= 0);
        idle += r == 0;
    }
    assert_false(core_has_work(c));
    assert_int_equal(out.n[0], 2);
    core_free(c);
    return idle;
}

static void test_full_pool_request_runs(void **state) {
    (void)state;
    char *p = write_pattern();
    for (int with = 0; with < 2; with++) {
        assert_int_equal(full_pool_idle_steps(with ? p : NULL, false), 0);
        assert_int_equal(full_pool_idle_steps(with ? p : NULL, true), 0);
    }
    unlink(p);
    free(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hit_equals_miss_full_attention),
        cmocka_unit_test(test_hit_equals_miss_with_streaming_heads),
        cmocka_unit_test(test_hit_equals_miss_fp8),
        cmocka_unit_test(test_short_prefixes),
        cmocka_unit_test(test_pressure_keeps_bits),
        cmocka_unit_test(test_full_pool_request_runs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
