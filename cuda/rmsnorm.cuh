// rmsnorm.cuh: the RMSNorm of one row as device code shared by the norm kernels
// (kernels_elementwise.cu) and the GEMM that normalises its own input (gemm.cu), so that both
// compute the same bits: a token's normalised row must not depend on which kernel made it.
#ifndef DUO_CUDA_RMSNORM_CUH
#define DUO_CUDA_RMSNORM_CUH

#include <cuda_bf16.h>
#include <stdint.h>

// Sum of v over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
static __device__ __forceinline__ float block_sum(float v) {
    __shared__ float partial[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads(); /* partial may still be read by a previous call */
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        v = threadIdx.x < (blockDim.x + 31) / 32 ? partial[threadIdx.x] : 0.0f;
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (threadIdx.x == 0) partial[0] = v;
    }
    __syncthreads();
    return partial[0];
}

// Each thread of the block keeps up to RMS_CH 16-byte chunks of the row (chunks threadIdx.x,
// + blockDim.x, ...), so a row costs one round trip to memory.
#define RMS_CH 4

// One row (dim % 8 == 0, dim <= 8 * RMS_CH * blockDim.x) of x, plus y when y is set: the sum
// rounded to bf16 goes to x_out (may be x; NULL: not stored), and out = bf16(w * (x * inv)),
// inv = rsqrt(mean(x^2) + eps), goes chunk by chunk to store(chunk index, 16-byte chunk). Every
// thread of the block must call it.
template <typename ST>
static __device__ __forceinline__ void rms_row(const __nv_bfloat16 *x, const __nv_bfloat16 *y,
                                               const __nv_bfloat16 *w, __nv_bfloat16 *x_out, int dim, float eps,
                                               ST store) {
    const int nch = dim / 8;
    const uint4 *xr = reinterpret_cast<const uint4 *>(x), *wr = reinterpret_cast<const uint4 *>(w);
    const uint4 *yr = reinterpret_cast<const uint4 *>(y);
    uint4 *xo = reinterpret_cast<uint4 *>(x_out);
    uint4 xv[RMS_CH], yv[RMS_CH], wv[RMS_CH]; // w too, so the row costs one round trip
#pragma unroll
    for (int j = 0; j < RMS_CH; j++) {
        int c = threadIdx.x + j * blockDim.x;
        if (c < nch) {
            xv[j] = xr[c];
            if (yr) yv[j] = yr[c];
            wv[j] = wr[c];
        }
    }
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < RMS_CH; j++) {
        int c = threadIdx.x + j * blockDim.x;
        if (c >= nch) continue;
        __nv_bfloat16 *xe = reinterpret_cast<__nv_bfloat16 *>(&xv[j]);
        if (yr) { // x += y, rounded to bf16 as stored
            const __nv_bfloat16 *ye = reinterpret_cast<const __nv_bfloat16 *>(&yv[j]);
#pragma unroll
            for (int e = 0; e < 8; e++) xe[e] = __float2bfloat16(__bfloat162float(xe[e]) + __bfloat162float(ye[e]));
            if (xo) xo[c] = xv[j];
        }
#pragma unroll
        for (int e = 0; e < 8; e++) {
            float v = __bfloat162float(xe[e]);
            ss += v * v;
        }
    }
    float inv = rsqrtf(block_sum(ss) / dim + eps);
#pragma unroll
    for (int j = 0; j < RMS_CH; j++) {
        int c = threadIdx.x + j * blockDim.x;
        if (c >= nch) continue;
        uint4 ov;
        const __nv_bfloat16 *xe = reinterpret_cast<const __nv_bfloat16 *>(&xv[j]);
        const __nv_bfloat16 *we = reinterpret_cast<const __nv_bfloat16 *>(&wv[j]);
        __nv_bfloat16 *oe = reinterpret_cast<__nv_bfloat16 *>(&ov);
#pragma unroll
        for (int e = 0; e < 8; e++) oe[e] = __float2bfloat16(__bfloat162float(we[e]) * (__bfloat162float(xe[e]) * inv));
        store(c, ov);
    }
}

// The threads rms_row is run with for a row of dim (a multiple of 32, at most 1024), or 0 when
// the row does not fit its registers or is not made of 16-byte chunks.
static inline unsigned rms_threads(int dim, const void *a, const void *b, const void *c, const void *d) {
    if (dim % 8 || ((uintptr_t)a | (uintptr_t)b | (uintptr_t)c | (uintptr_t)d) % 16) return 0;
    unsigned per = (unsigned)((dim / 8 + RMS_CH - 1) / RMS_CH);
    unsigned t = (per + 31) / 32 * 32;
    return t <= 1024 ? t : 0;
}

#endif
