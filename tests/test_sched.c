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

/* The cost of the planned step, summed over its sequences. */
static double plan_cost(const struct fixture *f) {
    double c = 0;
    for (int i = 0; i < f->s.plan.n; i++)
        c += sched_chunk_cost(&f->s.cfg.cost, f->s.plan.seqs[i]->n_computed, f->s.plan.want[i]);
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
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
