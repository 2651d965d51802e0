/* The CPU attention op's rows in threads (engine/backend_cpu.c, attend_rows_threads): a step large
 * enough to be shared by threads gives bit for bit what each of its sequences gives in a step of
 * its own, small enough to run on one thread: 8 sequences of 8,000 to 8,049 positions, one token
 * each, then a 24-token prefill chunk of one of them, retrieval and streaming heads (the streaming
 * head's keys come from its slot and from the chunk's own rows). With fewer than two CPUs there
 * are no threads, and the test says so. */
#include <math.h>

#include "tests/test_common.h"

#include "engine/backend.h"
#include "engine/util.h"

#define H 32
#define KV 4
#define NF 3 /* retrieval heads; one streaming */
#define HD 64
#define BS 16
#define SINK 4
#define RECENT 64
#define NSEQ 8
#define CTX 8000
#define CHUNK 24
#define ROW ((H + 2 * KV) * HD)
#define BLK_SEQ ((CTX + NSEQ * 7 + CHUNK + BS - 1) / BS) /* blocks a sequence */

struct pools {
    float *kf, *vf, *ks, *vs;
};

static float rnd(uint64_t *s) {
    *s ^= *s >> 12, *s ^= *s << 25, *s ^= *s >> 27;
    return (float)((*s * 0x2545f4914f6cdd1dull) >> 40) * 0x1p-23f - 1.0f;
}

static size_t full_n(void) { return (size_t)NSEQ * BLK_SEQ * BS * NF * HD; }
static size_t slot_n(void) { return (size_t)NSEQ * (SINK + RECENT) * (KV - NF) * HD; }

static void pools_make(struct pools *p, uint64_t seed) {
    p->kf = malloc(full_n() * 4), p->vf = malloc(full_n() * 4);
    p->ks = malloc(slot_n() * 4), p->vs = malloc(slot_n() * 4);
    assert_non_null(p->kf), assert_non_null(p->vf), assert_non_null(p->ks), assert_non_null(p->vs);
    for (size_t i = 0; i < full_n(); i++) p->kf[i] = rnd(&seed), p->vf[i] = rnd(&seed);
    for (size_t i = 0; i < slot_n(); i++) p->ks[i] = rnd(&seed), p->vs[i] = rnd(&seed);
}

static void pools_free(struct pools *p) { free(p->kf), free(p->vf), free(p->ks), free(p->vs); }

/* One step over sequences seqs[0 .. n) (T tokens each, sequence s from position CTX + 7 s + t0):
 * out [n * T][H * HD]; qkv rows drawn from (sequence, position) so that every run sees the same ones. */
static void step(struct backend *b, const struct pools *p, const int *seqs, int n, int T, int t0, float *out) {
    int32_t *toks = calloc((size_t)n * T, 4), *pos = malloc(sizeof(int32_t) * n * T), ss[NSEQ + 1], ip[NSEQ + 1], sl[NSEQ];
    int32_t *ids = malloc(sizeof(int32_t) * n * BLK_SEQ);
    float *qkv = malloc(sizeof(float) * n * T * ROW);
    ss[0] = ip[0] = 0;
    for (int i = 0; i < n; i++) {
        const int s = seqs[i];
        for (int t = 0; t < T; t++) {
            pos[i * T + t] = CTX + 7 * s + t0 + t;
            uint64_t seed = 0x9e3779b97f4a7c15ull * (uint64_t)(s * 1000 + t0 + t + 1);
            for (int j = 0; j < ROW; j++) qkv[(size_t)(i * T + t) * ROW + j] = rnd(&seed);
        }
        ss[i + 1] = (i + 1) * T;
        for (int k = 0; k < BLK_SEQ; k++) ids[i * BLK_SEQ + k] = s * BLK_SEQ + (k * 7 + 3) % BLK_SEQ; /* shuffled */
        ip[i + 1] = (i + 1) * BLK_SEQ;
        sl[i] = s;
    }
    struct fwd_batch bt = {n * T, n, toks, pos, ss, ip, ids, sl, 0, NULL, NULL, false};
    assert_int_equal(b->ops->begin_step(b, &bt), 0);
    struct attn_layer L = {.n_heads = H, .n_kv_heads = KV, .head_dim = HD, .n_full = NF, .n_stream = KV - NF,
                           .block_size = BS, .sink = SINK, .recent = RECENT, .scale = 0.125f,
                           .k_full = p->kf, .v_full = p->vf, .k_stream = p->ks, .v_stream = p->vs};
    b->ops->attention(b, out, qkv, ROW, &L);
    free(toks), free(pos), free(ids), free(qkv);
}

/* The same step on a copy of the pools made from the same seed (a step appends to them). */
static void step_fresh(struct backend *b, const int *seqs, int n, int T, float *out) {
    struct pools p;
    pools_make(&p, 42);
    step(b, &p, seqs, n, T, 0, out);
    pools_free(&p);
}

static void test_threaded_rows_equal_lone_steps(void **state) {
    struct backend *b = backend_cpu_create();
    assert_non_null(b);
    if (sysconf(_SC_NPROCESSORS_ONLN) < 2) print_message("one CPU: the step below runs without threads\n");
    int all[NSEQ];
    for (int s = 0; s < NSEQ; s++) all[s] = s;
    float *batched = malloc(sizeof(float) * NSEQ * H * HD), *alone = malloc(sizeof(float) * H * HD);
    step_fresh(b, all, NSEQ, 1, batched); /* ~131M query-key products: in threads */
    for (int s = 0; s < NSEQ; s++) {
        step_fresh(b, &s, 1, 1, alone); /* ~16M: one thread */
        if (memcmp(alone, batched + (size_t)s * H * HD, sizeof(float) * H * HD))
            fail_msg("sequence %d: its row in the threaded step differs from its step alone", s);
    }
    /* a prefill chunk: its 24 rows in threads (~390M), against the same chunk as 24 one-token steps */
    float *chunk = malloc(sizeof(float) * CHUNK * H * HD);
    const int s3 = 3;
    step_fresh(b, &s3, 1, CHUNK, chunk);
    struct pools p;
    pools_make(&p, 42);
    for (int t = 0; t < CHUNK; t++) { /* token t after the chunk's tokens before it were appended */
        step(b, &p, &s3, 1, 1, t, alone);
        /* the streaming head reads the chunk's own rows in the chunk, the slot afterwards: the
         * same values (f32 pools), so the rows still agree bit for bit */
        if (memcmp(alone, chunk + (size_t)t * H * HD, sizeof(float) * H * HD))
            fail_msg("chunk row %d: threaded chunk differs from its one-token step", t);
    }
    pools_free(&p);
    free(batched), free(alone), free(chunk);
    backend_destroy(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_threaded_rows_equal_lone_steps),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
