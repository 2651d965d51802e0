/* model_tp: the model the engine holds, over its ranks (engine/tp.h; rank 0 alone without tensor
 * parallelism): the public load, free and forward entries, loading every rank's shard at once, a
 * step on every rank at once, and the KV pools and their memory plan per rank. Rank 0's struct
 * model owns the others. One rank's loading and step are engine/model.c's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/elog.h"
#include "engine/model_impl.h"
#include "engine/tp.h"
#include "engine/util.h"

struct model_tp {
    struct tp_group *g;
    struct model **ranks; // [n]; ranks[0] is the model that owns this
};

/* Memory a device keeps free for what the KV plan does not count: logits, workspaces. */
#define KV_RESERVE_BYTES ((double)(512u << 20))
/* ... and under tensor parallelism the gathered logits of up to this many rows (f32, twice:
 * the rank's part and every rank's) */
#define TP_LOGIT_ROWS 512

int model_tp_size(const struct model *m) { return m->sh.size; }

bool model_failed(const struct model *m) {
    return m->failed || (m->sh.comm && m->sh.comm->ops->aborted(m->sh.comm));
}

static struct model *rank_model(const struct model *m, int r) { return m->tp ? m->tp->ranks[r] : (struct model *)m; }

struct load_job {
    const char *dir;
    const struct model_load_opts *o;
    struct tp_group *g;
    struct model **ranks;
    char (*err)[512];
};

static int load_rank_job(void *arg, int r) {
    struct load_job *j = arg;
    struct model_rank_spec spec = {r, tp_size(j->g), tp_comm(j->g, r), r == 0};
    return model_load_rank(&j->ranks[r], j->dir, tp_backend(j->g, r), j->o, &spec, j->err[r], sizeof j->err[r]);
}

static int tp_load(struct model **out, const char *dir, struct backend *b, const struct model_load_opts *o, char *err,
                  size_t errlen) {
    *out = NULL;
    int n = o->tensor_parallel_size > 1 ? o->tensor_parallel_size : 1;
    struct model_config cfg;
    if (model_config_load(&cfg, dir, err, errlen) != 0 || tp_check(&cfg, n, err, errlen) != 0) return -1;
    if (!b->ops->logits_to || !b->ops->logits_assemble)
        return util_err(err, errlen, "the %s backend cannot run tensor parallelism", b->name);
    struct tp_group *g;
    if (tp_group_create(&g, b, n, o->cuda_flags, err, errlen) != 0) return -1;
    struct model **ranks = calloc((size_t)n, sizeof *ranks);
    char(*errs)[512] = calloc((size_t)n, sizeof *errs);
    struct model_tp *t = calloc(1, sizeof *t);
    if (!ranks || !errs || !t) {
        free(ranks), free(errs), free(t);
        tp_group_free(g);
        return util_err(err, errlen, "out of memory");
    }
    /* every rank reads its shard at once (its own mapping of the files, its own device) */
    struct load_job job = {dir, o, g, ranks, errs};
    int rc = tp_run(g, load_rank_job, &job);
    if (rc) {
        for (int r = 0; r < n; r++)
            if (errs[r][0]) {
                util_err(err, errlen, "%s", errs[r]);
                break;
            }
        for (int r = 0; r < n; r++) model_free_rank(ranks[r]);
        free(ranks), free(errs), free(t);
        tp_group_free(g);
        return -1;
    }
    free(errs);
    t->g = g;
    t->ranks = ranks;
    ranks[0]->tp = t;
    *out = ranks[0];
    return 0;
}

static void tp_free(struct model_tp *t) {
    if (!t) return;
    int n = tp_size(t->g);
    for (int r = 1; r < n; r++) model_free_rank(t->ranks[r]);
    tp_group_free(t->g);
    free(t->ranks);
    free(t);
}

/* Grows a rank's gather buffers to the step's logits rows (before a graph capture uses them). */
static int tp_reserve(struct model *m, int rows) {
    if (rows <= m->lg_rows) return 0;
    const struct backend_ops *op = m->b->ops;
    size_t part = (size_t)rows * m->sh.vocab_part * sizeof(float);
    if (op->graph_reset) op->graph_reset(m->b); /* captured steps use the buffers that move */
    op->free(m->b, m->lg_part);
    op->free(m->b, m->lg_all);
    enum backend_status s1, s2 = BACKEND_OK;
    m->lg_part = op->alloc(m->b, part, &s1);
    m->lg_all = s1 == BACKEND_OK ? op->alloc(m->b, part * (size_t)m->sh.size, &s2) : NULL;
    m->lg_rows = s1 == BACKEND_OK && s2 == BACKEND_OK ? rows : 0;
    return m->lg_rows ? 0 : BACKEND_ERR_OOM;
}

struct fwd_job {
    struct model_tp *t;
    struct kv_cache *kv;
    const struct fwd_batch *batch;
    float *logits;
};

static int forward_job(void *arg, int r) {
    struct fwd_job *j = arg;
    struct model *m = j->t->ranks[r];
    struct comm *cm = m->sh.comm;
    if (cm->ops->aborted(cm)) return BACKEND_ERR_DEVICE;
    bool fault = tp_fault(j->t->g, r);
    int rc = fault ? BACKEND_ERR_DEVICE : tp_reserve(m, j->batch->n_logits);
    if (!rc) rc = model_step(m, j->kv, j->batch, r == 0 ? j->logits : NULL);
    if (rc && !cm->ops->aborted(cm)) { /* this rank failed first: no peer may wait for it */
        elog("error", "tensor parallelism: rank %d failed (%s)", r, fault ? "fault injection" : "backend error");
        cm->ops->abort(cm);
    }
    return rc;
}

static int tp_forward(struct model *m, struct kv_cache *kv, const struct fwd_batch *batch, float *logits) {
    int T = batch->n_tokens;
    if (T < 1 || T > m->max_tokens || batch->n_logits > T) return BACKEND_ERR_ARG;
    if (model_failed(m)) return BACKEND_ERR_DEVICE;
    struct fwd_job job = {m->tp, kv, batch, logits};
    int rc = tp_run(m->tp->g, forward_job, &job);
    if (rc) {
        m->failed = true;
        elog("error", "tensor parallelism: the step failed on the %s backend; the model cannot run more steps",
             m->b->name);
    }
    return rc;
}

/* Rank r's KV geometry: its heads of each layer. */
static void rank_geometry(const struct model *m, int r, int block_size, int sink, int recent, struct kv_geometry *g) {
    const struct model *rm = rank_model(m, r);
    *g = (struct kv_geometry){m->cfg.n_layers, m->cfg.head_dim, block_size, rm->sh.n_full, rm->sh.n_stream, sink,
                              recent, m->kv_dtype};
}

/* Each rank's scales into its shard of the fp8 pools. */
static int set_kv_scales(const struct model *m, struct kv_cache *kv) {
    for (int r = 0; m->kv_dtype == KV_DTYPE_FP8_E4M3 && r < m->sh.size; r++) {
        const struct model *rm = rank_model(m, r);
        int kvr = rm->sh.n_kv_heads;
        for (int l = 0; l < m->cfg.n_layers; l++)
            if (kv_cache_set_scales(kv, r, l, rm->k_scale + (size_t)l * kvr, rm->v_scale + (size_t)l * kvr) != 0) {
                kv_cache_free(kv);
                return KV_STATUS_OOM;
            }
    }
    return KV_STATUS_OK;
}

int model_kv_cache_init(const struct model *m, struct kv_cache *kv, int block_size, int sink, int recent,
                        int n_blocks, int n_slots) {
    int n = m->sh.size;
    if (!m->tp) {
        struct kv_geometry g;
        model_kv_geometry(m, block_size, sink, recent, &g);
        int rc = kv_cache_init(kv, m->b, &g, n_blocks, n_slots);
        return rc ? rc : set_kv_scales(m, kv);
    }
    struct backend **b = calloc((size_t)n, sizeof *b);
    struct kv_geometry *g = calloc((size_t)n, sizeof *g);
    int rc = KV_STATUS_OOM;
    if (b && g) {
        for (int r = 0; r < n; r++) {
            b[r] = rank_model(m, r)->b;
            rank_geometry(m, r, block_size, sink, recent, &g[r]);
        }
        rc = kv_cache_init_shards(kv, n, b, g, n_blocks, n_slots);
    }
    free(b);
    free(g);
    return rc ? rc : set_kv_scales(m, kv);
}

int model_kv_budget(const struct model *m, int block_size, int sink, int recent, float util, double *budget,
                    char *err, size_t errlen) {
    int n = m->sh.size;
    size_t es = kv_cache_elem_size(m->b, m->kv_dtype);
    struct kv_geometry whole;
    model_kv_geometry(m, block_size, sink, recent, &whole);
    double block_tot = (double)kv_cache_block_bytes(&whole, es), slot_tot = (double)kv_cache_slot_bytes(&whole, es);
    double best = INFINITY, first = 0;
    for (int r = 0; r < n; r++) {
        struct backend *b = rank_model(m, r)->b;
        size_t dev_free = 0, dev_total = 0;
        b->ops->mem_info(b, &dev_free, &dev_total);
        double reserve = KV_RESERVE_BYTES;
        if (n > 1) reserve += 2.0 * TP_LOGIT_ROWS * (double)m->cfg.vocab_size * sizeof(float);
        double want = (double)util * (double)dev_total - (double)(dev_total - dev_free) - reserve;
        if (want < (double)(64u << 20)) {
            char where[32] = "";
            if (n > 1) snprintf(where, sizeof where, " on GPU %d", r);
            return util_err(err, errlen,
                            "not enough GPU memory for the KV cache%s: %.1f GiB total, %.1f GiB free after the "
                            "weights, --gpu-memory-utilization %.2f",
                            where, dev_total / 1073741824.0, dev_free / 1073741824.0, util);
        }
        struct kv_geometry g;
        rank_geometry(m, r, block_size, sink, recent, &g);
        /* the rank's fraction of every block and slot: the whole model's budget it can carry */
        double fb = block_tot > 0 ? (double)kv_cache_block_bytes(&g, es) / block_tot : 0;
        double fs = slot_tot > 0 ? (double)kv_cache_slot_bytes(&g, es) / slot_tot : 0;
        double share = fb > fs ? fb : fs;
        if (r == 0) first = want;
        if (share > 0 && want / share < best) best = want / share;
    }
    *budget = isfinite(best) ? best : first;
    return 0;
}

int model_prefill_waves(const struct model *m, int *block_tokens, int *heads) {
    const struct backend_ops *op = m->b->ops;
    *block_tokens = 0;
    int wave = op->prefill_blocks ? op->prefill_blocks(m->b, m->cfg.n_heads / m->cfg.n_kv_heads, m->cfg.head_dim,
                                                       block_tokens)
                                  : 0;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        heads[l] = 0;
        for (int r = 0; r < m->sh.size; r++) {
            int h = rank_model(m, r)->sh.n_full[l];
            if (h > heads[l]) heads[l] = h;
        }
    }
    return wave > 0 && *block_tokens > 0 ? wave : 0;
}

int model_load(struct model **out, const char *dir, struct backend *b, int max_tokens, char *err, size_t errlen) {
    return model_load_duo(out, dir, b, max_tokens, NULL, err, errlen);
}

int model_load_duo(struct model **out, const char *dir, struct backend *b, int max_tokens, const uint8_t *streaming,
                   char *err, size_t errlen) {
    struct model_load_opts o = {.max_tokens = max_tokens, .streaming = streaming, .tensor_parallel_size = 1};
    return model_load_with(out, dir, b, &o, err, errlen);
}

int model_load_with(struct model **out, const char *dir, struct backend *b, const struct model_load_opts *o,
                    char *err, size_t errlen) {
    /* DUOSERVE_TP_GROUP=1: one rank through the tensor-parallel path (communicator, gathered
     * logits), the same results as without it: checks that path on one GPU */
    const char *g = getenv("DUOSERVE_TP_GROUP");
    if (o->tensor_parallel_size > 1 || (g && g[0] == '1')) return tp_load(out, dir, b, o, err, errlen);
    struct model_rank_spec spec = {.rank = 0, .size = 1, .progress = true};
    return model_load_rank(out, dir, b, o, &spec, err, errlen);
}

void model_free(struct model *m) {
    if (!m) return;
    if (m->tp) tp_free(m->tp); /* the other ranks first: rank 0's backend outlives them */
    model_free_rank(m);
}

int model_forward(struct model *m, struct kv_cache *kv, const struct fwd_batch *batch, float *logits) {
    if (m->tp) return tp_forward(m, kv, batch, logits);
    return model_step(m, kv, batch, logits);
}
