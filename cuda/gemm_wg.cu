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

#include "cuda/gemm_common.cuh"
#include "cuda/gemm_wg.h"
#include "cuda/wgmma.cuh"

#define WG_BM 128       // weight rows a tile (two consumer warpgroups of 64)
#define WG_BK 64        // k a stage (one 128-byte swizzled token row)
#define WG_THREADS 384  // producer warpgroup + two consumers
#define WG_KT_CHUNK (GEMM_KC / WG_BK)

template <int BN> struct wg_cfg {
    static constexpr int X_BYTES = BN * WG_BK * 2;              // tokens of a stage
    static constexpr int W_BYTES = WG_BM / 16 * WG_BK / 16 * 512; // 8 strips x 4 packed 16 x 16 blocks
    static constexpr int STAGES = BN <= 64 ? 8 : 6;
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
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}
// wgmma descriptor of a K-major tile with 128-byte rows, 128-byte swizzle (8-row groups 1024 bytes apart)
__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | (1ull << 16) | ((uint64_t)(1024 >> 4) << 32) | (1ull << 62);
}

// Work item i: weight tile wt (WG_BM rows), token tile tt, chunk group gr (of S)
struct wg_item {
    int wt, tt, c_lo, c_hi;
};
__device__ __forceinline__ wg_item wg_item_of(int i, int S, int TT, int cpg, int chunks) {
    wg_item it;
    const int gr = i % S, rest = i / S;
    it.tt = rest % TT, it.wt = rest / TT;
    it.c_lo = gr * cpg, it.c_hi = min(chunks, it.c_lo + cpg);
    return it;
}

template <int BN, typename OUT, bool SW>
__global__ void __launch_bounds__(WG_THREADS, 1)
    gemm_wg_kernel(OUT *__restrict__ y, const __nv_bfloat16 *__restrict__ w, const __nv_bfloat16 *__restrict__ bias,
                   int M, int N, int K, float *__restrict__ ws, int *__restrict__ counters, int S, int cpg,
                   const __grid_constant__ CUtensorMap xmap) {
    using C = wg_cfg<BN>;
    constexpr int ST = C::STAGES;
    extern __shared__ unsigned char smem_raw[];
    const uint32_t base = (smem_u32(smem_raw) + 1023) & ~1023u;
    auto xs = [&](int s) { return base + s * C::X_BYTES; };
    auto wsm = [&](int s) { return base + ST * C::X_BYTES + s * C::W_BYTES; };
    const uint32_t full0 = base + ST * (C::X_BYTES + C::W_BYTES), empty0 = full0 + ST * 8;
    const unsigned char *gbase = smem_raw + (base - smem_u32(smem_raw)); // generic address of base

    const int NB = (N + 15) / 16, KB = (K + 15) / 16, KT = (KB + 3) / 4, chunks = (K + GEMM_KC - 1) / GEMM_KC;
    const int WT = (N + WG_BM - 1) / WG_BM, TT = (M + BN - 1) / BN, items = WT * TT * S;
    const bool split = S > 1;
    if (threadIdx.x == 0) {
        for (int s = 0; s < ST; s++) mbar_init(full0 + 8 * s, 1), mbar_init(empty0 + 8 * s, 8);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    pdl_wait();

    if (threadIdx.x < 128) { // producer
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        if (threadIdx.x != 0) return;
        int s = 0, ph = 0;
        for (int i = blockIdx.x; i < items; i += gridDim.x) {
            const wg_item it = wg_item_of(i, S, TT, cpg, chunks);
            const int strips = min(WG_BM / 16, NB - it.wt * (WG_BM / 16));
            const int kt_end = min(KT, it.c_hi * WG_KT_CHUNK);
            for (int kt = it.c_lo * WG_KT_CHUNK; kt < kt_end; kt++) {
                mbar_wait(empty0 + 8 * s, ph ^ 1);
                const int nkb = min(4, KB - kt * 4);
                const uint32_t full = full0 + 8 * s;
                mbar_expect_tx(full, C::X_BYTES + strips * nkb * 512);
                tma_tokens(xs(s), &xmap, kt * WG_BK, it.tt * BN, full);
                for (int st = 0; st < strips; st++)
                    bulk_copy(wsm(s) + st * 2048, w + ((size_t)(it.wt * (WG_BM / 16) + st) * KB + kt * 4) * 256, nkb * 512,
                              full);
                if (++s == ST) s = 0, ph ^= 1;
            }
        }
        return;
    }

    // consumers: warpgroup cw (0, 1) holds weight rows cw * 64 .. + 63 of the tile; warp wq of it strip wq
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
    const int cw = threadIdx.x / 128 - 1, wq = threadIdx.x / 32 % 4, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
    const int cwarp = cw * 4 + wq; // 0..7
    float acc[BN / 2], total[BN / 2];
#pragma unroll
    for (int j = 0; j < BN / 2; j++) acc[j] = 0.0f; // (defined before the first wgmma: a chunk's first step overwrites it)
    int s = 0, ph = 0;
    // f(n, t, v) for each output of the tile this thread holds in v (acc or total)
    auto each_out = [&](const wg_item &it, float(&v)[BN / 2], auto &&f) {
#pragma unroll
        for (int i = 0; i < BN / 2; i++) {
            const int n = it.wt * WG_BM + cwarp * 16 + g + 8 * ((i % 4) >> 1), t = it.tt * BN + (i / 4) * 8 + 2 * q + (i & 1);
            if (n < N && t < M) f(n, t, v[i]);
        }
    };
    for (int i = blockIdx.x; i < items; i += gridDim.x) {
        const wg_item it = wg_item_of(i, S, TT, cpg, chunks);
        const int kt_beg = it.c_lo * WG_KT_CHUNK, kt_end = min(KT, it.c_hi * WG_KT_CHUNK);
#pragma unroll
        for (int j = 0; j < BN / 2; j++) total[j] = 0.0f;
        int prev = -1; // the stage whose wgmma group may still be in flight
        // one k tile: its A fragments into a (two register sets alternate, so that loading the
        // next tile's never waits for the wgmma group still reading this one's), the wgmma group,
        // then the group before it done: its stage is released
        auto k_tile = [&](uint32_t(&a)[4][4], int kt) {
            mbar_wait(full0 + 8 * s, ph);
            const int nkb = min(4, KB - kt * 4);
            const uint4 *wa = reinterpret_cast<const uint4 *>(gbase + (wsm(s) - base) + cwarp * 2048) + lane;
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                const uint4 v = wa[kk * 32];
                a[kk][0] = v.x, a[kk][1] = v.y, a[kk][2] = v.z, a[kk][3] = v.w;
            }
            wgmma_fence();
            // a chunk's first step starts from zero (scale_d 0: only wgmma defines acc, so the
            // groups pipeline)
            const int keep = kt % WG_KT_CHUNK != 0;
            if (nkb == 4) {
#pragma unroll
                for (int kk = 0; kk < 4; kk++) wgmma_rs<BN>(acc, a[kk], sw128_desc(xs(s) + kk * 32), kk ? 1 : keep);
            } else { // K's last tile: its nkb < 4 k blocks (the stage holds nothing past them)
                for (int kk = 0; kk < nkb; kk++) wgmma_rs<BN>(acc, a[kk], sw128_desc(xs(s) + kk * 32), kk ? 1 : keep);
            }
            wgmma_commit();
            const bool chunk_end = (kt + 1) % WG_KT_CHUNK == 0 || kt + 1 == kt_end;
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
                if (split) { // this chunk's sum is a partial of its own
                    float *part = ws + (size_t)(kt / WG_KT_CHUNK) * M * N;
                    each_out(it, acc, [&](int n, int t, float &v) { part[(size_t)t * N + n] = v; });
                } else {
#pragma unroll
                    for (int j = 0; j < BN / 2; j++) total[j] += acc[j];
                }
            }
            if (++s == ST) s = 0, ph ^= 1;
        };
        uint32_t a0[4][4], a1[4][4];
        for (int kt = kt_beg; kt < kt_end; kt += 2) {
            k_tile(a0, kt);
            if (kt + 1 < kt_end) k_tile(a1, kt + 1);
        }
        if (split) { // the warp's last arrival adds its rows' partials in chunk order
            fence_acq_rel();
            __syncwarp();
            const int tile = (it.wt * TT + it.tt) * 8 + cwarp;
            int last = 0;
            if (lane == 0) last = atomicAdd(&counters[tile], it.c_hi - it.c_lo) == chunks - (it.c_hi - it.c_lo);
            if (!__shfl_sync(0xffffffffu, last, 0)) continue;
            fence_acq_rel();
            partials_in_order<BN / 2, 1>(ws, chunks, M, N, [&](int o, int &n, int &t) {
                n = it.wt * WG_BM + cwarp * 16 + g + 8 * ((o % 4) >> 1);
                t = it.tt * BN + (o / 4) * 8 + 2 * q + (o & 1);
            }, total);
            if (lane == 0) counters[tile] = 0;
        }
        if constexpr (SW) { // total[4j + e] is row g, total[4j + 2 + e] row g + 8: a gate and its up
#pragma unroll
            for (int j = 0; j < BN / 8; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int n = it.wt * WG_BM + cwarp * 16 + g, t = it.tt * BN + j * 8 + 2 * q + e;
                    if (n < N && t < M) store_swiglu(y, N, n, t, total[4 * j + e], total[4 * j + 2 + e]);
                }
        } else {
            each_out(it, total, [&](int n, int t, float &v) { store_out(y + (size_t)t * N + n, out_value(v, bias, n)); });
        }
    }
    pdl_trigger();
}

static PFN_cuTensorMapEncodeTiled_v12000 g_encode;

// The tokens' tensor map: x [M][K] bf16 row-major, boxes of WG_BK k x bn tokens, 128-byte
// swizzle, zeros past M and K.
static int token_map(CUtensorMap *map, const void *x, int M, int K, int bn) {
    cuuint64_t dims[2] = {(cuuint64_t)K, (cuuint64_t)M}, strides[1] = {(cuuint64_t)K * 2};
    cuuint32_t box[2] = {WG_BK, (cuuint32_t)bn}, es[2] = {1, 1};
    CUresult r = g_encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void *>(x), dims, strides, box, es,
                          CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                          CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "duoserve: cuTensorMapEncodeTiled failed (%d) for x %p, M %d, K %d\n", (int)r, x, M, K);
        return -2;
    }
    return 0;
}

template <int BN, typename OUT, bool SW>
static int wg_launch(OUT *y, const void *x, const void *w, const void *bias, int M, int N, int K,
                     const struct gemm_wg_env *env, cudaStream_t s) {
    CUtensorMap map;
    if (token_map(&map, x, M, K, BN)) return -2;
    const unsigned chunks = (unsigned)((K + GEMM_KC - 1) / GEMM_KC);
    const unsigned tiles = (unsigned)((N + WG_BM - 1) / WG_BM) * (unsigned)((M + BN - 1) / BN);
    // too few tiles for the GPU: chunk groups as separate work items, when the partials fit
    unsigned S = 1, cpg = chunks;
    if (tiles < (unsigned)env->sms && chunks > 1 && tiles * 8 <= GEMM_COUNTERS &&
        (size_t)chunks * M * N <= GEMM_WS_FLOATS) {
        S = min(chunks, (env->sms + tiles - 1) / tiles);
        cpg = (chunks + S - 1) / S;
        S = (chunks + cpg - 1) / cpg;
    }
    const unsigned items = tiles * S, grid = min(items, (unsigned)env->sms);
    CUDA_CHECK(cuda_launch(gemm_wg_kernel<BN, OUT, SW>, dim3(grid), dim3(WG_THREADS), wg_cfg<BN>::SMEM, s, y,
                           (const __nv_bfloat16 *)w, (const __nv_bfloat16 *)bias, M, N, K, env->ws, env->counters,
                           (int)S, (int)cpg, map));
    return 0;
}

template <int BN, typename OUT, bool SW> static int wg_allow() {
    CUDA_CHECK(cudaFuncSetAttribute(gemm_wg_kernel<BN, OUT, SW>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)wg_cfg<BN>::SMEM));
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
    return wg_allow<64, __nv_bfloat16, false>() | wg_allow<64, float, false>() | wg_allow<64, __nv_bfloat16, true>() |
           wg_allow<128, __nv_bfloat16, false>() | wg_allow<128, float, false>() | wg_allow<128, __nv_bfloat16, true>();
}

template <typename OUT, bool SW>
static int wg_gemm(OUT *y, const void *x, const void *w, const void *bias, int M, int N, int K,
                   const struct gemm_wg_env *env, cudaStream_t s) {
    if (M <= 64) return wg_launch<64, OUT, SW>(y, x, w, bias, M, N, K, env, s);
    return wg_launch<128, OUT, SW>(y, x, w, bias, M, N, K, env, s);
}

int gemm_wg_bf16(__nv_bfloat16 *y, const void *x, const void *w, const void *bias, int M, int N, int K, bool swiglu,
                 const struct gemm_wg_env *env, cudaStream_t s) {
    return swiglu ? wg_gemm<__nv_bfloat16, true>(y, x, w, NULL, M, N, K, env, s)
                  : wg_gemm<__nv_bfloat16, false>(y, x, w, bias, M, N, K, env, s);
}

int gemm_wg_f32(float *y, const void *x, const void *w, const void *bias, int M, int N, int K,
                const struct gemm_wg_env *env, cudaStream_t s) {
    return wg_gemm<float, false>(y, x, w, bias, M, N, K, env, s);
}
