/* backend_cpu: the reference implementation of every op, plain fp32 loops in the order of the
 * math (llama2.c's forward). Activations and weights are f32 host memory; the KV pools f32, bf16
 * or e4m3 (struct attn_layer), whose values the attention computes with in f32. Single-threaded,
 * but for a large attention step's rows (cpu_attention), which threads share a row each: every
 * row is computed whole by one thread with the same code, so the bits do not depend on it. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/backend.h"
#include "engine/fp8.h"
#include "engine/sampler.h"
#include "engine/util.h"

struct cpu_ctx {
    struct fwd_batch batch; // borrowed for the duration of a step
    float *logits;          // the last logits computed (the caller's buffer or own)
    float *own_logits;
    size_t own_cap;
    float *scores;          // attention scratch, grown as needed
    size_t scores_cap;
    float *row;             // attention scratch: a decoded K/V row, then a stored one (2 * head_dim floats)
    size_t row_cap;
    float *samp;            // sample op scratch: a row and sampler_run's scratch rows, grown as needed
    size_t samp_cap;
};

static void *cpu_alloc(struct backend *b, size_t bytes, enum backend_status *st) {
    void *p = calloc(1, bytes ? bytes : 1);
    if (st) *st = p ? BACKEND_OK : BACKEND_ERR_OOM;
    return p;
}

static void cpu_free(struct backend *b, void *p) { free(p); }

/* Every page of p resident now (calloc maps large blocks lazily). */
static void cpu_prefault(struct backend *b, void *p, size_t bytes) {
    for (size_t i = 0; p && i < bytes; i += 4096) ((volatile char *)p)[i] = 0;
}

static void cpu_copy(struct backend *b, void *dst, const void *src, size_t bytes) { memmove(dst, src, bytes); }

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

static int cpu_upload_act(struct backend *b, void *dst, const float *src, size_t n) {
    memcpy(dst, src, n * sizeof(float));
    return BACKEND_OK;
}

static int cpu_download_act(struct backend *b, float *dst, const void *src, size_t n) {
    memcpy(dst, src, n * sizeof(float));
    return BACKEND_OK;
}

static int cpu_copy_bytes(struct backend *b, void *dst, const void *src, size_t bytes) {
    memcpy(dst, src, bytes);
    return BACKEND_OK;
}

static void cpu_mem_info(struct backend *b, size_t *free_bytes, size_t *total_bytes) {
    *free_bytes = *total_bytes = 0;
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

/* Four tokens share each weight row (four independent sums: instruction-level parallelism and
 * one pass over the weights), so batching raises throughput. Every output is still one
 * sequential sum over k, so results do not depend on the batch. */
static void cpu_matmul(struct backend *b, void *out_, const void *x_, const void *w_, const void *bias_, int n,
                       int n_out, int n_in) {
    const float *w = w_, *bias = bias_, *x = x_;
    float *out = out_;
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        const float *x0 = x + (size_t)i * n_in, *x1 = x0 + n_in, *x2 = x1 + n_in, *x3 = x2 + n_in;
        for (int r = 0; r < n_out; r++) {
            const float *wr = w + (size_t)r * n_in;
            float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
            for (int k = 0; k < n_in; k++) {
                float wk = wr[k];
                s0 += wk * x0[k];
                s1 += wk * x1[k];
                s2 += wk * x2[k];
                s3 += wk * x3[k];
            }
            float bb = bias ? bias[r] : 0.0f;
            out[(size_t)i * n_out + r] = bias ? s0 + bb : s0;
            out[(size_t)(i + 1) * n_out + r] = bias ? s1 + bb : s1;
            out[(size_t)(i + 2) * n_out + r] = bias ? s2 + bb : s2;
            out[(size_t)(i + 3) * n_out + r] = bias ? s3 + bb : s3;
        }
    }
    for (; i < n; i++) {
        const float *xi = x + (size_t)i * n_in;
        float *o = out + (size_t)i * n_out;
        for (int r = 0; r < n_out; r++) {
            const float *wr = w + (size_t)r * n_in;
            float s = 0.0f;
            for (int k = 0; k < n_in; k++) s += wr[k] * xi[k];
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

static void cpu_rope(struct backend *b, void *qk, int n_heads, int head_dim, int row_stride, const void *inv_freq) {
    const struct fwd_batch *bt = &((struct cpu_ctx *)b->ctx)->batch;
    for (int t = 0; t < bt->n_tokens; t++)
        rope_rows((float *)qk + (size_t)t * row_stride, n_heads, head_dim, bt->pos[t], inv_freq);
}

/* Element offset of the full-pool row of (sequence s, position p, retrieval head h). */
static size_t full_row(const struct fwd_batch *bt, const struct attn_layer *L, int s, int p, int h) {
    int blk = bt->block_ids[bt->block_indptr[s] + p / L->block_size];
    size_t row = ((size_t)blk * L->block_size + (size_t)(p % L->block_size)) * L->n_full + (size_t)h;
    return row * L->head_dim;
}

/* Element offset of the streaming-slot row of (slot, position p, streaming head h). */
static size_t stream_row(const struct attn_layer *L, int slot, int p, int h) {
    int r = p < L->sink ? p : L->sink + (p - L->sink) % L->recent;
    size_t row = ((size_t)slot * (L->sink + L->recent) + (size_t)r) * L->n_stream + (size_t)h;
    return row * L->head_dim;
}

/* The scale of KV head kvh (reordered index) of an fp8 pool; 1 otherwise. */
static float kv_scale(const struct attn_layer *L, int kvh, int want_v) {
    const float *sc = want_v ? L->v_scale : L->k_scale;
    return L->kv_dtype == KV_DTYPE_FP8_E4M3 && sc ? sc[kvh] : 1.0f;
}

/* Stores a row of head_dim values at element offset `at` of a pool: f32, bf16 (nearest even) or
 * e4m3 of x / scale (engine/fp8.h). */
static void kv_store(const struct attn_layer *L, void *pool, size_t at, const float *x, float scale) {
    int hd = L->head_dim;
    if (L->kv_dtype == KV_DTYPE_FP8_E4M3)
        for (int i = 0; i < hd; i++) ((uint8_t *)pool)[at + i] = fp8_e4m3_from_f32(x[i] / scale);
    else if (L->kv_dtype == KV_DTYPE_BF16)
        for (int i = 0; i < hd; i++) ((uint16_t *)pool)[at + i] = util_f32_to_bf16(x[i]);
    else
        memcpy((float *)pool + at, x, hd * sizeof(float));
}

/* The f32 values of the row at element offset `at` of a pool: the row itself when f32, else
 * decoded into buf (e4m3 * scale). */
static const float *kv_load(const struct attn_layer *L, const void *pool, size_t at, float scale, float *buf) {
    int hd = L->head_dim;
    if (L->kv_dtype == KV_DTYPE_FP8_E4M3)
        for (int i = 0; i < hd; i++) buf[i] = fp8_e4m3_to_f32(((const uint8_t *)pool)[at + i]) * scale;
    else if (L->kv_dtype == KV_DTYPE_BF16)
        for (int i = 0; i < hd; i++) buf[i] = util_bf16_to_f32(((const uint16_t *)pool)[at + i]);
    else
        return (const float *)pool + at;
    return buf;
}

/* One query head over the keys `visible` says it sees; scores in sc[0..pos]. */
static void attend(float *o, const float *q, int pos, int first, const struct attn_layer *L, float *sc,
                   const float *(*key)(const void *ctx, int j, int want_v), const void *ctx,
                   int (*visible)(const struct attn_layer *L, int i, int j)) {
    int hd = L->head_dim;
    float mx = -INFINITY;
    for (int j = first; j <= pos; j++) {
        if (!visible(L, pos, j)) continue;
        const float *kr = key(ctx, j, 0);
        float d = 0.0f;
        for (int i = 0; i < hd; i++) d += q[i] * kr[i];
        sc[j] = d * L->scale;
        if (sc[j] > mx) mx = sc[j];
    }
    float sum = 0.0f;
    for (int j = first; j <= pos; j++) {
        if (!visible(L, pos, j)) continue;
        sc[j] = expf(sc[j] - mx);
        sum += sc[j];
    }
    memset(o, 0, hd * sizeof(float));
    for (int j = first; j <= pos; j++) {
        if (!visible(L, pos, j)) continue;
        const float *vr = key(ctx, j, 1);
        float p = sc[j] / sum;
        for (int i = 0; i < hd; i++) o[i] += p * vr[i];
    }
}

static int visible_full(const struct attn_layer *L, int i, int j) {
    return L->sliding_window <= 0 || i - j < L->sliding_window;
}

static int visible_stream(const struct attn_layer *L, int i, int j) { return j < L->sink || i - j < L->recent; }

/* Where a key/value row lives: this batch's k/v (positions >= chunk_pos) or the pools. A row
 * returned is read before the next call (decoded rows share buf). */
struct key_ctx {
    const struct fwd_batch *bt;
    const struct attn_layer *L;
    const float *k, *v; // batch k/v rows, row_stride apart
    int row_stride;
    int s, kvh;         // sequence, KV head (reordered index)
    int row0, pos0;     // first batch row of the sequence and its position
    float *buf;         // [head_dim] a decoded row
    uint8_t *raw;       // [head_dim * 4] a stored row
};

static const float *key_full(const void *ctx_, int j, int want_v) {
    const struct key_ctx *c = ctx_;
    const struct attn_layer *L = c->L;
    return kv_load(L, want_v ? L->v_full : L->k_full, full_row(c->bt, L, c->s, j, c->kvh), kv_scale(L, c->kvh, want_v),
                   c->buf);
}

static const float *key_stream(const void *ctx_, int j, int want_v) {
    const struct key_ctx *c = ctx_;
    const struct attn_layer *L = c->L;
    float sc = kv_scale(L, c->kvh, want_v);
    if (j >= c->pos0) { /* in this chunk: the ring may already be too small to hold it; read as stored */
        const float *x = (want_v ? c->v : c->k) + (size_t)(c->row0 + j - c->pos0) * c->row_stride + (size_t)c->kvh * L->head_dim;
        kv_store(L, c->raw, 0, x, sc);
        return kv_load(L, c->raw, 0, sc, c->buf);
    }
    return kv_load(L, want_v ? L->v_stream : L->k_stream, stream_row(L, c->bt->stream_slot[c->s], j, c->kvh - L->n_full),
                   sc, c->buf);
}

/* A step's attention rows r0 .. r1 - 1 (row t * n_heads + h: token t, query head h), with scratch
 * of its own: scores ([max pos + 1]) and row (2 head_dim floats). */
struct attn_rows {
    const struct fwd_batch *bt;
    const struct attn_layer *L;
    const float *q, *k, *v; /* the q|k|v rows, rs apart */
    int rs;
    float *out;
    long r0, r1;
    float *scores, *row;
};

static void attend_rows(struct attn_rows *a) {
    const struct fwd_batch *bt = a->bt;
    const struct attn_layer *L = a->L;
    int hd = L->head_dim, group = L->n_heads / L->n_kv_heads, s = 0;
    for (long r = a->r0; r < a->r1; r++) {
        int t = (int)(r / L->n_heads), h = (int)(r % L->n_heads);
        while (t >= bt->seq_start[s + 1]) s++;
        int row0 = bt->seq_start[s], pos0 = bt->pos[row0], pos = bt->pos[t], kvh = h / group;
        struct key_ctx kc = {bt, L, a->k, a->v, a->rs, s, kvh, row0, pos0, a->row, (uint8_t *)(a->row + hd)};
        const float *q = a->q + (size_t)t * a->rs + (size_t)h * hd;
        float *o = a->out + ((size_t)t * L->n_heads + h) * hd;
        if (kvh < L->n_full) {
            int first = L->sliding_window > 0 && pos - L->sliding_window + 1 > 0 ? pos - L->sliding_window + 1 : 0;
            attend(o, q, pos, first, L, a->scores, key_full, &kc, visible_full);
        } else {
            attend(o, q, pos, 0, L, a->scores, key_stream, &kc, visible_stream);
        }
    }
}

/* The scores a row of the step needs at most: its last key's position + 1. */
static size_t scores_len(const struct fwd_batch *bt) {
    size_t need = 1;
    for (int t = 0; t < bt->n_tokens; t++) need = (size_t)bt->pos[t] + 1 > need ? (size_t)bt->pos[t] + 1 : need;
    return need;
}

static void *attend_rows_main(void *arg) {
    attend_rows(arg);
    return NULL;
}

/* Above this many query-key products a step's rows are shared by threads (below, a thread's start
 * costs more than it saves), at most ATTN_THREADS_MAX of them. */
#define ATTN_THREAD_WORK (1L << 25)
#define ATTN_THREADS_MAX 16

/* job's rows in nt threads, contiguous ranges in order; each with scratch of its own. 0, or -1
 * when a thread or its scratch could not be had (nothing computed: the caller runs them all). */
static int attend_rows_threads(const struct attn_rows *job, int nt) {
    struct attn_rows jobs[ATTN_THREADS_MAX];
    pthread_t th[ATTN_THREADS_MAX];
    size_t need = scores_len(job->bt);
    int made = 0, rc = 0;
    for (int i = 0; i < nt; i++) {
        jobs[i] = *job;
        jobs[i].r0 = job->r0 + (job->r1 - job->r0) * i / nt, jobs[i].r1 = job->r0 + (job->r1 - job->r0) * (i + 1) / nt;
        jobs[i].scores = malloc(need * sizeof(float));
        jobs[i].row = malloc((size_t)job->L->head_dim * 2 * sizeof(float));
        if (!jobs[i].scores || !jobs[i].row) {
            free(jobs[i].scores), free(jobs[i].row);
            rc = -1;
            break;
        }
        made++;
    }
    int started = 0;
    for (; rc == 0 && started < made; started++)
        if (pthread_create(&th[started], NULL, attend_rows_main, &jobs[started]) != 0) rc = -1;
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < made; i++) free(jobs[i].scores), free(jobs[i].row);
    return rc;
}

static void cpu_attention(struct backend *b, void *out_, const void *qkv, int rs, const struct attn_layer *L) {
    struct cpu_ctx *c = b->ctx;
    const struct fwd_batch *bt = &c->batch;
    int hd = L->head_dim;
    const float *q_ = qkv, *kin = q_ + (size_t)L->n_heads * hd, *vin = kin + (size_t)L->n_kv_heads * hd;
    if ((size_t)hd * 2 > c->row_cap) {
        float *nr = realloc(c->row, (size_t)hd * 2 * sizeof(float));
        if (!nr) abort(); /* host OOM in the reference backend: nothing sensible to do */
        c->row = nr;
        c->row_cap = (size_t)hd * 2;
    }

    /* 1. retrieval heads: append this step's keys and values to the full pool */
    for (int s = 0; s < bt->n_seqs; s++)
        for (int t = bt->seq_start[s]; t < bt->seq_start[s + 1]; t++)
            for (int h = 0; h < L->n_full; h++) {
                size_t src = (size_t)t * rs + (size_t)h * hd, at = full_row(bt, L, s, bt->pos[t], h);
                kv_store(L, L->k_full, at, kin + src, kv_scale(L, h, 0));
                kv_store(L, L->v_full, at, vin + src, kv_scale(L, h, 1));
            }

    /* 2. every query head over the keys its mask allows: rows (token, head) in order, in threads
     * of their own when the step is large (attend_rows) */
    struct attn_rows job = {bt, L, q_, kin, vin, rs, out_, 0, (long)bt->n_tokens * L->n_heads, NULL, NULL};
    long work = 0; /* query-key products of the step's retrieval heads, roughly */
    for (int t = 0; t < bt->n_tokens; t++) work += (long)(bt->pos[t] + 1) * L->n_heads * hd;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int nt = work < ATTN_THREAD_WORK || ncpu < 2 ? 1 : (int)(ncpu < ATTN_THREADS_MAX ? ncpu : ATTN_THREADS_MAX);
    if (nt < 2 || attend_rows_threads(&job, nt) != 0) { /* one thread: the context's scratch */
        size_t need = scores_len(bt);
        if (need > c->scores_cap) {
            float *ns = realloc(c->scores, need * sizeof(float));
            if (!ns) abort(); /* host OOM in the reference backend: nothing sensible to do */
            c->scores = ns;
            c->scores_cap = need;
        }
        job.scores = c->scores, job.row = c->row;
        attend_rows(&job);
    }

    /* 3. streaming heads: store the chunk into the slots (sink rows, then the recent ring) */
    for (int s = 0; L->n_stream && s < bt->n_seqs; s++)
        for (int t = bt->seq_start[s]; t < bt->seq_start[s + 1]; t++)
            for (int h = 0; h < L->n_stream; h++) {
                size_t src = (size_t)t * rs + (size_t)(L->n_full + h) * hd;
                size_t at = stream_row(L, bt->stream_slot[s], bt->pos[t], h);
                kv_store(L, L->k_stream, at, kin + src, kv_scale(L, L->n_full + h, 0));
                kv_store(L, L->v_stream, at, vin + src, kv_scale(L, L->n_full + h, 1));
            }
}

static void cpu_silu_mul(struct backend *b, void *out, const void *gu, int n, int F) {
    for (int t = 0; t < n; t++) {
        const float *g = (const float *)gu + (size_t)t * 2 * F, *u = g + F;
        float *o = (float *)out + (size_t)t * F;
        for (int i = 0; i < F; i++) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}

/* gu (scratch) = x @ w^T with w's gate and up rows interleaved in groups of 8, then the same
 * silu(g) * u as cpu_silu_mul for each (gate, up) row pair */
static void cpu_matmul_swiglu(struct backend *b, void *out, void *gu, const void *x, const void *w, int n, int F,
                              int n_in) {
    cpu_matmul(b, gu, x, w, NULL, n, 2 * F, n_in);
    for (int t = 0; t < n; t++) {
        const float *y = (const float *)gu + (size_t)t * 2 * F;
        float *o = (float *)out + (size_t)t * F;
        for (int i = 0; i < F; i++) {
            float g = y[i / 8 * 16 + i % 8], u = y[i / 8 * 16 + 8 + i % 8];
            o[i] = g / (1.0f + expf(-g)) * u;
        }
    }
}

static void cpu_add(struct backend *b, void *x, const void *y, size_t n) {
    float *a = x;
    const float *c = y;
    for (size_t i = 0; i < n; i++) a[i] += c[i];
}

static void cpu_add_rmsnorm(struct backend *b, void *out, void *x, const void *y, const void *w, int n, int dim,
                            float eps) {
    cpu_add(b, x, y, (size_t)n * dim);
    cpu_rmsnorm(b, out, x, w, n, dim, eps);
}

static void cpu_norm_matmul(struct backend *b, void *out, void *gu, void *h, void *x_next, const void *x,
                            const void *y, const void *norm_w, float eps, const void *w, const void *bias, int n,
                            int n_out, int dim, bool swiglu) {
    memcpy(x_next, x, sizeof(float) * (size_t)n * dim);
    cpu_add_rmsnorm(b, h, x_next, y, norm_w, n, dim, eps);
    if (swiglu) cpu_matmul_swiglu(b, out, gu, h, w, n, n_out, dim);
    else cpu_matmul(b, out, h, w, bias, n, n_out, dim);
}

static void cpu_get_rows(struct backend *b, void *out, const void *x, int dim) {
    const struct fwd_batch *bt = &((struct cpu_ctx *)b->ctx)->batch;
    for (int i = 0; i < bt->n_logits; i++)
        memmove((float *)out + (size_t)i * dim, (const float *)x + (size_t)bt->logit_rows[i] * dim, dim * sizeof(float));
}

static int cpu_logits(struct backend *b, float *host_logits, const void *x, const void *w, int n, int vocab, int dim) {
    struct cpu_ctx *c = b->ctx;
    if (!host_logits) {
        size_t need = (size_t)n * vocab;
        if (need > c->own_cap) {
            free(c->own_logits);
            c->own_logits = malloc(need * sizeof(float));
            c->own_cap = c->own_logits ? need : 0;
            if (!c->own_logits) return BACKEND_ERR_OOM;
        }
        host_logits = c->own_logits;
    }
    cpu_matmul(b, host_logits, x, w, NULL, n, vocab, dim);
    c->logits = host_logits;
    return BACKEND_OK;
}

static int cpu_logits_to(struct backend *b, float *out, const void *x, const void *w, int n, int vocab, int dim) {
    cpu_matmul(b, out, x, w, NULL, n, vocab, dim);
    return BACKEND_OK;
}

static int cpu_logits_assemble(struct backend *b, float *host_logits, const float *parts, int n, int vocab,
                               int part_cols) {
    struct cpu_ctx *c = b->ctx;
    float *dst = host_logits;
    if (!dst) {
        size_t need = (size_t)n * vocab;
        if (need > c->own_cap) {
            free(c->own_logits);
            c->own_logits = malloc(need * sizeof(float));
            c->own_cap = c->own_logits ? need : 0;
            if (!c->own_logits) return BACKEND_ERR_OOM;
        }
        dst = c->own_logits;
    }
    for (int p = 0; p * part_cols < vocab; p++) {
        int cols = vocab - p * part_cols < part_cols ? vocab - p * part_cols : part_cols;
        const float *src = parts + (size_t)p * n * part_cols;
        for (int i = 0; i < n; i++)
            memcpy(dst + (size_t)i * vocab + (size_t)p * part_cols, src + (size_t)i * cols, sizeof(float) * cols);
    }
    c->logits = dst;
    return BACKEND_OK;
}

static void cpu_argmax(struct backend *b, int32_t *host_ids, int n, int vocab) {
    const float *l = ((struct cpu_ctx *)b->ctx)->logits;
    for (int i = 0; i < n; i++) {
        const float *row = l + (size_t)i * vocab;
        int best = 0;
        for (int j = 1; j < vocab; j++)
            if (row[j] > row[best]) best = j;
        host_ids[i] = best;
    }
}

/* The pipeline itself (engine/sampler.c) on a copy of each row: rows stay unchanged for forks
 * that draw from the same one. */
static int cpu_sample(struct backend *b, int32_t *host_ids, const struct sample_row *rows, int n, int vocab) {
    struct cpu_ctx *c = b->ctx;
    size_t need = (size_t)(1 + SAMPLER_SCRATCH_ROWS) * vocab;
    if (need > c->samp_cap) {
        free(c->samp);
        c->samp = malloc(need * sizeof(float));
        c->samp_cap = c->samp ? need : 0;
        if (!c->samp) return BACKEND_ERR_OOM;
    }
    for (int i = 0; i < n; i++) {
        memcpy(c->samp, c->logits + (size_t)rows[i].row * vocab, sizeof(float) * vocab);
        host_ids[i] = sampler_run(&rows[i], c->samp, vocab, c->samp + vocab);
    }
    return BACKEND_OK;
}

static int cpu_sync(struct backend *b) { return BACKEND_OK; }

static void cpu_destroy(struct backend *b) {
    struct cpu_ctx *c = b->ctx;
    free(c->scores);
    free(c->row);
    free(c->own_logits);
    free(c->samp);
    free(c);
    free(b);
}

static const struct backend_ops cpu_ops = {
    .alloc = cpu_alloc,
    .free = cpu_free,
    .prefault = cpu_prefault,
    .copy = cpu_copy,
    .act_size = sizeof(float),
    .kv_dtypes = 1u << KV_DTYPE_BF16 | 1u << KV_DTYPE_FP8_E4M3,
    .weight_upload = cpu_weight_upload,
    .upload_f32 = cpu_upload_f32,
    .upload_act = cpu_upload_act,
    .download_act = cpu_download_act,
    .upload_bytes = cpu_copy_bytes,
    .download_bytes = cpu_copy_bytes,
    .mem_info = cpu_mem_info,
    .begin_step = cpu_begin_step,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .matmul = cpu_matmul,
    .rope = cpu_rope,
    .attention = cpu_attention,
    .silu_mul = cpu_silu_mul,
    .matmul_swiglu = cpu_matmul_swiglu,
    .add_rmsnorm = cpu_add_rmsnorm,
    .norm_matmul = cpu_norm_matmul,
    .get_rows = cpu_get_rows,
    .logits = cpu_logits,
    .argmax = cpu_argmax,
    .sample = cpu_sample,
    .sample_allow = true,
    .sync = cpu_sync,
    .logits_to = cpu_logits_to,
    .logits_assemble = cpu_logits_assemble,
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
