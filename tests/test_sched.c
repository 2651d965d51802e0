/* The scheduler (engine/sched.h) driven with fake sequences and a real KV cache on the CPU backend,
 * no model: admission order, the token budget and chunked prefill, seats, preemption, forks, a
 * random walk that checks the cache's reference counts after every operation, and prefill chunks
 * sized by their cost beside decodes. */
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
static void fx_init_cost(struct fixture *f, int n_blocks, int n_slots, int max_seqs, int budget,
                         const struct sched_cost *cost) {
    f->b = backend_cpu_create();
    assert_non_null(f->b);
    int n_full = 1, n_stream = n_slots > 0;
    struct kv_geometry g = {.n_layers = 1, .head_dim = 8, .block_size = BS, .n_full = &n_full,
                            .n_stream = &n_stream, .sink = 2, .recent = 4};
    f->kv = kv_cache_new();
    assert_non_null(f->kv);
    assert_int_equal(kv_cache_init(f->kv, f->b, &g, n_blocks, n_slots), KV_STATUS_OK);
    struct sched_config sc = {.max_num_seqs = max_seqs, .max_batch_tokens = budget};
    if (cost) sc.cost = *cost;
    assert_int_equal(sched_init(&f->s, &sc, f->kv), 0);
}

static void fx_init(struct fixture *f, int n_blocks, int n_slots, int max_seqs, int budget) {
    fx_init_cost(f, n_blocks, n_slots, max_seqs, budget, NULL);
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

/* ---- prefill chunks sized by their cost ---- */

/* The cost of the planned step, summed over its sequences (a decode: one token left). */
static double plan_cost(const struct fixture *f) {
    double c = 0;
    for (int i = 0; i < f->s.plan.n; i++) {
        const struct sched_seq *q = f->s.plan.seqs[i];
        c += q->n_tokens - q->n_computed == 1 ? sched_decode_cost(&f->s.cfg.cost, q->n_computed)
                                              : sched_chunk_cost(&f->s.cfg.cost, q->n_computed, f->s.plan.want[i]);
    }
    return c;
}

/* A step ran and every sequence that finished its tokens appended one (a decode). */
static void run_plan_decode(struct fixture *f) {
    for (int i = 0; i < f->s.plan.n; i++) {
        struct sched_seq *q = f->s.plan.seqs[i];
        if (q->n_computed + f->s.plan.want[i] == q->n_tokens) q->n_tokens++;
    }
    run_plan(f);
}

/* The closed form against the sum over each query of the keys it sees (unbounded and windowed
 * heads, chunks before, across and past the window). */
static void test_chunk_cost_counts_visible_keys(void **state) {
    (void)state;
    struct sched_cost c = {.attn = {{0.25, 0}, {0.5, 6}}};
    int starts[] = {0, 1, 3, 5, 6, 7, 40}, lens[] = {1, 2, 3, 8, 30};
    for (size_t i = 0; i < sizeof starts / sizeof *starts; i++)
        for (size_t j = 0; j < sizeof lens / sizeof *lens; j++) {
            double want = 0;
            for (int p = starts[i]; p < starts[i] + lens[j]; p++)
                want += 1 + 0.25 * (p + 1) + 0.5 * (p + 1 < 6 ? p + 1 : 6);
            assert_float_equal(sched_chunk_cost(&c, starts[i], lens[j]), want, 1e-9);
        }
    /* the fit is the most tokens within the cost */
    for (int start = 0; start < 50; start += 7)
        for (double cost = 0.5; cost < 400; cost *= 1.7) {
            int n = sched_chunk_fit(&c, start, 100, cost);
            assert_true(n >= 0 && n <= 100);
            if (n > 0) assert_true(sched_chunk_cost(&c, start, n) <= cost);
            if (n < 100) assert_true(sched_chunk_cost(&c, start, n + 1) > cost);
        }
    assert_int_equal(sched_chunk_fit(&c, 0, 0, 1e9), 0);
}

/* Costs for the cases below: attention 0.02 a visible key (a 400-token prefix costs 8 more a
 * token), the cap what 16 tokens from position 0 cost, at least 4 tokens a step. */
static struct sched_cost test_cost(void) {
    struct sched_cost c = {.attn = {{0.02, 0}, {0, 0}}, .min_chunk = 4};
    c.step_budget = sched_chunk_cost(&c, 0, 16);
    return c;
}

/* A long prompt beside a running decode: every step keeps the decode's token and stays within the
 * cost (each chunk the most that fits), the chunks shrink as the prompt's prefix grows, and once
 * the decode ends the prompt takes the whole token budget again. */
static void test_cost_chunks_beside_decode(void **state) {
    (void)state;
    struct sched_cost cost = test_cost();
    struct fixture f;
    fx_init_cost(&f, 256, 0, 8, 64, &cost);
    struct sched_seq *d = seq_make(3), *l = seq_make(600);
    sched_add(&f.s, d);
    assert_int_equal(sched_step_plan(&f.s), 1);
    run_plan_decode(&f); /* d's prompt: d decodes from now on */
    sched_add(&f.s, l);
    int prev = 1 << 30, first = 0, last = 0, steps = 0;
    while (l->n_computed < 600) {
        assert_int_equal(sched_step_plan(&f.s), 2);
        assert_int_equal(plan_want(&f, d), 1);
        int c = plan_want(&f, l), left = l->n_tokens - l->n_computed;
        assert_true(c >= 1 && c <= left && c <= 63);
        /* within the cost, and one token more would not be (or the prompt's end or the token budget) */
        assert_true(plan_cost(&f) <= cost.step_budget || c == cost.min_chunk);
        if (c < left && c < 63)
            assert_true(plan_cost(&f) + sched_chunk_cost(&cost, l->n_computed + c, 1) > cost.step_budget);
        if (c < left) assert_true(c <= prev); /* shrinking as the prefix grows */
        if (!first) first = c;
        last = c;
        prev = c;
        run_plan_decode(&f);
        assert_true(++steps < 1000);
    }
    assert_true(first >= 12);         /* near position 0 nearly what 16 tokens cost */
    assert_true(last <= first / 3);   /* at ~600 tokens of prefix a token costs 13x more */
    assert_true(steps > 600 / 64 * 3); /* far more steps than by the token budget alone */
    /* alone again (d finished): the whole token budget whatever the prefix */
    seq_drop(&f, d);
    l->n_tokens += 200; /* (as if its prompt had been longer) */
    assert_int_equal(sched_step_plan(&f.s), 1);
    assert_int_equal(plan_want(&f, l), 64);
    seq_drop(&f, l);
    fx_free(&f);
}

/* Alone, a prompt is chunked by the token budget only, however much its chunks cost. */
static void test_cost_alone_takes_token_budget(void **state) {
    (void)state;
    struct sched_cost cost = test_cost();
    struct fixture f;
    fx_init_cost(&f, 256, 0, 8, 64, &cost);
    struct sched_seq *l = seq_make(600);
    sched_add(&f.s, l);
    for (int k = 0; k < 9; k++) {
        assert_int_equal(sched_step_plan(&f.s), 1);
        assert_int_equal(plan_want(&f, l), 64);
        assert_true(k == 0 || plan_cost(&f) > cost.step_budget);
        run_plan(&f);
    }
    assert_int_equal(sched_step_plan(&f.s), 1);
    assert_int_equal(plan_want(&f, l), 600 - 9 * 64);
    seq_drop(&f, l);
    fx_free(&f);
}

/* A cap the decodes alone exceed: the oldest prefill still gets min_chunk tokens a step and
 * finishes; a younger prompt waits (nothing left of the cost) and then runs. */
static void test_cost_progress_guaranteed(void **state) {
    (void)state;
    struct sched_cost cost = test_cost();
    cost.step_budget = 1.5; /* less than a decode with any context */
    struct fixture f;
    fx_init_cost(&f, 256, 0, 8, 64, &cost);
    struct sched_seq *d = seq_make(30), *l = seq_make(50), *w = seq_make(20);
    sched_add(&f.s, d);
    assert_int_equal(sched_step_plan(&f.s), 1); /* alone: its whole prompt */
    assert_int_equal(plan_want(&f, d), 30);
    run_plan_decode(&f);
    sched_add(&f.s, l);
    sched_add(&f.s, w);
    int steps = 0;
    while (l->n_computed < 50) {
        assert_int_equal(sched_step_plan(&f.s), 2);
        assert_int_equal(plan_want(&f, d), 1);
        assert_int_equal(plan_want(&f, l), 50 - l->n_computed < 4 ? 50 - l->n_computed : 4);
        assert_int_equal(plan_want(&f, w), 0);
        assert_int_equal(w->state, SCHED_WAITING);
        run_plan_decode(&f);
        assert_true(++steps <= 13);
    }
    /* l decodes now; w is admitted with its minimum */
    assert_int_equal(sched_step_plan(&f.s), 3);
    assert_int_equal(plan_want(&f, w), 4);
    struct sched_seq *all[] = {d, l, w};
    check_counts(&f, all, 3);
    seq_drop(&f, d);
    seq_drop(&f, l);
    seq_drop(&f, w);
    fx_free(&f);
}

/* Mixed: decodes younger than a long prefill keep their tokens (the prefill takes what they leave
 * of the token budget); two prefills share the cost, the older first; a windowed (streaming)
 * head's cost stops growing past its window, so its chunks stop shrinking. */
static void test_cost_mixed(void **state) {
    (void)state;
    struct sched_cost cost = test_cost();
    struct fixture f;
    fx_init_cost(&f, 512, 0, 8, 10, &cost);
    struct sched_seq *l = seq_make(200), *d[3];
    sched_add(&f.s, l);
    assert_int_equal(sched_step_plan(&f.s), 1);
    run_plan(&f); /* l: 10 of 200 */
    /* three one-token prompts join behind l; they are admitted in a step where l has nothing to
     * compute (as if its prompt had ended there), and decode from then on */
    for (int k = 0; k < 3; k++) {
        d[k] = seq_make(1);
        sched_add(&f.s, d[k]);
    }
    l->n_tokens = l->n_computed;
    assert_int_equal(sched_step_plan(&f.s), 3);
    run_plan_decode(&f);
    l->n_tokens = 200;
    /* the decodes (younger) keep their 3 tokens; l (older, planned first) gets the other 7, which
     * fit in the cost */
    assert_int_equal(sched_step_plan(&f.s), 4);
    assert_ptr_equal(f.s.plan.seqs[0], l);
    for (int k = 0; k < 3; k++) assert_int_equal(plan_want(&f, d[k]), 1);
    assert_int_equal(plan_want(&f, l), 7);
    assert_true(plan_cost(&f) <= cost.step_budget);
    run_plan_decode(&f);
    for (int k = 0; k < 3; k++) seq_drop(&f, d[k]);
    seq_drop(&f, l);
    fx_free(&f);

    /* two prompts beside a decode: the older (short) takes all of its prompt, the younger what is
     * left of the cost */
    fx_init_cost(&f, 512, 0, 8, 64, &cost);
    struct sched_seq *dd = seq_make(2), *a = seq_make(5), *b = seq_make(40);
    sched_add(&f.s, dd);
    sched_step_plan(&f.s);
    run_plan_decode(&f);
    sched_add(&f.s, a);
    sched_add(&f.s, b);
    assert_int_equal(sched_step_plan(&f.s), 3);
    int ca = plan_want(&f, a), cb = plan_want(&f, b);
    assert_int_equal(ca, 5);
    assert_true(cb > 0 && cb < 16);
    assert_true(plan_cost(&f) <= cost.step_budget);
    assert_true(plan_cost(&f) + sched_chunk_cost(&cost, b->n_computed + cb, 1) > cost.step_budget);
    seq_drop(&f, dd);
    seq_drop(&f, a);
    seq_drop(&f, b);
    fx_free(&f);

    /* all of attention in windowed heads (window 32): past the window the chunks stop shrinking */
    struct sched_cost wc = {.attn = {{0, 0}, {0.02, 32}}, .min_chunk = 4};
    wc.step_budget = sched_chunk_cost(&wc, 0, 16);
    fx_init_cost(&f, 512, 0, 8, 64, &wc);
    struct sched_seq *s1 = seq_make(2), *s2 = seq_make(400);
    sched_add(&f.s, s1);
    sched_step_plan(&f.s);
    run_plan_decode(&f);
    sched_add(&f.s, s2);
    int at100 = 0, at300 = 0;
    while (s2->n_computed < 400) {
        sched_step_plan(&f.s);
        assert_true(plan_cost(&f) <= wc.step_budget);
        if (!at100 && s2->n_computed >= 100) at100 = plan_want(&f, s2);
        if (!at300 && s2->n_computed >= 300) at300 = plan_want(&f, s2);
        run_plan_decode(&f);
    }
    assert_true(at100 > 0 && at100 == at300);
    assert_true(at100 < 16);
    seq_drop(&f, s1);
    seq_drop(&f, s2);
    fx_free(&f);
}

/* ---- the wave model (a GPU's prefill attention in blocks) ---- */

/* An H100's wgmma prefill kernel at GQA 4: 132 blocks at once, 32 tokens of one KV head a block. */
#define WAVE 132
#define WAVE_TB 32

static struct sched_waves waves_of(const struct sched_wave_part *parts, int n) {
    return (struct sched_waves){WAVE, WAVE_TB, n, parts};
}

/* The tokens whose blocks fill the waves n tokens start in a part of h heads, counted block by
 * block: ceil(n / TB) blocks a head, the waves those need, then every block a head those waves
 * hold. */
static int ref_span(int h, int n) {
    int per_head = (n + WAVE_TB - 1) / WAVE_TB, waves = 0;
    while (waves * WAVE < per_head * h) waves++;
    while ((per_head + 1) * h <= waves * WAVE) per_head++;
    return per_head * WAVE_TB;
}

/* A chunk's cost summed query by query: linear layers 1 a token, streaming heads (attn[1]) the
 * keys each query of the chunk sees, each part's retrieval heads every earlier key of each query
 * of its span. */
static double ref_cost(const struct sched_cost *c, int start, int n) {
    double want = n;
    for (int p = start; p < start + n; p++) {
        int seen = c->attn[1].window && c->attn[1].window < p + 1 ? c->attn[1].window : p + 1;
        want += c->attn[1].per_key * seen;
    }
    for (int i = 0; i < c->waves.n_parts; i++) {
        const struct sched_wave_part *pt = &c->waves.parts[i];
        if (!pt->heads) continue;
        for (int p = start; p < start + ref_span(pt->heads, n); p++) want += pt->per_key * (p + 1);
    }
    return want;
}

/* Llama-3-8B's shape: 32 layers; per_key a query-key pair of every head (4.4e-5), a layer's part
 * its share; heads[l] retrieval KV heads of 8, the rest streaming (sink + recent 320). */
static struct sched_cost llama8b_cost(struct sched_wave_part *parts, const int *heads) {
    const double per_key = 4.4e-5;
    struct sched_cost c = {.attn = {{0, 0}, {0, 320}}};
    for (int l = 0; l < 32; l++) {
        parts[l] = (struct sched_wave_part){per_key * heads[l] / (8.0 * 32), heads[l]};
        c.attn[0].per_key += parts[l].per_key;
        c.attn[1].per_key += per_key * (8 - heads[l]) / (8.0 * 32);
    }
    c.waves = waves_of(parts, 32);
    c.min_chunk = sched_wave_chunk(&c.waves, 16);
    return c;
}

/* The cost of chunks of lens[] tokens from each of starts[] against the sum over their queries,
 * and from each start never falling as the chunk grows to max_n tokens (the fit's binary search
 * needs it). */
static void check_cost(const struct sched_cost *c, const int *starts, int n_starts, const int *lens, int n_lens,
                       int max_n) {
    for (int i = 0; i < n_starts; i++) {
        for (int j = 0; j < n_lens; j++) {
            double want = ref_cost(c, starts[i], lens[j]);
            assert_float_equal(sched_chunk_cost(c, starts[i], lens[j]), want, want * 1e-9);
        }
        double prev = 0;
        for (int n = 1; n <= max_n; n++) {
            double cost = sched_chunk_cost(c, starts[i], n);
            assert_true(cost >= prev);
            prev = cost;
        }
    }
}

/* Whether n tokens fill at least half of the last wave they start in a part of h heads. */
static bool last_wave_half_full(int h, int n) {
    int last = (n + WAVE_TB - 1) / WAVE_TB * h % WAVE;
    return last == 0 || 2 * last >= WAVE;
}

/* The span against blocks counted one by one; the cost against the sum over queries, never
 * falling as the chunk grows. */
static void test_wave_span_and_cost(void **state) {
    (void)state;
    struct sched_wave_part parts[5] = {{2e-5, 8}, {2e-5, 8}, {1e-5, 3}, {3e-5, 16}, {0, 0}};
    struct sched_waves w = waves_of(parts, 5);
    for (int h = 1; h <= 16; h++)
        for (int n = 1; n <= 2100; n++) assert_int_equal(sched_blocks_span(&w, h, n), ref_span(h, n));
    assert_int_equal(sched_blocks_span(&w, 8, 1), 512);   /* 16 blocks a head of 132 */
    assert_int_equal(sched_blocks_span(&w, 8, 513), 1056); /* two waves: 33 blocks a head */
    assert_int_equal(sched_blocks_span(&w, 0, 77), 77);
    struct sched_waves none = {0};
    assert_int_equal(sched_blocks_span(&none, 8, 77), 77);
    struct sched_cost c = {.attn = {{0, 0}, {4e-5, 320}}, .waves = w};
    const int starts[] = {0, 100, 8192, 131072}, lens[] = {1, 31, 32, 33, 511, 512, 513, 1000, 1056, 1057, 2048};
    check_cost(&c, starts, 4, lens, 11, 3000);
}

/* Llama-3-8B at full attention, 131,072 tokens in: at 1 x (2048) a token costs its whole wave,
 * more than the budget, so the chunk is the least, one wave; at 1.75 x one wave fits and two do
 * not, so the chunk is the wave; the FLOP model takes chunks there that leave their last wave part
 * empty. At every budget the chunk there fills at least half of its last wave. */
static void test_wave_chunks_fill_waves_at_long_prefix(void **state) {
    (void)state;
    struct sched_wave_part parts[32];
    int heads[32];
    for (int l = 0; l < 32; l++) heads[l] = 8;
    struct sched_cost c = llama8b_cost(parts, heads), flops = c;
    flops.waves.wave = 0;
    flops.min_chunk = 16;
    const int at = 131072;
    for (int k = 0; k < 2; k++) {
        c.step_budget = sched_chunk_cost(&c, 0, k ? 3584 : 2048);
        if (k) assert_true(ref_cost(&c, at, 512) <= c.step_budget && ref_cost(&c, at, 513) > c.step_budget);
        else assert_true(ref_cost(&c, at, 1) > c.step_budget);
        assert_int_equal(sched_chunk_size(&c, at, 2048, c.step_budget, true), 512);
        flops.step_budget = sched_chunk_cost(&flops, 0, k ? 3584 : 2048);
        int fl = sched_chunk_size(&flops, at, 2048, flops.step_budget, true);
        assert_true(fl > 16 && ref_span(8, fl) > fl);
    }
    for (int b = 2048; b <= 16384; b += 256) {
        c.step_budget = sched_chunk_cost(&c, 0, b);
        int n = sched_chunk_size(&c, at, 8192, c.step_budget, true);
        assert_true(n == 512 || (n > 512 && sched_chunk_cost(&c, at, n) <= c.step_budget));
        assert_true(last_wave_half_full(8, n));
    }
}

/* A query at position p under the FLOP model below: its linear layers, every earlier key at 3e-3,
 * at most 40 keys at 5e-3. */
static double flop_query(int p) { return 1 + 3e-3 * (p + 1) + 5e-3 * (p + 1 < 40 ? p + 1 : 40); }

/* Without the wave model the cost is the FLOP model's, query by query; with it, a decode keeps
 * the FLOP cost; the chunk size is the fit, or min_chunk for the step's first chunk. */
static void test_wave_none_is_flop_cost(void **state) {
    (void)state;
    struct sched_wave_part parts[2] = {{1e-3, 8}, {2e-3, 4}};
    struct sched_cost c = {.attn = {{3e-3, 0}, {5e-3, 40}}, .waves = {0, WAVE_TB, 2, parts}, .min_chunk = 16};
    for (int start = 0; start < 3000; start += 277)
        for (int n = 1; n < 700; n += 37) {
            double want = 0;
            for (int p = start; p < start + n; p++) want += flop_query(p);
            assert_float_equal(sched_chunk_cost(&c, start, n), want, want * 1e-9);
            assert_float_equal(sched_decode_cost(&c, start), flop_query(start), 1e-9);
        }
    assert_int_equal(sched_wave_chunk(&c.waves, 16), 16);
    for (int start = 0; start < 3000; start += 300)
        for (double cost = 1; cost < 5000; cost *= 1.9) {
            int fit = sched_chunk_fit(&c, start, 500, cost);
            assert_int_equal(sched_chunk_size(&c, start, 500, cost, false), fit);
            assert_int_equal(sched_chunk_size(&c, start, 500, cost, true), fit < 16 ? 16 : fit);
            assert_int_equal(sched_chunk_size(&c, start, 10, cost, true), 10); /* the least, cut to what is left */
        }
    c.waves.wave = WAVE;
    for (int pos = 0; pos < 200000; pos += 9999) assert_float_equal(sched_decode_cost(&c, pos), flop_query(pos), 1e-9);
}

/* The least chunk is one wave of the part with the most heads in whole KV blocks, at least one
 * block; a chunk the cost cuts short in the first half of a wave ends the wave before, unless
 * that is below the least chunk or the cost did not cut it. */
static void test_wave_least_chunk_and_back_off(void **state) {
    (void)state;
    struct sched_wave_part parts[3] = {{1e-5, 2}, {1e-5, 8}, {1e-5, 5}};
    struct sched_waves w = waves_of(parts, 3);
    assert_int_equal(sched_wave_chunk(&w, 16), WAVE / 8 * WAVE_TB);
    w.n_parts = 1;
    assert_int_equal(sched_wave_chunk(&w, 16), WAVE / 2 * WAVE_TB);
    parts[0].heads = 5; /* 26 blocks a head: 832 tokens, 816 in blocks of 48 */
    assert_int_equal(sched_wave_chunk(&w, 16), 832);
    assert_int_equal(sched_wave_chunk(&w, 48), 816);
    parts[0].heads = 0;
    assert_int_equal(sched_wave_chunk(&w, 16), 16);
    struct sched_waves tiny = {4, 8, 1, &parts[1]}; /* a wave holds half a block a head: 8 tokens */
    assert_int_equal(sched_wave_chunk(&tiny, 16), 16);
    parts[0].heads = 2;

    struct sched_cost c = {.attn = {{3e-5, 0}, {0, 0}}, .waves = waves_of(parts, 3)};
    c.min_chunk = sched_wave_chunk(&c.waves, 16);
    const int at = 32768;
    /* the least: the step's first chunk gets a wave however little is left (or what the prompt has) */
    assert_int_equal(sched_chunk_size(&c, at, 2048, 1.0, true), 512);
    assert_int_equal(sched_chunk_size(&c, at, 300, 1.0, true), 300);
    assert_int_equal(sched_chunk_size(&c, at, 2048, 1.0, false), 0);
    /* the cost cuts the chunk at n0 (it grows with every token); the 8-head part decides */
    int n0s[] = {600, 700, 800, 1056, 1100, 1600, 2000};
    for (size_t i = 0; i < sizeof n0s / sizeof *n0s; i++) {
        int n0 = n0s[i], blocks = (n0 + WAVE_TB - 1) / WAVE_TB * 8, full = blocks / WAVE, last = blocks % WAVE;
        int want = last && 2 * last < WAVE ? full * WAVE / 8 * WAVE_TB : n0;
        double cost = sched_chunk_cost(&c, at, n0);
        assert_int_equal(sched_chunk_fit(&c, at, 4096, cost), n0);
        assert_int_equal(sched_chunk_size(&c, at, 4096, cost, false), want);
        /* not cut by the cost: kept whole */
        assert_int_equal(sched_chunk_size(&c, at, n0, 1e12, false), n0);
    }
    assert_int_equal(sched_chunk_size(&c, at, 4096, sched_chunk_cost(&c, at, 600), false), 512);
    c.min_chunk = 1024; /* the wave before would be below the least chunk: kept */
    assert_int_equal(sched_chunk_size(&c, at, 4096, sched_chunk_cost(&c, at, 600), false), 600);
    assert_int_equal(sched_chunk_size(&c, at, 4096, sched_chunk_cost(&c, at, 1100), true), 1056);
}

/* Streaming heads by layer (DuoAttention): layers with 0, 2, 4, 6 or 8 retrieval heads; a layer
 * with none adds nothing, the streaming heads keep their window's cost, the least chunk is a wave
 * of the layer with the most, and chunks still fill their last wave at least half there. */
static void test_wave_streaming_heads_by_layer(void **state) {
    (void)state;
    struct sched_wave_part parts[32];
    int heads[32];
    for (int l = 0; l < 32; l++) heads[l] = 2 * (l % 5); /* 0, 2, 4, 6, 8, ... */
    struct sched_cost c = llama8b_cost(parts, heads);
    assert_int_equal(c.min_chunk, 512);
    const int starts[] = {0, 200, 5000, 131072}, lens[] = {1, 100, 512, 700, 1056, 2000};
    check_cost(&c, starts, 4, lens, 6, 2500);
    /* the layers without retrieval heads left out: the same cost */
    struct sched_wave_part some[32];
    struct sched_cost d = c;
    d.waves.n_parts = 0;
    for (int l = 0; l < 32; l++)
        if (heads[l]) some[d.waves.n_parts++] = parts[l];
    d.waves.parts = some;
    for (int n = 1; n < 3000; n += 97)
        assert_float_equal(sched_chunk_cost(&d, 70000, n), sched_chunk_cost(&c, 70000, n), 1e-9);
    /* half the heads streaming in every layer: a wave is 33 blocks a head */
    for (int l = 0; l < 32; l++) heads[l] = 4;
    c = llama8b_cost(parts, heads);
    assert_int_equal(c.min_chunk, WAVE / 4 * WAVE_TB);
    for (int l = 0; l < 32; l++) heads[l] = 2 * (l % 5);
    c = llama8b_cost(parts, heads);
    for (int b = 2048; b <= 8192; b += 512) {
        c.step_budget = sched_chunk_cost(&c, 0, b);
        for (int at = 16384; at <= 262144; at *= 2) {
            int n = sched_chunk_size(&c, at, 8192, c.step_budget, true);
            assert_true(n >= 512 && last_wave_half_full(8, n));
            assert_true(n == 512 || sched_chunk_cost(&c, at, n) <= c.step_budget);
        }
    }
}

/* A long prompt beside a decode under the wave model, in a cache of 4-token blocks: a wave is 3
 * blocks of 4 tokens for each of 4 heads (12 tokens); every chunk is at least one wave, within
 * the cost (the decode charged its FLOPs), and fills at least half of its last wave unless it
 * ends the prompt or takes the token budget. */
static void test_wave_chunks_beside_decode(void **state) {
    (void)state;
    struct sched_wave_part part = {0.02, 4};
    struct sched_cost cost = {.attn = {{0.02, 0}, {0, 0}}, .waves = {12, 4, 1, &part}};
    cost.min_chunk = sched_wave_chunk(&cost.waves, BS);
    assert_int_equal(cost.min_chunk, 12);
    cost.step_budget = sched_chunk_cost(&cost, 0, 32);
    struct fixture f;
    fx_init_cost(&f, 256, 0, 8, 64, &cost);
    struct sched_seq *d = seq_make(3), *l = seq_make(600);
    sched_add(&f.s, d);
    assert_int_equal(sched_step_plan(&f.s), 1);
    run_plan_decode(&f);
    sched_add(&f.s, l);
    int steps = 0, shrank = 0;
    while (l->n_computed < 600) {
        assert_int_equal(sched_step_plan(&f.s), 2);
        assert_int_equal(plan_want(&f, d), 1);
        int c = plan_want(&f, l), left = l->n_tokens - l->n_computed;
        assert_true(c >= (left < 12 ? left : 12) && c <= left && c <= 63);
        double dec = 1 + 0.02 * (d->n_computed + 1);
        assert_float_equal(plan_cost(&f), dec + sched_chunk_cost(&cost, l->n_computed, c), 1e-9);
        assert_true(plan_cost(&f) <= cost.step_budget || c == (left < 12 ? left : 12));
        if (c < left && c < 63) {
            int blocks = (c + 3) / 4 * 4, last = blocks % 12;
            assert_true(last == 0 || 2 * last >= 12);
        }
        shrank += c == 12;
        run_plan_decode(&f);
        assert_true(++steps < 1000);
    }
    assert_true(shrank > 10); /* at a long prefix one wave a step */
    seq_drop(&f, d);
    seq_drop(&f, l);
    fx_free(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fcfs_and_chunked_prefill),
        cmocka_unit_test(test_seats_and_queue_state),
        cmocka_unit_test(test_preemption_newest_first),
        cmocka_unit_test(test_fork_shares_and_copies_on_write),
        cmocka_unit_test(test_random_walk_keeps_counts_exact),
        cmocka_unit_test(test_random_walk_with_prefix_cache),
        cmocka_unit_test(test_chunk_cost_counts_visible_keys),
        cmocka_unit_test(test_cost_chunks_beside_decode),
        cmocka_unit_test(test_cost_alone_takes_token_budget),
        cmocka_unit_test(test_cost_progress_guaranteed),
        cmocka_unit_test(test_cost_mixed),
        cmocka_unit_test(test_wave_span_and_cost),
        cmocka_unit_test(test_wave_chunks_fill_waves_at_long_prefix),
        cmocka_unit_test(test_wave_none_is_flop_cost),
        cmocka_unit_test(test_wave_least_chunk_and_back_off),
        cmocka_unit_test(test_wave_streaming_heads_by_layer),
        cmocka_unit_test(test_wave_chunks_beside_decode),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
