// gemm_wg: the GEMM for M above the weight stream's batch sizes, on Hopper's wgmma. A block of
// three warpgroups: one producer thread streams each k tile into a ring of shared-memory stages
// (the tokens through a 2D TMA tensor copy, 128-byte swizzled; the packed weight strips through
// a 3D one, both completing on the stage's mbarrier); two consumer warpgroups each multiply 64
// weight rows (the wgmma A operand, from registers: a warp's strip of the packed layout is its A
// fragment, one 16-byte shared load a lane and k block) by the tile's BN tokens (B, from the
// swizzled stage), one wgmma group in flight while the next is issued. Above M 4096 the tiles are
// 192 tokens of 64 k a stage; at 64 and 128 tokens a tile's chunks go in pairs on two accumulator
// sets (the tensor cores drain once a pair). The grid is persistent; from M 2048 its
// blocks pair up in clusters of two on neighbouring weight tiles, each copying half of the
// tokens into both (TMA multicast).
//
// The sums are gemm.cu's (see its top comment): K in chunks of GEMM_KC, each chunk summed from
// zero by m64nNk16 steps in k order (bit-equal to mma.m16n8k16 steps: wgmma and mma.sync round
// alike, which the op test checks), chunk sums added in order into a zero-started total. Past
// K the stage holds zeros (the tensor copies fill them), and a step of zero products leaves a
// sum as it is. When the tiles are fewer than the SMs, the blocks share the (tile, chunk) units
// (stream-K): a tile split over several blocks has its chunks past the prefix as partials, and
// a fixup kernel adds them in chunk order.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/gemm_common.cuh"
#include "cuda/gemm_wg.h"
#include "cuda/hopper.cuh"
#include "cuda/wgmma.cuh"

#define WG_BM 128       // weight rows a tile (two consumer warpgroups of 64)
#define WG_THREADS 384  // producer warpgroup + two consumers
#ifndef WG_GROUP // (a build may set it)
#define WG_GROUP 16 // tiles mode: weight tiles a group (their token tiles walked together: see wg_walk)
#endif
static_assert(WG_GROUP % 2 == 0, "WG_GROUP / 2 tile pairs a group (MC)");
#define WG_GROUP_MIN 2048 // ... from this M up (below it, weight-major order: decode b256 was 12% slower grouped)
#ifndef WG_MC_MIN // (a build may set it: scripts/device_pack.sh's VARIANTS)
#define WG_MC_MIN 2048 // tile pairs sharing their tokens (clusters of two) from this M up (0: never)
#endif

// BN tokens x BK k a stage: BK / 64 token boxes of 64 k (128-byte swizzled rows) and the weight
// rows' 8 packed 16 x 16 blocks of each of 8 strips
template <int BN, int BK> struct wg_cfg {
    static constexpr int X_BYTES = BN * BK * 2;
    static constexpr int W_BYTES = WG_BM / 16 * BK / 16 * 512;
    static constexpr int ROOM = 229376;
    static constexpr int STAGES = ROOM / (X_BYTES + W_BYTES) < 8 ? ROOM / (X_BYTES + W_BYTES) : 8;
    static constexpr size_t SMEM = 1024 + (size_t)STAGES * (X_BYTES + W_BYTES) + 2 * STAGES * 8;
};

__device__ __forceinline__ void tma_tokens(uint32_t dst, const CUtensorMap *map, int k, int t, uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
                 "l"(map), "r"(k), "r"(t), "r"(bar)
                 : "memory");
}
// the same into the same offset of each block of the cluster in mask (and each one's mbarrier at bar's offset)
__device__ __forceinline__ void tma_tokens_mc(uint32_t dst, const CUtensorMap *map, int k, int t, uint32_t bar, uint16_t mask) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
                 "l"(map), "r"(k), "r"(t), "r"(bar), "h"(mask)
                 : "memory");
}
// weight strips [strip, strip + 8) x k blocks [kb, kb + BK / 16) into dst
__device__ __forceinline__ void tma_weights(uint32_t dst, const CUtensorMap *map, int kb, int strip, uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
                 "l"(map), "r"(0), "r"(kb), "r"(strip), "r"(bar)
                 : "memory");
}
// the B descriptor of k block kk of a stage at x: BK >= 64: boxes of 64 k, 128-byte rows; BK 32: one
// box of 32 k, 64-byte rows
template <int BN, int BK> __device__ __forceinline__ uint64_t x_desc(uint32_t x, int kk) {
    if constexpr (BK >= 64) return sw128_desc(x + (kk / 4) * BN * 128 + (kk % 4) * 32);
    else return sw64_desc(x + kk * 32);
}

// The work of a block, in segments: a tile's chunks [c_lo, c_hi). Tiles mode: block b takes the
// whole tiles b, b + grid, ...;
// stream-K: the grid's blocks share the units (tile, chunk) evenly in order, block b units
// [b U / grid, (b + 1) U / grid), so a tile may be split over several blocks (the one holding
// its chunk 0 is its prefix). Tiles are numbered weight tile major, token tiles fastest.
struct wg_seg {
    int tile, wt, tt, c_lo, c_hi; // tile = wt * TT + tt
};
// Tiles mode from M WG_GROUP_MIN walks the tiles in groups of WG_GROUP weight tiles, each group's token tiles outer
// and its weight tiles inner, so that the blocks at work at once share a few token tiles and a
// few weight tiles in the L2 (in plain weight-major order they spread over every token tile, and
// at M 8192 each pass of the grid over one or two weight tiles read all 64 MB of tokens again).
// MC (tiles mode): the grid's blocks in clusters of two, cluster c taking the tile pairs c, c +
// clusters, ..., pair i the weight tiles 2 w and 2 w + 1 (one a block) of a token tile, in
// groups of WG_GROUP / 2 pairs
struct wg_walk {
    int u, u1; // stream-K: the next unit and the end of the block's range
    int i;     // tiles mode: the next tile (MC: pair)
    int mc;    // MC: 1 + the block's rank in its cluster (0: no clusters)
    int gw;    // weight tiles a group (0: weight-major order)
    __device__ wg_walk(bool sk, int T, int CH, int M, int mc_ = 0) : mc(mc_), gw(M >= WG_GROUP_MIN ? WG_GROUP : 0) {
        const int U = T * CH;
        u = (int)((long long)blockIdx.x * U / gridDim.x), u1 = (int)((long long)(blockIdx.x + 1) * U / gridDim.x);
        i = mc ? blockIdx.x / 2 : blockIdx.x;
    }
    // item i of NW x TT (weight item, token tile) in groups of GW weight items (GW 0: weight-major)
    __device__ static void grouped(int i, int NW, int TT, int GW, int &w, int &tt) {
        if (GW <= 0) {
            w = i / TT, tt = i % TT;
            return;
        }
        const int g = i / (GW * TT), r = i - g * GW * TT, gs = min(GW, NW - g * GW);
        tt = r / gs, w = g * GW + r % gs;
    }
    __device__ bool next(bool sk, int T, int TT, int CH, wg_seg &sg) {
        if (mc) {
            if (i >= T / 2) return false;
            int w, tt;
            grouped(i, T / TT / 2, TT, gw / 2, w, tt);
            const int wt = 2 * w + mc - 1;
            sg = {wt * TT + tt, wt, tt, 0, CH};
            i += gridDim.x / 2;
            return true;
        }
        if (!sk) {
            if (i >= T) return false;
            int wt, tt;
            grouped(i, T / TT, TT, gw, wt, tt);
            sg = {wt * TT + tt, wt, tt, 0, CH};
            i += gridDim.x;
            return true;
        }
        if (u >= u1) return false;
        sg.tile = u / CH, sg.c_lo = u - sg.tile * CH, sg.c_hi = min(CH, u1 - sg.tile * CH);
        sg.wt = sg.tile / TT, sg.tt = sg.tile % TT;
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
    const __nv_bfloat16 *bias;
    int M, N, K;
    float *ws; // stream-K partials [chunk][M][N]
    int sk;    // stream-K
};

// MC: clusters of two blocks (wg_walk), each block's tile the other's neighbour in weights and
// the same tokens: each block copies half of a stage's token rows into both (TMA multicast: the
// L2 sends the tokens once for two tiles), and a stage is refilled only when both blocks'
// consumers are done with it (each releases it in both blocks: 16 arrivals). xmap's boxes are
// then BN / 2 tokens.
template <int BN, int BK, typename OUT, bool SW, bool MC = false>
__global__ void __launch_bounds__(WG_THREADS, 1)
    gemm_wg_kernel(const wg_args p, const __grid_constant__ CUtensorMap xmap, const __grid_constant__ CUtensorMap wmap) {
    using C = wg_cfg<BN, BK>;
    constexpr int ST = C::STAGES, KS = BK / 16, KTC = GEMM_KC / BK; // k blocks a stage, stages a chunk
    static_assert(KTC >= 2 && KTC % 2 == 0, "the consumers take a chunk's k tiles in pairs");
    extern __shared__ unsigned char smem_raw[];
    const uint32_t base = (smem_u32(smem_raw) + 1023) & ~1023u;
    auto xs = [&](int s) { return base + s * C::X_BYTES; };
    auto wsm = [&](int s) { return base + ST * C::X_BYTES + s * C::W_BYTES; };
    const uint32_t full0 = base + ST * (C::X_BYTES + C::W_BYTES), empty0 = full0 + ST * 8;
    const unsigned char *gbase = smem_raw + (base - smem_u32(smem_raw)); // generic address of base

    const int M = p.M, N = p.N, K = p.K;
    const int KB = (K + 15) / 16, KT0 = (KB + KS - 1) / KS, CH = (K + GEMM_KC - 1) / GEMM_KC;
    // k tiles go in pairs, so the last chunk's count is rounded up to even (a tile wholly past K
    // is zeros, and a step of zero products leaves the sum as it is)
    const int KT = (CH - 1) * KTC + ((KT0 - (CH - 1) * KTC + 1) & ~1);
    const int TT = (M + BN - 1) / BN, T = (N + WG_BM - 1) / WG_BM * TT;
    const bool sk = p.sk != 0;
    const uint32_t crank = MC ? cluster_rank() : 0;
    if (threadIdx.x == 0) {
        for (int s = 0; s < ST; s++) mbar_init(full0 + 8 * s, 1), mbar_init(empty0 + 8 * s, MC ? 16 : 8);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if constexpr (MC) cluster_sync(); // the other block's barriers initialized
    pdl_wait();

    if (threadIdx.x < 128) { // producer
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
        if (threadIdx.x == 0) {
            int s = 0, ph = 0;
            wg_walk walk(sk, T, CH, M, MC ? 1 + crank : 0);
            wg_seg sg;
            while (walk.next(sk, T, TT, CH, sg)) {
                const int kt_end = min(KT, sg.c_hi * KTC);
                for (int kt = sg.c_lo * KTC; kt < kt_end; kt++) {
                    mbar_wait(empty0 + 8 * s, ph ^ 1);
                    const uint32_t full = full0 + 8 * s;
                    // every box of the stage, also one wholly past K: the copies fill zeros past the
                    // matrix, and every k block of a stage goes through the wgmma group
                    mbar_expect_tx(full, C::X_BYTES + C::W_BYTES);
                    tma_weights(wsm(s), &wmap, kt * KS, sg.wt * (WG_BM / 16), full);
                    constexpr int XB = BK < 64 ? BK : 64; // k a token box
                    if constexpr (MC) { // this block's half of the token rows, into both blocks
                        for (int h = 0; h < BK / XB; h++)
                            tma_tokens_mc(xs(s) + h * BN * XB * 2 + crank * (BN / 2) * XB * 2, &xmap, kt * BK + h * XB,
                                          sg.tt * BN + crank * (BN / 2), full, 0x3);
                    } else {
                        for (int h = 0; h < BK / XB; h++) tma_tokens(xs(s) + h * BN * XB * 2, &xmap, kt * BK + h * XB, sg.tt * BN, full);
                    }
                    if (++s == ST) s = 0, ph ^= 1;
                }
            }
        }
    } else { // consumers: warpgroup cw (0, 1) holds weight rows cw * 64 .. + 63 of the tile; warp wq of it strip wq
        asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
        const int cw = threadIdx.x / 128 - 1, wq = threadIdx.x / 32 % 4, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
        const int cwarp = cw * 4 + wq; // 0..7
        // PAIR: chunks in pairs on two accumulator sets (below; not at 192 tokens, whose three sets
        // would not fit 240 registers, nor at 128 x 128 x 128, whose A fragments leave no room)
        constexpr bool PAIR = BN <= 128 && !(BN == 128 && BK == 128);
        float acc[BN / 2], acc2[PAIR ? BN / 2 : 1], total[BN / 2];
        auto tot = [&](int i) -> float & { return total[i]; }; // running total i of this thread
#pragma unroll
        for (int j = 0; j < BN / 2; j++) acc[j] = 0.0f; // (defined before the first wgmma: a chunk's first step overwrites it)
#pragma unroll
        for (int j = 0; j < (PAIR ? BN / 2 : 1); j++) acc2[j] = 0.0f;
        int s = 0, ph = 0;
        auto release = [&](int st) { // stage st may be refilled (MC: in both blocks)
            __syncwarp();
            if (lane == 0) {
                mbar_arrive(empty0 + 8 * st);
                if constexpr (MC) mbar_arrive_cluster(empty0 + 8 * st, crank ^ 1);
            }
        };
        wg_walk walk(sk, T, CH, M, MC ? 1 + crank : 0);
        wg_seg sg;
        while (walk.next(sk, T, TT, CH, sg)) {
            const int n0 = sg.wt * WG_BM + cwarp * 16 + g, t0 = sg.tt * BN + 2 * q;
            // output i of this thread: row n0 + 8 ((i % 4) / 2), token t0 + 8 (i / 4) + i % 2; f(n, t,
            // v(i)) for each within the matrix (v: an accumulator's or a running total's reference)
            auto each_out = [&](auto &&v, auto &&f) {
#pragma unroll
                for (int i = 0; i < BN / 2; i++) {
                    const int n = n0 + 8 * ((i % 4) >> 1), t = t0 + (i / 4) * 8 + (i & 1);
                    if (n < N && t < M) f(n, t, v(i));
                }
            };
            const bool whole = sg.c_lo == 0 && sg.c_hi == CH, prefix = sg.c_lo == 0;
#pragma unroll
            for (int j = 0; j < BN / 2; j++) total[j] = 0.0f;
            // A chunk's sum into total (the prefix's chunks) or a partial of its own (a chunk of a split
            // tile past its prefix), its groups all complete
            auto finish = [&](int c, float(&ac)[BN / 2]) {
                if (prefix) {
#pragma unroll
                    for (int j = 0; j < BN / 2; j++) total[j] += ac[j];
                } else {
                    float *part = p.ws + (size_t)c * M * N;
                    // (stream-K runs at 128 k a stage (wg_choose): compiled there only; its index
                    // arithmetic spilled 28 bytes at 64 k a stage, 600 at 192 tokens)
                    if constexpr (BK == 128) each_out([&](int i) -> float & { return ac[i]; }, [&](int n, int t, float &v) { part[(size_t)t * N + n] = v; });
                }
            };
            // each k tile: its A fragments, its wgmma group, then the group before it done (one group
            // in flight while the next is issued), so that one's stage is released; k tiles in
            // pairs, the A fragments of the two in registers of their own (tile kt's loaded while
            // kt - 1's group runs, after kt - 2's was waited for). zero: the chunk's first group
            // (overwrites ac); rel: a group before it to release
            int prev = s;
            uint32_t a0[KS][4], a1[KS][4];
            auto step = [&](float(&ac)[BN / 2], uint32_t(&a)[KS][4], int zero, bool rel) {
                mbar_wait(full0 + 8 * s, ph);
                const uint4 *wa = reinterpret_cast<const uint4 *>(gbase + (wsm(s) - base) + cwarp * KS * 512) + lane;
#pragma unroll
                for (int kk = 0; kk < KS; kk++) {
                    const uint4 v = wa[kk * 32];
                    a[kk][0] = v.x, a[kk][1] = v.y, a[kk][2] = v.z, a[kk][3] = v.w;
                }
                wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < KS; kk++) wgmma_rs<BN>(ac, a[kk], x_desc<BN, BK>(xs(s), kk), kk ? 1 : !zero);
                wgmma_commit();
                wgmma_wait<1>(); // the group before is done: its stage may be refilled
                if (rel) release(prev);
                prev = s;
                if (++s == ST) s = 0, ph ^= 1;
            };
            if constexpr (PAIR) {
                // Chunks in pairs on two accumulator sets (acc, acc2): the first chunk's sum is added
                // once the second chunk's first group is in flight, so the tensor cores drain once a
                // pair, not at every chunk's end. The sums are the same (each chunk from zero, added
                // in order). (The pair ends drained: ptxas serializes every wgmma of the kernel when
                // a group is still in flight across the loop's back edge and read after it.)
                auto chunk = [&](int c, float(&ac)[BN / 2]) { // the chunk's groups after its first
                    const int k0 = c * KTC, k1 = min(KT, k0 + KTC);
                    step(ac, a1, 0, true);
                    for (int kt = k0 + 2; kt < k1; kt += 2) step(ac, a0, 0, true), step(ac, a1, 0, true);
                };
                int c = sg.c_lo;
                for (; c + 1 < sg.c_hi; c += 2) {
                    step(acc, a0, 1, false);
                    chunk(c, acc);
                    step(acc2, a0, 1, true); // (its wait: chunk c is complete)
                    wgmma_hold<BN / 2>(acc);
                    finish(c, acc);
                    chunk(c + 1, acc2);
                    wgmma_wait<0>();
                    release(prev);
                    wgmma_hold<BN / 2>(acc2);
                    finish(c + 1, acc2);
                }
                if (c < sg.c_hi) {
                    step(acc, a0, 1, false);
                    chunk(c, acc);
                    wgmma_wait<0>();
                    release(prev);
                    wgmma_hold<BN / 2>(acc);
                    finish(c, acc);
                }
            } else {
                // chunk by chunk, each drained before its sum is added into the totals
                for (int c = sg.c_lo; c < sg.c_hi; c++) {
                    const int k0 = c * KTC, k1 = min(KT, k0 + KTC);
                    for (int kt = k0; kt < k1; kt += 2) step(acc, a0, kt == k0, kt != k0), step(acc, a1, 0, true);
                    wgmma_wait<0>();
                    wgmma_hold<BN / 2>(acc);
                    release(prev);
                    finish(c, acc);
                }
            }
            if (!whole) { // a split tile: the prefix's total out (the fixup kernel adds the rest in chunk order)
                if (prefix) {
                    float *part = p.ws + (size_t)(sg.c_hi - 1) * M * N;
                    each_out(tot, [&](int n, int t, float &v) { part[(size_t)t * N + n] = v; });
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
                        if (n0 < N && t < M) store_swiglu(y, N, n0, t, tot(4 * j + e), tot(4 * j + 2 + e));
                    }
            } else {
                each_out(tot, [&](int n, int t, float &v) { store_out(y + (size_t)t * N + n, out_value(v, p.bias, n)); });
            }
        }
        pdl_trigger();
    }
    if constexpr (MC) cluster_sync(); // no block leaves while the other may still write to it
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

static int encode(CUtensorMap *map, int rank, const void *ptr, const cuuint64_t *dims, const cuuint64_t *strides,
                  const cuuint32_t *box, CUtensorMapSwizzle sw) {
    const cuuint32_t es[3] = {1, 1, 1};
    CUresult r = g_encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, rank, const_cast<void *>(ptr), dims, strides, box, es,
                          CU_TENSOR_MAP_INTERLEAVE_NONE, sw, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "duoserve: cuTensorMapEncodeTiled failed (%d) for %p (%llu x %llu)\n", (int)r, ptr,
                (unsigned long long)dims[rank - 1], (unsigned long long)dims[0]);
        return -2;
    }
    return 0;
}

// The tokens' tensor map: x [M][K] bf16 row-major, boxes of 64 k x bn tokens, 128-byte swizzle
// (bk 32: 32 k, 64-byte swizzle), zeros past M and K.
static int token_map(CUtensorMap *map, const void *x, int M, int K, int bn, int bk) {
    const cuuint64_t dims[2] = {(cuuint64_t)K, (cuuint64_t)M}, strides[1] = {(cuuint64_t)K * 2};
    const cuuint32_t box[2] = {bk < 64 ? (cuuint32_t)bk : 64, (cuuint32_t)bn};
    return encode(map, 2, x, dims, strides, box, bk < 64 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_128B);
}

// The packed weights' tensor map: [NB strips][KB blocks][256 elements], boxes of bk / 16 blocks x
// `strips` strips, zeros past the matrix.
static int weight_map(CUtensorMap *map, const void *w, int N, int K, int bk, int strips) {
    const cuuint64_t dims[3] = {256, (cuuint64_t)(K + 15) / 16, (cuuint64_t)(N + 15) / 16},
                     strides[2] = {512, (cuuint64_t)(K + 15) / 16 * 512};
    const cuuint32_t box[3] = {256, (cuuint32_t)bk / 16, (cuuint32_t)strips};
    return encode(map, 3, w, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_NONE);
}

template <int BN, int BK, typename OUT, bool SW, bool MC = false>
static int wg_launch(OUT *y, const void *x, const void *w, const void *bias, int M, int N, int K, bool sk,
                     const struct gemm_wg_env *env, cudaStream_t s) {
    CUtensorMap xm, wm;
    if (sk && BK != 128) return -2; // (the kernel writes stream-K partials at 128 k a stage only)
    if (token_map(&xm, x, M, K, MC ? BN / 2 : BN, BK) || weight_map(&wm, w, N, K, BK, WG_BM / 16)) return -2;
    const unsigned chunks = (unsigned)((K + GEMM_KC - 1) / GEMM_KC);
    const unsigned tiles = (unsigned)((N + WG_BM - 1) / WG_BM) * (unsigned)((M + BN - 1) / BN);
    const wg_args a = {y, (const __nv_bfloat16 *)bias, M, N, K, env->ws, sk};
    if constexpr (MC) { // clusters of two, a tile pair each (wg_choose: the weight tiles even, no stream-K),
        // as many as the device holds at once (a GPC's SMs pair up: fewer than sms / 2 may fit)
        static int resident_of[64]; // by device (the same GEMM may run on several)
        int dev = 0;
        CUDA_CHECK(cudaGetDevice(&dev));
        int &resident = resident_of[dev & 63];
        if (!resident) {
            cudaLaunchConfig_t cfg = {};
            cfg.gridDim = dim3(2 * (env->sms / 2)), cfg.blockDim = dim3(WG_THREADS), cfg.dynamicSmemBytes = wg_cfg<BN, BK>::SMEM;
            cudaLaunchAttribute at;
            at.id = cudaLaunchAttributeClusterDimension;
            at.val.clusterDim.x = 2, at.val.clusterDim.y = 1, at.val.clusterDim.z = 1;
            cfg.attrs = &at, cfg.numAttrs = 1;
            int n = 0;
            CUDA_CHECK(cudaOccupancyMaxActiveClusters(&n, gemm_wg_kernel<BN, BK, OUT, SW, true>, &cfg));
            resident = n > 0 ? n : 1;
        }
        const unsigned grid = 2 * min(tiles / 2, (unsigned)resident);
        CUDA_CHECK(cuda_launch_cluster(false, dim3(2, 1, 1), gemm_wg_kernel<BN, BK, OUT, SW, true>, dim3(grid), dim3(WG_THREADS),
                                       wg_cfg<BN, BK>::SMEM, s, a, xm, wm));
        return 0;
    }
    const unsigned grid = sk ? (unsigned)min((size_t)env->sms, (size_t)tiles * chunks) : min(tiles, (unsigned)env->sms);
    CUDA_CHECK(cuda_launch(gemm_wg_kernel<BN, BK, OUT, SW>, dim3(grid), dim3(WG_THREADS), wg_cfg<BN, BK>::SMEM, s, a, xm, wm));
    if (sk) {
        const size_t outs = (size_t)M * (SW ? N / 2 : N);
        CUDA_CHECK(cuda_launch(gemm_wg_fixup_kernel<OUT, SW>, dim3(cuda_blocks(outs, 256)), dim3(256), 0, s, a, BN, (int)grid));
    }
    return 0;
}

template <int BN, int BK> static int wg_allow() {
    const int smem = (int)wg_cfg<BN, BK>::SMEM;
    static_assert(wg_cfg<BN, BK>::SMEM <= 232448, "shared memory");
    CUDA_CHECK(cudaFuncSetAttribute(gemm_wg_kernel<BN, BK, __nv_bfloat16, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    CUDA_CHECK(cudaFuncSetAttribute(gemm_wg_kernel<BN, BK, float, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    CUDA_CHECK(cudaFuncSetAttribute(gemm_wg_kernel<BN, BK, __nv_bfloat16, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    if constexpr (BN >= 128 && WG_MC_MIN > 0) {
        CUDA_CHECK(cudaFuncSetAttribute(gemm_wg_kernel<BN, BK, __nv_bfloat16, false, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        CUDA_CHECK(cudaFuncSetAttribute(gemm_wg_kernel<BN, BK, float, false, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        CUDA_CHECK(cudaFuncSetAttribute(gemm_wg_kernel<BN, BK, __nv_bfloat16, true, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    }
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
    return wg_allow<64, 128>() | wg_allow<64, 64>() | wg_allow<128, 128>() | wg_allow<128, 64>() | wg_allow<192, 64>();
}

// The tile and the split for M x N x K (runs 39-40: each Llama-3-8B GEMM alone at M 64..8192):
// - 64-token tiles up to M 64, and above it where their waves cost less: a 64-token tile takes
//   ~0.73 of a 128-token one's time (o and down at M 256, one wave either way: 22.3 and 67.2 us
//   against 30.6 and 92.3);
// - stream-K over (tile, chunk) units when the tiles fill at most a quarter of the SMs (o and down
//   at M 64, 32 tiles: 17.0 and 51.7 us against 22.0 and 67.0 whole; at 48 tiles, qkv, and at
//   M 128, whole tiles were faster) and the partials fit;
// - 64 k a stage at 64 < M <= 4096 (3-10% faster at M 256-2048 than 128), 128 otherwise;
// - above M 4096 (WG_T192_MIN), 192-token tiles of 64 k a stage with the totals in registers (runs
//   68 and 70, M 8192: gate|up 2,799-2,876 us against 3,485-3,660 with the 256-token tiles of run
//   43, whose totals sat in shared memory, and 3,089 at 32 k a stage; prefill 8k 33,547 tok/s
//   against 29,130);
// - from M 2048 (WG_MC_MIN), tile pairs sharing their tokens (MC) where the weight tiles pair up
//   (runs 63-64: 2-5% faster GEMMs at M 2048 and 8192, gate|up at 2048 819 us against 847, down
//   378 against 399; slower below, down at M 1024 197 against 179, decode b256 14.06 ms against
//   13.25 with pairs from M 256).
struct wg_plan {
    int bn, bk;
    bool sk, mc;
};
static wg_plan wg_choose(int M, int N, int K, int sms) {
    const long nt = (N + WG_BM - 1) / WG_BM, t64 = nt * ((M + 63) / 64), t128 = nt * ((M + 127) / 128);
    const long w64 = (t64 + sms - 1) / sms, w128 = (t128 + sms - 1) / sms;
    wg_plan pl;
    pl.bn = M <= 64 || 73 * w64 < 100 * w128 ? 64 : 128;
    const long tiles = pl.bn == 64 ? t64 : t128, chunks = (K + GEMM_KC - 1) / GEMM_KC;
    pl.sk = 4 * tiles <= sms && chunks > 1 && (size_t)chunks * M * N <= GEMM_WS_FLOATS;
    pl.bk = M <= 64 || M > 4096 || pl.sk ? 128 : 64;
    if (M > WG_T192_MIN && !pl.sk) pl.bn = 192, pl.bk = 64;
    pl.mc = WG_MC_MIN > 0 && M >= WG_MC_MIN && !pl.sk && pl.bn >= 128 && nt % 2 == 0 && nt >= 2;
    return pl;
}

template <typename OUT, bool SW>
static int wg_gemm(OUT *y, const void *x, const void *w, const void *bias, int M, int N, int K,
                   const struct gemm_wg_env *env, cudaStream_t s) {
    wg_plan pl = wg_choose(M, N, K, env->sms);
    if constexpr (WG_MC_MIN > 0) {
        if (pl.mc && pl.bn == 192) return wg_launch<192, 64, OUT, SW, true>(y, x, w, bias, M, N, K, false, env, s);
        if (pl.mc && pl.bn == 128)
            return pl.bk == 128 ? wg_launch<128, 128, OUT, SW, true>(y, x, w, bias, M, N, K, false, env, s)
                                : wg_launch<128, 64, OUT, SW, true>(y, x, w, bias, M, N, K, false, env, s);
    }
    if (pl.bn == 192) return wg_launch<192, 64, OUT, SW>(y, x, w, bias, M, N, K, false, env, s);
    if (pl.bn == 64) return pl.bk == 128 ? wg_launch<64, 128, OUT, SW>(y, x, w, bias, M, N, K, pl.sk, env, s)
                                         : wg_launch<64, 64, OUT, SW>(y, x, w, bias, M, N, K, pl.sk, env, s);
    return pl.bk == 128 ? wg_launch<128, 128, OUT, SW>(y, x, w, bias, M, N, K, pl.sk, env, s)
                        : wg_launch<128, 64, OUT, SW>(y, x, w, bias, M, N, K, pl.sk, env, s);
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
