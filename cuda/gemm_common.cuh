// gemm_common.cuh: what the GEMM kernels of gemm.cu (weight streams) and gemm_wg.cu (wgmma
// tiles) share: the summation order's chunk, the packed weight layout, the in-order split
// reduction and the epilogues. Both sum every output the same way (see gemm.cu's top comment).
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

#include "cuda/cuda_common.h"

#ifndef GEMM_KC // (a build may set it: scripts/device_pack.sh's VARIANTS)
#define GEMM_KC 512                 // the K chunk of the summation order (a multiple of every BK)
#endif
#ifndef WG_T192_MIN // (likewise)
#define WG_T192_MIN 4096 // above this M the wgmma tiles are 192 tokens of 64 k a stage (gemm_wg.cu)
#endif
#define GEMM_WS_FLOATS (16u << 20)  // split-K partials (64 MiB)
#define GEMM_COUNTERS 65536         // tiles of a split launch

// Packed weights: element (n, k) of an N x K matrix, with KB = ceil(K / 16) k blocks. Lane
// (g, q) = (lane / 4, lane % 4) of a 16 x 16 block holds the mma A fragment {a0, a1, a2, a3} =
// rows {g, g + 8, g, g + 8} x k {2q, 2q, 8 + 2q, 8 + 2q} (+0, +1 in each 32-bit half).
__host__ __device__ __forceinline__ size_t packed_index(int n, int k, int KB) {
    int r = n & 15, c = k & 15;
    int lane = (r & 7) * 4 + ((c & 7) >> 1), e = (c >> 3) * 4 + (r >> 3) * 2 + (c & 1);
    return (((size_t)(n >> 4) * KB + (k >> 4)) * 32 + lane) * 8 + e;
}

__device__ __forceinline__ void store_out(float *y, float v) { *y = v; }
__device__ __forceinline__ void store_out(__nv_bfloat16 *y, float v) { *y = __float2bfloat16(v); }

__device__ __forceinline__ float out_value(float total, const __nv_bfloat16 *bias, int n) {
    return total + (bias ? __bfloat162float(bias[n]) : 0.0f);
}

// Split-K: a thread's NO outputs (idx(o, n, t) names output o; those outside M x N are skipped)
// from the partials ws[chunk][M][N], each added in chunk order from zero into v[o] (the same sum
// the unsplit kernels make in registers); every split reduction goes through here (or, for one
// token of a weight stream, through partials_in_order_row16: the same adds). The loads of
// PB chunks of every output are issued together, so a split GEMM's tail waits on chunks / PB
// round trips to L2, not one for each few chunks of each output.
template <int NO, int PB, typename IDX>
__device__ __forceinline__ void partials_in_order(const float *ws, int chunks, int M, int N, IDX idx, float *v) {
#pragma unroll
    for (int o = 0; o < NO; o++) v[o] = 0.0f;
    for (int c0 = 0; c0 < chunks; c0 += PB) {
        float p[PB][NO];
#pragma unroll
        for (int u = 0; u < PB; u++)
#pragma unroll
            for (int o = 0; o < NO; o++) {
                int n, t;
                idx(o, n, t);
                p[u][o] = c0 + u < chunks && n < N && t < M ? __ldcg(ws + ((size_t)(c0 + u) * M + t) * N + n) : 0.0f;
            }
#pragma unroll
        for (int u = 0; u < PB; u++)
            if (c0 + u < chunks)
#pragma unroll
                for (int o = 0; o < NO; o++) v[o] += p[u][o];
    }
}

// The fused SwiGLU epilogue (SW kernels: weight rows interleaved by 8, gate rows 16j..16j+7 and
// up rows 16j+8..16j+15 of group j): the gate and up outputs rounded to bf16 as the plain GEMM
// stores them, then silu_mul's arithmetic, so the result is bit for bit the unfused one. A
// thread's mma fragments hold rows r and r + 8 of a 16-row block, i.e. the gate and up of one
// feature: y[t][N / 2] gets feature (n / 16) * 8 + n % 8 for the gate row n.
__device__ __forceinline__ void store_swiglu(__nv_bfloat16 *y, int N, int n, int t, float gate, float up) {
    float g = __bfloat162float(__float2bfloat16(out_value(gate, NULL, n)));
    float u = __bfloat162float(__float2bfloat16(out_value(up, NULL, n + 8)));
    y[(size_t)t * (N / 2) + (n / 16) * 8 + n % 8] = __float2bfloat16(silu_mul_f(g, u));
}
