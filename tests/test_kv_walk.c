/* A random walk over the scheduler and the prefix cache with a content oracle. Each
 * "step" writes, for every planned position p of a sequence, a value that names the token prefix
 * tokens[0..p] into its full block row and its streaming slot row (where the model would); after
 * every operation each running sequence must see, for every position it has computed, the value of
 * its own prefix (full rows, sink rows and the ring's last `recent`). Internal checks of the prefix
 * cache's idle list and hash table as well. kv_cache.c is compiled into this file for those. */
#include "tests/test_common.h"

#include "engine/kv_cache.c"
#include "engine/backend.h"
#include "engine/sched.h"
#include "engine/util.h"

static int BS = 4, SINK = 2, RECENT = 4, HD = 8;

struct fixture {
    struct backend *b;
    struct kv_cache *kv;
    struct sched s;
};

#define N 24
#define MAXT 96
struct wseq {
    struct sched_seq q; /* first */
    int32_t tokens[MAXT];
    int n_total; /* its end: finished when n_tokens reaches it */
};

static uint32_t prefix_val(const int32_t *t, int p) {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i <= p; i++) h = (h ^ (uint32_t)t[i]) * 1099511628211ull;
    h ^= (uint64_t)p << 40;
    return (uint32_t)(h ^ (h >> 32)) | 1u; /* never 0 (fresh memory) */
}

static uint32_t *full_row(struct kv_cache *kv, int32_t block, int off) {
    return (uint32_t *)kv->shards[0].k_full[0] + ((size_t)block * BS + off) * HD;
}
static uint32_t *slot_row(struct kv_cache *kv, int32_t slot, int p) {
    int r = p < SINK ? p : SINK + (p - SINK) % RECENT;
    return (uint32_t *)kv->shards[0].k_stream[0] + ((size_t)slot * (SINK + RECENT) + r) * HD;
}

static void write_step(struct fixture *f, bool garbage) {
    for (int i = 0; i < f->s.plan.n; i++) {
        struct sched_seq *q = f->s.plan.seqs[i];
        for (int k = 0; k < f->s.plan.want[i]; k++) {
            int p = q->n_computed + k;
            uint32_t v = garbage ? 0xdeadbeefu : prefix_val(q->tokens, p);
            if (f->kv->has_full) {
                assert_true(p / BS < q->kv.n_blocks);
                int32_t b = q->kv.blocks[p / BS];
                /* the writer must be the only holder of the block it writes into */
                assert_int_equal(f->kv->ref[b], 1);
                *full_row(f->kv, b, p % BS) = v;
            }
            if (f->kv->has_stream) {
                assert_true(q->kv.slot >= 0);
                *slot_row(f->kv, q->kv.slot, p) = v;
            }
        }
    }
}

static void check_content(struct fixture *f, struct wseq **w) {
    for (int i = 0; i < N; i++) {
        if (!w[i] || w[i]->q.state != SCHED_RUNNING) continue;
        struct sched_seq *q = &w[i]->q;
        int nc = q->n_computed;
        for (int p = 0; p < nc; p++) {
            uint32_t want = prefix_val(q->tokens, p);
            if (f->kv->has_full) {
                uint32_t got = *full_row(f->kv, q->kv.blocks[p / BS], p % BS);
                if (got != want) fail_msg("seq %d position %d (of %d computed): full row %08x, wants %08x", i, p, nc, got, want);
            }
            if (f->kv->has_stream && (p < SINK || nc - 1 - p < RECENT)) {
                uint32_t got = *slot_row(f->kv, q->kv.slot, p);
                if (got != want) fail_msg("seq %d position %d (of %d computed): slot row %08x, wants %08x", i, p, nc, got, want);
            }
        }
    }
}

static void check_internals(struct fixture *f, struct wseq **w) {
    struct kv_cache *kv = f->kv;
    int *holders = calloc((size_t)kv->n_blocks, sizeof *holders);
    int *slot_holders = calloc((size_t)kv->n_slots + 1, sizeof *slot_holders);
    kv_cache_snapshot_holders(kv, holders, slot_holders);
    for (int i = 0; i < N; i++) {
        if (!w[i]) continue;
        struct sched_seq *q = &w[i]->q;
        for (int k = 0; k < q->kv.n_blocks; k++) holders[q->kv.blocks[k]]++;
        if (q->kv.slot >= 0) slot_holders[q->kv.slot]++;
        if (q->state != SCHED_RUNNING) assert_true(q->kv.n_blocks == 0 && q->kv.slot < 0);
    }
    for (int b = 0; b < kv->n_blocks; b++) assert_int_equal(kv->ref[b], holders[b]);
    for (int sl = 0; sl < kv->n_slots; sl++) assert_int_equal(kv->slot_used[sl], slot_holders[sl]);
    struct kv_prefix *pc = kv->pc;
    if (pc) {
        /* idle list: exactly the registered blocks nobody holds, each once, linked both ways */
        int n = 0;
        int32_t prev = -1;
        char *on = calloc((size_t)kv->n_blocks, 1);
        for (int32_t id = pc->head; id >= 0; id = pc->next[id]) {
            assert_true(!on[id]);
            on[id] = 1;
            assert_int_equal(pc->prev[id], prev);
            prev = id;
            n++;
            assert_true(n <= kv->n_blocks);
        }
        assert_int_equal(pc->tail, prev);
        assert_int_equal(n, pc->n_idle);
        int n_reg = 0;
        for (int b = 0; b < kv->n_blocks; b++) {
            n_reg += pc->reg[b];
            assert_int_equal(on[b], pc->reg[b] && kv->ref[b] == 0);
            if (pc->reg[b]) { /* findable in its bucket */
                int found = 0;
                for (int32_t id = pc->bucket[pc->hash[b] & (uint64_t)(pc->n_buckets - 1)]; id >= 0; id = pc->chain[id])
                    found += id == b;
                assert_int_equal(found, 1);
            }
        }
        assert_int_equal(n_reg, pc->n_reg);
        for (int bk = 0; bk < pc->n_buckets; bk++)
            for (int32_t id = pc->bucket[bk]; id >= 0; id = pc->chain[id]) assert_true(pc->reg[id]);
        /* a registered block's content: its positions are those of its tokens' chain */
        free(on);
    }
    free(holders);
    free(slot_holders);
}

static struct wseq *wseq_new(void) {
    struct wseq *s = calloc(1, sizeof *s);
    kv_seq_init(&s->q.kv);
    s->q.tokens = s->tokens;
    return s;
}

static void wdrop(struct fixture *f, struct wseq *s) {
    sched_finish(&f->s, &s->q);
    kv_seq_free(&s->q.kv);
    free(s);
}

static uint64_t walk(uint64_t seed, int n_blocks, int n_slots, int max_seqs, int budget, bool with_full, int ops) {
    struct fixture f;
    f.b = backend_cpu_create();
    int n_full = with_full, n_stream = n_slots > 0;
    struct kv_geometry g = {.n_layers = 1, .head_dim = HD, .block_size = BS, .n_full = &n_full, .n_stream = &n_stream,
                            .sink = SINK, .recent = RECENT};
    f.kv = kv_cache_new();
    assert_int_equal(kv_cache_init(f.kv, f.b, &g, n_blocks, n_slots), KV_STATUS_OK);
    if (!getenv("NOCACHE")) assert_int_equal(kv_cache_enable_prefix_caching(f.kv, 99), 0);
    struct sched_config sc = {.max_num_seqs = max_seqs, .max_batch_tokens = budget};
    assert_int_equal(sched_init(&f.s, &sc, f.kv), 0);
    struct wseq *w[N] = {0};
    int32_t hist[8][MAXT]; /* earlier sequences' tokens, for chat-like prompts */
    int n_hist = 0;
    struct util_rng rng;
    util_rng_seed(&rng, seed);
#define R(n) ((int)(util_rng_next(&rng) % (uint64_t)(n)))
    int cap = with_full ? n_blocks * BS : MAXT;
    if (cap > MAXT) cap = MAXT;
    for (int op = 0; op < ops; op++) {
        int i = R(N), what = R(12);
        if (!w[i]) {
            if (what < 4) continue;
            struct wseq *s = w[i] = wseq_new();
            int total = 2 + R(cap - 1); /* prompt + generated fits the pool */
            int prompt = 1 + R(total - 1);
            if (n_hist && R(2)) { /* an earlier sequence's beginning, then new tokens */
                int h = R(n_hist), keep = 1 + R(prompt);
                memcpy(s->tokens, hist[h], sizeof(int32_t) * (size_t)keep);
                for (int k = keep; k < MAXT; k++) s->tokens[k] = 1 + R(3);
            } else {
                int fam = R(3);
                for (int k = 0; k < MAXT; k++) s->tokens[k] = k < 6 ? 100 + fam : 1 + R(3);
            }
            s->q.n_tokens = prompt;
            s->q.snapshot_at = prompt;
            s->n_total = total;
            if (what == 11 && max_seqs > 1) s->q.forks_pending = 1;
            assert_int_equal(sched_add(&f.s, &s->q), 0);
        } else if (what < 6) {
            sched_step_plan(&f.s);
            bool fail = R(40) == 0;
            write_step(&f, fail);
            if (fail) {
                sched_step_failed(&f.s);
                for (int k = 0; k < f.s.plan.n; k++) /* the batch's requests end */
                    for (int j = 0; j < N; j++)
                        if (w[j] && &w[j]->q == f.s.plan.seqs[k]) {
                            wdrop(&f, w[j]);
                            w[j] = NULL;
                        }
                f.s.plan.n = 0;
            } else {
                sched_step_done(&f.s);
            }
            for (int j = 0; j < N; j++) {
                struct wseq *s = w[j];
                if (!s || s->q.state != SCHED_RUNNING || s->q.n_computed != s->q.n_tokens) continue;
                for (int k = 0; k < N && s->q.forks_pending; k++)
                    if (!w[k]) {
                        struct wseq *c = w[k] = wseq_new();
                        memcpy(c->tokens, s->tokens, sizeof c->tokens);
                        for (int t = s->q.n_tokens; t < MAXT; t++) c->tokens[t] = 1 + R(3); /* its own answer */
                        c->q.n_tokens = s->q.n_tokens;
                        c->q.snapshot_at = s->q.n_tokens;
                        c->n_total = s->n_total;
                        assert_int_equal(sched_fork(&f.s, &s->q, &c->q), KV_STATUS_OK);
                    }
                if (s->q.forks_pending) continue;
                if (s->q.n_tokens < s->n_total) s->q.n_tokens++; /* the sampled token */
                if (s->q.n_tokens == s->n_total) { /* finished */
                    memcpy(hist[n_hist < 8 ? n_hist++ : R(8)], s->tokens, sizeof s->tokens);
                    wdrop(&f, s);
                    w[j] = NULL;
                }
            }
        } else if (what < 8 && w[i]->q.forks_pending == 0) {
            if (w[i]->q.n_tokens > 1) memcpy(hist[n_hist < 8 ? n_hist++ : R(8)], w[i]->tokens, sizeof w[i]->tokens);
            wdrop(&f, w[i]); /* cancel */
            w[i] = NULL;
        }
        check_internals(&f, w);
        check_content(&f, w);
    }
    /* drain: no arrivals, no cancellations; everything must finish */
    for (int guard = 0;; guard++) {
        int live = 0;
        for (int j = 0; j < N; j++) live += w[j] != NULL;
        if (!live) break;
        if (guard > 2000) fail_msg("seed %llu: %d sequences never finish (livelock)", (unsigned long long)seed, live);
        sched_step_plan(&f.s);
        write_step(&f, false);
        sched_step_done(&f.s);
        for (int j = 0; j < N; j++) {
            struct wseq *s = w[j];
            if (!s || s->q.state != SCHED_RUNNING || s->q.n_computed != s->q.n_tokens) continue;
            for (int k = 0; k < N && s->q.forks_pending; k++)
                if (!w[k]) {
                    struct wseq *c = w[k] = wseq_new();
                    memcpy(c->tokens, s->tokens, sizeof c->tokens);
                    c->q.n_tokens = s->q.n_tokens;
                    c->q.snapshot_at = s->q.n_tokens;
                    c->n_total = s->n_total;
                    assert_int_equal(sched_fork(&f.s, &s->q, &c->q), KV_STATUS_OK);
                }
            if (s->q.forks_pending) continue;
            if (s->q.n_tokens < s->n_total) s->q.n_tokens++;
            if (s->q.n_tokens == s->n_total) {
                wdrop(&f, s);
                w[j] = NULL;
            }
        }
        check_internals(&f, w);
        check_content(&f, w);
    }
    struct kv_prefix_stats ps;
    kv_cache_prefix_stats(f.kv, &ps);
    sched_free(&f.s);
    kv_cache_delete(f.kv);
    backend_destroy(f.b);
    return ps.hits;
}

static void test_walks(void **state) {
    (void)state;
    int bss[] = {1, 2, 4, 8}, sinks[] = {0, 1, 2, 5}, recents[] = {1, 3, 4, 9};
    uint64_t h2 = 0;
    for (int seed = 1; seed <= 400; seed++) {
        BS = bss[seed % 4]; SINK = sinks[(seed / 4) % 4]; RECENT = recents[(seed / 16) % 4];
        int nb = 3 + seed % 17;
        h2 += walk((uint64_t)seed * 7919, nb, 1 + seed % 6 + seed % 3, 1 + seed % 6, 1 + seed % 13, true, 4000);
        h2 += walk((uint64_t)seed * 7919 + 1, nb, 0, 1 + seed % 6, 1 + seed % 13, true, 4000);
    }
    print_message("param hits %llu\n", (unsigned long long)h2);
    BS = 4; SINK = 2; RECENT = 4;
    int n = getenv("WALKS") ? atoi(getenv("WALKS")) : 40;
    uint64_t hits = 0;
    for (int seed = 1; seed <= n; seed++) {
        hits += walk((uint64_t)seed, 12, 6, 6, 9, true, 3000);   /* both pools */
        hits += walk((uint64_t)seed + 1000, 16, 0, 6, 7, true, 3000); /* no streaming heads */
        hits += walk((uint64_t)seed + 2000, 24, 8, 4, 100, true, 3000); /* big budget */
    }
    print_message("hits %llu\n", (unsigned long long)hits);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_walks)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
