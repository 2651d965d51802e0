/* The CUDA sample op against the CPU op on the same logits. Each case computes R rows of f32
 * logits with a random GEMM on the GPU (they stay in its logits buffer for the op, and come to
 * the host once), then makes n draws with random parameters (temperature, top-k, top-p, min-p,
 * bias, min_tokens masks, penalties, structured output's allow bitset, u; several draws per row,
 * as forks do) through the GPU op and through sampler_run, which is what the CPU backend's op
 * runs on each row.
 *
 * Tolerance: ids must be equal, except at a boundary: the GPU rounds exp in double to f32 where
 * the CPU calls expf (within 0.502 ulp), and sums in 2^-62 fixed point where the CPU sums in
 * double, so a probability can differ by 1 ulp (6e-8 relative) and a cumulative mass by about
 * 6e-8 of the total. A different id is accepted only when the CPU itself draws the GPU's id with
 * u moved by at most TOL (the CPU's cumulative probability at the boundary is within TOL of u),
 * or with top_p moved by TOL, or min_p moved by TOL relative (a cut at the boundary). TOL = 1e-6
 * leaves a factor of 16 over that bound; top-k and greedy have no tolerance (exact keys).
 *
 * Run on a GPU machine after make CUDA=1:
 *   ./build/duoserve-test-cuda-sampling
 * Prints one line per case (draws, exact, boundary), each mismatch, ms per call of the op at
 * batch 1/64/256 for vocab 128256, and a closing "cuda sampling: N passed, M failed". */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend.h"
#include "engine/sampler.h"
#include "engine/util.h"

#define DIM 64
#define TOL 1e-6f
#define U_MAX (1.0f - 1.0f / 16777216.0f)

static struct backend *gpu;
static struct util_rng rng;
static int n_pass, n_fail;

static int rnd(int n) { return (int)(util_rng_next(&rng) % (uint64_t)n); }

static int first_max(const float *l, int V) {
    int b = 0;
    for (int i = 1; i < V; i++)
        if (l[i] > l[b]) b = i;
    return b;
}

/* R rows of V logits, left in the GPU's logits buffer by logits() and copied to host[R][V].
 * dup: ids >= V/2 repeat the weight rows of ids < V/2, so their logits tie exactly. */
static float *make_logits(int V, int R, float scale, int dup) {
    float *w = malloc(sizeof(float) * (size_t)V * DIM), *x = malloc(sizeof(float) * R * DIM);
    float *host = malloc(sizeof(float) * (size_t)R * V);
    for (size_t i = 0; i < (size_t)V * DIM; i++) w[i] = util_rng_normal(&rng) / 8.0f;
    if (dup)
        for (int v = V / 2; v < V; v++) memcpy(w + (size_t)v * DIM, w + (size_t)(v - V / 2) * DIM, sizeof(float) * DIM);
    for (int i = 0; i < R * DIM; i++) x[i] = scale * util_rng_normal(&rng);
    struct st_tensor t = {.name = "w", .dtype = ST_DTYPE_F32, .n_dims = 2, .shape = {V, DIM}, .data = w,
                          .nbytes = sizeof(float) * (size_t)V * DIM};
    void *wd = NULL, *xd;
    enum backend_status st;
    int rc = gpu->ops->weight_upload(gpu, &t, &wd);
    xd = gpu->ops->alloc(gpu, (size_t)R * DIM * gpu->ops->act_size, &st);
    if (rc || !xd || gpu->ops->upload_act(gpu, xd, x, (size_t)R * DIM) || gpu->ops->logits(gpu, host, xd, wd, R, V, DIM) ||
        gpu->ops->sync(gpu)) {
        printf("FAIL could not compute %d x %d logits on the GPU\n", R, V);
        exit(1);
    }
    gpu->ops->free(gpu, wd);
    gpu->ops->free(gpu, xd);
    free(w);
    free(x);
    return host;
}

#define MAX_WORDS ((151936 + 31) / 32)

/* The lists of one draw. */
struct lists {
    int32_t bias_ids[9];
    float bias_vals[9];
    int32_t mask[4];
    struct sample_seen seen[300];
    uint32_t allow[MAX_WORDS];
};

/* A random allow bitset (structured output's token mask): one id, or a share of the vocabulary,
 * sometimes without the row's argmax; never empty. */
static void random_allow(struct sample_row *p, struct lists *L, int V, const float *row) {
    static const float density[] = {0.0f, 0.001f, 0.05f, 0.5f, 0.95f};
    float d = density[rnd(5)];
    memset(L->allow, 0, sizeof(uint32_t) * (((size_t)V + 31) / 32));
    for (int i = 0; i < V; i++)
        if (util_rng_uniform(&rng) < d) L->allow[i / 32] |= 1u << (i % 32);
    if (rnd(3) == 0) {
        int am = first_max(row, V);
        L->allow[am / 32] &= ~(1u << (am % 32));
    }
    int one = rnd(V);
    L->allow[one / 32] |= 1u << (one % 32);
    p->allow = L->allow;
}


static void random_row(struct sample_row *p, struct lists *L, int V, int R, const float *host) {
    *p = (struct sample_row){.row = rnd(R), .top_p = 1.0f, .repetition_penalty = 1.0f,
                             .u = util_rng_uniform(&rng)};
    p->temperature = rnd(10) == 0 ? 0.0f : 0.1f + 1.9f * util_rng_uniform(&rng);
    if (rnd(5) < 3) {
        static const int ks[] = {1, 2, 5, 20, 50, 100, 1000, 5000};
        p->top_k = rnd(3) == 0 ? 1 + rnd(V < 4000 ? V : 4000) : ks[rnd(8)];
        if (p->top_k >= V) p->top_k = V > 1 ? V - 1 : 0;
    }
    if (rnd(5) < 3) {
        static const float ps[] = {0.1f, 0.5f, 0.8f, 0.9f, 0.95f, 0.99f, 0.999f};
        p->top_p = rnd(3) == 0 ? 0.01f + 0.98f * util_rng_uniform(&rng) : ps[rnd(7)];
    }
    if (rnd(5) < 2) {
        static const float ms[] = {0.001f, 0.01f, 0.05f, 0.1f, 0.3f};
        p->min_p = rnd(3) == 0 ? 0.5f * util_rng_uniform(&rng) : ms[rnd(5)];
    }
    if (rnd(20) == 0) p->u = 0.0f;
    if (rnd(20) == 0) p->u = U_MAX;
    if (rnd(10) < 3) { /* bias (one id twice), masks (the row's argmax among them), penalties */
        const float *row = host + (size_t)p->row * V;
        int nb = 1 + rnd(8);
        for (int i = 0; i < nb; i++) L->bias_ids[i] = rnd(V), L->bias_vals[i] = 20.0f * util_rng_uniform(&rng) - 10.0f;
        L->bias_ids[nb] = L->bias_ids[0], L->bias_vals[nb] = 1.5f;
        p->n_bias = nb + 1, p->bias_ids = L->bias_ids, p->bias_vals = L->bias_vals;
        L->mask[0] = first_max(row, V), L->mask[1] = rnd(V);
        p->n_mask = 2, p->mask_ids = L->mask;
        p->repetition_penalty = 0.5f + 1.5f * util_rng_uniform(&rng);
        p->presence_penalty = 4.0f * util_rng_uniform(&rng) - 2.0f;
        p->frequency_penalty = 4.0f * util_rng_uniform(&rng) - 2.0f;
        int ns = rnd(V < 300 ? V : 300);
        for (int i = 0; i < ns; i++) /* distinct ids (ns < V, 7919 prime and no divisor of V) */
            L->seen[p->n_seen++] = (struct sample_seen){(int32_t)(((int64_t)i * 7919 + 13) % V), rnd(4), rnd(2)};
        p->seen = L->seen;
    }
    if (rnd(10) < 3) random_allow(p, L, V, host + (size_t)p->row * V);
}

static int cpu_draw(const struct sample_row *p, const float *host, int V, float *work, float *scratch) {
    memcpy(work, host + (size_t)p->row * V, sizeof(float) * V);
    return sampler_run(p, work, V, scratch);
}

/* True when the CPU draws id with u, top_p or min_p moved by TOL: a boundary case. */
static int at_boundary(const struct sample_row *p, const float *host, int V, int id, float *work, float *scratch) {
    for (int s = -1; s <= 1; s += 2) {
        struct sample_row q = *p;
        q.u = fminf(fmaxf(p->u + s * TOL, 0.0f), U_MAX);
        if (cpu_draw(&q, host, V, work, scratch) == id) return 1;
        q = *p;
        q.top_p = fminf(p->top_p + s * TOL, 1.0f);
        if (p->top_p < 1.0f && cpu_draw(&q, host, V, work, scratch) == id) return 1;
        q = *p;
        q.min_p = p->min_p * (1.0f + s * TOL);
        if (p->min_p > 0.0f && cpu_draw(&q, host, V, work, scratch) == id) return 1;
    }
    return 0;
}

static const char *describe(const struct sample_row *p, char *buf, size_t n) {
    snprintf(buf, n, "row %d T %.3g top_k %d top_p %.4g min_p %.3g u %.7f bias %d mask %d seen %d (rep %.2f pres %.2f "
             "freq %.2f)%s", p->row, p->temperature, p->top_k, p->top_p, p->min_p, p->u, p->n_bias, p->n_mask, p->n_seen,
             p->repetition_penalty, p->presence_penalty, p->frequency_penalty, p->allow ? " allow" : "");
    return buf;
}

/* n draws from R fresh rows of V logits; fixed: every draw uses it (row 0), u sweeping (0, 1). */
static void run_case(const char *name, int V, int n, int R, float scale, int dup, const struct sample_row *fixed) {
    float *host = make_logits(V, R, scale, dup);
    struct sample_row *rows = malloc(sizeof *rows * n);
    struct lists *L = malloc(sizeof *L * n);
    int32_t *ids = malloc(sizeof(int32_t) * n);
    float *work = malloc(sizeof(float) * V), *scratch = malloc(sizeof(float) * SAMPLER_SCRATCH_ROWS * V);
    for (int i = 0; i < n; i++) {
        if (fixed) {
            rows[i] = *fixed;
            rows[i].u = ((float)i + 0.5f) / (float)n;
        } else {
            random_row(&rows[i], &L[i], V, R, host);
        }
    }
    int rc = gpu->ops->sample(gpu, ids, rows, n, V);
    int exact = 0, boundary = 0, bad = 0;
    for (int i = 0; i < n && !rc; i++) {
        int want = cpu_draw(&rows[i], host, V, work, scratch);
        char d[256];
        if (ids[i] == want) {
            exact++;
        } else if (rows[i].temperature >= 1e-5f && at_boundary(&rows[i], host, V, ids[i], work, scratch)) {
            boundary++;
            printf("     boundary: draw %d: cpu %d gpu %d, %s\n", i, want, ids[i], describe(&rows[i], d, sizeof d));
        } else {
            bad++;
            if (bad <= 10) printf("     MISMATCH: draw %d: cpu %d gpu %d, %s\n", i, want, ids[i], describe(&rows[i], d, sizeof d));
        }
    }
    int ok = rc == 0 && bad == 0;
    printf("%-4s %-44s vocab %6d, %3d draws from %3d rows: %3d exact, %d at a boundary, %d wrong%s\n", ok ? "ok" : "FAIL",
           name, V, n, R, exact, boundary, bad, rc ? "  [op error]" : "");
    ok ? n_pass++ : n_fail++;
    free(host), free(rows), free(L), free(ids), free(work), free(scratch);
}

/* ms per call of the op (staging, kernel, ids back) at batch 1/64/256, vocab 128256. */
static void timing(void) {
    int V = 128256, R = 256;
    float *host = make_logits(V, R, 3.0f, 0);
    struct sample_row *rows = malloc(sizeof *rows * R);
    int32_t *ids = malloc(sizeof(int32_t) * R);
    static struct sample_seen seen[200];
    static uint32_t allow[(128256 + 31) / 32];
    for (int i = 0; i < V; i += 20) allow[i / 32] |= 1u << (i % 32); /* 5% of the ids */
    static int32_t bid[4] = {11, 500, 77777, 11}, mask[2] = {2, 128001};
    static float bval[4] = {3.0f, -5.0f, 1.0f, 2.0f};
    for (int i = 0; i < 200; i++) seen[i] = (struct sample_seen){(i * 641) % V, i % 3, i % 2};
    struct {
        const char *name;
        struct sample_row p;
    } sets[] = {
        {"T 0.8, top-k 50, top-p 0.95", {.temperature = 0.8f, .top_k = 50, .top_p = 0.95f, .repetition_penalty = 1}},
        {"T 1, top-p 0.9", {.temperature = 1.0f, .top_p = 0.9f, .repetition_penalty = 1}},
        {"T 1, min-p 0.05", {.temperature = 1.0f, .top_p = 1.0f, .min_p = 0.05f, .repetition_penalty = 1}},
        {"T 1, no filter", {.temperature = 1.0f, .top_p = 1.0f, .repetition_penalty = 1}},
        {"T 0.7, top-p 0.9, bias, masks, 200 penalised", {.temperature = 0.7f, .top_p = 0.9f, .repetition_penalty = 1.1f,
                                                          .presence_penalty = 0.5f, .frequency_penalty = 0.2f, .n_bias = 4,
                                                          .bias_ids = bid, .bias_vals = bval, .n_mask = 2, .mask_ids = mask,
                                                          .n_seen = 200, .seen = seen}},
        {"greedy with penalties", {.temperature = 0.0f, .top_p = 1.0f, .repetition_penalty = 1.3f, .n_seen = 200,
                                   .seen = seen}},
        {"T 1, top-p 0.9, allow 5% (structured output)", {.temperature = 1.0f, .top_p = 0.9f, .repetition_penalty = 1,
                                                          .allow = allow}},
        {"greedy, allow 5% (structured output)", {.temperature = 0.0f, .top_p = 1.0f, .repetition_penalty = 1,
                                                  .allow = allow}},
    };
    int batches[3] = {1, 64, 256};
    float *work = malloc(sizeof(float) * V), *scratch = malloc(sizeof(float) * SAMPLER_SCRATCH_ROWS * V);
    for (size_t s = 0; s < sizeof sets / sizeof sets[0]; s++) {
        double t0 = util_now();
        cpu_draw(&sets[s].p, host, V, work, scratch);
        double cpu_ms = (util_now() - t0) * 1e3;
        printf("time %-46s", sets[s].name);
        for (int bi = 0; bi < 3; bi++) {
            int n = batches[bi];
            for (int i = 0; i < n; i++) {
                rows[i] = sets[s].p;
                rows[i].row = i;
                rows[i].u = util_rng_uniform(&rng);
            }
            int rc = gpu->ops->sample(gpu, ids, rows, n, V) | gpu->ops->sample(gpu, ids, rows, n, V); /* warm-up */
            int reps = n == 256 ? 10 : 30;
            t0 = util_now();
            for (int k = 0; k < reps; k++) rc |= gpu->ops->sample(gpu, ids, rows, n, V);
            double ms = (util_now() - t0) * 1e3 / reps;
            printf("  batch %3d %7.3f ms%s", n, ms, rc ? " [op error]" : "");
        }
        printf("   (CPU sampler_run, one row: %.1f ms)\n", cpu_ms);
    }
    free(host), free(rows), free(ids), free(work), free(scratch);
}

int main(void) {
    char err[256];
    gpu = backend_cuda_create(0, 0, err, sizeof err);
    char why[256];
    if (!gpu && backend_cuda_probe(0, why, sizeof why) != BACKEND_CUDA_NONE) { /* a GPU it could not use: a failure */
        printf("FAIL: %s\ncuda sampling: 0 passed, 1 failed\n", err);
        return 1;
    }
    if (!gpu) {
        printf("SKIP: %s\ncuda sampling: 0 passed, 0 failed\n", err);
        return 0;
    }
    util_rng_seed(&rng, 11);
    /* random parameters: vocabularies from 2 to 151936 (chunks of 64 ids), batches 1..64, logits
     * from flat (scale 0.3) to peaked (12), exact ties (dup) in small vocabularies */
    run_case("random params", 2, 13, 4, 1.0f, 0, NULL);
    run_case("random params, ties", 17, 64, 8, 2.0f, 1, NULL);
    run_case("random params, ties", 100, 64, 16, 1.0f, 1, NULL);
    run_case("random params, ties, flat", 1000, 7, 3, 0.3f, 1, NULL);
    run_case("random params", 1000, 64, 64, 3.0f, 0, NULL);
    run_case("random params", 32000, 64, 48, 2.0f, 0, NULL);
    run_case("random params, peaked", 32000, 1, 1, 8.0f, 0, NULL);
    for (int rep = 0; rep < 3; rep++) {
        run_case("random params", 128256, 1, 1, 2.0f, 0, NULL);
        run_case("random params", 128256, 64, 40, 4.0f, 0, NULL);
        run_case("random params, flat", 128256, 64, 64, 1.0f, 0, NULL);
        run_case("random params, peaked", 128256, 37, 20, 12.0f, 0, NULL);
    }
    run_case("random params", 151936, 16, 16, 3.0f, 0, NULL);
    /* one row, u sweeping (0, 1) in 128 steps, fixed parameters */
    struct sample_row f1 = {.temperature = 1.0f, .top_p = 0.9f, .repetition_penalty = 1.0f};
    struct sample_row f2 = {.temperature = 0.7f, .top_k = 50, .top_p = 0.95f, .repetition_penalty = 1.0f};
    struct sample_row f3 = {.temperature = 1.2f, .top_p = 1.0f, .min_p = 0.05f, .repetition_penalty = 1.0f};
    struct sample_row f4 = {.temperature = 1.0f, .top_p = 1.0f, .repetition_penalty = 1.0f};
    run_case("u sweep: T 1, top-p 0.9", 128256, 128, 1, 3.0f, 0, &f1);
    run_case("u sweep: T 0.7, top-k 50, top-p 0.95", 128256, 128, 1, 3.0f, 0, &f2);
    run_case("u sweep: T 1.2, min-p 0.05", 128256, 128, 1, 3.0f, 0, &f3);
    run_case("u sweep: T 1, no filter, flat", 128256, 128, 1, 0.5f, 0, &f4);
    run_case("u sweep: T 1, top-p 0.9, ties", 64, 128, 1, 1.0f, 1, &f1);
    /* structured output: a sparse allow bitset without the row's likeliest ids, u sweeping */
    static uint32_t allow[(128256 + 31) / 32];
    for (int i = 7; i < 128256; i += 97) allow[i / 32] |= 1u << (i % 32);
    struct sample_row f5 = {.temperature = 0.8f, .top_p = 0.95f, .repetition_penalty = 1.0f, .allow = allow};
    run_case("u sweep: T 0.8, top-p 0.95, allow 1%", 128256, 128, 1, 3.0f, 0, &f5);
    struct sample_row f6 = {.temperature = 0.0f, .top_p = 1.0f, .repetition_penalty = 1.0f, .allow = allow};
    run_case("greedy, allow 1%", 128256, 4, 1, 3.0f, 0, &f6);
    timing();
    printf("\ncuda sampling: %d passed, %d failed\n", n_pass, n_fail);
    backend_destroy(gpu);
    return n_fail ? 1 : 0;
}
