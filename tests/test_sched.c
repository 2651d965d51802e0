/* The scheduler (engine/sched.h) driven with fake sequences and a real KV cache on the CPU backend,
 * no model: admission order, the token budget and chunked prefill, seats, preemption, forks, and a
 * random walk that checks the cache's reference counts after every operation. */
#include "test_common.h"

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

/* A cache of n_blocks blocks of BS tokens (one layer, one retrieval head, streaming slots when
 * n_slots > 0: one streaming head). */
static void fx_init(struct fixture *f, int n_blocks, int n_slots, int max_seqs, int budget) {
    f->b = backend_cpu_create();
    assert_non_null(f->b);
    int n_full = 1, n_stream = n_slots > 0;
    struct kv_geometry g = {.n_layers = 1, .head_dim = 8, .block_size = BS, .n_full = &n_full,
                            .n_stream = &n_stream, .sink = 2, .recent = 4};
    f->kv = kv_cache_new();
    assert_non_null(f->kv);
    assert_int_equal(kv_cache_init(f->kv, f->b, &g, n_blocks, n_slots), KV_STATUS_OK);
    struct sched_config sc = {.max_num_seqs = max_seqs, .max_batch_tokens = budget};
    assert_int_equal(sched_init(&f->s, &sc, f->kv), 0);
}

static void fx_free(struct fixture *f) {
    sched_free(&f->s);
    kv_cache_delete(f->kv);
    backend_destroy(f->b);
}

static struct sched_seq *seq_make(int n_tokens) {
    struct sched_seq *q = calloc(1, sizeof *q);
    assert_non_null(q);
    q->n_tokens = n_tokens;
    kv_seq_init(&q->kv);
    return q;
}

static void seq_drop(struct fixture *f, struct sched_seq *q) {
    sched_finish(&f->s, q);
    kv_seq_free(&q->kv);
    free(q);
}

/* What a step does to the planned sequences: their tokens are computed. */
static void run_plan(struct fixture *f) { sched_step_done(&f->s); }

static int plan_want(const struct fixture *f, const struct sched_seq *q) {
    for (int i = 0; i < f->s.plan.n; i++)
        if (f->s.plan.seqs[i] == q) return f->s.plan.want[i];
    return 0;
}

/* Every block's count equals the number of tables holding it; free blocks have none and are on the
 * free stack exactly once; the same for slots. */
static void check_counts(const struct fixture *f, struct sched_seq **seqs, int n) {
    const struct kv_cache *kv = f->kv;
    int *holders = calloc((size_t)kv->n_blocks, sizeof *holders);
    int *slot_holders = calloc((size_t)kv->n_slots + 1, sizeof *slot_holders);
    kv_cache_snapshot_holders(kv, holders, slot_holders);
    for (int i = 0; i < n; i++) {
        if (!seqs[i]) continue;
        for (int k = 0; k < seqs[i]->kv.n_blocks; k++) holders[seqs[i]->kv.blocks[k]]++;
        if (seqs[i]->kv.slot >= 0) slot_holders[seqs[i]->kv.slot]++;
        /* a sequence's table covers what it computed, never less */
        if (seqs[i]->state == SCHED_RUNNING)
            assert_true(seqs[i]->kv.n_blocks * BS >= seqs[i]->n_computed);
    }
    int on_stack = 0;
    for (int b = 0; b < kv->n_blocks; b++) {
        assert_int_equal(kv->ref[b], holders[b]);
        int times = 0;
        for (int k = 0; k < kv->n_free_blocks; k++) times += kv->free_blocks[k] == b;
        /* nobody's block is free, or cached (an idle registered block is not on the free stack) */
        assert_int_equal(times, holders[b] == 0 && !kv_cache_block_cached(kv, b));
        on_stack += times;
    }
    assert_int_equal(on_stack, kv->n_free_blocks);
    struct kv_cache_usage u;
    kv_cache_usage(kv, &u);
    assert_true(u.n_free_blocks >= kv->n_free_blocks && u.n_free_blocks <= kv->n_blocks);
    for (int sl = 0; sl < kv->n_slots; sl++) {
        assert_true(slot_holders[sl] <= 1);
        assert_int_equal(kv->slot_used[sl], slot_holders[sl]);
    }
    free(holders);
    free(slot_holders);
}

static void test_fcfs_and_chunked_prefill(void **state) {
    (void)state;
    struct fixture f;
    fx_init(&f, 64, 0, 8, 10);
    struct sched_seq *a = seq_make(25), *b = seq_make(3);
    assert_int_equal(sched_add(&f.s, a), 0);
    assert_int_equal(sched_add(&f.s, b), 0);
    /* a's prompt in chunks of the budget; b waits behind it (FCFS) until a leaves room */
    assert_int_equal(sched_step_plan(&f.s), 1);
    assert_ptr_equal(f.s.plan.seqs[0], a);
    assert_int_equal(f.s.plan.want[0], 10);
    assert_int_equal(f.s.plan.n_tokens, 10);
    run_plan(&f);
    assert_int_equal(sched_step_plan(&f.s), 1);
    assert_int_equal(plan_want(&f, a), 10);
    run_plan(&f);
    assert_int_equal(sched_step_plan(&f.s), 2); /* 5 left of a, then b's 3 */
    assert_ptr_equal(f.s.plan.seqs[0], a);
    assert_int_equal(plan_want(&f, a), 5);
    assert_int_equal(plan_want(&f, b), 3);
    run_plan(&f);
    /* decodes: one token each, running first in admission order */
    a->n_tokens++;
    b->n_tokens++;
    assert_int_equal(sched_step_plan(&f.s), 2);
    assert_ptr_equal(f.s.plan.seqs[0], a);
    assert_ptr_equal(f.s.plan.seqs[1], b);
    assert_int_equal(f.s.plan.n_tokens, 2);
    assert_int_equal(a->kv.n_blocks, 7); /* 26 tokens of 4 */
    struct sched_seq *all[] = {a, b};
    check_counts(&f, all, 2);
    seq_drop(&f, a);
    seq_drop(&f, b);
    assert_false(sched_has_work(&f.s));
    assert_int_equal(f.kv->n_free_blocks, 64);
    fx_free(&f);
}

static void test_seats_and_queue_state(void **state) {
    (void)state;
    struct fixture f;
    fx_init(&f, 64, 4, 2, 100);
    struct sched_seq *q[4];
    for (int i = 0; i < 4; i++) {
        q[i] = seq_make(2);
        assert_int_equal(sched_add(&f.s, q[i]), 0);
    }
    int unseated, left;
    sched_queue_state(&f.s, &unseated, &left);
    assert_int_equal(unseated, 2); /* two seats: the first two fit */
    assert_int_equal(left, 0);
    assert_int_equal(sched_step_plan(&f.s), 2);
    assert_int_equal(sched_num_running(&f.s), 2);
    assert_int_equal(sched_num_waiting(&f.s), 2);
    assert_true(q[0]->kv.slot >= 0 && q[1]->kv.slot >= 0 && q[2]->kv.slot < 0);
    run_plan(&f);
    seq_drop(&f, q[0]);
    q[0] = NULL;
    q[1]->n_tokens++;
    assert_int_equal(sched_step_plan(&f.s), 2); /* q[1]'s decode, then q[2] takes the free seat */
    assert_ptr_equal(f.s.plan.seqs[1], q[2]);
    check_counts(&f, q, 4);
    for (int i = 1; i < 4; i++) seq_drop(&f, q[i]);
    assert_int_equal(f.kv->n_free_slots, 4);
    fx_free(&f);
}

static void test_preemption_newest_first(void **state) {
    (void)state;
    struct fixture f;
    fx_init(&f, 4, 0, 4, 100); /* 16 tokens of KV in all */
    struct sched_seq *a = seq_make(7), *b = seq_make(7);
    sched_add(&f.s, a);
    sched_add(&f.s, b);
    assert_int_equal(sched_step_plan(&f.s), 2); /* 2 blocks each: the pool is full */
    run_plan(&f);
    assert_int_equal(f.kv->n_free_blocks, 0);
    a->n_tokens = 9; /* a's decode needs a third block: b (the newest) loses its KV */
    b->n_tokens = 8;
    assert_int_equal(sched_step_plan(&f.s), 1);
    assert_ptr_equal(f.s.plan.seqs[0], a);
    assert_int_equal(f.s.preemptions, 1);
    assert_int_equal(b->state, SCHED_WAITING);
    assert_int_equal(b->n_computed, 0);
    assert_int_equal(b->kv.n_blocks, 0);
    struct sched_seq *c = seq_make(1);
    sched_add(&f.s, c); /* behind b: the preempted sequence waits at the front */
    struct sched_seq *all[] = {a, b, c};
    check_counts(&f, all, 3);
    run_plan(&f);
    seq_drop(&f, a);
    assert_int_equal(sched_step_plan(&f.s), 2); /* b recomputes all its 8 tokens, then c */
    assert_ptr_equal(f.s.plan.seqs[0], b);
    assert_int_equal(f.s.plan.want[0], 8);
    assert_ptr_equal(f.s.plan.seqs[1], c);
    seq_drop(&f, b);
    seq_drop(&f, c);
    fx_free(&f);
}

static void test_fork_shares_and_copies_on_write(void **state) {
    (void)state;
    struct fixture f;
    fx_init(&f, 16, 4, 4, 100);
    struct sched_seq *p = seq_make(6), *k1 = seq_make(6), *k2 = seq_make(6);
    p->forks_pending = 2;
    sched_add(&f.s, p);
    int unseated, left;
    sched_queue_state(&f.s, &unseated, &left);
    assert_int_equal(left, 1); /* three of four seats */
    assert_int_equal(sched_step_plan(&f.s), 1);
    run_plan(&f);
    assert_int_equal(f.kv->n_free_slots, 3); /* two held for the forks, not yet taken */
    assert_int_equal(sched_fork(&f.s, p, k1), KV_STATUS_OK);
    assert_int_equal(sched_fork(&f.s, p, k2), KV_STATUS_OK);
    assert_int_equal(p->forks_pending, 0);
    assert_int_equal(k1->n_computed, 6);
    assert_int_equal(f.kv->n_free_blocks, 14); /* shared, not copied */
    assert_int_equal(f.kv->ref[p->kv.blocks[1]], 3);
    assert_int_equal(f.kv->n_free_slots, 1);
    struct sched_seq *all[] = {p, k1, k2};
    check_counts(&f, all, 3);
    /* each writes position 6, inside the shared second block: copies for the writers */
    p->n_tokens = k1->n_tokens = k2->n_tokens = 7;
    assert_int_equal(sched_step_plan(&f.s), 3);
    assert_int_equal(f.kv->ref[p->kv.blocks[0]], 3);
    assert_true(p->kv.blocks[1] != k1->kv.blocks[1] && k1->kv.blocks[1] != k2->kv.blocks[1]);
    check_counts(&f, all, 3);
    seq_drop(&f, k1);
    seq_drop(&f, p);
    seq_drop(&f, k2);
    assert_int_equal(f.kv->n_free_blocks, 16);
    assert_int_equal(f.kv->n_free_slots, 4);
    fx_free(&f);
}

/* Random admissions, steps, decodes, forks, finishes and aborts on a small pool (so preemption is
 * frequent); the counts are checked after every operation, and everything returns at the end. */
/* The tokens of sequence i: a few shared beginnings, so that the prefix cache finds them. */
static int32_t walk_tokens[24][64];

static void random_walk(bool caching) {
    enum { N = 24, OPS = 3000 };
    struct fixture f;
    fx_init(&f, 12, 6, 6, 9);
    if (caching) assert_int_equal(kv_cache_enable_prefix_caching(f.kv, 99), 0);
    struct sched_seq *q[N] = {0};
    struct util_rng rng;
    util_rng_seed(&rng, 12345);
    int finished = 0;
    for (int op = 0; op < OPS; op++) {
        int i = (int)(util_rng_next(&rng) % N), what = (int)(util_rng_next(&rng) % 10);
        if (!q[i]) {
            if (what < 4) continue;
            q[i] = seq_make(1 + (int)(util_rng_next(&rng) % 10));
            int family = (int)(util_rng_next(&rng) % 3);
            for (int k = 0; k < 64; k++) walk_tokens[i][k] = k < 6 ? family : family * 100 + k % (2 + family);
            q[i]->tokens = walk_tokens[i];
            q[i]->snapshot_at = q[i]->n_tokens; /* the prompt's end */
            if (what == 9) q[i]->forks_pending = 1;
            assert_int_equal(sched_add(&f.s, q[i]), 0);
        } else if (what < 5) {
            sched_step_plan(&f.s);
            sched_step_done(&f.s);
            for (int j = 0; j < N; j++) { /* sequences whose prompt is done fork, then decode */
                struct sched_seq *s = q[j];
                if (!s || s->state != SCHED_RUNNING || s->n_computed != s->n_tokens) continue;
                for (int k = 0; k < N && s->forks_pending; k++)
                    if (!q[k]) {
                        q[k] = seq_make(s->n_tokens);
                        memcpy(walk_tokens[k], s->tokens, sizeof walk_tokens[k]);
                        q[k]->tokens = walk_tokens[k];
                        assert_int_equal(sched_fork(&f.s, s, q[k]), KV_STATUS_OK);
                    }
                if (s->forks_pending) continue; /* no room in q[]: the fork stays pending */
                if (s->n_tokens < 40) s->n_tokens++;
            }
        } else if (what < 7 && q[i]->forks_pending == 0) {
            seq_drop(&f, q[i]); /* finish, or cancel in whatever state */
            q[i] = NULL;
            finished++;
        }
        check_counts(&f, q, N);
        int running = sched_num_running(&f.s);
        assert_true(running + f.s.reserved <= 6);
    }
    assert_true(finished > 100);
    assert_true(f.s.preemptions > 10);
    for (int i = 0; i < N; i++)
        if (q[i]) seq_drop(&f, q[i]); /* gives back the seats held for its pending forks */
    assert_int_equal(f.s.reserved, 0);
    struct kv_cache_usage u;
    kv_cache_usage(f.kv, &u);
    assert_int_equal(u.n_free_blocks, 12);
    assert_int_equal(u.n_free_slots, 6);
    if (caching) {
        struct kv_prefix_stats ps;
        kv_cache_prefix_stats(f.kv, &ps);
        assert_true(ps.hits > 0);
        print_message("prefix cache: %llu of %llu tokens found, %d snapshots\n", (unsigned long long)ps.hits,
                      (unsigned long long)ps.queries, ps.snapshots);
    } else {
        assert_int_equal(f.kv->n_free_blocks, 12);
    }
    fx_free(&f);
}

static void test_random_walk_keeps_counts_exact(void **state) {
    (void)state;
    random_walk(false);
}

/* The same with the prefix cache on: blocks and slots are held by sequences, by snapshots or by
 * nobody; a block nobody holds is free or cached, never both. */
static void test_random_walk_with_prefix_cache(void **state) {
    (void)state;
    random_walk(true);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fcfs_and_chunked_prefill),
        cmocka_unit_test(test_seats_and_queue_state),
        cmocka_unit_test(test_preemption_newest_first),
        cmocka_unit_test(test_fork_shares_and_copies_on_write),
        cmocka_unit_test(test_random_walk_keeps_counts_exact),
        cmocka_unit_test(test_random_walk_with_prefix_cache),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
