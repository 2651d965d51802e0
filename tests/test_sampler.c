/* The sampling pipeline (engine/sampler.c sampler_run, the definition every backend's sample op
 * follows) on hand-computable rows: a fixed u picks the expected id, top-k keeps exactly k (ties
 * at the k-th kept), the top-p and min-p cuts, penalties and bias to the exact f32 value,
 * min_tokens masking, the per-choice state and RNG, and the CPU backend's sample op. */
#include <math.h>

#include "tests/test_common.h"

#include "engine/backend.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/util.h"

#define MAXV 64

/* A sampling row with everything off. */
static struct sample_row plain(float temperature, float u) {
    return (struct sample_row){.temperature = temperature, .top_p = 1.0f, .repetition_penalty = 1.0f, .u = u};
}

/* sampler_run on a copy of logits[V]; the modified row is left in out when given. */
static int run(const struct sample_row *p, const float *logits, int V, float *out) {
    float l[MAXV], scratch[SAMPLER_SCRATCH_ROWS * MAXV];
    memcpy(l, logits, sizeof(float) * V);
    int id = sampler_run(p, l, V, scratch);
    if (out) memcpy(out, l, sizeof(float) * V);
    return id;
}

/* Which ids a sweep of u over [0, 1) can draw: kept[i] = 1 for each. */
static void sweep(struct sample_row p, const float *logits, int V, int *kept) {
    memset(kept, 0, sizeof(int) * V);
    for (int k = 0; k < 2000; k++) {
        p.u = (k + 0.5f) / 2000.0f;
        kept[run(&p, logits, V, NULL)] = 1;
    }
}

static void assert_kept(const int *kept, int V, const int *want, int n_want) {
    int set[MAXV] = {0};
    for (int i = 0; i < n_want; i++) set[want[i]] = 1;
    for (int i = 0; i < V; i++) {
        if (kept[i] != set[i]) print_error("id %d: kept %d, want %d\n", i, kept[i], set[i]);
        assert_int_equal(kept[i], set[i]);
    }
}

/* Probabilities 0.3, 0.05, 0.5, 0.15 (ids 0..3), as logits. */
static void four_probs(float *l) {
    static const float p[4] = {0.3f, 0.05f, 0.5f, 0.15f};
    for (int i = 0; i < 4; i++) l[i] = logf(p[i]);
}

static void test_fixed_u_picks_expected_id(void **state) {
    float flat[4] = {0, 0, 0, 0}; /* 0.25 each: cumulative 0.25, 0.5, 0.75, 1 in id order */
    float us[] = {0.0f, 0.24f, 0.26f, 0.5f, 0.74f, 0.76f, 0.999f};
    int want[] = {0, 0, 1, 2, 2, 3, 3}; /* u = 0.5 is not below 0.5: id 2 */
    for (int i = 0; i < 7; i++) {
        struct sample_row p = plain(1.0f, us[i]);
        assert_int_equal(run(&p, flat, 4, NULL), want[i]);
    }
    float l[4];
    four_probs(l); /* cumulative 0.3, 0.35, 0.85, 1 */
    float us2[] = {0.1f, 0.32f, 0.6f, 0.9f};
    int want2[] = {0, 1, 2, 3};
    for (int i = 0; i < 4; i++) {
        struct sample_row p = plain(1.0f, us2[i]);
        assert_int_equal(run(&p, l, 4, NULL), want2[i]);
    }
    /* temperature 2 flattens: p ~ sqrt(p), normalised 0.294, 0.120, 0.379, 0.208 */
    struct sample_row p = plain(2.0f, 0.35f);
    assert_int_equal(run(&p, l, 4, NULL), 1);
    /* greedy ignores u */
    p = plain(0.0f, 0.99f);
    assert_int_equal(run(&p, l, 4, NULL), 2);
    p = plain(1e-6f, 0.99f);
    assert_int_equal(run(&p, l, 4, NULL), 2);
}

static void test_top_k_keeps_exactly_k(void **state) {
    /* distinct logits in a scrambled order: rank r sits at id (r * 7) % 50 */
    float l[50];
    for (int r = 0; r < 50; r++) l[(r * 7) % 50] = 0.1f * (float)(50 - r);
    for (int k = 1; k <= 10; k++) {
        struct sample_row p = plain(1.0f, 0);
        p.top_k = k;
        int kept[50], want[10];
        for (int r = 0; r < k; r++) want[r] = (r * 7) % 50;
        sweep(p, l, 50, kept);
        assert_kept(kept, 50, want, k);
    }
    /* ties at the k-th largest are all kept */
    float t[5] = {1, 3, 3, 2, 0};
    struct sample_row p = plain(1.0f, 0);
    int kept[5];
    p.top_k = 2;
    sweep(p, t, 5, kept);
    assert_kept(kept, 5, (int[]){1, 2}, 2);
    p.top_k = 1;
    sweep(p, t, 5, kept);
    assert_kept(kept, 5, (int[]){1, 2}, 2);
    p.top_k = 3;
    sweep(p, t, 5, kept);
    assert_kept(kept, 5, (int[]){1, 2, 3}, 3);
    /* k >= vocab or <= 0: off */
    p.top_k = 5;
    sweep(p, t, 5, kept);
    assert_kept(kept, 5, (int[]){0, 1, 2, 3, 4}, 5);
}

static void test_top_p_cut(void **state) {
    float l[4];
    four_probs(l); /* sorted: 0.5 (id 2), 0.3 (id 0), 0.15 (id 3), 0.05 (id 1) */
    struct sample_row p = plain(1.0f, 0);
    int kept[4];
    p.top_p = 0.45f;
    sweep(p, l, 4, kept);
    assert_kept(kept, 4, (int[]){2}, 1);
    p.top_p = 0.7f; /* 0.5 < 0.7 <= 0.8 */
    sweep(p, l, 4, kept);
    assert_kept(kept, 4, (int[]){0, 2}, 2);
    p.top_p = 0.9f;
    sweep(p, l, 4, kept);
    assert_kept(kept, 4, (int[]){0, 2, 3}, 3);
    p.top_p = 0.97f;
    sweep(p, l, 4, kept);
    assert_kept(kept, 4, (int[]){0, 1, 2, 3}, 4);
    /* the draw renormalises the kept mass: ids 0 (0.3) then 2 (0.5) of 0.8, in id order */
    p.top_p = 0.7f;
    p.u = 0.37f; /* 0.37 * 0.8 = 0.296 < 0.3 */
    assert_int_equal(run(&p, l, 4, NULL), 0);
    p.u = 0.38f; /* 0.304 */
    assert_int_equal(run(&p, l, 4, NULL), 2);
    /* ties at the cut are kept */
    float t[4] = {0, 0, 0, -1};
    p.top_p = 0.2f;
    sweep(p, t, 4, kept);
    assert_kept(kept, 4, (int[]){0, 1, 2}, 3);
}

static void test_min_p_cut(void **state) {
    float l[4];
    four_probs(l); /* the largest is 0.5 */
    struct sample_row p = plain(1.0f, 0);
    int kept[4];
    p.min_p = 0.2f; /* below 0.1 goes: id 1 */
    sweep(p, l, 4, kept);
    assert_kept(kept, 4, (int[]){0, 2, 3}, 3);
    p.min_p = 0.5f; /* below 0.25 */
    sweep(p, l, 4, kept);
    assert_kept(kept, 4, (int[]){0, 2}, 2);
    p.min_p = 0.65f; /* below 0.325 */
    sweep(p, l, 4, kept);
    assert_kept(kept, 4, (int[]){2}, 1);
    /* min-p, then top-p over what is left: 0.5, 0.3, 0.15 of 0.95; 0.8 / 0.95 = 0.84 */
    p.min_p = 0.2f;
    p.top_p = 0.8f;
    sweep(p, l, 4, kept);
    assert_kept(kept, 4, (int[]){0, 2}, 2);
}

static void test_penalties_exact_values(void **state) {
    float l[5] = {2, -2, 1, 0.5f, 3}, out[5];
    struct sample_seen seen[3] = {{0, 0, 1}, {1, 1, 0}, {2, 2, 0}};
    struct sample_row p = plain(0.0f, 0); /* greedy returns with the penalised row in place */
    p.repetition_penalty = 2.0f;
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    p.n_seen = 3;
    p.seen = seen;
    assert_int_equal(run(&p, l, 5, out), 4);
    assert_true(out[0] == 1.0f);   /* 2 / 2: in the prompt only, no presence */
    assert_true(out[1] == -4.75f); /* -2 * 2 - (0.25 * 1 + 0.5) */
    assert_true(out[2] == -0.5f);  /* 1 / 2 - (0.25 * 2 + 0.5) */
    assert_true(out[3] == 0.5f && out[4] == 3.0f);
    /* repetition off: prompt-only ids untouched */
    p.repetition_penalty = 1.0f;
    run(&p, l, 5, out);
    assert_true(out[0] == 2.0f && out[1] == -2.75f && out[2] == 0.0f);
    /* a penalty moves the argmax */
    float m[2] = {3.0f, 2.9f};
    struct sample_seen s0 = {0, 1, 0};
    struct sample_row q = plain(0.0f, 0);
    q.presence_penalty = 0.5f;
    q.n_seen = 1;
    q.seen = &s0;
    assert_int_equal(run(&q, m, 2, NULL), 1);
}

static void test_bias_and_min_tokens_mask(void **state) {
    float l[4] = {0, 1, 2, 3}, out[4];
    int32_t bid[2] = {0, 0};
    float bval[2] = {2.0f, 2.5f}; /* repeats add up, in order */
    struct sample_row p = plain(0.0f, 0);
    p.n_bias = 2;
    p.bias_ids = bid;
    p.bias_vals = bval;
    assert_int_equal(run(&p, l, 4, out), 0);
    assert_true(out[0] == 4.5f);
    /* min_tokens: the mask ids (EOS, stop ids) are -inf until n_generated reaches it */
    struct engine_sampling sp = {.n = 1, .max_tokens = 8, .min_tokens = 2, .top_p = 1.0f, .repetition_penalty = 1.0f,
                                 .logprobs = -1};
    struct sampler_seq s;
    assert_int_equal(sampler_seq_init(&s, &sp, 1, 0, 4, NULL, 0), 0);
    int32_t eos[2] = {3, 1};
    float scratch[SAMPLER_SCRATCH_ROWS * 4], w[4];
    for (int g = 0; g < 3; g++) {
        memcpy(w, l, sizeof w);
        int id = sampler_pick(&s, &sp, w, 4, g, eos, 2, scratch);
        assert_int_equal(id, g < 2 ? 2 : 3);
        if (g < 2) assert_true(isinf(w[3]) && w[3] < 0 && isinf(w[1]));
    }
    /* every id masked: the first index */
    int32_t all[4] = {0, 1, 2, 3};
    struct sample_row q = plain(1.0f, 0.5f);
    q.n_mask = 4;
    q.mask_ids = all;
    assert_int_equal(run(&q, l, 4, NULL), 0);
    sampler_seq_free(&s);
}

static void test_seq_state_and_rng(void **state) {
    struct engine_sampling sp = {.n = 1, .max_tokens = 8, .top_p = 1.0f, .repetition_penalty = 1.3f, .logprobs = -1};
    int32_t prompt[3] = {5, 5, 7};
    struct sampler_seq s;
    assert_int_equal(sampler_seq_init(&s, &sp, 42, 0, 16, prompt, 3), 0);
    assert_int_equal(s.n_seen, 2);
    sampler_seq_accept(&s, 7);
    sampler_seq_accept(&s, 9);
    sampler_seq_accept(&s, 9);
    assert_int_equal(s.n_seen, 3);
    struct sample_seen want[3] = {{5, 0, 1}, {7, 1, 1}, {9, 2, 0}};
    assert_memory_equal(s.seen, want, sizeof want);
    sampler_seq_free(&s);
    sampler_seq_free(&s); /* idempotent */
    /* no penalty: no state */
    sp.repetition_penalty = 1.0f;
    assert_int_equal(sampler_seq_init(&s, &sp, 42, 0, 16, prompt, 3), 0);
    sampler_seq_accept(&s, 9);
    assert_true(s.slot == NULL && s.n_seen == 0);
    sampler_seq_free(&s);
    /* u comes from the choice's stream, and greedy draws take none */
    struct sampler_seq a, b;
    struct sample_row ra, rb;
    sampler_seq_init(&a, &sp, 7, 1, 16, NULL, 0);
    sampler_seq_init(&b, &sp, 7, 1, 16, NULL, 0);
    sp.temperature = 0.0f;
    sampler_row(&ra, &a, &sp, 0, NULL, 0);
    assert_true(ra.u == 0.0f);
    sp.temperature = 1.0f;
    sampler_row(&ra, &a, &sp, 0, NULL, 0);
    sampler_row(&rb, &b, &sp, 0, NULL, 0);
    assert_true(ra.u == rb.u && ra.u >= 0.0f && ra.u < 1.0f);
    sampler_row(&rb, &b, &sp, 0, NULL, 0);
    assert_true(ra.u != rb.u);
    sampler_seq_free(&a);
    sampler_seq_free(&b);
}

/* The CPU backend's op: logits() through an identity weight leaves the rows as given; draws
 * match sampler_run, and two draws from one row (forks) see it unchanged. */
/* The filters by sorting the whole row (qsort), as the pipeline first did: the oracle for the
 * selection and radix sort sampler_run uses, which must pick exactly the same ids. */
static int cmp_desc_f(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}
static int oracle_draw(const struct sample_row *p, const float *logits, int V, float *l, float *pr, float *sorted) {
    memcpy(l, logits, sizeof(float) * V);
    for (int i = 0; i < V; i++) l[i] /= p->temperature;
    if (p->top_k > 0 && p->top_k < V) {
        memcpy(sorted, l, sizeof(float) * V);
        qsort(sorted, V, sizeof(float), cmp_desc_f);
        float kth = sorted[p->top_k - 1];
        for (int i = 0; i < V; i++)
            if (l[i] < kth) l[i] = -INFINITY;
    }
    float mx = l[sampler_argmax(l, V)];
    double sum = 0.0;
    for (int i = 0; i < V; i++) {
        pr[i] = isinf(l[i]) && l[i] < 0 ? 0.0f : expf(l[i] - mx);
        sum += pr[i];
    }
    for (int i = 0; i < V; i++) pr[i] = (float)(pr[i] / sum);
    if (p->min_p > 0.0f) {
        float pmax = 0.0f;
        for (int i = 0; i < V; i++) pmax = pr[i] > pmax ? pr[i] : pmax;
        for (int i = 0; i < V; i++)
            if (pr[i] < p->min_p * pmax) pr[i] = 0.0f;
    }
    if (p->top_p < 1.0f) {
        memcpy(sorted, pr, sizeof(float) * V);
        qsort(sorted, V, sizeof(float), cmp_desc_f);
        double tot = 0.0, acc = 0.0;
        for (int i = 0; i < V; i++) tot += sorted[i];
        float cut = sorted[0];
        for (int i = 0; i < V; i++) {
            acc += sorted[i];
            cut = sorted[i];
            if (acc >= p->top_p * tot) break;
        }
        for (int i = 0; i < V; i++)
            if (pr[i] < cut) pr[i] = 0.0f;
    }
    double tot = 0.0;
    for (int i = 0; i < V; i++) tot += pr[i];
    double r = (double)p->u * tot, acc = 0.0;
    int last = -1;
    for (int i = 0; i < V; i++) {
        if (pr[i] <= 0.0f) continue;
        acc += pr[i];
        last = i;
        if (r < acc) return i;
    }
    return last;
}

/* Random rows (flat, peaked, many ties, masked runs; vocab to 128256) and parameters: sampler_run
 * draws exactly the oracle's id for every u tried. */
static void test_filters_match_full_sort_oracle(void **state) {
    enum { BIG = 128256 };
    float *logits = malloc(sizeof(float) * BIG), *l = malloc(sizeof(float) * BIG);
    float *scratch = malloc(sizeof(float) * SAMPLER_SCRATCH_ROWS * BIG), *o1 = malloc(sizeof(float) * BIG);
    float *o2 = malloc(sizeof(float) * BIG), *o3 = malloc(sizeof(float) * BIG);
    struct util_rng rng;
    util_rng_seed(&rng, 11);
    int sizes[] = {5, 64, 1000, 32000, BIG}, draws = 0;
    for (int c = 0; c < 40; c++) {
        int V = sizes[c % 5], kind = c % 4;
        for (int i = 0; i < V; i++) {
            float u = util_rng_uniform(&rng);
            logits[i] = kind == 0   ? u * 4.0f                              /* flat */
                        : kind == 1 ? (u < 0.001f ? 12.0f : 0.0f) + u * 8.0f /* peaked */
                        : kind == 2 ? (float)(int)(u * 6.0f)                 /* ties */
                                    : (u < 0.3f ? -INFINITY : u * 10.0f);    /* masked runs */
        }
        logits[c % V] = 9.0f; /* at least one finite logit */
        struct sample_row p = plain(0.5f + util_rng_uniform(&rng), 0.0f);
        p.top_k = c % 3 == 0 ? 0 : 1 + (int)(util_rng_next(&rng) % (uint64_t)(c % 3 == 1 ? 50 : V));
        p.top_p = c % 5 == 4 ? 1.0f : 0.3f + 0.69f * util_rng_uniform(&rng);
        p.min_p = c % 7 == 3 ? 0.05f : 0.0f;
        for (int k = 0; k < 16; k++, draws++) {
            p.u = k / 16.0f + util_rng_uniform(&rng) / 16.0f;
            memcpy(l, logits, sizeof(float) * V);
            int got = sampler_run(&p, l, V, scratch);
            int want = oracle_draw(&p, logits, V, o1, o2, o3);
            if (got != want) print_error("row %d (V %d, kind %d, top_k %d, top_p %g, min_p %g, u %g): %d, oracle %d\n", c,
                                         V, kind, p.top_k, p.top_p, p.min_p, p.u, got, want);
            assert_int_equal(got, want);
        }
    }
    assert_int_equal(draws, 640);
    free(logits), free(l), free(scratch), free(o1), free(o2), free(o3);
}

static void test_cpu_backend_sample_op(void **state) {
    enum { V = 8, N = 2 };
    struct backend *b = backend_cpu_create();
    float eye[V * V] = {0}, x[N * V];
    for (int i = 0; i < V; i++) eye[i * V + i] = 1.0f;
    for (int i = 0; i < N * V; i++) x[i] = (float)((i * 5) % 7) - 3.0f;
    struct st_tensor t = {.name = "w", .dtype = ST_DTYPE_F32, .n_dims = 2, .shape = {V, V}, .data = eye,
                          .nbytes = sizeof eye};
    void *w, *xb;
    enum backend_status st;
    assert_int_equal(b->ops->weight_upload(b, &t, &w), 0);
    xb = b->ops->alloc(b, sizeof x, &st);
    assert_int_equal(b->ops->upload_act(b, xb, x, N * V), 0);
    assert_int_equal(b->ops->logits(b, NULL, xb, w, N, V, V), 0);
    int32_t bid = 0, mask = 6;
    float bval = 9.0f;
    struct sample_seen seen = {5, 2, 1};
    struct sample_row rows[5] = {plain(1.0f, 0.1f), plain(1.0f, 0.1f), plain(0.7f, 0.9f), plain(0.0f, 0), plain(1.0f, 0.6f)};
    rows[0].n_bias = 1, rows[0].bias_ids = &bid, rows[0].bias_vals = &bval; /* modifies its copy only */
    rows[2].row = 1, rows[2].top_k = 3, rows[2].n_mask = 1, rows[2].mask_ids = &mask;
    rows[3].row = 1, rows[3].n_seen = 1, rows[3].seen = &seen, rows[3].repetition_penalty = 3.0f;
    rows[4].top_p = 0.5f, rows[4].min_p = 0.1f;
    int32_t ids[5];
    assert_int_equal(b->ops->sample(b, ids, rows, 5, V), 0);
    for (int i = 0; i < 5; i++) assert_int_equal(ids[i], run(&rows[i], x + rows[i].row * V, V, NULL));
    assert_int_equal(ids[0], 0);
    assert_int_not_equal(ids[1], 0);
    b->ops->free(b, xb);
    b->ops->free(b, w);
    backend_destroy(b);
}


/* Structured output: ids outside the allow bitset are never drawn, whatever their logit, bias or
 * temperature; the seq's mask reaches the row through sampler_row; NULL changes nothing. */
static void test_allow_mask(void **state) {
    enum { V = 40 }; /* two words */
    float l[V];
    for (int i = 0; i < V; i++) l[i] = (float)((i * 7) % 11) * 0.5f;
    l[3] = 20.0f; /* the best by far, and not allowed */
    uint32_t allow[2] = {(1u << 1) | (1u << 5) | (1u << 9), 1u << (33 - 32)};
    struct sample_row p = plain(0.0f, 0);
    p.allow = allow;
    float out[V];
    int g = run(&p, l, V, out);
    assert_true(g == 1 || g == 5 || g == 9 || g == 33);
    for (int i = 0; i < V; i++) {
        bool on = (i == 1 || i == 5 || i == 9 || i == 33);
        if (!on) assert_true(isinf(out[i]) && out[i] < 0);
        else assert_true(out[i] == l[i]);
    }
    /* greedy picks the best allowed: l[1] = 3.5, l[5] = 1.0, l[9] = 4.0, l[33] = 0 */
    assert_int_equal(g, 9);
    /* a bias cannot bring a disallowed id back */
    int32_t bid = 3;
    float bval = 100.0f;
    p.n_bias = 1, p.bias_ids = &bid, p.bias_vals = &bval;
    assert_int_equal(run(&p, l, V, NULL), 9);
    /* sampled draws stay inside the mask and reach every allowed id */
    struct sample_row q = plain(5.0f, 0);
    q.allow = allow;
    int kept[V];
    sweep(q, l, V, kept);
    int want[4] = {1, 5, 9, 33};
    assert_kept(kept, V, want, 4);
    /* through the per-choice state */
    struct engine_sampling sp = {.n = 1, .max_tokens = 8, .temperature = 0.0f, .top_p = 1.0f,
                                 .repetition_penalty = 1.0f, .logprobs = -1};
    struct sampler_seq s;
    float scratch[SAMPLER_SCRATCH_ROWS * V], w[V];
    assert_int_equal(sampler_seq_init(&s, &sp, 7, 0, V, NULL, 0), 0);
    assert_null(s.allow);
    memcpy(w, l, sizeof w);
    assert_int_equal(sampler_pick(&s, &sp, w, V, 0, NULL, 0, scratch), 3); /* unconstrained: the argmax */
    s.allow = allow;
    memcpy(w, l, sizeof w);
    assert_int_equal(sampler_pick(&s, &sp, w, V, 0, NULL, 0, scratch), 9);
    struct sample_row r;
    sampler_row(&r, &s, &sp, 0, NULL, 0);
    assert_ptr_equal(r.allow, allow);
    sampler_seq_free(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_allow_mask),
        cmocka_unit_test(test_fixed_u_picks_expected_id),
        cmocka_unit_test(test_top_k_keeps_exactly_k),
        cmocka_unit_test(test_top_p_cut),
        cmocka_unit_test(test_min_p_cut),
        cmocka_unit_test(test_penalties_exact_values),
        cmocka_unit_test(test_bias_and_min_tokens_mask),
        cmocka_unit_test(test_seq_state_and_rng),
        cmocka_unit_test(test_cpu_backend_sample_op),
        cmocka_unit_test(test_filters_match_full_sort_oracle),
    };
    return cmocka_run_group_tests_name("sampler", tests, NULL, NULL);
}
