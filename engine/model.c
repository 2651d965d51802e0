/* model: one rank's model: loading its shard of a Hugging Face checkpoint (or dummy weights) into
 * its backend, and its forward pass over a flattened batch in terms of backend ops, the LM head
 * gathered over the ranks under tensor parallelism. The whole model's entries are model_tp.c's. */
#include "engine/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/elog.h"
#include "engine/kv_cache_impl.h"
#include "engine/model_impl.h"
#include "engine/tp.h"
#include "engine/util.h"

void model_kv_geometry(const struct model *m, int block_size, int sink, int recent, struct kv_geometry *g) {
    *g = (struct kv_geometry){m->cfg.n_layers, m->cfg.head_dim, block_size, m->n_full, m->n_stream, sink, recent,
                              m->kv_dtype};
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
 * except buffers HF itself ignores. With dummy weights there is no checkpoint: each tensor is
 * made up (dummy_fill) with the shape the config implies. */
struct loader {
    const char *dir;
    const struct safetensors *st; // NULL with dummy weights
    struct backend *b;
    char *used; // [n_tensors]
    bool dummy;
    bool progress_on;
    struct elog_progress progress; // "layers loaded: i/L"
    char *err;
    size_t errlen;
};

/* The part of a tensor a rank loads: along `axis` (0: rows, 1: columns), n runs of `len` rows or
 * columns starting at start[i], one after another. A NULL selection is the whole tensor. The
 * DuoAttention head order and the tensor-parallel shards are both selections of head groups. */
struct tsel {
    int axis;
    int n;
    const int64_t *start; // [n]
    int64_t len;
};

/* Dummy weights (--load-format dummy): element i of a tensor is a hash of (its name, i), so the
 * values do not depend on the load order or on which rank reads which part. Uniform with the
 * spread of a sensible initialisation (norms 1; embeddings std 1; a weight of K columns std
 * 1/sqrt(K), so activations keep their scale through the layers; biases within 0.1), in bf16. */
#define DUMMY_SEED 0x64756f7365727665ull

static uint64_t dummy_mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

static void dummy_fill(const struct st_tensor *t, int64_t first, int64_t n, uint16_t *out) {
    if (ends_with(t->name, "norm.weight")) {
        for (int64_t i = 0; i < n; i++) out[i] = 0x3f80; /* 1.0 */
        return;
    }
    float a = ends_with(t->name, ".bias")                        ? 0.1f
              : !strcmp(t->name, "model.embed_tokens.weight") ? sqrtf(3.0f)
                                                              : sqrtf(3.0f / (float)t->shape[1]);
    uint64_t seed = DUMMY_SEED;
    for (const char *p = t->name; *p; p++) seed = (seed ^ (uint8_t)*p) * 0x100000001b3ull; /* FNV-1a */
    for (int64_t i = 0; i < n; i++) {
        float u = (float)(dummy_mix(seed + (uint64_t)(first + i)) >> 40) * 0x1p-24f;
        out[i] = util_f32_to_bf16((2.0f * u - 1.0f) * a);
    }
}

/* Elements [first, first + n) of t into dst (t's dtype). */
static void src_read(const struct st_tensor *t, unsigned char *dst, int64_t first, int64_t n) {
    size_t es = st_dtype_size(t->dtype);
    if (t->data) memcpy(dst, (const unsigned char *)t->data + (size_t)first * es, (size_t)n * es);
    else dummy_fill(t, first, n, (uint16_t *)dst);
}

/* t's shape (and size) after the selection; data NULL. */
static struct st_tensor sel_shape(const struct st_tensor *t, const struct tsel *sel) {
    struct st_tensor o = *t;
    o.data = NULL;
    if (sel) o.shape[sel->axis] = sel->n * sel->len;
    o.nbytes = (size_t)st_tensor_numel(&o) * st_dtype_size(t->dtype);
    return o;
}

/* Writes the selected part of t into dst, in t's dtype. */
static void select_into(unsigned char *dst, const struct st_tensor *t, const struct tsel *sel) {
    size_t es = st_dtype_size(t->dtype);
    int64_t rows = t->shape[0], cols = t->n_dims > 1 ? t->shape[1] : 1;
    if (!sel) {
        src_read(t, dst, 0, rows * cols);
    } else if (sel->axis == 0) {
        int64_t run = sel->len * cols;
        for (int i = 0; i < sel->n; i++) src_read(t, dst + (size_t)(i * run) * es, sel->start[i] * cols, run);
    } else {
        for (int64_t r = 0; r < rows; r++)
            for (int i = 0; i < sel->n; i++)
                src_read(t, dst + (size_t)((r * sel->n + i) * sel->len) * es, r * cols + sel->start[i], sel->len);
    }
}

/* The selected part of t: t's own data when that is all of it, else a malloc'd copy in *owned. */
static const void *selected_data(const struct st_tensor *t, const struct tsel *sel, unsigned char **owned) {
    *owned = NULL;
    if (!sel && t->data) return t->data;
    size_t bytes = sel_shape(t, sel).nbytes;
    unsigned char *buf = malloc(bytes ? bytes : 1);
    if (!buf) return NULL;
    select_into(buf, t, sel);
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
    for (int i = 0, seen = 0; !ld->dummy && i < n; i++) {
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
    if (ld->dummy) dt = ST_DTYPE_BF16;
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

/* Appends t's selected rows to sk, converting through f32 when the dtypes differ. */
static int stack_append(struct stack *sk, const struct st_tensor *t, const struct tsel *sel) {
    size_t es = st_dtype_size(sk->dtype), rb = (size_t)(sk->cols ? sk->cols : 1) * es;
    struct st_tensor src = sel_shape(t, sel);
    int64_t first = sk->filled;
    sk->filled += src.shape[0];
    unsigned char *dst = sk->data + (size_t)first * rb;
    if (t->dtype == sk->dtype && !sk->group) {
        select_into(dst, t, sel);
        return BACKEND_OK;
    }
    unsigned char *owned, *conv = NULL;
    src.data = selected_data(t, sel, &owned);
    if (!src.data) return BACKEND_ERR_OOM;
    const unsigned char *rows = src.data; // t's rows in the stack's dtype
    if (t->dtype != sk->dtype) {
        int64_t n = st_tensor_numel(&src);
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
        for (int64_t r = 0; r < src.shape[0]; r++)
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

static int upload_selected(struct loader *ld, const struct st_tensor *t, const struct tsel *sel, void **dst,
                           struct stack *sk) {
    if (sk) return stack_append(sk, t, sel);
    unsigned char *owned;
    struct st_tensor tmp = sel_shape(t, sel);
    tmp.data = selected_data(t, sel, &owned);
    if (!tmp.data) return BACKEND_ERR_OOM;
    int rc = ld->b->ops->weight_upload(ld->b, &tmp, dst);
    free(owned);
    return rc;
}

/* Marks a checkpoint tensor as accounted for without loading it (one another rank loads). */
static void mark_used(struct loader *ld, const char *name) {
    const struct st_tensor *t = ld->st ? safetensors_find(ld->st, name) : NULL;
    if (t) ld->used[t - ld->st->tensors] = 1;
}

static int load_tensor_p(struct loader *ld, void **dst, const char *name, int n_dims, int64_t d0, int64_t d1,
                         const struct tsel *sel, struct stack *sk);

static int load_tensor(struct loader *ld, void **dst, const char *name, int n_dims, int64_t d0, int64_t d1) {
    return load_tensor_p(ld, dst, name, n_dims, d0, d1, NULL, NULL);
}

/* Loads (the selected part of) one tensor into *dst, or appends it to sk when sk is not NULL. */
static int load_tensor_p(struct loader *ld, void **dst, const char *name, int n_dims, int64_t d0, int64_t d1,
                         const struct tsel *sel, struct stack *sk) {
    struct st_tensor made = {.name = (char *)name, .dtype = ST_DTYPE_BF16, .n_dims = n_dims, .shape = {d0, d1},
                             .file = ld->dir};
    const struct st_tensor *t = ld->dummy ? &made : safetensors_find(ld->st, name);
    if (!t) return util_err(ld->err, ld->errlen, "%s: tensor \"%s\" is missing", ld->dir, name);
    if (!ld->dummy) ld->used[t - ld->st->tensors] = 1;
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
    if (upload_selected(ld, t, sel, dst, sk) != BACKEND_OK)
        return util_err(ld->err, ld->errlen, "%s: out of %s memory loading \"%s\"", t->file, ld->b->name, name);
    return 0;
}

/* The LM head: the rank's vocabulary rows (all of them with one rank; tied to the embedding
 * table when the config says so, as a copy of its rows under tensor parallelism). */
static int load_lm_head(struct model *m, struct loader *ld) {
    const struct model_config *c = &m->cfg;
    const struct model_shard *sh = &m->sh;
    int64_t lo = sh->vocab_lo;
    struct tsel rows = {0, 1, &lo, sh->vocab_n};
    const struct tsel *sel = sh->size > 1 ? &rows : NULL;
    const char *name = c->tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
    if (c->tie_embeddings) mark_used(ld, "lm_head.weight"); /* some tied checkpoints still carry a copy; HF ignores it */
    if (c->tie_embeddings && sh->size == 1) {
        m->lm_head = m->tok_embed;
        return 0;
    }
    if (sh->vocab_n == 0) { /* more ranks than rows: this one holds none */
        mark_used(ld, name);
        return 0;
    }
    return load_tensor_p(ld, &m->lm_head, name, 2, c->vocab_size, c->dim, sel, NULL);
}

/* Layer l's selections for the rank: the q/k/v rows and o_proj columns of its KV heads (their
 * query groups), in the rank's head order; NULL when that is every head in checkpoint order. */
struct head_sels {
    int64_t *q_start, *kv_start; // [kv heads of the rank]
    struct tsel q_rows, kv_rows, o_cols;
    bool identity;
};

static void head_sels_set(struct head_sels *hs, const struct model *m, const int *heads) {
    const struct model_config *c = &m->cfg;
    int kvr = m->sh.n_kv_heads, hd = c->head_dim, group = c->n_heads / c->n_kv_heads;
    hs->identity = kvr == c->n_kv_heads;
    for (int j = 0; j < kvr; j++) {
        hs->identity &= heads[j] == j;
        hs->q_start[j] = (int64_t)heads[j] * group * hd;
        hs->kv_start[j] = (int64_t)heads[j] * hd;
    }
    hs->q_rows = (struct tsel){0, kvr, hs->q_start, (int64_t)group * hd};
    hs->kv_rows = (struct tsel){0, kvr, hs->kv_start, hd};
    hs->o_cols = (struct tsel){1, kvr, hs->q_start, (int64_t)group * hd};
}

static int load_weights(struct model *m, struct loader *ld, const int *heads) {
    const struct model_config *c = &m->cfg;
    const struct model_shard *sh = &m->sh;
    int64_t D = c->dim, F = c->hidden_dim, V = c->vocab_size, Fr = sh->hidden_dim;
    int64_t QD = (int64_t)c->n_heads * c->head_dim, KD = (int64_t)c->n_kv_heads * c->head_dim;
    int64_t QDr = (int64_t)sh->n_heads * c->head_dim, KDr = (int64_t)sh->n_kv_heads * c->head_dim;
    if (load_tensor(ld, &m->tok_embed, "model.embed_tokens.weight", 2, V, D)) return -1;
    if (load_tensor(ld, &m->final_norm, "model.norm.weight", 1, D, 0)) return -1;
    if (load_lm_head(m, ld)) return -1;
    /* the parts of the stacked weights, in stacking order */
    static const char *const qkv_w[] = {"self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                        "self_attn.v_proj.weight"};
    static const char *const qkv_b[] = {"self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"};
    static const char *const gu_w[] = {"mlp.gate_proj.weight", "mlp.up_proj.weight"};
    struct stack qkv = {0}, qkvb = {0}, gu = {0};
    struct head_sels hs = {.q_start = malloc(sizeof(int64_t) * (size_t)sh->n_kv_heads),
                           .kv_start = malloc(sizeof(int64_t) * (size_t)sh->n_kv_heads)};
    int rc = hs.q_start && hs.kv_start ? 0 : util_err(ld->err, ld->errlen, "out of memory");
    /* the rank's MLP columns: gate and up rows, down_proj columns */
    int64_t f0 = (int64_t)sh->rank * Fr;
    struct tsel f_rows = {0, 1, &f0, Fr}, f_cols = {1, 1, &f0, Fr};
    const struct tsel *fr = sh->size > 1 ? &f_rows : NULL, *fc = sh->size > 1 ? &f_cols : NULL;
    m->fused_swiglu = ld->b->ops->matmul_swiglu && Fr % 8 == 0;
    m->fused_norm = ld->b->ops->norm_matmul != NULL;
    for (int l = 0; !rc && l < c->n_layers; l++) {
        struct layer_weights *w = &m->layers[l];
        char n[160];
        head_sels_set(&hs, m, heads + (size_t)l * sh->n_kv_heads);
        const struct tsel *qs = hs.identity ? NULL : &hs.q_rows, *ks = hs.identity ? NULL : &hs.kv_rows;
        const struct tsel *os = hs.identity ? NULL : &hs.o_cols;
#define LT(dst, suffix, nd, a, b, sel, sk)                                          \
    do {                                                                            \
        snprintf(n, sizeof n, "model.layers.%d.%s", l, suffix);                     \
        if (!rc) rc = load_tensor_p(ld, dst, n, nd, a, b, sel, sk);                 \
    } while (0)
        LT(&w->attn_norm, "input_layernorm.weight", 1, D, 0, NULL, NULL);
        LT(&w->ffn_norm, "post_attention_layernorm.weight", 1, D, 0, NULL, NULL);
        if (!rc && (stack_init(ld, &qkv, l, qkv_w, 3, QDr + 2 * KDr, D) || stack_init(ld, &gu, l, gu_w, 2, 2 * Fr, D) ||
                    (c->qkv_bias && stack_init(ld, &qkvb, l, qkv_b, 3, QDr + 2 * KDr, 0))))
            rc = util_err(ld->err, ld->errlen, "out of memory");
        gu.group = m->fused_swiglu ? 8 : 0; /* the row order matmul_swiglu reads */
        for (int i = 0; i < 3; i++) LT(NULL, qkv_w[i], 2, i ? KD : QD, D, i ? ks : qs, &qkv);
        LT(&w->wo, "self_attn.o_proj.weight", 2, D, QD, os, NULL);
        for (int i = 0; c->qkv_bias && i < 3; i++) LT(NULL, qkv_b[i], 1, i ? KD : QD, 0, i ? ks : qs, &qkvb);
        if (c->o_bias && sh->rank == 0) LT(&w->bo, "self_attn.o_proj.bias", 1, D, 0, NULL, NULL);
        if (c->o_bias && sh->rank > 0) { /* added once, by rank 0, before the sum over the ranks */
            snprintf(n, sizeof n, "model.layers.%d.self_attn.o_proj.bias", l);
            mark_used(ld, n);
        }
        for (int i = 0; i < 2; i++) LT(NULL, gu_w[i], 2, F, D, fr, &gu);
        LT(&w->w_down, "mlp.down_proj.weight", 2, D, F, fc, NULL);
        if (!rc) rc = stack_upload(ld, &qkv, &w->wqkv);
        if (!rc && c->qkv_bias) rc = stack_upload(ld, &qkvb, &w->bqkv);
        if (!rc) rc = stack_upload(ld, &gu, &w->w_gateup);
        if (!rc && ld->progress_on) elog_progress_step(&ld->progress, l + 1);
#undef LT
    }
    free(hs.q_start);
    free(hs.kv_start);
    free(qkv.data);
    free(qkvb.data);
    free(gu.data);
    if (rc) return -1;
    for (int i = 0; !ld->dummy && i < ld->st->n_tensors; i++) {
        const char *name = ld->st->tensors[i].name;
        if (ld->used[i] || ends_with(name, "rotary_emb.inv_freq")) continue;
        return util_err(ld->err, ld->errlen, "%s: unexpected tensor \"%s\" (not part of a %s with this config.json)",
                        ld->st->tensors[i].file, name, model_arch_name(c->arch));
    }
    return 0;
}

static int alloc_acts(struct model *m) {
    const struct model_config *c = &m->cfg;
    const struct model_shard *sh = &m->sh;
    size_t T = (size_t)m->max_tokens, es = m->b->ops->act_size;
    size_t qd = (size_t)sh->n_heads * c->head_dim, kd = (size_t)sh->n_kv_heads * c->head_dim;
    struct {
        void **p;
        size_t n;
    } bufs[] = {{&m->x, T * c->dim},   {&m->h, T * c->dim},   {&m->qkv, T * (qd + 2 * kd)},
                {&m->att, T * qd},     {&m->o, T * c->dim},   {&m->gu, T * 2 * sh->hidden_dim},
                {&m->act, T * sh->hidden_dim}, {&m->x2, m->fused_norm ? T * c->dim : 0}};
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

/* The fp8 KV pools' scales of the rank's heads: 1 (as vLLM's kv_cache_dtype=fp8 without
 * calibration). */
static int kv_scales(struct model *m) {
    size_t n = (size_t)m->cfg.n_layers * m->sh.n_kv_heads;
    m->k_scale = malloc(sizeof(float) * (n ? n : 1));
    m->v_scale = malloc(sizeof(float) * (n ? n : 1));
    if (!m->k_scale || !m->v_scale) return -1;
    for (size_t i = 0; i < n; i++) m->k_scale[i] = m->v_scale[i] = 1.0f;
    return 0;
}

/* The rank's share of the model's shape. */
static void shard_init(struct model *m, const struct model_rank_spec *spec) {
    const struct model_config *c = &m->cfg;
    int n = spec->size, part = (c->vocab_size + n - 1) / n;
    int lo = spec->rank * part < c->vocab_size ? spec->rank * part : c->vocab_size;
    m->sh.rank = spec->rank;
    m->sh.size = n;
    m->sh.n_heads = c->n_heads / n;
    m->sh.n_kv_heads = c->n_kv_heads / n;
    m->sh.hidden_dim = c->hidden_dim / n;
    m->sh.vocab_part = part;
    m->sh.vocab_lo = lo;
    m->sh.vocab_n = c->vocab_size - lo < part ? c->vocab_size - lo : part;
    m->sh.comm = spec->comm;
}

/* The rank's KV heads and every layer's retrieval heads (the whole model's and the rank's). */
static int shard_heads(struct model *m, const struct model_load_opts *o, int **heads) {
    const struct model_config *c = &m->cfg;
    int L = c->n_layers, n = m->sh.size, kvr = m->sh.n_kv_heads;
    int *all = malloc(sizeof(int) * (size_t)L * c->n_kv_heads), *nf = malloc(sizeof(int) * (size_t)L * n);
    *heads = malloc(sizeof(int) * (size_t)L * kvr);
    if (!all || !nf || !*heads || tp_assign_heads(L, c->n_kv_heads, n, o->streaming, all, nf) != 0) {
        free(all), free(nf);
        return -1;
    }
    for (int l = 0; l < L; l++) {
        memcpy(*heads + (size_t)l * kvr, all + ((size_t)l * n + m->sh.rank) * kvr, sizeof(int) * (size_t)kvr);
        m->n_full[l] = 0;
        for (int r = 0; r < n; r++) m->n_full[l] += nf[l * n + r];
        m->n_stream[l] = c->n_kv_heads - m->n_full[l];
        m->sh.n_full[l] = nf[l * n + m->sh.rank];
        m->sh.n_stream[l] = kvr - m->sh.n_full[l];
    }
    free(all);
    free(nf);
    return 0;
}

int model_load_rank(struct model **out, const char *dir, struct backend *b, const struct model_load_opts *o,
                    const struct model_rank_spec *spec, char *err, size_t errlen) {
    *out = NULL;
    struct model *m = calloc(1, sizeof *m);
    if (!m) return util_err(err, errlen, "out of memory");
    m->b = b;
    m->max_tokens = o->max_tokens;
    m->kv_dtype = o->kv_dtype;
    struct safetensors *st = NULL;
    int *heads = NULL;
    int rc = model_config_load(&m->cfg, dir, err, errlen);
    if (!rc) rc = tp_check(&m->cfg, spec->size, err, errlen);
    if (!rc && !o->dummy) rc = safetensors_open_dir(&st, dir, err, errlen);
    if (!rc) {
        int L = m->cfg.n_layers;
        shard_init(m, spec);
        m->layers = calloc((size_t)L, sizeof *m->layers);
        m->n_full = calloc((size_t)L, sizeof *m->n_full);
        m->n_stream = calloc((size_t)L, sizeof *m->n_stream);
        m->sh.n_full = calloc((size_t)L, sizeof *m->sh.n_full);
        m->sh.n_stream = calloc((size_t)L, sizeof *m->sh.n_stream);
        struct loader ld = {dir, st, b, calloc((size_t)(st ? st->n_tensors : 0) + 1, 1), o->dummy, spec->progress,
                            {0}, err, errlen};
        if (!m->layers || !m->n_full || !m->n_stream || !m->sh.n_full || !m->sh.n_stream || !ld.used ||
            shard_heads(m, o, &heads) != 0)
            rc = util_err(err, errlen, "out of memory");
        if (ld.progress_on) {
            elog_progress_begin(&ld.progress, "layers loaded:", L);
            ld.progress.inplace &= L >= 8; /* a small model loads faster than a redraw */
        }
        if (!rc) rc = load_weights(m, &ld, heads);
        if (ld.progress_on) elog_progress_end(&ld.progress);
        free(ld.used);
    }
    if (!rc && m->kv_dtype == KV_DTYPE_FP8_E4M3 && kv_scales(m) != 0) rc = util_err(err, errlen, "out of memory");
    if (!rc && alloc_acts(m) != 0)
        rc = util_err(err, errlen, "out of %s memory for activations of %d tokens", b->name, o->max_tokens);
    free(heads);
    safetensors_free(st); /* weights were copied into the backend */
    if (rc) {
        model_free_rank(m);
        return -1;
    }
    *out = m;
    return 0;
}

void model_free_rank(struct model *m) {
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
    void *acts[] = {m->x, m->x2, m->h, m->qkv, m->att, m->o, m->gu, m->act, m->inv_freq, m->lg_part, m->lg_all};
    for (size_t i = 0; i < sizeof acts / sizeof acts[0]; i++) fr(b, acts[i]);
    free(m->layers);
    free(m->k_scale);
    free(m->v_scale);
    free(m->n_full);
    free(m->n_stream);
    free(m->sh.n_full);
    free(m->sh.n_stream);
    free(m);
}

/* the residual stream's two buffers trade places (after a norm_matmul) */
static void swap_ptr(void **a, void **b) {
    void *t = *a;
    *a = *b, *b = t;
}

/* Tensor parallelism: x[n] = the sum of x over the ranks (after o_proj and down_proj, whose
 * inputs are split by columns). Nothing with one rank. */
static int reduce_ranks(struct model *m, void *x, size_t n) {
    struct comm *cm = m->sh.comm;
    if (!cm) return 0;
    return cm->ops->all_reduce_sum(cm, x, n, m->b->ops->act_size == 2 ? COMM_BF16 : COMM_F32) ? BACKEND_ERR_DEVICE : 0;
}

/* The LM head of one rank under tensor parallelism (h's logits rows in m->o): its vocabulary
 * part, gathered; rank 0 assembles the whole rows (and their argmax). Returns a status. */
static int lm_head_gather(struct model *m, const struct fwd_batch *batch, float *logits) {
    const struct backend_ops *op = m->b->ops;
    const struct model_shard *sh = &m->sh;
    int n = batch->n_logits, V = m->cfg.vocab_size, rc = 0;
    if (sh->vocab_n) rc = op->logits_to(m->b, m->lg_part, m->o, m->lm_head, n, sh->vocab_n, m->cfg.dim);
    if (rc) return rc;
    if (sh->comm->ops->all_gather(sh->comm, m->lg_all, m->lg_part, (size_t)n * sh->vocab_part, COMM_F32) != 0)
        return BACKEND_ERR_DEVICE;
    if (sh->rank != 0) return 0;
    rc = op->logits_assemble(m->b, batch->argmax_out && batch->skip_logits ? NULL : logits, m->lg_all, n, V,
                             sh->vocab_part);
    if (!rc && batch->argmax_out) op->argmax(m->b, batch->argmax_out, n, V);
    return rc;
}

/* The ops of one forward pass (everything after begin_step). Returns 0, or a backend status
 * when a collective failed (the ops themselves report through sync()). */
static int forward_ops(struct model *m, struct kv_cache *kv, const struct fwd_batch *batch, float *logits) {
    const struct model_config *c = &m->cfg;
    const struct model_shard *sh = &m->sh;
    const struct backend_ops *op = m->b->ops;
    struct backend *b = m->b;
    const struct kv_shard *ks = &kv->shards[sh->rank];
    int T = batch->n_tokens;
    /* the rank's heads and MLP columns (all of them with one rank) */
    int D = c->dim, F = sh->hidden_dim, H = sh->n_heads, KV = sh->n_kv_heads, hd = c->head_dim;
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
        struct attn_layer L = {.n_heads = H, .n_kv_heads = KV, .head_dim = hd, .n_full = sh->n_full[l],
                               .n_stream = sh->n_stream[l], .block_size = kv->block_size, .sink = kv->sink,
                               .recent = kv->recent, .sliding_window = c->sliding_window,
                               .scale = 1.0f / sqrtf((float)hd), .k_full = ks->k_full[l], .v_full = ks->v_full[l],
                               .k_stream = ks->k_stream[l], .v_stream = ks->v_stream[l], .kv_dtype = kv->dtype,
                               .k_scale = ks->k_scale ? ks->k_scale[l] : NULL,
                               .v_scale = ks->v_scale ? ks->v_scale[l] : NULL};
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
        int rc = reduce_ranks(m, m->o, (size_t)T * D);
        if (rc) return rc;
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
        if ((rc = reduce_ranks(m, m->o, (size_t)T * D)) != 0) return rc;
        if (!m->fused_norm) {
            const void *next_norm = l + 1 < c->n_layers ? m->layers[l + 1].attn_norm : m->final_norm;
            op->add_rmsnorm(b, m->h, cur, m->o, next_norm, T, D, c->norm_eps);
        }
    }
    if (m->fused_norm && c->n_layers > 0) op->add_rmsnorm(b, m->h, cur, m->o, m->final_norm, T, D, c->norm_eps);
    if (batch->n_logits == 0) return 0;
    // LM head, only for the rows that sample (h already holds the final norm)
    op->get_rows(b, m->o, m->h, D);
    if (sh->comm) return lm_head_gather(m, batch, logits);
    op->logits(b, batch->argmax_out && batch->skip_logits ? NULL : logits, m->o, m->lm_head, batch->n_logits,
               c->vocab_size, D);
    if (batch->argmax_out) op->argmax(b, batch->argmax_out, batch->n_logits, c->vocab_size);
    return 0;
}

/* Tensor parallelism on a device: waits for the rank's queued work without blocking in a
 * collective that a failed peer will never join (that peer aborts the group, and
 * comm->aborted() then cancels this rank's pending collectives). */
static int wait_rank(struct model *m) {
    const struct backend_ops *op = m->b->ops;
    struct comm *cm = m->sh.comm;
    if (!cm || !op->query) return 0;
    for (long spins = 0;; spins++) {
        int q = op->query(m->b);
        if (q != BACKEND_BUSY) return q;
        if (cm->ops->aborted(cm)) return BACKEND_ERR_DEVICE;
        if (spins > 256) nanosleep(&(struct timespec){0, 20000}, NULL);
    }
}

int model_step(struct model *m, struct kv_cache *kv, const struct fwd_batch *batch, float *logits) {
    const struct backend_ops *op = m->b->ops;
    struct backend *b = m->b;
    int T = batch->n_tokens;
    if (T < 1 || T > m->max_tokens || batch->n_logits > T) return BACKEND_ERR_ARG;
    int rc = op->begin_step(b, batch);
    if (rc) return rc;
    int g = BACKEND_GRAPH_OFF;
    /* graphs by batch size, negative when only the argmax ids go to the host; rank 0 delivers
     * the step's outputs, the other ranks none */
    int key = batch->argmax_out && batch->skip_logits ? -T : T;
    bool root = m->sh.rank == 0;
    if (op->graph_begin && batch->n_seqs == T && batch->n_logits == T)
        g = op->graph_begin(b, key, root ? logits : NULL, root ? (size_t)T * m->cfg.vocab_size : 0,
                            root ? batch->argmax_out : NULL);
    if (g != BACKEND_GRAPH_REPLAYED) {
        rc = forward_ops(m, kv, batch, logits);
        if (g == BACKEND_GRAPH_CAPTURING && op->graph_end(b, key) != 0 && !rc) rc = forward_ops(m, kv, batch, logits);
    }
    int w = wait_rank(m), s = op->sync(b);
    return rc ? rc : w ? w : s;
}
