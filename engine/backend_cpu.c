/* backend_cpu: the reference implementation of every op, plain fp32 loops in the order of the
 * math (llama2.c's forward). Activations and weights are f32 host memory. Single-threaded. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend.h"

struct cpu_ctx {
    struct fwd_batch batch; // borrowed for the duration of a step
    float *scores;          // attention scratch, grown as needed
    size_t scores_cap;
};

static void *cpu_alloc(struct backend *b, size_t bytes, enum backend_status *st) {
    void *p = calloc(1, bytes ? bytes : 1);
    if (st) *st = p ? BACKEND_OK : BACKEND_ERR_OOM;
    return p;
}

static void cpu_free(struct backend *b, void *p) { free(p); }

static int cpu_weight_upload(struct backend *b, const struct st_tensor *t, void **out) {
    int64_t n = st_tensor_numel(t);
    float *w = malloc((size_t)(n ? n : 1) * sizeof(float));
    if (!w) return BACKEND_ERR_OOM;
    st_tensor_to_f32(t, 0, n, w);
    *out = w;
    return BACKEND_OK;
}

static int cpu_upload_f32(struct backend *b, void *dst, const float *src, size_t n) {
    memcpy(dst, src, n * sizeof(float));
    return BACKEND_OK;
}

static int cpu_begin_step(struct backend *b, const struct fwd_batch *batch) {
    struct cpu_ctx *c = b->ctx;
    c->batch = *batch;
    return BACKEND_OK;
}

static void cpu_embed(struct backend *b, void *out, const void *table, int dim) {
    const struct fwd_batch *bt = &((struct cpu_ctx *)b->ctx)->batch;
    for (int t = 0; t < bt->n_tokens; t++)
        memcpy((float *)out + (size_t)t * dim, (const float *)table + (size_t)bt->tokens[t] * dim, dim * sizeof(float));
}

/* HF LlamaRMSNorm in fp32: x * rsqrt(mean(x^2) + eps) * w */
static void cpu_rmsnorm(struct backend *b, void *out_, const void *x_, const void *w_, int n, int dim, float eps) {
    const float *w = w_;
    for (int i = 0; i < n; i++) {
        const float *x = (const float *)x_ + (size_t)i * dim;
        float *o = (float *)out_ + (size_t)i * dim;
        float ss = 0.0f;
        for (int j = 0; j < dim; j++) ss += x[j] * x[j];
        float inv = 1.0f / sqrtf(ss / dim + eps);
        for (int j = 0; j < dim; j++) o[j] = w[j] * (x[j] * inv);
    }
}

static void cpu_matmul(struct backend *b, void *out_, const void *x_, const void *w_, const void *bias_, int n,
                       int n_out, int n_in) {
    const float *w = w_, *bias = bias_;
    for (int i = 0; i < n; i++) {
        const float *x = (const float *)x_ + (size_t)i * n_in;
        float *o = (float *)out_ + (size_t)i * n_out;
        for (int r = 0; r < n_out; r++) {
            const float *wr = w + (size_t)r * n_in;
            float s = 0.0f;
            for (int k = 0; k < n_in; k++) s += wr[k] * x[k];
            o[r] = bias ? s + bias[r] : s;
        }
    }
}

/* HF rotate_half: element i pairs with i + hd/2; angle = pos * inv_freq[i] in f32. */
static void rope_rows(float *x, int n_heads, int hd, int pos, const float *inv_freq) {
    int half = hd / 2;
    for (int i = 0; i < half; i++) {
        float ang = (float)pos * inv_freq[i];
        float c = cosf(ang), s = sinf(ang);
        for (int h = 0; h < n_heads; h++) {
            float *v = x + (size_t)h * hd;
            float a = v[i], bb = v[i + half];
            v[i] = a * c - bb * s;
            v[i + half] = bb * c + a * s;
        }
    }
}

static void cpu_rope(struct backend *b, void *q, void *k, int n_heads, int n_kv_heads, int head_dim,
                     const void *inv_freq) {
    const struct fwd_batch *bt = &((struct cpu_ctx *)b->ctx)->batch;
    for (int t = 0; t < bt->n_tokens; t++) {
        rope_rows((float *)q + (size_t)t * n_heads * head_dim, n_heads, head_dim, bt->pos[t], inv_freq);
        rope_rows((float *)k + (size_t)t * n_kv_heads * head_dim, n_kv_heads, head_dim, bt->pos[t], inv_freq);
    }
}

/* Row of the full pool holding (sequence s, position p), kv head h. */
static float *kv_row(float *cache, const struct fwd_batch *bt, const struct attn_layer *L, int s, int p, int h) {
    int blk = bt->block_ids[bt->block_indptr[s] + p / L->block_size];
    size_t row = ((size_t)blk * L->block_size + (size_t)(p % L->block_size)) * L->n_kv_heads + (size_t)h;
    return cache + row * L->head_dim;
}

static void cpu_attention(struct backend *b, void *out_, const void *q_, const void *k_, const void *v_,
                          const struct attn_layer *L) {
    struct cpu_ctx *c = b->ctx;
    const struct fwd_batch *bt = &c->batch;
    int hd = L->head_dim, nkv = L->n_kv_heads, group = L->n_heads / L->n_kv_heads;

    /* 1. append this step's keys and values to the cache */
    for (int s = 0; s < bt->n_seqs; s++)
        for (int t = bt->seq_start[s]; t < bt->seq_start[s + 1]; t++)
            for (int h = 0; h < nkv; h++) {
                size_t src = ((size_t)t * nkv + h) * hd;
                memcpy(kv_row(L->k_cache, bt, L, s, bt->pos[t], h), (const float *)k_ + src, hd * sizeof(float));
                memcpy(kv_row(L->v_cache, bt, L, s, bt->pos[t], h), (const float *)v_ + src, hd * sizeof(float));
            }

    /* 2. each query attends to keys 0..pos (within the sliding window, if any) */
    for (int s = 0; s < bt->n_seqs; s++) {
        for (int t = bt->seq_start[s]; t < bt->seq_start[s + 1]; t++) {
            int pos = bt->pos[t];
            int first = L->sliding_window > 0 && pos - L->sliding_window + 1 > 0 ? pos - L->sliding_window + 1 : 0;
            size_t need = (size_t)(pos + 1);
            if (need > c->scores_cap) {
                float *ns = realloc(c->scores, need * sizeof(float));
                if (!ns) abort(); /* host OOM in the reference backend: nothing sensible to do */
                c->scores = ns;
                c->scores_cap = need;
            }
            float *sc = c->scores;
            for (int h = 0; h < L->n_heads; h++) {
                const float *q = (const float *)q_ + ((size_t)t * L->n_heads + h) * hd;
                int kvh = h / group;
                float mx = -INFINITY;
                for (int j = first; j <= pos; j++) {
                    const float *kr = kv_row(L->k_cache, bt, L, s, j, kvh);
                    float d = 0.0f;
                    for (int i = 0; i < hd; i++) d += q[i] * kr[i];
                    sc[j] = d * L->scale;
                    if (sc[j] > mx) mx = sc[j];
                }
                float sum = 0.0f;
                for (int j = first; j <= pos; j++) {
                    sc[j] = expf(sc[j] - mx);
                    sum += sc[j];
                }
                float *o = (float *)out_ + ((size_t)t * L->n_heads + h) * hd;
                memset(o, 0, hd * sizeof(float));
                for (int j = first; j <= pos; j++) {
                    const float *vr = kv_row(L->v_cache, bt, L, s, j, kvh);
                    float p = sc[j] / sum;
                    for (int i = 0; i < hd; i++) o[i] += p * vr[i];
                }
            }
        }
    }
}

static void cpu_silu_mul(struct backend *b, void *out, const void *gate, const void *up, size_t n) {
    const float *g = gate, *u = up;
    float *o = out;
    for (size_t i = 0; i < n; i++) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

static void cpu_add(struct backend *b, void *x, const void *y, size_t n) {
    float *a = x;
    const float *c = y;
    for (size_t i = 0; i < n; i++) a[i] += c[i];
}

static void cpu_get_rows(struct backend *b, void *out, const void *x, int dim) {
    const struct fwd_batch *bt = &((struct cpu_ctx *)b->ctx)->batch;
    for (int i = 0; i < bt->n_logits; i++)
        memmove((float *)out + (size_t)i * dim, (const float *)x + (size_t)bt->logit_rows[i] * dim, dim * sizeof(float));
}

static int cpu_logits(struct backend *b, float *host_logits, const void *x, const void *w, int n, int vocab, int dim) {
    cpu_matmul(b, host_logits, x, w, NULL, n, vocab, dim);
    return BACKEND_OK;
}

static int cpu_sync(struct backend *b) { return BACKEND_OK; }

static void cpu_destroy(struct backend *b) {
    struct cpu_ctx *c = b->ctx;
    free(c->scores);
    free(c);
    free(b);
}

static const struct backend_ops cpu_ops = {
    .alloc = cpu_alloc,
    .free = cpu_free,
    .act_size = sizeof(float),
    .weight_upload = cpu_weight_upload,
    .upload_f32 = cpu_upload_f32,
    .begin_step = cpu_begin_step,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .matmul = cpu_matmul,
    .rope = cpu_rope,
    .attention = cpu_attention,
    .silu_mul = cpu_silu_mul,
    .add = cpu_add,
    .get_rows = cpu_get_rows,
    .logits = cpu_logits,
    .sync = cpu_sync,
    .destroy = cpu_destroy,
};

struct backend *backend_cpu_create(void) {
    struct backend *b = calloc(1, sizeof *b);
    struct cpu_ctx *c = calloc(1, sizeof *c);
    if (!b || !c) {
        free(b);
        free(c);
        return NULL;
    }
    b->ops = &cpu_ops;
    b->name = "cpu";
    b->ctx = c;
    return b;
}

void backend_destroy(struct backend *b) {
    if (b) b->ops->destroy(b);
}

#ifndef DUO_CUDA
struct backend *backend_cuda_create(int device, char *err, size_t errlen) {
    if (err && errlen) snprintf(err, errlen, "this build has no CUDA support (rebuild with make CUDA=1)");
    return NULL;
}
#endif
