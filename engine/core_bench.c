/* core_bench: benchmark-only hooks into the engine core (engine/core_bench.h). */
#include "engine/core_bench.h"

#include <stdlib.h>
#include <string.h>

#include "engine/core_impl.h"

/* A running sequence that decodes: every token computed but the last (sampled, not yet run). */
static bool decoding(const struct sched_seq *q) { return q->state == SCHED_RUNNING && q->n_tokens == q->n_computed + 1; }

int core_bench_skip_context(struct core *c, int n, char *err, size_t errlen) {
    if (n < 0) return util_err(err, errlen, "cannot skip %d positions", n);
    if (kv_cache_prefix_caching(c->kv))
        return util_err(err, errlen, "skipping context needs prefix caching off (--no-enable-prefix-caching)");
    const struct sched_list *run = &c->sched.running;
    /* the blocks first, for every sequence or none: new blocks, and one each for a copy on write
     * of its last block should another choice share it */
    int bs = kv_cache_block_size(c->kv), need = 0;
    for (int i = 0; i < run->n; i++) {
        const struct sched_seq *q = run->v[i];
        if (!decoding(q)) continue;
        int have = q->kv.n_blocks, want = (q->n_computed + n + bs - 1) / bs;
        need += (want > have ? want - have : 0) + 1;
    }
    struct kv_cache_usage u;
    kv_cache_usage(c->kv, &u);
    if (kv_cache_has_full(c->kv) && need > u.n_free_blocks)
        return util_err(err, errlen, "the full pool has %d free blocks, skipping %d positions needs %d",
                        u.n_free_blocks, n, need);
    /* room for each sequence's tokens: those it has, the skipped ones, what it may still generate */
    for (int i = 0; i < run->n; i++) {
        struct core_seq *s = (struct core_seq *)run->v[i]; /* sq is a core_seq's first member */
        if (!decoding(&s->sq)) continue;
        int left = s->req->sp->max_tokens - s->n_generated, cap = s->sq.n_tokens + n + (left > 0 ? left : 0) + 1;
        if (cap <= s->cap) continue;
        int32_t *t = realloc(s->tokens, sizeof(int32_t) * (size_t)cap);
        if (!t) return util_err(err, errlen, "out of memory");
        s->tokens = t;
        s->sq.tokens = t;
        s->cap = cap;
    }
    int done = 0;
    for (int i = 0; i < run->n; i++) {
        struct core_seq *s = (struct core_seq *)run->v[i];
        struct sched_seq *q = &s->sq;
        if (!decoding(q)) continue;
        if (kv_cache_seq_ensure(c->kv, &q->kv, q->n_computed, q->n_computed + n) != KV_STATUS_OK)
            return util_err(err, errlen, "the KV cache refused %d more positions", n); /* counted above: not reached */
        int32_t last = s->tokens[q->n_computed], fill = q->n_computed > 0 ? s->tokens[q->n_computed - 1] : last;
        for (int k = 0; k < n; k++) s->tokens[q->n_computed + k] = fill;
        s->tokens[q->n_computed + n] = last;
        q->n_computed += n;
        q->n_tokens += n;
        int left = s->req->sp->max_tokens - s->n_generated;
        if (q->n_tokens + left > c->max_model_len) c->max_model_len = q->n_tokens + left;
        done++;
    }
    return done;
}
