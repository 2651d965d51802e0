/* The prefix cache at the edges of the pool, through the scheduler (engine/sched.h) with fake
 * sequences: a hit never costs more room than a miss (a full-pool request runs, with or without
 * streaming heads), a request that waits is counted once, eviction takes a chain's leaves first,
 * block pressure drops only snapshots that give a block, and a failed admission keeps its
 * snapshot. (Each case once failed: a review found them.) */
#include "tests/test_common.h"

#include "engine/backend.h"
#include "engine/kv_cache_impl.h"
#include "engine/sched.h"
#include "engine/util.h"

#define BS 4

struct fixture {
    struct backend *b;
    struct kv_cache *kv;
    struct sched s;
};

static void fx_init(struct fixture *f, int n_blocks, int n_slots, int max_seqs, int budget, bool caching) {
    f->b = backend_cpu_create();
    int n_full = 1, n_stream = n_slots > 0;
    struct kv_geometry g = {.n_layers = 1, .head_dim = 8, .block_size = BS, .n_full = &n_full,
                            .n_stream = &n_stream, .sink = 2, .recent = 4};
    f->kv = kv_cache_new();
    assert_int_equal(kv_cache_init(f->kv, f->b, &g, n_blocks, n_slots), KV_STATUS_OK);
    if (caching) assert_int_equal(kv_cache_enable_prefix_caching(f->kv, 7), 0);
    struct sched_config sc = {.max_num_seqs = max_seqs, .max_batch_tokens = budget};
    assert_int_equal(sched_init(&f->s, &sc, f->kv), 0);
}

static void fx_free(struct fixture *f) {
    sched_free(&f->s);
    kv_cache_delete(f->kv);
    backend_destroy(f->b);
}

static struct sched_seq *seq_make(const int32_t *tokens, int n_tokens) {
    struct sched_seq *q = calloc(1, sizeof *q);
    q->n_tokens = n_tokens;
    q->tokens = tokens;
    q->snapshot_at = n_tokens;
    kv_seq_init(&q->kv);
    return q;
}

static void seq_drop(struct fixture *f, struct sched_seq *q) {
    sched_finish(&f->s, q);
    kv_seq_free(&q->kv);
    free(q);
}

static int32_t toks[64];

/* Runs a sequence (prompt n_prompt, then decodes up to n_total) to its end: returns the steps
 * that planned nothing while it still had work (0 when it finished). */
static int run_to_end(struct fixture *f, struct sched_seq *q, int n_total) {
    int stuck = 0;
    for (int guard = 0; guard < 200; guard++) {
        if (sched_step_plan(&f->s) == 0) {
            stuck++;
            continue;
        }
        sched_step_done(&f->s);
        if (q->n_computed == q->n_tokens) {
            if (q->n_tokens == n_total) return 0;
            q->n_tokens++; /* the sampled token */
            if (q->n_tokens == n_total) { /* finished: its last token is never computed */
                return 0;
            }
        }
    }
    return stuck;
}

/* Streaming heads: a prompt that ends mid-block in the pool's last block, and one decode. The
 * snapshot at the prompt's end shares the partial block, so the first decode would need a copy: one
 * block more than the pool has. The sequence takes the block over from the snapshot instead. */
static void lone_request(int n_slots, bool caching, int *stuck_out) {
    struct fixture f;
    fx_init(&f, 4, n_slots, 4, 100, caching); /* 16 tokens of KV */
    for (int i = 0; i < 64; i++) toks[i] = 10 + i;
    struct sched_seq *q = seq_make(toks, 14); /* 14 prompt tokens + 2 generated = 16 = capacity */
    sched_add(&f.s, q);
    *stuck_out = run_to_end(&f, q, 16);
    seq_drop(&f, q);
    fx_free(&f);
}

static void test_full_pool_request_runs_with_stream_snapshot(void **state) {
    (void)state;
    int stuck;
    lone_request(4, false, &stuck);
    assert_int_equal(stuck, 0); /* no cache: fine */
    lone_request(4, true, &stuck);
    print_message("with the cache: %d steps planned nothing\n", stuck);
    assert_int_equal(stuck, 0);
}

/* No streaming heads: a finished request left a snapshot holding its partial block; the next request
 * begins the same way and needs the whole pool: it takes the snapshot's partial block over rather
 * than copy it (which would need one block more than the pool has). */
static void test_full_pool_request_runs_after_partial_snapshot(void **state) {
    (void)state;
    struct fixture f;
    fx_init(&f, 4, 0, 4, 100, true);
    for (int i = 0; i < 64; i++) toks[i] = 10 + i;
    struct sched_seq *a = seq_make(toks, 6);
    sched_add(&f.s, a);
    assert_int_equal(sched_step_plan(&f.s), 1);
    sched_step_done(&f.s);
    seq_drop(&f, a); /* retire: snapshot of 6 tokens (1 full block + 2), block 0 cached */
    struct sched_seq *b = seq_make(toks, 15); /* prompt 15, max_tokens 1: 16 = capacity */
    sched_add(&f.s, b);
    int planned = 0;
    for (int k = 0; k < 10; k++) planned += sched_step_plan(&f.s) > 0;
    print_message("planned %d of 10 steps; waiting %d\n", planned, sched_num_waiting(&f.s));
    assert_true(planned > 0);
    seq_drop(&f, b);
    fx_free(&f);
}


/* A request waiting at the head of the queue for blocks is matched again at every step; the
 * prefix cache counts its prompt (and its hit) once, at its admission. */
static void test_waiting_request_counted_once(void **state) {
    (void)state;
    struct fixture f;
    fx_init(&f, 7, 0, 4, 100, true);
    for (int i = 0; i < 64; i++) toks[i] = 10 + i;
    static int32_t other[64];
    for (int i = 0; i < 64; i++) other[i] = 500 + i;
    struct sched_seq *a = seq_make(toks, 9); /* leaves 2 full blocks cached + a snapshot */
    sched_add(&f.s, a);
    sched_step_plan(&f.s);
    sched_step_done(&f.s);
    seq_drop(&f, a);
    struct sched_seq *big = seq_make(other, 16); /* holds the 4 free blocks while it runs */
    sched_add(&f.s, big);
    sched_step_plan(&f.s);
    sched_step_done(&f.s);
    struct sched_seq *b = seq_make(toks, 16); /* hits 9 tokens, needs 4 blocks + 1 copy: waits */
    sched_add(&f.s, b);
    for (int k = 0; k < 5; k++) { /* big's steps (nothing new to compute, so no block taken) */
        sched_step_plan(&f.s);
        sched_step_done(&f.s);
    }
    struct kv_prefix_stats ps;
    kv_cache_prefix_stats(f.kv, &ps);
    print_message("queries %llu hits %llu (one admission of b: queries 9 + 16 + 16 = 41)\n",
                  (unsigned long long)ps.queries, (unsigned long long)ps.hits);
    assert_int_equal(b->state, SCHED_WAITING);
    assert_true(ps.queries <= 9 + 16 + 16);
    assert_true(ps.hits <= 9);
    seq_drop(&f, b);
    seq_drop(&f, big);
    fx_free(&f);
}

/* A finished sequence's blocks go idle leaves first, so eviction takes a chain's last block and
 * the rest still matches. */
static void test_eviction_takes_leaves_first(void **state) {
    (void)state;
    struct fixture f;
    fx_init(&f, 4, 0, 4, 100, true);
    for (int i = 0; i < 64; i++) toks[i] = 10 + i;
    static int32_t other[64];
    for (int i = 0; i < 64; i++) other[i] = 500 + i;
    struct sched_seq *a = seq_make(toks, 12); /* 3 full blocks (the last token is never computed: 11) */
    a->n_tokens = 13;
    sched_add(&f.s, a);
    sched_step_plan(&f.s);
    sched_step_done(&f.s); /* 13 computed: 3 full blocks registered */
    seq_drop(&f, a);
    struct sched_seq *o = seq_make(other, 3); /* needs 1 block: the pool is full, one idle block is evicted */
    sched_add(&f.s, o);
    sched_step_plan(&f.s);
    sched_step_done(&f.s);
    seq_drop(&f, o);
    struct kv_prefix_stats ps;
    kv_cache_prefix_stats(f.kv, &ps);
    struct kv_seq t;
    kv_seq_init(&t);
    int found = kv_cache_seq_match(f.kv, &t, toks, 14);
    print_message("registered blocks %d, of a's 12 tokens found %d\n", ps.cached_blocks, found);
    kv_cache_seq_release(f.kv, &t);
    kv_seq_free(&t);
    assert_true(found >= 8); /* blocks 0 and 1 of the chain */
    fx_free(&f);
}

/* Block pressure drops only snapshots that give a block back: a slot-only snapshot (a prompt
 * ending on a block edge) stays. */
static void test_block_pressure_keeps_slot_only_snapshots(void **state) {
    (void)state;
    struct fixture f;
    fx_init(&f, 4, 4, 2, 100, true);
    for (int i = 0; i < 64; i++) toks[i] = 10 + i;
    static int32_t t2[64], other[64];
    for (int i = 0; i < 64; i++) t2[i] = 300 + i, other[i] = 500 + i;
    struct sched_seq *a = seq_make(toks, 4); /* snapshot of 4 tokens: slot only */
    sched_add(&f.s, a);
    sched_step_plan(&f.s);
    sched_step_done(&f.s);
    seq_drop(&f, a);
    struct sched_seq *b = seq_make(t2, 6); /* snapshot of 6 tokens: slot + partial block */
    sched_add(&f.s, b);
    sched_step_plan(&f.s);
    sched_step_done(&f.s);
    seq_drop(&f, b);
    struct kv_prefix_stats ps;
    kv_cache_prefix_stats(f.kv, &ps);
    int before = ps.snapshots;
    /* 4 blocks: one is a's (idle), two b's (one idle, one in its snapshot), one free */
    struct sched_seq *o = seq_make(other, 16);
    sched_add(&f.s, o);
    sched_step_plan(&f.s); /* o's 4 blocks: 1 free, 2 idle, 1 from b's snapshot */
    kv_cache_prefix_stats(f.kv, &ps);
    print_message("snapshots before %d, after %d\n", before, ps.snapshots);
    assert_int_equal(before, 2);
    assert_int_equal(ps.snapshots, 1);
    seq_drop(&f, o);
    fx_free(&f);
}

/* Streaming heads, no free slot: an admission that matches a snapshot takes its slot over, then
 * finds no blocks: it leaves the snapshot behind again, and is admitted from it once room comes. */
static void test_failed_admission_keeps_snapshot(void **state) {
    (void)state;
    struct fixture f;
    fx_init(&f, 6, 2, 2, 100, true);
    for (int i = 0; i < 64; i++) toks[i] = 10 + i;
    static int32_t other[64];
    for (int i = 0; i < 64; i++) other[i] = 500 + i;
    struct sched_seq *a = seq_make(toks, 6); /* leaves a snapshot of 6 tokens (slot + partial block) */
    sched_add(&f.s, a);
    sched_step_plan(&f.s);
    sched_step_done(&f.s);
    seq_drop(&f, a);
    struct sched_seq *r = seq_make(other, 16); /* holds 4 blocks and the other slot */
    r->snapshot_at = 0;
    sched_add(&f.s, r);
    assert_int_equal(sched_step_plan(&f.s), 1);
    sched_step_done(&f.s);
    struct kv_prefix_stats ps;
    kv_cache_prefix_stats(f.kv, &ps);
    assert_int_equal(ps.snapshots, 1);
    struct sched_seq *b = seq_make(toks, 14); /* a's 6 tokens and more: needs 4 blocks */
    sched_add(&f.s, b);
    sched_step_plan(&f.s); /* r (nothing to compute); b cannot be admitted */
    assert_int_equal(b->state, SCHED_WAITING);
    kv_cache_prefix_stats(f.kv, &ps);
    print_message("snapshots after b's failed admission: %d\n", ps.snapshots);
    seq_drop(&f, r);
    assert_int_equal(sched_step_plan(&f.s), 1);
    print_message("b admitted with %d tokens cached\n", b->n_cached);
    assert_int_equal(b->n_cached, 6);
    seq_drop(&f, b);
    fx_free(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_pool_request_runs_with_stream_snapshot),
        cmocka_unit_test(test_full_pool_request_runs_after_partial_snapshot),
        cmocka_unit_test(test_waiting_request_counted_once),
        cmocka_unit_test(test_eviction_takes_leaves_first),
        cmocka_unit_test(test_block_pressure_keeps_slot_only_snapshots),
        cmocka_unit_test(test_failed_admission_keeps_snapshot),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
