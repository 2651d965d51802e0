// Skinny GEMM for decode: out[n][n_out] = x[n][n_in] @ w[n_out][n_in]^T for n <= 8 tokens.
// At batch 1-8 the weights are read once per step, so the kernel is a pure weight stream:
// one warp per output row, 16-byte loads, every token's x row reused from L1/L2, f32 sums
// reduced across the warp. cuBLAS's GEMM path reaches noticeably less bandwidth at these
// shapes. n_in must be a multiple of 8 (the caller falls back to cuBLAS otherwise).
#include <cuda_bf16.h>
#include <stdint.h>

#include "cuda/cuda_common.h"

#define GEMV_WARPS 8

__device__ __forceinline__ void bf16x8_to_f32(const uint4 &u, float *f) {
    const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&u);
    for (int i = 0; i < 4; i++) {
        float2 v = __bfloat1622float2(h[i]);
        f[2 * i] = v.x;
        f[2 * i + 1] = v.y;
    }
}

template <int N, typename OUT>
__global__ void __launch_bounds__(32 * GEMV_WARPS) gemv_kernel(OUT *out, const __nv_bfloat16 *x, const __nv_bfloat16 *w,
                                                               const __nv_bfloat16 *bias, int n_out, int n_in) {
    int row = blockIdx.x * GEMV_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= n_out) return;
    const uint4 *wr = reinterpret_cast<const uint4 *>(w + (size_t)row * n_in);
    float acc[N];
    for (int t = 0; t < N; t++) acc[t] = 0.0f;
    int n8 = n_in / 8;
    for (int k = lane; k < n8; k += 32) {
        float wf[8];
        bf16x8_to_f32(__ldg(wr + k), wf);
        for (int t = 0; t < N; t++) {
            float xf[8];
            bf16x8_to_f32(__ldg(reinterpret_cast<const uint4 *>(x + (size_t)t * n_in) + k), xf);
            for (int i = 0; i < 8; i++) acc[t] += wf[i] * xf[i];
        }
    }
    for (int t = 0; t < N; t++)
        for (int o = 16; o > 0; o >>= 1) acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], o);
    if (lane < N) {
        float v = acc[0];
        for (int t = 1; t < N; t++)
            if (t == lane) v = acc[t];
        if (bias) v += __bfloat162float(bias[row]);
        if constexpr (sizeof(OUT) == 4) out[(size_t)lane * n_out + row] = v;
        else out[(size_t)lane * n_out + row] = __float2bfloat16(v);
    }
}

template <typename OUT>
static int launch(OUT *out, const void *x, const void *w, const void *bias, int n, int n_out, int n_in, cudaStream_t s) {
    dim3 grid((n_out + GEMV_WARPS - 1) / GEMV_WARPS), block(32 * GEMV_WARPS);
    const __nv_bfloat16 *xb = (const __nv_bfloat16 *)x, *wb = (const __nv_bfloat16 *)w, *bb = (const __nv_bfloat16 *)bias;
    switch (n) {
#define CASE(K) case K: gemv_kernel<K, OUT><<<grid, block, 0, s>>>(out, xb, wb, bb, n_out, n_in); break;
        CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)
#undef CASE
    default: return -3;
    }
    CUDA_CHECK(cudaGetLastError());
    return 0;
}

extern "C" {

/* Returns -3 when the shape is not one this kernel takes (n > 8, n_in % 8, unaligned). */
int cuda_gemv_bf16(void *out, const void *x, const void *w, const void *bias, int n, int n_out, int n_in, cudaStream_t s) {
    if (n < 1 || n > 8 || n_in % 8 || ((uintptr_t)x | (uintptr_t)w) % 16) return -3;
    return launch((__nv_bfloat16 *)out, x, w, bias, n, n_out, n_in, s);
}

int cuda_gemv_f32out(float *out, const void *x, const void *w, int n, int n_out, int n_in, cudaStream_t s) {
    if (n < 1 || n > 8 || n_in % 8 || ((uintptr_t)x | (uintptr_t)w) % 16) return -3;
    return launch(out, x, w, NULL, n, n_out, n_in, s);
}

}  // extern "C"
