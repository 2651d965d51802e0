/* gemm_wg: the wgmma tile GEMM (cuda/gemm_wg.cu) that gemm.cu takes above the weight stream's
 * batch sizes; packed weights (K % 8 == 0), x and w 16-byte aligned. */
#ifndef DUO_GEMM_WG_H
#define DUO_GEMM_WG_H

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdbool.h>

/* gemm.cu's split-K workspace and the SM count */
struct gemm_wg_env {
    float *ws;
    int sms;
};

int gemm_wg_init(void);
/* y[M][N] (bf16; swiglu: y[M][N / 2], no bias) or f32 = x[M][K] @ w^T (+ bias) */
int gemm_wg_bf16(__nv_bfloat16 *y, const void *x, const void *w, const void *bias, int M, int N, int K, bool swiglu,
                 const struct gemm_wg_env *env, cudaStream_t s);
int gemm_wg_f32(float *y, const void *x, const void *w, const void *bias, int M, int N, int K,
                const struct gemm_wg_env *env, cudaStream_t s);

#endif
