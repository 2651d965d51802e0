#include "engine/sched.h"

#include <stdlib.h>
#include <string.h>

#include "engine/util.h"

/* Room for `need` entries. */
static int list_reserve(struct sched_list *l, int need) {
    if (need <= l->cap) return 0;
    int nc = l->cap ? l->cap : 16;
    while (nc < need) nc *= 2;
    struct sched_seq **nv = realloc(l->v, sizeof *nv * (size_t)nc);
    if (!nv) return -1;
    l->v = nv;
    l->cap = nc;
    return 0;
}

/* The lists always have room (see sched_add), so pushing never fails. */
static void list_push(struct sched_list *l, struct sched_seq *q) { l->v[l->n++] = q; }

static void list_push_front(struct sched_list *l, struct sched_seq *q) {
    memmove(l->v + 1, l->v, sizeof *l->v * (size_t)l->n);
    l->v[0] = q;
    l->n++;
}

static void list_remove(struct sched_list *l, struct sched_seq *q) {
    for (int i = 0; i < l->n; i++)
        if (l->v[i] == q) {
            memmove(l->v + i, l->v + i + 1, sizeof *l->v * (size_t)(l->n - i - 1));
            l->n--;
            return;
        }
}

int sched_init(struct sched *s, const struct sched_config *cfg, struct kv_cache *kv) {
    memset(s, 0, sizeof *s);
    s->cfg = *cfg;
    s->kv = kv;
    s->has_stream = kv_cache_has_stream(kv);
    int S = cfg->max_num_seqs;
    s->plan.seqs = malloc(sizeof *s->plan.seqs * (size_t)S);
    s->plan.want = malloc(sizeof *s->plan.want * (size_t)S);
    /* running never holds more than the seats; the waiting list is grown by sched_add */
    if (!s->plan.seqs || !s->plan.want || list_reserve(&s->running, S) || list_reserve(&s->waiting, S)) {
        sched_free(s);
        return -1;
    }
    return 0;
}

void sched_free(struct sched *s) {
    free(s->waiting.v);
    free(s->running.v);
    free(s->plan.seqs);
    free(s->plan.want);
    memset(s, 0, sizeof *s);
}

int sched_add(struct sched *s, struct sched_seq *q) {
    /* preemption moves running sequences (at most max_num_seqs) to the waiting list: room for them */
    if (list_reserve(&s->waiting, s->waiting.n + 1 + s->cfg.max_num_seqs)) return -1;
    list_push(&s->waiting, q);
    q->state = SCHED_WAITING;
    return 0;
}

/* Recompute preemption: q loses its KV and waits at the front of the queue. */
static void preempt(struct sched *s, struct sched_seq *q) {
    list_remove(&s->running, q);
    s->reserved -= q->forks_pending;
    kv_cache_seq_retire(s->kv, &q->kv, q->tokens, q->n_computed);
    q->n_computed = 0;
    q->state = SCHED_WAITING;
    list_push_front(&s->waiting, q);
    s->preemptions++;
}

static void plan_add(struct sched *s, struct sched_seq *q, int want) {
    s->plan.seqs[s->plan.n] = q;
    s->plan.want[s->plan.n++] = want;
    s->plan.n_tokens += want;
}

/* Keys seen by the queries at positions [start, start + n), summed, when a query sees at most w
 * keys (w = 0: every earlier key and itself). */
static double keys_seen(int start, int n, int w) {
    double a = start, c = n;
    if (w <= 0) return c * a + c * (c + 1) / 2;
    int n1 = w - start; /* queries at p < w see p + 1 keys, the others w */
    if (n1 < 0) n1 = 0;
    if (n1 > n) n1 = n;
    return (double)n1 * a + (double)n1 * (n1 + 1) / 2 + (double)(n - n1) * w;
}

/* The linear layers and attn[k] for k >= from. */
static double flop_cost(const struct sched_cost *c, int start, int n, int from) {
    double cost = n;
    for (int k = from; k < 2; k++)
        if (c->attn[k].per_key > 0) cost += c->attn[k].per_key * keys_seen(start, n, c->attn[k].window);
    return cost;
}

/* The attention blocks of n tokens in a part of `heads` heads (block_tokens tokens a block). */
static int64_t wave_blocks(const struct sched_waves *w, int heads, int n) {
    return (n + (int64_t)w->block_tokens - 1) / w->block_tokens * heads;
}

int sched_blocks_span(const struct sched_waves *w, int heads, int n) {
    if (w->wave <= 0 || heads <= 0 || n <= 0) return n;
    int64_t waves = (wave_blocks(w, heads, n) + w->wave - 1) / w->wave;
    return (int)(waves * w->wave / heads * w->block_tokens);
}

double sched_chunk_cost(const struct sched_cost *c, int start, int n) {
    const struct sched_waves *w = &c->waves;
    if (w->wave <= 0) return flop_cost(c, start, n, 0);
    double cost = flop_cost(c, start, n, 1);
    for (int i = 0; i < w->n_parts; i++) {
        const struct sched_wave_part *p = &w->parts[i];
        if (p->heads > 0 && p->per_key > 0)
            cost += p->per_key * keys_seen(start, sched_blocks_span(w, p->heads, n), c->attn[0].window);
    }
    return cost;
}

double sched_decode_cost(const struct sched_cost *c, int pos) { return flop_cost(c, pos, 1, 0); }

int sched_chunk_fit(const struct sched_cost *c, int start, int max_n, double cost) {
    if (max_n <= 0 || sched_chunk_cost(c, start, 1) > cost) return 0;
    if (sched_chunk_cost(c, start, max_n) <= cost) return max_n;
    int lo = 1, hi = max_n; /* the cost never falls as n grows: lo fits, hi does not */
    while (hi - lo > 1) {
        int mid = lo + (hi - lo) / 2;
        if (sched_chunk_cost(c, start, mid) <= cost) lo = mid;
        else hi = mid;
    }
    return lo;
}

/* The heads of the part that has the most. */
static int most_heads(const struct sched_waves *w) {
    int h = 0;
    for (int i = 0; i < w->n_parts; i++)
        if (w->parts[i].heads > h) h = w->parts[i].heads;
    return h;
}

int sched_wave_chunk(const struct sched_waves *w, int block_size) {
    int h = most_heads(w), one = w->wave > 0 && h > 0 ? sched_blocks_span(w, h, 1) / block_size * block_size : 0;
    return one > block_size ? one : block_size;
}

/* n tokens cut short by the cost, with the wave model: when they fill less than half of the last
 * wave they start in the part with the most heads, the tokens of the waves before (a wave costs
 * about as much nearly empty as full), unless those are fewer than min_chunk. */
static int wave_back_off(const struct sched_cost *c, int n) {
    const struct sched_waves *w = &c->waves;
    int h = most_heads(w);
    if (w->wave <= 0 || h == 0 || n <= 0) return n;
    int64_t blocks = wave_blocks(w, h, n), full = blocks / w->wave;
    int64_t last = blocks - full * w->wave; /* the last wave's blocks */
    if (last == 0 || 2 * last >= w->wave) return n;
    int64_t before = full * w->wave / h * w->block_tokens;
    return before > 0 && before >= c->min_chunk ? (int)before : n;
}

int sched_chunk_size(const struct sched_cost *c, int start, int max_n, double cost, bool first) {
    if (max_n <= 0) return 0;
    int n = sched_chunk_fit(c, start, max_n, cost);
    if (n < max_n) n = wave_back_off(c, n);
    int least = c->min_chunk > 0 ? c->min_chunk : 1;
    if (first && n < least) n = least < max_n ? least : max_n;
    return n;
}

/* A running sequence with one token to compute: a decode (or a prompt's last token). */
static bool is_decode(const struct sched_seq *q) { return q->n_tokens - q->n_computed == 1; }

/* What a step being planned has left. */
struct step_left {
    int tokens;        // of the token budget
    int decodes;       // decodes not planned yet: their tokens are kept for them
    double dec_cost;   // their cost
    double spent;      // cost of what is planned
    bool capped;       // sequences decode and the cost has a cap: chunks fit in it
    bool chunked;      // a prefill chunk is planned (the oldest had its minimum)
};

/* The tokens of a prefill chunk from start with `remaining` to compute: what the token budget
 * leaves after the decodes still to plan, and while sequences decode the chunk sched_chunk_size
 * gives in what is left of the step's cost (the first chunk of the step gets at least min_chunk:
 * progress). 0: none this step. */
static int chunk_tokens(const struct sched *s, const struct step_left *l, int start, int remaining) {
    int want = l->tokens - l->decodes;
    if (want > remaining) want = remaining;
    if (want <= 0) return 0;
    if (!l->capped) return want;
    const struct sched_cost *c = &s->cfg.cost;
    return sched_chunk_size(c, start, want, c->step_budget - l->spent - l->dec_cost, !l->chunked);
}

/* q, running and not planned, loses its KV: the step no longer keeps room for it. */
static void preempt_unplanned(struct sched *s, struct step_left *l, struct sched_seq *q) {
    if (is_decode(q)) {
        l->decodes--;
        l->dec_cost -= sched_decode_cost(&s->cfg.cost, q->n_computed);
    }
    preempt(s, q);
}

static void plan_take(struct sched *s, struct step_left *l, struct sched_seq *q, int want, bool decode) {
    plan_add(s, q, want);
    const struct sched_cost *c = &s->cfg.cost;
    double cost = decode ? sched_decode_cost(c, q->n_computed) : sched_chunk_cost(c, q->n_computed, want);
    l->tokens -= want;
    l->spent += cost;
    if (decode) {
        l->decodes--;
        l->dec_cost -= cost;
    } else {
        l->chunked = true;
    }
}

int sched_step_plan(struct sched *s) {
    struct sched_plan *p = &s->plan;
    p->n = p->n_tokens = 0;
    struct step_left l = {.tokens = s->cfg.max_batch_tokens};
    for (int i = 0; i < s->running.n; i++) {
        struct sched_seq *q = s->running.v[i];
        if (!is_decode(q)) continue;
        l.decodes++;
        l.dec_cost += sched_decode_cost(&s->cfg.cost, q->n_computed);
    }
    l.capped = l.decodes > 0 && s->cfg.cost.step_budget > 0;
    for (int i = 0; i < s->running.n && l.tokens > 0;) {
        struct sched_seq *q = s->running.v[i];
        bool decode = is_decode(q);
        int want = decode ? 1 : chunk_tokens(s, &l, q->n_computed, q->n_tokens - q->n_computed);
        if (want == 0) { /* its turn comes in a later step */
            i++;
            continue;
        }
        bool preempted_self = false;
        while (kv_cache_seq_ensure(s->kv, &q->kv, q->n_computed, q->n_computed + want) != KV_STATUS_OK) {
            struct sched_seq *victim = s->running.v[s->running.n - 1]; /* never a planned one: those are before i */
            preempt_unplanned(s, &l, victim);
            if (victim == q) {
                preempted_self = true;
                break;
            }
        }
        if (preempted_self) continue; /* running.v[i] is now the next sequence (or none) */
        plan_take(s, &l, q, want, decode);
        i++;
    }
    struct kv_cache_usage u;
    while (s->waiting.n && l.tokens > 0) {
        struct sched_seq *q = s->waiting.v[0];
        int seats = 1 + q->forks_pending;
        if (s->running.n + s->reserved + seats > s->cfg.max_num_seqs) break;
        kv_cache_usage(s->kv, &u);
        if (s->has_stream && u.n_free_slots - s->reserved < seats) break;
        int hit = 0;
        bool looked = q->n_computed == 0 && q->kv.n_blocks == 0 && q->kv.slot < 0;
        if (looked) {
            hit = q->n_computed = kv_cache_seq_match(s->kv, &q->kv, q->tokens, q->n_tokens);
            if (q->t_scheduled <= 0) q->n_cached = hit;
        }
        int want = chunk_tokens(s, &l, q->n_computed, q->n_tokens - q->n_computed);
        if (want == 0 ||
            kv_cache_seq_ensure(s->kv, &q->kv, q->n_computed, q->n_computed + want) != KV_STATUS_OK) {
            if (hit) { /* not now: the cached part waits in the cache, not in q */
                kv_cache_seq_retire(s->kv, &q->kv, q->tokens, q->n_computed);
                q->n_computed = 0;
            }
            break;
        }
        if (s->has_stream && q->kv.slot < 0) kv_cache_seq_slot(s->kv, &q->kv); /* checked free above */
        if (looked) kv_cache_prefix_count(s->kv, q->n_tokens, hit);
        if (q->t_scheduled <= 0) q->t_scheduled = util_now();
        list_remove(&s->waiting, q);
        q->state = SCHED_RUNNING;
        q->admit_order = s->next_admit++;
        s->reserved += q->forks_pending;
        list_push(&s->running, q);
        plan_take(s, &l, q, want, false);
    }
    return p->n;
}

void sched_step_done(struct sched *s) {
    for (int i = 0; i < s->plan.n; i++) {
        struct sched_seq *q = s->plan.seqs[i];
        q->n_computed += s->plan.want[i];
        kv_cache_seq_commit(s->kv, &q->kv, q->tokens, q->n_computed);
        if (q->n_computed == q->snapshot_at) kv_cache_seq_snapshot(s->kv, &q->kv, q->tokens, q->n_computed);
    }
}

void sched_step_failed(struct sched *s) {
    for (int i = 0; i < s->plan.n; i++) {
        struct sched_seq *q = s->plan.seqs[i];
        if (q->state != SCHED_RUNNING) continue;
        /* keeps the seat and the slot, drops the KV: a recompute if it ever runs again */
        int32_t slot = q->kv.slot;
        q->kv.slot = -1;
        kv_cache_seq_release(s->kv, &q->kv);
        q->kv.slot = slot;
        q->n_computed = 0;
    }
}

void sched_finish(struct sched *s, struct sched_seq *q) {
    if (q->state == SCHED_RUNNING) {
        list_remove(&s->running, q);
        s->reserved -= q->forks_pending;
    } else if (q->state == SCHED_WAITING) {
        list_remove(&s->waiting, q);
    }
    kv_cache_seq_retire(s->kv, &q->kv, q->tokens, q->n_computed);
    q->state = SCHED_DONE;
}

enum kv_status sched_fork(struct sched *s, struct sched_seq *parent, struct sched_seq *child) {
    enum kv_status st = kv_cache_seq_fork(s->kv, &child->kv, &parent->kv);
    if (st != KV_STATUS_OK) return st;
    list_push(&s->running, child); /* its seat was reserved */
    child->n_computed = parent->n_computed;
    child->t_scheduled = parent->t_scheduled;
    child->state = SCHED_RUNNING;
    child->admit_order = s->next_admit++;
    parent->forks_pending--;
    s->reserved--;
    return KV_STATUS_OK;
}

bool sched_has_work(const struct sched *s) { return s->running.n > 0 || s->waiting.n > 0; }
int sched_num_running(const struct sched *s) { return s->running.n; }
int sched_num_waiting(const struct sched *s) { return s->waiting.n; }

struct sched_seq *sched_any(const struct sched *s) {
    return s->running.n ? s->running.v[0] : s->waiting.n ? s->waiting.v[0] : NULL;
}

void sched_queue_state(const struct sched *s, int *unseated, int *seats_left) {
    int free = s->cfg.max_num_seqs - s->running.n - s->reserved, n = 0;
    for (int i = 0; i < s->waiting.n; i++) {
        int seats = 1 + s->waiting.v[i]->forks_pending;
        if (n == 0 && seats <= free) free -= seats;
        else n++;
    }
    *unseated = n;
    *seats_left = free > 0 ? free : 0;
}
