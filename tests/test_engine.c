/* The engine core on the CPU backend: invariance of greedy ids (alone, batched, chunked,
 * preempted; with and without a DuoAttention pattern; f32 and fp8 KV), an fp8 KV cache end to
 * end, DuoAttention math against a dense-mask reference, allocator properties, seeded sampling,
 * stop conditions, n > 1 prefix sharing. */
#include <cjson/cJSON.h>
#include <math.h>

#include "tests/test_common.h"
#include "tests/test_kv.h"

#include "engine/kv_cache_impl.h"
#include "engine/core_bench.h"
#include "engine/duo_pattern.h"
#include "engine/engine_core.h"
#include "engine/safetensors.h"
#include "engine/sampler.h"
#include "engine/text/tokenizer.h"
#include "engine/text/utf8.h"
#include "engine/util.h"

#define MAXC 4
#define MAXG 256

struct collect {
    int32_t ids[MAXC][MAXG];
    float lps[MAXC][MAXG];
    int32_t top_ids[MAXC][MAXG][ENGINE_MAX_LOGPROBS];
    float top_lps[MAXC][MAXG][ENGINE_MAX_LOGPROBS];
    int n[MAXC];
    char text[MAXC][4096];
    size_t text_len[MAXC];
    size_t at[MAXC][MAXG];    // where each token's text starts in text[k], in characters
    bool text_start[MAXC][MAXG];
    enum engine_finish finish[MAXC];
    int completion_tokens[MAXC];
    int n_finished, errors;
};

static void collect_emit(void *ud, const struct engine_event *ev) {
    struct collect *c = ud;
    int k = ev->choice;
    assert_true(k >= 0 && k < MAXC);
    if (ev->type == ENGINE_EVENT_ERROR) {
        c->errors++;
        return;
    }
    size_t chars = utf8_count(c->text[k], c->text_len[k]);
    if (ev->type == ENGINE_EVENT_TOKEN && c->n[k] < MAXG) {
        c->at[k][c->n[k]] = chars + (size_t)ev->token_text_at;
        c->text_start[k][c->n[k]] = ev->text_start;
    }
    if (ev->text) {
        size_t l = strlen(ev->text);
        assert_true(c->text_len[k] + l < sizeof c->text[k]);
        memcpy(c->text[k] + c->text_len[k], ev->text, l + 1);
        c->text_len[k] += l;
        free(ev->text);
    }
    if (ev->type == ENGINE_EVENT_TOKEN) {
        assert_true(c->n[k] < MAXG);
        c->ids[k][c->n[k]] = ev->token;
        c->lps[k][c->n[k]] = ev->logprob;
        memcpy(c->top_ids[k][c->n[k]], ev->top_ids, sizeof ev->top_ids);
        memcpy(c->top_lps[k][c->n[k]], ev->top_lps, sizeof ev->top_lps);
        c->n[k]++;
    } else {
        c->finish[k] = ev->finish;
        c->completion_tokens[k] = ev->completion_tokens;
        c->n_finished++;
    }
}

static struct engine_sampling greedy(int max_tokens) {
    return (struct engine_sampling){.n = 1, .max_tokens = max_tokens, .top_p = 1.0f, .repetition_penalty = 1.0f,
                                    .ignore_eos = true, .skip_special_tokens = true, .logprobs = -1};
}

/* DUO_TEST_TP=N runs every case with the model split over N tensor-parallel ranks (threads on the
 * CPU); the KV budgets are the whole model's, so the pools are the same as with one rank. */
static int test_tp(void) {
    const char *v = getenv("DUO_TEST_TP");
    return v && atoi(v) > 1 ? atoi(v) : 1;
}

/* --kv-cache-dtype of the cores make_core makes (NULL: auto, f32 on the CPU) */
static const char *kv_dtype;

static struct core *make_core(const char *dir, int budget, size_t kv_bytes, const char *pattern, float sparsity,
                              int sink, int recent) {
    struct engine_config cfg = {.model_dir = dir, .max_num_batched_tokens = budget, .max_num_seqs = 32,
                                .kv_cache_memory = kv_bytes, .block_size = 16, .duo_pattern = pattern,
                                .duo_sparsity = sparsity, .sink_tokens = sink, .recent_tokens = recent,
                                .tensor_parallel_size = test_tp(), .kv_cache_dtype = kv_dtype, .quiet = true};
    struct core *c;
    char err[512] = "";
    int rc = core_create(&c, &cfg, err, sizeof err);
    if (rc) print_error("core_create: %s\n", err);
    assert_int_equal(rc, 0);
    return c;
}

static void run_all(struct core *c) {
    for (int guard = 0; core_has_work(c); guard++) {
        assert_true(guard < 100000);
        assert_true(core_step(c) >= 0);
    }
}

static void submit(struct core *c, const int32_t *prompt, int n, struct engine_sampling sp, struct collect *out) {
    struct engine_request req = {prompt, n, sp};
    char err[256];
    int rc = core_add(c, &req, collect_emit, out, NULL, err, sizeof err);
    if (rc) print_error("core_add: %s\n", err);
    assert_int_equal(rc, ENGINE_OK);
}

/* A 2-layer x 2-KV-head pattern file for the fixture models: gates chosen so sparsity 0.5
 * makes one head per layer streaming. */
static char *write_pattern(const char *text) {
    char *d = test_mkdtemp();
    char *p = malloc(strlen(d) + 32);
    sprintf(p, "%s/full_attention_heads.tsv", d);
    test_write_text(p, text);
    free(d);
    return p;
}

#define N_REQ 6
static void make_prompts(int32_t prompts[N_REQ][200], int lens[N_REQ]) {
    int L[N_REQ] = {1, 9, 37, 64, 150, 23};
    for (int r = 0; r < N_REQ; r++) {
        lens[r] = L[r];
        for (int i = 0; i < L[r]; i++) prompts[r][i] = 3 + (r * 101 + i * 37) % 500;
    }
}

/* Greedy ids of N_REQ requests: alone (one core each), then all at once with several token
 * budgets and a KV pool small enough to force preemption: always the same ids. */
static void check_invariance(const char *pattern, float sparsity) {
    const char *dir = "tests/fixtures/hf/llama3";
    int32_t prompts[N_REQ][200];
    int lens[N_REQ];
    make_prompts(prompts, lens);
    static struct collect alone[N_REQ], mixed[N_REQ];
    memset(alone, 0, sizeof alone);
    for (int r = 0; r < N_REQ; r++) {
        struct core *c = make_core(dir, 4096, 0, pattern, sparsity, 4, 8);
        submit(c, prompts[r], lens[r], greedy(20 + r * 3), &alone[r]);
        run_all(c);
        assert_int_equal(alone[r].n[0], 20 + r * 3);
        core_free(c);
    }
    struct {
        int budget;
        size_t kv;
    } runs[] = {{7, 0}, {16, 0}, {4096, 0}, {64, 0}, {33, 0}};
    /* a pool of 14 blocks (224 tokens) for ~470 tokens of work: preemption under load. llama3
     * fixture: a block is K+V x 2 layers x R heads x 16 tokens x 16 dims x 4 B (1 B with fp8); a
     * slot (sink 4 + recent 8 rows) K+V x 2 layers x S heads x 12 x 16 x 4 B, 48 of them (32 seats
     * and 16 for the prefix cache's snapshots) */
    runs[3].kv = (pattern ? 14 * 4096 + 48 * 3072 : 14 * 8192) / (kv_dtype ? 4 : 1);
    uint64_t preemptions = 0;
    for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
        memset(mixed, 0, sizeof mixed);
        struct core *c = make_core(dir, runs[k].budget, runs[k].kv, pattern, sparsity, 4, 8);
        for (int r = 0; r < N_REQ; r++) submit(c, prompts[r], lens[r], greedy(20 + r * 3), &mixed[r]);
        run_all(c);
        struct engine_stats st;
        core_stats(c, &st);
        preemptions += st.preemptions_total;
        for (int r = 0; r < N_REQ; r++) {
            assert_int_equal(mixed[r].n[0], alone[r].n[0]);
            assert_memory_equal(mixed[r].ids[0], alone[r].ids[0], sizeof(int32_t) * alone[r].n[0]);
        }
        /* everything is free at the end, or held by the prefix cache only (free on demand) */
        assert_kv_idle(core_kv(c));
        core_free(c);
    }
    print_message("invariance holds over budgets 7/16/4096/33 and a small pool (%llu preemptions)\n",
                  (unsigned long long)preemptions);
    assert_true(preemptions > 0);
}

static void test_greedy_invariant_alone_batched_chunked_preempted(void **state) { check_invariance(NULL, 0); }

static void test_greedy_invariant_with_duo_pattern(void **state) {
    char *p = write_pattern("0.9\t0.1\n0.2\t0.8\n");
    check_invariance(p, 0.5f);
    unlink(p);
    free(p);
}

/* The same with an fp8 KV cache: its rounding is per element, whatever the batch or the chunk. */
static void test_greedy_invariant_fp8_kv(void **state) {
    char *p = write_pattern("0.9\t0.1\n0.2\t0.8\n");
    kv_dtype = "fp8";
    check_invariance(NULL, 0);
    check_invariance(p, 0.5f);
    kv_dtype = NULL;
    unlink(p);
    free(p);
}

/* A long prompt prefilled beside a decoding request, its chunks sized by cost under three caps
 * (none, the default, a tight one), with and without a head pattern: the steps differ (smaller
 * chunks, more steps, the tighter the cap), the ids of both requests do not. */
static void test_cost_sized_chunks_keep_ids(void **state) {
    char *pat = write_pattern("0.9\t0.1\n0.2\t0.8\n");
    enum { LONG = 600 };
    int32_t shortp[5], longp[LONG];
    for (int i = 0; i < 5; i++) shortp[i] = 3 + i * 41;
    for (int i = 0; i < LONG; i++) longp[i] = 3 + (i * 53 + i / 7) % 500;
    int caps[] = {-1, 0, 8};
    static struct collect out[3][2];
    for (int with = 0; with < 2; with++) {
        int steps[3], most[3];
        memset(out, 0, sizeof out);
        for (int k = 0; k < 3; k++) {
            struct engine_config cfg = {.model_dir = "tests/fixtures/hf/llama3", .max_num_batched_tokens = 64,
                                        .step_cost_budget = caps[k], .max_num_seqs = 8, .block_size = 16,
                                        .duo_pattern = with ? pat : NULL, .duo_sparsity = 0.5f, .sink_tokens = 4,
                                        .recent_tokens = 8, .tensor_parallel_size = test_tp(), .quiet = true};
            struct core *c;
            char err[512] = "";
            assert_int_equal(core_create(&c, &cfg, err, sizeof err), 0);
            submit(c, shortp, 5, greedy(120), &out[k][0]);
            assert_int_equal(core_step(c), 5); /* its prompt: it decodes from now on */
            submit(c, longp, LONG, greedy(8), &out[k][1]);
            steps[k] = most[k] = 0;
            while (out[k][1].n[0] == 0) { /* the long prompt's prefill, beside the decodes */
                int n = core_step(c);
                assert_true(n > 0 && out[k][0].n[0] < 120);
                steps[k]++;
                if (n > most[k]) most[k] = n;
            }
            run_all(c);
            core_free(c);
            for (int r = 0; r < 2; r++) {
                assert_int_equal(out[k][r].n[0], r ? 8 : 120);
                assert_memory_equal(out[k][r].ids[0], out[0][r].ids[0], sizeof(int32_t) * out[0][r].n[0]);
            }
        }
        print_message("%s: prefill of %d tokens beside a decode in %d / %d / %d steps of at most %d / %d / %d "
                      "tokens (no cap, default, cap 8)\n", with ? "pattern" : "full attention", LONG, steps[0],
                      steps[1], steps[2], most[0], most[1], most[2]);
        assert_int_equal(most[0], 64); /* no cap: chunks of the token budget (63 and the decode) */
        assert_true(steps[0] < steps[1] && steps[1] < steps[2]);
        assert_true(most[2] < most[1] && most[1] <= 64);
    }
    unlink(pat);
    free(pat);
}

/* --kv-cache-dtype fp8 end to end, with and without a head pattern: the pools are fp8 (a quarter
 * of f32's bytes: at least 4x the tokens in the same memory), a request runs to the end, and its
 * logprobs are near f32's but not the same. */
static void test_fp8_kv_end_to_end(void **state) {
    char *p = write_pattern("0.9\t0.1\n0.2\t0.8\n");
    int32_t prompt[37];
    for (int i = 0; i < 37; i++) prompt[i] = 3 + (i * 29) % 500;
    for (int with = 0; with < 2; with++) {
        const char *pat = with ? p : NULL;
        static struct collect o32, o8;
        struct core *c[2];
        struct engine_stats st[2];
        for (int k = 0; k < 2; k++) {
            kv_dtype = k ? "fp8_e4m3" : NULL;
            c[k] = make_core("tests/fixtures/hf/llama3", 16, (size_t)1 << 20, pat, 0.5f, 4, 8);
            struct collect *o = k ? &o8 : &o32;
            memset(o, 0, sizeof *o);
            struct engine_sampling sp = greedy(24);
            sp.logprobs = 20;
            submit(c[k], prompt, 37, sp, o);
            run_all(c[k]);
            assert_int_equal(o->n[0], 24);
            core_stats(c[k], &st[k]);
            assert_kv_idle(core_kv(c[k]));
        }
        kv_dtype = NULL;
        assert_string_equal(core_kv_dtype(c[0]), "float32");
        assert_string_equal(core_kv_dtype(c[1]), "fp8_e4m3");
        assert_true(kv_cache_has_stream(core_kv(c[1])) == (pat != NULL));
        int cap32 = st[0].kv_capacity_tokens, cap8 = st[1].kv_capacity_tokens;
        assert_true(cap32 > 0 && cap8 >= 4 * cap32);
        if (!pat) assert_true(cap8 < 4 * cap32 + 4 * 16);
        /* the first token's top-20 logprobs, from the same prompt (matched by id: near ties may swap) */
        float d = 0;
        int matched = 0;
        for (int t = 0; t < 20; t++)
            for (int u = 0; u < 20; u++)
                if (o8.top_ids[0][0][u] == o32.top_ids[0][0][t]) {
                    d = fmaxf(d, fabsf(o8.top_lps[0][0][u] - o32.top_lps[0][0][t]));
                    matched++;
                }
        assert_true(matched >= 15);
        print_message("fp8 KV %s: %d tokens of capacity (f32: %d); first token's top-20 |d logprob| <= %.2e\n",
                      pat ? "with a pattern" : "full attention", cap8, cap32, d);
        assert_true(d > 0 && d < 0.25f);
        core_free(c[0]);
        core_free(c[1]);
    }
    unlink(p);
    free(p);
}

/* --- DuoAttention against a dense reference with explicit per-head masks --- */

struct dense_model {
    int D, F, L, H, KV, hd, V;
    float eps;
    float *emb, *lm, *norm;
    float **attn_norm, **ffn_norm, **wq, **wk, **wv, **wo, **wg, **wu, **wd;
};

static float *tensor_f32(const struct safetensors *st, const char *name) {
    const struct st_tensor *t = safetensors_find(st, name);
    assert_non_null(t);
    float *v = malloc(sizeof(float) * st_tensor_numel(t));
    st_tensor_to_f32(t, 0, st_tensor_numel(t), v);
    return v;
}

static void matvec(float *o, const float *w, const float *x, int n_out, int n_in) {
    for (int r = 0; r < n_out; r++) {
        double s = 0;
        for (int k = 0; k < n_in; k++) s += (double)w[(size_t)r * n_in + k] * x[k];
        o[r] = (float)s;
    }
}

static void rmsnorm_ref(float *o, const float *x, const float *w, int n, float eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float inv = (float)(1.0 / sqrt(ss / n + eps));
    for (int i = 0; i < n; i++) o[i] = w[i] * x[i] * inv;
}

/* Logits at every position of toks[0..T) with head masks mask[l][kvh] = streaming or not; the K
 * and V rows of positions [zero_lo, zero_hi) are zeros (after RoPE) in every layer. */
static float *dense_forward(const struct dense_model *m, const struct model_config *cfg, const int32_t *toks, int T,
                            const uint8_t *streaming, int sink, int recent, int zero_lo, int zero_hi) {
    int D = m->D, hd = m->hd, H = m->H, KV = m->KV, group = H / KV;
    float *x = calloc((size_t)T * D, sizeof(float)), *h = malloc(sizeof(float) * D);
    float *q = malloc(sizeof(float) * (size_t)T * H * hd), *k = malloc(sizeof(float) * (size_t)T * KV * hd);
    float *v = malloc(sizeof(float) * (size_t)T * KV * hd), *att = malloc(sizeof(float) * H * hd);
    float *o = malloc(sizeof(float) * D), *g = malloc(sizeof(float) * m->F), *u = malloc(sizeof(float) * m->F);
    float *sc = malloc(sizeof(float) * T), *inv = malloc(sizeof(float) * hd / 2);
    uint8_t *mask = malloc((size_t)T * T);
    float *logits = malloc(sizeof(float) * (size_t)T * m->V);
    model_rope_inv_freq(cfg, inv);
    for (int t = 0; t < T; t++) memcpy(x + (size_t)t * D, m->emb + (size_t)toks[t] * D, sizeof(float) * D);
    for (int l = 0; l < m->L; l++) {
        for (int t = 0; t < T; t++) {
            rmsnorm_ref(h, x + (size_t)t * D, m->attn_norm[l], D, m->eps);
            matvec(q + (size_t)t * H * hd, m->wq[l], h, H * hd, D);
            matvec(k + (size_t)t * KV * hd, m->wk[l], h, KV * hd, D);
            matvec(v + (size_t)t * KV * hd, m->wv[l], h, KV * hd, D);
            for (int hh = 0; hh < H + KV; hh++) {
                float *vec = hh < H ? q + ((size_t)t * H + hh) * hd : k + ((size_t)t * KV + hh - H) * hd;
                for (int i = 0; i < hd / 2; i++) {
                    float ang = (float)t * inv[i], c = cosf(ang), s = sinf(ang), a = vec[i], b = vec[i + hd / 2];
                    vec[i] = a * c - b * s;
                    vec[i + hd / 2] = b * c + a * s;
                }
            }
        }
        for (int t = zero_lo; t < zero_hi && t < T; t++) {
            memset(k + (size_t)t * KV * hd, 0, sizeof(float) * KV * hd);
            memset(v + (size_t)t * KV * hd, 0, sizeof(float) * KV * hd);
        }
        for (int t = 0; t < T; t++) {
            for (int hh = 0; hh < H; hh++) {
                int kvh = hh / group;
                bool st = streaming && streaming[l * KV + kvh];
                /* the explicit mask row of this head */
                for (int j = 0; j < T; j++) mask[j] = j <= t && (!st || j < sink || t - j < recent);
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j < T; j++) {
                    if (!mask[j]) continue;
                    double d = 0;
                    for (int i = 0; i < hd; i++) d += (double)q[((size_t)t * H + hh) * hd + i] * k[((size_t)j * KV + kvh) * hd + i];
                    sc[j] = (float)(d / sqrt((double)hd));
                    if (sc[j] > mx) mx = sc[j];
                }
                for (int j = 0; j < T; j++)
                    if (mask[j]) sum += exp(sc[j] - mx);
                for (int i = 0; i < hd; i++) {
                    double acc = 0;
                    for (int j = 0; j < T; j++)
                        if (mask[j]) acc += exp(sc[j] - mx) / sum * v[((size_t)j * KV + kvh) * hd + i];
                    att[hh * hd + i] = (float)acc;
                }
            }
            matvec(o, m->wo[l], att, D, H * hd);
            for (int i = 0; i < D; i++) x[(size_t)t * D + i] += o[i];
            rmsnorm_ref(h, x + (size_t)t * D, m->ffn_norm[l], D, m->eps);
            matvec(g, m->wg[l], h, m->F, D);
            matvec(u, m->wu[l], h, m->F, D);
            for (int i = 0; i < m->F; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
            matvec(o, m->wd[l], g, D, m->F);
            for (int i = 0; i < D; i++) x[(size_t)t * D + i] += o[i];
        }
    }
    for (int t = 0; t < T; t++) {
        rmsnorm_ref(h, x + (size_t)t * D, m->norm, D, m->eps);
        matvec(logits + (size_t)t * m->V, m->lm, h, m->V, D);
    }
    free(x), free(h), free(q), free(k), free(v), free(att), free(o), free(g), free(u), free(sc), free(inv), free(mask);
    return logits;
}

static void dense_load(struct dense_model *m, const char *dir, struct model_config *cfg) {
    char err[256];
    assert_int_equal(model_config_load(cfg, dir, err, sizeof err), 0);
    struct safetensors *st;
    assert_int_equal(safetensors_open_dir(&st, dir, err, sizeof err), 0);
    m->D = cfg->dim, m->F = cfg->hidden_dim, m->L = cfg->n_layers, m->H = cfg->n_heads, m->KV = cfg->n_kv_heads;
    m->hd = cfg->head_dim, m->V = cfg->vocab_size, m->eps = cfg->norm_eps;
    m->emb = tensor_f32(st, "model.embed_tokens.weight");
    m->lm = cfg->tie_embeddings ? m->emb : tensor_f32(st, "lm_head.weight");
    m->norm = tensor_f32(st, "model.norm.weight");
    float ***arrs[] = {&m->attn_norm, &m->ffn_norm, &m->wq, &m->wk, &m->wv, &m->wo, &m->wg, &m->wu, &m->wd};
    const char *names[] = {"input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
                           "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"};
    for (int a = 0; a < 9; a++) {
        *arrs[a] = malloc(sizeof(float *) * m->L);
        for (int l = 0; l < m->L; l++) {
            char n[128];
            snprintf(n, sizeof n, "model.layers.%d.%s.weight", l, names[a]);
            (*arrs[a])[l] = tensor_f32(st, n);
        }
    }
    safetensors_free(st);
}

static void dense_free(struct dense_model *m) {
    float **arrs[] = {m->attn_norm, m->ffn_norm, m->wq, m->wk, m->wv, m->wo, m->wg, m->wu, m->wd};
    for (int a = 0; a < 9; a++) {
        for (int l = 0; l < m->L; l++) free(arrs[a][l]);
        free(arrs[a]);
    }
    if (m->lm != m->emb) free(m->lm);
    free(m->emb);
    free(m->norm);
}

static void test_duo_attention_equals_dense_mask_reference(void **state) {
    const char *dir = "tests/fixtures/hf/llama3"; /* no biases: the dense reference needs none */
    struct dense_model dm;
    struct model_config cfg;
    dense_load(&dm, dir, &cfg);
    char *pat = write_pattern("0.9\t0.1\n0.2\t0.8\n");
    struct duo_pattern_case {
        float sparsity;
        int sink, recent;
    } cases[] = {{0.5f, 4, 8}, {0.5f, 1, 3}, {1.0f, 16, 16}, {0.25f, 2, 30}};
    int32_t prompt[90];
    for (int i = 0; i < 90; i++) prompt[i] = 3 + (i * 53) % 500;
    float worst = 0;
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        struct core *c = make_core(dir, 16, 0, pat, cases[k].sparsity, cases[k].sink, cases[k].recent);
        static struct collect out;
        memset(&out, 0, sizeof out);
        struct engine_sampling sp = greedy(12);
        sp.logprobs = 20;
        submit(c, prompt, 90, sp, &out);
        run_all(c);
        assert_int_equal(out.n[0], 12);
        /* the reference's streaming mask, in checkpoint head order */
        struct duo_pattern p;
        char err[128];
        assert_int_equal(duo_pattern_load(&p, pat, err, sizeof err), 0);
        uint8_t streaming[4];
        int n_stream = duo_pattern_streaming(&p, cases[k].sparsity, streaming);
        duo_pattern_free(&p);
        assert_true(n_stream >= 1);
        int32_t toks[90 + 12];
        memcpy(toks, prompt, sizeof prompt);
        memcpy(toks + 90, out.ids[0], sizeof(int32_t) * 11);
        float *ref = dense_forward(&dm, &cfg, toks, 101, streaming, cases[k].sink, cases[k].recent, 0, 0);
        float *lp = malloc(sizeof(float) * dm.V);
        /* the masks matter: full attention gives visibly different logits here */
        float *full = dense_forward(&dm, &cfg, toks, 101, NULL, 0, 0, 0, 0);
        float diff = 0;
        for (int i = 0; i < dm.V; i++) diff = fmaxf(diff, fabsf(full[(size_t)100 * dm.V + i] - ref[(size_t)100 * dm.V + i]));
        assert_true(diff > 1e-2f);
        free(full);
        for (int g = 0; g < 12; g++) {
            sampler_log_softmax(ref + (size_t)(89 + g) * dm.V, dm.V, lp);
            assert_int_equal(out.ids[0][g], sampler_argmax(lp, dm.V));
            float d = fabsf(out.lps[0][g] - lp[out.ids[0][g]]);
            for (int t = 0; t < 20; t++) {
                float dt = fabsf(out.top_lps[0][g][t] - lp[out.top_ids[0][g][t]]);
                d = dt > d ? dt : d;
            }
            worst = d > worst ? d : worst;
            assert_true(d <= 1e-5f);
        }
        free(lp);
        free(ref);
        core_free(c);
    }
    print_message("DuoAttention matches the dense-mask reference: max |dlogprob| %.2e (tolerance 1e-5)\n", worst);
    unlink(pat);
    free(pat);
    dense_free(&dm);
}

/* The benchmark's context without a prefill (engine/core_bench.h): in a fresh pool the skipped
 * positions read as zero K/V rows, so every token after them is the dense reference's over the same
 * tokens with those rows zeroed (full attention, and a pattern with the prompt within the sinks,
 * so no ring row was written before the skip); the blocks they take; max_model_len past the
 * model's; and the refusals (prefix caching on, a pool too small), after which the request goes
 * on as before. */
static struct core *skip_core(const char *pattern, size_t kv_bytes, bool caching) {
    struct engine_config cfg = {.model_dir = "tests/fixtures/hf/llama3", .max_num_batched_tokens = 64,
                                .max_num_seqs = 4, .kv_cache_memory = kv_bytes, .block_size = 16,
                                .duo_pattern = pattern, .duo_sparsity = 0.5f, .sink_tokens = 4, .recent_tokens = 8,
                                .tensor_parallel_size = test_tp(), .no_prefix_caching = !caching, .quiet = true};
    struct core *c;
    char err[512] = "";
    int rc = core_create(&c, &cfg, err, sizeof err);
    if (rc) print_error("core_create: %s\n", err);
    assert_int_equal(rc, 0);
    return c;
}

static void test_bench_skip_context_reads_zero_rows(void **state) {
    struct dense_model dm;
    struct model_config mcfg;
    dense_load(&dm, "tests/fixtures/hf/llama3", &mcfg);
    char *pat = write_pattern("0.9\t0.1\n0.2\t0.8\n");
    const int32_t prompt[3] = {17, 230, 411};
    enum { SKIP = 150, GEN = 8 };
    char err[256];
    float worst = 0;
    for (int k = 0; k < 2; k++) {
        struct core *c = skip_core(k ? pat : NULL, 0, false);
        static struct collect out;
        memset(&out, 0, sizeof out);
        struct engine_sampling sp = greedy(GEN);
        sp.logprobs = 20;
        submit(c, prompt, 3, sp, &out);
        assert_int_equal(core_step(c), 3); /* the prompt, and the first token */
        struct kv_cache_usage u0, u1;
        kv_cache_usage(core_kv(c), &u0);
        assert_int_equal(core_bench_skip_context(c, SKIP, err, sizeof err), 1);
        kv_cache_usage(core_kv(c), &u1);
        assert_int_equal(u0.n_free_blocks - u1.n_free_blocks, (3 + SKIP + 15) / 16 - 1); /* [0, 3 + SKIP) */
        run_all(c);
        assert_int_equal(out.n[0], GEN);
        /* the reference: the prompt, SKIP tokens with zero K/V rows, then the generated ones */
        int T = 3 + SKIP + GEN - 1;
        int32_t toks[3 + SKIP + GEN];
        memcpy(toks, prompt, sizeof prompt);
        for (int i = 0; i < SKIP; i++) toks[3 + i] = 99;
        memcpy(toks + 3 + SKIP, out.ids[0], sizeof(int32_t) * (GEN - 1));
        uint8_t streaming[4] = {0};
        if (k) {
            struct duo_pattern p;
            assert_int_equal(duo_pattern_load(&p, pat, err, sizeof err), 0);
            assert_true(duo_pattern_streaming(&p, 0.5f, streaming) >= 1);
            duo_pattern_free(&p);
        }
        float *ref = dense_forward(&dm, &mcfg, toks, T, k ? streaming : NULL, 4, 8, 3, 3 + SKIP);
        float *lp = malloc(sizeof(float) * dm.V);
        for (int g = 0; g < GEN; g++) { /* token g comes from the logits of the position before it */
            int row = g == 0 ? 2 : 2 + SKIP + g;
            sampler_log_softmax(ref + (size_t)row * dm.V, dm.V, lp);
            assert_int_equal(out.ids[0][g], sampler_argmax(lp, dm.V));
            for (int t = 0; t < 20; t++) worst = fmaxf(worst, fabsf(out.top_lps[0][g][t] - lp[out.top_ids[0][g][t]]));
        }
        assert_true(worst <= 1e-5f);
        free(lp);
        free(ref);
        core_free(c);
    }
    /* past the model's max_position_embeddings (2048): the request is not cut short */
    struct core *c = skip_core(pat, 0, false);
    static struct collect out;
    memset(&out, 0, sizeof out);
    submit(c, prompt, 3, greedy(GEN), &out);
    assert_int_equal(core_step(c), 3);
    assert_int_equal(core_bench_skip_context(c, 3000, err, sizeof err), 1);
    run_all(c);
    assert_int_equal(out.n[0], GEN);
    core_free(c);
    /* refused: with prefix caching, and past a pool of 30 blocks; the request then goes on */
    for (int k = 0; k < 2; k++) {
        c = skip_core(NULL, k ? 30 * 8192 : 0, !k);
        memset(&out, 0, sizeof out);
        submit(c, prompt, 3, greedy(GEN), &out);
        assert_int_equal(core_step(c), 3);
        struct kv_cache_usage u0, u1;
        kv_cache_usage(core_kv(c), &u0);
        assert_int_equal(core_bench_skip_context(c, 1000, err, sizeof err), -1);
        assert_non_null(strstr(err, k ? "free blocks" : "prefix caching"));
        kv_cache_usage(core_kv(c), &u1);
        assert_int_equal(u0.n_free_blocks, u1.n_free_blocks);
        run_all(c);
        assert_int_equal(out.n[0], GEN);
        core_free(c);
    }
    print_message("skipped context reads as zero K/V rows: max |dlogprob| %.2e (tolerance 1e-5)\n", worst);
    unlink(pat);
    free(pat);
    dense_free(&dm);
}

/* Sparsity 0 makes no head streaming: bit-identical to running without a pattern. */
static void test_duo_sparsity_zero_equals_no_pattern(void **state) {
    char *pat = write_pattern("0.9\t0.1\n0.2\t0.8\n");
    int32_t prompt[70];
    for (int i = 0; i < 70; i++) prompt[i] = 3 + (i * 7) % 500;
    static struct collect a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    struct engine_sampling sp = greedy(16);
    sp.logprobs = 5;
    struct core *c1 = make_core("tests/fixtures/hf/llama3", 32, 0, NULL, 0, 4, 8);
    submit(c1, prompt, 70, sp, &a);
    run_all(c1);
    struct core *c2 = make_core("tests/fixtures/hf/llama3", 32, 0, pat, 0.0f, 4, 8);
    submit(c2, prompt, 70, sp, &b);
    run_all(c2);
    assert_false(kv_cache_has_stream(core_kv(c2)));
    assert_memory_equal(a.ids, b.ids, sizeof a.ids);
    assert_memory_equal(a.lps, b.lps, sizeof a.lps);
    assert_memory_equal(a.top_lps, b.top_lps, sizeof a.top_lps);
    core_free(c1);
    core_free(c2);
    unlink(pat);
    free(pat);
}

/* Random admissions (n up to 3), growth, preemption and cancellations on a tiny pool: no block
 * or slot leaks or is freed twice (kv_cache asserts on double frees); all free at the end. */
static void test_allocator_random_workload_never_leaks(void **state) {
    char *pat = write_pattern("0.9\t0.1\n0.2\t0.8\n");
    struct util_rng rng;
    util_rng_seed(&rng, 42);
    for (int round = 0; round < 3; round++) {
        struct core *c = make_core("tests/fixtures/hf/llama3", 24 + round * 20, 8 * 16384 + 32 * 9216, round == 1 ? NULL : pat,
                                   0.5f, 4, 8);
        enum { NR = 40 };
        static struct collect outs[NR];
        memset(outs, 0, sizeof outs);
        struct core_request *reqs[NR] = {0};
        int32_t prompt[60];
        for (int r = 0; r < NR; r++) {
            int len = 1 + (int)(util_rng_next(&rng) % 60);
            for (int i = 0; i < len; i++) prompt[i] = 3 + (int)(util_rng_next(&rng) % 500);
            struct engine_sampling sp = greedy(1 + (int)(util_rng_next(&rng) % 30));
            sp.n = 1 + (int)(util_rng_next(&rng) % 3);
            sp.temperature = 0.8f;
            struct engine_request req = {prompt, len, sp};
            char err[256];
            assert_int_equal(core_add(c, &req, collect_emit, &outs[r], &reqs[r], err, sizeof err), ENGINE_OK);
            /* a few steps between admissions, sometimes a cancellation of an unfinished one */
            int steps = (int)(util_rng_next(&rng) % 4);
            for (int s = 0; s < steps; s++) assert_true(core_step(c) >= 0);
            int victim = (int)(util_rng_next(&rng) % (r + 1));
            if (util_rng_next(&rng) % 5 == 0 && outs[victim].n_finished < MAXC && reqs[victim] &&
                outs[victim].n_finished == 0) {
                core_abort(c, reqs[victim]);
                reqs[victim] = NULL;
            }
            const struct kv_cache *kv = core_kv(c);
            assert_true(kv->n_free_blocks >= 0 && kv->n_free_blocks <= kv->n_blocks);
            /* reference counts never exceed the choices that could share a block */
            for (int b = 0; b < kv->n_blocks; b++) assert_true(kv->ref[b] >= 0 && kv->ref[b] <= 3 * NR);
        }
        run_all(c);
        assert_kv_idle(core_kv(c));
        for (int r = 0; r < NR; r++) assert_true(outs[r].n_finished >= 1);
        core_free(c);
    }
    unlink(pat);
    free(pat);
}

/* Seeds reproduce; n = 3 with a seed gives three distinct, reproducible choices. */
static void test_seeded_sampling_reproducible_and_choices_distinct(void **state) {
    int32_t prompt[5] = {1, 50, 60, 70, 80};
    static struct collect a, b;
    for (int rep = 0; rep < 2; rep++) {
        struct collect *o = rep ? &b : &a;
        memset(o, 0, sizeof *o);
        struct core *c = make_core("tests/fixtures/hf/qwen2", 64, 0, NULL, 0, 4, 8);
        struct engine_sampling sp = greedy(24);
        sp.temperature = 1.0f;
        sp.top_p = 0.95f;
        sp.top_k = 50;
        sp.has_seed = true;
        sp.seed = 1234;
        sp.n = 3;
        submit(c, prompt, 5, sp, o);
        run_all(c);
        core_free(c);
    }
    assert_memory_equal(a.ids, b.ids, sizeof a.ids);
    for (int k = 0; k < 3; k++) assert_int_equal(a.n[k], 24);
    assert_true(memcmp(a.ids[0], a.ids[1], sizeof(int32_t) * 24) != 0);
    assert_true(memcmp(a.ids[1], a.ids[2], sizeof(int32_t) * 24) != 0);
    assert_true(memcmp(a.ids[0], a.ids[2], sizeof(int32_t) * 24) != 0);
}

/* n > 1 shares the prompt's blocks: after the fork the pool holds one copy of the prompt. */
static void test_n_choices_share_prompt_blocks(void **state) {
    struct core *c = make_core("tests/fixtures/hf/qwen2", 4096, 0, NULL, 0, 4, 8);
    int32_t prompt[100];
    for (int i = 0; i < 100; i++) prompt[i] = 3 + i;
    static struct collect o;
    memset(&o, 0, sizeof o);
    struct engine_sampling sp = greedy(8);
    sp.n = 4;
    submit(c, prompt, 100, sp, &o);
    assert_true(core_step(c) == 100); /* prefill, fork, first tokens */
    const struct kv_cache *kv = core_kv(c);
    int used = kv->n_blocks - kv->n_free_blocks;
    assert_int_equal(used, 7);              /* ceil(100 / 16) blocks, shared by 4 choices */
    assert_int_equal(kv->ref[0], 4);
    assert_true(core_step(c) == 4);         /* 4 decodes: the shared partial block is copied 3 times */
    assert_int_equal(kv->n_blocks - kv->n_free_blocks, 7 + 3);
    run_all(c);
    for (int k = 0; k < 4; k++) assert_int_equal(o.n[k], 8);
    /* greedy: every choice is the same continuation */
    for (int k = 1; k < 4; k++) assert_memory_equal(o.ids[0], o.ids[k], sizeof(int32_t) * 8);
    assert_kv_idle(kv);
    core_free(c);
}

static struct core *stories_core(char *dir, size_t n) {
    if (test_shared_path(dir, n, "models/stories260k/tokenizer.json") != 0) return NULL;
    snprintf(dir, n, "%s/models/stories260k", test_shared_dir());
    return make_core(dir, 64, 0, NULL, 0, 4, 8);
}

/* The trained model through the engine: golden ids, and the streamed text is a prefix of
 * llama2.c's own expected text. */
static void test_stories260k_engine_golden_ids_and_text(void **state) {
    char dir[1024], exp_path[1024], txt_path[1024];
    TEST_REQUIRE_SHARED(exp_path, "models/stories260k/expected_greedy_ids.json");
    TEST_REQUIRE_SHARED(txt_path, "models/stories260k/expected_greedy.txt");
    struct core *c = stories_core(dir, sizeof dir);
    char *text;
    assert_int_equal(util_read_file(exp_path, &text, NULL), 0);
    cJSON *exp = cJSON_Parse(text);
    free(text);
    const cJSON *g = cJSON_GetObjectItem(exp, "greedy_ids");
    static struct collect o;
    memset(&o, 0, sizeof o);
    int32_t bos = 1;
    submit(c, &bos, 1, greedy(199), &o);
    run_all(c);
    assert_int_equal(o.n[0], 199);
    for (int i = 0; i < 199; i++) assert_int_equal(o.ids[0][i], (int)cJSON_GetArrayItem(g, i)->valuedouble);
    assert_int_equal(util_read_file(txt_path, &text, NULL), 0);
    assert_true(o.text_len[0] > 100);
    assert_memory_equal(text, o.text[0], o.text_len[0]);
    free(text);
    cJSON_Delete(exp);
    core_free(c);
}

/* Stop strings are found across token boundaries and cut from the output (or kept). */
static void test_stop_string_straddling_tokens(void **state) {
    char dir[1024];
    TEST_REQUIRE_SHARED(dir, "models/stories260k/tokenizer.json");
    struct core *c = stories_core(dir, sizeof dir);
    int32_t bos = 1;
    static struct collect full, cut, kept;
    memset(&full, 0, sizeof full);
    submit(c, &bos, 1, greedy(60), &full);
    run_all(c);
    /* "e girl na": spans several tokens of "little girl named" */
    const char *stop = "e girl na";
    const char *at = strstr(full.text[0], stop);
    assert_non_null(at);
    size_t cut_len = (size_t)(at - full.text[0]);
    char *stops[1] = {(char *)stop};
    for (int keep = 0; keep < 2; keep++) {
        struct collect *o = keep ? &kept : &cut;
        memset(o, 0, sizeof *o);
        struct engine_sampling sp = greedy(60);
        sp.n_stop = 1;
        sp.stop = stops;
        sp.include_stop_str_in_output = keep;
        submit(c, &bos, 1, sp, o);
        run_all(c);
        assert_int_equal(o->finish[0], ENGINE_FINISH_STOP);
        size_t want = cut_len + (keep ? strlen(stop) : 0);
        assert_int_equal(o->text_len[0], want);
        assert_memory_equal(o->text[0], full.text[0], want);
        assert_true(o->n[0] < 60);
    }
    core_free(c);
}

/* decode(prompt + ids) less decode(prompt), both without special tokens (malloc'd). */
static char *text_after(const struct tokenizer *t, const int32_t *prompt, int np, const int32_t *ids, int n) {
    int32_t all[MAXG + 64];
    assert_true(np + n <= (int)(sizeof all / sizeof all[0]));
    memcpy(all, prompt, sizeof *prompt * (size_t)np);
    memcpy(all + np, ids, sizeof *ids * (size_t)n);
    char *pre, *full;
    size_t pl, fl;
    assert_int_equal(tokenizer_decode(t, prompt, (size_t)np, true, &pre, &pl), 0);
    assert_int_equal(tokenizer_decode(t, all, (size_t)(np + n), true, &full, &fl), 0);
    assert_true(fl >= pl && !memcmp(full, pre, pl));
    memmove(full, full + pl, fl - pl + 1);
    free(pre);
    return full;
}

/* A prompt that ends in byte tokens (CJK on a Llama-2 vocabulary): the output is the generated
 * tokens' text only. Each token's text sits where token_text_at says, also when a stop string's
 * possible start was held back before it; only the first token after a BOS-only prompt begins
 * the text. */
static void test_text_is_the_completion_and_tokens_are_placed(void **state) {
    char dir[1024];
    TEST_REQUIRE_SHARED(dir, "models/stories260k/tokenizer.json");
    struct core *c = stories_core(dir, sizeof dir);
    const struct tokenizer *tok = core_tokenizer(c);
    int32_t *prompt;
    size_t np;
    const char *text = "Lily saw a 日本";
    assert_int_equal(tokenizer_encode(tok, text, strlen(text), true, &prompt, &np), 0);
    assert_true(prompt[np - 1] == 3 + 0xAC); // the last byte of 本
    static struct collect o;
    memset(&o, 0, sizeof o);
    submit(c, prompt, (int)np, greedy(12), &o);
    run_all(c);
    char *want = text_after(tok, prompt, (int)np, o.ids[0], o.n[0]);
    assert_string_equal(o.text[0], want);
    assert_null(strstr(o.text[0], "日本"));
    assert_false(o.text_start[0][0]);
    free(want);
    free(prompt);

    char *stops[1] = {"Lily X"}; // " Lily" is held back until the next token shows no stop follows
    struct engine_sampling sp = greedy(40);
    sp.n_stop = 1;
    sp.stop = stops;
    int32_t bos = 1;
    memset(&o, 0, sizeof o);
    submit(c, &bos, 1, sp, &o);
    run_all(c);
    assert_non_null(strstr(o.text[0], "Lily."));
    for (int i = 0; i < o.n[0]; i++) {
        char *before = text_after(tok, &bos, 1, o.ids[0], i);
        assert_int_equal(o.at[0][i], utf8_count(before, strlen(before)));
        assert_int_equal(o.text_start[0][i], i == 0);
        free(before);
    }
    core_free(c);
}

/* EOS forced by logit_bias: stops at once; min_tokens holds it off (vLLM masks it); ignore_eos
 * runs to max_tokens. */
static void test_min_tokens_and_ignore_eos(void **state) {
    char dir[1024];
    TEST_REQUIRE_SHARED(dir, "models/stories260k/tokenizer.json");
    struct core *c = stories_core(dir, sizeof dir);
    int32_t bos = 1, eos = 2;
    float big = 100.0f;
    static struct collect o;
    struct engine_sampling sp = greedy(20);
    sp.ignore_eos = false;
    sp.n_logit_bias = 1;
    sp.logit_bias_ids = &eos;
    sp.logit_bias_vals = &big;
    memset(&o, 0, sizeof o);
    submit(c, &bos, 1, sp, &o);
    run_all(c);
    assert_int_equal(o.finish[0], ENGINE_FINISH_STOP);
    assert_int_equal(o.n[0], 1);
    assert_int_equal(o.ids[0][0], 2);

    sp.min_tokens = 5;
    memset(&o, 0, sizeof o);
    submit(c, &bos, 1, sp, &o);
    run_all(c);
    assert_int_equal(o.finish[0], ENGINE_FINISH_STOP);
    assert_int_equal(o.n[0], 6);
    for (int i = 0; i < 5; i++) assert_int_not_equal(o.ids[0][i], 2);
    assert_int_equal(o.ids[0][5], 2);
    assert_int_equal(o.completion_tokens[0], 6);

    sp.min_tokens = 0;
    sp.ignore_eos = true;
    memset(&o, 0, sizeof o);
    submit(c, &bos, 1, sp, &o);
    run_all(c);
    assert_int_equal(o.finish[0], ENGINE_FINISH_LENGTH);
    assert_int_equal(o.n[0], 20);
    assert_int_equal(o.ids[0][3], 2);
    core_free(c);
}

/* Requests that can never fit are refused up front; bad parameters are refused. */
static void test_requests_that_cannot_fit_are_rejected(void **state) {
    struct core *c = make_core("tests/fixtures/hf/qwen2", 64, 0, NULL, 0, 4, 8);
    int32_t p[3] = {1, 2, 3}, bad[2] = {1, 512};
    struct engine_request r = {p, 3, greedy(2046)};
    char err[512];
    assert_int_equal(core_add(c, &r, collect_emit, NULL, NULL, err, sizeof err), ENGINE_ERR_TOO_LONG);
    assert_non_null(strstr(err, "maximum context length is 2048"));
    struct engine_request r2 = {bad, 2, greedy(4)};
    assert_int_equal(core_add(c, &r2, collect_emit, NULL, NULL, err, sizeof err), ENGINE_ERR_INVALID);
    assert_non_null(strstr(err, "outside the vocabulary"));
    struct engine_request r3 = {p, 3, greedy(4)};
    r3.sp.temperature = NAN;
    assert_int_equal(core_add(c, &r3, collect_emit, NULL, NULL, err, sizeof err), ENGINE_ERR_INVALID);
    assert_false(core_has_work(c));
    core_free(c);
}

/* Seats and slots promised to a parent's forks are not given to later requests: running
 * sequences never exceed max_num_seqs (the batch arrays' size), with or without streaming slots. */
static void test_forks_keep_their_reserved_seats(void **state) {
    char *pat = write_pattern("0.9\t0.1\n0.2\t0.8\n");
    for (int with_pattern = 0; with_pattern < 2; with_pattern++) {
        struct engine_config cfg = {.model_dir = "tests/fixtures/hf/llama3", .max_num_batched_tokens = 16,
                                    .max_num_seqs = 4, .block_size = 16, .duo_pattern = with_pattern ? pat : NULL,
                                    .duo_sparsity = 0.5f, .sink_tokens = 4, .recent_tokens = 8,
                                    .tensor_parallel_size = test_tp(), .quiet = true};
        struct core *c;
        char err[256];
        assert_int_equal(core_create(&c, &cfg, err, sizeof err), 0);
        static struct collect a, b2;
        memset(&a, 0, sizeof a);
        memset(&b2, 0, sizeof b2);
        int32_t prompt[40];
        for (int i = 0; i < 40; i++) prompt[i] = 5 + i;
        struct engine_sampling sp = greedy(6);
        sp.n = 4;
        submit(c, prompt, 40, sp, &a);
        submit(c, prompt, 10, greedy(6), &b2);
        for (int guard = 0; core_has_work(c) && guard < 1000; guard++) {
            assert_true(core_step(c) >= 0);
            struct engine_stats st;
            core_stats(c, &st);
            assert_true(st.num_running <= 4);
        }
        for (int k = 0; k < 4; k++) assert_int_equal(a.n[k], 6);
        assert_int_equal(b2.n[0], 6);
        assert_kv_idle(core_kv(c));
        core_free(c);
    }
    unlink(pat);
    free(pat);
}

/* The sample op (logits left in backend memory) and the host path (logprobs requested: the
 * logits come to the host) draw the same tokens for a seed, with every stage of the pipeline
 * on, n = 3 forks drawing from one row, and a plain greedy request batched with them. */
static void test_sample_op_matches_host_path(void **state) {
    int32_t prompt[6] = {1, 50, 60, 70, 80, 50};
    static struct collect a[2], g[2];
    int32_t bias_id = 60;
    float bias_val = 2.0f;
    for (int rep = 0; rep < 2; rep++) {
        memset(&a[rep], 0, sizeof a[rep]);
        memset(&g[rep], 0, sizeof g[rep]);
        struct core *c = make_core("tests/fixtures/hf/qwen2", 64, 0, NULL, 0, 4, 8);
        struct engine_sampling sp = greedy(20);
        sp.temperature = 0.9f;
        sp.top_p = 0.9f;
        sp.top_k = 40;
        sp.min_p = 0.02f;
        sp.presence_penalty = 0.4f;
        sp.frequency_penalty = 0.3f;
        sp.repetition_penalty = 1.2f;
        sp.n_logit_bias = 1;
        sp.logit_bias_ids = &bias_id;
        sp.logit_bias_vals = &bias_val;
        sp.min_tokens = 5;
        sp.has_seed = true;
        sp.seed = 99;
        sp.n = 3;
        sp.logprobs = rep ? 0 : -1;
        submit(c, prompt, 6, sp, &a[rep]);
        submit(c, prompt, 6, greedy(20), &g[rep]);
        run_all(c);
        core_free(c);
    }
    assert_memory_equal(a[0].ids, a[1].ids, sizeof a[0].ids);
    assert_memory_equal(g[0].ids, g[1].ids, sizeof g[0].ids);
    for (int k = 0; k < 3; k++) assert_int_equal(a[0].n[k], 20);
    assert_true(memcmp(a[0].ids[0], a[0].ids[1], sizeof(int32_t) * 20) != 0);
}

/* A temperature too small to divide by is greedy, not the last token of the vocabulary. */
static void test_tiny_temperature_is_greedy(void **state) {
    struct core *c = make_core("tests/fixtures/hf/qwen2", 64, 0, NULL, 0, 4, 8);
    int32_t prompt[5] = {1, 50, 60, 70, 80};
    static struct collect g, t;
    memset(&g, 0, sizeof g);
    memset(&t, 0, sizeof t);
    submit(c, prompt, 5, greedy(10), &g);
    struct engine_sampling sp = greedy(10);
    sp.temperature = 1e-39f;
    sp.has_seed = true;
    submit(c, prompt, 5, sp, &t);
    run_all(c);
    assert_memory_equal(g.ids[0], t.ids[0], sizeof(int32_t) * 10);
    core_free(c);
}

int main(void) {
    if (test_tp() > 1) print_message("engine tests with tensor parallelism over %d ranks\n", test_tp());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_invariant_alone_batched_chunked_preempted),
        cmocka_unit_test(test_greedy_invariant_with_duo_pattern),
        cmocka_unit_test(test_greedy_invariant_fp8_kv),
        cmocka_unit_test(test_cost_sized_chunks_keep_ids),
        cmocka_unit_test(test_fp8_kv_end_to_end),
        cmocka_unit_test(test_duo_attention_equals_dense_mask_reference),
        cmocka_unit_test(test_duo_sparsity_zero_equals_no_pattern),
        cmocka_unit_test(test_bench_skip_context_reads_zero_rows),
        cmocka_unit_test(test_allocator_random_workload_never_leaks),
        cmocka_unit_test(test_seeded_sampling_reproducible_and_choices_distinct),
        cmocka_unit_test(test_n_choices_share_prompt_blocks),
        cmocka_unit_test(test_stories260k_engine_golden_ids_and_text),
        cmocka_unit_test(test_stop_string_straddling_tokens),
        cmocka_unit_test(test_text_is_the_completion_and_tokens_are_placed),
        cmocka_unit_test(test_min_tokens_and_ignore_eos),
        cmocka_unit_test(test_requests_that_cannot_fit_are_rejected),
        cmocka_unit_test(test_forks_keep_their_reserved_seats),
        cmocka_unit_test(test_tiny_temperature_is_greedy),
        cmocka_unit_test(test_sample_op_matches_host_path),
    };
    return cmocka_run_group_tests_name("engine", tests, NULL, NULL);
}
