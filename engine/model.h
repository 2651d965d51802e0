/* model: a decoder-only transformer (Llama / Mistral / Qwen2 family) loaded from a Hugging Face
 * model directory into a backend, and its forward pass over a flattened batch written once in
 * terms of backend ops. Owned and called by the engine thread only.
 * Tensor parallelism (Megatron): with n ranks (engine/tp.h) each rank holds a struct model of
 * its own shard: the q/k/v rows of its heads and the o_proj columns of the same heads, gate|up
 * rows and down_proj columns of its n-th of the MLP, the LM head rows of its n-th of the
 * vocabulary; embeddings and norms are whole on every rank. The residual stream is the same on
 * every rank: o_proj and down_proj outputs are summed over the ranks (one all-reduce each), the
 * logits gathered from the ranks' vocabulary parts onto rank 0, which samples. Rank 0's model is
 * the one the engine holds; it owns the others.
 * Two files, calls running one way: engine/model_tp.c holds the entries below that act on the
 * whole model (load, free, forward, the KV pools and their budget), over its ranks (rank 0 alone
 * without tensor parallelism); engine/model.c holds one rank (loading its shard, its step, its
 * LM head) through engine/model_impl.h. */
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

/* What one rank holds of the model (everything, with one rank). */
struct model_shard {
    int rank, size;          // this rank of `size` (0 of 1 without tensor parallelism)
    int n_heads, n_kv_heads; // its query and KV heads
    int hidden_dim;          // its MLP columns
    int vocab_lo, vocab_n;   // its LM head rows [vocab_lo, vocab_lo + vocab_n)
    int vocab_part;          // ceil(vocab / size): every rank's stride in the gathered logits
    int *n_full, *n_stream;  // [n_layers] its retrieval / streaming KV heads (retrieval first)
    struct comm *comm;       // NULL without tensor parallelism
};

struct model_tp; // the other ranks (engine/model_tp.c)

struct model {
    struct model_config cfg;
    struct backend *b;
    struct model_shard sh;
    struct model_tp *tp;          // rank 0 with tensor parallelism: the group and the other ranks; else NULL
    void *tok_embed;              // (vocab, dim)
    void *lm_head;                // (vocab, dim); == tok_embed when tied
    void *final_norm;             // (dim)
    struct layer_weights *layers; // [n_layers]
    int *n_full, *n_stream;       // [n_layers] retrieval / streaming KV heads of the whole model
    void *inv_freq;               // (head_dim/2) f32 RoPE frequencies
    int max_tokens;               // activation buffers hold this many tokens per step
    enum kv_dtype kv_dtype;       // the KV pools' elements (model_load_opts)
    float *k_scale, *v_scale;     // KV_DTYPE_FP8_E4M3: [n_layers][sh.n_kv_heads] host, the rank's heads in
                                  // pool order (retrieval first): the pools' scales; else NULL
    bool fused_swiglu;            // w_gateup's rows in matmul_swiglu's order, and the MLP runs through it
    bool fused_norm;              // the norms feed their GEMMs through norm_matmul (residual in x / x2)
    // activations, backend memory, [max_tokens][...]
    void *x, *h;     // residual stream, normalised (dim)
    void *x2;        // the residual's second buffer (fused_norm), else NULL
    void *qkv;       // (n_heads*hd + 2*n_kv*hd): q | k | v of each token
    void *att, *o;   // attention output (n_heads*hd), projection output (dim)
    void *gu, *act;  // gate | up (2*hidden_dim), silu(gate) * up (hidden_dim)
    // tensor parallelism: the logits of the rank's vocabulary part and every rank's, f32 backend
    // memory, grown to the step's logits rows
    float *lg_part, *lg_all; // [rows][vocab_part], [size][rows][vocab_part]
    int lg_rows;
    bool failed; // a rank failed: the communicators are aborted, every later step fails
};

/* How to load (model_load_with). */
struct model_load_opts {
    int max_tokens;           // activation buffers hold this many tokens per step
    const uint8_t *streaming; // [n_layers][n_kv_heads] non-zero: a DuoAttention streaming head; or NULL
    int tensor_parallel_size; // ranks; <= 1: none
    int cuda_flags;           // BACKEND_CUDA_* of the other ranks' backends
    bool dummy;               // --load-format dummy: random weights from config.json alone (no safetensors)
    enum kv_dtype kv_dtype;   // the KV pools' elements (the backend must take them: backend_ops.kv_dtypes)
};

/* Loads DIR into backend b with activation buffers for max_tokens tokens per step. On error
 * returns -1 with a one-line message naming the file and the problem. */
int model_load(struct model **out, const char *dir, struct backend *b, int max_tokens, char *err, size_t errlen);
/* The same, with DuoAttention: streaming[l * n_kv_heads + h] != 0 makes KV head h of layer l a
 * streaming head; each layer's heads are reordered at load so retrieval heads come first. */
int model_load_duo(struct model **out, const char *dir, struct backend *b, int max_tokens, const uint8_t *streaming,
                   char *err, size_t errlen);
/* The general form: options above; with tensor parallelism b is rank 0's backend and the other
 * ranks' backends, threads and communicators are made here (and freed by model_free). Dummy
 * weights are the same for the same config.json on every load and every rank count. */
int model_load_with(struct model **out, const char *dir, struct backend *b, const struct model_load_opts *o,
                    char *err, size_t errlen);
void model_free(struct model *m);

/* Tensor-parallel ranks (1 without). */
int model_tp_size(const struct model *m);
/* True once a rank has failed: the model cannot run another step (the server should stop). */
bool model_failed(const struct model *m);

/* The KV pools for this model, on every rank (each rank its heads' arrays), of the model's KV
 * dtype and scales. */
int model_kv_cache_init(const struct model *m, struct kv_cache *kv, int block_size, int sink, int recent,
                        int n_blocks, int n_slots);
/* On a backend that plans from device memory: the bytes the KV pools of the whole model may take
 * so that every rank stays within util of its device after its weights and activations (less a
 * reserve per device); the ranks' shares of a block or slot decide, so the rank with the least
 * room sets the size. Returns 0, or -1 with a message when some device has no room. */
int model_kv_budget(const struct model *m, int block_size, int sink, int recent, float util, double *budget,
                    char *err, size_t errlen);

/* The prefill attention's waves on this model's backend (backend_ops.prefill_blocks): the blocks
 * that run at once, 0 when it has none (the CPU), and the tokens a block takes (*block_tokens);
 * heads[l] (n_layers of them): layer l's retrieval KV heads on the rank that holds the most, whose
 * blocks the layer waits for (the whole layer's without tensor parallelism). */
int model_prefill_waves(const struct model *m, int *block_tokens, int *heads);

/* The KV pool geometry of the whole model (all ranks' heads). */
void model_kv_geometry(const struct model *m, int block_size, int sink, int recent, struct kv_geometry *g);

/* Computes RoPE inverse frequencies (head_dim/2 floats) as HF does, in f32. */
void model_rope_inv_freq(const struct model_config *cfg, float *inv_freq);

/* Runs the batch: appends its K/V to kv (the block table must cover every position) and writes
 * logits for batch->logit_rows into host memory logits[n_logits][vocab]. */
int model_forward(struct model *m, struct kv_cache *kv, const struct fwd_batch *batch, float *logits);

#endif
