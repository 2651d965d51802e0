/* model: a decoder-only transformer (Llama / Mistral / Qwen2 family) loaded from a Hugging Face
 * model directory into a backend, and its forward pass over a flattened batch written once in
 * terms of backend ops. Owned and called by the engine thread only. */
#ifndef DUO_MODEL_H
#define DUO_MODEL_H

#include "engine/backend.h"
#include "engine/kv_cache.h"
#include "engine/model_config.h"
#include "engine/safetensors.h"

struct layer_weights {
    void *attn_norm;  // (dim)
    void *wqkv;       // (n_heads*hd + 2*n_kv*hd, dim): q, k, v projections stacked by rows
    void *bqkv;       // (n_heads*hd + 2*n_kv*hd) or NULL
    void *wo, *bo;    // (dim, n_heads*hd), bias (dim) or NULL
    void *ffn_norm;   // (dim)
    void *w_gateup;   // (2*hidden_dim, dim): gate then up, or interleaved by 8 rows (fused_swiglu)
    void *w_down;     // (dim, hidden_dim)
};

struct model {
    struct model_config cfg;
    struct backend *b;
    void *tok_embed;              // (vocab, dim)
    void *lm_head;                // (vocab, dim); == tok_embed when tied
    void *final_norm;             // (dim)
    struct layer_weights *layers; // [n_layers]
    int *n_full, *n_stream;       // [n_layers] retrieval / streaming KV heads (retrieval first)
    void *inv_freq;               // (head_dim/2) f32 RoPE frequencies
    int max_tokens;               // activation buffers hold this many tokens per step
    bool fused_swiglu;            // w_gateup's rows in matmul_swiglu's order, and the MLP runs through it
    bool fused_norm;              // the norms feed their GEMMs through norm_matmul (residual in x / x2)
    // activations, backend memory, [max_tokens][...]
    void *x, *h;     // residual stream, normalised (dim)
    void *x2;        // the residual's second buffer (fused_norm), else NULL
    void *qkv;       // (n_heads*hd + 2*n_kv*hd): q | k | v of each token
    void *att, *o;   // attention output (n_heads*hd), projection output (dim)
    void *gu, *act;  // gate | up (2*hidden_dim), silu(gate) * up (hidden_dim)
};

/* Loads DIR into backend b with activation buffers for max_tokens tokens per step. On error
 * returns -1 with a one-line message naming the file and the problem. */
int model_load(struct model **out, const char *dir, struct backend *b, int max_tokens, char *err, size_t errlen);
/* The same, with DuoAttention: streaming[l * n_kv_heads + h] != 0 makes KV head h of layer l a
 * streaming head; each layer's heads are reordered at load so retrieval heads come first. */
int model_load_duo(struct model **out, const char *dir, struct backend *b, int max_tokens, const uint8_t *streaming,
                   char *err, size_t errlen);
void model_free(struct model *m);

/* The KV pool geometry this model needs. */
void model_kv_geometry(const struct model *m, int block_size, int sink, int recent, struct kv_geometry *g);

/* Computes RoPE inverse frequencies (head_dim/2 floats) as HF does, in f32. */
void model_rope_inv_freq(const struct model_config *cfg, float *inv_freq);

/* Runs the batch: appends its K/V to kv (the block table must cover every position) and writes
 * logits for batch->logit_rows into host memory logits[n_logits][vocab]. */
int model_forward(struct model *m, struct kv_cache *kv, const struct fwd_batch *batch, float *logits);

#endif
