// Batch-invariant bf16 GEMM: y[t][n] = sum_k x[t][k] * w[n][k] (+ bias[n]), f32 accumulation,
// bf16 or f32 output. Every shape runs one kernel template whose tiles differ by batch size
// (a weight stream at decode batch sizes, 128 x 128 tensor-core tiles for prefill), but each
// output element is always summed the same way: K is cut into chunks of GEMM_KC; within a
// chunk one f32 accumulator is fed by mma.m16n8k16 over k = 0, 16, 32, ... in order (weights
// the A operand, tokens B); the chunk sums are added in order into a zero-started total; then
// the bias. Whether the chunks are summed in registers or by separate blocks (split-K, with the
// last block of a tile adding the partials in chunk order) is only a matter of speed. So a
// token's output does not depend on how many other tokens share the step (cuBLAS picks split-K
// and tile shapes by M, which changes the rounding), which is what keeps greedy outputs
// identical alone, batched and chunked.
//
// Shapes: K % 8 == 0 (16-byte rows); other K (tiny models) take a plain CUDA-core kernel
// that is equally order-fixed.
#include <cuda_bf16.h>
#include <stdint.h>

#include "cuda/cuda_common.h"

#define GEMM_KC 2048                // the K chunk of the summation order (a multiple of every BK)
#define GEMM_WS_FLOATS (16u << 20)  // split-K partials (64 MiB)
#define GEMM_COUNTERS 65536         // tiles of a split launch

static float *g_ws;      // partial sums [chunk][M][N]
static int *g_counters;  // per tile: chunks done (back to 0 after each tile)
static int g_sms = 132;

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool pred) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    int n = pred ? 16 : 0; // 0 bytes read: the 16 bytes are zero-filled
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t *r, const void *p) {
    unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t *r, const void *p) {
    unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(s));
}
__device__ __forceinline__ void mma_bf16(float *c, const uint32_t *a, const uint32_t *b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ void store_out(float *y, float v) { *y = v; }
__device__ __forceinline__ void store_out(__nv_bfloat16 *y, float v) { *y = __float2bfloat16(v); }

// A block covers BM = WMW * WMT * 16 weight rows and BN = WNW * WNT * 8 tokens; its warps form
// a WMW x WNW grid, each owning WMT m16 tiles x WNT n8 tiles. K advances BK per pipeline stage.
template <int WMW, int WMT, int WNW, int WNT, int BK, int STAGES> struct gemm_cfg {
    static constexpr int BM = WMW * WMT * 16, BN = WNW * WNT * 8, THREADS = 32 * WMW * WNW;
    static constexpr int LD = BK + 8; // padded smem rows (halves): ldmatrix rows hit distinct banks
    static constexpr bool XG = BN == 8; // one token tile: its B fragments straight from global (L1)
    static constexpr size_t SMEM = (size_t)STAGES * (BM + (XG ? 0 : BN)) * LD * 2;
};

template <int WMW, int WMT, int WNW, int WNT, int BK, int STAGES, typename OUT>
__global__ void __launch_bounds__(32 * WMW * WNW)
    gemm_kernel(OUT *__restrict__ y, const __nv_bfloat16 *__restrict__ x, const __nv_bfloat16 *__restrict__ w,
                const __nv_bfloat16 *__restrict__ bias, int M, int N, int K, float *__restrict__ ws,
                int *__restrict__ counters) {
    using C = gemm_cfg<WMW, WMT, WNW, WNT, BK, STAGES>;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    __nv_bfloat16 *sw = reinterpret_cast<__nv_bfloat16 *>(smem_raw);
    __nv_bfloat16 *sx = sw + (size_t)STAGES * C::BM * C::LD;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int wm = warp % WMW, wn = warp / WMW;
    const int t0 = blockIdx.x * C::BN, n0 = blockIdx.y * C::BM; // token tiles vary fastest: they share w
    const bool split = gridDim.z > 1; // this block sums chunk blockIdx.z only
    const int kbeg = split ? blockIdx.z * GEMM_KC : 0, kend = split ? min(K, kbeg + GEMM_KC) : K;
    const int nk = (kend - kbeg + BK - 1) / BK;
    const int g = lane / 4, q = lane % 4; // mma fragment coordinates

    // k tile kt of `rows` rows of src (row r0 on, rows >= lim zero) into stage buffer dst
    auto load_rows = [&](__nv_bfloat16 *dst, const __nv_bfloat16 *src, int rows, int r0, int lim, int kt) {
        constexpr int CPR = BK / 8; // 16-byte chunks per row
        int k0 = kbeg + kt * BK;
        for (int i = tid; i < rows * CPR; i += C::THREADS) {
            int r = i / CPR, c = (i % CPR) * 8, k = k0 + c;
            bool ok = r0 + r < lim && k < K;
            cp_async16(dst + r * C::LD + c, ok ? src + (size_t)(r0 + r) * K + k : src, ok);
        }
    };
    auto load_w = [&](int stage, int kt) { load_rows(sw + (size_t)stage * C::BM * C::LD, w, C::BM, n0, N, kt); };
    auto load_x = [&](int stage, int kt) {
        if constexpr (!C::XG) load_rows(sx + (size_t)stage * C::BN * C::LD, x, C::BN, t0, M, kt);
    };

    float acc[WMT][WNT][4], total[WMT][WNT][4];
#pragma unroll
    for (int i = 0; i < WMT; i++)
#pragma unroll
        for (int j = 0; j < WNT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = total[i][j][e] = 0.0f;

    // the first weight tiles stream in while the kernel before this one finishes (PDL); x and
    // every write wait for it
    pdl_trigger();
    for (int s = 0; s < STAGES - 1; s++)
        if (s < nk) load_w(s, s);
    pdl_wait();
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < nk) load_x(s, s);
        cp_async_commit();
    }
    for (int kt = 0; kt < nk; kt++) {
        cp_async_wait<STAGES - 2>();
        __syncthreads(); // stage kt landed for every thread; stage kt-1 is free to refill
        if (kt + STAGES - 1 < nk) {
            load_w((kt + STAGES - 1) % STAGES, kt + STAGES - 1);
            load_x((kt + STAGES - 1) % STAGES, kt + STAGES - 1);
        }
        cp_async_commit();
        const __nv_bfloat16 *cw = sw + (size_t)(kt % STAGES) * C::BM * C::LD;
        const __nv_bfloat16 *cx = sx + (size_t)(kt % STAGES) * C::BN * C::LD;
        // XG: token g's x row (zero past M) gives b0 = x[k + 2q, +1], b1 = x[k + 8 + 2q, +1]
        const uint32_t *xrow = reinterpret_cast<const uint32_t *>(x + (size_t)(t0 + g) * K);
        const bool xok = t0 + g < M;
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            uint32_t a[WMT][4], b[WNT][2];
#pragma unroll
            for (int i = 0; i < WMT; i++)
                ldmatrix_x4(a[i], cw + (size_t)((wm * WMT + i) * 16 + lane % 16) * C::LD + kk + (lane / 16) * 8);
            if constexpr (C::XG) {
                int k = kbeg + kt * BK + kk + 2 * q;
                b[0][0] = xok && k < K ? __ldg(xrow + k / 2) : 0u;
                b[0][1] = xok && k + 8 < K ? __ldg(xrow + k / 2 + 4) : 0u;
            } else if constexpr (WNT % 2 == 0) {
#pragma unroll
                for (int j = 0; j < WNT; j += 2) { // two n8 tiles per ldmatrix
                    uint32_t r[4];
                    ldmatrix_x4(r, cx + (size_t)((wn * WNT + j + lane / 16) * 8 + lane % 8) * C::LD + kk +
                                       ((lane / 8) % 2) * 8);
                    b[j][0] = r[0], b[j][1] = r[1], b[j + 1][0] = r[2], b[j + 1][1] = r[3];
                }
            } else {
#pragma unroll
                for (int j = 0; j < WNT; j++)
                    ldmatrix_x2(b[j], cx + (size_t)((wn * WNT + j) * 8 + lane % 8) * C::LD + kk + ((lane / 8) % 2) * 8);
            }
#pragma unroll
            for (int i = 0; i < WMT; i++)
#pragma unroll
                for (int j = 0; j < WNT; j++) mma_bf16(acc[i][j], a[i], b[j]);
        }
        int kn = kbeg + (kt + 1) * BK; // end of this k tile: a chunk ends here?
        if (kn % GEMM_KC == 0 || kn >= kend)
#pragma unroll
            for (int i = 0; i < WMT; i++)
#pragma unroll
                for (int j = 0; j < WNT; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) total[i][j][e] += acc[i][j][e], acc[i][j][e] = 0.0f;
    }
    cp_async_wait<0>();

    // f(n, t, total) for each output this thread holds: total[i][j] covers rows (weight n) g and
    // g + 8 of m tile i, columns (token t) 2q and 2q + 1 of n tile j
    auto each_out = [&](auto &&f) {
#pragma unroll
        for (int i = 0; i < WMT; i++)
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int j = 0; j < WNT; j++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        int n = n0 + (wm * WMT + i) * 16 + g + 8 * h, t = t0 + (wn * WNT + j) * 8 + 2 * q + e;
                        if (n < N && t < M) f(n, t, total[i][j][2 * h + e]);
                    }
    };
    if (split) {
        // partials out; the tile's last block adds them in chunk order (the same sum as above)
        float *part = ws + (size_t)blockIdx.z * M * N;
        each_out([&](int n, int t, float &v) { part[(size_t)t * N + n] = v; });
        __threadfence();
        __syncthreads();
        __shared__ int last;
        int tile = blockIdx.y * gridDim.x + blockIdx.x;
        if (tid == 0) last = atomicAdd(&counters[tile], 1) == (int)gridDim.z - 1;
        __syncthreads();
        if (!last) return;
        __threadfence();
        each_out([&](int n, int t, float &v) {
            float sum = 0.0f;
            for (int c = 0; c < (int)gridDim.z; c++) sum += __ldcg(ws + ((size_t)c * M + t) * N + n);
            v = sum;
        });
        if (tid == 0) counters[tile] = 0;
    }
    each_out([&](int n, int t, float &v) {
        store_out(y + (size_t)t * N + n, v + (bias ? __bfloat162float(bias[n]) : 0.0f));
    });
}

// K % 8 != 0: one thread per output, k in order (tiny models only).
template <typename OUT>
__global__ void gemm_plain_kernel(OUT *y, const __nv_bfloat16 *x, const __nv_bfloat16 *w, const __nv_bfloat16 *bias,
                                  int M, int N, int K) {
    pdl_wait();
    pdl_trigger();
    int n = blockIdx.x * blockDim.x + threadIdx.x, t = blockIdx.y;
    if (n >= N) return;
    const __nv_bfloat16 *xr = x + (size_t)t * K, *wr = w + (size_t)n * K;
    float total = 0.0f;
    for (int k0 = 0; k0 < K; k0 += GEMM_KC) {
        float acc = 0.0f;
        for (int k = k0; k < min(K, k0 + GEMM_KC); k++) acc = fmaf(__bfloat162float(xr[k]), __bfloat162float(wr[k]), acc);
        total += acc;
    }
    store_out(y + (size_t)t * N + n, total + (bias ? __bfloat162float(bias[n]) : 0.0f));
}

// The three tile shapes, by batch size. Each sums in the same order (see the top).
#define GEMM_SMALL 1, 1, 1, 1, 128, 6  // M <= 8: one warp streams 16 weight rows
#define GEMM_MID 4, 1, 1, 8, 64, 4     // M <= 64: 64 rows x 64 tokens, 4 warps
#define GEMM_BIG 2, 4, 4, 4, 32, 4     // 128 rows x 128 tokens, 8 warps

template <int WMW, int WMT, int WNW, int WNT, int BK, int STAGES, typename OUT>
static int launch(OUT *y, const void *x, const void *w, const void *bias, int M, int N, int K, cudaStream_t s) {
    using C = gemm_cfg<WMW, WMT, WNW, WNT, BK, STAGES>;
    auto kern = gemm_kernel<WMW, WMT, WNW, WNT, BK, STAGES, OUT>;
    dim3 grid((M + C::BN - 1) / C::BN, (N + C::BM - 1) / C::BM, 1);
    // too few tiles to fill the GPU: one block per K chunk, when the partials fit. At M <= 8 the
    // partials cost nothing next to the weights and more blocks mean more loads in flight; at
    // larger M they are real traffic, so only nearly idle grids split.
    unsigned chunks = (unsigned)((K + GEMM_KC - 1) / GEMM_KC), tiles = grid.x * grid.y;
    unsigned want = C::BN == 8 ? 8u * g_sms : (unsigned)g_sms / 2;
    if (chunks > 1 && tiles < want && tiles <= GEMM_COUNTERS && (size_t)chunks * M * N <= GEMM_WS_FLOATS)
        grid.z = chunks;
    CUDA_CHECK(cuda_launch(kern, grid, dim3(C::THREADS), C::SMEM, s, y, (const __nv_bfloat16 *)x,
                           (const __nv_bfloat16 *)w, (const __nv_bfloat16 *)bias, M, N, K, g_ws, g_counters));
    return 0;
}

template <int WMW, int WMT, int WNW, int WNT, int BK, int STAGES, typename OUT> static int allow_smem() {
    using C = gemm_cfg<WMW, WMT, WNW, WNT, BK, STAGES>;
    CUDA_CHECK(cudaFuncSetAttribute(gemm_kernel<WMW, WMT, WNW, WNT, BK, STAGES, OUT>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)C::SMEM));
    return 0;
}

template <typename OUT>
static int gemm(OUT *y, const void *x, const void *w, const void *bias, int M, int N, int K, cudaStream_t s) {
    if (M <= 0 || N <= 0) return 0;
    if (K % 8 || ((uintptr_t)x | (uintptr_t)w) % 16) {
        dim3 grid(cuda_blocks((size_t)N, 128), (unsigned)M);
        CUDA_CHECK(cuda_launch(gemm_plain_kernel<OUT>, grid, dim3(128), 0, s, y, (const __nv_bfloat16 *)x,
                               (const __nv_bfloat16 *)w, (const __nv_bfloat16 *)bias, M, N, K));
        return 0;
    }
    if (M <= 8) return launch<GEMM_SMALL>(y, x, w, bias, M, N, K, s);
    if (M <= 64) return launch<GEMM_MID>(y, x, w, bias, M, N, K, s);
    return launch<GEMM_BIG>(y, x, w, bias, M, N, K, s);
}

extern "C" {

/* Once per process, before any launch (graph capture included): the opt-in shared memory. */
int cuda_gemm_init(void) {
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, dev));
    if (!g_ws) CUDA_CHECK(cudaMalloc(&g_ws, (size_t)GEMM_WS_FLOATS * sizeof(float)));
    if (!g_counters) {
        CUDA_CHECK(cudaMalloc(&g_counters, GEMM_COUNTERS * sizeof(int)));
        CUDA_CHECK(cudaMemset(g_counters, 0, GEMM_COUNTERS * sizeof(int)));
    }
    int rc = allow_smem<GEMM_SMALL, __nv_bfloat16>() | allow_smem<GEMM_MID, __nv_bfloat16>() |
             allow_smem<GEMM_BIG, __nv_bfloat16>() | allow_smem<GEMM_SMALL, float>() |
             allow_smem<GEMM_MID, float>() | allow_smem<GEMM_BIG, float>();
    return rc ? -2 : 0;
}

int cuda_gemm_bf16(void *y, const void *x, const void *w, const void *bias, int M, int N, int K, cudaStream_t s) {
    return gemm((__nv_bfloat16 *)y, x, w, bias, M, N, K, s);
}

int cuda_gemm_f32out(float *y, const void *x, const void *w, int M, int N, int K, cudaStream_t s) {
    return gemm(y, x, w, NULL, M, N, K, s);
}

/* Which kernel a shape takes (for the op test's labels). */
const char *cuda_gemm_kind(int M, int K) {
    if (K % 8) return "plain kernel";
    return M <= 8 ? "small tiles" : M <= 64 ? "mid tiles" : "128x128 tiles";
}

}  // extern "C"
