/* cuda_gemm: the batch-invariant GEMMs of cuda/gemm.cu (weight streams up to 32 tokens, the
 * wgmma tiles of cuda/gemm_wg.cu above) and what they keep on a device: a split-K workspace and
 * its counters, owned by the backend context that made them (cuda_gemm_init, cuda_gemm_free).
 * A context's calls run on its own device and stream, one at a time. */
#ifndef DUO_CUDA_GEMM_H
#define DUO_CUDA_GEMM_H

#include <cuda_runtime.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct cuda_gemm {
    float *ws;                   // split-K partials [chunk][M][N], GEMM_WS_FLOATS of them
    int *counters;               // chunks done per strip or tile of a split launch (GEMM_COUNTERS; 0 between launches)
    int sms;                     // the device's SMs
    unsigned stream_k_min_units; // cuda_tuning's: weight streams of this many units or more may go stream-K
};

#ifdef __cplusplus
extern "C" {
#endif
/* With the device current, before any launch there (graph capture included): the workspace and
 * the wgmma tiles' opt-in shared memory. 0, or -2 on a CUDA error (g then holds what was
 * allocated: cuda_gemm_free frees it). */
int cuda_gemm_init(struct cuda_gemm *g, unsigned stream_k_min_units);
/* Frees the workspace (the device current; g zeroed or initialised; a second call is a no-op). */
void cuda_gemm_free(struct cuda_gemm *g);
/* y[M][N] (bf16, or f32 for the logits) = x[M][K] @ w^T (+ bias), w packed (K % 8 == 0) or row-major */
int cuda_gemm_bf16(const struct cuda_gemm *g, void *y, const void *x, const void *w, const void *bias, int M, int N,
                   int K, cudaStream_t s);
int cuda_gemm_f32out(const struct cuda_gemm *g, float *y, const void *x, const void *w, int M, int N, int K,
                     cudaStream_t s);
/* act[M][F] = SwiGLU of x[M][K] @ w^T, w packed with 2F rows interleaved by 8 (gate rows 16j..,
 * up rows 16j+8..); -1 when the shape cannot take the fused epilogue (K % 8, F % 8). */
int cuda_gemm_swiglu(const struct cuda_gemm *g, void *act, const void *x, const void *w, int M, int F, int K,
                     cudaStream_t s);
/* One token (M = 1) through the gate|up GEMM whose input is RMSNorm(x + y) * nw (K = the row
 * length): act = matmul_swiglu's result over N = 2F rows, x_out = x + y. Returns 1 when the shape
 * cannot take it (the caller runs add_rmsnorm + the GEMM: the same bits), 0 done, -2 a CUDA error. */
int cuda_gemm_norm_swiglu(const struct cuda_gemm *g, void *act, void *x_out, const void *x, const void *y,
                          const void *nw, float eps, const void *w, int M, int N, int K, cudaStream_t s);
/* Bytes of an N x K weight in the layout the GEMMs read: packed (K % 8 == 0) or row-major. */
size_t cuda_gemm_weight_bytes(int64_t N, int64_t K);
/* Packs `rows` row-major rows (of K, K % 8 == 0) into the packed weight dst from row row0
 * (a multiple of 16) on. */
int cuda_gemm_pack(void *dst, const void *src, int64_t row0, int rows, int K, cudaStream_t s);
/* out[t] = row tokens[t] of a packed [V][dim] table (dim % 8 == 0). */
int cuda_embed_packed(void *out, const void *table, const int32_t *tokens, int n, int dim, cudaStream_t s);
/* Which kernel a shape takes (for the op test's labels). */
const char *cuda_gemm_kind(int M, int N, int K);
#ifdef __cplusplus
}
#endif

#endif
