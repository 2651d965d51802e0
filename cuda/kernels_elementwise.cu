// Elementwise and row-wise kernels of the forward pass: embedding gather, RMSNorm, RoPE
// (HF rotate_half layout), SwiGLU and residual add. Activations are bf16, math in f32.
// Each op: __global__ kernel -> launcher on raw pointers and a stream (STYLE.md).
#include <cuda_bf16.h>
#include <stdint.h>

#include "cuda/cuda_common.h"
#include "cuda/rmsnorm.cuh"

__global__ void embed_kernel(__nv_bfloat16 *out, const __nv_bfloat16 *table, const int32_t *tokens, int dim) {
    pdl_trigger();
    pdl_wait();
    int t = blockIdx.x;
    const __nv_bfloat16 *row = table + (size_t)tokens[t] * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) out[(size_t)t * dim + i] = row[i];
}

// One block per row; f32 sum of squares reduced through shared memory.
__global__ void rmsnorm_kernel(__nv_bfloat16 *out, const __nv_bfloat16 *x, const __nv_bfloat16 *w, int dim, float eps) {
    pdl_trigger();
    pdl_wait();
    const __nv_bfloat16 *xr = x + (size_t)blockIdx.x * dim;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float v = __bfloat162float(xr[i]);
        ss += v * v;
    }
    float inv = rsqrtf(block_sum(ss) / dim + eps);
    __nv_bfloat16 *orow = out + (size_t)blockIdx.x * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        orow[i] = __float2bfloat16(__bfloat162float(w[i]) * (__bfloat162float(xr[i]) * inv));
}

// A decode step's norms (up to 64 rows) launch programmatically (norm_pdl: DUOSERVE_NORM_PDL, on
// by default) and, like every norm, let the next kernel (the qkv weight stream, which waits for
// them before reading their rows) launch at their start: the norm waits inside for the down GEMM
// before it, and the qkv GEMM's first weight buffers load during that GEMM's tail rather than
// after the norm.
static bool norm_launch_pdl(bool norm_pdl, int rows) { return norm_pdl && rows <= 64; }

// Row-wise norms with dim % 8 == 0 (every real model): rms_row (rmsnorm.cuh), a row a block,
// x + y stored to x_out (in place when x_out == x). The same per-element arithmetic as the
// kernels above; only the order of the sum of squares differs (it is fixed per row, so batch
// invariance holds).
__global__ void rmsnorm_vec_kernel(__nv_bfloat16 *out, __nv_bfloat16 *x_out, const __nv_bfloat16 *x,
                                   const __nv_bfloat16 *y, const __nv_bfloat16 *w, int dim, float eps) {
    pdl_trigger();
    pdl_wait();
    const size_t row = (size_t)blockIdx.x * dim;
    uint4 *orow = reinterpret_cast<uint4 *>(out + row);
    rms_row(x + row, y ? y + row : NULL, w, y ? x_out + row : NULL, dim, eps, [&](int c, uint4 v) { orow[c] = v; });
}

// One thread per (token, pair (i, i + hd/2) of a head): one round trip per element pair.
__global__ void rope_kernel(__nv_bfloat16 *x, const int32_t *pos, const float *inv_freq, int n_heads, int hd,
                            int row_stride) {
    pdl_trigger();
    pdl_wait();
    int t = blockIdx.x, half = hd / 2;
    int j = blockIdx.y * blockDim.x + threadIdx.x;
    if (j < n_heads * half) {
        int h = j / half, i = j % half;
        __nv_bfloat16 *v = x + (size_t)t * row_stride + (size_t)h * hd;
        float ra, rb;
        rope_pair(__bfloat162float(v[i]), __bfloat162float(v[i + half]), pos[t], inv_freq[i], ra, rb);
        v[i] = __float2bfloat16(ra);
        v[i + half] = __float2bfloat16(rb);
    }
}

// out[t][i] = silu(gu[t][i]) * gu[t][F + i]
__global__ void silu_mul_kernel(__nv_bfloat16 *out, const __nv_bfloat16 *gu, int F, size_t n) {
    pdl_trigger();
    pdl_wait();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        size_t t = i / F, c = i % F;
        float g = __bfloat162float(gu[t * 2 * F + c]);
        out[i] = __float2bfloat16(silu_mul_f(g, __bfloat162float(gu[t * 2 * F + F + c])));
    }
}

// The same for F % 8 == 0, eight outputs (16 bytes) a thread.
__global__ void silu_mul_vec_kernel(__nv_bfloat16 *out, const __nv_bfloat16 *gu, int F, size_t n8) {
    pdl_trigger();
    pdl_wait();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n8) return;
    size_t t = i * 8 / F, c = i * 8 % F;
    uint4 gv = *reinterpret_cast<const uint4 *>(gu + t * 2 * F + c), uv = *reinterpret_cast<const uint4 *>(gu + t * 2 * F + F + c), ov;
    const __nv_bfloat16 *ge = reinterpret_cast<const __nv_bfloat16 *>(&gv), *ue = reinterpret_cast<const __nv_bfloat16 *>(&uv);
    __nv_bfloat16 *oe = reinterpret_cast<__nv_bfloat16 *>(&ov);
#pragma unroll
    for (int e = 0; e < 8; e++) oe[e] = __float2bfloat16(silu_mul_f(__bfloat162float(ge[e]), __bfloat162float(ue[e])));
    *reinterpret_cast<uint4 *>(out + i * 8) = ov;
}

// The same over gate | up rows interleaved in groups of 8 (backend matmul_swiglu's layout): row t
// of gu holds, for each group j, gate j*8..j*8+7 then up j*8..j*8+7. One group a thread.
__global__ void silu_mul_grouped_kernel(__nv_bfloat16 *out, const __nv_bfloat16 *gu, size_t groups) {
    pdl_trigger();
    pdl_wait();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= groups) return;
    uint4 gv = *reinterpret_cast<const uint4 *>(gu + i * 16), uv = *reinterpret_cast<const uint4 *>(gu + i * 16 + 8), ov;
    const __nv_bfloat16 *ge = reinterpret_cast<const __nv_bfloat16 *>(&gv), *ue = reinterpret_cast<const __nv_bfloat16 *>(&uv);
    __nv_bfloat16 *oe = reinterpret_cast<__nv_bfloat16 *>(&ov);
#pragma unroll
    for (int e = 0; e < 8; e++) oe[e] = __float2bfloat16(silu_mul_f(__bfloat162float(ge[e]), __bfloat162float(ue[e])));
    *reinterpret_cast<uint4 *>(out + i * 8) = ov;
}

// x_out = x + y (x_out may be x), then out = rmsnorm(x_out) * w; one block per row.
__global__ void add_rmsnorm_kernel(__nv_bfloat16 *out, __nv_bfloat16 *x_out, const __nv_bfloat16 *x,
                                   const __nv_bfloat16 *y, const __nv_bfloat16 *w, int dim, float eps) {
    pdl_trigger();
    pdl_wait();
    __nv_bfloat16 *xr = x_out + (size_t)blockIdx.x * dim;
    const __nv_bfloat16 *xin = x + (size_t)blockIdx.x * dim, *yr = y + (size_t)blockIdx.x * dim;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        __nv_bfloat16 s = __float2bfloat16(__bfloat162float(xin[i]) + __bfloat162float(yr[i]));
        xr[i] = s;
        float v = __bfloat162float(s);
        ss += v * v;
    }
    float inv = rsqrtf(block_sum(ss) / dim + eps);
    __nv_bfloat16 *orow = out + (size_t)blockIdx.x * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        orow[i] = __float2bfloat16(__bfloat162float(w[i]) * (__bfloat162float(xr[i]) * inv));
}


__global__ void add_bias_kernel(__nv_bfloat16 *x, const __nv_bfloat16 *bias, int dim, size_t n) {
    pdl_trigger();
    pdl_wait();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = __float2bfloat16(__bfloat162float(x[i]) + __bfloat162float(bias[i % dim]));
}

// A row a block; dim % 8 == 0 rows move as 16-byte pieces (x and out 16-byte aligned: the
// engine's activation buffers are), all of a thread's loads issued before its first store
// (restrict: one round trip a row, not one an element)
__global__ void get_rows_kernel(__nv_bfloat16 *__restrict__ out, const __nv_bfloat16 *__restrict__ x,
                                const int32_t *__restrict__ rows, int dim) {
    pdl_trigger();
    pdl_wait();
    const __nv_bfloat16 *src = x + (size_t)rows[blockIdx.x] * dim;
    __nv_bfloat16 *dst = out + (size_t)blockIdx.x * dim;
    if (dim % 8) {
        for (int i = threadIdx.x; i < dim; i += blockDim.x) dst[i] = src[i];
        return;
    }
    constexpr int P = 4;
    const uint4 *s16 = reinterpret_cast<const uint4 *>(src);
    uint4 *d16 = reinterpret_cast<uint4 *>(dst);
    for (int i0 = threadIdx.x; i0 < dim / 8; i0 += P * blockDim.x) {
        uint4 v[P];
#pragma unroll
        for (int u = 0; u < P; u++)
            if (i0 + u * (int)blockDim.x < dim / 8) v[u] = s16[i0 + u * blockDim.x];
#pragma unroll
        for (int u = 0; u < P; u++)
            if (i0 + u * (int)blockDim.x < dim / 8) d16[i0 + u * blockDim.x] = v[u];
    }
}

__global__ void f32_to_bf16_kernel(__nv_bfloat16 *dst, const float *src, size_t n) {
    pdl_trigger();
    pdl_wait();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = __float2bfloat16(src[i]);
}

__global__ void bf16_to_f32_kernel(float *dst, const __nv_bfloat16 *src, size_t n) {
    pdl_trigger();
    pdl_wait();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = __bfloat162float(src[i]);
}

// The first index of each row's maximum (torch.argmax's tie rule): ARGMAX_SLICES blocks a row,
// each reducing a slice to a (value, index) pair; the row's last block to finish combines the
// pairs (the rule is a total order, so the combination order does not matter). ws holds a
// counter per row of its capacity (zero between launches), then [rows][ARGMAX_SLICES] pairs.
// Each thread's loads go out ARGMAX_AHEAD at a time (one round trip for a 128k vocabulary).
#define ARGMAX_SLICES 64
#define ARGMAX_AHEAD 8
__global__ void argmax_kernel(int32_t *__restrict__ ids, const float *__restrict__ x, int vocab, int32_t *ws, int ws_rows) {
    pdl_trigger();
    pdl_wait();
    __shared__ float sv[32];
    __shared__ int si[32];
    __shared__ bool last;
    const int r = blockIdx.x, p = blockIdx.y, per = (vocab + ARGMAX_SLICES - 1) / ARGMAX_SLICES;
    const float *row = x + (size_t)r * vocab;
    float best = -INFINITY;
    int bi = 0x7fffffff;
    const int end = min(vocab, (p + 1) * per);
    for (int i0 = p * per + threadIdx.x; i0 < end; i0 += ARGMAX_AHEAD * blockDim.x) {
        float v[ARGMAX_AHEAD];
#pragma unroll
        for (int u = 0; u < ARGMAX_AHEAD; u++) {
            const int i = i0 + u * blockDim.x;
            v[u] = i < end ? row[i] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < ARGMAX_AHEAD; u++)
            if (i0 + u * (int)blockDim.x < end) argmax_take(best, bi, v[u], i0 + u * blockDim.x);
    }
    // the block's pair into sv[0], si[0]
    auto block_argmax = [&]() {
        warp_argmax(best, bi);
        if ((threadIdx.x & 31) == 0) sv[threadIdx.x >> 5] = best, si[threadIdx.x >> 5] = bi;
        __syncthreads();
        if (threadIdx.x < 32) {
            int nw = (blockDim.x + 31) / 32;
            best = threadIdx.x < nw ? sv[threadIdx.x] : -INFINITY;
            bi = threadIdx.x < nw ? si[threadIdx.x] : 0x7fffffff;
            warp_argmax(best, bi);
        }
        __syncthreads();
    };
    block_argmax();
    int32_t *pairs = ws + ws_rows + (size_t)r * 2 * ARGMAX_SLICES, *counter = ws + r;
    if (threadIdx.x == 0) {
        pairs[2 * p] = __float_as_int(best);
        pairs[2 * p + 1] = bi;
        fence_acq_rel();
        last = atomicAdd(counter, 1) == ARGMAX_SLICES - 1;
    }
    __syncthreads();
    if (!last) return;
    fence_acq_rel();
    best = -INFINITY, bi = 0x7fffffff;
    if (threadIdx.x < ARGMAX_SLICES)
        best = __int_as_float(__ldcg(pairs + 2 * threadIdx.x)), bi = __ldcg(pairs + 2 * threadIdx.x + 1);
    block_argmax();
    if (threadIdx.x == 0) {
        ids[r] = bi == 0x7fffffff ? 0 : bi;
        *counter = 0;
    }
}

extern "C" {

/* Bytes of the workspace of cuda_argmax_rows for up to ws_rows rows (zeroed before first use). */
size_t cuda_argmax_ws_bytes(int ws_rows) { return (size_t)ws_rows * (2 * ARGMAX_SLICES + 1) * sizeof(int32_t); }

int cuda_argmax_rows(int32_t *ids, const float *x, int n, int vocab, int32_t *ws, int ws_rows, cudaStream_t s) {
    if (n == 0) return 0;
    if (n > ws_rows) return -1;
    CUDA_CHECK(cuda_launch(argmax_kernel, dim3(n, ARGMAX_SLICES), dim3(256), 0, s, ids, x, vocab, ws, ws_rows));
    return 0;
}

int cuda_add_bias(void *x, const void *bias, int n, int dim, cudaStream_t s) {
    size_t total = (size_t)n * dim;
    if (total == 0) return 0;
    CUDA_CHECK(cuda_launch(add_bias_kernel, dim3(cuda_blocks(total, 256)), dim3(256), 0, s, (__nv_bfloat16 *)x, (const __nv_bfloat16 *)bias, dim, total));
    return 0;
}

int cuda_get_rows(void *out, const void *x, const int32_t *rows, int n, int dim, cudaStream_t s) {
    if (n == 0) return 0;
    // out and x must not overlap (the kernel's pointers are restrict): the engine passes separate buffers
    if (dim % 8 == 0 && ((uintptr_t)x | (uintptr_t)out) % 16) { // (its rows move as 16-byte pieces)
        fprintf(stderr, "duoserve: get_rows buffers not 16-byte aligned (x %p, out %p)\n", x, out);
        return -1;
    }
    CUDA_CHECK(cuda_launch(get_rows_kernel, dim3(n), dim3(256), 0, s, (__nv_bfloat16 *)out, (const __nv_bfloat16 *)x, rows, dim));
    return 0;
}

int cuda_f32_to_bf16(void *dst, const float *src, size_t n, cudaStream_t s) {
    if (n == 0) return 0;
    CUDA_CHECK(cuda_launch(f32_to_bf16_kernel, dim3(cuda_blocks(n, 256)), dim3(256), 0, s, (__nv_bfloat16 *)dst, src, n));
    return 0;
}

int cuda_bf16_to_f32(float *dst, const void *src, size_t n, cudaStream_t s) {
    if (n == 0) return 0;
    CUDA_CHECK(cuda_launch(bf16_to_f32_kernel, dim3(cuda_blocks(n, 256)), dim3(256), 0, s, dst, (const __nv_bfloat16 *)src, n));
    return 0;
}

int cuda_embed(void *out, const void *table, const int32_t *tokens, int n, int dim, cudaStream_t s) {
    if (n == 0) return 0;
    CUDA_CHECK(cuda_launch(embed_kernel, dim3(n), dim3(256), 0, s, (__nv_bfloat16 *)out, (const __nv_bfloat16 *)table, tokens, dim));
    return 0;
}

/* norm_pdl: a decode step's norms may launch programmatically (cuda_tuning) */
int cuda_rmsnorm(void *out, const void *x, const void *w, int n, int dim, float eps, bool norm_pdl, cudaStream_t s) {
    if (n == 0) return 0;
    if (unsigned t = rms_threads(dim, out, x, w, NULL)) {
        CUDA_CHECK(cuda_launch_pdl(norm_launch_pdl(norm_pdl, n), rmsnorm_vec_kernel, dim3(n), dim3(t), 0, s,
                                   (__nv_bfloat16 *)out, (__nv_bfloat16 *)NULL, (const __nv_bfloat16 *)x,
                                   (const __nv_bfloat16 *)NULL, (const __nv_bfloat16 *)w, dim, eps));
        return 0;
    }
    CUDA_CHECK(cuda_launch(rmsnorm_kernel, dim3(n), dim3(256), 0, s, (__nv_bfloat16 *)out, (const __nv_bfloat16 *)x, (const __nv_bfloat16 *)w, dim, eps));
    return 0;
}

int cuda_rope(void *x, const int32_t *pos, const float *inv_freq, int n, int n_heads, int hd, int row_stride,
              cudaStream_t s) {
    if (n == 0) return 0;
    CUDA_CHECK(cuda_launch(rope_kernel, dim3(n, cuda_blocks((size_t)n_heads * (hd / 2), 128)), dim3(128), 0, s,
                           (__nv_bfloat16 *)x, pos, inv_freq, n_heads, hd, row_stride));
    return 0;
}

int cuda_silu_mul(void *out, const void *gu, int rows, int F, cudaStream_t s) {
    size_t n = (size_t)rows * F;
    if (n == 0) return 0;
    if (F % 8 == 0 && ((uintptr_t)out | (uintptr_t)gu) % 16 == 0) {
        CUDA_CHECK(cuda_launch(silu_mul_vec_kernel, dim3(cuda_blocks(n / 8, 128)), dim3(128), 0, s, (__nv_bfloat16 *)out,
                               (const __nv_bfloat16 *)gu, F, n / 8));
        return 0;
    }
    CUDA_CHECK(cuda_launch(silu_mul_kernel, dim3(cuda_blocks(n, 256)), dim3(256), 0, s, (__nv_bfloat16 *)out, (const __nv_bfloat16 *)gu, F, n));
    return 0;
}

/* out[rows][F] = SwiGLU of gu[rows][2F] in groups of 8 (F % 8 == 0, 16-byte aligned rows) */
int cuda_silu_mul_grouped(void *out, const void *gu, int rows, int F, cudaStream_t s) {
    size_t groups = (size_t)rows * (F / 8);
    if (groups == 0) return 0;
    if (F % 8 || ((uintptr_t)out | (uintptr_t)gu) % 16) return -1;
    CUDA_CHECK(cuda_launch(silu_mul_grouped_kernel, dim3(cuda_blocks(groups, 128)), dim3(128), 0, s,
                           (__nv_bfloat16 *)out, (const __nv_bfloat16 *)gu, groups));
    return 0;
}

/* x_out = x + y (x_out may be x), out = rmsnorm(x_out) * w, n rows of dim */
int cuda_add_rmsnorm_to(void *out, void *x_out, const void *x, const void *y, const void *w, int n, int dim, float eps,
                        bool norm_pdl, cudaStream_t s) {
    if (n == 0) return 0;
    unsigned t = (uintptr_t)x_out % 16 ? 0 : rms_threads(dim, out, x, y, w);
    if (t) {
        CUDA_CHECK(cuda_launch_pdl(norm_launch_pdl(norm_pdl, n), rmsnorm_vec_kernel, dim3(n), dim3(t), 0, s,
                                   (__nv_bfloat16 *)out, (__nv_bfloat16 *)x_out, (const __nv_bfloat16 *)x,
                                   (const __nv_bfloat16 *)y, (const __nv_bfloat16 *)w, dim, eps));
        return 0;
    }
    CUDA_CHECK(cuda_launch(add_rmsnorm_kernel, dim3(n), dim3(256), 0, s, (__nv_bfloat16 *)out, (__nv_bfloat16 *)x_out,
                           (const __nv_bfloat16 *)x, (const __nv_bfloat16 *)y, (const __nv_bfloat16 *)w, dim, eps));
    return 0;
}

int cuda_add_rmsnorm(void *out, void *x, const void *y, const void *w, int n, int dim, float eps, bool norm_pdl,
                     cudaStream_t s) {
    return cuda_add_rmsnorm_to(out, x, x, y, w, n, dim, eps, norm_pdl, s);
}


}  // extern "C"
