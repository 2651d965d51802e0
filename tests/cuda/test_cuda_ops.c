/* Every CUDA op against the CPU reference op on fresh random inputs, with stated tolerances.
 * Inputs are rounded to bf16 first and given to both backends, so differences come only from
 * the CUDA side's bf16 activations and accumulation order. Run on a GPU machine:
 *   source .device/env.sh && ./build/duoserve-test-cuda
 * Prints one line per case and a closing "N passed, M failed". */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend.h"
#include "engine/fp8.h"
#include "engine/model.h"
#include "engine/util.h"

static struct backend *cpu, *gpu;
static struct util_rng rng;
static int n_pass, n_fail;

static float *rand_bf16(size_t n, float scale) {
    float *v = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) v[i] = util_bf16_to_f32(util_f32_to_bf16(scale * util_rng_normal(&rng)));
    return v;
}

/* The same f32 data as activations of both backends. */
static void up2(void **pc, void **pg, const float *h, size_t n) {
    enum backend_status st;
    *pc = cpu->ops->alloc(cpu, n * 4, &st);
    *pg = gpu->ops->alloc(gpu, n * 2, &st);
    cpu->ops->upload_act(cpu, *pc, h, n);
    gpu->ops->upload_act(gpu, *pg, h, n);
}

/* A weight (rows x cols) from f32 data, in both backends. */
static void weight2(void **pc, void **pg, const float *h, int64_t rows, int64_t cols) {
    struct st_tensor t = {.name = "w", .dtype = ST_DTYPE_F32, .n_dims = cols ? 2 : 1, .shape = {rows, cols ? cols : 0},
                          .data = h, .nbytes = (size_t)(rows * (cols ? cols : 1) * 4)};
    cpu->ops->weight_upload(cpu, &t, pc);
    gpu->ops->weight_upload(gpu, &t, pg);
}

static void free2(void *pc, void *pg) {
    cpu->ops->free(cpu, pc);
    gpu->ops->free(gpu, pg);
}

/* Compares n outputs: |gpu - cpu| <= atol + rtol * |cpu| everywhere. */
static void compare(const char *what, const void *pc, const void *pg, size_t n, float atol, float rtol) {
    float *a = malloc(n * 4), *b = malloc(n * 4);
    cpu->ops->download_act(cpu, a, pc, n);
    int sync = gpu->ops->sync(gpu);
    gpu->ops->download_act(gpu, b, pg, n);
    double worst = 0, worst_rel = 0;
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= atol + rtol * fabs(a[i]))) bad++;
        if (d > worst) worst = d;
        double r = d / (fabs(a[i]) + 1e-6);
        if (r > worst_rel && fabs(a[i]) > 1e-2) worst_rel = r;
    }
    int ok = bad == 0 && sync == 0;
    printf("%-4s %-58s max|d| %.3e  max rel %.3e  (atol %.0e rtol %.0e)%s\n", ok ? "ok" : "FAIL", what, worst,
           worst_rel, atol, rtol, sync ? "  [device error]" : "");
    ok ? n_pass++ : n_fail++;
    free(a);
    free(b);
}

static void batch_both(const struct fwd_batch *bt) {
    cpu->ops->begin_step(cpu, bt);
    gpu->ops->begin_step(gpu, bt);
}

static void test_elementwise(void) {
    /* 16-byte rows (vectorised kernels, several chunks a thread at 8200) and not (100) */
    int dims[] = {64, 100, 4096, 8200};
    for (int di = 0; di < 4; di++) {
        int n = 33, d = dims[di];
        float *x = rand_bf16((size_t)n * d, 1.0f), *w = rand_bf16(d, 1.0f), *y = rand_bf16((size_t)n * d, 1.0f);
        void *xc, *xg, *yc, *yg, *oc, *og, *wc, *wg;
        up2(&xc, &xg, x, (size_t)n * d);
        up2(&yc, &yg, y, (size_t)n * d);
        up2(&oc, &og, y, (size_t)n * d);
        weight2(&wc, &wg, w, d, 0);
        char what[96];
        cpu->ops->rmsnorm(cpu, oc, xc, wc, n, d, 1e-5f);
        gpu->ops->rmsnorm(gpu, og, xg, wg, n, d, 1e-5f);
        snprintf(what, sizeof what, "rmsnorm %d x %d", n, d);
        compare(what, oc, og, (size_t)n * d, 1e-2f, 1e-2f);
        /* x viewed as n/2 rows of gate | up (d each) */
        cpu->ops->silu_mul(cpu, oc, xc, n / 2, d);
        gpu->ops->silu_mul(gpu, og, xg, n / 2, d);
        snprintf(what, sizeof what, "silu_mul %d rows x %d", n / 2, d);
        compare(what, oc, og, (size_t)(n / 2) * d, 1e-2f, 1e-2f);
        cpu->ops->add_rmsnorm(cpu, oc, yc, xc, wc, n, d, 1e-5f);
        gpu->ops->add_rmsnorm(gpu, og, yg, xg, wg, n, d, 1e-5f);
        snprintf(what, sizeof what, "add_rmsnorm %d x %d (normalised output)", n, d);
        compare(what, oc, og, (size_t)n * d, 2e-2f, 2e-2f);
        snprintf(what, sizeof what, "add_rmsnorm %d x %d (residual)", n, d);
        compare(what, yc, yg, (size_t)n * d, 1e-2f, 1e-2f);
        free2(xc, xg), free2(yc, yg), free2(oc, og), free2(wc, wg);
        free(x), free(w), free(y);
    }
}

static void test_embed_rows_logits(void) {
    int V = 1000, D = 256, T = 20; /* 3 logits rows, f32 output */
    float *table = rand_bf16((size_t)V * D, 1.0f);
    void *tc, *tg, *oc, *og, *hc, *hg;
    weight2(&tc, &tg, table, V, D);
    float *zero = calloc((size_t)T * D, 4);
    up2(&oc, &og, zero, (size_t)T * D);
    up2(&hc, &hg, zero, (size_t)T * D);
    int32_t toks[20], pos[20], ss[2] = {0, T}, ip[2] = {0, 0}, rows[3] = {19, 0, 7};
    for (int i = 0; i < T; i++) toks[i] = (int32_t)(util_rng_next(&rng) % V), pos[i] = i;
    struct fwd_batch bt = {T, 1, toks, pos, ss, ip, NULL, NULL, 3, rows, NULL, false};
    batch_both(&bt);
    cpu->ops->embed(cpu, oc, tc, D);
    gpu->ops->embed(gpu, og, tg, D);
    compare("embed 20 tokens of a 1000 x 256 table", oc, og, (size_t)T * D, 0, 0);
    cpu->ops->get_rows(cpu, hc, oc, D);
    gpu->ops->get_rows(gpu, hg, og, D);
    compare("get_rows 3 of 20", hc, hg, (size_t)3 * D, 0, 0);
    float *lc = malloc(sizeof(float) * 3 * V), *lg = malloc(sizeof(float) * 3 * V);
    cpu->ops->logits(cpu, lc, hc, tc, 3, V, D);
    int rc = gpu->ops->logits(gpu, lg, hg, tg, 3, V, D);
    gpu->ops->sync(gpu);
    double worst = 0;
    for (int i = 0; i < 3 * V; i++) worst = fmax(worst, fabs(lc[i] - lg[i]));
    int ok = rc == 0 && worst <= 0.05;
    printf("%-4s %-58s max|d| %.3e  (atol 5e-2, f32 logits of |x| ~ 16)\n", ok ? "ok" : "FAIL",
           "logits 3 x 1000 (f32 out)", worst);
    ok ? n_pass++ : n_fail++;
    free2(tc, tg), free2(oc, og), free2(hc, hg);
    free(table), free(zero), free(lc), free(lg);
}

/* argmax over exact logits (x one-hot, so logit v of row r is W[v][r]): ties across the
 * kernel's slices, a constant row, the maximum at the last index; the GPU's ids must be the
 * CPU's (the first index of the maximum), launch after launch at several row counts. */
static void test_argmax(void) {
    const int V = 128256, D = 16, R = 5;
    float *w = malloc(sizeof(float) * (size_t)V * D), *x = calloc((size_t)R * D, 4);
    for (int v = 0; v < V; v++) {
        float *wr = w + (size_t)v * D;
        for (int d = 0; d < D; d++) wr[d] = 0.0f;
        wr[0] = util_bf16_to_f32(util_f32_to_bf16(util_rng_normal(&rng)));        /* random */
        wr[1] = v == 130 || v == 77777 || v == V - 1 ? 2.0f : 0.0f;                /* tie: 130 */
        wr[2] = 1.0f;                                                              /* constant: 0 */
        wr[3] = v == V - 1 ? 5.0f : -3.0f;                                          /* the last */
        wr[4] = v >= 64000 && v % 1000 == 7 ? 9.0f : (float)(v % 13) - 6.0f;        /* tie in slice 7 */
    }
    for (int r = 0; r < R; r++) x[(size_t)r * D + r] = 1.0f;
    void *wc, *wg, *xc, *xg;
    weight2(&wc, &wg, w, V, D);
    up2(&xc, &xg, x, (size_t)R * D);
    int counts[4] = {5, 1, 3, 5}, bad = 0, rc = 0;
    for (int k = 0; k < 4; k++) {
        int n = counts[k];
        int32_t ic[5], ig[5];
        cpu->ops->logits(cpu, NULL, xc, wc, n, V, D);
        cpu->ops->argmax(cpu, ic, n, V);
        rc |= gpu->ops->logits(gpu, NULL, xg, wg, n, V, D);
        gpu->ops->argmax(gpu, ig, n, V);
        rc |= gpu->ops->sync(gpu);
        for (int r = 0; r < n; r++) bad += ic[r] != ig[r];
        if (k == 0) printf("     argmax ids cpu %d %d %d %d %d, gpu %d %d %d %d %d\n", ic[0], ic[1], ic[2], ic[3], ic[4],
                           ig[0], ig[1], ig[2], ig[3], ig[4]);
    }
    int ok = bad == 0 && rc == 0;
    printf("%-4s %-58s %d ids differ (want 0)\n", ok ? "ok" : "FAIL", "argmax 128256 wide, 5/1/3/5 rows, ties", bad);
    ok ? n_pass++ : n_fail++;
    free2(wc, wg), free2(xc, xg);
    free(w), free(x);
}

const char *cuda_gemm_kind(int M, int N, int K);

static void test_matmul(void) {
    /* every kernel (weight stream with 1, 2 or 4 token tiles, 64- and 128-row tiles), N and K
     * not multiples of the tiles or of 16 (packed padding), K % 8 != 0 (row-major weights) */
    int shapes[][3] = {{1, 4096, 4096}, {37, 1024, 4096}, {128, 2048, 512}, {3, 14336, 4096}, {8, 4096, 14336},
                       {5, 1000, 64},   {2, 96, 100},     {300, 520, 1032}, {2048, 384, 4096}, {1, 128256, 64},
                       {17, 200, 172},  {12, 333, 1000},  {29, 6144, 4096}, {16, 72, 24},
                       {1024, 2560, 264}};
    int n_shapes = (int)(sizeof shapes / sizeof shapes[0]);
    for (int s = 0; s < n_shapes; s++) {
        int n = shapes[s][0], no = shapes[s][1], ni = shapes[s][2];
        bool with_bias = s == 1 || s == 4 || s == 7;
        float *x = rand_bf16((size_t)n * ni, 1.0f), *w = rand_bf16((size_t)no * ni, 1.0f / sqrtf((float)ni));
        float *bias = rand_bf16(no, 1.0f), *z = calloc((size_t)n * no, 4);
        void *xc, *xg, *wc, *wg, *bc, *bg, *oc, *og;
        up2(&xc, &xg, x, (size_t)n * ni);
        up2(&oc, &og, z, (size_t)n * no);
        weight2(&wc, &wg, w, no, ni);
        weight2(&bc, &bg, bias, no, 0);
        cpu->ops->matmul(cpu, oc, xc, wc, with_bias ? bc : NULL, n, no, ni);
        gpu->ops->matmul(gpu, og, xg, wg, with_bias ? bg : NULL, n, no, ni);
        char what[96];
        snprintf(what, sizeof what, "matmul %d x %d x %d%s (%s)", n, no, ni, with_bias ? " + bias" : "",
                 cuda_gemm_kind(n, no, ni));
        compare(what, oc, og, (size_t)n * no, 2e-2f, 1e-2f);
        free2(xc, xg), free2(wc, wg), free2(bc, bg), free2(oc, og);
        free(x), free(w), free(bias), free(z);
    }
}

/* Fills n bf16 activations with NaN, so an output a kernel never wrote cannot pass a comparison. */
static void gpu_fill_nan(void *p, size_t n) {
    float *h = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) h[i] = NAN;
    gpu->ops->upload_act(gpu, p, h, n);
    free(h);
}

/* A tile GEMM whose last stage reaches past K (here K = 264: a stage of 128 k holds 8 of it)
 * right after one that left +Inf tokens in every SM's shared-memory stages: the stage's k past
 * K must be zeros (Inf x 0 would be NaN), not what an earlier call left there. */
static void test_matmul_stale_stages(void) {
    const int M = 1024, N = 2560, K1 = 4096, K2 = 264;
    enum backend_status st;
    float *xi = malloc(sizeof(float) * M * K1), *w1 = rand_bf16((size_t)N * K1, 0.01f);
    for (size_t i = 0; i < (size_t)M * K1; i++) xi[i] = INFINITY;
    void *xg = gpu->ops->alloc(gpu, (size_t)M * K1 * 2, &st), *og = gpu->ops->alloc(gpu, (size_t)M * N * 2, &st), *wc, *wg;
    gpu->ops->upload_act(gpu, xg, xi, (size_t)M * K1);
    weight2(&wc, &wg, w1, N, K1);
    gpu->ops->matmul(gpu, og, xg, wg, NULL, M, N, K1);
    gpu->ops->sync(gpu);
    free2(wc, wg);
    float *x = rand_bf16((size_t)M * K2, 1.0f), *w = rand_bf16((size_t)N * K2, 1.0f / sqrtf((float)K2)), *z = calloc((size_t)M * N, 4);
    void *xc, *x2, *oc, *o2;
    up2(&xc, &x2, x, (size_t)M * K2);
    up2(&oc, &o2, z, (size_t)M * N);
    weight2(&wc, &wg, w, N, K2);
    cpu->ops->matmul(cpu, oc, xc, wc, NULL, M, N, K2);
    gpu->ops->matmul(gpu, o2, x2, wg, NULL, M, N, K2);
    char what[96];
    snprintf(what, sizeof what, "matmul %d x %d x %d after +Inf tokens (%s)", M, N, K2, cuda_gemm_kind(M, N, K2));
    compare(what, oc, o2, (size_t)M * N, 2e-2f, 1e-2f);
    free2(xc, x2), free2(oc, o2), free2(wc, wg);
    gpu->ops->free(gpu, xg), gpu->ops->free(gpu, og);
    free(xi), free(w1), free(x), free(w), free(z);
}

/* The fused SwiGLU GEMM (matmul_swiglu, weights interleaved by 8 rows) against the CPU op, and bit
 * for bit against the GPU's unfused path (matmul over the same weights stacked gate then up,
 * then silu_mul) on every kernel: the weight stream with 1, 2 and 4 token tiles (split), 64-row
 * tiles with and without split-K, 128-row tiles, 256-token tiles (M > 4096: the totals in shared
 * memory; K 1000: a last chunk of 488), and row-major weights (K % 8 != 0). */
static void test_matmul_swiglu(void) {
    int shapes[][3] = {{1, 2048, 4096}, {5, 1024, 512}, {12, 512, 1024}, {29, 1024, 4096}, {64, 1024, 4096},
                       {200, 2048, 1024}, {2048, 2048, 512}, {3, 64, 100}, {1, 14336, 4096}, {4500, 256, 1000}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        int n = shapes[k][0], F = shapes[k][1], ni = shapes[k][2];
        float *x = rand_bf16((size_t)n * ni, 1.0f), *w = rand_bf16((size_t)2 * F * ni, 1.0f / sqrtf((float)ni));
        float *wp = malloc(sizeof(float) * 2 * F * ni), *z = calloc((size_t)n * 2 * F, 4);
        for (int r = 0; r < 2 * F; r++) { /* interleaved row r = gate or up row of feature f */
            int f = r / 16 * 8 + r % 8, up = r % 16 >= 8;
            memcpy(wp + (size_t)(up * F + f) * ni, w + (size_t)r * ni, sizeof(float) * ni);
        }
        void *xc, *xg, *wc, *wg, *guc, *gug, *oc, *og, *wpc, *wpg;
        up2(&xc, &xg, x, (size_t)n * ni);
        up2(&guc, &gug, z, (size_t)n * 2 * F);
        up2(&oc, &og, z, (size_t)n * F);
        weight2(&wc, &wg, w, 2 * F, ni);
        weight2(&wpc, &wpg, wp, 2 * F, ni);
        gpu_fill_nan(og, (size_t)n * F);
        cpu->ops->matmul_swiglu(cpu, oc, guc, xc, wc, n, F, ni);
        gpu->ops->matmul_swiglu(gpu, og, gug, xg, wg, n, F, ni);
        char what[96];
        snprintf(what, sizeof what, "matmul_swiglu %d x %d x %d (%s)", n, 2 * F, ni, cuda_gemm_kind(n, 2 * F, ni));
        compare(what, oc, og, (size_t)n * F, 3e-2f, 2e-2f);
        /* the unfused GPU path */
        enum backend_status st;
        void *ref = gpu->ops->alloc(gpu, (size_t)n * F * 2, &st);
        gpu_fill_nan(ref, (size_t)n * F);
        gpu->ops->matmul(gpu, gug, xg, wpg, NULL, n, 2 * F, ni);
        gpu->ops->silu_mul(gpu, ref, gug, n, F);
        int errs = gpu->ops->sync(gpu) != 0;
        float *a = malloc(sizeof(float) * n * F), *b = malloc(sizeof(float) * n * F);
        gpu->ops->download_act(gpu, a, og, (size_t)n * F);
        gpu->ops->download_act(gpu, b, ref, (size_t)n * F);
        size_t bad = 0;
        for (size_t i = 0; i < (size_t)n * F; i++) bad += isnan(a[i]) || memcmp(&a[i], &b[i], 4) != 0;
        int ok = bad == 0 && errs == 0;
        printf("%-4s %-58s %zu differ from matmul + silu_mul (want 0)%s\n", ok ? "ok" : "FAIL", what, bad,
               errs ? "  [device error]" : "");
        ok ? n_pass++ : n_fail++;
        gpu->ops->free(gpu, ref);
        free2(xc, xg), free2(wc, wg), free2(wpc, wpg), free2(guc, gug), free2(oc, og);
        free(x), free(w), free(wp), free(z), free(a), free(b);
    }
}

/* Batch invariance, bit for bit: a token's GEMM output must not depend on how many tokens
 * share the call (every tile shape; split-K, by one chunk or groups of chunks, and in-register
 * chunk sums: 4096 x 4096 splits at small M only), and the f32 logits likewise. */
static void test_matmul_invariance(void) {
    /* 4096 x 14336 (Llama-3-8B's down): the weight stream splits K in groups of 4 chunks */
    int dims[][2] = {{1024, 4096}, {4096, 4096}, {333, 1000}, {96, 172}, {4096, 14336}};
    int Ms[] = {1, 2, 3, 7, 8, 9, 16, 17, 32, 33, 64, 65, 256, 257, 700};
    for (int d = 0; d < 5; d++) {
        int no = dims[d][0], ni = dims[d][1], MM = 700;
        float *x = rand_bf16((size_t)MM * ni, 1.0f), *w = rand_bf16((size_t)no * ni, 1.0f / sqrtf((float)ni));
        float *bias = rand_bf16(no, 1.0f);
        void *xc, *xg, *wc, *wg, *bc, *bg;
        up2(&xc, &xg, x, (size_t)MM * ni);
        weight2(&wc, &wg, w, no, ni);
        weight2(&bc, &bg, bias, no, 0);
        enum backend_status st;
        void *full = gpu->ops->alloc(gpu, (size_t)MM * no * 2, &st), *part = gpu->ops->alloc(gpu, (size_t)MM * no * 2, &st);
        float *ref = malloc(sizeof(float) * MM * no), *got = malloc(sizeof(float) * MM * no);
        float *lref = malloc(sizeof(float) * MM * no), *lgot = malloc(sizeof(float) * MM * no);
        int errs = 0;
        gpu_fill_nan(full, (size_t)MM * no);
        gpu->ops->matmul(gpu, full, xg, wg, bg, MM, no, ni);
        errs += gpu->ops->sync(gpu) != 0;
        gpu->ops->download_act(gpu, ref, full, (size_t)MM * no);
        gpu->ops->logits(gpu, lref, xg, wg, MM, no, ni);
        errs += gpu->ops->sync(gpu) != 0;
        size_t bad = 0, lbad = 0;
        for (size_t i = 0; i < (size_t)MM * no; i++) bad += isnan(ref[i]) || isnan(lref[i]);
        for (size_t k = 0; k < sizeof Ms / sizeof Ms[0]; k++) {
            int M = Ms[k], off = (int)(util_rng_next(&rng) % (uint64_t)(MM - M + 1));
            /* tokens off .. off+M-1 alone in a call of M (x offset by whole rows keeps 16-byte alignment) */
            const void *xs = (const char *)xg + (size_t)off * ni * 2;
            gpu_fill_nan(part, (size_t)M * no);
            gpu->ops->matmul(gpu, part, xs, wg, bg, M, no, ni);
            errs += gpu->ops->sync(gpu) != 0;
            gpu->ops->download_act(gpu, got, part, (size_t)M * no);
            for (size_t i = 0; i < (size_t)M * no; i++) bad += memcmp(&got[i], &ref[(size_t)off * no + i], 4) != 0;
            gpu->ops->logits(gpu, lgot, xs, wg, M, no, ni);
            errs += gpu->ops->sync(gpu) != 0;
            for (size_t i = 0; i < (size_t)M * no; i++) lbad += memcmp(&lgot[i], &lref[(size_t)off * no + i], 4) != 0;
        }
        int ok = bad == 0 && lbad == 0 && errs == 0;
        printf("%-4s matmul %d x %d batch invariance, M in 1..700 vs 700: %zu + %zu logits differ (want 0)%s\n",
               ok ? "ok" : "FAIL", no, ni, bad, lbad, errs ? "  [device error]" : "");
        ok ? n_pass++ : n_fail++;
        gpu->ops->free(gpu, full);
        gpu->ops->free(gpu, part);
        free2(xc, xg), free2(wc, wg), free2(bc, bg);
        free(x), free(w), free(bias), free(ref), free(got), free(lref), free(lgot);
    }
}

/* Llama-3-8B's GEMMs (qkv, o, gate|up, down; the LM head through logits, f32) at the batch sizes
 * of decode and prefill: rows of one call of MM tokens against the CPU op (a sample of rows: the
 * CPU reference of 8192 x 28672 x 4096 would take minutes), and bit for bit against the same
 * tokens in calls of M in {1, 7, 64, 255, 256, 1024, 2048} (every kernel: weight streams and
 * tiles, with and without split-K). */
static void test_matmul_llama(void) {
    int shapes[][2] = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}, {128256, 4096}};
    const char *names[] = {"qkv", "o", "gate|up", "down", "LM head (logits)"};
    int Ms[] = {1, 7, 64, 255, 256, 1024, 2048};
    enum backend_status st;
    for (int s = 0; s < 5; s++) {
        const int N = shapes[s][0], K = shapes[s][1], head = s == 4, MM = head ? 1024 : 8192, R = 8;
        float *x = rand_bf16((size_t)MM * K, 1.0f), *w = rand_bf16((size_t)N * K, 1.0f / sqrtf((float)K));
        void *xg = gpu->ops->alloc(gpu, (size_t)MM * K * 2, &st), *wc, *wg;
        gpu->ops->upload_act(gpu, xg, x, (size_t)MM * K);
        weight2(&wc, &wg, w, N, K);
        void *out = head ? NULL : gpu->ops->alloc(gpu, (size_t)MM * N * 2, &st);
        float *ref = malloc(sizeof(float) * MM * N), *got = malloc(sizeof(float) * MM * N);
        int errs = 0;
        /* one call of M tokens from row off into dst (host) */
        #define LLAMA_CALL(dst, off, M)                                                                      \
            do {                                                                                             \
                const void *xs_ = (const char *)xg + (size_t)(off) * K * 2;                                  \
                if (head) {                                                                                  \
                    errs += gpu->ops->logits(gpu, dst, xs_, wg, M, N, K) != 0;                               \
                    errs += gpu->ops->sync(gpu) != 0; /* the host copy lands at the sync */                  \
                } else {                                                                                     \
                    gpu_fill_nan(out, (size_t)(M) * N);                                                      \
                    gpu->ops->matmul(gpu, out, xs_, wg, NULL, M, N, K);                                      \
                    errs += gpu->ops->sync(gpu) != 0;                                                        \
                    gpu->ops->download_act(gpu, dst, out, (size_t)(M) * N);                                  \
                }                                                                                            \
            } while (0)
        LLAMA_CALL(ref, 0, MM);
        size_t nan = 0;
        for (size_t i = 0; i < (size_t)MM * N; i++) nan += isnan(ref[i]);
        /* CPU rows */
        float *xr = malloc(sizeof(float) * R * K), *cr = malloc(sizeof(float) * R * N);
        int rows[8];
        for (int r = 0; r < R; r++) {
            rows[r] = r == 0 ? MM - 1 : (int)(util_rng_next(&rng) % (uint64_t)MM);
            memcpy(xr + (size_t)r * K, x + (size_t)rows[r] * K, sizeof(float) * K);
        }
        void *xc = cpu->ops->alloc(cpu, (size_t)R * K * 4, &st);
        cpu->ops->upload_act(cpu, xc, xr, (size_t)R * K);
        if (head) cpu->ops->logits(cpu, cr, xc, wc, R, N, K);
        else {
            void *oc = cpu->ops->alloc(cpu, (size_t)R * N * 4, &st);
            cpu->ops->matmul(cpu, oc, xc, wc, NULL, R, N, K);
            cpu->ops->download_act(cpu, cr, oc, (size_t)R * N);
            cpu->ops->free(cpu, oc);
        }
        size_t far = 0;
        double worst = 0;
        for (int r = 0; r < R; r++)
            for (int n = 0; n < N; n++) {
                double a = cr[(size_t)r * N + n], b = ref[(size_t)rows[r] * N + n], d = fabs(a - b);
                if (!(d <= 2e-2 + 1e-2 * fabs(a))) far++;
                if (d > worst) worst = d;
            }
        /* the same tokens in smaller calls */
        size_t bad = 0;
        char ms[128] = "";
        for (size_t k = 0; k < sizeof Ms / sizeof Ms[0]; k++) {
            int M = Ms[k];
            if (M >= MM) continue;
            int off = (int)(util_rng_next(&rng) % (uint64_t)(MM - M + 1));
            LLAMA_CALL(got, off, M);
            size_t b0 = bad;
            for (size_t i = 0; i < (size_t)M * N; i++) bad += memcmp(&got[i], &ref[(size_t)off * N + i], 4) != 0;
            if (bad > b0) snprintf(ms + strlen(ms), sizeof ms - strlen(ms), " M=%d", M);
        }
        #undef LLAMA_CALL
        int ok = far == 0 && bad == 0 && nan == 0 && errs == 0;
        printf("%-4s %s %d x %d x %d (%s): %d CPU rows max|d| %.2e (atol 2e-2 rtol 1e-2); calls of M < %d: %zu differ%s%s\n",
               ok ? "ok" : "FAIL", names[s], MM, N, K, cuda_gemm_kind(MM, N, K), R, worst, MM, bad, ms,
               errs ? "  [device error]" : nan ? "  [NaN: unwritten outputs]" : "");
        ok ? n_pass++ : n_fail++;
        if (out) gpu->ops->free(gpu, out);
        gpu->ops->free(gpu, xg);
        cpu->ops->free(cpu, xc);
        free2(wc, wg);
        free(x), free(w), free(ref), free(got), free(xr), free(cr);
    }
}

/* norm_matmul (a GEMM fed by add_rmsnorm) against the CPU op and bit for bit against the GPU's
 * add_rmsnorm + matmul (or matmul_swiglu): one token at dim 4096 and 3584 (the GEMM normalises
 * its input itself), and the fallbacks (3 tokens; dim 1024), with and without SwiGLU. */
static void test_norm_matmul(void) {
    /* (1 x 28672 x 4096: Llama-3-8B's gate|up, a stream-K warp's range across two strips) */
    int shapes[][4] = {{1, 6144, 4096, 0}, {1, 2048, 4096, 1}, {1, 1000, 3584, 0}, {3, 1024, 4096, 1},
                       {1, 512, 1024, 0},  {5, 256, 1024, 1},  {1, 14336, 4096, 1}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        int n = shapes[k][0], no = shapes[k][1], D = shapes[k][2], sw = shapes[k][3];
        int rows = sw ? 2 * no : no, outs = n * no;
        float *x = rand_bf16((size_t)n * D, 1.0f), *y = rand_bf16((size_t)n * D, 1.0f), *nw = rand_bf16(D, 1.0f);
        float *w = rand_bf16((size_t)rows * D, 1.0f / sqrtf((float)D)), *bias = rand_bf16(rows, 1.0f);
        float *z = calloc((size_t)n * (2 * rows > D ? 2 * rows : D), 4);
        void *xc, *xg, *yc, *yg, *nc, *ng, *wc, *wg, *bc, *bg, *oc, *og, *hc, *hg, *x2c, *x2g, *guc, *gug;
        up2(&xc, &xg, x, (size_t)n * D);
        up2(&yc, &yg, y, (size_t)n * D);
        up2(&hc, &hg, z, (size_t)n * D);
        up2(&x2c, &x2g, z, (size_t)n * D);
        up2(&guc, &gug, z, (size_t)n * 2 * rows);
        up2(&oc, &og, z, (size_t)outs);
        weight2(&nc, &ng, nw, D, 0);
        weight2(&wc, &wg, w, rows, D);
        weight2(&bc, &bg, bias, rows, 0);
        gpu_fill_nan(og, (size_t)outs);
        gpu_fill_nan(x2g, (size_t)n * D);
        const void *bcu = sw ? NULL : bc, *bgu = sw ? NULL : bg;
        cpu->ops->norm_matmul(cpu, oc, guc, hc, x2c, xc, yc, nc, 1e-5f, wc, bcu, n, no, D, sw);
        gpu->ops->norm_matmul(gpu, og, gug, hg, x2g, xg, yg, ng, 1e-5f, wg, bgu, n, no, D, sw);
        char what[96];
        snprintf(what, sizeof what, "norm_matmul%s %d x %d x %d", sw ? "+swiglu" : "", n, rows, D);
        compare(what, oc, og, (size_t)outs, 3e-2f, 2e-2f);
        snprintf(what, sizeof what, "norm_matmul%s %d x %d x %d (x + y)", sw ? "+swiglu" : "", n, rows, D);
        compare(what, x2c, x2g, (size_t)n * D, 1e-2f, 1e-2f);
        /* the unfused GPU ops: add_rmsnorm in place on a copy of x, then the GEMM */
        enum backend_status st;
        void *ref = gpu->ops->alloc(gpu, (size_t)outs * 2, &st), *xr = gpu->ops->alloc(gpu, (size_t)n * D * 2, &st);
        gpu->ops->upload_act(gpu, xr, x, (size_t)n * D);
        gpu_fill_nan(ref, (size_t)outs);
        gpu->ops->add_rmsnorm(gpu, hg, xr, yg, ng, n, D, 1e-5f);
        if (sw) gpu->ops->matmul_swiglu(gpu, ref, gug, hg, wg, n, no, D);
        else gpu->ops->matmul(gpu, ref, hg, wg, bgu, n, no, D);
        int errs = gpu->ops->sync(gpu) != 0;
        size_t m = (size_t)(outs > n * D ? outs : n * D);
        float *a = malloc(sizeof(float) * m), *b = malloc(sizeof(float) * m);
        gpu->ops->download_act(gpu, a, og, (size_t)outs);
        gpu->ops->download_act(gpu, b, ref, (size_t)outs);
        size_t bad = 0;
        for (size_t i = 0; i < (size_t)outs; i++) bad += isnan(a[i]) || memcmp(&a[i], &b[i], 4) != 0;
        gpu->ops->download_act(gpu, a, x2g, (size_t)n * D);
        gpu->ops->download_act(gpu, b, xr, (size_t)n * D);
        for (size_t i = 0; i < (size_t)n * D; i++) bad += isnan(a[i]) || memcmp(&a[i], &b[i], 4) != 0;
        int ok = bad == 0 && errs == 0;
        snprintf(what, sizeof what, "norm_matmul%s %d x %d x %d", sw ? "+swiglu" : "", n, rows, D);
        printf("%-4s %-58s %zu differ from add_rmsnorm + GEMM (want 0)%s\n", ok ? "ok" : "FAIL", what, bad,
               errs ? "  [device error]" : "");
        ok ? n_pass++ : n_fail++;
        gpu->ops->free(gpu, ref);
        gpu->ops->free(gpu, xr);
        free2(xc, xg), free2(yc, yg), free2(nc, ng), free2(wc, wg), free2(bc, bg), free2(oc, og), free2(hc, hg);
        free2(x2c, x2g), free2(guc, gug);
        free(x), free(y), free(nw), free(w), free(bias), free(z), free(a), free(b);
    }
}

static void test_rope(void) {
    struct model_config cfgs[3] = {{0}};
    const char *names[3] = {"default theta 1e4", "linear x4", "llama3 (8, 1, 4, 8192) theta 5e5"};
    cfgs[0].rope_type = ROPE_TYPE_DEFAULT, cfgs[0].rope_theta = 10000.0f;
    cfgs[1].rope_type = ROPE_TYPE_LINEAR, cfgs[1].rope_theta = 10000.0f, cfgs[1].rope_factor = 4.0f;
    cfgs[2].rope_type = ROPE_TYPE_LLAMA3, cfgs[2].rope_theta = 500000.0f, cfgs[2].rope_factor = 8.0f;
    cfgs[2].rope_low_freq_factor = 1.0f, cfgs[2].rope_high_freq_factor = 4.0f, cfgs[2].rope_orig_max_pos = 8192;
    int hds[2] = {64, 128};
    for (int c = 0; c < 3; c++)
        for (int hi = 0; hi < 2; hi++) {
            int hd = hds[hi], H = 8, KV = 2, T = 16;
            cfgs[c].head_dim = hd;
            float inv[64];
            model_rope_inv_freq(&cfgs[c], inv);
            int rs = (H + 2 * KV) * hd; /* q | k | v rows; rope touches q and k */
            float *q = rand_bf16((size_t)T * rs, 1.0f);
            void *qc, *qg, *ic, *ig;
            up2(&qc, &qg, q, (size_t)T * rs);
            enum backend_status st;
            ic = cpu->ops->alloc(cpu, sizeof inv, &st);
            ig = gpu->ops->alloc(gpu, sizeof inv, &st);
            cpu->ops->upload_f32(cpu, ic, inv, hd / 2);
            gpu->ops->upload_f32(gpu, ig, inv, hd / 2);
            int32_t pos[16], ss[2] = {0, T}, ip[2] = {0, 0};
            for (int i = 0; i < T; i++) pos[i] = (int32_t)(util_rng_next(&rng) % 32768);
            struct fwd_batch bt = {T, 1, pos, pos, ss, ip, NULL, NULL, 0, NULL, NULL, false};
            batch_both(&bt);
            cpu->ops->rope(cpu, qc, H + KV, hd, rs, ic);
            gpu->ops->rope(gpu, qg, H + KV, hd, rs, ig);
            char what[96];
            snprintf(what, sizeof what, "rope %s, hd %d, positions < 32k", names[c], hd);
            compare(what, qc, qg, (size_t)T * rs, 2e-2f, 1e-2f);
            free2(qc, qg), free2(ic, ig);
            free(q);
        }
}

/* Attention: pools filled with random K/V (both backends the same), block tables shuffled,
 * then a step of `T` query tokens per sequence (T = 1: decode; T > 1: a prefill chunk). */
/* Optional knobs of an attention case: a sliding window for the retrieval heads, and K/V scales
 * (small keys and large values make every key's weight visible in the output, so a mask that
 * drops or adds a single key fails the tolerance). */
struct attn_opts {
    int window;
    float kscale, vscale;
    const int *starts; /* when set: sequence s starts at starts[s] (<= ctx), not ctx - 7 s */
    int rope;          /* 1: the GPU runs rope_attention (fused RoPE + append), the CPU rope() then
                        * attention(); and a second GPU run of rope() then attention() must give the
                        * same bits */
    int fp8;           /* 1: fp8 KV pools (KV_DTYPE_FP8_E4M3), the same bytes in both backends, K and V
                        * scales 0.5, 1 and 2 by KV head (fp8_scale) */
    float tol;         /* the output's rtol against the CPU, and tol x vscale its atol (0: 2e-2, 2e-2) */
    int alone;         /* 1: a decode step the batch decode kernel (cuda/attn_decode.cu) takes (more
                        * units than the flash kernel's resident blocks, or a work-sized split):
                        * checked to have run there, and sequences 0, n/2 and n - 1 again each alone
                        * (the flash kernel, or the batch kernel's split) give the same bits */
};

/* cuda/cuda_attention.h's (it needs the CUDA headers, which this file is built without): the
 * decode steps the batch decode kernel ran so far */
long cuda_attention_batch_launches(void);

/* attention_case's alone check: the step's GPU runs (want of them) took the batch decode kernel,
 * and (each) sequences 0, n/2 and n - 1 of bt, each as a step of its own on the GPU from the same
 * q|k|v rows and pools (the append writes the same rows again), give their rows of og bit for bit */
static void attention_alone(const struct fwd_batch *bt, const struct attn_layer *Lg, void *qg, void *og, int rs,
                            long launched, long want, bool each) {
    const int H = Lg->n_heads, hd = Lg->head_dim, S = bt->n_seqs;
    const int pick[3] = {0, S / 2, S - 1};
    size_t differ = 0;
    enum backend_status st;
    void *o1 = gpu->ops->alloc(gpu, (size_t)H * hd * 2, &st);
    float *x = malloc((size_t)H * hd * 4), *y = malloc((size_t)S * H * hd * 4);
    gpu->ops->download_act(gpu, y, og, (size_t)S * H * hd);
    for (int k = 0; k < (each ? 3 : 0); k++) {
        const int s = pick[k], n_blk = bt->block_indptr[s + 1] - bt->block_indptr[s];
        const int32_t tok = 0, ss[2] = {0, 1}, ip[2] = {0, n_blk};
        struct fwd_batch b1 = {1, 1, &tok, bt->pos + s, ss, ip, bt->block_ids + bt->block_indptr[s],
                               bt->stream_slot + s, 0, NULL, NULL, false};
        gpu->ops->begin_step(gpu, &b1);
        gpu->ops->attention(gpu, o1, (char *)qg + (size_t)s * rs * 2, rs, Lg);
        gpu->ops->download_act(gpu, x, o1, (size_t)H * hd);
        for (int i = 0; i < H * hd; i++) differ += memcmp(&x[i], &y[(size_t)s * H * hd + i], 4) != 0;
    }
    const int ok = differ == 0 && launched == want && gpu->ops->sync(gpu) == 0;
    printf("%-4s   ... in the batch decode kernel: %ld of %ld GPU runs", ok ? "ok" : "FAIL", launched, want);
    if (each) printf("; sequences 0, %d, %d alone: %zu values differ (want 0)", S / 2, S - 1, differ);
    printf("\n");
    ok ? n_pass++ : n_fail++;
    gpu->ops->free(gpu, o1);
    free(x), free(y);
}

/* fp8 pools: the scale of KV head h's K (v = 0) or V (v = 1) */
static float fp8_scale(int h, int v) {
    static const float sc[3] = {0.5f, 1.0f, 2.0f};
    return sc[v ? 2 - h % 3 : h % 3];
}
/* A pool of n elements (rows of hd, n_heads heads a row group, the first KV head h0) from f32
 * data as e4m3(x / scale) bytes, in both backends (pc may be NULL: the GPU's alone). */
static void pool2_fp8(void **pc, void **pg, const float *h, size_t n, int hd, int n_heads, int h0, int v) {
    enum backend_status st;
    uint8_t *b = malloc(n);
    for (size_t i = 0; i < n; i++) b[i] = fp8_e4m3_from_f32(h[i] / fp8_scale(h0 + (int)(i / hd % (n_heads ? n_heads : 1)), v));
    if (pc) {
        *pc = cpu->ops->alloc(cpu, n, &st);
        cpu->ops->upload_bytes(cpu, *pc, b, n);
    }
    *pg = gpu->ops->alloc(gpu, n, &st);
    gpu->ops->upload_bytes(gpu, *pg, b, n);
    free(b);
}
/* Two fp8 pools of n bytes (a: the CPU's when ga is false, else the GPU's; b: the GPU's): the
 * bytes whose codes differ by more than max_codes (a sign change counts as far) */
static size_t fp8_differ(const void *a, bool ga, const void *b, size_t n, int max_codes) {
    uint8_t *x = malloc(n), *y = malloc(n);
    (ga ? gpu : cpu)->ops->download_bytes(ga ? gpu : cpu, x, a, n);
    gpu->ops->download_bytes(gpu, y, b, n);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        const int a = x[i] & 0x7f, b = y[i] & 0x7f; /* magnitudes: codes in order; 0x7f is NaN */
        if (a == 0x7f || b == 0x7f) bad += a != b || x[i] != y[i];
        else if ((x[i] ^ y[i]) & 0x80) bad += a != 0 || b != 0; /* signs apart: only +-0 agree */
        else bad += abs(a - b) > max_codes;
    }
    free(x), free(y);
    return bad;
}
static void fp8_compare(const char *what, const void *pc, const void *pg, size_t n, int max_codes) {
    int sync = gpu->ops->sync(gpu);
    size_t bad = fp8_differ(pc, false, pg, n, max_codes);
    int ok = bad == 0 && sync == 0;
    printf("%-4s %-58s %zu of %zu bytes differ by more than %d code(s)%s\n", ok ? "ok" : "FAIL", what, bad, n,
           max_codes, sync ? "  [device error]" : "");
    ok ? n_pass++ : n_fail++;
}

/* A second CUDA backend (set while the long decode cases run), made with BACKEND_CUDA_PLAIN_SPLIT
 * (so that the first splits long decode steps by the work, this one the plain way, as when the
 * work-sized split cannot run). attention_case runs its step there too, from the same inputs, and
 * wants the same bits: the partition states and their merge order do not depend on which block
 * computes what. */
static struct backend *gpu_alt;

/* bt's step on gpu_alt from fresh copies of the inputs (the pools as before the step, q|k|v as
 * drawn; rope: the fused RoPE with attention_case's llama3 tables): its output, and with RoPE the
 * q|k|v rows and the full K pool after the step, bit for bit against the primary GPU's (og, qg, kfg). */
static void attention_alt(const struct fwd_batch *bt, const struct attn_layer *L0, const float *q, const float *kf,
                          const float *vf, const float *ks, const float *vs, int rs, int TT, size_t full_n,
                          size_t slot_n, bool rope, void *og, void *qg, void *kfg) {
    enum backend_status st;
    struct backend *g = gpu_alt;
    size_t on = (size_t)TT * L0->n_heads * L0->head_dim, qn = (size_t)TT * rs;
    void *bufs[7];
    size_t ns[7] = {full_n + 1, full_n + 1, slot_n + 1, slot_n + 1, qn, on, 128};
    const float *src[6] = {kf, vf, ks, vs, q, NULL};
    for (int i = 0; i < 7; i++) {
        bufs[i] = g->ops->alloc(g, ns[i] * (i == 6 ? 4 : 2), &st);
        if (i < 5) g->ops->upload_act(g, bufs[i], src[i], ns[i]);
    }
    struct attn_layer L = *L0;
    L.k_full = bufs[0], L.v_full = bufs[1], L.k_stream = bufs[2], L.v_stream = bufs[3];
    g->ops->begin_step(g, bt);
    if (rope) {
        float inv[128];
        struct model_config rc = {.rope_type = ROPE_TYPE_LLAMA3, .rope_theta = 500000.0f, .rope_factor = 8.0f,
                                  .rope_low_freq_factor = 1.0f, .rope_high_freq_factor = 4.0f,
                                  .rope_orig_max_pos = 8192, .head_dim = L.head_dim};
        model_rope_inv_freq(&rc, inv);
        g->ops->upload_f32(g, bufs[6], inv, L.head_dim / 2);
        g->ops->rope_attention(g, bufs[5], bufs[4], rs, &L, bufs[6]);
    } else {
        g->ops->attention(g, bufs[5], bufs[4], rs, &L);
    }
    int err = g->ops->sync(g) != 0 || gpu->ops->sync(gpu) != 0;
    void *mine[3] = {og, qg, kfg}, *theirs[3] = {bufs[5], bufs[4], bufs[0]};
    size_t n_cmp[3] = {on, qn, full_n}, differ = 0;
    for (int k = 0; k < (rope ? 3 : 1); k++) {
        float *x = malloc(n_cmp[k] * 4), *y = malloc(n_cmp[k] * 4);
        gpu->ops->download_act(gpu, x, mine[k], n_cmp[k]);
        g->ops->download_act(g, y, theirs[k], n_cmp[k]);
        for (size_t i = 0; i < n_cmp[k]; i++) differ += memcmp(&x[i], &y[i], 4) != 0;
        free(x), free(y);
    }
    int ok = differ == 0 && !err;
    printf("%-4s   ... under the plain split too: %zu values differ (want 0)%s\n", ok ? "ok" : "FAIL", differ,
           err ? "  [device error]" : "");
    ok ? n_pass++ : n_fail++;
    for (int i = 0; i < 7; i++) g->ops->free(g, bufs[i]);
}

static void attention_case(int H, int KV, int hd, int n_stream, int ctx, int T, int n_seqs, int sink, int recent,
                           const struct attn_opts *opt) {
    struct attn_opts o = opt ? *opt : (struct attn_opts){.kscale = 1.0f, .vscale = 1.0f};
    int bs = 16, n_full = KV - n_stream;
    /* sequence s: T tokens from position starts[s] (or ctx - 7 s), in blocks ip[s] .. ip[s + 1] */
    int32_t *ip = malloc(4 * (n_seqs + 1));
    ip[0] = 0;
    for (int s = 0; s < n_seqs; s++) ip[s + 1] = ip[s] + ((o.starts ? o.starts[s] : ctx - s * 7) + T + bs - 1) / bs;
    int NB = ip[n_seqs];
    size_t full_n = (size_t)NB * bs * n_full * hd, slot_n = (size_t)n_seqs * (sink + recent) * n_stream * hd;
    float *kf = rand_bf16(full_n + 1, o.kscale), *vf = rand_bf16(full_n + 1, o.vscale);
    float *ks = rand_bf16(slot_n + 1, o.kscale), *vs = rand_bf16(slot_n + 1, o.vscale);
    int TT = T * n_seqs;
    int rs = (H + 2 * KV) * hd;
    float *q = rand_bf16((size_t)TT * rs, 1.0f), *z = calloc((size_t)TT * H * hd, 4);
    for (int t = 0; t < TT; t++) /* this step's K and V parts of each q|k|v row */
        for (int i = H * hd; i < rs; i++) {
            float sc = i < (H + KV) * hd ? o.kscale : o.vscale;
            q[(size_t)t * rs + i] = util_bf16_to_f32(util_f32_to_bf16(q[(size_t)t * rs + i] * sc));
        }
    void *kfc, *kfg, *vfc, *vfg, *ksc, *ksg, *vsc, *vsg, *qc, *qg, *oc, *og;
    void *scc[2] = {NULL, NULL}, *scg[2] = {NULL, NULL}; /* fp8: the K and V scales a KV head */
    if (o.fp8) {
        pool2_fp8(&kfc, &kfg, kf, full_n + 1, hd, n_full, 0, 0);
        pool2_fp8(&vfc, &vfg, vf, full_n + 1, hd, n_full, 0, 1);
        pool2_fp8(&ksc, &ksg, ks, slot_n + 1, hd, n_stream, n_full, 0);
        pool2_fp8(&vsc, &vsg, vs, slot_n + 1, hd, n_stream, n_full, 1);
        for (int v = 0; v < 2; v++) {
            float sc[256];
            enum backend_status st;
            for (int h = 0; h < KV; h++) sc[h] = fp8_scale(h, v);
            scc[v] = cpu->ops->alloc(cpu, sizeof sc, &st), scg[v] = gpu->ops->alloc(gpu, sizeof sc, &st);
            cpu->ops->upload_f32(cpu, scc[v], sc, KV), gpu->ops->upload_f32(gpu, scg[v], sc, KV);
        }
    } else {
        up2(&kfc, &kfg, kf, full_n + 1);
        up2(&vfc, &vfg, vf, full_n + 1);
        up2(&ksc, &ksg, ks, slot_n + 1);
        up2(&vsc, &vsg, vs, slot_n + 1);
    }
    up2(&qc, &qg, q, (size_t)TT * rs);
    up2(&oc, &og, z, (size_t)TT * H * hd);
    /* shuffled block ids */
    int32_t *ids = malloc(sizeof(int32_t) * NB);
    for (int i = 0; i < NB; i++) ids[i] = i;
    for (int i = NB - 1; i > 0; i--) {
        int j = (int)(util_rng_next(&rng) % (uint64_t)(i + 1));
        int32_t t = ids[i];
        ids[i] = ids[j];
        ids[j] = t;
    }
    int32_t *toks = calloc(TT, 4), *pos = malloc(4 * TT), *ss = malloc(4 * (n_seqs + 1)), *slots = malloc(4 * n_seqs);
    for (int s = 0; s < n_seqs; s++) {
        int start = o.starts ? o.starts[s] : ctx - s * 7; /* sequences of different lengths */
        ss[s] = s * T;
        slots[s] = n_seqs - 1 - s;
        for (int i = 0; i < T; i++) pos[s * T + i] = start + i;
    }
    ss[n_seqs] = TT;
    struct fwd_batch bt = {TT, n_seqs, toks, pos, ss, ip, ids, slots, 0, NULL, NULL, false};
    batch_both(&bt);
    struct attn_layer L = {.n_heads = H, .n_kv_heads = KV, .head_dim = hd, .n_full = n_full, .n_stream = n_stream,
                           .block_size = bs, .sink = sink, .recent = recent, .sliding_window = o.window,
                           .scale = 1.0f / sqrtf((float)hd)};
    struct attn_layer Lc = L, Lg = L;
    Lc.k_full = kfc, Lc.v_full = vfc, Lc.k_stream = ksc, Lc.v_stream = vsc;
    Lg.k_full = kfg, Lg.v_full = vfg, Lg.k_stream = ksg, Lg.v_stream = vsg;
    if (o.fp8) {
        L.kv_dtype = Lc.kv_dtype = Lg.kv_dtype = KV_DTYPE_FP8_E4M3;
        Lc.k_scale = scc[0], Lc.v_scale = scc[1], Lg.k_scale = scg[0], Lg.v_scale = scg[1];
        L.k_scale = Lg.k_scale, L.v_scale = Lg.v_scale; /* (the second GPU run's) */
    }
    char what[128];
    void *ic = NULL, *ig = NULL, *q2 = NULL, *o2 = NULL, *kf2 = NULL, *vf2 = NULL, *ks2 = NULL, *vs2 = NULL;
    const long launches0 = cuda_attention_batch_launches();
    if (o.rope) { /* llama3 RoPE tables; the unfused GPU run gets its own copies of q and the pools */
        struct model_config rc = {.rope_type = ROPE_TYPE_LLAMA3, .rope_theta = 500000.0f, .rope_factor = 8.0f,
                                  .rope_low_freq_factor = 1.0f, .rope_high_freq_factor = 4.0f,
                                  .rope_orig_max_pos = 8192, .head_dim = hd};
        float inv[128];
        model_rope_inv_freq(&rc, inv);
        enum backend_status st;
        ic = cpu->ops->alloc(cpu, sizeof inv, &st);
        ig = gpu->ops->alloc(gpu, sizeof inv, &st);
        cpu->ops->upload_f32(cpu, ic, inv, hd / 2);
        gpu->ops->upload_f32(gpu, ig, inv, hd / 2);
        void *dummy;
        up2(&dummy, &q2, q, (size_t)TT * rs), cpu->ops->free(cpu, dummy);
        up2(&dummy, &o2, z, (size_t)TT * H * hd), cpu->ops->free(cpu, dummy);
        if (o.fp8) {
            pool2_fp8(NULL, &kf2, kf, full_n + 1, hd, n_full, 0, 0);
            pool2_fp8(NULL, &vf2, vf, full_n + 1, hd, n_full, 0, 1);
            pool2_fp8(NULL, &ks2, ks, slot_n + 1, hd, n_stream, n_full, 0);
            pool2_fp8(NULL, &vs2, vs, slot_n + 1, hd, n_stream, n_full, 1);
        } else {
            up2(&dummy, &kf2, kf, full_n + 1), cpu->ops->free(cpu, dummy);
            up2(&dummy, &vf2, vf, full_n + 1), cpu->ops->free(cpu, dummy);
            up2(&dummy, &ks2, ks, slot_n + 1), cpu->ops->free(cpu, dummy);
            up2(&dummy, &vs2, vs, slot_n + 1), cpu->ops->free(cpu, dummy);
        }
        cpu->ops->rope(cpu, qc, H + KV, hd, rs, ic);
        if (o.fp8) { /* the GPU's rotated Q and K rows are bf16 (rope_append_kernel), and it codes K
                      * to e4m3 from them: the reference from the same bf16 values, not its f32 ones
                      * (else ~3% of the step's K bytes differ by a code, and a streaming head's
                      * 44-key softmax moves past the tolerance) */
            float *r = malloc((size_t)TT * rs * 4);
            cpu->ops->download_act(cpu, r, qc, (size_t)TT * rs);
            for (int t = 0; t < TT; t++)
                for (int i = 0; i < (H + KV) * hd; i++)
                    r[(size_t)t * rs + i] = util_bf16_to_f32(util_f32_to_bf16(r[(size_t)t * rs + i]));
            cpu->ops->upload_act(cpu, qc, r, (size_t)TT * rs);
            free(r);
        }
        cpu->ops->attention(cpu, oc, qc, rs, &Lc);
        gpu->ops->rope_attention(gpu, og, qg, rs, &Lg, ig);
        struct attn_layer L2 = L;
        L2.k_full = kf2, L2.v_full = vf2, L2.k_stream = ks2, L2.v_stream = vs2;
        gpu->ops->rope(gpu, q2, H + KV, hd, rs, ig);
        gpu->ops->attention(gpu, o2, q2, rs, &L2);
    } else {
        cpu->ops->attention(cpu, oc, qc, rs, &Lc);
        gpu->ops->attention(gpu, og, qg, rs, &Lg);
    }
    const long launched = cuda_attention_batch_launches() - launches0;
    snprintf(what, sizeof what, "%sattention%s H%d/KV%d hd%d %d streaming, ctx %d, %d x %d tok%s%s", o.rope ? "rope+" : "",
             o.fp8 ? " fp8" : "", H, KV, hd, n_stream, ctx, n_seqs, T, n_stream ? " (sink/recent)" : "",
             o.starts ? " (mixed contexts)" : opt && !o.rope && !o.fp8 ? " (mask edges)" : "");
    compare(what, oc, og, (size_t)TT * H * hd, o.tol > 0 ? o.tol * o.vscale : 2e-2f, o.tol > 0 ? o.tol : 2e-2f);
    if (o.alone) attention_alone(&bt, &Lg, qg, og, rs, launched, o.rope ? 2 : 1, !o.rope);
    if (gpu_alt && !o.fp8) attention_alt(&bt, &L, q, kf, vf, ks, vs, rs, TT, full_n, slot_n, o.rope, og, qg, kfg);
    if (o.rope) {
        snprintf(what, sizeof what, "  ... q|k rows after the fused RoPE");
        compare(what, qc, qg, (size_t)TT * rs, 2e-2f, 1e-2f);
        snprintf(what, sizeof what, "  ... full V pool after the fused append");
        if (o.fp8) fp8_compare(what, vfc, vfg, full_n, 0);
        else compare(what, vfc, vfg, full_n, 0, 0);
        /* fused and unfused on the GPU: the same bits */
        size_t n_cmp[4] = {(size_t)TT * H * hd, (size_t)TT * rs, full_n, full_n};
        void *fa[4] = {og, qg, kfg, vfg}, *fb[4] = {o2, q2, kf2, vf2};
        size_t differ = 0;
        for (int k = 0; k < 4; k++) {
            if (o.fp8 && k >= 2) { /* the pools: bytes */
                differ += fp8_differ(fa[k], true, fb[k], n_cmp[k], 0);
                continue;
            }
            float *x = malloc(n_cmp[k] * 4), *y = malloc(n_cmp[k] * 4);
            gpu->ops->download_act(gpu, x, fa[k], n_cmp[k]);
            gpu->ops->download_act(gpu, y, fb[k], n_cmp[k]);
            for (size_t i = 0; i < n_cmp[k]; i++) differ += memcmp(&x[i], &y[i], 4) != 0;
            free(x), free(y);
        }
        int ok = differ == 0 && gpu->ops->sync(gpu) == 0;
        printf("%-4s   ... fused vs rope() then attention() on the GPU: %zu values differ (want 0)\n",
               ok ? "ok" : "FAIL", differ);
        ok ? n_pass++ : n_fail++;
        cpu->ops->free(cpu, ic);
        gpu->ops->free(gpu, ig), gpu->ops->free(gpu, q2), gpu->ops->free(gpu, o2), gpu->ops->free(gpu, kf2);
        gpu->ops->free(gpu, vf2), gpu->ops->free(gpu, ks2), gpu->ops->free(gpu, vs2);
    }
    /* the pools the step wrote must agree too (fp8: the bytes; rotated K, bf16 on the GPU before
     * its rounding to e4m3, within a code) */
    snprintf(what, sizeof what, "  ... full pool after the step's K append");
    if (o.fp8) fp8_compare(what, kfc, kfg, full_n, o.rope ? 1 : 0);
    else compare(what, kfc, kfg, full_n, o.rope ? 2e-2f : 0, o.rope ? 1e-2f : 0); /* rotated K: bf16 on the GPU */
    if (n_stream) {
        snprintf(what, sizeof what, "  ... streaming slots after the step's %s append", o.fp8 ? "K" : "K/V");
        if (o.fp8) {
            fp8_compare(what, ksc, ksg, slot_n, o.rope ? 1 : 0);
            snprintf(what, sizeof what, "  ... streaming slots after the step's V append");
            fp8_compare(what, vsc, vsg, slot_n, 0);
        } else {
            compare(what, vsc, vsg, slot_n, 0, 0);
        }
    }
    if (o.fp8) free2(scc[0], scg[0]), free2(scc[1], scg[1]);
    free2(kfc, kfg), free2(vfc, vfg), free2(ksc, ksg), free2(vsc, vsg), free2(qc, qg), free2(oc, og);
    free(kf), free(vf), free(ks), free(vs), free(q), free(z), free(ids), free(toks), free(pos), free(ss), free(ip);
    free(slots);
}

/* The backend of the plain split (gpu_alt). */
static struct backend *other_split_backend(void) {
    char err[256];
    struct backend *b = backend_cuda_create(0, BACKEND_CUDA_PLAIN_SPLIT, err, sizeof err);
    if (!b) {
        printf("FAIL a CUDA backend with the plain split: %s\n", err);
        n_fail++;
    }
    return b;
}

/* Decode steps at long contexts (issue 22): the work-sized split spreads the retrieval heads'
 * partitions over units (past CUDA_ATTN_MERGE_LONG partitions at head dims 64 and 128: the batch
 * decode kernel's resident blocks walk them, its split pairs merged by the long-merge kernel;
 * checked to have run there, and three sequences of each step alone give the same bits); each
 * case also under the plain split (the flash kernel), for the same bits. Keys are scaled by 3, so
 * that a few hundred keys carry each softmax and the outputs stay far from zero at any length: a
 * partition lost or counted twice moves them past the tolerance. Contexts 16k to 1M (a 1M token
 * beside 1k, 32k and 128k ones), batches of 1 to 150 tokens, GQA 4, 8 and 16, head dims 64 and
 * 128, streaming heads, a sliding window, and the fused RoPE (whose rotated Q the long merges write
 * back). */
static void test_long_decode(void) {
    gpu_alt = other_split_backend();
    if (!gpu_alt) return;
    struct attn_opts sharp = {.kscale = 3.0f, .vscale = 1.0f, .alone = 1};
    struct attn_opts win = {.window = 3000, .kscale = 3.0f, .vscale = 1.0f, .alone = 1};
    struct attn_opts fused = {.kscale = 3.0f, .vscale = 1.0f, .rope = 1, .alone = 1};
    attention_case(32, 8, 128, 0, 32768, 1, 1, 0, 1, &sharp);     /* GQA 4 at 32k */
    attention_case(32, 4, 128, 0, 131072, 1, 1, 0, 1, &sharp);    /* GQA 8 at 128k */
    attention_case(32, 8, 128, 4, 131072, 1, 1, 64, 256, &sharp); /* half the KV heads streaming */
    attention_case(32, 4, 128, 0, 16384, 1, 8, 0, 1, &sharp);     /* 8 tokens at 16k */
    attention_case(8, 1, 64, 0, 5000, 1, 150, 0, 1, &sharp);      /* 150 tokens (below and past the long merge) */
    attention_case(16, 2, 128, 0, 40000, 1, 2, 0, 1, &win);       /* the first partitions out of the window */
    attention_case(32, 2, 128, 0, 20000, 1, 1, 0, 1, &sharp);     /* GQA 16 */
    attention_case(16, 4, 64, 1, 60000, 1, 2, 16, 64, &sharp);    /* head dim 64 */
    struct attn_opts fused24 = {.kscale = 3.0f, .vscale = 1.0f, .rope = 1}; /* (split 4: the flash kernel's) */
    attention_case(32, 8, 128, 0, 3000, 1, 1, 0, 1, &fused24);    /* 24 partitions: merged in the decode kernel */
    attention_case(32, 8, 128, 4, 65536, 1, 2, 64, 256, &fused);  /* the long merges write the rotated Q */
    static const int mixed[4] = {1000, 32768, 131072, 1048576};
    struct attn_opts mix = {.kscale = 3.0f, .vscale = 1.0f, .starts = mixed, .alone = 1};
    attention_case(16, 2, 128, 1, 1048576, 1, 4, 64, 256, &mix); /* 1k, 32k, 128k and 1M in one step */
    /* fp8 pools (issue 24): 128k with streaming heads, and the mixed step */
    struct attn_opts f8 = {.kscale = 3.0f, .vscale = 1.0f, .fp8 = 1, .alone = 1};
    attention_case(32, 8, 128, 4, 131072, 1, 1, 64, 256, &f8);
    f8.starts = mixed;
    attention_case(16, 2, 128, 1, 1048576, 1, 4, 64, 256, &f8);
    backend_destroy(gpu_alt);
    gpu_alt = NULL;
}

/* Prefill chunks at long contexts (issue 21: the wgmma prefill kernel by default), against the CPU:
 * chunks behind 16k to 128k of context, starting mid-block (contexts not a multiple of the block
 * size; a second sequence 7 tokens shorter), GQA 4 and 8, head dims 64 and 128, streaming heads
 * with sinks and recent windows of several sizes (a recent window longer than the chunk, a sink
 * longer than a partition). Keys scaled by 3, as the long decode cases. Short chunks: the CPU
 * reference is one thread: ~20 s here in all). */
static void test_long_prefill(void) {
    struct attn_opts sharp = {.kscale = 3.0f, .vscale = 1.0f};
    attention_case(32, 8, 128, 0, 32765, 8, 1, 0, 1, &sharp);      /* GQA 4 at 32k */
    attention_case(32, 4, 128, 2, 16389, 24, 2, 64, 256, &sharp);  /* GQA 8, streaming, two sequences */
    attention_case(16, 4, 64, 1, 24581, 16, 2, 16, 64, &sharp);    /* head dim 64 */
    attention_case(32, 8, 128, 3, 20003, 16, 1, 4, 1024, &sharp);  /* a recent window past the chunk */
    attention_case(16, 2, 128, 1, 9001, 50, 1, 200, 128, &sharp);  /* a sink longer than a partition */
    attention_case(16, 4, 128, 1, 131069, 4, 1, 64, 256, &sharp);  /* 128k */
}

/* fp8 KV pools (issue 24) against the CPU's fp8 reference (the same bytes in; the step's appends
 * must write the same bytes): prefill through the wgmma kernel (head dims 64, 128) and the flash
 * kernel (8, 16), streaming heads reading the step's own rows, decode in the cooperative kernel
 * (split and merged), the fused RoPE decode and the RoPE append, a long work-sized split, and the
 * CUDA-core kernel (head dim 256, GQA 32). */
static void test_attention_fp8(void) {
    struct attn_opts f8 = {.kscale = 1.0f, .vscale = 1.0f, .fp8 = 1};
    struct attn_opts f8rope = {.kscale = 1.0f, .vscale = 1.0f, .rope = 1, .fp8 = 1};
    /* Tight cases, where a value rounded or decoded wrongly (an e4m3 step is 6-12%) cannot hide in
     * the average: keys near zero (equal weights), values past e4m3's range (x / scale beyond 448:
     * saturated), and masks that leave each query one key (a window of 1: its own row, appended and
     * read back from the pool) or two (a sink of 1 and a recent window of 1: key 0 from the pool, and
     * its own row from q|k|v). The output is then a mean of one or two decoded values, to bf16
     * (within 0.5%, and 10 absolute: an e4m3 step of a value past 80 is more). */
    struct attn_opts one = {.window = 1, .kscale = 1e-3f, .vscale = 2000.0f, .fp8 = 1, .tol = 5e-3f};
    struct attn_opts two = {.kscale = 1e-3f, .vscale = 2000.0f, .fp8 = 1, .tol = 5e-3f};
    attention_case(16, 4, 128, 0, 300, 1, 2, 0, 1, &one);   /* decode, retrieval heads */
    attention_case(16, 4, 128, 0, 300, 40, 2, 0, 1, &one);  /* prefill (wgmma) */
    attention_case(8, 2, 16, 0, 100, 20, 2, 0, 1, &one);    /* prefill (flash) */
    attention_case(32, 8, 128, 8, 700, 1, 2, 1, 1, &two);   /* decode, streaming heads */
    attention_case(32, 8, 128, 8, 700, 50, 2, 1, 1, &two);  /* prefill, streaming heads */
    attention_case(32, 1, 128, 1, 300, 5, 2, 1, 1, &two);   /* the CUDA-core kernel (GQA 32) */
    /* the other kernel forms: split decode merged in a cluster (2 .. 8 partitions), head dims 16,
     * 32 and 64 in decode and prefill, the CUDA-core kernel with the step's streaming rows */
    attention_case(32, 8, 128, 3, 500, 1, 2, 16, 64, &f8);
    attention_case(16, 4, 64, 1, 700, 1, 2, 4, 40, &f8);
    attention_case(8, 2, 32, 1, 300, 1, 2, 4, 16, &f8);
    attention_case(8, 4, 16, 0, 200, 1, 2, 0, 1, &f8);
    attention_case(8, 2, 32, 1, 200, 17, 2, 4, 16, &f8);
    attention_case(32, 1, 256, 1, 200, 3, 2, 4, 16, &f8);
    attention_case(32, 8, 128, 3, 700, 100, 2, 16, 64, &f8);
    attention_case(14, 2, 64, 1, 300, 33, 3, 4, 40, &f8);
    attention_case(8, 2, 16, 0, 100, 20, 2, 0, 1, &f8);
    attention_case(8, 4, 8, 2, 50, 9, 2, 3, 16, &f8);
    attention_case(32, 8, 128, 5, 2000, 1, 3, 64, 256, &f8);
    attention_case(16, 4, 64, 2, 3000, 1, 2, 1100, 200, &f8);
    attention_case(32, 8, 128, 3, 2000, 1, 3, 16, 64, &f8rope);
    attention_case(32, 8, 128, 3, 100, 1, 2, 16, 64, &f8rope);
    attention_case(14, 2, 64, 1, 300, 33, 3, 4, 40, &f8rope);
    /* a work-sized split past CUDA_ATTN_MERGE_LONG partitions: the batch decode kernel's fp8 form */
    struct attn_opts f8long = {.kscale = 3.0f, .vscale = 1.0f, .fp8 = 1, .alone = 1};
    attention_case(32, 4, 128, 2, 20000, 1, 2, 64, 256, &f8long);
    attention_case(32, 1, 256, 0, 300, 3, 2, 0, 1, &f8);
}

/* Attention batch invariance, bit for bit, on the GPU: the rows of one sequence's T-token
 * prefill must come out the same computed (A) in one step, (B) in three chunks (c1, T-1-c1, 1:
 * the last one a decode-shaped step), and (C) in one step behind another sequence's 5 tokens.
 * Every scenario starts from the same pool contents. */
static void attention_invariance(int H, int KV, int hd, int n_stream, int ctx, int T, int c1, int sink, int recent,
                                 int window) {
    int bs = 16, n_full = KV - n_stream, per = (ctx + T + bs - 1) / bs, NB = 2 * per;
    size_t full_n = (size_t)NB * bs * n_full * hd + 1, slot_n = (size_t)2 * (sink + recent) * n_stream * hd + 1;
    float *kf = rand_bf16(full_n, 1.0f), *vf = rand_bf16(full_n, 1.0f), *ks = rand_bf16(slot_n, 1.0f),
          *vs = rand_bf16(slot_n, 1.0f);
    int rs = (H + 2 * KV) * hd, TT = T + 5;
    float *q = rand_bf16((size_t)TT * rs, 1.0f);
    int32_t ids[4096], toks[4096] = {0}, pos[4096];
    for (int i = 0; i < NB; i++) ids[i] = (i * 7 + 3) % NB; /* non-contiguous, a permutation (NB % 7 != 0) */
    enum backend_status st;
    void *pk = gpu->ops->alloc(gpu, full_n * 2, &st), *pv = gpu->ops->alloc(gpu, full_n * 2, &st);
    void *sk = gpu->ops->alloc(gpu, slot_n * 2, &st), *sv = gpu->ops->alloc(gpu, slot_n * 2, &st);
    void *qg = gpu->ops->alloc(gpu, (size_t)TT * rs * 2, &st), *og = gpu->ops->alloc(gpu, (size_t)TT * H * hd * 2, &st);
    gpu->ops->upload_act(gpu, qg, q, (size_t)TT * rs);
    struct attn_layer L = {.n_heads = H, .n_kv_heads = KV, .head_dim = hd, .n_full = n_full, .n_stream = n_stream,
                           .block_size = bs, .sink = sink, .recent = recent, .sliding_window = window,
                           .scale = 1.0f / sqrtf((float)hd), .k_full = pk, .v_full = pv, .k_stream = sk, .v_stream = sv};
    size_t on = (size_t)T * H * hd;
    float *out[3];
    int errs = 0;
    for (int sc = 0; sc < 3; sc++) {
        gpu_fill_nan(og, (size_t)TT * H * hd);
        gpu->ops->upload_act(gpu, pk, kf, full_n);
        gpu->ops->upload_act(gpu, pv, vf, full_n);
        gpu->ops->upload_act(gpu, sk, ks, slot_n);
        gpu->ops->upload_act(gpu, sv, vs, slot_n);
        out[sc] = malloc(on * 4);
        int cuts[4] = {0, T, T, T}, n_chunks = 1;
        if (sc == 1) cuts[1] = c1, cuts[2] = T - 1, cuts[3] = T, n_chunks = 3;
        for (int k = 0; k < n_chunks; k++) {
            int a = cuts[k], n = cuts[k + 1] - a, lead = sc == 2 ? 5 : 0;
            /* sequence 0 of the batch: the other one (scenario C) at positions 40.., its own blocks and slot */
            int32_t ss[3], ip[3], slots[2];
            int ns = 0;
            if (lead) {
                for (int i = 0; i < lead; i++) pos[i] = 40 + i;
                ss[0] = 0, ip[0] = 0, slots[0] = 1, ns = 1;
                ip[1] = per;
            }
            for (int i = 0; i < n; i++) pos[lead + i] = ctx + a + i;
            ss[ns] = lead, ip[ns] = lead ? per : 0, slots[ns] = 0;
            ss[ns + 1] = lead + n, ip[ns + 1] = ip[ns] + per;
            /* sequence 1 (ours) uses blocks [0, per) of ids in every scenario */
            int32_t idv[4096];
            if (lead) {
                for (int i = 0; i < per; i++) idv[i] = ids[per + i], idv[per + i] = ids[i];
            } else {
                memcpy(idv, ids, sizeof(int32_t) * per);
            }
            struct fwd_batch bt = {lead + n, ns + 1, toks, pos, ss, ip, idv, slots, 0, NULL, NULL, false};
            gpu->ops->begin_step(gpu, &bt);
            /* the step's q rows: the lead's (any rows) then ours, contiguous */
            void *qs = (char *)qg + (size_t)(a - lead + 5) * rs * 2;
            void *os = (char *)og + (size_t)(a - lead + 5) * H * hd * 2;
            gpu->ops->attention(gpu, os, qs, rs, &L);
        }
        errs += gpu->ops->sync(gpu) != 0;
        gpu->ops->download_act(gpu, out[sc], (char *)og + (size_t)5 * H * hd * 2, on);
    }
    size_t bad_b = 0, bad_c = 0;
    for (size_t i = 0; i < on; i++) {
        bad_b += isnan(out[0][i]) || isnan(out[1][i]);
        bad_c += isnan(out[2][i]);
        bad_b += memcmp(&out[0][i], &out[1][i], 4) != 0;
        bad_c += memcmp(&out[0][i], &out[2][i], 4) != 0;
    }
    int ok = bad_b == 0 && bad_c == 0 && errs == 0;
    printf("%-4s attention invariance H%d/KV%d hd%d %d streaming%s, %d tok at ctx %d: chunked %zu, batched %zu "
           "differ (want 0)%s\n",
           ok ? "ok" : "FAIL", H, KV, hd, n_stream, window ? ", window" : "", T, ctx, bad_b, bad_c,
           errs ? "  [device error]" : "");
    ok ? n_pass++ : n_fail++;
    gpu->ops->free(gpu, pk), gpu->ops->free(gpu, pv), gpu->ops->free(gpu, sk), gpu->ops->free(gpu, sv);
    gpu->ops->free(gpu, qg), gpu->ops->free(gpu, og);
    for (int sc = 0; sc < 3; sc++) free(out[sc]);
    free(kf), free(vf), free(ks), free(vs), free(q);
}

/* DUOSERVE_TEST_ONLY=attnbench (profiling, not a test): one Llama-3-8B-shaped decode token's
 * RoPE + attention (32/8 heads, head dim 128) at several contexts: the time a call, and with an
 * FA_CLOCKS build the flash kernel's phase stamps (clock64) of the last call. */
#ifdef FA_CLOCKS
int cuda_attention_clocks(long long *out);
#endif
static void attention_bench(int ctx) {
    int H = 32, KV = 8, hd = 128, bs = 16, NB = (ctx + 1 + bs - 1) / bs, rs = (H + 2 * KV) * hd;
    size_t full_n = (size_t)NB * bs * KV * hd;
    enum backend_status st;
    void *kf = gpu->ops->alloc(gpu, full_n * 2, &st), *vf = gpu->ops->alloc(gpu, full_n * 2, &st);
    void *q = gpu->ops->alloc(gpu, (size_t)rs * 2, &st), *o = gpu->ops->alloc(gpu, (size_t)H * hd * 2, &st);
    float *hq = rand_bf16(rs, 1.0f);
    gpu->ops->upload_act(gpu, q, hq, rs);
    gpu_fill_nan(o, (size_t)H * hd);
    float *hk = rand_bf16((size_t)bs * KV * hd, 1.0f); /* one block's worth, repeated */
    for (int i = 0; i < NB; i++) {
        gpu->ops->upload_act(gpu, (char *)kf + (size_t)i * bs * KV * hd * 2, hk, (size_t)bs * KV * hd);
        gpu->ops->upload_act(gpu, (char *)vf + (size_t)i * bs * KV * hd * 2, hk, (size_t)bs * KV * hd);
    }
    int32_t *ids = malloc(sizeof(int32_t) * NB), tok = 0, p = ctx, ss[2] = {0, 1}, ip[2] = {0, NB}, slot = 0;
    for (int i = 0; i < NB; i++) ids[i] = i;
    struct fwd_batch bt = {1, 1, &tok, &p, ss, ip, ids, &slot, 0, NULL, NULL, false};
    gpu->ops->begin_step(gpu, &bt);
    struct attn_layer L = {.n_heads = H, .n_kv_heads = KV, .head_dim = hd, .n_full = KV, .n_stream = 0,
                           .block_size = bs, .sink = 0, .recent = 1, .k_full = kf, .v_full = vf,
                           .scale = 1.0f / sqrtf((float)hd)};
    /* the engine's op: RoPE (llama3 tables) + append + attention (q and k rotate a little
     * further each call, which changes no timing) */
    struct model_config rc = {.rope_type = ROPE_TYPE_LLAMA3, .rope_theta = 500000.0f, .rope_factor = 8.0f,
                              .rope_low_freq_factor = 1.0f, .rope_high_freq_factor = 4.0f,
                              .rope_orig_max_pos = 8192, .head_dim = hd};
    float inv[64];
    model_rope_inv_freq(&rc, inv);
    void *ig = gpu->ops->alloc(gpu, sizeof inv, &st);
    gpu->ops->upload_f32(gpu, ig, inv, hd / 2);
    int reps = 200;
    for (int r = 0; r < 10; r++) gpu->ops->rope_attention(gpu, o, q, rs, &L, ig);
    gpu->ops->sync(gpu);
    double t0 = util_now();
    for (int r = 0; r < reps; r++) gpu->ops->rope_attention(gpu, o, q, rs, &L, ig);
    int err = gpu->ops->sync(gpu);
    double us = (util_now() - t0) / reps * 1e6;
    printf("attnbench ctx %6d: %8.2f us a call (rope + append + attention)%s\n", ctx, us, err ? " [device error]" : "");
#ifdef FA_CLOCKS
    long long c[64];
    if (cuda_attention_clocks(c) == 64) {
        /* stamp i (cycles after entry) for every one the kernel set: 1 setup, 2 first loads issued,
         * then per tile (prefill kernel: 3 + 4i ..) or partition (decode: 3 + 6i ..); 40 end */
        printf("  stamps (cycles from entry):");
        for (int i = 1; i <= 40; i++)
            if (c[i] > c[0]) printf(" %d:%lld", i, c[i] - c[0]);
        if (c[49] > c[48] && c[40] > c[0])
            printf("; entry to end %lld ns (%.0f MHz)", c[49] - c[48], (double)(c[40] - c[0]) * 1e3 / (double)(c[49] - c[48]));
        printf("\n");
    }
#endif
    gpu->ops->free(gpu, kf), gpu->ops->free(gpu, vf), gpu->ops->free(gpu, q), gpu->ops->free(gpu, o);
    gpu->ops->free(gpu, ig);
    free(hq), free(hk), free(ids);
}


/* DUOSERVE_TEST_ONLY=prefillbench (profiling, not a test): one Llama-3-8B-shaped layer's causal
 * prefill attention (32/8 heads, head dim 128, full attention) of a prompt of n tokens in one
 * step (the engine's op: the step's K/V appended to the pool, then attention), the time a call
 * and TFLOP/s in standard FLOPs (4 n^2 / 2 x head dim x heads). Which kernel: as the backend's
 * switches say (DUOSERVE_ATTN_WG). */
static void prefill_bench(int n) {
    const int H = 32, KV = 8, hd = 128, bs = 16, NB = (n + bs - 1) / bs, rs = (H + 2 * KV) * hd, R = 1024;
    const size_t full_n = (size_t)NB * bs * KV * hd;
    enum backend_status st;
    void *kf = gpu->ops->alloc(gpu, full_n * 2, &st), *vf = gpu->ops->alloc(gpu, full_n * 2, &st);
    void *q = gpu->ops->alloc(gpu, (size_t)n * rs * 2, &st), *o = gpu->ops->alloc(gpu, (size_t)n * H * hd * 2, &st);
    if (!kf || !vf || !q || !o) {
        printf("prefillbench %6d: out of device memory\n", n);
        gpu->ops->free(gpu, kf), gpu->ops->free(gpu, vf), gpu->ops->free(gpu, q), gpu->ops->free(gpu, o);
        return;
    }
    float *hq = rand_bf16((size_t)R * rs, 1.0f); /* R random rows, repeated */
    for (int r0 = 0; r0 < n; r0 += R)
        gpu->ops->upload_act(gpu, (char *)q + (size_t)r0 * rs * 2, hq, (size_t)(n - r0 < R ? n - r0 : R) * rs);
    int32_t *ids = malloc(sizeof(int32_t) * NB), *pos = malloc(sizeof(int32_t) * n), *tok = calloc((size_t)n, sizeof(int32_t));
    for (int i = 0; i < NB; i++) ids[i] = i;
    for (int i = 0; i < n; i++) pos[i] = i;
    int32_t ss[2] = {0, n}, ip[2] = {0, NB}, slot = 0;
    struct fwd_batch bt = {n, 1, tok, pos, ss, ip, ids, &slot, 0, NULL, NULL, false};
    gpu->ops->begin_step(gpu, &bt);
    struct attn_layer L = {.n_heads = H, .n_kv_heads = KV, .head_dim = hd, .n_full = KV, .n_stream = 0,
                           .block_size = bs, .sink = 0, .recent = 1, .k_full = kf, .v_full = vf,
                           .scale = 1.0f / sqrtf((float)hd)};
    const int reps = n >= 65536 ? 2 : n >= 16384 ? 5 : 20;
    gpu->ops->attention(gpu, o, q, rs, &L);
    gpu->ops->sync(gpu);
    double t0 = util_now();
    for (int r = 0; r < reps; r++) gpu->ops->attention(gpu, o, q, rs, &L);
    int err = gpu->ops->sync(gpu);
    const double s = (util_now() - t0) / reps, flop = 2.0 * H * hd * (double)n * (double)n;
    printf("prefillbench %6d tokens: %9.3f ms a call, %6.1f TFLOP/s%s\n", n, s * 1e3, flop / s * 1e-12,
           err ? " [device error]" : "");
    gpu->ops->free(gpu, kf), gpu->ops->free(gpu, vf), gpu->ops->free(gpu, q), gpu->ops->free(gpu, o);
    free(hq), free(ids), free(pos), free(tok);
}

/* DUOSERVE_TEST_ONLY=gemmbench: Llama-3-8B's GEMMs alone at decode and prefill batch sizes, us a
 * call (back to back, then one sync), the default kernels against cuBLAS. */
static void gemm_bench(void) {
    char err[256];
    struct backend *blas = backend_cuda_create(0, BACKEND_CUDA_CUBLAS, err, sizeof err);
    int shapes[][2] = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}};
    const char *names[] = {"qkv", "o", "gate|up", "down"};
    int Ms[] = {64, 128, 256, 384, 512, 1024, 2048, 8192};
    const char *ms_env = getenv("GEMMBENCH_MS"); /* "2048,8192": only these M */
    struct {
        char name[16];
    } v[1] = {{"default"}};
    const int nv = 1;
    /* GEMMBENCH_ONLY="gate|up,2048,default": one shape, M and kernel (default or cublas: for a profiler) */
    const char *only = getenv("GEMMBENCH_ONLY");
    char o_shape[32] = "", o_var[32] = "";
    int o_m = 0;
    if (only) sscanf(only, "%31[^,],%d,%31s", o_shape, &o_m, o_var);
    enum backend_status st;
    printf("gemmbench: us a call%*s", 18, "");
    for (int k = 0; k < nv; k++) printf(" %9s", v[k].name);
    printf(" %9s   best TFLOP/s\n", "cublas");
    for (int s = 0; s < 4; s++) {
        if (only && strcmp(o_shape, names[s])) continue;
        const int N = shapes[s][0], K = shapes[s][1], MM = 8192;
        float *x = rand_bf16((size_t)MM * K, 1.0f), *w = rand_bf16((size_t)N * K, 1.0f / sqrtf((float)K));
        void *xg = gpu->ops->alloc(gpu, (size_t)MM * K * 2, &st), *og = gpu->ops->alloc(gpu, (size_t)MM * N * 2, &st);
        void *xb = blas ? blas->ops->alloc(blas, (size_t)MM * K * 2, &st) : NULL;
        void *ob = blas ? blas->ops->alloc(blas, (size_t)MM * N * 2, &st) : NULL, *wg, *wb = NULL;
        gpu->ops->upload_act(gpu, xg, x, (size_t)MM * K);
        struct st_tensor t = {.name = "w", .dtype = ST_DTYPE_F32, .n_dims = 2, .shape = {N, K}, .data = w,
                              .nbytes = (size_t)N * K * 4};
        gpu->ops->weight_upload(gpu, &t, &wg);
        if (blas) blas->ops->upload_act(blas, xb, x, (size_t)MM * K), blas->ops->weight_upload(blas, &t, &wb);
        for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
            const int M = Ms[mi], reps = M >= 2048 ? 10 : 40;
            if (only && M != o_m) continue;
            if (ms_env) {
                char key[16];
                snprintf(key, sizeof key, "%d", M);
                const char *f = strstr(ms_env, key);
                if (!f || (f > ms_env && f[-1] != ',') || (f[strlen(key)] && f[strlen(key)] != ',')) continue;
            }
            double us[8], best = 1e30;
            for (int k = 0; k <= nv; k++) {
                struct backend *b = k < nv ? gpu : blas;
                if (!b || (only && strcmp(o_var, k < nv ? v[k].name : "cublas"))) { us[k] = 0; continue; }
                void *o = k < nv ? og : ob, *xx = k < nv ? xg : xb, *ww = k < nv ? wg : wb;
                for (int r = 0; r < 2; r++) b->ops->matmul(b, o, xx, ww, NULL, M, N, K);
                int e = b->ops->sync(b);
                double t0 = util_now();
                for (int r = 0; r < reps; r++) b->ops->matmul(b, o, xx, ww, NULL, M, N, K);
                e |= b->ops->sync(b);
                us[k] = e ? -1 : (util_now() - t0) / reps * 1e6;
                if (us[k] > 0 && us[k] < best) best = us[k];
            }
            printf("gemmbench %-8s M %5d N %5d K %5d", names[s], M, N, K);
            for (int k = 0; k <= nv; k++) printf(" %9.1f", us[k]);
            printf("   %.0f\n", 2.0 * M * N * K / best * 1e-6);
        }
        gpu->ops->free(gpu, xg), gpu->ops->free(gpu, og), gpu->ops->free(gpu, wg);
        if (blas) blas->ops->free(blas, xb), blas->ops->free(blas, ob), blas->ops->free(blas, wb);
        free(x), free(w);
    }
    if (blas) backend_destroy(blas);
}

/* n decode positions spread over [lo, hi] (lo may be 0: a sequence of one key) */
static int *spread_starts(int n, int lo, int hi) {
    int *v = malloc(sizeof *v * (size_t)n);
    for (int i = 0; i < n; i++) v[i] = lo + (int)(((long)i * 397) % (hi - lo + 1));
    return v;
}

/* Decode steps of more (token, KV head) units than the flash kernel's resident blocks (about two
 * an SM): the batch decode kernel (cuda/attn_decode.cu), against the CPU and, for three sequences
 * of each step, against the flash kernel's bits alone. */
static void test_decode_batch(void) {
    int *one = spread_starts(40, 0, 127), *few = spread_starts(150, 200, 1000), *wide = spread_starts(48, 0, 3000);
    int *edge = spread_starts(400, 20, 80), *win = spread_starts(40, 1500, 2600);
    struct attn_opts o = {.kscale = 1.0f, .vscale = 1.0f, .starts = one, .alone = 1};
    attention_case(32, 8, 128, 0, 127, 1, 40, 0, 1, &o); /* one partition each, from a single key */
    attention_case(32, 8, 128, 3, 127, 1, 40, 16, 64, &o); /* and streaming heads */
    o.starts = few;
    attention_case(32, 8, 64, 2, 1000, 1, 100, 4, 40, &o); /* head dim 64, up to 8 partitions */
    attention_case(64, 8, 128, 4, 1000, 1, 100, 8, 32, &o); /* GQA 8 */
    attention_case(32, 2, 128, 1, 1000, 1, 150, 16, 64, &o); /* GQA 16: rows 8-15 real */
    o.starts = wide;
    attention_case(32, 8, 128, 3, 3000, 1, 48, 16, 64, &o); /* units of 1 to 24 partitions */
    o.starts = win, o.window = 1000, o.kscale = 3.0f; /* a sliding window: first partitions empty */
    attention_case(32, 8, 128, 0, 2600, 1, 40, 0, 1, &o);
    /* the engine's call: RoPE and the append first */
    struct attn_opts rope = {.kscale = 1.0f, .vscale = 1.0f, .starts = few, .rope = 1, .alone = 1};
    attention_case(32, 8, 128, 3, 1000, 1, 100, 16, 64, &rope);
    /* mask edges: sink, recent, window */
    struct attn_opts edges = {.window = 16, .kscale = 0.01f, .vscale = 8.0f, .starts = edge, .alone = 1};
    attention_case(8, 2, 64, 1, 80, 1, 400, 4, 8, &edges);
    /* fp8 pools (the kernel's F8 form: bytes made bf16 in shared memory), with the tight cases of
     * test_attention_fp8: one key visible (a window of 1), or two (a sink and a recent window of 1) */
    struct attn_opts f8 = {.kscale = 1.0f, .vscale = 1.0f, .fp8 = 1, .starts = wide, .alone = 1};
    attention_case(32, 8, 128, 3, 3000, 1, 48, 16, 64, &f8);
    f8.starts = few;
    attention_case(32, 8, 64, 2, 1000, 1, 100, 4, 40, &f8);
    struct attn_opts f8one = {.window = 1, .kscale = 1e-3f, .vscale = 2000.0f, .fp8 = 1, .tol = 5e-3f, .starts = few, .alone = 1};
    attention_case(16, 4, 128, 0, 1000, 1, 100, 0, 1, &f8one);
    struct attn_opts f8two = {.kscale = 1e-3f, .vscale = 2000.0f, .fp8 = 1, .tol = 5e-3f, .starts = few, .alone = 1};
    attention_case(32, 8, 128, 8, 1000, 1, 100, 1, 1, &f8two);
    struct attn_opts f8rope = {.kscale = 1.0f, .vscale = 1.0f, .starts = few, .rope = 1, .fp8 = 1, .alone = 1};
    attention_case(32, 8, 128, 3, 1000, 1, 100, 16, 64, &f8rope);
    free(one), free(few), free(wide), free(edge), free(win);
}

/* every attention case: decode and prefill against the CPU, invariance, mask edges, mixed
 * contexts, the fused RoPE append, cluster merges, the batch decode kernel, the long decode cases */
static void test_attention_all(void) {
    /* GQA ratios 1, 4, 8; head dims 64 and 128; decode and prefill; contexts to 32k */
    attention_case(8, 8, 64, 0, 1000, 1, 3, 0, 1, NULL);
    attention_case(32, 8, 128, 0, 4096, 1, 4, 0, 1, NULL);
    attention_case(32, 4, 128, 0, 32768, 1, 1, 0, 1, NULL);
    attention_case(16, 4, 64, 0, 500, 64, 2, 0, 1, NULL);
    attention_case(32, 8, 128, 5, 2000, 1, 3, 64, 256, NULL);
    attention_case(32, 8, 128, 3, 700, 100, 2, 16, 64, NULL);
    attention_case(8, 1, 128, 1, 30000, 1, 2, 64, 256, NULL);
    /* GQA 7 (units of 2 tokens x 7 heads), head dims 8/16 (padded), a sink inside the chunk */
    attention_case(14, 2, 64, 1, 300, 33, 3, 4, 40, NULL);
    attention_case(8, 2, 16, 0, 100, 20, 2, 0, 1, NULL);
    attention_case(8, 4, 8, 2, 50, 9, 2, 3, 16, NULL);
    attention_case(32, 8, 128, 4, 0, 200, 1, 64, 96, NULL);
    attention_invariance(32, 8, 128, 3, 500, 150, 61, 16, 64, 0);
    attention_invariance(14, 2, 64, 0, 90, 77, 13, 0, 1, 0);
    attention_invariance(8, 8, 64, 4, 1000, 40, 17, 8, 32, 0);
    attention_invariance(8, 2, 16, 0, 300, 70, 30, 0, 1, 48);
    /* a prompt from position 0: the sink inside chunk 1, chunk 1 longer than the ring */
    attention_invariance(32, 8, 128, 3, 0, 300, 100, 64, 96, 0);
    /* contexts over several partitions: the last, single-token chunk is a decode step whose
     * partitions run in parallel (split) and merge (in a cluster up to 8 partitions, else from
     * memory); a sliding window that leaves the first partitions empty */
    attention_invariance(32, 8, 128, 3, 2500, 100, 40, 16, 64, 0);
    attention_invariance(8, 2, 64, 0, 3000, 60, 21, 0, 1, 1500);
    attention_invariance(16, 2, 128, 1, 5030, 30, 9, 4, 300, 0);
    /* mask edges against the CPU: keys near-equal in score, values large, so one key more or less
     * at the sink, recent or window boundary moves the output far past the tolerance */
    struct attn_opts edges = {.window = 16, .kscale = 0.01f, .vscale = 8.0f};
    attention_case(8, 2, 64, 1, 40, 1, 2, 4, 8, &edges);
    attention_case(8, 2, 64, 1, 20, 24, 2, 4, 8, &edges);
    attention_case(8, 4, 128, 2, 3, 40, 1, 6, 10, &edges);
    /* a decode step mixing short and long contexts (the split path with 1 to 5 partitions a
     * token), and a sink longer than a partition */
    static const int mixed[3] = {100, 1500, 5000};
    struct attn_opts mix = {.kscale = 1.0f, .vscale = 1.0f, .starts = mixed};
    attention_case(32, 8, 128, 3, 5000, 1, 3, 16, 64, &mix);
    attention_case(16, 4, 64, 2, 3000, 1, 2, 1100, 200, NULL);
    /* RoPE fused with the KV append (the engine's path on the GPU): decode and a prefill chunk,
     * with and without streaming heads */
    struct attn_opts fused = {.kscale = 1.0f, .vscale = 1.0f, .rope = 1};
    attention_case(32, 8, 128, 0, 2000, 1, 3, 0, 1, &fused);
    attention_case(32, 8, 128, 3, 700, 100, 2, 16, 64, &fused);
    attention_case(14, 2, 64, 1, 300, 33, 3, 4, 40, &fused);
    /* ... decode steps take it inside the decode kernel: one partition (not split), streaming
     * heads, head dim 64, and a split step over contexts of 1 to 5 partitions */
    attention_case(32, 8, 128, 3, 100, 1, 2, 16, 64, &fused);
    attention_case(14, 2, 64, 1, 300, 1, 3, 4, 40, &fused);
    struct attn_opts fused_mix = {.kscale = 1.0f, .vscale = 1.0f, .starts = mixed, .rope = 1};
    attention_case(32, 8, 128, 3, 5000, 1, 3, 16, 64, &fused_mix);
    /* split decode steps merged in a thread-block cluster: 2 partitions (a cluster of 2), 4
     * partitions with GQA 8 (4), and GQA 16 (four heads a merging warp) */
    attention_case(32, 8, 128, 3, 200, 1, 2, 16, 64, &fused);
    attention_case(16, 2, 64, 1, 450, 1, 2, 4, 40, &fused);
    attention_case(32, 2, 128, 0, 200, 1, 3, 0, 1, NULL);
    /* the CUDA-core kernel: head dim 256, GQA 32 */
    attention_case(32, 1, 256, 0, 300, 3, 2, 0, 1, NULL);
    test_decode_batch();
    test_long_decode();
    test_long_prefill();
    test_attention_fp8();
}

/* the GEMM cases: every tile choice, stale stages, invariance across M, the fused ops, Llama-3-8B's shapes */
static void test_matmul_all(void) {
    test_matmul();
    test_matmul_stale_stages();
    test_matmul_invariance();
    test_matmul_swiglu();
    test_norm_matmul();
    test_matmul_llama();
}

/* fn(n) for each size of the comma-separated list in environment variable var (else dflt) */
static void each_size(const char *var, const char *dflt, void (*fn)(int)) {
    const char *v = getenv(var);
    for (const char *s = v ? v : dflt; *s;) {
        fn(atoi(s));
        s = strchr(s, ',') ? strchr(s, ',') + 1 : "";
    }
}

int main(void) {
    char err[256];
    gpu = backend_cuda_create(0, 0, err, sizeof err);
    char why[256];
    if (!gpu && backend_cuda_probe(0, why, sizeof why) != BACKEND_CUDA_NONE) { /* a GPU it could not use: a failure */
        printf("FAIL: %s\n0 passed, 1 failed\n", err);
        return 1;
    }
    if (!gpu) {
        printf("SKIP: %s\n0 passed, 0 failed\n", err);
        return 0;
    }
    cpu = backend_cpu_create();
    util_rng_seed(&rng, 7);
    /* DUOSERVE_TEST_ONLY=matmul: the GEMM cases alone (checking another tile choice quickly);
     * attention: every attention case; longattn: the long decode cases alone, under both splits;
     * decodebatch: the batch decode kernel's many-unit cases alone (a quick check of that kernel);
     * attnbench, prefillbench, gemmbench: profiling only (no tests, exit 0) */
    const char *only = getenv("DUOSERVE_TEST_ONLY");
    bool bench = true;
    if (only && !strcmp(only, "attnbench")) /* ATTNBENCH_CTX="32000": other contexts */
        each_size("ATTNBENCH_CTX", "128,1000,4000,32000", attention_bench);
    else if (only && !strcmp(only, "prefillbench")) /* PREFILLBENCH_N="8192,32768": other prompt sizes */
        each_size("PREFILLBENCH_N", "2048,8192,32768,131072", prefill_bench);
    else if (only && !strcmp(only, "gemmbench"))
        gemm_bench();
    else {
        bench = false;
        if (only && !strcmp(only, "attention")) { /* the attention cases alone (a new attention kernel) */
            test_rope();
            test_attention_all();
        } else if (only && !strcmp(only, "decodebatch")) {
            test_decode_batch();
        } else if (only && !strcmp(only, "longattn")) {
            test_long_decode();
        } else if (only && !strcmp(only, "matmul")) {
            printf("GEMM cases only (%s)\n", cuda_gemm_kind(64, 4096, 4096));
            test_matmul_all();
        } else {
            test_elementwise();
            test_embed_rows_logits();
            test_matmul_all();
            test_rope();
            test_argmax();
            test_attention_all();
        }
        printf("\ncuda ops: %d passed, %d failed\n", n_pass, n_fail);
    }
    backend_destroy(cpu);
    backend_destroy(gpu);
    return !bench && n_fail ? 1 : 0;
}
