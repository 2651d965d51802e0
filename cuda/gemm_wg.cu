// gemm_wg: the GEMM for M above the weight stream's batch sizes, on Hopper's wgmma. A block of
// three warpgroups: one producer warp streams each k tile into a ring of shared-memory stages
// (the tokens through a TMA tensor copy, 128-byte swizzled; the packed weight strips through
// bulk copies, both completing on the stage's mbarrier), two consumer warpgroups each multiply
// 64 weight rows (the wgmma A operand, from registers: a warp's strip of the packed layout is its
// A fragment, one 16-byte shared load a lane and k step) by the tile's BN tokens (B, from the
// swizzled stage). The grid is persistent: block b takes work items b, b + grid, ...
//
// The sums are gemm.cu's (see its top comment): K in chunks of GEMM_KC, each chunk summed from
// zero by m64nNk16 steps in k order (bit-equal to mma.m16n8k16 steps: wgmma and mma.sync round
// alike, which the op test checks), chunk sums added in order into a zero-started total. A
// work item is a tile's chunks or, when too few tiles fill the GPU, a group of them: then each
// chunk's sum is a partial of its own and each warp's last arrival adds its rows' partials in
// chunk order.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <string.h>

#include "cuda/gemm_common.cuh"
#include "cuda/gemm_wg.h"
#include "cuda/wgmma.cuh"

#define WG_BM 128       // weight rows a tile (two consumer warpgroups of 64)
#define WG_THREADS 384  // producer warpgroup + two consumers

// BN tokens x BK k a stage: BK / 64 token boxes of 64 k (128-byte swizzled rows) and the weight
// rows' BK / 16 packed 16 x 16 blocks of each of 8 strips
template <int BN, int BK> struct wg_cfg {
    static constexpr int X_BYTES = BN * BK * 2;
    static constexpr int W_BYTES = WG_BM / 16 * BK / 16 * 512;
    static constexpr int STAGES = 196608 / (X_BYTES + W_BYTES) < 8 ? 196608 / (X_BYTES + W_BYTES) : 8;
    static constexpr size_t SMEM = 1024 + (size_t)STAGES * (X_BYTES + W_BYTES) + 2 * STAGES * 8;
};

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, int parity) {
    uint32_t done = 0;
    while (!done)
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
}
__device__ __forceinline__ void tma_tokens(uint32_t dst, const CUtensorMap *map, int k, int t, uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
                 "l"(map), "r"(k), "r"(t), "r"(bar)
                 : "memory");
}
__device__ __forceinline__ void tma_weights(uint32_t dst, const CUtensorMap *map, int kb, int strip, uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
                 "l"(map), "r"(0), "r"(kb), "r"(strip), "r"(bar)
                 : "memory");
}
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}
// wgmma descriptor of a K-major tile with 128-byte rows, 128-byte swizzle (8-row groups 1024 bytes apart)
__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | (1ull << 16) | ((uint64_t)(1024 >> 4) << 32) | (1ull << 62);
}

// The work of a block, in segments: a tile's chunks [c_lo, c_hi). Tiles mode: block b takes the
// whole tiles b, b + grid, ...; stream-K (fewer tiles than SMs): the grid's blocks share the
// units (tile, chunk) evenly in order, block b units [b U / grid, (b + 1) U / grid), so a tile
// may be split over several blocks (the one holding its chunk 0 is its prefix).
struct wg_seg {
    int tile, c_lo, c_hi;
};
struct wg_walk {
    int u, u1; // stream-K: the next unit and the end of the block's range
    int i;     // tiles mode: the next tile
    __device__ wg_walk(bool sk, int T, int CH) {
        const int U = T * CH;
        u = (int)((long long)blockIdx.x * U / gridDim.x), u1 = (int)((long long)(blockIdx.x + 1) * U / gridDim.x);
        i = blockIdx.x;
    }
    __device__ bool next(bool sk, int T, int CH, wg_seg &sg) {
        if (!sk) {
            if (i >= T) return false;
            sg = {i, 0, CH};
            i += gridDim.x;
            return true;
        }
        if (u >= u1) return false;
        sg.tile = u / CH, sg.c_lo = u - sg.tile * CH, sg.c_hi = min(CH, u1 - sg.tile * CH);
        u = sg.tile * CH + sg.c_hi;
        return true;
    }
};
// stream-K over a grid of W blocks: the chunk that tile's prefix (the block holding its chunk 0)
// ends before (CH: the tile is whole in one block)
__device__ __forceinline__ int wg_prefix_end(int tile, int T, int CH, int W) {
    const long long U = (long long)T * CH, u = (long long)tile * CH;
    const long long b = ((u + 1) * W + U - 1) / U - 1; // the block whose range holds unit u
    return (int)min((long long)CH, (b + 1) * U / W - u);
}

struct wg_args {
    void *y; // OUT [M][N] (SW: [M][N / 2])
    const __nv_bfloat16 *w, *bias;
    int M, N, K;
    float *ws;   // stream-K partials [chunk][M][N]
    int sk, w3d;   // stream-K; packed weights through one 3D tensor copy a stage (else bulk copies a strip)
};

template <int BN, int BK, typename OUT, bool SW>
__global__ void __launch_bounds__(WG_THREADS, 1)
    gemm_wg_kernel(const wg_args p, const __grid_constant__ CUtensorMap xmap, const __grid_constant__ CUtensorMap wmap) {
    using C = wg_cfg<BN, BK>;
    constexpr int ST = C::STAGES, KS = BK / 16, KTC = GEMM_KC / BK; // k blocks a stage, stages a chunk
    extern __shared__ unsigned char smem_raw[];
    const uint32_t base = (smem_u32(smem_raw) + 1023) & ~1023u;
    auto xs = [&](int s) { return base + s * C::X_BYTES; };
    auto wsm = [&](int s) { return base + ST * C::X_BYTES + s * C::W_BYTES; };
    const uint32_t full0 = base + ST * (C::X_BYTES + C::W_BYTES), empty0 = full0 + ST * 8;
    const unsigned char *gbase = smem_raw + (base - smem_u32(smem_raw)); // generic address of base

    const int M = p.M, N = p.N, K = p.K;
    const int NB = (N + 15) / 16, KB = (K + 15) / 16, KT = (KB + KS - 1) / KS, CH = (K + GEMM_KC - 1) / GEMM_KC;
    const int TT = (M + BN - 1) / BN, T = (N + WG_BM - 1) / WG_BM * TT;
    const bool sk = p.sk != 0;
    if (threadIdx.x == 0) {
        for (int s = 0; s < ST; s++) mbar_init(full0 + 8 * s, 1), mbar_init(empty0 + 8 * s, 8);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    pdl_wait();

    if (threadIdx.x < 128) { // producer
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        int s = 0, ph = 0;
        if (threadIdx.x == 0) {
        wg_walk walk(sk, T, CH);
        wg_seg sg;
        while (walk.next(sk, T, CH, sg)) {
            const int wt = sg.tile / TT, tt = sg.tile % TT;
            const int strips = min(WG_BM / 16, NB - wt * (WG_BM / 16));
            const int kt_end = min(KT, sg.c_hi * KTC);
            for (int kt = sg.c_lo * KTC; kt < kt_end; kt++) {
                mbar_wait(empty0 + 8 * s, ph ^ 1);
                const int nkb = min(KS, KB - kt * KS), nx = (min(BK, K - kt * BK) + 63) / 64; // token boxes in K
                const uint32_t full = full0 + 8 * s;
                if (p.w3d) {
                    mbar_expect_tx(full, nx * BN * 128 + C::W_BYTES);
                    tma_weights(wsm(s), &wmap, kt * KS, wt * (WG_BM / 16), full);
                } else {
                    mbar_expect_tx(full, nx * BN * 128 + strips * nkb * 512);
                    for (int st = 0; st < strips; st++)
                        bulk_copy(wsm(s) + st * KS * 512, p.w + ((size_t)(wt * (WG_BM / 16) + st) * KB + kt * KS) * 256,
                                  nkb * 512, full);
                }
                for (int h = 0; h < nx; h++) tma_tokens(xs(s) + h * BN * 128, &xmap, kt * BK + h * 64, tt * BN, full);
                if (++s == ST) s = 0, ph ^= 1;
            }
        }
            }
    } else { // consumers
    // consumers: warpgroup cw (0, 1) holds weight rows cw * 64 .. + 63 of the tile; warp wq of it strip wq
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
    const int cw = threadIdx.x / 128 - 1, wq = threadIdx.x / 32 % 4, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
    const int cwarp = cw * 4 + wq; // 0..7
    float acc[BN / 2], total[BN / 2];
#pragma unroll
    for (int j = 0; j < BN / 2; j++) acc[j] = 0.0f; // (defined before the first wgmma: a chunk's first step overwrites it)
    int s = 0, ph = 0;
    wg_walk walk(sk, T, CH);
    wg_seg sg;
    while (walk.next(sk, T, CH, sg)) {
        const int wt = sg.tile / TT, tt = sg.tile % TT, n0 = wt * WG_BM + cwarp * 16 + g, t0 = tt * BN + 2 * q;
        // output i of this thread: row n0 + 8 ((i % 4) / 2), token t0 + 8 (i / 4) + i % 2
        auto each_out = [&](float(&v)[BN / 2], auto &&f) {
#pragma unroll
            for (int i = 0; i < BN / 2; i++) {
                const int n = n0 + 8 * ((i % 4) >> 1), t = t0 + (i / 4) * 8 + (i & 1);
                if (n < N && t < M) f(n, t, v[i]);
            }
        };
        const bool whole = sg.c_lo == 0 && sg.c_hi == CH, prefix = sg.c_lo == 0;
        const int kt_beg = sg.c_lo * KTC, kt_end = min(KT, sg.c_hi * KTC);
#pragma unroll
        for (int j = 0; j < BN / 2; j++) total[j] = 0.0f;
        int prev = -1; // the stage whose wgmma group may still be in flight
        // one k tile: its A fragments into a, the wgmma group, then the group before it done: its
        // stage is released; at a chunk's end its sum goes into total (the prefix's chunks) or to
        // a partial of its own
        auto xdesc = [&](int kk) { return sw128_desc(xs(s) + (kk / 4) * BN * 128 + (kk % 4) * 32); };
        auto k_tile = [&](uint32_t(&a)[KS][4], int kt) {
            mbar_wait(full0 + 8 * s, ph);
            const int nkb = min(KS, KB - kt * KS);
            const uint4 *wa = reinterpret_cast<const uint4 *>(gbase + (wsm(s) - base) + cwarp * KS * 512) + lane;
#pragma unroll
            for (int kk = 0; kk < KS; kk++) {
                const uint4 v = wa[kk * 32];
                a[kk][0] = v.x, a[kk][1] = v.y, a[kk][2] = v.z, a[kk][3] = v.w;
            }
            wgmma_fence();
            // a chunk's first step starts from zero (scale_d 0: only wgmma defines acc, so the
            // groups pipeline)
            const int keep = kt % KTC != 0;
            if (nkb == KS) {
#pragma unroll
                for (int kk = 0; kk < KS; kk++) wgmma_rs<BN>(acc, a[kk], xdesc(kk), kk ? 1 : keep);
            } else { // K's last tile: its nkb < KS k blocks
                for (int kk = 0; kk < nkb; kk++) wgmma_rs<BN>(acc, a[kk], xdesc(kk), kk ? 1 : keep);
            }
            wgmma_commit();
            const bool chunk_end = (kt + 1) % KTC == 0 || kt + 1 == kt_end;
            if (chunk_end) wgmma_wait<0>();
            else wgmma_wait<1>();
            if (prev >= 0) { // its group is done: the stage may be refilled
                __syncwarp();
                if (lane == 0) mbar_arrive(empty0 + 8 * prev);
            }
            prev = s;
            if (chunk_end) {
                wgmma_hold<BN / 2>(acc);
                __syncwarp();
                if (lane == 0) mbar_arrive(empty0 + 8 * s);
                prev = -1;
                if (prefix) {
#pragma unroll
                    for (int j = 0; j < BN / 2; j++) total[j] += acc[j];
                } else { // a chunk of a split tile past its prefix: a partial of its own
                    float *part = p.ws + (size_t)(kt / KTC) * M * N;
                    each_out(acc, [&](int n, int t, float &v) { part[(size_t)t * N + n] = v; });
                }
            }
            if (++s == ST) s = 0, ph ^= 1;
        };
        uint32_t a0[KS][4], a1[KS][4];
        for (int kt = kt_beg; kt < kt_end; kt += 2) {
            k_tile(a0, kt);
            if (kt + 1 < kt_end) k_tile(a1, kt + 1);
        }
        if (!whole) { // a split tile: the prefix's total out (the fixup kernel adds the rest in chunk order)
            if (prefix) {
                float *part = p.ws + (size_t)(sg.c_hi - 1) * M * N;
                each_out(total, [&](int n, int t, float &v) { part[(size_t)t * N + n] = v; });
            }
            continue;
        }
        OUT *y = (OUT *)p.y;
        if constexpr (SW) { // total[4j + e] is row g, total[4j + 2 + e] row g + 8: a gate and its up
#pragma unroll
            for (int j = 0; j < BN / 8; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int t = t0 + j * 8 + e;
                    if (n0 < N && t < M) store_swiglu(y, N, n0, t, total[4 * j + e], total[4 * j + 2 + e]);
                }
        } else {
            each_out(total, [&](int n, int t, float &v) { store_out(y + (size_t)t * N + n, out_value(v, p.bias, n)); });
        }
    }
    }
    pdl_trigger();
}

// Stream-K's split tiles: each output's prefix total (slot j - 1) plus its chunks j.. in order,
// then the epilogue; a thread an output (SW: a gate row and its up row, y[t][N / 2])
template <typename OUT, bool SW>
__global__ void gemm_wg_fixup_kernel(const wg_args p, int BN, int W) {
    pdl_wait();
    const int M = p.M, N = p.N, CH = (p.K + GEMM_KC - 1) / GEMM_KC, TT = (M + BN - 1) / BN;
    const int T = (N + WG_BM - 1) / WG_BM * TT, NO = SW ? N / 2 : N;
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)M * NO) return;
    const int t = (int)(idx / NO), o = (int)(idx % NO), n = SW ? (o / 8) * 16 + o % 8 : o;
    const int j = wg_prefix_end((n / WG_BM) * TT + t / BN, T, CH, W);
    if (j == CH) return; // a whole tile: stored by its block
    const float *ws = p.ws + (size_t)t * N + n;
    const size_t cs = (size_t)M * N;
    float v = __ldcg(ws + (j - 1) * cs), u = SW ? __ldcg(ws + (j - 1) * cs + 8) : 0.0f;
    for (int c = j; c < CH; c++) {
        v += __ldcg(ws + c * cs);
        if (SW) u += __ldcg(ws + c * cs + 8);
    }
    OUT *y = (OUT *)p.y;
    if constexpr (SW) store_swiglu(y, N, n, t, v, u);
    else store_out(y + (size_t)t * N + n, out_value(v, p.bias, n));
}

static PFN_cuTensorMapEncodeTiled_v12000 g_encode;

// The tokens' tensor map: x [M][K] bf16 row-major, boxes of 64 k x bn tokens, 128-byte
// swizzle, zeros past M and K.
static int token_map(CUtensorMap *map, const void *x, int M, int K, int bn) {
    cuuint64_t dims[2] = {(cuuint64_t)K, (cuuint64_t)M}, strides[1] = {(cuuint64_t)K * 2};
    cuuint32_t box[2] = {64, (cuuint32_t)bn}, es[2] = {1, 1};
    CUresult r = g_encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void *>(x), dims, strides, box, es,
                          CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                          CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "duoserve: cuTensorMapEncodeTiled failed (%d) for x %p, M %d, K %d\n", (int)r, x, M, K);
        return -2;
    }
    return 0;
}

// The packed weights' tensor map: [NB strips][KB blocks][256 elements], boxes of bk / 16 blocks x
// 8 strips (a stage's), zeros past the matrix.
static int weight_map(CUtensorMap *map, const void *w, int N, int K, int bk) {
    const int NB = (N + 15) / 16, KB = (K + 15) / 16;
    cuuint64_t dims[3] = {256, (cuuint64_t)KB, (cuuint64_t)NB}, strides[2] = {512, (cuuint64_t)KB * 512};
    cuuint32_t box[3] = {256, (cuuint32_t)bk / 16, WG_BM / 16}, es[3] = {1, 1, 1};
    CUresult r = g_encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void *>(w), dims, strides, box, es,
                          CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                          CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "duoserve: cuTensorMapEncodeTiled failed (%d) for w %p, N %d, K %d\n", (int)r, w, N, K);
        return -2;
    }
    return 0;
}

static struct gemm_wg_tune g_tune = {0, 0, 1, 64};

template <int BN, int BK, typename OUT, bool SW>
static int wg_launch(OUT *y, const void *x, const void *w, const void *bias, int M, int N, int K,
                     const struct gemm_wg_env *env, cudaStream_t s) {
    CUtensorMap xm, wm;
    if (token_map(&xm, x, M, K, BN)) return -2;
    if (g_tune.w3d && weight_map(&wm, w, N, K, BK)) return -2;
    if (!g_tune.w3d) memset(&wm, 0, sizeof wm);
    const unsigned chunks = (unsigned)((K + GEMM_KC - 1) / GEMM_KC);
    const unsigned tiles = (unsigned)((N + WG_BM - 1) / WG_BM) * (unsigned)((M + BN - 1) / BN);
    // fewer tiles than SMs: stream-K over (tile, chunk) units, when the partials fit
    const bool sk = g_tune.sk && tiles < (unsigned)env->sms && chunks > 1 && (size_t)chunks * M * N <= GEMM_WS_FLOATS;
    const unsigned grid = sk ? (unsigned)min((size_t)env->sms, (size_t)tiles * chunks) : min(tiles, (unsigned)env->sms);
    const wg_args a = {y, (const __nv_bfloat16 *)w, (const __nv_bfloat16 *)bias, M, N, K, env->ws, sk, g_tune.w3d};
    CUDA_CHECK(cuda_launch(gemm_wg_kernel<BN, BK, OUT, SW>, dim3(grid), dim3(WG_THREADS), wg_cfg<BN, BK>::SMEM, s, a, xm,
                           wm));
    if (sk) {
        const size_t outs = (size_t)M * (SW ? N / 2 : N);
        CUDA_CHECK(cuda_launch(gemm_wg_fixup_kernel<OUT, SW>, dim3(cuda_blocks(outs, 256)), dim3(256), 0, s, a, BN, (int)grid));
    }
    return 0;
}

template <int BN, int BK> static int wg_allow() {
    const int smem = (int)wg_cfg<BN, BK>::SMEM;
    CUDA_CHECK(cudaFuncSetAttribute(gemm_wg_kernel<BN, BK, __nv_bfloat16, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    CUDA_CHECK(cudaFuncSetAttribute(gemm_wg_kernel<BN, BK, float, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    CUDA_CHECK(cudaFuncSetAttribute(gemm_wg_kernel<BN, BK, __nv_bfloat16, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    return 0;
}

int gemm_wg_init(void) {
    cudaDriverEntryPointQueryResult q;
    void *fn = NULL;
    CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q));
    if (q != cudaDriverEntryPointSuccess || !fn) {
        fprintf(stderr, "duoserve: the CUDA driver has no cuTensorMapEncodeTiled\n");
        return -2;
    }
    g_encode = (PFN_cuTensorMapEncodeTiled_v12000)fn;
    return wg_allow<64, 64>() | wg_allow<128, 64>() | wg_allow<64, 128>() | wg_allow<128, 128>();
}

template <typename OUT, bool SW>
static int wg_gemm(OUT *y, const void *x, const void *w, const void *bias, int M, int N, int K,
                   const struct gemm_wg_env *env, cudaStream_t s) {
    const bool bn64 = g_tune.bn == 64 || (!g_tune.bn && M <= 64), bk128 = g_tune.bk == 128;
    if (bn64) return bk128 ? wg_launch<64, 128, OUT, SW>(y, x, w, bias, M, N, K, env, s)
                           : wg_launch<64, 64, OUT, SW>(y, x, w, bias, M, N, K, env, s);
    return bk128 ? wg_launch<128, 128, OUT, SW>(y, x, w, bias, M, N, K, env, s)
                 : wg_launch<128, 64, OUT, SW>(y, x, w, bias, M, N, K, env, s);
}

void gemm_wg_set_tune(const struct gemm_wg_tune *t) { g_tune = *t; }

int gemm_wg_bf16(__nv_bfloat16 *y, const void *x, const void *w, const void *bias, int M, int N, int K, bool swiglu,
                 const struct gemm_wg_env *env, cudaStream_t s) {
    return swiglu ? wg_gemm<__nv_bfloat16, true>(y, x, w, NULL, M, N, K, env, s)
                  : wg_gemm<__nv_bfloat16, false>(y, x, w, bias, M, N, K, env, s);
}

int gemm_wg_f32(float *y, const void *x, const void *w, const void *bias, int M, int N, int K,
                const struct gemm_wg_env *env, cudaStream_t s) {
    return wg_gemm<float, false>(y, x, w, bias, M, N, K, env, s);
}
