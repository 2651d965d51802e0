/* comm: the thread implementation of the collectives (engine/comm.h). */
#include "engine/comm.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/util.h"

/* The state the ranks of one group share. A collective is two barriers: after the first every
 * rank's buffer is posted; between them rank r works on its own share (the r-th slice of a
 * sum, or its own gathered copy); after the second every rank's result is in place, so no rank
 * returns (and reuses its buffer) while a peer still reads it. */
struct comm_group {
    int n;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived;
    unsigned long gen;
    bool aborted;
    void **buf;       // [n] each rank's posted buffer
    const void **src; // [n] each rank's posted source (all_gather)
    int refs;         // communicators alive
};

static int barrier(struct comm_group *g) {
    pthread_mutex_lock(&g->mu);
    int rc = COMM_OK;
    if (g->aborted) {
        rc = COMM_ERR_ABORTED;
    } else if (++g->arrived == g->n) {
        g->arrived = 0;
        g->gen++;
        pthread_cond_broadcast(&g->cv);
    } else {
        unsigned long gen = g->gen;
        while (g->gen == gen && !g->aborted) pthread_cond_wait(&g->cv, &g->mu);
        if (g->gen == gen) rc = COMM_ERR_ABORTED;
    }
    pthread_mutex_unlock(&g->mu);
    return rc;
}

/* Elements [lo, hi) of the sum: each element added in rank order, the result written to every
 * rank's buffer (no other rank touches these elements in this collective). */
static void reduce_slice(struct comm_group *g, size_t lo, size_t hi, enum comm_dtype dt) {
    if (dt == COMM_F32) {
        for (size_t i = lo; i < hi; i++) {
            float s = ((const float *)g->buf[0])[i];
            for (int r = 1; r < g->n; r++) s += ((const float *)g->buf[r])[i];
            for (int r = 0; r < g->n; r++) ((float *)g->buf[r])[i] = s;
        }
        return;
    }
    for (size_t i = lo; i < hi; i++) { /* bf16: summed in f32, rounded once */
        float s = util_bf16_to_f32(((const uint16_t *)g->buf[0])[i]);
        for (int r = 1; r < g->n; r++) s += util_bf16_to_f32(((const uint16_t *)g->buf[r])[i]);
        uint16_t h = util_f32_to_bf16(s);
        for (int r = 0; r < g->n; r++) ((uint16_t *)g->buf[r])[i] = h;
    }
}

static int th_all_reduce(struct comm *c, void *buf, size_t n, enum comm_dtype dt) {
    struct comm_group *g = c->ctx;
    g->buf[c->rank] = buf;
    int rc = barrier(g);
    if (rc) return rc;
    size_t per = (n + (size_t)g->n - 1) / (size_t)g->n, lo = per * (size_t)c->rank;
    if (lo < n) reduce_slice(g, lo, lo + per < n ? lo + per : n, dt);
    return barrier(g);
}

static int th_all_gather(struct comm *c, void *dst, const void *src, size_t n, enum comm_dtype dt) {
    struct comm_group *g = c->ctx;
    size_t bytes = n * (dt == COMM_F32 ? 4 : 2);
    g->src[c->rank] = src;
    int rc = barrier(g);
    if (rc) return rc;
    for (int r = 0; r < g->n; r++) memcpy((char *)dst + (size_t)r * bytes, g->src[r], bytes);
    return barrier(g);
}

static void th_abort(struct comm *c) {
    struct comm_group *g = c->ctx;
    pthread_mutex_lock(&g->mu);
    g->aborted = true;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static bool th_aborted(struct comm *c) {
    struct comm_group *g = c->ctx;
    pthread_mutex_lock(&g->mu);
    bool a = g->aborted;
    pthread_mutex_unlock(&g->mu);
    return a;
}

static void th_destroy(struct comm *c) {
    struct comm_group *g = c->ctx;
    pthread_mutex_lock(&g->mu);
    bool last = --g->refs == 0;
    pthread_mutex_unlock(&g->mu);
    if (last) {
        pthread_cond_destroy(&g->cv);
        pthread_mutex_destroy(&g->mu);
        free(g->buf);
        free(g->src);
        free(g);
    }
    free(c);
}

static const struct comm_ops threads_ops = {
    .all_reduce_sum = th_all_reduce,
    .all_gather = th_all_gather,
    .abort = th_abort,
    .aborted = th_aborted,
    .destroy = th_destroy,
};

int comm_threads_create(struct comm **out, int n) {
    struct comm_group *g = calloc(1, sizeof *g);
    if (!g) return COMM_ERR_OOM;
    g->n = n;
    g->buf = calloc((size_t)n, sizeof *g->buf);
    g->src = calloc((size_t)n, sizeof *g->src);
    if (!g->buf || !g->src) {
        free(g->buf);
        free(g->src);
        free(g);
        return COMM_ERR_OOM;
    }
    bool ok = true;
    for (int r = 0; r < n; r++) ok = (out[r] = ok ? malloc(sizeof **out) : NULL) != NULL;
    if (!ok) {
        for (int r = 0; r < n; r++) free(out[r]), out[r] = NULL;
        free(g->buf);
        free(g->src);
        free(g);
        return COMM_ERR_OOM;
    }
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->refs = n;
    for (int r = 0; r < n; r++) *out[r] = (struct comm){&threads_ops, r, n, g};
    return COMM_OK;
}

void comm_destroy(struct comm *c) {
    if (c) c->ops->destroy(c);
}
