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

int sched_step_plan(struct sched *s) {
    struct sched_plan *p = &s->plan;
    p->n = p->n_tokens = 0;
    int budget = s->cfg.max_batch_tokens;
    for (int i = 0; i < s->running.n && budget > 0;) {
        struct sched_seq *q = s->running.v[i];
        int want = q->n_tokens - q->n_computed;
        if (want > budget) want = budget;
        bool preempted_self = false;
        while (kv_cache_seq_ensure(s->kv, &q->kv, q->n_computed, q->n_computed + want) != KV_STATUS_OK) {
            struct sched_seq *victim = s->running.v[s->running.n - 1];
            preempt(s, victim);
            if (victim == q) {
                preempted_self = true;
                break;
            }
        }
        if (preempted_self) continue; /* running.v[i] is now the next sequence (or none) */
        plan_add(s, q, want);
        budget -= want;
        i++;
    }
    struct kv_cache_usage u;
    while (s->waiting.n && budget > 0) {
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
        int want = q->n_tokens - q->n_computed;
        if (want > budget) want = budget;
        if (kv_cache_seq_ensure(s->kv, &q->kv, q->n_computed, q->n_computed + want) != KV_STATUS_OK) {
            if (hit) { /* no room for the rest: the cached part waits in the cache, not in q */
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
        plan_add(s, q, want);
        budget -= want;
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
