// backend_cuda: the backend op table (engine/backend.h) on one NVIDIA GPU. Weights and
// activations are bf16 in device memory, accumulation in f32, logits in f32; GEMMs go through
// duoserve's batch-invariant kernels (cuda/gemm.cu, packed weights) or, with --gemm cublas,
// cuBLAS; everything else through the kernels of cuda/*.cu. All work is queued on one stream;
// ops that cannot return a status record the first error, which sync() reports.
#include <cuda_bf16.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/attn_prefill.h"
#include "cuda/cuda_common.h"
#include "cuda/cuda_ctx.h"

extern "C" {
int cuda_embed(void *out, const void *table, const int32_t *tokens, int n, int dim, cudaStream_t s);
int cuda_rmsnorm(void *out, const void *x, const void *w, int n, int dim, float eps, bool norm_pdl, cudaStream_t s);
int cuda_rope(void *x, const int32_t *pos, const float *inv_freq, int n, int n_heads, int hd, int row_stride,
              cudaStream_t s);
int cuda_silu_mul(void *out, const void *gu, int rows, int F, cudaStream_t s);
int cuda_silu_mul_grouped(void *out, const void *gu, int rows, int F, cudaStream_t s);
int cuda_add_rmsnorm_to(void *out, void *x_out, const void *x, const void *y, const void *w, int n, int dim, float eps,
                        bool norm_pdl, cudaStream_t s);
int cuda_add_rmsnorm(void *out, void *x, const void *y, const void *w, int n, int dim, float eps, bool norm_pdl,
                     cudaStream_t s);
int cuda_add_bias(void *x, const void *bias, int n, int dim, cudaStream_t s);
int cuda_get_rows(void *out, const void *x, const int32_t *rows, int n, int dim, cudaStream_t s);
int cuda_f32_to_bf16(void *dst, const float *src, size_t n, cudaStream_t s);
int cuda_bf16_to_f32(float *dst, const void *src, size_t n, cudaStream_t s);
size_t cuda_argmax_ws_bytes(int ws_rows);
int cuda_argmax_rows(int32_t *ids, const float *x, int n, int vocab, int32_t *ws, int ws_rows, cudaStream_t s);
struct cuda_sampler;
int cuda_sample(struct cuda_sampler **state, int32_t *host_ids, const struct sample_row *rows, int n,
                const float *logits, int n_rows, int vocab, cudaStream_t s);
void cuda_sampler_free(struct cuda_sampler *sp);
}

static void *cu_alloc(struct backend *b, size_t bytes, enum backend_status *st) {
    use_device(CTX(b));
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 16);
    if (e != cudaSuccess) {
        cudaGetLastError(); // clear the sticky-free OOM error
        if (st) *st = BACKEND_ERR_OOM;
        return NULL;
    }
    cudaMemsetAsync(p, 0, bytes, CTX(b)->stream);
    if (st) *st = BACKEND_OK;
    return p;
}

static void cu_free(struct backend *b, void *p) {
    if (!p) return;
    use_device(CTX(b));
    cudaFree(p);
}

static void cu_copy(struct backend *b, void *dst, const void *src, size_t bytes) {
    use_device(CTX(b));
    CK(b, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, CTX(b)->stream));
}

static float *tmp_f32(struct backend *b, size_t n) {
    struct cuda_ctx *c = CTX(b);
    if (n > c->tmp_cap) {
        cudaFree(c->d_tmp);
        c->d_tmp = NULL;
        if (cudaMalloc(&c->d_tmp, n * sizeof(float)) != cudaSuccess) {
            c->tmp_cap = 0;
            return NULL;
        }
        c->tmp_cap = n;
        if (c->tm) c->tm->dirty = true;
    }
    return c->d_tmp;
}

/* Whether a weight of n_in columns is stored packed for duoserve's GEMM kernels (cuda/gemm.cu):
 * every 2-D weight whose rows are whole 16-byte units, unless cuBLAS runs the GEMMs. The
 * embedding table follows the same rule, so a tied lm_head needs no second copy. */
static bool packed_weight(const struct cuda_ctx *c, int n_in) { return !c->cublas && n_in % 8 == 0; }

/* Weights: copied to the device in chunks through two pinned staging buffers, so the host's
 * copy of one chunk (bf16 sources) or its conversion to bf16 (round to nearest even) overlaps
 * the device's copy of the previous chunk. The staging is allocated on first use and kept for
 * the process (every later upload reuses it). Packed weights take chunks of whole 16-row
 * blocks, copied into a device staging buffer and packed from there. Returns once the weight is
 * on the device. */
static int cu_weight_upload(struct backend *b, const struct st_tensor *t, void **out) {
    struct cuda_ctx *c = CTX(b);
    use_device(c);
    const size_t chunk = (size_t)32 << 20; // elements: 64 MiB a buffer
    if (!c->stage) {
        c->stage_pinned = cudaMallocHost((void **)&c->stage, 2 * chunk * 2) == cudaSuccess;
        if (!c->stage_pinned) { // pageable: slower, still correct
            cudaGetLastError();
            c->stage = (uint16_t *)malloc(2 * chunk * 2);
            if (!c->stage) return BACKEND_ERR_OOM;
        }
    }
    uint16_t *stage = c->stage;
    size_t n = (size_t)st_tensor_numel(t);
    const bool packed = t->n_dims == 2 && packed_weight(c, (int)t->shape[1]);
    const int64_t K = packed ? t->shape[1] : 1;
    /* packed: chunks of whole 16-row blocks (16 rows must fit a staging buffer) */
    if (packed && (size_t)16 * (size_t)K > chunk) {
        elog("error", "weight rows of %lld elements are too long to upload", (long long)K);
        return BACKEND_ERR_ARG;
    }
    size_t step = packed ? (size_t)((chunk / (size_t)K) / 16 * 16) * (size_t)K : chunk;
    enum backend_status st;
    void *d = cu_alloc(b, packed ? cuda_gemm_weight_bytes(t->shape[0], K) : n * 2, &st);
    if (!d) return st;
    void *dstage = NULL;
    if (packed && cudaMalloc(&dstage, 2 * (n < step ? n : step)) != cudaSuccess) {
        cudaGetLastError();
        cudaFree(d);
        return BACKEND_ERR_OOM;
    }
    cudaStream_t s = c->stream;
    int rc = BACKEND_OK;
    for (size_t i = 0, k = 0; i < n && rc == BACKEND_OK; i += step, k ^= 1) {
        size_t m = n - i < step ? n - i : step;
        uint16_t *h = stage + k * chunk;
        st_tensor_to_bf16(t, (int64_t)i, (int64_t)m, h);
        /* the previous chunk's copy finishes first, so its buffer is free for the next chunk */
        if (cudaStreamSynchronize(s) != cudaSuccess ||
            cudaMemcpyAsync(packed ? dstage : (char *)d + 2 * i, h, 2 * m, cudaMemcpyHostToDevice, s) != cudaSuccess ||
            (packed && cuda_gemm_pack(d, dstage, (int64_t)(i / (size_t)K), (int)(m / (size_t)K), (int)K, s) != 0))
            rc = BACKEND_ERR_DEVICE;
    }
    if (cudaStreamSynchronize(s) != cudaSuccess) rc = BACKEND_ERR_DEVICE;
    cudaFree(dstage);
    if (rc != BACKEND_OK) {
        cudaFree(d);
        return rc;
    }
    *out = d;
    return BACKEND_OK;
}

static int cu_upload_f32(struct backend *b, void *dst, const float *src, size_t n) {
    use_device(CTX(b));
    return cudaMemcpy(dst, src, n * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess ? BACKEND_OK
                                                                                          : BACKEND_ERR_DEVICE;
}

static int cu_upload_act(struct backend *b, void *dst, const float *src, size_t n) {
    use_device(CTX(b));
    float *t = tmp_f32(b, n);
    if (!t) return BACKEND_ERR_OOM;
    if (cudaMemcpyAsync(t, src, n * sizeof(float), cudaMemcpyHostToDevice, CTX(b)->stream) != cudaSuccess)
        return BACKEND_ERR_DEVICE;
    if (cuda_f32_to_bf16(dst, t, n, CTX(b)->stream)) return BACKEND_ERR_DEVICE;
    return cudaStreamSynchronize(CTX(b)->stream) == cudaSuccess ? BACKEND_OK : BACKEND_ERR_DEVICE;
}

static int cu_download_act(struct backend *b, float *dst, const void *src, size_t n) {
    use_device(CTX(b));
    float *t = tmp_f32(b, n);
    if (!t) return BACKEND_ERR_OOM;
    if (cuda_bf16_to_f32(t, src, n, CTX(b)->stream)) return BACKEND_ERR_DEVICE;
    if (cudaMemcpyAsync(dst, t, n * sizeof(float), cudaMemcpyDeviceToHost, CTX(b)->stream) != cudaSuccess)
        return BACKEND_ERR_DEVICE;
    return cudaStreamSynchronize(CTX(b)->stream) == cudaSuccess ? BACKEND_OK : BACKEND_ERR_DEVICE;
}

static int cu_upload_bytes(struct backend *b, void *dst, const void *src, size_t bytes) {
    use_device(CTX(b));
    return cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice) == cudaSuccess ? BACKEND_OK : BACKEND_ERR_DEVICE;
}

static int cu_download_bytes(struct backend *b, void *dst, const void *src, size_t bytes) {
    use_device(CTX(b));
    if (cudaStreamSynchronize(CTX(b)->stream) != cudaSuccess) return BACKEND_ERR_DEVICE;
    return cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost) == cudaSuccess ? BACKEND_OK : BACKEND_ERR_DEVICE;
}

static void cu_mem_info(struct backend *b, size_t *free_bytes, size_t *total_bytes) {
    use_device(CTX(b));
    if (cudaMemGetInfo(free_bytes, total_bytes) != cudaSuccess) *free_bytes = *total_bytes = 0;
}

/* The split-decode workspace: `floats` of partition states, then the split blocks' counters and
 * the long merges' list (cuda_attn_args.counters: 2 ATTN_COUNTERS + 2 ints, zeroed). It replaces
 * the one there (once the stream is idle: queued kernels may use it) and the graphs that name it
 * go. 0, or -1 when the device has no room (the old one stays). */
static int attn_ws_alloc(struct cuda_ctx *c, size_t floats) {
    size_t cnt_bytes = (2 * (size_t)ATTN_COUNTERS + 2) * sizeof(int);
    float *ws = NULL;
    if (cudaMalloc(&ws, floats * sizeof(float) + cnt_bytes) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    if (cudaMemset(ws + floats, 0, cnt_bytes) != cudaSuccess) {
        cudaGetLastError();
        cudaFree(ws);
        return -1;
    }
    if (c->attn_ws) {
        cudaStreamSynchronize(c->stream);
        cudaFree(c->attn_ws);
        cuda_drop_graphs(c);
        if (c->tm) c->tm->dirty = true;
    }
    c->attn_ws = ws;
    c->attn_ws_floats = floats;
    c->attn_counters = (int *)(ws + floats);
    return 0;
}

/* A work-sized split (decode steps of split level 4 and 5) has the workspace grow to the step's
 * partition states (a quarter more), so that long contexts and batches of them split (the plain
 * split keeps its fixed 64 MiB: a step past it runs unsplit). Before
 * a step's ops (begin_step), or at an attention op that is not being captured into a graph (the
 * first one of a layer geometry larger than any before). Without room the step runs unsplit. */
static void attn_ws_fit(struct cuda_ctx *c, bool maybe_capturing) {
    if (c->attn_env.plain_split || !c->decode_step || c->split_decode < 4 || !c->attn_part_floats) return;
    size_t need = c->step_parts * c->attn_part_floats;
    if (need <= c->attn_ws_floats) return;
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (maybe_capturing && (cudaStreamIsCapturing(c->stream, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone)) {
        cudaGetLastError();
        return; /* the next begin_step grows it, and the graph captured now goes */
    }
    attn_ws_alloc(c, need + need / 4);
}

/* The batch metadata travels in one copy into one device buffer with fixed segments (tokens,
 * pos, tok_seq [capT]; seq_start, indptr [capS+1]; slots, rows [capS]; block ids [capB]; then
 * the prefill kernel's block list [capT + 1], written on the device), so kernel arguments stay
 * the same from step to step and captured graphs stay valid. */
static int cu_begin_step(struct backend *b, const struct fwd_batch *bt) {
    struct cuda_ctx *c = CTX(b);
    use_device(c);
    struct meta_caps &g_caps = c->caps;
    size_t T = (size_t)bt->n_tokens, S = (size_t)bt->n_seqs, NB = bt->block_indptr ? (size_t)bt->block_indptr[S] : 0;
    if (!c->d_meta || T > g_caps.T || S + 1 > g_caps.S || NB > g_caps.B || (size_t)bt->n_logits > g_caps.S) {
        struct meta_caps nc = {T > 8192 ? T : 8192, S + 1 > 1024 ? 2 * (S + 1) : 1024, NB > (1u << 20) ? 2 * NB : (1u << 20)};
        cudaStreamSynchronize(c->stream);
        cudaFree(c->d_meta);
        cudaFreeHost(c->h_meta);
        c->d_meta = c->h_meta = NULL;
        size_t cap = 4 * nc.T + 1 + 4 * (nc.S + 1) + nc.B + nc.T + 1; // (+ the prefill block list)
        if (cudaMalloc(&c->d_meta, cap * 4) != cudaSuccess || cudaMallocHost(&c->h_meta, cap * 4) != cudaSuccess) {
            c->meta_cap = 0;
            return BACKEND_ERR_OOM;
        }
        c->meta_cap = cap;
        g_caps = nc;
        if (c->tm) c->tm->dirty = true;
        cuda_drop_graphs(c);
    }
    // the previous step's copy must be done before the staging buffer is rewritten
    if (cudaStreamSynchronize(c->stream) != cudaSuccess) return BACKEND_ERR_DEVICE;
    int32_t *h = c->h_meta;
    /* tokens, pos, tok_seq [T]; seq_start, indptr [S+1]; slots, rows [S]; part_off [T+1]; blocks */
    size_t off[9] = {0, g_caps.T, 2 * g_caps.T, 3 * g_caps.T, 3 * g_caps.T + (g_caps.S + 1),
                     3 * g_caps.T + 2 * (g_caps.S + 1), 3 * g_caps.T + 3 * (g_caps.S + 1),
                     3 * g_caps.T + 4 * (g_caps.S + 1), 4 * g_caps.T + 1 + 4 * (g_caps.S + 1)};
    c->tokens = c->d_meta + off[0];
    c->pos = c->d_meta + off[1];
    c->tok_seq = c->d_meta + off[2];
    c->seq_start = c->d_meta + off[3];
    c->indptr = c->d_meta + off[4];
    c->slots = c->d_meta + off[5];
    c->rows = c->d_meta + off[6];
    c->part_off = c->d_meta + off[7];
    c->blocks = c->d_meta + off[8];
    c->pf_list = c->d_meta + off[8] + g_caps.B;
    memcpy(h + off[0], bt->tokens, 4 * T);
    memcpy(h + off[1], bt->pos, 4 * T);
    for (size_t s = 0; s < S; s++)
        for (int t = bt->seq_start[s]; t < bt->seq_start[s + 1]; t++) h[off[2] + (size_t)t] = (int32_t)s;
    memcpy(h + off[3], bt->seq_start, 4 * (S + 1));
    if (bt->block_indptr) memcpy(h + off[4], bt->block_indptr, 4 * (S + 1));
    else memset(h + off[4], 0, 4 * (S + 1));
    if (bt->stream_slot) memcpy(h + off[5], bt->stream_slot, 4 * S);
    else memset(h + off[5], 0, 4 * S);
    if (bt->n_logits) memcpy(h + off[6], bt->logit_rows, 4 * (size_t)bt->n_logits);
    /* each token's first slot of split-decode partition states (attention.cu) */
    h[off[7]] = 0;
    int max_parts = 0;
    for (size_t t = 0; t < T; t++) {
        const int parts = cuda_attn_parts(bt->pos[t]);
        h[off[7] + t + 1] = h[off[7] + t] + parts;
        if (parts > max_parts) max_parts = parts;
    }
    /* decode steps split attention only when a context spans partitions (the result is the same
     * either way; short contexts skip the merge kernel) */
    bool one_each = T == S && bt->seq_start[0] == 0; /* every sequence exactly one token (not merely T == S) */
    for (size_t s = 0; one_each && s < S; s++) one_each = bt->seq_start[s + 1] - bt->seq_start[s] == 1;
    c->decode_step = one_each;
    c->split_decode = !one_each || (size_t)h[off[7] + T] == T ? 0 : max_parts <= 2 ? 1 : max_parts <= 4 ? 2
                      : max_parts <= 8 ? 3 : max_parts <= CUDA_ATTN_MERGE_LONG ? 4 : 5;
    c->step_parts = (size_t)h[off[7] + T];
    attn_ws_fit(c, false);
    if (NB) memcpy(h + off[8], bt->block_ids, 4 * NB);
    c->n_tokens = (int)T;
    c->n_seqs = (int)S;
    c->n_logits = bt->n_logits;
    /* segments are copied whole up to what this step uses (one call) */
    size_t used = off[8] + NB;
    if (cudaMemcpyAsync(c->d_meta, h, used * 4, cudaMemcpyHostToDevice, c->stream) != cudaSuccess) return BACKEND_ERR_DEVICE;
    if (c->tm && cudaEventRecord(c->tm->ev[0], c->stream) == cudaSuccess) c->tm->n = 1;
    return BACKEND_OK;
}

static void cu_embed(struct backend *b, void *out, const void *table, int dim) {
    struct cuda_ctx *c = CTX(b);
    if (packed_weight(c, dim)) CKI(b, cuda_embed_packed(out, table, c->tokens, c->n_tokens, dim, c->stream));
    else CKI(b, cuda_embed(out, table, c->tokens, c->n_tokens, dim, c->stream));
    tm_mark(c, "embed");
}

static void cu_rmsnorm(struct backend *b, void *out, const void *x, const void *w, int n, int dim, float eps) {
    CKI(b, cuda_rmsnorm(out, x, w, n, dim, eps, CTX(b)->tune.norm_pdl, CTX(b)->stream));
    tm_mark(CTX(b), "rmsnorm");
}

/* out[n][n_out] = x[n][n_in] @ w[n_out][n_in]^T: in cuBLAS's column-major terms
 * out^T (n_out x n) = w^T' (op T of the n_in x n_out matrix) * x^T (n_in x n). */
static void gemm(struct backend *b, void *out, cudaDataType_t out_type, const void *x, const void *w, int n,
                 int n_out, int n_in) {
    const float alpha = 1.0f, beta = 0.0f;
    CUBLAS_CHECK(b, cublasGemmEx(CTX(b)->blas, CUBLAS_OP_T, CUBLAS_OP_N, n_out, n, n_in, &alpha, w, CUDA_R_16BF, n_in,
                                 x, CUDA_R_16BF, n_in, &beta, out, out_type, n_out, CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT));
}

static void cu_matmul(struct backend *b, void *out, const void *x, const void *w, const void *bias, int n, int n_out,
                      int n_in) {
    if (!CTX(b)->cublas) {
        CKI(b, cuda_gemm_bf16(&CTX(b)->gemm, out, x, w, bias, n, n_out, n_in, CTX(b)->stream));
    } else {
        gemm(b, out, CUDA_R_16BF, x, w, n, n_out, n_in);
        if (bias) CKI(b, cuda_add_bias(out, bias, n, n_out, CTX(b)->stream));
    }
    tm_mark(CTX(b), "matmul N %d K %d", n_out, n_in);
}

static void cu_rope(struct backend *b, void *qk, int n_heads, int head_dim, int row_stride, const void *inv_freq) {
    struct cuda_ctx *c = CTX(b);
    CKI(b, cuda_rope(qk, c->pos, (const float *)inv_freq, c->n_tokens, n_heads, head_dim, row_stride, c->stream));
    tm_mark(c, "rope");
}

static void attention(struct backend *b, void *out, void *qkv, int row_stride, const struct attn_layer *L,
                      const float *inv_freq) {
    struct cuda_ctx *c = CTX(b);
    size_t part_floats = (size_t)L->n_heads * (size_t)(L->head_dim + 2);
    if (part_floats > c->attn_part_floats) {
        c->attn_part_floats = part_floats;
        attn_ws_fit(c, true);
    }
    struct cuda_attn_args a = {L->n_heads, L->n_kv_heads, L->head_dim, L->n_full, L->n_stream, L->block_size,
                               L->sink, L->recent, L->sliding_window, L->scale,
                               (__nv_bfloat16 *)L->k_full, (__nv_bfloat16 *)L->v_full,
                               (__nv_bfloat16 *)L->k_stream, (__nv_bfloat16 *)L->v_stream,
                               c->pos, c->tok_seq, c->seq_start, c->indptr, c->blocks, c->slots,
                               c->part_off, c->attn_ws, c->attn_ws_floats, c->attn_counters, ATTN_COUNTERS, NULL,
                               {0, 0}, {0, 0}, {0, 0}, {0, 0}, 0, 0, 0, // (the rest: cuda_attention's)
                               L->kv_dtype == KV_DTYPE_FP8_E4M3, L->k_scale, L->v_scale, c->n_seqs, c->pf_list};
    if (a.kv_fp8 && (!a.k_scale || !a.v_scale)) { // (the engine gives every fp8 layer its scales)
        if (!c->err) c->err = BACKEND_ERR_ARG;
        return;
    }
    CKI(b, cuda_attention(&c->attn_env, out, qkv, row_stride, &a, c->n_tokens, c->decode_step, c->split_decode,
                          inv_freq, c->stream));
    tm_mark(c, "%sattention%s", inv_freq ? "rope+" : "", c->split_decode ? " (split)" : "");
}

static void cu_attention(struct backend *b, void *out, const void *qkv, int row_stride, const struct attn_layer *L) {
    attention(b, out, (void *)qkv, row_stride, L, NULL); // qkv is only read without inv_freq
}

static void cu_rope_attention(struct backend *b, void *out, void *qkv, int row_stride, const struct attn_layer *L,
                              const void *inv_freq) {
    attention(b, out, qkv, row_stride, L, (const float *)inv_freq);
}

static void cu_silu_mul(struct backend *b, void *out, const void *gu, int n, int F) {
    CKI(b, cuda_silu_mul(out, gu, n, F, CTX(b)->stream));
    tm_mark(CTX(b), "silu_mul");
}

/* Packed weights: one GEMM whose epilogue applies SwiGLU to each gate/up row pair. Row-major
 * weights (cuBLAS, or rows not made of 16-byte units): the GEMM into gu, then the same SwiGLU. */
static void cu_matmul_swiglu(struct backend *b, void *out, void *gu, const void *x, const void *w, int n, int F,
                             int n_in) {
    struct cuda_ctx *c = CTX(b);
    if (packed_weight(c, n_in)) {
        CKI(b, cuda_gemm_swiglu(&c->gemm, out, x, w, n, F, n_in, c->stream));
    } else {
        if (c->cublas) gemm(b, gu, CUDA_R_16BF, x, w, n, 2 * F, n_in);
        else CKI(b, cuda_gemm_bf16(&c->gemm, gu, x, w, NULL, n, 2 * F, n_in, c->stream));
        CKI(b, cuda_silu_mul_grouped(out, gu, n, F, c->stream));
    }
    tm_mark(c, "matmul_swiglu N %d K %d", 2 * F, n_in);
}

/* One token through the packed gate|up weights: the GEMM normalises its own input
 * (cuda_gemm_norm_swiglu); else, and for every other GEMM (the qkv GEMM measured no faster
 * fused), add_rmsnorm into h, then the GEMM (the same bits). */
static void cu_norm_matmul(struct backend *b, void *out, void *gu, void *h, void *x_next, const void *x, const void *y,
                           const void *norm_w, float eps, const void *w, const void *bias, int n, int n_out, int dim,
                           bool swiglu) {
    struct cuda_ctx *c = CTX(b);
    if (swiglu && packed_weight(c, dim) && x_next != x) {
        int rc = cuda_gemm_norm_swiglu(&c->gemm, out, x_next, x, y, norm_w, eps, w, n, 2 * n_out, dim, c->stream);
        if (rc <= 0) {
            CKI(b, rc);
            tm_mark(c, "norm+matmul_swiglu N %d K %d", 2 * n_out, dim);
            return;
        }
    }
    CKI(b, cuda_add_rmsnorm_to(h, x_next, x, y, norm_w, n, dim, eps, c->tune.norm_pdl, c->stream));
    tm_mark(c, "add_rmsnorm");
    if (swiglu) cu_matmul_swiglu(b, out, gu, h, w, n, n_out, dim);
    else cu_matmul(b, out, h, w, bias, n, n_out, dim);
}

static void cu_add_rmsnorm(struct backend *b, void *out, void *x, const void *y, const void *w, int n, int dim,
                           float eps) {
    CKI(b, cuda_add_rmsnorm(out, x, y, w, n, dim, eps, CTX(b)->tune.norm_pdl, CTX(b)->stream));
    tm_mark(CTX(b), "add_rmsnorm");
}


static void cu_get_rows(struct backend *b, void *out, const void *x, int dim) {
    struct cuda_ctx *c = CTX(b);
    CKI(b, cuda_get_rows(out, x, c->rows, c->n_logits, dim, c->stream));
    tm_mark(c, "get_rows");
}

/* The logits buffers (device, pinned host, argmax ids) hold at least need floats of rows of
 * vocab; when they move, the graphs that use them go. */
static int ensure_logits(struct backend *b, size_t need, int vocab) {
    struct cuda_ctx *c = CTX(b);
    if (need <= c->logits_cap && need <= c->h_logits_cap) return BACKEND_OK;
    size_t cap = need > (size_t)256 * vocab ? need : (size_t)256 * vocab;
    cudaStreamSynchronize(c->stream);
    cudaFree(c->d_logits);
    cudaFreeHost(c->h_logits);
    c->d_logits = NULL;
    c->h_logits = NULL;
    c->logits_cap = c->h_logits_cap = 0;
    cudaFree(c->d_ids);
    cudaFreeHost(c->h_ids);
    c->d_ids = c->h_ids = NULL;
    size_t rows = cap / vocab;
    if (cudaMalloc(&c->d_logits, cap * sizeof(float)) != cudaSuccess ||
        cudaMallocHost(&c->h_logits, cap * sizeof(float)) != cudaSuccess ||
        cudaMalloc(&c->d_ids, rows * sizeof(int32_t) + cuda_argmax_ws_bytes((int)rows)) != cudaSuccess ||
        cudaMallocHost(&c->h_ids, rows * sizeof(int32_t)) != cudaSuccess)
        return c->err = BACKEND_ERR_OOM;
    c->d_amax_ws = c->d_ids + rows;
    c->ids_rows = (int)rows;
    CK(b, cudaMemsetAsync(c->d_amax_ws, 0, cuda_argmax_ws_bytes((int)rows), c->stream));
    c->logits_cap = c->h_logits_cap = cap;
    cuda_drop_graphs(c);
    if (c->tm) c->tm->dirty = true;
    return BACKEND_OK;
}

/* The logits just written to d_logits go to host_logits (when set) at sync(). */
static void logits_out(struct backend *b, float *host_logits, int n, size_t need) {
    struct cuda_ctx *c = CTX(b);
    c->n_logit_rows = n;
    if (!host_logits) return;
    CK(b, cudaMemcpyAsync(c->h_logits, c->d_logits, need * sizeof(float), cudaMemcpyDeviceToHost, c->stream));
    c->pending_dst = host_logits;
    c->pending_n = need;
}

static int cu_logits(struct backend *b, float *host_logits, const void *x, const void *w, int n, int vocab, int dim) {
    struct cuda_ctx *c = CTX(b);
    size_t need = (size_t)n * vocab;
    if (ensure_logits(b, need, vocab) != BACKEND_OK) return c->err;
    if (c->cublas) gemm(b, c->d_logits, CUDA_R_32F, x, w, n, vocab, dim);
    else CKI(b, cuda_gemm_f32out(&c->gemm, c->d_logits, x, w, n, vocab, dim, c->stream));
    tm_mark(c, "logits");
    logits_out(b, host_logits, n, need);
    return c->err;
}

/* Tensor parallelism: a rank's vocabulary part, the same GEMM as cu_logits, into out. */
static int cu_logits_to(struct backend *b, float *out, const void *x, const void *w, int n, int vocab, int dim) {
    struct cuda_ctx *c = CTX(b);
    if (c->cublas) gemm(b, out, CUDA_R_32F, x, w, n, vocab, dim);
    else CKI(b, cuda_gemm_f32out(&c->gemm, out, x, w, n, vocab, dim, c->stream));
    tm_mark(c, "logits (part)");
    return c->err;
}

/* Tensor parallelism, rank 0: the gathered parts into d_logits, one strided copy a part. */
static int cu_logits_assemble(struct backend *b, float *host_logits, const float *parts, int n, int vocab,
                              int part_cols) {
    struct cuda_ctx *c = CTX(b);
    size_t need = (size_t)n * vocab;
    if (ensure_logits(b, need, vocab) != BACKEND_OK) return c->err;
    for (int p = 0; p * part_cols < vocab; p++) {
        int cols = vocab - p * part_cols < part_cols ? vocab - p * part_cols : part_cols;
        CK(b, cudaMemcpy2DAsync(c->d_logits + (size_t)p * part_cols, (size_t)vocab * sizeof(float),
                                parts + (size_t)p * n * part_cols, (size_t)cols * sizeof(float),
                                (size_t)cols * sizeof(float), (size_t)n, cudaMemcpyDeviceToDevice, c->stream));
    }
    tm_mark(c, "logits (gathered)");
    logits_out(b, host_logits, n, need);
    return c->err;
}

/* Never blocks: a rank polls it while a peer may have failed (engine/model.c wait_rank). */
static int cu_query(struct backend *b) {
    struct cuda_ctx *c = CTX(b);
    cudaError_t e = cudaStreamQuery(c->stream);
    if (e == cudaErrorNotReady) return BACKEND_BUSY;
    if (e != cudaSuccess) {
        elog("error", "CUDA error %s on device %d", cudaGetErrorString(e), c->device);
        if (!c->err) c->err = BACKEND_ERR_DEVICE;
    }
    return c->err;
}

static void cu_graph_reset(struct backend *b) {
    struct cuda_ctx *c = CTX(b);
    use_device(c);
    cudaStreamSynchronize(c->stream);
    cuda_drop_graphs(c);
}

static void cu_argmax(struct backend *b, int32_t *host_ids, int n, int vocab) {
    struct cuda_ctx *c = CTX(b);
    CKI(b, cuda_argmax_rows(c->d_ids, c->d_logits, n, vocab, c->d_amax_ws, c->ids_rows, c->stream));
    tm_mark(c, "argmax");
    CK(b, cudaMemcpyAsync(c->h_ids, c->d_ids, (size_t)n * sizeof(int32_t), cudaMemcpyDeviceToHost, c->stream));
    c->pending_ids = host_ids;
    c->pending_n_ids = n;
}

/* Draws from d_logits as the last logits() call (or graph replay) left them; synchronous. */
static int cu_sample(struct backend *b, int32_t *host_ids, const struct sample_row *rows, int n, int vocab) {
    struct cuda_ctx *c = CTX(b);
    use_device(c);
    if (!c->d_logits || vocab < 1) return BACKEND_ERR_ARG;
    return cuda_sample(&c->sampler, host_ids, rows, n, c->d_logits, (int)(c->logits_cap / (size_t)vocab), vocab,
                       c->stream);
}

static int cu_sync(struct backend *b) {
    struct cuda_ctx *c = CTX(b);
    CK(b, cudaStreamSynchronize(c->stream));
    tm_collect(c);
    if (c->pending_dst && !c->err) memcpy(c->pending_dst, c->h_logits, c->pending_n * sizeof(float));
    if (c->pending_ids && !c->err) memcpy(c->pending_ids, c->h_ids, (size_t)c->pending_n_ids * sizeof(int32_t));
    c->pending_dst = NULL;
    c->pending_ids = NULL;
    int e = c->err;
    c->err = 0;
    return e;
}

/* The wgmma prefill kernel's waves; none when prefill attention runs through the flash kernel
 * (DUOSERVE_ATTN_WG=0), whose blocks are (token, KV head) pairs. */
static int cu_prefill_blocks(struct backend *b, int group, int head_dim, int *tokens_per_block) {
    struct cuda_ctx *c = CTX(b);
    if (!c->attn_env.wg_prefill) return 0;
    use_device(c);
    return fa_prefill_wg_wave(head_dim, group, c->attn_env.sms, tokens_per_block);
}

/* Also frees a context that backend_cuda_create left half made (NULL handles skipped). */
static void cu_destroy(struct backend *b) {
    struct cuda_ctx *c = CTX(b);
    use_device(c);
    if (c->stream) cudaStreamSynchronize(c->stream);
    cuda_drop_graphs(c);
    tm_close(c);
    cuda_sampler_free(c->sampler);
    if (c->stage_pinned) cudaFreeHost(c->stage);
    else free(c->stage);
    cudaFreeHost(c->h_logits);
    cudaFree(c->d_ids);
    cudaFreeHost(c->h_ids);
    cudaFree(c->blas_ws);
    cudaFree(c->attn_ws);
    cudaFree(c->d_meta);
    cudaFreeHost(c->h_meta);
    cudaFree(c->d_logits);
    cudaFree(c->d_tmp);
    cuda_gemm_free(&c->gemm);
    if (c->blas) cublasDestroy(c->blas);
    if (c->stream) cudaStreamDestroy(c->stream);
    free(c);
    free(b);
}

static struct backend_ops make_ops(void) {
    struct backend_ops o;
    memset(&o, 0, sizeof o);
    o.alloc = cu_alloc;
    o.free = cu_free;
    o.copy = cu_copy;
    o.act_size = 2; // bf16
    o.weight_upload = cu_weight_upload;
    o.upload_f32 = cu_upload_f32;
    o.upload_act = cu_upload_act;
    o.download_act = cu_download_act;
    o.upload_bytes = cu_upload_bytes;
    o.download_bytes = cu_download_bytes;
    o.kv_dtypes = 1u << KV_DTYPE_FP8_E4M3; // (bf16 is the activation dtype: KV_DTYPE_ACT)
    o.mem_info = cu_mem_info;
    o.begin_step = cu_begin_step;
    o.embed = cu_embed;
    o.rmsnorm = cu_rmsnorm;
    o.matmul = cu_matmul;
    o.rope = cu_rope;
    o.attention = cu_attention;
    o.rope_attention = cu_rope_attention;
    o.silu_mul = cu_silu_mul;
    o.matmul_swiglu = cu_matmul_swiglu;
    o.norm_matmul = cu_norm_matmul;
    o.add_rmsnorm = cu_add_rmsnorm;
    o.get_rows = cu_get_rows;
    o.logits = cu_logits;
    o.argmax = cu_argmax;
    o.sample = cu_sample;
    o.sample_allow = true; // cuda/sampling.cu applies sample_row.allow (structured output)
    o.sync = cu_sync;
    o.destroy = cu_destroy;
    o.graph_begin = cuda_graph_begin;
    o.graph_end = cuda_graph_end;
    o.graph_reset = cu_graph_reset;
    o.prefill_blocks = cu_prefill_blocks;
    o.logits_to = cu_logits_to;
    o.logits_assemble = cu_logits_assemble;
    o.query = cu_query;
    return o;
}

static const struct backend_ops cuda_ops = make_ops();

/* The CUDA runtime's own words mislead here: with no NVIDIA driver at all it says "CUDA driver
 * version is insufficient for CUDA runtime version", which reads as "upgrade your driver". */
extern "C" int backend_cuda_probe(int device, char *err, size_t errlen) {
    int n = 0, drv = 0, rt = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    cudaGetLastError();
    cudaDriverGetVersion(&drv); // 0 when no driver is installed
    cudaRuntimeGetVersion(&rt);
    if (e == cudaErrorInsufficientDriver && drv == 0) {
        snprintf(err, errlen, "no NVIDIA GPU driver found (libcuda.so.1 is not installed or not visible; in a "
                              "container, run it with --gpus all)");
        return BACKEND_CUDA_NONE;
    }
    if (e == cudaErrorInsufficientDriver) {
        snprintf(err, errlen, "the NVIDIA driver supports CUDA %d.%d, this build needs %d.%d: update the NVIDIA driver",
                 drv / 1000, drv % 1000 / 10, rt / 1000, rt % 1000 / 10);
        return BACKEND_CUDA_UNSUPPORTED;
    }
    if (e == cudaErrorNoDevice || (e == cudaSuccess && n == 0)) {
        snprintf(err, errlen, "no NVIDIA GPU found (the driver sees none; check nvidia-smi and CUDA_VISIBLE_DEVICES)");
        return BACKEND_CUDA_NONE;
    }
    if (e != cudaSuccess) {
        snprintf(err, errlen, "the NVIDIA GPUs cannot be used: %s", cudaGetErrorString(e));
        return BACKEND_CUDA_UNSUPPORTED;
    }
    cudaDeviceProp prop;
    if (device < 0 || device >= n || cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
        cudaGetLastError();
        snprintf(err, errlen, "CUDA device %d is not usable (%d found)", device, n);
        return BACKEND_CUDA_UNSUPPORTED;
    }
    if (prop.major != 9 || prop.minor != 0) {
        snprintf(err, errlen, "GPU %d (%s) has compute capability %d.%d; duoserve's CUDA kernels are built for "
                              "sm_90a only (H100, H200, GH200)", device, prop.name, prop.major, prop.minor);
        return BACKEND_CUDA_UNSUPPORTED;
    }
    struct cuda_tuning tune;
    if (cuda_tuning_parse(&tune, err, errlen)) return BACKEND_CUDA_BAD_SETTING;
    return BACKEND_CUDA_OK;
}

extern "C" int backend_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

/* For cuda/comm_nccl.cu: the GPU and the stream of a CUDA backend. */
extern "C" int backend_cuda_device(struct backend *b) { return CTX(b)->device; }
extern "C" cudaStream_t backend_cuda_stream(struct backend *b) { return CTX(b)->stream; }

extern "C" struct backend *backend_cuda_create(int device, int flags, char *err, size_t errlen) {
    if (backend_cuda_probe(device, err, errlen) != BACKEND_CUDA_OK) return NULL;
    if (cudaSetDevice(device) != cudaSuccess) {
        cudaGetLastError();
        snprintf(err, errlen, "CUDA device %d is not usable", device);
        return NULL;
    }
    struct backend *b = (struct backend *)calloc(1, sizeof *b);
    struct cuda_ctx *c = (struct cuda_ctx *)calloc(1, sizeof *c);
    if (!b || !c) {
        snprintf(err, errlen, "out of memory");
        free(b);
        free(c);
        return NULL;
    }
    b->ops = &cuda_ops;
    b->name = "cuda";
    b->ctx = c;
    c->device = device;
    c->cublas = (flags & BACKEND_CUDA_CUBLAS) != 0;
    if (cuda_tuning_parse(&c->tune, err, errlen)) { // (the probe read the same environment)
        cu_destroy(b);
        return NULL;
    }
    c->graphs_off = c->tune.no_graphs;
    if (cuda_gemm_init(&c->gemm, c->tune.stream_k_min_units) || cuda_attention_init(&c->attn_env)) {
        cudaGetLastError();
        snprintf(err, errlen, "cannot configure the GEMM and attention kernels on CUDA device %d", device);
        cu_destroy(b);
        return NULL;
    }
    if (cudaStreamCreate(&c->stream) != cudaSuccess || cublasCreate(&c->blas) != CUBLAS_STATUS_SUCCESS) {
        cudaGetLastError();
        snprintf(err, errlen, "cannot initialise CUDA / cuBLAS on device %d", device);
        cu_destroy(b);
        return NULL;
    }
    cublasSetStream(c->blas, c->stream);
    /* a fixed cuBLAS workspace: GEMMs inside a graph capture must not allocate */
    size_t ws = 32u << 20;
    if (cudaMalloc(&c->blas_ws, ws) == cudaSuccess) cublasSetWorkspace(c->blas, c->blas_ws, ws);
    /* split-decode partition states (64 MiB; a work-sized split grows them to its steps,
     * attn_ws_fit): a step whose states do not fit computes them in one block per (token, KV
     * head) instead, with the same result */
    c->attn_env.plain_split = (flags & BACKEND_CUDA_PLAIN_SPLIT) != 0;
    c->attn_env.wg_prefill = c->tune.attn_wg;
    attn_ws_alloc(c, (size_t)16 << 20);
    tm_open(c);
    return b;
}
