#include "engine/tp.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/util.h"

struct tp_worker {
    struct tp_group *g;
    int rank;
    pthread_t thread;
};

struct tp_group {
    int n;
    struct backend **b;  // [n] b[0] borrowed
    struct comm **comm;  // [n]
    struct tp_worker *w; // [n] (w[0] unused: rank 0 is the caller)
    int n_started;       // worker threads running (ranks 1..n_started)
    pthread_mutex_t mu;
    pthread_cond_t cv_job, cv_done;
    unsigned long gen; // job number
    int pending;       // workers still running the current job
    bool stop;
    int (*fn)(void *arg, int rank);
    void *arg;
    int *rc; // [n] each rank's result of the current job
    int fault_step, fault_calls;
};

int tp_check(const struct model_config *c, int n, char *err, size_t errlen) {
    if (n <= 1) return 0;
    const char *what = c->n_heads % n ? "num_attention_heads" : c->n_kv_heads % n ? "num_key_value_heads"
                       : c->hidden_dim % n                    ? "intermediate_size" : NULL;
    int v = c->n_heads % n ? c->n_heads : c->n_kv_heads % n ? c->n_kv_heads : c->hidden_dim;
    if (!what) return 0;
    return util_err(err, errlen,
                    "--tensor-parallel-size %d does not divide the model's %s (%d): each GPU must hold an equal share "
                    "of the heads and MLP columns",
                    n, what, v);
}

int tp_assign_heads(int n_layers, int n_kv, int n, const uint8_t *streaming, int *heads, int *n_full) {
    int kvr = n_kv / n;
    int *total = calloc((size_t)n, sizeof *total), *cnt = calloc((size_t)n, sizeof *cnt);
    int *ret = malloc(sizeof *ret * (size_t)n_kv), *str = malloc(sizeof *str * (size_t)n_kv);
    if (!total || !cnt || !ret || !str) {
        free(total), free(cnt), free(ret), free(str);
        return -1;
    }
    for (int l = 0; l < n_layers; l++) {
        int nr = 0, ns = 0;
        for (int h = 0; h < n_kv; h++) {
            if (streaming && streaming[l * n_kv + h]) str[ns++] = h;
            else ret[nr++] = h;
        }
        for (int r = 0; r < n; r++) cnt[r] = nr / n;
        for (int extra = nr % n; extra > 0; extra--) { /* one more to the rank with the fewest so far */
            int best = -1;
            for (int r = 0; r < n; r++)
                if (cnt[r] == nr / n && (best < 0 || total[r] < total[best])) best = r;
            cnt[best]++;
        }
        int ri = 0, si = 0;
        for (int r = 0; r < n; r++) {
            int *out = heads + ((size_t)l * n + r) * kvr;
            for (int j = 0; j < kvr; j++) out[j] = j < cnt[r] ? ret[ri++] : str[si++];
            total[r] += cnt[r];
            if (n_full) n_full[l * n + r] = cnt[r];
        }
    }
    free(total), free(cnt), free(ret), free(str);
    return 0;
}

static void *worker_main(void *p) {
    struct tp_worker *w = p;
    struct tp_group *g = w->g;
    unsigned long seen = 0;
    pthread_mutex_lock(&g->mu);
    for (;;) {
        while (!g->stop && g->gen == seen) pthread_cond_wait(&g->cv_job, &g->mu);
        if (g->stop) break;
        seen = g->gen;
        int (*fn)(void *, int) = g->fn;
        void *arg = g->arg;
        pthread_mutex_unlock(&g->mu);
        int rc = fn(arg, w->rank);
        pthread_mutex_lock(&g->mu);
        g->rc[w->rank] = rc;
        if (--g->pending == 0) pthread_cond_signal(&g->cv_done);
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

int tp_run(struct tp_group *g, int (*fn)(void *arg, int rank), void *arg) {
    pthread_mutex_lock(&g->mu);
    g->fn = fn;
    g->arg = arg;
    g->pending = g->n - 1;
    g->gen++;
    pthread_cond_broadcast(&g->cv_job);
    pthread_mutex_unlock(&g->mu);
    g->rc[0] = fn(arg, 0);
    pthread_mutex_lock(&g->mu);
    while (g->pending > 0) pthread_cond_wait(&g->cv_done, &g->mu);
    int rc = 0;
    for (int r = 0; r < g->n && !rc; r++) rc = g->rc[r];
    pthread_mutex_unlock(&g->mu);
    return rc;
}

bool tp_fault(struct tp_group *g, int rank) {
    return g->fault_step > 0 && rank == g->n - 1 && ++g->fault_calls == g->fault_step;
}

int tp_size(const struct tp_group *g) { return g->n; }
struct backend *tp_backend(const struct tp_group *g, int rank) { return g->b[rank]; }
struct comm *tp_comm(const struct tp_group *g, int rank) { return g->comm[rank]; }

/* Ranks 1..n-1's backends, like b0: the CPU reference, or GPU r. */
static int make_backends(struct tp_group *g, int cuda_flags, char *err, size_t errlen) {
    bool cpu = !strcmp(g->b[0]->name, "cpu");
    if (!cpu) {
        int have = backend_cuda_device_count();
        if (have < g->n)
            return util_err(err, errlen,
                            "--tensor-parallel-size %d needs %d GPUs, and %d %s visible (CUDA_VISIBLE_DEVICES selects "
                            "them)", g->n, g->n, have, have == 1 ? "is" : "are");
    }
    for (int r = 1; r < g->n; r++) {
        char why[300] = "";
        g->b[r] = cpu ? backend_cpu_create() : backend_cuda_create(r, cuda_flags, why, sizeof why);
        if (!g->b[r]) return util_err(err, errlen, "tensor parallelism, rank %d: %s", r, cpu ? "out of memory" : why);
    }
    if (cpu) return comm_threads_create(g->comm, g->n) ? util_err(err, errlen, "out of memory") : 0;
    return comm_nccl_create(g->comm, g->b, g->n, err, errlen);
}

int tp_group_create(struct tp_group **out, struct backend *b0, int n, int cuda_flags, char *err, size_t errlen) {
    *out = NULL;
    struct tp_group *g = calloc(1, sizeof *g);
    if (!g) return util_err(err, errlen, "out of memory");
    g->n = n;
    g->b = calloc((size_t)n, sizeof *g->b);
    g->comm = calloc((size_t)n, sizeof *g->comm);
    g->w = calloc((size_t)n, sizeof *g->w);
    g->rc = calloc((size_t)n, sizeof *g->rc);
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv_job, NULL);
    pthread_cond_init(&g->cv_done, NULL);
    const char *fs = getenv("DUOSERVE_TP_FAULT_STEP");
    g->fault_step = fs ? atoi(fs) : 0;
    if (!g->b || !g->comm || !g->w || !g->rc) {
        tp_group_free(g);
        return util_err(err, errlen, "out of memory");
    }
    g->b[0] = b0;
    if (make_backends(g, cuda_flags, err, errlen) != 0) {
        tp_group_free(g);
        return -1;
    }
    for (int r = 1; r < n; r++) {
        g->w[r] = (struct tp_worker){g, r, 0};
        if (pthread_create(&g->w[r].thread, NULL, worker_main, &g->w[r]) != 0) {
            tp_group_free(g);
            return util_err(err, errlen, "cannot start the thread of tensor-parallel rank %d", r);
        }
        g->n_started = r;
    }
    *out = g;
    return 0;
}

void tp_group_free(struct tp_group *g) {
    if (!g) return;
    pthread_mutex_lock(&g->mu);
    g->stop = true;
    pthread_cond_broadcast(&g->cv_job);
    pthread_mutex_unlock(&g->mu);
    for (int r = 1; r <= g->n_started; r++) pthread_join(g->w[r].thread, NULL);
    for (int r = 0; g->comm && r < g->n; r++) comm_destroy(g->comm[r]);
    for (int r = 1; g->b && r < g->n; r++) backend_destroy(g->b[r]);
    pthread_cond_destroy(&g->cv_job);
    pthread_cond_destroy(&g->cv_done);
    pthread_mutex_destroy(&g->mu);
    free(g->b);
    free(g->comm);
    free(g->w);
    free(g->rc);
    free(g);
}
