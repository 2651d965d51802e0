/* The CPU reference forward pass against real references: the trained stories260k model's
 * golden greedy ids, HF transformers' greedy ids and top-5 logprobs for a tiny random model of
 * every supported family (tests/fixtures/hf, written by scripts/make_reference.py), and the
 * flattened-batch contract (a sequence's results do not depend on its batch-mates or on how
 * its prompt is chunked). */
#include <cjson/cJSON.h>
#include <math.h>

#include "tests/test_common.h"
#include "tests/generate_ref.h"

#include "engine/kv_cache_impl.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "engine/util.h"

static int test_kv_init(struct kv_cache *kv, struct backend *b, const struct model *m, int bs, int n_blocks) {
    struct kv_geometry g;
    model_kv_geometry(m, bs, 0, 1, &g);
    return kv_cache_init(kv, b, &g, n_blocks, 1);
}

#define HF_LOGPROB_TOL 2e-3f

static struct model *load_or_fail(struct backend *b, const char *dir, int max_tokens) {
    struct model *m = NULL;
    char err[512] = "";
    int rc = model_load(&m, dir, b, max_tokens, err, sizeof err);
    if (rc) print_error("model_load(%s): %s\n", dir, err);
    assert_int_equal(rc, 0);
    return m;
}

static cJSON *read_json(const char *path) {
    char *text;
    size_t len;
    assert_int_equal(util_read_file(path, &text, &len), 0);
    cJSON *j = cJSON_ParseWithLength(text, len);
    free(text);
    assert_non_null(j);
    return j;
}

static int32_t *json_ids(const cJSON *arr, int *n) {
    *n = cJSON_GetArraySize(arr);
    int32_t *v = malloc(sizeof *v * (size_t)(*n ? *n : 1));
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) v[i++] = (int32_t)it->valuedouble;
    return v;
}

static void stories_golden_with_chunk(int chunk) {
    char dir[1024], exp_path[1024];
    TEST_REQUIRE_SHARED(dir, "models/stories260k/config.json");
    TEST_REQUIRE_SHARED(exp_path, "models/stories260k/expected_greedy_ids.json");
    snprintf(dir, sizeof dir, "%s/models/stories260k", test_shared_dir());
    cJSON *exp = read_json(exp_path);
    int n_prompt, n_exp;
    int32_t *prompt = json_ids(cJSON_GetObjectItem(exp, "prompt_ids"), &n_prompt);
    int32_t *want = json_ids(cJSON_GetObjectItem(exp, "greedy_ids"), &n_exp);
    assert_int_equal(n_exp, 199);

    struct backend *b = backend_cpu_create();
    struct model *m = load_or_fail(b, dir, 64);
    struct gen_params p = {.max_tokens = n_exp, .prefill_chunk = chunk, .ignore_eos = true};
    struct gen_result r;
    char err[256];
    assert_int_equal(generate_run(m, prompt, n_prompt, &p, &r, err, sizeof err), 0);
    assert_int_equal(r.n, n_exp);
    for (int i = 0; i < n_exp; i++) {
        if (r.ids[i] != want[i]) print_error("position %d: got %d, expected %d\n", i, r.ids[i], want[i]);
        assert_int_equal(r.ids[i], want[i]);
    }
    gen_result_free(&r);
    model_free(m);
    backend_destroy(b);
    free(prompt);
    free(want);
    cJSON_Delete(exp);
}

static void test_stories260k_greedy_matches_golden_ids(void **state) { stories_golden_with_chunk(0); }

/* HF parity for one family: greedy ids equal; every HF top-5 logprob within tolerance of ours
 * (computed by teacher forcing over prompt + HF's ids, all positions in one forward pass). */
static void check_hf_family(const char *family) {
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "tests/fixtures/hf/%s", family);
    snprintf(path, sizeof path, "%s/expected.json", dir);
    cJSON *exp = read_json(path);
    struct backend *b = backend_cpu_create();
    struct model *m = load_or_fail(b, dir, 2048);
    const cJSON *c;
    int n_cases = 0;
    float worst = 0.0f;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(exp, "cases")) {
        int np, ng;
        int32_t *prompt = json_ids(cJSON_GetObjectItem(c, "prompt_ids"), &np);
        int32_t *want = json_ids(cJSON_GetObjectItem(c, "greedy_ids"), &ng);

        struct gen_params p = {.max_tokens = ng, .ignore_eos = true};
        struct gen_result r;
        char err[256];
        assert_int_equal(generate_run(m, prompt, np, &p, &r, err, sizeof err), 0);
        assert_int_equal(r.n, ng);
        for (int i = 0; i < ng; i++) {
            if (r.ids[i] != want[i])
                print_error("%s prompt %d: position %d: got %d, HF %d\n", family, np, i, r.ids[i], want[i]);
            assert_int_equal(r.ids[i], want[i]);
        }
        gen_result_free(&r);

        /* teacher forcing: tokens = prompt + want[0..ng-2]; logits at the last ng rows */
        int T = np + ng - 1, V = m->cfg.vocab_size;
        int32_t *toks = malloc(sizeof *toks * T), *pos = malloc(sizeof *pos * T), *rows = malloc(sizeof *rows * ng);
        memcpy(toks, prompt, sizeof *toks * np);
        memcpy(toks + np, want, sizeof *toks * (ng - 1));
        for (int i = 0; i < T; i++) pos[i] = i;
        for (int i = 0; i < ng; i++) rows[i] = np - 1 + i;
        int nb = (T + 15) / 16;
        struct kv_cache kv;
        assert_int_equal(test_kv_init(&kv, b, m, 16, nb), 0);
        int32_t *blocks = malloc(sizeof *blocks * nb);
        assert_int_equal(kv_cache_alloc(&kv, nb, blocks), KV_STATUS_OK);
        int32_t ss[2] = {0, T}, ip[2] = {0, nb};
        struct fwd_batch bt = {T, 1, toks, pos, ss, ip, blocks, NULL, ng, rows, NULL, false};
        float *logits = malloc(sizeof *logits * (size_t)ng * V), *lp = malloc(sizeof *lp * V);
        assert_int_equal(model_forward(m, &kv, &bt, logits), 0);
        int i = 0;
        const cJSON *posj;
        cJSON_ArrayForEach(posj, cJSON_GetObjectItem(c, "top_logprobs")) {
            sampler_log_softmax(logits + (size_t)i * V, V, lp);
            const cJSON *pair;
            cJSON_ArrayForEach(pair, posj) {
                int id = (int)cJSON_GetArrayItem(pair, 0)->valuedouble;
                float hf = (float)cJSON_GetArrayItem(pair, 1)->valuedouble;
                float d = fabsf(lp[id] - hf);
                if (d > worst) worst = d;
                if (d > HF_LOGPROB_TOL)
                    print_error("%s prompt %d pos %d token %d: logprob %f, HF %f\n", family, np, i, id, lp[id], hf);
                assert_true(d <= HF_LOGPROB_TOL);
            }
            i++;
        }
        assert_int_equal(i, ng);
        kv_cache_free(&kv);
        free(blocks);
        free(logits);
        free(lp);
        free(toks);
        free(pos);
        free(rows);
        free(prompt);
        free(want);
        n_cases++;
    }
    print_message("%s: %d prompts match HF (max |dlogprob| %.2e, tolerance %.0e)\n", family, n_cases, worst,
                  HF_LOGPROB_TOL);
    assert_true(n_cases >= 5);
    model_free(m);
    backend_destroy(b);
    cJSON_Delete(exp);
}

static void test_hf_parity_llama3_gqa_llama3_rope(void **state) { check_hf_family("llama3"); }
static void test_hf_parity_llama2_mha_linear_rope(void **state) { check_hf_family("llama2"); }
static void test_hf_parity_mistral_sliding_window(void **state) { check_hf_family("mistral"); }
static void test_hf_parity_qwen2_bias_tied(void **state) { check_hf_family("qwen2"); }
static void test_hf_parity_llama_head_dim_128(void **state) { check_hf_family("llama_hd128"); }

/* The same greedy continuation whatever the prefill chunk size. */
static void test_greedy_ids_identical_across_prefill_chunks(void **state) {
    struct backend *b = backend_cpu_create();
    struct model *m = load_or_fail(b, "tests/fixtures/hf/mistral", 4096);
    int32_t prompt[300];
    for (int i = 0; i < 300; i++) prompt[i] = 3 + (i * 37) % 500;
    int32_t ref[24];
    int chunks[] = {4096, 1, 7, 16, 129};
    for (size_t k = 0; k < sizeof chunks / sizeof chunks[0]; k++) {
        struct gen_params p = {.max_tokens = 24, .prefill_chunk = chunks[k], .ignore_eos = true};
        struct gen_result r;
        char err[256];
        assert_int_equal(generate_run(m, prompt, 300, &p, &r, err, sizeof err), 0);
        assert_int_equal(r.n, 24);
        if (k == 0) memcpy(ref, r.ids, sizeof ref);
        else assert_memory_equal(ref, r.ids, sizeof ref);
        gen_result_free(&r);
    }
    model_free(m);
    backend_destroy(b);
}

/* Two sequences in one flattened batch (with shuffled, non-contiguous blocks) give exactly the
 * logits each gives alone. */
static void test_batched_forward_equals_separate_forwards(void **state) {
    struct backend *b = backend_cpu_create();
    struct model *m = load_or_fail(b, "tests/fixtures/hf/llama3", 256);
    int V = m->cfg.vocab_size;
    enum { NA = 40, NB = 23, BS = 16 };
    int32_t ta[NA], tb[NB], pa[NA], pb[NB];
    for (int i = 0; i < NA; i++) ta[i] = 5 + (i * 13) % 400, pa[i] = i;
    for (int i = 0; i < NB; i++) tb[i] = 7 + (i * 29) % 400, pb[i] = i;
    struct kv_cache kv;
    assert_int_equal(test_kv_init(&kv, b, m, BS, 8), 0);

    float *alone = malloc(sizeof(float) * 2 * V), *both = malloc(sizeof(float) * 2 * V);
    int32_t blk_a[3] = {5, 0, 7}, blk_b[2] = {3, 6};
    { /* alone */
        int32_t ss[2] = {0, NA}, ip[2] = {0, 3}, row = NA - 1;
        struct fwd_batch bt = {NA, 1, ta, pa, ss, ip, blk_a, NULL, 1, &row, NULL, false};
        assert_int_equal(model_forward(m, &kv, &bt, alone), 0);
        int32_t ss2[2] = {0, NB}, ip2[2] = {0, 2}, row2 = NB - 1;
        struct fwd_batch bt2 = {NB, 1, tb, pb, ss2, ip2, blk_b, NULL, 1, &row2, NULL, false};
        assert_int_equal(model_forward(m, &kv, &bt2, alone + V), 0);
    }
    { /* together, b first, in other blocks */
        int32_t toks[NA + NB], pos[NA + NB];
        memcpy(toks, tb, sizeof tb);
        memcpy(toks + NB, ta, sizeof ta);
        memcpy(pos, pb, sizeof pb);
        memcpy(pos + NB, pa, sizeof pa);
        int32_t ss[3] = {0, NB, NB + NA}, ip[3] = {0, 2, 5}, blocks[5] = {1, 4, 2, 6, 3};
        int32_t rows[2] = {NA + NB - 1, NB - 1};
        struct fwd_batch bt = {NA + NB, 2, toks, pos, ss, ip, blocks, NULL, 2, rows, NULL, false};
        assert_int_equal(model_forward(m, &kv, &bt, both), 0);
    }
    assert_memory_equal(alone, both, sizeof(float) * 2 * V);
    free(alone);
    free(both);
    kv_cache_free(&kv);
    model_free(m);
    backend_destroy(b);
}

/* Decode steps reach a backend's graph cache under one key for both calls: graph_begin and
 * graph_end get the same key (negative when only argmax ids go to the host), so a second
 * ids-only step finds the graph the first captured, and a step that needs the logits on the
 * host never finds an ids-only graph. A fake graph cache over the CPU ops records it. */
static bool fake_graph[2][9];
static int fake_found[2][9], fake_captured[2][9];
static int fake_graph_begin(struct backend *b, int key, float *host_logits, size_t n, int32_t *host_ids) {
    int ids = key < 0, T = key < 0 ? -key : key;
    if (T > 8) return BACKEND_GRAPH_OFF;
    if (fake_graph[ids][T]) {
        fake_found[ids][T]++;
        return BACKEND_GRAPH_OFF; /* a real backend replays; the CPU runs the ops again */
    }
    return BACKEND_GRAPH_CAPTURING;
}
static int fake_graph_end(struct backend *b, int key) {
    int ids = key < 0, T = key < 0 ? -key : key;
    fake_graph[ids][T] = true;
    fake_captured[ids][T]++;
    return 0;
}

static void test_decode_graph_keys(void **state) {
    struct backend *cpu = backend_cpu_create();
    struct backend_ops ops = *cpu->ops;
    ops.graph_begin = fake_graph_begin;
    ops.graph_end = fake_graph_end;
    struct backend b = {&ops, "cpu+fake-graphs", cpu->ctx};
    struct model *m = load_or_fail(&b, "tests/fixtures/hf/qwen2", 64);
    int V = m->cfg.vocab_size;
    struct kv_cache kv;
    assert_int_equal(test_kv_init(&kv, &b, m, 8, 6), 0);
    int32_t toks[8] = {3, 14, 25, 36, 47, 58, 69, 70}, pos[8] = {0, 1, 2, 3, 4, 5, 6, 7}, blocks[1] = {2};
    int32_t ip[2] = {0, 1}, ss_pre[2] = {0, 4}, row_pre = 3, ss1[2] = {0, 1}, row = 0, id = -1;
    float *logits = malloc(sizeof(float) * V);
    struct fwd_batch pre = {4, 1, toks, pos, ss_pre, ip, blocks, NULL, 1, &row_pre, NULL, false};
    assert_int_equal(model_forward(m, &kv, &pre, logits), 0); /* a prefill: no graph */
    /* two greedy decode steps (ids only), then one that needs the logits on the host */
    for (int i = 4; i < 7; i++) {
        bool ids_only = i < 6;
        struct fwd_batch dec = {1, 1, toks + i, pos + i, ss1, ip, blocks, NULL, 1, &row, &id, ids_only};
        assert_int_equal(model_forward(m, &kv, &dec, logits), 0);
        if (!ids_only) assert_int_equal(id, sampler_argmax(logits, V)); /* the logits reached the host */
    }
    assert_int_equal(fake_captured[1][1], 1); /* the ids-only graph: captured once, found once */
    assert_int_equal(fake_found[1][1], 1);
    assert_int_equal(fake_captured[0][1], 1); /* the logits step: its own graph, not the ids-only one */
    assert_int_equal(fake_found[0][1], 0);
    free(logits);
    kv_cache_free(&kv);
    model_free(m);
    backend_destroy(cpu);
}

/* Decode after prefill reads the cache: one step of 1 token equals that row of a full pass. */
static void test_decode_step_matches_full_forward(void **state) {
    struct backend *b = backend_cpu_create();
    struct model *m = load_or_fail(b, "tests/fixtures/hf/qwen2", 64);
    int V = m->cfg.vocab_size;
    enum { N = 20 };
    int32_t toks[N], pos[N];
    for (int i = 0; i < N; i++) toks[i] = 3 + i * 11, pos[i] = i;
    struct kv_cache kv;
    assert_int_equal(test_kv_init(&kv, b, m, 8, 6), 0);
    int32_t blocks[3] = {4, 1, 2}, blocks2[3] = {0, 5, 3};
    float *full = malloc(sizeof(float) * V), *step = malloc(sizeof(float) * V);
    int32_t ss[2] = {0, N}, ip[2] = {0, 3}, row = N - 1;
    struct fwd_batch bt = {N, 1, toks, pos, ss, ip, blocks, NULL, 1, &row, NULL, false};
    assert_int_equal(model_forward(m, &kv, &bt, full), 0);
    int32_t ss1[2] = {0, N - 1}, row1 = N - 2;
    struct fwd_batch pre = {N - 1, 1, toks, pos, ss1, ip, blocks2, NULL, 1, &row1, NULL, false};
    assert_int_equal(model_forward(m, &kv, &pre, step), 0);
    int32_t ss2[2] = {0, 1}, row2 = 0;
    struct fwd_batch dec = {1, 1, toks + N - 1, pos + N - 1, ss2, ip, blocks2, NULL, 1, &row2, NULL, false};
    assert_int_equal(model_forward(m, &kv, &dec, step), 0);
    for (int i = 0; i < V; i++) assert_float_equal(full[i], step[i], 1e-5);
    free(full);
    free(step);
    kv_cache_free(&kv);
    model_free(m);
    backend_destroy(b);
}

/* The fused ops give the same logits, bit for bit, as the ops they fuse: SwiGLU over gate|up
 * weights stacked in groups of 8 rows against matmul + silu_mul over the plain stack (F = 128:
 * the fused path is taken), and norm_matmul (the residual moving between two buffers) against
 * add_rmsnorm + matmul; each alone and both. */
static void test_fused_ops_equal_the_ops_they_fuse(void **state) {
    struct backend *cpu = backend_cpu_create();
    int V = 0;
    float *ref = NULL;
    for (int k = 0; k < 4; k++) {
        struct backend_ops ops = *cpu->ops;
        if (k & 1) ops.matmul_swiglu = NULL;
        if (k & 2) ops.norm_matmul = NULL;
        struct backend b = {&ops, "cpu-variant", cpu->ctx};
        struct model *m = load_or_fail(&b, "tests/fixtures/hf/llama3", 16);
        assert_int_equal(m->fused_swiglu, !(k & 1));
        assert_int_equal(m->fused_norm, !(k & 2));
        V = m->cfg.vocab_size;
        enum { N = 12 };
        int32_t toks[N], pos[N], blocks[2] = {0, 1}, ss[2] = {0, N}, ip[2] = {0, 2}, row = N - 1;
        for (int i = 0; i < N; i++) toks[i] = 5 + i * 13, pos[i] = i;
        float *lg = malloc(sizeof(float) * V);
        struct fwd_batch bt = {N, 1, toks, pos, ss, ip, blocks, NULL, 1, &row, NULL, false};
        struct kv_cache kv;
        assert_int_equal(test_kv_init(&kv, &b, m, 8, 4), 0);
        assert_int_equal(model_forward(m, &kv, &bt, lg), 0);
        if (!ref) {
            ref = lg;
            float spread = 0.0f; /* the logits are not all equal (a broken MLP could agree with itself) */
            for (int i = 1; i < V; i++) spread = fmaxf(spread, fabsf(lg[i] - lg[0]));
            assert_true(spread > 1e-3f);
        } else {
            assert_memory_equal(lg, ref, sizeof(float) * V);
            free(lg);
        }
        kv_cache_free(&kv);
        model_free(m);
    }
    free(ref);
    backend_destroy(cpu);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fused_ops_equal_the_ops_they_fuse),
        cmocka_unit_test(test_stories260k_greedy_matches_golden_ids),
        cmocka_unit_test(test_hf_parity_llama3_gqa_llama3_rope),
        cmocka_unit_test(test_hf_parity_llama2_mha_linear_rope),
        cmocka_unit_test(test_hf_parity_mistral_sliding_window),
        cmocka_unit_test(test_hf_parity_qwen2_bias_tied),
        cmocka_unit_test(test_hf_parity_llama_head_dim_128),
        cmocka_unit_test(test_greedy_ids_identical_across_prefill_chunks),
        cmocka_unit_test(test_batched_forward_equals_separate_forwards),
        cmocka_unit_test(test_decode_step_matches_full_forward),
        cmocka_unit_test(test_decode_graph_keys),
    };
    return cmocka_run_group_tests_name("model", tests, NULL, NULL);
}
