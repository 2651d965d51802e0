/* Attention over fp8 (e4m3) and bf16 KV pools (engine/backend_cpu.c):
 * - the attention op over an fp8 pool with per-head scales (saturating and subnormal values
 *   included), two sequences in chunks and decode steps, retrieval and streaming heads, with and
 *   without a sliding window, gives bit for bit what the same op over f32 pools gives when its K/V
 *   inputs are the rounded values (e4m3(x / scale) * scale), and its pools hold exactly those
 *   values; the same for bf16;
 * - a model's fp8 pools (tests/fixtures/hf, head pattern and biases) hold e4m3 of what the f32
 *   model's pools hold where their inputs agree (layer 0), and its logprobs stay near f32's. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdbool.h>

#include "tests/test_common.h"

#include "engine/backend.h"
#include "engine/fp8.h"
#include "engine/kv_cache_impl.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "engine/util.h"

/* ---- the op ---- */

#define H 8
#define KV 4
#define NF 2 /* retrieval heads; KV - NF streaming */
#define HD 16
#define BS 16
#define SINK 4
#define RECENT 8
#define NSEQ 2
#define NBLK 13 /* sequence 0: blocks 0..9 (150 tokens), sequence 1: 10..12 (40) */
#define ROW ((H + 2 * KV) * HD)
#define NSTEP 52

static const int seq_len[NSEQ] = {150, 40};
static const float k_scale[KV] = {1.0f, 0.0625f, 3.7f, 0.25f}, v_scale[KV] = {0.5f, 1.0f, 0.0625f, 2.3f};

/* Tokens of each sequence in step k: two prefill chunks, then sequence 0 decodes alone. */
static int chunk(int k, int s) {
    static const int first[2][NSEQ] = {{37, 10}, {63, 30}};
    return k < 2 ? first[k][s] : s == 0 ? 1 : 0;
}

static uint64_t rng_next(uint64_t *s) { /* xorshift64* */
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545f4914f6cdd1dull;
}

static float uniform(uint64_t *s) { return (float)(rng_next(s) >> 40) * 0x1p-24f; }

/* q, k and v of every position of both sequences: q near 1, k and v over 2^-9 .. 2^4 so that the
 * scales push some of them past 448 (saturated) and some below 2^-6 (subnormal). */
static void make_inputs(float *in) {
    uint64_t st = 0x243f6a8885a308d3ull;
    for (int s = 0; s < NSEQ; s++)
        for (int p = 0; p < seq_len[s]; p++) {
            float *r = in + ((size_t)s * 150 + p) * ROW;
            for (int i = 0; i < ROW; i++) {
                float sign = uniform(&st) < 0.5f ? -1.0f : 1.0f;
                r[i] = i < H * HD ? sign * (0.25f + uniform(&st)) : sign * ldexpf(1.0f + uniform(&st), (int)(uniform(&st) * 14) - 9);
            }
        }
}

/* x as a pool of dtype dt holds it (head kvh's scale for fp8) */
static float rounded(enum kv_dtype dt, float x, float scale) {
    if (dt == KV_DTYPE_FP8_E4M3) return fp8_e4m3_to_f32(fp8_e4m3_from_f32(x / scale)) * scale;
    if (dt == KV_DTYPE_BF16) return util_bf16_to_f32(util_f32_to_bf16(x));
    return x;
}

struct inst {
    enum kv_dtype dt;
    size_t es;
    void *kf, *vf, *ks, *vs;
    float *out; // [NSTEP][T of the step][H * HD]
};

static size_t full_elems(void) { return (size_t)NBLK * BS * NF * HD; }
static size_t stream_elems(void) { return (size_t)NSEQ * (SINK + RECENT) * (KV - NF) * HD; }

/* Runs every step through the CPU attention op over pools of dtype dt; with round_inputs the
 * batch's K/V are first rounded as a dt pool would hold them (the f32 reference on rounded values). */
static void run_op(struct inst *in, enum kv_dtype pool_dt, enum kv_dtype round_dt, int window, const float *inputs) {
    struct backend *b = backend_cpu_create();
    in->dt = pool_dt;
    in->es = pool_dt == KV_DTYPE_FP8_E4M3 ? 1 : pool_dt == KV_DTYPE_BF16 ? 2 : 4;
    in->kf = calloc(full_elems(), in->es), in->vf = calloc(full_elems(), in->es);
    in->ks = calloc(stream_elems(), in->es), in->vs = calloc(stream_elems(), in->es);
    in->out = calloc((size_t)(150 + 40) * H * HD, sizeof(float));
    int32_t blocks[NBLK], indptr[NSEQ + 1] = {0, 10, 13}, slots[NSEQ] = {0, 1};
    for (int i = 0; i < NBLK; i++) blocks[i] = i;
    struct attn_layer L = {.n_heads = H, .n_kv_heads = KV, .head_dim = HD, .n_full = NF, .n_stream = KV - NF,
                           .block_size = BS, .sink = SINK, .recent = RECENT, .sliding_window = window,
                           .scale = 0.25f, .k_full = in->kf, .v_full = in->vf, .k_stream = in->ks, .v_stream = in->vs,
                           .kv_dtype = pool_dt, .k_scale = k_scale, .v_scale = v_scale};
    int done[NSEQ] = {0}, out_row = 0;
    float *qkv = malloc(sizeof(float) * 100 * ROW), *att = malloc(sizeof(float) * 100 * H * HD);
    int32_t toks[100] = {0}, pos[100], seq_start[NSEQ + 1];
    for (int k = 0; k < NSTEP; k++) {
        int T = 0, S = 0;
        int32_t bind[NSEQ + 1], bids[NBLK], sl[NSEQ];
        bind[0] = 0;
        seq_start[0] = 0;
        for (int s = 0; s < NSEQ; s++) {
            int n = chunk(k, s);
            if (!n) continue;
            for (int i = 0; i < n; i++, T++) {
                pos[T] = done[s] + i;
                memcpy(qkv + (size_t)T * ROW, inputs + ((size_t)s * 150 + pos[T]) * ROW, sizeof(float) * ROW);
                for (int j = H * HD; j < ROW; j++) { /* k then v of head (j - H*HD) / HD % KV */
                    int kvh = (j - H * HD) / HD % KV, is_v = j >= (H + KV) * HD;
                    qkv[(size_t)T * ROW + j] = rounded(round_dt, qkv[(size_t)T * ROW + j], (is_v ? v_scale : k_scale)[kvh]);
                }
            }
            for (int i = indptr[s]; i < indptr[s + 1]; i++) bids[bind[S] + i - indptr[s]] = blocks[i];
            bind[S + 1] = bind[S] + indptr[s + 1] - indptr[s];
            sl[S] = slots[s];
            seq_start[++S] = T;
            done[s] += n;
        }
        struct fwd_batch bt = {T, S, toks, pos, seq_start, bind, bids, sl, 0, NULL, NULL, false};
        assert_int_equal(b->ops->begin_step(b, &bt), 0);
        b->ops->attention(b, att, qkv, ROW, &L);
        memcpy(in->out + (size_t)out_row * H * HD, att, sizeof(float) * T * H * HD);
        out_row += T;
    }
    assert_int_equal(out_row, 190);
    free(qkv);
    free(att);
    backend_destroy(b);
}

static void inst_free(struct inst *in) {
    free(in->kf), free(in->vf), free(in->ks), free(in->vs), free(in->out);
}

/* Element i of a pool as f32 (the head's scale applied for fp8). */
static float pool_value(const struct inst *in, const void *pool, size_t i, int kvh, bool is_v) {
    if (in->dt == KV_DTYPE_FP8_E4M3) return fp8_e4m3_to_f32(((const uint8_t *)pool)[i]) * (is_v ? v_scale : k_scale)[kvh];
    if (in->dt == KV_DTYPE_BF16) return util_bf16_to_f32(((const uint16_t *)pool)[i]);
    return ((const float *)pool)[i];
}

/* Every element of a's pools, read as f32, equals b's (f32 pools): bit for bit. */
static void assert_pools_equal(const struct inst *a, const struct inst *b) {
    for (int w = 0; w < 2; w++) {
        const void *fa = w ? a->vf : a->kf, *fb = w ? b->vf : b->kf, *sa = w ? a->vs : a->ks, *sb = w ? b->vs : b->ks;
        for (size_t i = 0; i < full_elems(); i++) {
            float x = pool_value(a, fa, i, (int)(i / HD % NF), w), y = ((const float *)fb)[i];
            if (memcmp(&x, &y, 4)) fail_msg("full pool %s element %zu: %a vs %a", w ? "V" : "K", i, (double)x, (double)y);
        }
        for (size_t i = 0; i < stream_elems(); i++) {
            float x = pool_value(a, sa, i, NF + (int)(i / HD % (KV - NF)), w), y = ((const float *)sb)[i];
            if (memcmp(&x, &y, 4)) fail_msg("streaming pool %s element %zu: %a vs %a", w ? "V" : "K", i, (double)x, (double)y);
        }
    }
}

static void check_dtype(enum kv_dtype dt, int window) {
    float *inputs = calloc((size_t)NSEQ * 150 * ROW, sizeof(float));
    make_inputs(inputs);
    struct inst got, ref, exact;
    run_op(&got, dt, KV_DTYPE_ACT, window, inputs);          /* pools of dt, the raw inputs */
    run_op(&ref, KV_DTYPE_ACT, dt, window, inputs);          /* f32 pools, the inputs rounded as dt holds them */
    run_op(&exact, KV_DTYPE_ACT, KV_DTYPE_ACT, window, inputs); /* f32 all the way */
    assert_memory_equal(got.out, ref.out, sizeof(float) * 190 * H * HD);
    assert_pools_equal(&got, &ref);
    /* the rounding is real: the outputs differ from f32's (by much, at places: these inputs are
     * made to saturate, and their scores are sharp; the model tests below measure realistic ones) */
    double worst = 0, big = 0;
    for (size_t i = 0; i < (size_t)190 * H * HD; i++) {
        worst = fmax(worst, fabs((double)got.out[i] - exact.out[i]));
        big = fmax(big, fabs((double)exact.out[i]));
    }
    print_message("%s (window %d): bit-identical to f32 on rounded values; max |out - f32 out| %.3g of max |out| %.3g\n",
                  dt == KV_DTYPE_FP8_E4M3 ? "fp8" : "bf16", window, worst, big);
    assert_true(worst > 0);
    inst_free(&got), inst_free(&ref), inst_free(&exact);
    free(inputs);
}

/* The inputs reach both ends of e4m3 under the scales (the cases are exercised, not assumed). */
static void test_inputs_saturate_and_go_subnormal(void **state) {
    (void)state;
    float *inputs = calloc((size_t)NSEQ * 150 * ROW, sizeof(float));
    make_inputs(inputs);
    int sat = 0, sub = 0;
    for (int s = 0; s < NSEQ; s++)
        for (int p = 0; p < seq_len[s]; p++)
            for (int j = H * HD; j < ROW; j++) {
                int kvh = (j - H * HD) / HD % KV, is_v = j >= (H + KV) * HD;
                float y = fabsf(inputs[((size_t)s * 150 + p) * ROW + j] / (is_v ? v_scale : k_scale)[kvh]);
                sat += y > 448.0f;
                sub += y < 0x1p-6f;
            }
    print_message("%d K/V inputs saturate, %d are subnormal in e4m3\n", sat, sub);
    assert_true(sat > 10 && sub > 10);
    free(inputs);
}

static void test_fp8_op_equals_f32_on_rounded_values(void **state) {
    (void)state;
    check_dtype(KV_DTYPE_FP8_E4M3, 0);
    check_dtype(KV_DTYPE_FP8_E4M3, 50); /* sliding window over the retrieval heads */
}

static void test_bf16_op_equals_f32_on_rounded_values(void **state) {
    (void)state;
    check_dtype(KV_DTYPE_BF16, 0);
}

/* ---- a model ---- */

static struct model *load(const char *dir, enum kv_dtype dt, const uint8_t *streaming) {
    struct model *m = NULL;
    char err[512] = "";
    struct model_load_opts o = {.max_tokens = 256, .streaming = streaming, .tensor_parallel_size = 1, .kv_dtype = dt};
    int rc = model_load_with(&m, dir, backend_cpu_create(), &o, err, sizeof err);
    if (rc) print_error("model_load_with(%s): %s\n", dir, err);
    assert_int_equal(rc, 0);
    return m;
}

static void unload(struct model *m) {
    struct backend *b = m->b;
    model_free(m);
    backend_destroy(b);
}

/* Runs toks[0, n) in chunks of `step` from an empty cache of nb blocks and one slot; logits of
 * every row into lg when given (n <= 256). */
static void forward(struct model *m, struct kv_cache *kv, const int32_t *toks, int n, int step, float *lg) {
    int nb = (n + 15) / 16, V = m->cfg.vocab_size;
    assert_int_equal(model_kv_cache_init(m, kv, 16, SINK, RECENT, nb, 1), KV_STATUS_OK);
    int32_t blocks[16], pos[256], rows[256];
    assert_int_equal(kv_cache_alloc(kv, nb, blocks), KV_STATUS_OK);
    for (int i = 0; i < n; i++) pos[i] = rows[i] = i;
    for (int at = 0; at < n; at += step) {
        int c = n - at < step ? n - at : step;
        int32_t seq_start[2] = {0, c}, indptr[2] = {0, nb}, slot = 0;
        struct fwd_batch bt = {c, 1, toks + at, pos + at, seq_start, indptr, blocks, &slot, lg ? c : 0, rows, NULL,
                               false};
        assert_int_equal(model_forward(m, kv, &bt, lg ? lg + (size_t)at * V : NULL), 0);
    }
}

/* Layer l's arrays of the fp8 cache are e4m3 of the f32 cache's (scaled): counts the differences. */
static long pool_mismatches(const struct model *m8, const struct kv_cache *c8, const struct kv_cache *c32, int l) {
    const struct kv_shard *a = &c8->shards[0], *b = &c32->shards[0];
    int hd = m8->cfg.head_dim, kvr = m8->sh.n_kv_heads;
    size_t nf = (size_t)c8->n_blocks * 16 * a->n_full[l] * hd, ns = (size_t)(SINK + RECENT) * a->n_stream[l] * hd;
    long bad = 0;
    for (int w = 0; w < 2; w++) {
        const float *sc = (w ? m8->v_scale : m8->k_scale) + (size_t)l * kvr;
        const uint8_t *f8 = w ? a->v_full[l] : a->k_full[l], *s8 = w ? a->v_stream[l] : a->k_stream[l];
        const float *f32 = w ? b->v_full[l] : b->k_full[l], *s32 = w ? b->v_stream[l] : b->k_stream[l];
        for (size_t i = 0; i < nf; i++) bad += f8[i] != fp8_e4m3_from_f32(f32[i] / sc[i / hd % a->n_full[l]]);
        for (size_t i = 0; i < ns; i++)
            bad += s8[i] != fp8_e4m3_from_f32(s32[i] / sc[a->n_full[l] + i / hd % a->n_stream[l]]);
    }
    return bad;
}

/* llama3 with one streaming head a layer (reordered heads, both pools), qwen2 with q/k/v biases:
 * layer 0's K/V do not depend on the KV dtype, so its fp8 pools are exactly e4m3 of the f32 ones;
 * layer 1 sees layer 0's rounded attention and so differs. Prefill in chunks of 7. */
static void test_model_fp8_pools_hold_rounded_f32(void **state) {
    (void)state;
    static const uint8_t pattern[4] = {0, 1, 1, 0}; /* layer 0: head 1 streaming; layer 1: head 0 */
    const char *dirs[] = {"tests/fixtures/hf/llama3", "tests/fixtures/hf/qwen2"};
    int32_t toks[50];
    for (int i = 0; i < 50; i++) toks[i] = 3 + (i * 41) % 500;
    for (int d = 0; d < 2; d++) {
        const uint8_t *st = d == 0 ? pattern : NULL;
        struct model *m32 = load(dirs[d], KV_DTYPE_ACT, st), *m8 = load(dirs[d], KV_DTYPE_FP8_E4M3, st);
        struct kv_cache c32, c8;
        forward(m32, &c32, toks, 50, 7, NULL);
        forward(m8, &c8, toks, 50, 7, NULL);
        assert_int_equal(kv_cache_dtype(&c8), KV_DTYPE_FP8_E4M3);
        assert_int_equal(c8.shards[0].es, 1);
        if (st) assert_true(kv_cache_has_stream(&c8) && kv_cache_has_full(&c8));
        assert_int_equal(pool_mismatches(m8, &c8, &c32, 0), 0);
        assert_true(pool_mismatches(m8, &c8, &c32, 1) > 0);
        kv_cache_free(&c32), kv_cache_free(&c8);
        unload(m32), unload(m8);
    }
}

/* The HF fixtures, teacher-forced over 201 positions (the 200-token prompt of expected.json and
 * HF's first greedy id): fp8 KV's next-token logprobs differ from f32 KV's, by little. */
static void test_model_fp8_logprobs_near_f32(void **state) {
    (void)state;
    const char *fams[] = {"llama2", "llama3", "mistral", "qwen2"};
    for (int f = 0; f < 4; f++) {
        char dir[256], path[300];
        snprintf(dir, sizeof dir, "tests/fixtures/hf/%s", fams[f]);
        snprintf(path, sizeof path, "%s/expected.json", dir);
        char *text;
        size_t len;
        assert_int_equal(util_read_file(path, &text, &len), 0);
        cJSON *exp = cJSON_ParseWithLength(text, len), *c;
        free(text);
        int32_t toks[256];
        int n = 0;
        cJSON_ArrayForEach(c, cJSON_GetObjectItem(exp, "cases")) {
            const cJSON *ids = cJSON_GetObjectItem(c, "prompt_ids"), *it;
            if (cJSON_GetArraySize(ids) != 200) continue;
            cJSON_ArrayForEach(it, ids) toks[n++] = (int32_t)it->valuedouble;
        }
        cJSON_Delete(exp);
        assert_int_equal(n, 200);
        struct model *m32 = load(dir, KV_DTYPE_ACT, NULL), *m8 = load(dir, KV_DTYPE_FP8_E4M3, NULL);
        int V = m32->cfg.vocab_size;
        float *l32 = malloc(sizeof(float) * 201 * V), *l8 = malloc(sizeof(float) * 201 * V), *a = malloc(sizeof(float) * V),
              *b = malloc(sizeof(float) * V);
        toks[200] = 0;
        struct kv_cache c32, c8;
        forward(m32, &c32, toks, 200, 200, l32);
        toks[200] = (int32_t)sampler_argmax(l32 + (size_t)199 * V, V);
        kv_cache_free(&c32);
        forward(m32, &c32, toks, 201, 64, l32);
        forward(m8, &c8, toks, 201, 64, l8);
        double worst = 0, sum = 0;
        int agree = 0;
        for (int i = 0; i < 200; i++) {
            sampler_log_softmax(l32 + (size_t)i * V, V, a);
            sampler_log_softmax(l8 + (size_t)i * V, V, b);
            double d = fabs((double)a[toks[i + 1]] - b[toks[i + 1]]);
            worst = fmax(worst, d);
            sum += d;
            agree += sampler_argmax(a, V) == sampler_argmax(b, V);
        }
        print_message("%s: fp8 vs f32 KV, 200 next tokens: |d logprob| max %.3g mean %.3g, argmax agrees %d/200\n",
                      fams[f], worst, sum / 200, agree);
        assert_true(worst > 0);
        assert_true(worst < 0.5 && sum / 200 < 0.05 && agree >= 180);
        kv_cache_free(&c32), kv_cache_free(&c8);
        free(l32), free(l8), free(a), free(b);
        unload(m32), unload(m8);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_inputs_saturate_and_go_subnormal),
        cmocka_unit_test(test_fp8_op_equals_f32_on_rounded_values),
        cmocka_unit_test(test_bf16_op_equals_f32_on_rounded_values),
        cmocka_unit_test(test_model_fp8_pools_hold_rounded_f32),
        cmocka_unit_test(test_model_fp8_logprobs_near_f32),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
