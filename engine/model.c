#include "engine/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/elog.h"
#include "engine/util.h"

void model_kv_geometry(const struct model *m, int block_size, int sink, int recent, struct kv_geometry *g) {
    *g = (struct kv_geometry){m->cfg.n_layers, m->cfg.head_dim, block_size, m->n_full, m->n_stream, sink, recent};
}

void model_rope_inv_freq(const struct model_config *cfg, float *inv_freq) {
    int hd = cfg->head_dim;
    for (int i = 0; i < hd / 2; i++) inv_freq[i] = 1.0f / powf(cfg->rope_theta, (float)(2 * i) / (float)hd);
    if (cfg->rope_type == ROPE_TYPE_LINEAR) {
        for (int i = 0; i < hd / 2; i++) inv_freq[i] /= cfg->rope_factor;
    } else if (cfg->rope_type == ROPE_TYPE_LLAMA3) {
        /* Llama 3.1: long wavelengths scaled by 1/factor, short kept, smooth blend between */
        float factor = cfg->rope_factor, lo = cfg->rope_low_freq_factor, hi = cfg->rope_high_freq_factor;
        float old_len = (float)cfg->rope_orig_max_pos;
        float low_freq_wavelen = old_len / lo, high_freq_wavelen = old_len / hi;
        for (int i = 0; i < hd / 2; i++) {
            float f = inv_freq[i];
            float wavelen = 2.0f * (float)M_PI / f;
            float scaled = wavelen > low_freq_wavelen ? f / factor : f;
            if (!(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen)) {
                float smooth = (old_len / wavelen - lo) / (hi - lo);
                scaled = (1.0f - smooth) * scaled / factor + smooth * scaled;
            }
            inv_freq[i] = scaled;
        }
    }
}

/* Loading: every tensor the config implies must exist with exactly the implied shape; any
 * other tensor in the checkpoint is an error too (it means the config and weights disagree),
 * except buffers HF itself ignores. */
struct loader {
    const char *dir;
    const struct safetensors *st;
    struct backend *b;
    char *used; // [n_tensors]
    const uint8_t *streaming; // [n_layers][n_kv_heads] or NULL
    struct elog_progress progress; // "layers loaded: i/L"
    char *err;
    size_t errlen;
};

/* DuoAttention head order: groups of rows (axis 0) or columns (axis 1) of a tensor, one group
 * per KV head, reordered so new group i is old group perm[i]. */
struct head_perm {
    const int *perm; // [n] or NULL for identity
    int n;
    int axis;
};

/* Writes t's data into dst (same dtype) with its head groups permuted; hp NULL or identity:
 * a plain copy. */
static void permute_into(unsigned char *dst, const struct st_tensor *t, const struct head_perm *hp) {
    const unsigned char *src = t->data;
    if (!hp || !hp->perm) {
        memcpy(dst, src, t->nbytes);
        return;
    }
    size_t es = st_dtype_size(t->dtype);
    int64_t rows = t->shape[0], cols = t->n_dims > 1 ? t->shape[1] : 1;
    if (hp->axis == 0) {
        size_t gbytes = (size_t)(rows / hp->n) * (size_t)cols * es;
        for (int i = 0; i < hp->n; i++) memcpy(dst + i * gbytes, src + (size_t)hp->perm[i] * gbytes, gbytes);
    } else {
        size_t gbytes = (size_t)(cols / hp->n) * es, rbytes = (size_t)cols * es;
        for (int64_t r = 0; r < rows; r++)
            for (int i = 0; i < hp->n; i++)
                memcpy(dst + r * rbytes + i * gbytes, src + r * rbytes + (size_t)hp->perm[i] * gbytes, gbytes);
    }
}

/* Returns t with its head groups permuted (a malloc'd copy in *owned), or t itself. */
static const void *permuted_data(const struct st_tensor *t, const struct head_perm *hp, unsigned char **owned) {
    *owned = NULL;
    if (!hp || !hp->perm) return t->data;
    unsigned char *buf = malloc(t->nbytes ? t->nbytes : 1);
    if (!buf) return NULL;
    permute_into(buf, t, hp);
    *owned = buf;
    return buf;
}

/* Several checkpoint tensors of a layer stacked by rows into one weight (q|k|v, gate|up), so
 * one GEMM computes them all. Held in the parts' dtype when they share one (rows copied as
 * they are), else in the backend's weight dtype: bf16 when its activations are bf16 (rounded
 * to nearest even, as its upload of f32 would), f32 otherwise (exact). The buffer is reused
 * from layer to layer. */
struct stack {
    unsigned char *data; // [rows][cols, or 1 for a vector] of dtype
    size_t cap;          // bytes allocated
    enum st_dtype dtype;
    int64_t rows, cols, filled;
    int group; // 0: parts one after another; else two halves interleaved in groups of this many rows
};

/* The data row of part row i (rows counted across the parts in stacking order). With a group,
 * each `group` rows of the first half are followed by the same rows of the second half (gate |
 * up for backend matmul_swiglu). */
static int64_t stack_row(const struct stack *sk, int64_t i) {
    if (!sk->group) return i;
    int64_t half = sk->rows / 2, p = i >= half, r = p ? i - half : i;
    return r / sk->group * 2 * sk->group + p * sk->group + r % sk->group;
}

/* Readies sk for layer l's tensors parts[n] stacked into rows x cols (0: a vector). A missing
 * part is reported when it is loaded. */
static int stack_init(const struct loader *ld, struct stack *sk, int l, const char *const *parts, int n,
                      int64_t rows, int64_t cols) {
    enum st_dtype own = ld->b->ops->act_size == 2 ? ST_DTYPE_BF16 : ST_DTYPE_F32, dt = own;
    for (int i = 0, seen = 0; i < n; i++) {
        char name[160];
        snprintf(name, sizeof name, "model.layers.%d.%s", l, parts[i]);
        const struct st_tensor *t = safetensors_find(ld->st, name);
        if (!t) continue;
        if (seen++ && t->dtype != dt) {
            dt = own;
            break;
        }
        dt = t->dtype;
    }
    size_t bytes = (size_t)(rows * (cols ? cols : 1)) * st_dtype_size(dt);
    if (bytes > sk->cap) {
        free(sk->data);
        sk->data = malloc(bytes);
        sk->cap = sk->data ? bytes : 0;
        if (!sk->data) return -1;
    }
    sk->dtype = dt;
    sk->rows = rows;
    sk->cols = cols;
    sk->filled = 0;
    sk->group = 0;
    return 0;
}

/* Appends t's rows (head groups permuted) to sk, converting through f32 when the dtypes differ. */
static int stack_append(struct stack *sk, const struct st_tensor *t, const struct head_perm *hp) {
    size_t es = st_dtype_size(sk->dtype), rb = (size_t)(sk->cols ? sk->cols : 1) * es;
    int64_t first = sk->filled;
    sk->filled += t->shape[0];
    unsigned char *dst = sk->data + (size_t)first * rb;
    if (t->dtype == sk->dtype && !sk->group) {
        permute_into(dst, t, hp);
        return BACKEND_OK;
    }
    unsigned char *owned, *conv = NULL;
    struct st_tensor src = *t;
    src.data = permuted_data(t, hp, &owned);
    if (!src.data) return BACKEND_ERR_OOM;
    const unsigned char *rows = src.data; // t's rows in the stack's dtype
    if (t->dtype != sk->dtype) {
        int64_t n = st_tensor_numel(t);
        unsigned char *to = sk->group ? (conv = malloc((size_t)n * es)) : dst;
        if (!to) {
            free(owned);
            return BACKEND_ERR_OOM;
        }
        if (sk->dtype == ST_DTYPE_F32) st_tensor_to_f32(&src, 0, n, (float *)to);
        else st_tensor_to_bf16(&src, 0, n, (uint16_t *)to);
        rows = to;
    }
    if (sk->group) /* each row to its place among the other half's */
        for (int64_t r = 0; r < t->shape[0]; r++)
            memcpy(sk->data + (size_t)stack_row(sk, first + r) * rb, rows + (size_t)r * rb, rb);
    free(conv);
    free(owned);
    return BACKEND_OK;
}

static int stack_upload(struct loader *ld, struct stack *sk, void **dst) {
    size_t n = (size_t)(sk->rows * (sk->cols ? sk->cols : 1));
    struct st_tensor t = {.name = "stacked", .dtype = sk->dtype, .n_dims = sk->cols ? 2 : 1,
                          .shape = {sk->rows, sk->cols}, .data = sk->data, .nbytes = n * st_dtype_size(sk->dtype)};
    int rc = ld->b->ops->weight_upload(ld->b, &t, dst);
    return rc == BACKEND_OK ? 0 : util_err(ld->err, ld->errlen, "out of %s memory loading weights", ld->b->name);
}

static int upload_permuted(struct loader *ld, const struct st_tensor *t, const struct head_perm *hp, void **dst,
                           struct stack *sk) {
    if (sk) return stack_append(sk, t, hp);
    unsigned char *owned;
    const void *data = permuted_data(t, hp, &owned);
    if (!data) return BACKEND_ERR_OOM;
    struct st_tensor tmp = *t;
    tmp.data = data;
    int rc = ld->b->ops->weight_upload(ld->b, &tmp, dst);
    free(owned);
    return rc;
}

static int load_tensor_p(struct loader *ld, void **dst, const char *name, int n_dims, int64_t d0, int64_t d1,
                         const struct head_perm *hp, struct stack *sk);

static int load_tensor(struct loader *ld, void **dst, const char *name, int n_dims, int64_t d0, int64_t d1) {
    return load_tensor_p(ld, dst, name, n_dims, d0, d1, NULL, NULL);
}

/* Loads one tensor into *dst, or appends it to sk when sk is not NULL. */
static int load_tensor_p(struct loader *ld, void **dst, const char *name, int n_dims, int64_t d0, int64_t d1,
                         const struct head_perm *hp, struct stack *sk) {
    const struct st_tensor *t = safetensors_find(ld->st, name);
    if (!t) return util_err(ld->err, ld->errlen, "%s: tensor \"%s\" is missing", ld->dir, name);
    ld->used[t - ld->st->tensors] = 1;
    int64_t want[2] = {d0, d1};
    int ok = t->n_dims == n_dims;
    for (int i = 0; ok && i < n_dims; i++) ok = t->shape[i] == want[i];
    if (!ok) {
        char got[96] = "", exp[64];
        size_t o = 0;
        for (int i = 0; i < t->n_dims && o < sizeof got; i++)
            o += (size_t)snprintf(got + o, sizeof got - o, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
        if (n_dims == 1) snprintf(exp, sizeof exp, "%lld", (long long)d0);
        else snprintf(exp, sizeof exp, "%lld, %lld", (long long)d0, (long long)d1);
        return util_err(ld->err, ld->errlen, "%s: tensor \"%s\" has shape [%s], config.json implies [%s]", t->file,
                        name, got, exp);
    }
    if (upload_permuted(ld, t, hp, dst, sk) != BACKEND_OK)
        return util_err(ld->err, ld->errlen, "%s: out of %s memory loading \"%s\"", t->file, ld->b->name, name);
    return 0;
}

static int load_weights(struct model *m, struct loader *ld) {
    const struct model_config *c = &m->cfg;
    int64_t D = c->dim, F = c->hidden_dim, V = c->vocab_size;
    int64_t QD = (int64_t)c->n_heads * c->head_dim, KD = (int64_t)c->n_kv_heads * c->head_dim;
    if (load_tensor(ld, &m->tok_embed, "model.embed_tokens.weight", 2, V, D)) return -1;
    if (load_tensor(ld, &m->final_norm, "model.norm.weight", 1, D, 0)) return -1;
    if (c->tie_embeddings) {
        m->lm_head = m->tok_embed;
        /* some tied checkpoints still carry a copy; HF ignores it */
        const struct st_tensor *t = safetensors_find(ld->st, "lm_head.weight");
        if (t) ld->used[t - ld->st->tensors] = 1;
    } else if (load_tensor(ld, &m->lm_head, "lm_head.weight", 2, V, D)) {
        return -1;
    }
    /* the parts of the stacked weights, in stacking order */
    static const char *const qkv_w[] = {"self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                        "self_attn.v_proj.weight"};
    static const char *const qkv_b[] = {"self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"};
    static const char *const gu_w[] = {"mlp.gate_proj.weight", "mlp.up_proj.weight"};
    struct stack qkv = {0}, qkvb = {0}, gu = {0};
    int *perm = malloc(sizeof(int) * (size_t)c->n_kv_heads);
    int rc = perm ? 0 : util_err(ld->err, ld->errlen, "out of memory");
    m->fused_swiglu = ld->b->ops->matmul_swiglu && F % 8 == 0;
    m->fused_norm = ld->b->ops->norm_matmul != NULL;
    for (int l = 0; !rc && l < c->n_layers; l++) {
        struct layer_weights *w = &m->layers[l];
        char n[160];
        /* retrieval KV heads first, then streaming ones, each in checkpoint order */
        int np = 0, nf = 0;
        for (int pass = 0; pass < 2; pass++)
            for (int h = 0; h < c->n_kv_heads; h++)
                if ((ld->streaming && ld->streaming[l * c->n_kv_heads + h]) == pass) perm[np++] = h, nf += !pass;
        m->n_full[l] = nf;
        m->n_stream[l] = c->n_kv_heads - nf;
        struct head_perm rows = {nf < c->n_kv_heads ? perm : NULL, c->n_kv_heads, 0};
        struct head_perm cols = {rows.perm, c->n_kv_heads, 1};
#define LT(dst, suffix, nd, a, b, hp, sk)                                           \
    do {                                                                            \
        snprintf(n, sizeof n, "model.layers.%d.%s", l, suffix);                     \
        if (!rc) rc = load_tensor_p(ld, dst, n, nd, a, b, hp, sk);                  \
    } while (0)
        LT(&w->attn_norm, "input_layernorm.weight", 1, D, 0, NULL, NULL);
        LT(&w->ffn_norm, "post_attention_layernorm.weight", 1, D, 0, NULL, NULL);
        if (!rc && (stack_init(ld, &qkv, l, qkv_w, 3, QD + 2 * KD, D) || stack_init(ld, &gu, l, gu_w, 2, 2 * F, D) ||
                    (c->qkv_bias && stack_init(ld, &qkvb, l, qkv_b, 3, QD + 2 * KD, 0))))
            rc = util_err(ld->err, ld->errlen, "out of memory");
        gu.group = m->fused_swiglu ? 8 : 0; /* the row order matmul_swiglu reads */
        for (int i = 0; i < 3; i++) LT(NULL, qkv_w[i], 2, i ? KD : QD, D, &rows, &qkv);
        LT(&w->wo, "self_attn.o_proj.weight", 2, D, QD, &cols, NULL);
        for (int i = 0; c->qkv_bias && i < 3; i++) LT(NULL, qkv_b[i], 1, i ? KD : QD, 0, &rows, &qkvb);
        if (c->o_bias) LT(&w->bo, "self_attn.o_proj.bias", 1, D, 0, NULL, NULL);
        for (int i = 0; i < 2; i++) LT(NULL, gu_w[i], 2, F, D, NULL, &gu);
        LT(&w->w_down, "mlp.down_proj.weight", 2, D, F, NULL, NULL);
        if (!rc) rc = stack_upload(ld, &qkv, &w->wqkv);
        if (!rc && c->qkv_bias) rc = stack_upload(ld, &qkvb, &w->bqkv);
        if (!rc) rc = stack_upload(ld, &gu, &w->w_gateup);
        if (!rc) elog_progress_step(&ld->progress, l + 1);
#undef LT
    }
    free(perm);
    free(qkv.data);
    free(qkvb.data);
    free(gu.data);
    if (rc) return -1;
    for (int i = 0; i < ld->st->n_tensors; i++) {
        const char *name = ld->st->tensors[i].name;
        static const char buffer_suffix[] = "rotary_emb.inv_freq";
        size_t len = strlen(name), sl = sizeof buffer_suffix - 1;
        if (ld->used[i] || (len >= sl && !strcmp(name + len - sl, buffer_suffix))) continue;
        return util_err(ld->err, ld->errlen, "%s: unexpected tensor \"%s\" (not part of a %s with this config.json)",
                        ld->st->tensors[i].file, name, model_arch_name(c->arch));
    }
    return 0;
}

static int alloc_acts(struct model *m) {
    const struct model_config *c = &m->cfg;
    size_t T = (size_t)m->max_tokens, es = m->b->ops->act_size;
    size_t qd = (size_t)c->n_heads * c->head_dim, kd = (size_t)c->n_kv_heads * c->head_dim;
    struct {
        void **p;
        size_t n;
    } bufs[] = {{&m->x, T * c->dim},   {&m->h, T * c->dim},   {&m->qkv, T * (qd + 2 * kd)},
                {&m->att, T * qd},     {&m->o, T * c->dim},   {&m->gu, T * 2 * c->hidden_dim},
                {&m->act, T * c->hidden_dim}, {&m->x2, m->fused_norm ? T * c->dim : 0}};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        enum backend_status st;
        if (!bufs[i].n) continue;
        *bufs[i].p = m->b->ops->alloc(m->b, bufs[i].n * es, &st);
        if (st != BACKEND_OK) return -1;
    }
    enum backend_status st;
    m->inv_freq = m->b->ops->alloc(m->b, sizeof(float) * (size_t)(c->head_dim / 2), &st);
    if (st != BACKEND_OK) return -1;
    float *inv = malloc(sizeof(float) * (size_t)(c->head_dim / 2));
    if (!inv) return -1;
    model_rope_inv_freq(c, inv);
    int rc = m->b->ops->upload_f32(m->b, m->inv_freq, inv, (size_t)(c->head_dim / 2));
    free(inv);
    return rc == BACKEND_OK ? 0 : -1;
}

int model_load(struct model **out, const char *dir, struct backend *b, int max_tokens, char *err, size_t errlen) {
    return model_load_duo(out, dir, b, max_tokens, NULL, err, errlen);
}

int model_load_duo(struct model **out, const char *dir, struct backend *b, int max_tokens, const uint8_t *streaming,
                   char *err, size_t errlen) {
    *out = NULL;
    struct model *m = calloc(1, sizeof *m);
    if (!m) return util_err(err, errlen, "out of memory");
    m->b = b;
    m->max_tokens = max_tokens;
    struct safetensors *st = NULL;
    int rc = model_config_load(&m->cfg, dir, err, errlen);
    if (!rc) rc = safetensors_open_dir(&st, dir, err, errlen);
    if (!rc) {
        m->layers = calloc((size_t)m->cfg.n_layers, sizeof *m->layers);
        m->n_full = calloc((size_t)m->cfg.n_layers, sizeof *m->n_full);
        m->n_stream = calloc((size_t)m->cfg.n_layers, sizeof *m->n_stream);
        struct loader ld = {dir, st, b, calloc((size_t)st->n_tensors + 1, 1), streaming, {0}, err, errlen};
        elog_progress_begin(&ld.progress, "layers loaded:", m->cfg.n_layers);
        ld.progress.inplace &= m->cfg.n_layers >= 8; /* a small model loads faster than a redraw */
        if (!m->layers || !m->n_full || !m->n_stream || !ld.used) rc = util_err(err, errlen, "out of memory");
        if (!rc) rc = load_weights(m, &ld);
        elog_progress_end(&ld.progress);
        free(ld.used);
    }
    if (!rc && alloc_acts(m) != 0)
        rc = util_err(err, errlen, "out of %s memory for activations of %d tokens", b->name, max_tokens);
    safetensors_free(st); /* weights were copied into the backend */
    if (rc) {
        model_free(m);
        return -1;
    }
    *out = m;
    return 0;
}

void model_free(struct model *m) {
    if (!m) return;
    struct backend *b = m->b;
    void (*fr)(struct backend *, void *) = b->ops->free;
    if (m->layers) {
        for (int l = 0; l < m->cfg.n_layers; l++) {
            struct layer_weights *w = &m->layers[l];
            void *ps[] = {w->attn_norm, w->wqkv, w->bqkv, w->wo, w->bo, w->ffn_norm, w->w_gateup, w->w_down};
            for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) fr(b, ps[i]);
        }
    }
    if (m->lm_head != m->tok_embed) fr(b, m->lm_head);
    fr(b, m->tok_embed);
    fr(b, m->final_norm);
    void *acts[] = {m->x, m->x2, m->h, m->qkv, m->att, m->o, m->gu, m->act, m->inv_freq};
    for (size_t i = 0; i < sizeof acts / sizeof acts[0]; i++) fr(b, acts[i]);
    free(m->layers);
    free(m->n_full);
    free(m->n_stream);
    free(m);
}

/* the residual stream's two buffers trade places (after a norm_matmul) */
static void swap_ptr(void **a, void **b) {
    void *t = *a;
    *a = *b, *b = t;
}

/* The ops of one forward pass (everything after begin_step). */
static void forward_ops(struct model *m, struct kv_cache *kv, const struct fwd_batch *batch, float *logits) {
    const struct model_config *c = &m->cfg;
    const struct backend_ops *op = m->b->ops;
    struct backend *b = m->b;
    int T = batch->n_tokens;
    int D = c->dim, F = c->hidden_dim, H = c->n_heads, KV = c->n_kv_heads, hd = c->head_dim;
    int QKV = (H + 2 * KV) * hd;
    /* the residual stream: in m->x, updated in place by add_rmsnorm; with fused_norm it moves
     * between m->x and m->x2 (each norm_matmul writes x + o to the other buffer) */
    /* fused_norm: after a layer, o is still to be added to cur (h is stale): the next
     * norm_matmul, or the final add_rmsnorm, does it */
    void *cur = m->x, *alt = m->x2;
    op->embed(b, cur, m->tok_embed, D);
    op->rmsnorm(b, m->h, cur, m->layers[0].attn_norm, T, D, c->norm_eps);
    for (int l = 0; l < c->n_layers; l++) {
        const struct layer_weights *w = &m->layers[l];
        struct attn_layer L = {.n_heads = H, .n_kv_heads = KV, .head_dim = hd, .n_full = m->n_full[l],
                               .n_stream = m->n_stream[l], .block_size = kv->block_size, .sink = kv->sink,
                               .recent = kv->recent, .sliding_window = c->sliding_window,
                               .scale = 1.0f / sqrtf((float)hd), .k_full = kv->k_full[l], .v_full = kv->v_full[l],
                               .k_stream = kv->k_stream[l], .v_stream = kv->v_stream[l]};
        // attention block (h = rmsnorm(x) on entry): x += o(attn(rope(q), rope(k), v)), h = rmsnorm(x)
        if (m->fused_norm && l > 0) {
            op->norm_matmul(b, m->qkv, m->gu, m->h, alt, cur, m->o, w->attn_norm, c->norm_eps, w->wqkv, w->bqkv, T,
                            QKV, D, false);
            swap_ptr(&cur, &alt);
        } else {
            op->matmul(b, m->qkv, m->h, w->wqkv, w->bqkv, T, QKV, D);
        }
        if (op->rope_attention) {
            op->rope_attention(b, m->att, m->qkv, QKV, &L, m->inv_freq);
        } else {
            op->rope(b, m->qkv, H + KV, hd, QKV, m->inv_freq);
            op->attention(b, m->att, m->qkv, QKV, &L);
        }
        op->matmul(b, m->o, m->att, w->wo, w->bo, T, D, H * hd);
        // MLP block: x += down(silu(gate(h)) * up(h)), then h = rmsnorm(x) for the next layer
        if (m->fused_norm) {
            op->norm_matmul(b, m->fused_swiglu ? m->act : m->gu, m->gu, m->h, alt, cur, m->o, w->ffn_norm,
                            c->norm_eps, w->w_gateup, NULL, T, m->fused_swiglu ? F : 2 * F, D, m->fused_swiglu);
            swap_ptr(&cur, &alt);
            if (!m->fused_swiglu) op->silu_mul(b, m->act, m->gu, T, F);
        } else {
            op->add_rmsnorm(b, m->h, cur, m->o, w->ffn_norm, T, D, c->norm_eps);
            if (m->fused_swiglu) {
                op->matmul_swiglu(b, m->act, m->gu, m->h, w->w_gateup, T, F, D);
            } else {
                op->matmul(b, m->gu, m->h, w->w_gateup, NULL, T, 2 * F, D);
                op->silu_mul(b, m->act, m->gu, T, F);
            }
        }
        op->matmul(b, m->o, m->act, w->w_down, NULL, T, D, F);
        if (!m->fused_norm) {
            const void *next_norm = l + 1 < c->n_layers ? m->layers[l + 1].attn_norm : m->final_norm;
            op->add_rmsnorm(b, m->h, cur, m->o, next_norm, T, D, c->norm_eps);
        }
    }
    if (m->fused_norm && c->n_layers > 0) op->add_rmsnorm(b, m->h, cur, m->o, m->final_norm, T, D, c->norm_eps);
    if (batch->n_logits == 0) return;
    // LM head, only for the rows that sample (h already holds the final norm)
    op->get_rows(b, m->o, m->h, D);
    op->logits(b, batch->argmax_out && batch->skip_logits ? NULL : logits, m->o, m->lm_head, batch->n_logits,
               c->vocab_size, D);
    if (batch->argmax_out) op->argmax(b, batch->argmax_out, batch->n_logits, c->vocab_size);
}

int model_forward(struct model *m, struct kv_cache *kv, const struct fwd_batch *batch, float *logits) {
    const struct backend_ops *op = m->b->ops;
    struct backend *b = m->b;
    int T = batch->n_tokens;
    if (T < 1 || T > m->max_tokens || batch->n_logits > T) return BACKEND_ERR_ARG;
    int rc = op->begin_step(b, batch);
    if (rc) return rc;
    int g = BACKEND_GRAPH_OFF;
    /* graphs by batch size, negative when only the argmax ids go to the host */
    int key = batch->argmax_out && batch->skip_logits ? -T : T;
    if (op->graph_begin && batch->n_seqs == T && batch->n_logits == T)
        g = op->graph_begin(b, key, logits, (size_t)T * m->cfg.vocab_size, batch->argmax_out);
    if (g != BACKEND_GRAPH_REPLAYED) {
        forward_ops(m, kv, batch, logits);
        if (g == BACKEND_GRAPH_CAPTURING && op->graph_end(b, key) != 0) forward_ops(m, kv, batch, logits);
    }
    return op->sync(b);
}
