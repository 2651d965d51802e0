/* backend: the table of operations the forward pass is written in. Two implementations:
 * backend_cpu.c (plain fp32 loops, the reference that defines correctness) and cuda/ (fast).
 * Pointers passed to ops are backend memory (host memory for the CPU backend, device memory
 * for CUDA); the activation dtype is the backend's business (fp32 on CPU, bf16 on CUDA), so
 * engine code never dereferences them. Called only from the engine thread. */
#ifndef DUO_BACKEND_H
#define DUO_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/safetensors.h"

/* One engine step: a flattened batch of tokens from several sequences. */
struct fwd_batch {
    int n_tokens;                // T
    int n_seqs;                  // S
    const int32_t *tokens;       // [T]
    const int32_t *pos;          // [T] absolute position of each token in its sequence
    const int32_t *seq_start;    // [S+1] tokens of sequence s are rows seq_start[s]..seq_start[s+1)
    const int32_t *block_indptr; // [S+1] sequence s's full-pool blocks: block_ids[indptr[s]..indptr[s+1])
    const int32_t *block_ids;    // block table, in position order (block i holds positions i*bs..)
    const int32_t *stream_slot;  // [S] streaming-pool slot of each sequence (unused without streaming heads)
    int n_logits;
    const int32_t *logit_rows;   // [n_logits] rows of T whose logits are computed
    int32_t *argmax_out;         // host [n_logits]: when set, the greedy id of each logits row
    bool skip_logits;            // with argmax_out: the logits themselves are not needed on the host
};

/* The KV pools' element type. KV_DTYPE_ACT (0) is the activation dtype (f32 on the CPU, bf16 on
 * CUDA); KV_DTYPE_FP8_E4M3 holds each K or V element x of KV head h as e4m3(x / scale[h])
 * (engine/fp8.h: nearest even, saturating), read back as e4m3 * scale[h]. */
enum kv_dtype { KV_DTYPE_ACT = 0, KV_DTYPE_BF16 = 1, KV_DTYPE_FP8_E4M3 = 2 };

/* Attention geometry and the KV of one layer. Its KV heads are ordered retrieval first:
 * heads 0..n_full-1 live in the full pool, heads n_full..n_kv_heads-1 in the streaming pool.
 * Full pool: [n_blocks][block_size][n_full][head_dim], indexed by the batch's block table.
 * Streaming pool: [n_slots][sink + recent][n_stream][head_dim]; rows 0..sink-1 hold positions
 * 0..sink-1, row sink + (p - sink) % recent holds position p >= sink.
 * Masks: retrieval heads are causal (and within sliding_window when set); a streaming head's
 * query at position i sees key j iff j <= i and (j < sink or i - j < recent). */
struct attn_layer {
    int n_heads, n_kv_heads, head_dim;
    int n_full, n_stream; // n_full + n_stream == n_kv_heads
    int block_size;
    int sink, recent;
    int sliding_window; // 0 = none; else key j visible to query i iff i - j < sliding_window
    float scale;        // 1/sqrt(head_dim)
    void *k_full, *v_full;
    void *k_stream, *v_stream;
    enum kv_dtype kv_dtype;         // the pools' elements; the attention rounds this batch's K/V to it too
    const float *k_scale, *v_scale; // KV_DTYPE_FP8_E4M3: [n_kv_heads] f32 backend memory, the order above
};

/* One draw of the sample op, in vLLM's order (engine/sampler.c defines it): logit bias (added
 * in list order), mask ids set to -inf (min_tokens: EOS and stop ids), repetition penalty over
 * the seen ids in the prompt or the output, presence / frequency penalties over those in the
 * output; then greedy (temperature < 1e-5: the first index of the maximum), else divide by the
 * temperature, keep the logits >= the top_k-th largest, softmax, drop probabilities below
 * min_p * the largest, keep the smallest set of most likely tokens whose mass reaches top_p
 * (ties at the cut kept), and return the first id, in id order, where the cumulative kept mass
 * exceeds u * the total. All pointers are host memory, borrowed for the call. */
struct sample_seen {
    int32_t id;
    int32_t count;     // occurrences in the output so far
    int32_t in_prompt; // 1: in the prompt (repetition penalty; output ids count through count > 0)
};

struct sample_row {
    int32_t row;                               // logits row of the last logits() call
    float temperature;                         // < 1e-5: greedy
    int32_t top_k;                             // <= 0 or >= vocab: off
    float top_p;                               // (0, 1]; 1: off
    float min_p;                               // [0, 1]; 0: off
    float repetition_penalty;                  // > 0; 1: off
    float presence_penalty, frequency_penalty; // 0, 0: off
    float u;                                   // uniform in [0, 1): the draw (unused when greedy)
    int32_t n_bias;
    const int32_t *bias_ids; // [n_bias] in the vocabulary; repeats add up in order
    const float *bias_vals;  // [n_bias]
    int32_t n_mask;
    const int32_t *mask_ids; // [n_mask] in the vocabulary
    int32_t n_seen;
    const struct sample_seen *seen; // [n_seen] distinct ids in the vocabulary
    const uint32_t *allow;          // [(vocab + 31) / 32] structured output: only ids whose bit is set
                                    // (bit id % 32 of word id / 32) may be drawn; NULL: every id
};

enum backend_status {
    BACKEND_OK = 0,
    BACKEND_BUSY = 1, // query(): queued work still running
    BACKEND_ERR_OOM = -1,
    BACKEND_ERR_DEVICE = -2,
    BACKEND_ERR_ARG = -3,
};
enum backend_graph { BACKEND_GRAPH_OFF = 0, BACKEND_GRAPH_REPLAYED = 1, BACKEND_GRAPH_CAPTURING = 2 };

struct backend;

struct backend_ops {
    /* memory: alloc returns zeroed memory or NULL; free(NULL) is a no-op */
    void *(*alloc)(struct backend *b, size_t bytes, enum backend_status *st);
    void (*free)(struct backend *b, void *p);
    /* device-to-device copy of bytes (KV copy on write, slot forks) */
    void (*copy)(struct backend *b, void *dst, const void *src, size_t bytes);
    /* Optional (host memory): makes [p, p + bytes) of an alloc resident now rather than on first use. */
    void (*prefault)(struct backend *b, void *p, size_t bytes);
    /* bytes of one activation element (4 on CPU, 2 for bf16 on CUDA) */
    size_t act_size;
    /* the KV pool element types the attention ops take besides KV_DTYPE_ACT: bit 1 << KV_DTYPE_* */
    unsigned kv_dtypes;
    /* weights: copies (and converts) a checkpoint tensor into backend memory */
    int (*weight_upload)(struct backend *b, const struct st_tensor *t, void **out);
    /* uploads f32 host data into a buffer of `n` floats kept as f32 (RoPE tables) */
    int (*upload_f32)(struct backend *b, void *dst, const float *src, size_t n);
    /* activations <-> f32 host data, converting to/from the activation dtype (tests, debugging) */
    int (*upload_act)(struct backend *b, void *dst, const float *src, size_t n);
    int (*download_act)(struct backend *b, float *dst, const void *src, size_t n);
    /* bytes as they are, host <-> backend memory (fp8 KV pools in the op tests) */
    int (*upload_bytes)(struct backend *b, void *dst, const void *src, size_t bytes);
    int (*download_bytes)(struct backend *b, void *dst, const void *src, size_t bytes);
    /* device memory: free and total bytes (CPU: 0, 0 = not planned from the device) */
    void (*mem_info)(struct backend *b, size_t *free_bytes, size_t *total_bytes);

    /* step: makes the batch metadata visible to the ops below */
    int (*begin_step)(struct backend *b, const struct fwd_batch *batch);

    /* out[T][dim] = table[tokens[t]] */
    void (*embed)(struct backend *b, void *out, const void *table, int dim);
    /* out[n][dim] = x[n] / rms(x[n]) * w */
    void (*rmsnorm)(struct backend *b, void *out, const void *x, const void *w, int n, int dim, float eps);
    /* out[n][n_out] = x[n][n_in] @ w[n_out][n_in]^T (+ bias[n_out]) */
    void (*matmul)(struct backend *b, void *out, const void *x, const void *w, const void *bias, int n, int n_out,
                   int n_in);
    /* rotates the first n_heads heads (q then k) of each row qk[T][row_stride] in place at the
     * batch positions, HF rotate_half layout; inv_freq[hd/2] is f32 */
    void (*rope)(struct backend *b, void *qk, int n_heads, int head_dim, int row_stride, const void *inv_freq);
    /* out[T][n_heads*hd] = attention of q over the layer's cache and this batch's k/v (masks
     * above); rows of qkv[T][row_stride] hold q (n_heads*hd), k then v (n_kv*hd each); the batch's
     * k/v are appended to the pools */
    void (*attention)(struct backend *b, void *out, const void *qkv, int row_stride, const struct attn_layer *layer);
    /* optional (NULL: rope() then attention()): the same two ops in one call, rope over the
     * layer's n_heads + n_kv_heads heads of qkv; a backend fuses the rotation with the KV append */
    void (*rope_attention)(struct backend *b, void *out, void *qkv, int row_stride, const struct attn_layer *layer,
                           const void *inv_freq);
    /* out[t][i] = silu(gu[t][i]) * gu[t][F + i] for n rows (gate | up stacked per row) */
    void (*silu_mul)(struct backend *b, void *out, const void *gu, int n, int F);
    /* optional (NULL: matmul() then silu_mul()): out[n][F] = silu(g) * u for the gate g and up u
     * of x[n][n_in] @ w^T, where w's 2F rows are stacked in groups of 8: rows 16j..16j+7 are
     * gate rows 8j..8j+7 and rows 16j+8..16j+15 the same up rows (F % 8 == 0). gu[n][2F] is
     * scratch the backend may use. Each output is exactly silu_mul() of matmul()'s outputs for its
     * gate and up rows (a backend fuses the two ops, it does not change their arithmetic) */
    void (*matmul_swiglu)(struct backend *b, void *out, void *gu, const void *x, const void *w, int n, int F,
                          int n_in);
    /* optional (NULL: add_rmsnorm() then matmul() or matmul_swiglu()): a GEMM whose input is the
     * RMSNorm of a residual add: x_next = x + y, h = rmsnorm(x_next) * norm_w, then out = h @ w^T
     * (+ bias), or with swiglu (n_out = F, no bias) matmul_swiglu's result over h. x_next != x;
     * h [n][dim] and gu [n][2F] are scratch a backend need not write. Exactly the results of
     * those ops (a backend fuses them, it does not change their arithmetic) */
    void (*norm_matmul)(struct backend *b, void *out, void *gu, void *h, void *x_next, const void *x, const void *y,
                        const void *norm_w, float eps, const void *w, const void *bias, int n, int n_out, int dim,
                        bool swiglu);
    /* x += y, then out = rmsnorm(x) * w, for n rows of dim */
    void (*add_rmsnorm)(struct backend *b, void *out, void *x, const void *y, const void *w, int n, int dim, float eps);
    /* out[i][dim] = x[logit_rows[i]][dim] */
    void (*get_rows)(struct backend *b, void *out, const void *x, int dim);
    /* host_logits[n][vocab] (f32, host memory) = x[n][dim] @ w[vocab][dim]^T; host_logits NULL:
     * computed but not copied to the host (argmax only) */
    int (*logits)(struct backend *b, float *host_logits, const void *x, const void *w, int n, int vocab, int dim);
    /* host_ids[i] = first index of the maximum of logits row i (torch.argmax), after logits() */
    void (*argmax)(struct backend *b, int32_t *host_ids, int n, int vocab);
    /* host_ids[i] = the draw of rows[i] (struct sample_row) from the logits the last logits()
     * call left in backend memory, which stay unchanged; called after sync(), it waits for its
     * own work and returns a backend_status with the ids on the host */
    int (*sample)(struct backend *b, int32_t *host_ids, const struct sample_row *rows, int n, int vocab);
    /* the sample op honours sample_row.allow; when not, the engine samples constrained rows on the
     * host (their logits copied back) */
    bool sample_allow;
    /* waits for queued work (and delivers the logits); returns a backend_status */
    int (*sync)(struct backend *b);
    /* Optional (NULL on the CPU): a decode-shaped step (every sequence one token) replays a
     * captured graph of the whole forward pass. graph_begin, called after begin_step, returns
     * BACKEND_GRAPH_REPLAYED (the step is queued; skip the ops), BACKEND_GRAPH_CAPTURING (run the
     * ops, then graph_end) or BACKEND_GRAPH_OFF (run the ops). graph_end returns non-zero when
     * the capture failed: the ops did not run and must be issued again. */
    int (*graph_begin)(struct backend *b, int key, float *host_logits, size_t n_logit_floats, int32_t *host_ids);
    int (*graph_end)(struct backend *b, int key);
    /* optional: drops every captured graph (a buffer they use is about to move) */
    void (*graph_reset)(struct backend *b);
    /* Optional (NULL on the CPU): the prefill attention's blocks, for the scheduler's step cost. A
     * block takes *tokens_per_block query tokens of one KV head (GQA group `group`, head_dim) and
     * walks every key its rows see, so a wave of blocks (the number returned: those that run at
     * once) takes about as long full as not. 0 when the prefill attention of these heads does not
     * run in such blocks. */
    int (*prefill_blocks)(struct backend *b, int group, int head_dim, int *tokens_per_block);

    /* Tensor parallelism (engine/model_tp.c, engine/model.c); a backend without them runs one rank only.
     * logits_to: out[n][vocab] (f32, backend memory) = x[n][dim] @ w[vocab][dim]^T, the arithmetic
     * of logits(), nothing copied to the host.
     * logits_assemble: the logits of n rows from column blocks: block p (p = 0, 1, ...) starts at
     * parts + p * n * part_cols and holds columns [p * part_cols, p * part_cols + c_p) of the n
     * rows, row after row, c_p = min(part_cols, vocab - p * part_cols). They become the logits of
     * the last logits() call (argmax and sample read them); copied to host_logits[n][vocab] when
     * it is not NULL (delivered by sync(), as logits() does).
     * query: BACKEND_OK when the queued work has finished, BACKEND_BUSY while it runs, or a
     * backend_status error; never blocks (a rank polls it, so that a peer's failure cannot leave
     * it waiting in a collective that will never complete). */
    int (*logits_to)(struct backend *b, float *out, const void *x, const void *w, int n, int vocab, int dim);
    int (*logits_assemble)(struct backend *b, float *host_logits, const float *parts, int n, int vocab,
                           int part_cols);
    int (*query)(struct backend *b);
    void (*destroy)(struct backend *b);
};

struct backend {
    const struct backend_ops *ops;
    const char *name;
    void *ctx;
};

struct backend *backend_cpu_create(void);
/* Whether CUDA device `device` can run duoserve's kernels, which are built for sm_90a only
 * (compute capability 9.0: H100, H200, GH200). Without a CUDA runtime call that could fail
 * later. Returns BACKEND_CUDA_OK, or another status with a one-line reason in err. */
enum backend_cuda_probe {
    BACKEND_CUDA_OK = 0,
    BACKEND_CUDA_NONE = 1,        // no NVIDIA GPU, no driver, or a build without CUDA
    BACKEND_CUDA_UNSUPPORTED = 2, // a GPU is there but cannot be used (its architecture, the driver's age)
    BACKEND_CUDA_BAD_SETTING = 3, // the GPU is usable, but a DUOSERVE_* tuning variable of the CUDA backend
                                  // (docs/TUNING.md) has a value it does not take: a startup error, also
                                  // under --device auto (err names the variable)
};
int backend_cuda_probe(int device, char *err, size_t errlen);
/* NULL with a message in err when the device is not usable (backend_cuda_probe's reasons
 * among them) or the build has no CUDA. */
/* flags: BACKEND_CUDA_CUBLAS: GEMMs through cuBLAS (faster at large batches, but a token's
 * rounding then depends on the batch size); default: duoserve's batch-invariant kernels. */
#define BACKEND_CUDA_CUBLAS 1
/* BACKEND_CUDA_PLAIN_SPLIT (the CUDA op test only): long decode steps split each (token, KV head)
 * into the same number of blocks, the path taken when the work-sized split cannot run (no counter
 * or workspace room), so that the test can want the same bits from both. */
#define BACKEND_CUDA_PLAIN_SPLIT 2
struct backend *backend_cuda_create(int device, int flags, char *err, size_t errlen);
/* CUDA devices visible to this process (CUDA_VISIBLE_DEVICES applies); 0 without CUDA. */
int backend_cuda_device_count(void);
void backend_destroy(struct backend *b);

#endif
