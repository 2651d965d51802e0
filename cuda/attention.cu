// Attention over the two KV pools on the GPU: appending K/V to the paged full pool and to the
// streaming slots, and the attention itself with the same masks as the CPU reference
// (engine/backend_cpu.c): retrieval heads are causal (and windowed when the model says so), a
// streaming head's query at position i sees key j iff j <= i and (j < sink or i - j < recent).
// Keys of the current chunk are read from the batch, older ones from the pools, so results do
// not depend on chunking.
//
// flash_kernel (tensor cores, below) serves head dims up to 128 that are multiples of 8 and
// GQA groups up to 16; attn_kernel (CUDA cores: one block per (query token, query head), 4
// warps taking every 4th visible key, lanes splitting the head dimension, online softmax per
// warp, merged at the end) serves the rest.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>

#include "cuda/attn_common.cuh"
#include "cuda/attn_decode.h"
#include "cuda/attn_plan.h"
#include "cuda/attn_prefill.h"
#include "cuda/cuda_attention.h"
#include "cuda/cuda_common.h"
#include "cuda/hopper.cuh"

#define ATTN_WARPS 4
#define ATTN_UNROLL 4

// a decode token's partitions run in parallel from this many on
#define ATTN_SPLIT_MIN_PARTS 2

__device__ __forceinline__ const __nv_bfloat16 *full_row(const __nv_bfloat16 *cache, const struct cuda_attn_args &a,
                                                         int s, int p, int h) {
    int blk = a.block_ids[a.block_indptr[s] + p / a.block_size];
    return cache + full_pool_row(a, blk, p % a.block_size, h) * a.head_dim;
}

__device__ __forceinline__ size_t stream_off(const struct cuda_attn_args &a, int slot, int p, int h) {
    int r = p < a.sink ? p : a.sink + (p - a.sink) % a.recent;
    return stream_pool_row(a, slot, r, h) * a.head_dim;
}

// One visible key per call: the number of visible keys and the j of the v-th one.
struct key_range {
    int a0, a1, b0, b1; // keys [a0, a1) then [b0, b1)
    __device__ int count() const { return (a1 - a0) + (b1 - b0); }
    __device__ int key(int v) const { return v < a1 - a0 ? a0 + v : b0 + (v - (a1 - a0)); }
};

// A K or V element at p, of a pool (F8: p's element offset in pool, as the fp8 pool's bytes) or of
// the step's rows (srow; F8: rounded as the pool would hold it), as f32; F8 either way
// bf16(e4m3 * scale), as the flash kernels read it.
template <bool F8>
__device__ __forceinline__ float kv_elem(const __nv_bfloat16 *p, const __nv_bfloat16 *pool, bool srow, float scale) {
    if constexpr (F8)
        return __bfloat162float(srow ? kv8_round(*p, scale) : kv8_get(reinterpret_cast<const uint8_t *>(pool)[p - pool], scale));
    return __bfloat162float(*p);
}

template <int PER, bool F8 = false> // F8: the pools are fp8 (cuda_attn_args.kv_fp8)
__global__ void attn_kernel(__nv_bfloat16 *out, const __nv_bfloat16 *q, const __nv_bfloat16 *kb,
                            const __nv_bfloat16 *vb, int rs, struct cuda_attn_args a) {
    // lane owns dims lane, lane + 32, ... (PER of them, the last ones masked when hd < 32 * PER)
    pdl_trigger();
    pdl_wait();
    const int HD = a.head_dim;
    int t = blockIdx.x, h = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int group = a.n_heads / a.n_kv_heads, kvh = h / group;
    int s = a.tok_seq[t], pos = a.pos[t], row0 = a.seq_start[s], pos0 = a.pos[row0];
    bool full = kvh < a.n_full;
    key_range kr;
    if (full) {
        int first = a.sliding_window > 0 && pos - a.sliding_window + 1 > 0 ? pos - a.sliding_window + 1 : 0;
        kr = {first, pos + 1, 0, 0};
    } else {
        int sink_end = min(a.sink, pos + 1);
        int rec_start = max(a.sink, pos - a.recent + 1);
        kr = {0, sink_end, rec_start, max(rec_start, pos + 1)};
    }
    float qv[PER], acc[PER];
    const __nv_bfloat16 *qrow = q + (size_t)t * rs + (size_t)h * HD;
    for (int i = 0; i < PER; i++) {
        int d = i * 32 + lane;
        qv[i] = d < HD ? __bfloat162float(qrow[d]) * a.scale : 0.0f;
        acc[i] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    int n = kr.count();
    const __nv_bfloat16 *kpool = full ? a.k_full : a.k_stream, *vpool = full ? a.v_full : a.v_stream;
    const float ksc = F8 ? a.k_scale[kvh] : 1.0f, vsc = F8 ? a.v_scale[kvh] : 1.0f;
    // ATTN_UNROLL keys per warp iteration: their loads and shuffle reductions are independent,
    // so their latencies overlap (one key at a time left the SMs waiting on memory and shuffles)
    for (int base = warp * ATTN_UNROLL; base < n; base += ATTN_WARPS * ATTN_UNROLL) {
        float d[ATTN_UNROLL];
        const __nv_bfloat16 *vp[ATTN_UNROLL];
        bool srow[ATTN_UNROLL]; // (F8) the key's K/V from the step's q|k|v rows, rounded as the pool would hold them
        for (int u = 0; u < ATTN_UNROLL; u++) {
            int vi = base + u;
            d[u] = 0.0f;
            vp[u] = NULL;
            srow[u] = false;
            if (vi >= n) continue;
            int j = kr.key(vi);
            const __nv_bfloat16 *kp;
            if (full) {
                kp = full_row(a.k_full, a, s, j, kvh);
                vp[u] = full_row(a.v_full, a, s, j, kvh);
            } else if (j >= pos0) {
                size_t off = (size_t)(row0 + j - pos0) * rs + (size_t)kvh * HD;
                kp = kb + off;
                vp[u] = vb + off;
                srow[u] = true;
            } else {
                size_t off = stream_off(a, a.stream_slot[s], j, kvh - a.n_full);
                kp = a.k_stream + off;
                vp[u] = a.v_stream + off;
            }
            for (int i = 0; i < PER; i++)
                if (i * 32 + lane < HD) d[u] += qv[i] * kv_elem<F8>(kp + i * 32 + lane, kpool, srow[u], ksc);
        }
        for (int o = 16; o > 0; o >>= 1)
            for (int u = 0; u < ATTN_UNROLL; u++) d[u] += __shfl_xor_sync(0xffffffffu, d[u], o);
        float m_new = m;
        for (int u = 0; u < ATTN_UNROLL; u++)
            if (vp[u]) m_new = fmaxf(m_new, d[u]);
        float corr = __expf(m - m_new);
        l *= corr;
        for (int i = 0; i < PER; i++) acc[i] *= corr;
        for (int u = 0; u < ATTN_UNROLL; u++) {
            if (!vp[u]) continue;
            float p = __expf(d[u] - m_new);
            l += p;
            for (int i = 0; i < PER; i++)
                if (i * 32 + lane < HD) acc[i] += p * kv_elem<F8>(vp[u] + i * 32 + lane, vpool, srow[u], vsc);
        }
        m = m_new;
    }
    // merge the warps' partial softmaxes
    __shared__ float sm[ATTN_WARPS], sl[ATTN_WARPS];
    __shared__ float sacc[ATTN_WARPS][PER * 32];
    if (lane == 0) {
        sm[warp] = m;
        sl[warp] = l;
    }
    for (int i = 0; i < PER; i++) sacc[warp][i * 32 + lane] = acc[i];
    __syncthreads();
    if (warp == 0) {
        float M = -INFINITY;
        for (int w = 0; w < ATTN_WARPS; w++) M = fmaxf(M, sm[w]);
        float L = 0.0f;
        for (int w = 0; w < ATTN_WARPS; w++) L += sm[w] == -INFINITY ? 0.0f : sl[w] * __expf(sm[w] - M);
        __nv_bfloat16 *orow = out + ((size_t)t * a.n_heads + h) * HD;
        for (int i = 0; i < PER; i++) {
            int d = i * 32 + lane;
            if (d >= HD) break;
            float o = 0.0f;
            for (int w = 0; w < ATTN_WARPS; w++)
                if (sm[w] != -INFINITY) o += sacc[w][d] * __expf(sm[w] - M);
            orow[d] = __float2bfloat16(o / L);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Tensor-core attention (FlashAttention-2 style, mma.m16n8k16), for prefill and decode alike.
// One warp owns a "unit": 16 query rows = (token, head) pairs of one sequence and one KV head,
// heads of the GQA group fastest (G = 4: 4 tokens x 4 heads; a decode token: 4 of 16 rows), so
// each K/V tile is read once for the whole group. Keys are walked in tiles of FA_KT absolute
// positions (tile k = positions [k FA_KT, (k + 1) FA_KT)), in order, wherever they live: the
// paged pool (retrieval heads), the sink rows and recent ring of the streaming slot, or this
// step's batch rows. A row's result therefore depends only on its own visible keys, never on
// which rows share its unit or how the prompt was chunked: keys a row cannot see add exactly
// nothing (p = 0). That keeps greedy outputs identical alone, batched and chunked. Within a
// partition the arithmetic is every kernel's (attn_common.cuh): S for the partition's tiles, one
// softmax over them (fa_part_softmax), and o = P V from zero with P in bf16 (below head dim 64: its
// bf16 head and remainder, fa_p_split), the keys' k16 steps in order; partitions are merged in
// order (fa_merge_begin / fa_merge_o).
// Invisible keys are zero-filled, never read, so stale pool rows cannot inject NaN.

// FA_CLOCKS builds (profiling only; scripts/device_pack.sh makes one): thread 0 of block (0, 0, 0)
// stamps clock64() at the flash kernel's phases into g_fa_clk (the last launch's), read by
// cuda_attention_clocks, which only such a build has. Other builds compile no stamp.
#ifdef FA_CLOCKS
__device__ long long g_fa_clk[64];
#define FA_STAMP(i) do { if (threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0) g_fa_clk[i] = clock64(); } while (0)
// at entry (the other stamps cleared) and at the end, also %globaltimer (ns) in [48] and [49]
__device__ __forceinline__ long long fa_globaltimer() { long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }
#define FA_STAMP_GT(i, k) do { if (threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0) { \
    if ((i) == 0) for (int c_ = 1; c_ < 64; c_++) g_fa_clk[c_] = 0; \
    g_fa_clk[k] = fa_globaltimer(); g_fa_clk[i] = clock64(); } } while (0)
// %globaltimer (ns) into [k] from thread 0 of any block of (token 0, KV head 0): the merging block
#define FA_GT_ANY(k) do { if (threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0) g_fa_clk[k] = fa_globaltimer(); } while (0)
extern "C" int cuda_attention_clocks(long long *out) { return cudaMemcpyFromSymbol(out, g_fa_clk, sizeof g_fa_clk) == cudaSuccess ? 64 : 0; }
#else
#define FA_STAMP(i) do { } while (0)
#define FA_STAMP_GT(i, k) do { } while (0)
#define FA_GT_ANY(k) do { } while (0)
#endif

// HDP: the head dim padded to a multiple of 16 (16, 32, 64 or 128); dims >= head_dim are zero.
// A block of FA_WARPS warps takes FA_WARPS consecutive units of one sequence and KV head: they
// share every K/V tile through shared memory (loaded by all threads), each warp computing its
// own rows; a warp skips tiles none of its rows can see, which changes nothing for them.
#define FA_WARPS 4

#define FA_STAGES 3 // K/V tiles in flight: the one summed and the next two loading (COOP: FA_PT)
// DEC (decode steps: every sequence one token, so a block has one unit), with head dims 64 or 128
// (PV takes output tiles in pairs): the block's warps share the unit ("cooperative"), a partition
// at a time. Its FA_PT == FA_WARPS tiles load at once; warp w computes the scores of tile w and
// puts them in shared memory; every warp then runs the partition's softmax (the same bits in
// each) and sums P V for its HDP / 8 / FA_WARPS output tiles only. Each value is computed
// exactly as a lone warp computes it (the same bits as prefill), the scores of four tiles at
// once. One copy of Q.
template <int HDP, bool DEC> struct fa_cfg {
    static constexpr bool COOP = DEC && FA_PT == FA_WARPS && (HDP / 8) % (2 * FA_WARPS) == 0;
    static constexpr int OT = COOP ? HDP / 8 / FA_WARPS : HDP / 8; // output n8 tiles of a warp
    static constexpr int STAGES = COOP ? FA_PT : FA_STAGES, QW = COOP ? 1 : FA_WARPS; // K/V buffers, Q copies
    static constexpr int LD = HDP + 8; // padded smem rows: conflict-free ldmatrix
    // K, V x STAGES buffers; Q (per warp, or one); then each warp's partition total O (f32,
    // lane-private, OT * 4 a lane); then (COOP) the partition's scores, [tile][FA_KT / 8][4][32] f32
    static constexpr size_t BF16_BYTES = (size_t)(2 * STAGES * FA_KT + 16 * QW) * LD * 2;
    static constexpr size_t XS_OFF = BF16_BYTES + (size_t)FA_WARPS * OT * 4 * 32 * 4;
    // then (COOP) the block's partition state of each of up to 16 heads, [head][HDP + 2] f32
    // (cluster merges: read by the cluster's first block)
    static constexpr size_t ST_OFF = XS_OFF + (COOP ? (size_t)FA_PT * (FA_KT / 8) * 4 * 32 * 4 : 0);
    static constexpr size_t BYTES = ST_OFF + (COOP ? (size_t)16 * (HDP + 2) * 4 : 0);
};

#define FA_MERGE_AHEAD 8 // partition states a merging warp loads at once (two batches in flight)

// One partition state {m, l, o} of a head folded into its running total (M, L, O) by one warp:
// this lane's dims lane, lane + 32, .. (o_at(i): o[lane + 32 i])
template <int NI, typename OAT>
__device__ __forceinline__ void fa_fold(float &M, float &L, float (&O)[NI], float m, float l, int lane, int HD,
                                        OAT &&o_at) {
    float ca, cb;
    if (!fa_merge_begin(M, L, m, l, ca, cb)) return;
#pragma unroll
    for (int i = 0; i < NI; i++)
        if (lane + 32 * i < HD) O[i] = fa_merge_o(O[i], o_at(i), ca, cb);
}
// A merged head's output, O / L, written by its warp (this lane's dims)
template <int NI>
__device__ __forceinline__ void fa_store_head(__nv_bfloat16 *out, const struct cuda_attn_args &a, int t, int head,
                                              const float (&O)[NI], float L, int lane) {
    const int HD = a.head_dim;
    float inv = 1.0f / L;
    __nv_bfloat16 *orow = out + ((size_t)t * a.n_heads + head) * HD;
    for (int i = 0; i < NI; i++) {
        int d = lane + 32 * i;
        if (d < HD) orow[d] = __float2bfloat16(O[i] * inv);
    }
}

__device__ __forceinline__ bool fa_split_fits(const struct cuda_attn_args &a, int n_tokens) {
    return fa_split_fits_n(a, a.part_off[n_tokens]);
}

// The states of token t's partitions for one head, merged in order (as the unsplit kernel does
// in registers) into out = O / L; one warp. States are read from L2: other blocks wrote them.
template <int NI> // head dims up to 32 * NI
__device__ void fa_merge_head(__nv_bfloat16 *out, const struct cuda_attn_args &a, int t, int head, int lane) {
    const int HD = a.head_dim, n_parts = cuda_attn_parts(a.pos[t]);
    float M = -INFINITY, L = 0.0f, O[NI];
    for (int i = 0; i < NI; i++) O[i] = 0.0f;
    // the states in batches of FA_MERGE_AHEAD (their loads overlap), folded in order, the next
    // batch loading while one is folded (two buffers); past the end a state is empty (m = -inf)
    struct batch {
        float m[FA_MERGE_AHEAD], l[FA_MERGE_AHEAD], o[FA_MERGE_AHEAD][NI];
    } bA, bB;
    auto load = [&](batch &b, int p0) {
#pragma unroll
        for (int u = 0; u < FA_MERGE_AHEAD; u++) {
            const float *st = fa_state(a, t, min(p0 + u, n_parts - 1), head);
            b.m[u] = p0 + u < n_parts ? __ldcg(st) : -INFINITY;
            b.l[u] = __ldcg(st + 1);
#pragma unroll
            for (int i = 0; i < NI; i++) b.o[u][i] = lane + 32 * i < HD ? __ldcg(st + 2 + lane + 32 * i) : 0.0f;
        }
    };
    auto fold = [&](const batch &b) {
#pragma unroll
        for (int u = 0; u < FA_MERGE_AHEAD; u++) fa_fold(M, L, O, b.m[u], b.l[u], lane, HD, [&](int i) { return b.o[u][i]; });
    };
    load(bA, 0);
    for (int p0 = 0; p0 < n_parts; p0 += 2 * FA_MERGE_AHEAD) {
        load(bB, p0 + FA_MERGE_AHEAD);
        fold(bA);
        if (p0 + FA_MERGE_AHEAD >= n_parts) break;
        load(bA, p0 + 2 * FA_MERGE_AHEAD);
        fold(bB);
    }
    fa_store_head(out, a, t, head, O, L, lane);
}

// The same merge by the flash kernel's last block of a (token t, KV head kvh): the states of its G
// heads are copied into shared memory (cp.async, smem_bytes of it) a group of partitions at a
// time, one round trip a group, and folded in order from there by one warp a head (heads warp,
// warp + FA_WARPS, ..: up to 4 a warp), with fa_merge_head's arithmetic (the same bits). Short
// loops, not unrolled: like the rest of a decode step's attention it runs once a layer on an SM
// whose instruction cache does not hold it. Every thread of the block calls it.
template <int NI> // head dims up to 32 * NI; the states of partitions p0 .. (those before are empty)
__device__ void fa_merge_block(__nv_bfloat16 *out, const struct cuda_attn_args &a, int t, int kvh, int G,
                               unsigned char *smem, size_t smem_bytes, int p0) {
    const int HD = a.head_dim, SW = HD + 2, n_parts = cuda_attn_parts(a.pos[t]);
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    // a partition's G states are contiguous: seg16 16-byte pieces from the one holding their
    // first float (reading up to 15 bytes of neighbours on each side, all inside the workspace,
    // whose partition counters follow the states)
    const int seg16 = (G * SW * 4 + 15) / 16 + 1, PG = max(1, (int)(smem_bytes / ((size_t)seg16 * 16)));
    auto first = [&](int p) { return reinterpret_cast<uintptr_t>(fa_state(a, t, p, kvh * G)); };
    float M[4], L[4], O[4][NI];
#pragma unroll
    for (int hs = 0; hs < 4; hs++) {
        M[hs] = -INFINITY, L[hs] = 0.0f;
#pragma unroll
        for (int i = 0; i < NI; i++) O[hs][i] = 0.0f;
    }
    for (int g0 = p0; g0 < n_parts; g0 += PG) {
        const int np = min(PG, n_parts - g0);
#pragma unroll 1
        for (int pp = 0; pp < np; pp++) {
            const char *src = reinterpret_cast<const char *>(first(g0 + pp) & ~(uintptr_t)15);
            unsigned char *dst = smem + (size_t)pp * seg16 * 16;
            for (int k = tid; k < seg16; k += blockDim.x) fa_cp16(dst + k * 16, src + k * 16, true);
        }
        asm volatile("cp.async.commit_group;\n" ::);
        asm volatile("cp.async.wait_group 0;\n" ::);
        __syncthreads();
#pragma unroll
        for (int hs = 0; hs < 4; hs++) {
            const int hh = warp + hs * FA_WARPS;
            if (hh >= G) break;
#pragma unroll 1
            for (int pp = 0; pp < np; pp++) {
                const float *st = reinterpret_cast<const float *>(smem + (size_t)pp * seg16 * 16 + (first(g0 + pp) & 15)) +
                                  (size_t)hh * SW;
                fa_fold(M[hs], L[hs], O[hs], st[0], st[1], lane, HD, [&](int i) { return st[2 + lane + 32 * i]; });
            }
        }
        __syncthreads(); // the group read before the next one lands
    }
#pragma unroll
    for (int hs = 0; hs < 4; hs++) {
        const int hh = warp + hs * FA_WARPS;
        if (hh >= G) break;
        fa_store_head(out, a, t, kvh * G + hh, O[hs], L[hs], lane);
    }
}

// The same merge in a cluster (a.cluster: the Z blocks of a (token t, KV head kvh) form one, and
// block z holds partition z's states of the G heads in its shared memory, sst, [head][HD + 2]):
// the cluster's first block folds them in order from the other blocks' shared memory, with
// fa_merge_head's arithmetic (the same bits), one warp a head (up to 4 a warp). Between two
// cluster barriers (every state written before; no block leaves before the fold is done).
template <int NI> // head dims up to 32 * NI
__device__ void fa_merge_cluster(__nv_bfloat16 *out, const struct cuda_attn_args &a, int t, int kvh, int G,
                                 int n_parts, float *sst) {
    namespace cg = cooperative_groups;
    cg::cluster_group cl = cg::this_cluster();
    const int HD = a.head_dim, SW = HD + 2, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
    for (int hs = 0; hs < 4; hs++) {
        const int hh = warp + hs * FA_WARPS;
        if (hh >= G) break;
        float M = -INFINITY, L = 0.0f, O[NI];
#pragma unroll
        for (int i = 0; i < NI; i++) O[i] = 0.0f;
#pragma unroll 1
        for (int p = 0; p < n_parts; p++) {
            const float *st = cl.map_shared_rank(sst, (unsigned)p) + (size_t)hh * SW;
            fa_fold(M, L, O, st[0], st[1], lane, HD, [&](int i) { return st[2 + lane + 32 * i]; });
        }
        fa_store_head(out, a, t, kvh * G + hh, O, L, lane);
    }
}

// A work-sized split (a.unit_T: the step's tokens, one each, and a.unit_X): block u of a 1-D grid
// is a unit of work. The streaming (token, KV head) pairs come first, one unit each (their work is
// constant: sink and recent), then for each retrieval KV head T + X units: token t gets k_t =
// S(t + 1) - S(t) of them, S(t) = t + floor(X part_off[t] / part_off[T]) (one, and the X extra
// units in proportion to its partitions), and unit j of its k computes the j-th of k near-equal
// runs of its partitions. Which block computes a partition changes nothing: its state and the
// merge order are the same. Every thread of the block calls it (one barrier when T > 1).
struct fa_unit {
    int t, kvh, j, k;
};
__device__ fa_unit fa_unit_of(const struct cuda_attn_args &a, int u) {
    const int T = a.unit_T, X = a.unit_X, n_su = a.n_stream * T;
    if (u < n_su) return {u % T, a.n_full + u / T, 0, 1};
    u -= n_su;
    const int per = T + X, kvh = u / per, r = u - kvh * per;
    if (T == 1) return {0, kvh, r, per};
    if (X == 0) return {r, kvh, 0, 1}; // one unit a token
    // S is increasing (k_t >= 1): exactly one token has S(t) <= r < S(t + 1)
    __shared__ int s_t, s_s0, s_s1;
    const long long P = a.part_off[T];
    for (int t = threadIdx.x; t < T; t += blockDim.x) {
        const int s0 = fa_unit_first(a, t, X, P), s1 = fa_unit_first(a, t + 1, X, P);
        if (s0 <= r && r < s1) s_t = t, s_s0 = s0, s_s1 = s1;
    }
    __syncthreads();
    return {s_t, kvh, r - s_s0, s_s1 - s_s0};
}

// Grid (token, KV head, split). Split (gridDim.z = Z > 1, decode steps): block z computes the
// partitions p with p % Z == z and writes their states (empty ones too); the last of the Z
// blocks to finish merges them (a.counters), else fa_merge_kernel does. A work-sized split
// (a.unit_T, decode steps): a 1-D grid of units (fa_unit_of); a unit that splits its (token, KV
// head) computes a run of partitions and writes their states, and the last of its units to finish
// merges them, or lists them for fa_merge_long_kernel (more than CUDA_ATTN_MERGE_LONG).
// WORK (DEC only): a work-sized split's grid; F8: the pools are fp8 (cuda_attn_args.kv_fp8)
template <int HDP, bool DEC, bool WORK = false, bool F8 = false>
__global__ void __launch_bounds__(32 * FA_WARPS) flash_kernel(__nv_bfloat16 *out, const __nv_bfloat16 *q,
                                                              const __nv_bfloat16 *kb, const __nv_bfloat16 *vb, int rs,
                                                              struct cuda_attn_args a) {
    using CF = fa_cfg<HDP, DEC>;
    constexpr int LD = CF::LD, OT = CF::OT, S = CF::STAGES;
    constexpr bool COOP = CF::COOP;
    // the fused decode kernel (COOP with a.rope_inv_freq) is launched programmatically after the
    // qkv GEMM: its metadata and past K/V rows load while that GEMM runs, and it waits only
    // before its first read of the q|k|v rows (below). It lets the next kernel (the wo GEMM,
    // whose weight loads would queue ahead of its own) launch only once its last K/V tile has
    // landed (late_trigger); every other kernel at its start
    const bool late_trigger = COOP && a.rope_inv_freq;
    if (!late_trigger) pdl_trigger();
    if (!COOP || !a.rope_inv_freq) pdl_wait();
    FA_STAMP_GT(0, 48);
    extern __shared__ __align__(16) unsigned char fa_raw[];
    __nv_bfloat16 *sk = reinterpret_cast<__nv_bfloat16 *>(fa_raw), *sv = sk + S * FA_KT * LD;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    static_assert(DEC || !WORK, "a work-sized split is a decode step's");
    constexpr bool work = WORK; // a work-sized split (a.unit_T): block x is a unit of work
    const fa_unit un = work ? fa_unit_of(a, (int)blockIdx.x) : fa_unit{(int)blockIdx.x, (int)blockIdx.y, 0, 1};
    const int tb = un.t, kvh = un.kvh;
    // DEC: the metadata this block needs first, all loads at once (one round trip): its position,
    // its block table's start (or streaming slot) and the split workspace's size
    const bool full = kvh < a.n_full;
    const int pos_tb = a.pos[tb], poff = work ? a.part_off[a.unit_T] : gridDim.z > 1 ? a.part_off[gridDim.x] : 0;
    const int bb_dec = DEC && full ? a.block_indptr[tb] : 0, ss_dec = DEC && !full ? a.stream_slot[tb] : 0;
    // the partitions this block computes: those p in [pa, pb) with p % Z == z (Z = 1: all of them)
    int pa = 0, pb = INT_MAX, Z = 1, z = 0, n_work = 1, pv0 = 0;
    bool split;
    if (work) {
        // a retrieval (token, KV head) of w partitions from pv0 (the first its window sees), split
        // over min(k, w) of its k units (the others' runs are empty); unsplit, the unit of its last
        // partition computes them all (and streaming units theirs)
        const int n_p = cuda_attn_parts(pos_tb);
        pv0 = full ? fa_window_part0(a, pos_tb) : 0;
        const int w = n_p - pv0;
        n_work = full ? min(un.k, w) : 1;
        split = n_work > 1 && fa_split_fits_n(a, poff);
        if (!split && un.j != un.k - 1) return;
        if (split) {
            pa = fa_run_at(pv0, w, un.j, un.k), pb = fa_run_at(pv0, w, un.j + 1, un.k);
            if (pa == pb) return;
        }
    } else {
        // a decode token of fewer than ATTN_SPLIT_MIN_PARTS partitions is not split: block z = 0
        // computes it (the same sums), the others have nothing to do
        split = gridDim.z > 1 && cuda_attn_parts(pos_tb) >= ATTN_SPLIT_MIN_PARTS && fa_split_fits_n(a, poff);
        Z = split ? (int)gridDim.z : 1, z = split ? (int)blockIdx.z : 0;
        if (!split && blockIdx.z > 0) return;
    }
    __nv_bfloat16 *sq = sv + S * FA_KT * LD + (COOP ? 0 : warp) * 16 * LD;
    // the total O of this thread's outputs o[d][e]: sO[(d * 4 + e) * 32] (lane-private, no conflicts)
    float *sO = reinterpret_cast<float *>(fa_raw + CF::BF16_BYTES) + (size_t)warp * OT * 4 * 32 + lane;
    const int HD = a.head_dim;
    const int G = a.n_heads / a.n_kv_heads, TPU = G >= 16 ? 1 : 16 / G; // tokens per unit (warp)
    // DEC: token tb is sequence tb's only row of the step (no tok_seq or seq_start round trips)
    const int s = DEC ? tb : a.tok_seq[tb], row0 = DEC ? tb : a.seq_start[s], row_end = DEC ? tb + 1 : a.seq_start[s + 1];
    if ((tb - row0) % (TPU * FA_WARPS)) return; // not the first token of a block's units
    const int uw = COOP ? 0 : warp; // the unit this warp computes on (COOP: the block's one unit)
    const int d0 = COOP ? warp * OT : 0; // its first output n8 tile
    const int t0 = tb + uw * TPU, nt = max(0, min(TPU, row_end - t0)), nrows = nt * G;
    const int pos0 = DEC ? pos_tb : a.pos[row0], pos_last = DEC ? pos_tb : a.pos[row_end - 1]; // s's in this step
    const int pb_first = pos_tb, pb_last = pb_first + min(TPU * FA_WARPS, row_end - tb) - 1;
    const int p_first = pb_first + uw * TPU, p_last = p_first + nt - 1;
    // split: blocks z < z_used have partitions (z, z + Z, ..); the others exit (no state, no count;
    // in a cluster, after its two barriers, letting the next kernel launch first). A work-sized
    // split: the units with partitions
    const int z_used = !split ? 1 : work ? n_work : min(Z, cuda_attn_parts(pos_last));
    // cluster merge (COOP decode, Z >= the token's partitions: block z has partition z): this
    // block's partition states in shared memory, m = -inf (empty) until the partition closes
    const bool clus = COOP && split && a.cluster;
    float *sst = reinterpret_cast<float *>(fa_raw + CF::ST_OFF);
    if (z >= z_used) {
        if (clus) {
            pdl_trigger();
            cluster_sync();
            cluster_sync();
        }
        return;
    }
    if (clus)
        for (int i = threadIdx.x; i < G; i += blockDim.x) sst[(size_t)i * (a.head_dim + 2)] = -INFINITY;

    fa_range rb, rw;
    rb.make(a, full, pb_first, pb_last); // the block walks these
    rw.make(a, full, p_first, p_last); // this warp computes on these
    const int lo0 = rb.lo0, hi0 = rb.hi0, lo1 = rb.lo1, hi1 = rb.hi1;
    const int wlo0 = rw.lo0, whi0 = rw.hi0, wlo1 = rw.lo1, whi1 = rw.hi1;
    // the block's next tile after t (in its partitions), or INT_MAX
    auto next_tile = [&](int t) {
        for (;;) {
            t++;
            if (t < lo0) t = lo0;
            if (t > hi0 && t < lo1) t = lo1;
            if (t > hi0 && t > hi1) return INT_MAX;
            int p = t / FA_PT, off = 0; // to the next partition p' with p' % Z == z
            if (p < pa) { // (a unit's run)
                t = pa * FA_PT - 1;
                continue;
            }
            if (p >= pb) return INT_MAX;
            if (Z > 1) {
                const int r = p - fdiv(p, a.z_div) * Z;
                off = z >= r ? z - r : z - r + Z;
            }
            if (off == 0) return t;
            t = (p + off) * FA_PT - 1; // the start of this block's next partition
        }
    };

    // 4 threads per key row (one each): the row's pool block, then every 4th 16-byte chunk of
    // the row. Block ids are read two tiles ahead of their loads (the first three at once), so
    // the block table's latency overlaps a tile's arithmetic instead of stalling every load.
    static_assert(FA_KT * 4 == 32 * FA_WARPS, "one key row part a thread");
    const int kr = tid / 4, part = tid % 4;
    // an fp8 pool (a.kv_fp8): each K/V buffer row's bytes land at F8_OFF in the row (its upper
    // half) and become bf16 in place (fa8_rows) before the row is read
    constexpr int F8_OFF = HDP + 16;
    const float ksc = F8 ? a.k_scale[kvh] : 1.0f, vsc = F8 ? a.v_scale[kvh] : 1.0f;
    const int bbase = DEC ? bb_dec : full ? a.block_indptr[s] : 0, sslot = DEC ? ss_dec : full ? 0 : a.stream_slot[s];
    auto blk_of = [&](int tile) { // the pool block of key row kr of a tile (full heads)
        int j = tile == INT_MAX ? INT_MAX : tile * FA_KT + kr;
        return full && j <= pos_last ? a.block_ids[bbase + fdiv(j, a.bs_div)] : 0;
    };
    // Fused RoPE (COOP with a.rope_inv_freq; the host asks for it only when head_dim == HDP): the
    // block rotates its token's G query rows into smem itself, as rope_append_kernel would
    // (rope_pair's code: the same bits). The block that owns the token's own tile ("own") also
    // rotates its K row, writes it and its V row into the tile in smem (never loading that row),
    // appends them to the pool (retrieval heads) and writes the rotated K back to the q|k|v row;
    // the rotated Q goes back there too, by the block that writes the output (after every block
    // of the token has read the raw Q). So the step leaves what rope_append_kernel would.
    constexpr int RH = HDP / 2, RSTEP = 32 * FA_WARPS / RH; // pair ri of rows rr0, rr0 + RSTEP, ..
    const float *rif = COOP ? a.rope_inv_freq : NULL;
    const int ri = tid % RH, rr0 = tid / RH;
    const bool own = rif && next_tile(pos_tb / FA_KT - 1) == pos_tb / FA_KT;
    __nv_bfloat16 *qrow = const_cast<__nv_bfloat16 *>(q) + (size_t)tb * rs + (size_t)kvh * G * HD; // head kvh*G + r
    __nv_bfloat16 own_k[2], own_v; // the own row's rotated K pair ri (tid < RH) and V dim tid
    auto write_q = [&]() { // the rotated Q rows from smem back to q|k|v
        for (int r = rr0; r < nrows; r += RSTEP) qrow[r * HD + ri] = sq[r * LD + ri], qrow[r * HD + ri + RH] = sq[r * LD + ri + RH];
    };
    // before the wait: the angle (a constant table) and the own row's pool block (metadata)
    float sn = 0.0f, cs = 1.0f;
    if (rif) rope_sincos(pos_tb, rif[ri], sn, cs);
    const int oblk = own && full ? a.block_ids[bbase + fdiv(pos_tb, a.bs_div)] : 0;
    bool rope_done = false;
    auto do_rope = [&]() { // (rif set) after pdl_wait: the q|k|v rows are the qkv GEMM's
        float qv[16 / RSTEP][2];
#pragma unroll
        for (int u = 0; u < 16 / RSTEP; u++) {
            const int r = rr0 + u * RSTEP;
            qv[u][0] = qv[u][1] = 0.0f;
            if (r < nrows) qv[u][0] = __bfloat162float(qrow[r * HD + ri]), qv[u][1] = __bfloat162float(qrow[r * HD + ri + RH]);
        }
        __nv_bfloat16 *krow = const_cast<__nv_bfloat16 *>(kb) + (size_t)tb * rs + (size_t)kvh * HD;
        float kv0 = 0.0f, kv1 = 0.0f;
        if (own && tid < RH) kv0 = __bfloat162float(krow[ri]), kv1 = __bfloat162float(krow[ri + RH]);
        if (own && tid < HD) own_v = vb[(size_t)tb * rs + (size_t)kvh * HD + tid];
#pragma unroll
        for (int u = 0; u < 16 / RSTEP; u++) { // padding rows are zero
            const int r = rr0 + u * RSTEP;
            float x = 0.0f, y = 0.0f;
            if (r < nrows) rope_rot(qv[u][0], qv[u][1], sn, cs, x, y);
            sq[r * LD + ri] = __float2bfloat16(x), sq[r * LD + ri + RH] = __float2bfloat16(y);
        }
        if (own && tid < RH) {
            float x, y;
            rope_rot(kv0, kv1, sn, cs, x, y);
            own_k[0] = __float2bfloat16(x), own_k[1] = __float2bfloat16(y);
            krow[ri] = own_k[0], krow[ri + RH] = own_k[1];
        }
        if (own && full) { // this step's row into its pool block
            const size_t row = full_pool_row(a, oblk, pos_tb - fdiv(pos_tb, a.bs_div) * a.block_size, kvh) * HD;
            if constexpr (F8) {
                uint8_t *k8 = reinterpret_cast<uint8_t *>(a.k_full), *v8 = reinterpret_cast<uint8_t *>(a.v_full);
                if (tid < RH) k8[row + ri] = kv8_enc(__bfloat162float(own_k[0]), ksc), k8[row + ri + RH] = kv8_enc(__bfloat162float(own_k[1]), ksc);
                if (tid < HD) v8[row + tid] = kv8_enc(__bfloat162float(own_v), vsc);
            } else {
                if (tid < RH) a.k_full[row + ri] = own_k[0], a.k_full[row + ri + RH] = own_k[1];
                if (tid < HD) a.v_full[row + tid] = own_v;
            }
        }
        if (!split) write_q(); // (each thread rewrites only what it read)
        rope_done = true;
    };
    // the own row of partition p's buffers from registers (after p's loads of that half)
    auto put_own = [&](int p, int kv) {
        if (!own || !rope_done || p != pos_tb / CUDA_ATTN_PART) return;
        const int row = ((pos_tb / FA_KT) % FA_PT * FA_KT + pos_tb % FA_KT) * LD;
        if constexpr (F8) { // (as the pool holds it: bytes, made bf16 with the rest of the buffer)
            uint8_t *ek = reinterpret_cast<uint8_t *>(sk + row) + F8_OFF, *ev = reinterpret_cast<uint8_t *>(sv + row) + F8_OFF;
            if ((kv & 1) && tid < RH) ek[ri] = kv8_enc(__bfloat162float(own_k[0]), ksc), ek[ri + RH] = kv8_enc(__bfloat162float(own_k[1]), ksc);
            if ((kv & 2) && tid < HD) ev[tid] = kv8_enc(__bfloat162float(own_v), vsc);
        } else {
            if ((kv & 1) && tid < RH) sk[row + ri] = own_k[0], sk[row + ri + RH] = own_k[1];
            if ((kv & 2) && tid < HD) sv[row + tid] = own_v;
        }
    };

    // (COOP loads a partition's K and V as two groups: kv 1 = K only, 2 = V only, 3 = both)
    auto load_tile = [&](int buf, int tile, int blk_next, int kv = 3) {
        int j = tile * FA_KT + kr;
        if (own && j == pos_tb) return; // put_own's
        const __nv_bfloat16 *kp = NULL, *vp = NULL;
        bool step_row = false; // (F8) from the step's q|k|v rows, not a pool
        if (full) {
            if (j <= pos_last) {
                size_t row = full_pool_row(a, blk_next, j - fdiv(j, a.bs_div) * a.block_size, kvh);
                kp = a.k_full + row * HD;
                vp = a.v_full + row * HD;
            }
        } else if (j >= pos0) {
            if (j <= pos_last) {
                size_t off = (size_t)(row0 + j - pos0) * rs + (size_t)kvh * HD;
                kp = kb + off;
                vp = vb + off;
                step_row = true;
            }
        } else if (j < a.sink || j >= pos0 - a.recent) {
            const int rr = stream_ring_row(a, j);
            size_t off = stream_pool_row(a, sslot, rr, kvh - a.n_full) * HD;
            kp = a.k_stream + off;
            vp = a.v_stream + off;
        }
        __nv_bfloat16 *dk = sk + (buf * FA_KT + kr) * LD, *dv = sv + (buf * FA_KT + kr) * LD;
        if constexpr (F8) { // the row's bytes (the step's own rows rounded here, as the pool would hold them)
            uint8_t *ek = reinterpret_cast<uint8_t *>(dk) + F8_OFF, *ev = reinterpret_cast<uint8_t *>(dv) + F8_OFF;
            const __nv_bfloat16 *pk = full ? a.k_full : a.k_stream, *pv = full ? a.v_full : a.v_stream;
            // (a pool row's element offset, as bytes of the fp8 pool)
            const uint8_t *bk = kp && !step_row ? reinterpret_cast<const uint8_t *>(pk) + (kp - pk) : NULL;
            const uint8_t *bv = vp && !step_row ? reinterpret_cast<const uint8_t *>(pv) + (vp - pv) : NULL;
            for (int c = part * 8; c < HD; c += 32) {
                if (step_row) {
                    if (kv & 1) *reinterpret_cast<uint2 *>(ek + c) = kv8_pack8(*reinterpret_cast<const uint4 *>(kp + c), ksc);
                    if (kv & 2) *reinterpret_cast<uint2 *>(ev + c) = kv8_pack8(*reinterpret_cast<const uint4 *>(vp + c), vsc);
                } else {
                    if (kv & 1) fa_cp8(ek + c, bk ? bk + c : (const void *)kb, bk != NULL);
                    if (kv & 2) fa_cp8(ev + c, bv ? bv + c : (const void *)vb, bv != NULL);
                }
            }
        } else {
            for (int c = part * 8; c < HDP; c += 32) {
                if (c < HD) {
                    if (kv & 1) fa_cp16(dk + c, kp ? kp + c : kb, kp != NULL);
                    if (kv & 2) fa_cp16(dv + c, vp ? vp + c : vb, vp != NULL);
                } else { // padded dims are zero
                    if (kv & 1) *reinterpret_cast<uint4 *>(dk + c) = make_uint4(0, 0, 0, 0);
                    if (kv & 2) *reinterpret_cast<uint4 *>(dv + c) = make_uint4(0, 0, 0, 0);
                }
            }
        }
    };

    // fp8: rows [r0, r0 + n) of the K buffers (kv & 1) and of the V buffers (kv & 2) from their
    // landed bytes to bf16, in place, padded dims zero; between two barriers. Four lanes a row
    // (chunks of 8 dims q, q + 4, ..): each reads its chunks' bytes, the row's four lanes meet
    // (__syncwarp: the bytes read before any is overwritten), then each writes its bf16 chunks.
    // (n is a multiple of FA_KT: every warp runs the loop the same number of times)
    auto fa8_rows = [&](int r0, int n, int kv) {
        constexpr int NC = HDP / 8, CH = (NC + 3) / 4; // chunks a row, a lane
        const int nk = kv & 1 ? n : 0, nn = nk + (kv & 2 ? n : 0);
        for (int i = tid; i < 4 * nn; i += 32 * FA_WARPS) {
            const int rr = i / 4, q = i % 4;
            const bool isv = rr >= nk;
            __nv_bfloat16 *row = (isv ? sv : sk) + (ptrdiff_t)(r0 + (isv ? rr - nk : rr)) * LD; // (r0 < 0 for a V item of the ring: sv - ..)
            const uint2 *src = reinterpret_cast<const uint2 *>(reinterpret_cast<const uint8_t *>(row) + F8_OFF);
            uint2 w[CH];
#pragma unroll
            for (int k = 0; k < CH; k++)
                if (q + 4 * k < NC) w[k] = src[q + 4 * k];
            __syncwarp();
#pragma unroll
            for (int k = 0; k < CH; k++) {
                const int c = q + 4 * k;
                if (c < NC) reinterpret_cast<uint4 *>(row)[c] = 8 * c < HD ? kv8_unpack8(w[k], isv ? vsc : ksc) : make_uint4(0, 0, 0, 0);
            }
        }
    };

    FA_STAMP(1);
    const int g = lane / 4, qd = lane % 4;
    // this thread's two rows: g and g + 8; their positions (or -1 when the row is padding)
    int ipos[2];
    for (int h = 0; h < 2; h++) {
        int r = g + 8 * h;
        ipos[h] = r < nrows ? p_first + fdiv(r, a.g_div) : -1;
    }
    // the mask: row h (at ipos[h]) sees key j iff j <= vhi[h] and (j >= vlo[h] or j < vse), i.e.
    // j <= i and (retrieval) i - j < sliding_window when there is one, (streaming) j < sink or
    // i - j < recent; padding rows (-1) see nothing. Evaluated without branches: the && / ||
    // form compiled into divergent branches that cost ~900 cycles a tile.
    int vhi[2], vlo[2];
    const int vse = full ? 0 : a.sink;
    for (int h = 0; h < 2; h++) {
        const int i = ipos[h];
        vhi[h] = i;
        vlo[h] = full ? (a.sliding_window > 0 ? i - a.sliding_window + 1 : 0) : i - a.recent + 1;
    }
    // decode: rows 8-15 are all padding (a token of a GQA group up to 8): their softmax is
    // skipped, giving what it would (p = 0, m and l untouched). (Prefill keeps one straight-line
    // tile body.)
    const bool rows8 = !DEC || nrows > 8;
    const float sl2 = a.scale * 1.4426950408889634f; // the scale in log2 units (fa_part_softmax: 2^x)
    // the partition being summed (m, l: this thread's part of the row sum; o) and the total
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, M[2] = {-INFINITY, -INFINITY}, L[2] = {0.0f, 0.0f};
    float o[OT][4]; // output tiles d0 + d
    for (int d = 0; d < OT; d++)
        for (int e = 0; e < 4; e++) o[d][e] = 0.0f, sO[(d * 4 + e) * 32] = 0.0f;
    uint32_t qa[HDP / 16][4];
    // this warp's Q rows into smem (zero rows/dims beyond the unit; COOP: warp 0's, once)
    auto load_q = [&]() {
        for (int i = COOP && warp ? 16 * (HDP / 8) : lane; i < 16 * (HDP / 8); i += 32) {
            int r = i / (HDP / 8), c = (i % (HDP / 8)) * 8;
            bool ok = r < nrows && c < HD;
            const int rt = fdiv(r, a.g_div);
            const __nv_bfloat16 *src = ok ? q + (size_t)(t0 + rt) * rs + (size_t)(kvh * G + r - rt * G) * HD + c : q;
            fa_cp16(sq + r * LD + c, src, ok);
        }
    };
    auto load_qa = [&]() {
        for (int k = 0; k < HDP / 16; k++) fa_ldsm_x4(qa[k], sq + (lane % 16) * LD + k * 16 + (lane / 16) * 8);
    };

    // one tile's sums (attn_common.cuh: the same code in every kernel, so a row's bits never
    // depend on the kernel that computed it)
    auto tile_scores = [&](const __nv_bfloat16 *ck, float (&sc)[FA_KT / 8][4]) { fa_tile_scores<HDP>(qa, ck, sc, lane); };
    // the mask (an invisible key: -inf), only on a tile that a real row of the warp does not wholly
    // see: a padding row (ipos -1) is not counted, never read (its Q is zeros: its scores stay finite)
    fa_warp_sight sight;
    sight.make(vhi, vlo, ipos[0] >= 0, ipos[1] >= 0);
    auto tile_mask = [&](int tile, float (&sc)[FA_KT / 8][4]) {
        if (!sight.sees_all(tile * FA_KT, tile * FA_KT + FA_KT - 1, vse)) fa_tile_mask(sc, tile, qd, vhi, vlo, vse, rows8);
    };
    auto tile_pv = [&](const __nv_bfloat16 *cv, const float (&sc)[FA_KT / 8][4]) { fa_tile_pv<HDP, OT>(o, cv, sc, rows8, d0, lane); };

    // split: the states of this warp's rows for partition p (m = -inf: empty), written in order
    const int n_parts = cuda_attn_parts(pos_last); // decode: one token, the unit's
    int next_p = work ? pa : z; // this block's next partition without a written state
    auto write_state = [&](int p, bool empty, const float *lf) {
        for (int h = 0; h < 2; h++) {
            int r = g + 8 * h;
            if (r >= nrows) continue;
            const int rt = fdiv(r, a.g_div);
            float *st = clus ? sst + (size_t)r * (HD + 2) : fa_state(a, t0 + rt, p, kvh * G + r - rt * G);
            if (qd == 0 && (!COOP || warp == 0)) st[0] = empty ? -INFINITY : m[h], st[1] = empty ? 0.0f : lf[h];
            if (empty) continue;
            for (int d = 0; d < OT; d++) {
                int col = (d0 + d) * 8 + 2 * qd;
                if (col < HD) st[2 + col] = o[d][2 * h], st[3 + col] = o[d][2 * h + 1];
            }
        }
    };
    auto empty_until = [&](int p_end) { // empty states for this block's partitions before p_end
        for (; next_p < p_end; next_p += Z) write_state(next_p, true, NULL);
    };
    // partition p is complete: its state into the total (or the workspace), then a fresh state
    auto close_partition = [&](int p) {
        float lf[2];
        for (int h = 0; h < 2; h++) { // the row's full sum, across the quad
            lf[h] = l[h] + __shfl_xor_sync(0xffffffffu, l[h], 1);
            lf[h] += __shfl_xor_sync(0xffffffffu, lf[h], 2);
        }
        if (split) {
            empty_until(p);
            write_state(p, false, lf);
            next_p = p + Z;
        } else {
            for (int h = 0; h < 2; h++) {
                float ca, cb;
                if (fa_merge_begin(M[h], L[h], m[h], lf[h], ca, cb))
                    for (int d = 0; d < OT; d++)
                        for (int e = 2 * h; e < 2 * h + 2; e++)
                            sO[(d * 4 + e) * 32] = fa_merge_o(sO[(d * 4 + e) * 32], o[d][e], ca, cb);
            }
        }
        for (int h = 0; h < 2; h++) m[h] = -INFINITY, l[h] = 0.0f;
        for (int d = 0; d < OT; d++)
            for (int e = 0; e < 4; e++) o[d][e] = 0.0f;
    };

    if constexpr (COOP) {
        // A partition at a time: its tiles (up to FA_PT) land in buffers 0 .. FA_PT - 1, K and V
        // as two groups. Warp w computes the scores of tile w (tile_scores: the lone warp's code)
        // into the exchange; then every warp walks the tiles in order, the mask and softmax (the
        // same code after the same MMAs as a lone warp's, in each warp) and P V for its own
        // output tiles. The next partition's K loads while this
        // one's V is summed, its V while the partition closes.
        float *xs = reinterpret_cast<float *>(fa_raw + CF::XS_OFF) + lane; // [tile][n][e], x 32 lanes
        auto in_walk = [&](int t) { return (t >= lo0 && t <= hi0) || (t >= lo1 && t <= hi1); };
        auto part_after = [&](int p) { // this block's next partition after p with tiles to sum, or -1
            const int t = next_tile(p < 0 ? -1 : (p + 1) * FA_PT - 1);
            return t == INT_MAX ? -1 : t / FA_PT;
        };
        int blq[FA_PT]; // the pool blocks of key row kr of the next partition's tiles
        auto fetch_blocks = [&](int p) {
#pragma unroll
            for (int i = 0; i < FA_PT; i++) blq[i] = p >= 0 && in_walk(p * FA_PT + i) ? blk_of(p * FA_PT + i) : 0;
        };
        auto load_part = [&](int p, int kv) { // one commit group (empty when p < 0)
            if (p >= 0) {
#pragma unroll
                for (int i = 0; i < FA_PT; i++)
                    if (in_walk(p * FA_PT + i)) load_tile(i, p * FA_PT + i, blq[i], kv);
                put_own(p, kv);
            }
            asm volatile("cp.async.commit_group;\n" ::);
        };
        int p = part_after(-1);
        fetch_blocks(p);
        if (p >= 0 && !rif) load_q(); // in K's group (fused RoPE: sq is written already)
        load_part(p, 1);
        load_part(p, 2);
        if (rif) { // now the GEMM's rows: Q into smem, the own row into the tiles
            pdl_wait();
            FA_STAMP_GT(41, 50);
            do_rope();
            put_own(p, 1), put_own(p, 2);
            FA_STAMP_GT(42, 51);
        }
        FA_STAMP(2);
        int pn = p >= 0 ? part_after(p) : -1;
        fetch_blocks(pn);
        for (int it = 0; p >= 0; it++) {
            asm volatile("cp.async.wait_group 1;\n" ::); // K of p (and Q) landed
            __syncthreads();
            if constexpr (F8) {
                fa8_rows(0, FA_PT * FA_KT, 1);
                __syncthreads();
            }
            if (it == 0) load_qa();
            FA_STAMP(3 + 6 * min(it, 5));
            const int tw = p * FA_PT + warp;
            if (in_walk(tw)) {
                float sc[FA_KT / 8][4];
                tile_scores(sk + warp * FA_KT * LD, sc);
#pragma unroll
                for (int n = 0; n < FA_KT / 8; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        if (e < 2 || rows8) xs[((warp * (FA_KT / 8) + n) * 4 + e) * 32] = sc[n][e];
            }
            FA_STAMP(4 + 6 * min(it, 5));
            asm volatile("cp.async.wait_group 0;\n" ::); // V of p landed
            __syncthreads(); // every score in the exchange; the K buffers free
            if constexpr (F8) {
                fa8_rows(0, FA_PT * FA_KT, 2);
                __syncthreads();
            }
            FA_STAMP(5 + 6 * min(it, 5));
            load_part(pn, 1);
            // the partition's scores from the exchange, masked; its softmax; P V tile by tile
            float sp[FA_PT][FA_KT / 8][4];
            unsigned has = 0;
#pragma unroll
            for (int i = 0; i < FA_PT; i++) {
                if (!in_walk(p * FA_PT + i)) continue;
                has |= 1u << i;
#pragma unroll
                for (int n = 0; n < FA_KT / 8; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        sp[i][n][e] = e < 2 || rows8 ? xs[((i * (FA_KT / 8) + n) * 4 + e) * 32] : 0.0f;
                tile_mask(p * FA_PT + i, sp[i]);
            }
            fa_part_softmax(sp, has, m, l, rows8, sl2);
#pragma unroll
            for (int i = 0; i < FA_PT; i++)
                if (has >> i & 1) tile_pv(sv + i * FA_KT * LD, sp[i]);
            FA_STAMP(6 + 6 * min(it, 5));
            __syncthreads(); // every warp done with the V buffers and the exchange
            load_part(pn, 2);
            close_partition(p);
            FA_STAMP(7 + 6 * min(it, 5));
            p = pn;
            pn = p >= 0 ? part_after(p) : -1;
            fetch_blocks(pn);
        }
    } else {
        // The walk as a stream of items, a K or V tile each (item 2 t + 1: tile t's V, 2 t: its
        // K): for each partition the K of its tiles, then their V, so that its scores are all in
        // registers when its softmax runs, and its V tiles arrive after. Items land in a ring of
        // R buffers (the K and V buffers as one array): up[0] is summed now, up[1 .. R-2] are
        // loading, up[R-1] starts loading in this iteration (a commit group each). The block ids
        // of the first R items are read at once, after that each one an iteration ahead of its load.
        constexpr int R = 2 * S;
        auto tile_of = [](int it) { return it == INT_MAX ? INT_MAX : it >> 1; };
        auto next_item = [&](int it) {
            if (it == INT_MAX) return INT_MAX;
            const int t = it >> 1, tn = next_tile(t);
            if (tn != INT_MAX && tn / FA_PT == t / FA_PT) return 2 * tn + (it & 1); // the partition's next tile
            if (!(it & 1)) return 2 * next_tile(t / FA_PT * FA_PT - 1) + 1; // its first tile's V
            return tn == INT_MAX ? INT_MAX : 2 * tn; // the next partition's first K
        };
        auto load_item = [&](int b, int it, int blk) { // ring buffer b: K at sk + b, V at sv + b - S (the same memory)
            if (it != INT_MAX) load_tile(it & 1 ? b - S : b, it >> 1, blk, it & 1 ? 2 : 1);
        };
        int up[R], blk_last;
        up[0] = next_tile(-1) == INT_MAX ? INT_MAX : 2 * next_tile(-1);
#pragma unroll
        for (int i = 1; i < R; i++) up[i] = next_item(up[i - 1]);
        int bl[R];
#pragma unroll
        for (int i = 0; i < R; i++) bl[i] = blk_of(tile_of(up[i]));
        blk_last = bl[R - 1];
        if (up[0] != INT_MAX) {
            load_q();
            load_item(0, up[0], bl[0]);
        }
        asm volatile("cp.async.commit_group;\n" ::);
        FA_STAMP(2);
#pragma unroll
        for (int i = 1; i < R - 1; i++) {
            load_item(i, up[i], bl[i]);
            asm volatile("cp.async.commit_group;\n" ::);
        }

        bool q_loaded = false;
        int it_ = 0, buf = 0;
        float sp[FA_PT][FA_KT / 8][4]; // the partition's masked scores, then its p (tiles in `has`)
        unsigned has = 0;
        bool soft = false; // its softmax done
        auto sp_tile = [&](float (&t)[FA_KT / 8][4], int ti, bool into) { // t into sp[ti], or out of it (static indices)
#pragma unroll
            for (int i = 0; i < FA_PT; i++)
                if (i == ti)
#pragma unroll
                    for (int n = 0; n < FA_KT / 8; n++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            if (into) sp[i][n][e] = t[n][e];
                            else t[n][e] = sp[i][n][e];
                        }
        };
        for (int it = up[0]; it != INT_MAX; it = up[0]) {
            FA_STAMP(3 + 4 * min(it_, 8));
            load_item((buf + R - 1) % R, up[R - 1], blk_last);
            const int nn = next_item(up[R - 1]), bn = blk_of(tile_of(nn));
            asm volatile("cp.async.commit_group;\n" ::);
            asm volatile("cp.async.wait_group %0;\n" ::"n"(R - 1)); // this item's group (and Q) landed
            __syncthreads();
            const bool isv = it & 1;
            const int tile = it >> 1, ti = tile % FA_PT;
            __nv_bfloat16 *cb = sk + buf * FA_KT * LD; // (sv + (buf - S) * FA_KT * LD for V)
            if constexpr (F8) {
                fa8_rows(isv ? (buf - S) * FA_KT : buf * FA_KT, FA_KT, isv ? 2 : 1);
                __syncthreads();
            }
            if (!q_loaded) load_qa();
            q_loaded = true;
            FA_STAMP(4 + 4 * min(it_, 8));
            const bool mine = nrows > 0 && ((tile >= wlo0 && tile <= whi0) || (tile >= wlo1 && tile <= whi1));
            if (!isv) {
                if (mine) {
                    float sc[FA_KT / 8][4];
                    tile_scores(cb, sc);
                    tile_mask(tile, sc);
                    sp_tile(sc, ti, true);
                    has |= 1u << ti;
                }
            } else {
                if (!soft && has) fa_part_softmax(sp, has, m, l, rows8, sl2);
                soft = true;
                if (mine) {
                    float pc[FA_KT / 8][4];
                    sp_tile(pc, ti, false);
                    tile_pv(cb, pc);
                }
            }
            FA_STAMP(5 + 4 * min(it_, 8));
            __syncthreads(); // every warp done with buf before the next iteration refills it
            FA_STAMP(6 + 4 * min(it_, 8));
            it_++;
#pragma unroll
            for (int i = 0; i < R - 1; i++) up[i] = up[i + 1];
            up[R - 1] = nn;
            blk_last = bn;
            buf = (buf + 1) % R;
            if (isv && (up[0] == INT_MAX || !(up[0] & 1))) { // the partition's last V: it closes
                if (has) close_partition(tile / FA_PT);
                has = 0, soft = false;
            }
        }
    }
    asm volatile("cp.async.wait_group 0;\n" ::);
    if (late_trigger) pdl_trigger();
    FA_STAMP_GT(40, 49);
    if (split) { // the token's last block to finish (or fa_merge_kernel) writes the output
        if (nrows > 0) empty_until(min(n_parts, pb));
        if (clus) { // the cluster's first block, from every block's shared memory
            cluster_sync(); // every state written; every block has read the raw Q
            if (z == 0) {
                FA_GT_ANY(52);
                if (rif) write_q();
                fa_merge_cluster<(HDP + 31) / 32>(out, a, tb, kvh, G, n_parts, sst);
                FA_GT_ANY(53);
            }
            cluster_sync(); // the fold is done: the blocks may leave
            return;
        }
        if (!a.counters) return;
        __shared__ int last;
        fence_acq_rel(); // this block's states before its count
        __syncthreads();
        if (tid == 0) {
            int *cnt = a.counters + tb * a.n_kv_heads + kvh;
            last = atomicAdd(cnt, 1) == z_used - 1;
            if (last) *cnt = 0; // ready for the next launch
        }
        __syncthreads();
        if (!last) return;
        FA_GT_ANY(52);
        fence_acq_rel();
        if (work && n_parts > CUDA_ATTN_MERGE_LONG) { // fa_merge_long_kernel merges it (and writes the Q)
            if (tid == 0) {
                int *list = a.counters + a.n_counters;
                list[2 + atomicAdd(list, 1)] = tb * a.n_kv_heads + kvh;
            }
            return;
        }
        if (rif) write_q(); // every block of the token has read the raw Q
        fa_merge_block<(HDP + 31) / 32>(out, a, tb, kvh, G, fa_raw, CF::BYTES, pv0);
        FA_GT_ANY(53);
        return;
    }

    // out = O / L
    for (int h = 0; h < 2; h++) {
        int r = g + 8 * h;
        if (r >= nrows) continue;
        float inv = 1.0f / L[h];
        const int rt = fdiv(r, a.g_div);
        __nv_bfloat16 *orow = out + ((size_t)(t0 + rt) * a.n_heads + (size_t)(kvh * G + r - rt * G)) * HD;
        for (int d = 0; d < OT; d++) {
            int col = (d0 + d) * 8 + 2 * qd;
            if (col < HD)
                *reinterpret_cast<__nv_bfloat162 *>(orow + col) =
                    __floats2bfloat162_rn(sO[(d * 4 + 2 * h) * 32] * inv, sO[(d * 4 + 2 * h + 1) * 32] * inv);
        }
    }
}

// Split decode: one warp per (token, head) merges the token's partition states in order, as the
// flash kernel does in registers, and writes out = O / L (fa_merge_kernel, or the token's last
// flash block when a.counters is set).
__global__ void fa_merge_kernel(__nv_bfloat16 *out, struct cuda_attn_args a) {
    pdl_trigger();
    pdl_wait();
    if (!fa_split_fits(a, gridDim.x)) return; // the flash kernel wrote the output itself
    const int t = blockIdx.x, head = blockIdx.y * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (head >= a.n_heads || cuda_attn_parts(a.pos[t]) < ATTN_SPLIT_MIN_PARTS) return; // not split
    fa_merge_head<CUDA_ATTN_MAX_HEAD_DIM / 32>(out, a, t, head, lane);
}

// The long merges of a work-sized split (split level 5): the last unit of each (token, KV head) of
// more than CUDA_ATTN_MERGE_LONG partitions listed it (after a.counters: cuda_attn_args). One
// warp a block folds the states of one head's 32-dim slice, partitions in order, with
// fa_merge_head's arithmetic (the same bits; each partition's correction factors come from a
// prefix maximum over 32 of them at once, fmaxf being exact), the states streaming through a ring
// of FA_ML_STAGES stages of 32 partitions (cp.async, from L2: other blocks wrote them) so that
// thousands of them arrive at the memory's pace. A stage's {m, l} and o slices land at fixed places
// (8-byte copies: a state is 8-byte aligned), and its 32 folds run straight, every load ahead of
// the two chains (L and each lane's O) that set the pace (an unused fold's factors {1, 0, 0} leave L
// exactly as it is, so L's chain has no select): a step is the chains' few cycles, not a
// round trip to shared memory. It writes the heads' rotated Q back (fused RoPE: every unit of the
// token has read the raw one by now). The last block to finish empties the list for the next launch.
#define FA_ML_STAGES 8 // stages of 32 partitions in flight: 7 loading while one is folded
__global__ void __launch_bounds__(32) fa_merge_long_kernel(__nv_bfloat16 *out, __nv_bfloat16 *q, int rs,
                                                           struct cuda_attn_args a) {
    pdl_trigger();
    pdl_wait();
    __shared__ __align__(16) float so[FA_ML_STAGES][32][32]; // a stage's o slices: [partition][dim]
    __shared__ __align__(16) float2 sml[FA_ML_STAGES][32];    // a stage's {m, l}
    __shared__ __align__(16) float4 fac[32]; // the fold's factors {ca, cb, l cb} of a stage's partitions
    int *list = a.counters + a.n_counters;
    const int lane = threadIdx.x, HD = a.head_dim, G = a.n_heads / a.n_kv_heads, NS = (HD + 31) / 32;
    const int n_items = __ldcg(list) * G * NS;
    for (int item = blockIdx.x; item < n_items; item += gridDim.x) {
        const int e = __ldcg(list + 2 + item / (G * NS)), r = item % (G * NS);
        const int t = e / a.n_kv_heads, head = (e - t * a.n_kv_heads) * G + r / NS, d0 = (r % NS) * 32;
        const int pos = a.pos[t], n_parts = cuda_attn_parts(pos), nd = min(32, HD - d0);
        const int pf = fa_window_part0(a, pos);
        const int n_st = (n_parts - pf + 31) / 32;
        const float *st0 = fa_state(a, t, 0, head); // partition p's state: st0 + p * pstride
        const size_t pstride = (size_t)a.n_heads * (HD + 2);
        // stage s: partitions pf + 32 s ..; lane i their {m, l}, then 16 pieces of 8 bytes each
        auto load = [&](int s) {
            if (s < n_st) {
                const int b = s % FA_ML_STAGES, p0 = pf + 32 * s;
                fa_cp8(&sml[b][lane], st0 + (size_t)(p0 + lane) * pstride, p0 + lane < n_parts);
#pragma unroll
                for (int j = 0; j < 16; j++) {
                    const int x = lane + 32 * j, i = x / 16, c = 2 * (x % 16);
                    if (c < nd) fa_cp8(&so[b][i][c], st0 + (size_t)(p0 + i) * pstride + 2 + d0 + c, p0 + i < n_parts);
                }
            }
            asm volatile("cp.async.commit_group;\n" ::);
        };
        float M = -INFINITY, L = 0.0f, O = 0.0f;
        for (int s = 0; s < FA_ML_STAGES - 1; s++) load(s);
        for (int s = 0; s < n_st; s++) {
            asm volatile("cp.async.wait_group %0;\n" ::"n"(FA_ML_STAGES - 2)); // stage s landed
            __syncwarp();
            load(s + FA_ML_STAGES - 1); // into the stage folded last time
            const int b = s % FA_ML_STAGES, np = min(32, n_parts - pf - 32 * s);
            // lane k: partition k's m, the total's maximum after it (mx) and before it (mp)
            const float2 ml = sml[b][lane];
            const float mk = lane < np ? ml.x : -INFINITY;
            float mx = mk;
            for (int o = 1; o < 32; o <<= 1) {
                const float y = __shfl_up_sync(0xffffffffu, mx, o);
                if (lane >= o) mx = fmaxf(mx, y);
            }
            mx = fmaxf(mx, M);
            float mp = __shfl_up_sync(0xffffffffu, mx, 1);
            if (lane == 0) mp = M;
            const unsigned use = __ballot_sync(0xffffffffu, mk != -INFINITY); // empty: adds nothing
            if (use >> lane & 1) { // fa_merge_begin's factors; {1, 0, 0} leave L as it is (L >= +0)
                const float cb = exp2f(mk - mx);
                fac[lane] = make_float4(exp2f(mp - mx), cb, __fmul_rn(ml.y, cb), 0.0f);
            } else {
                fac[lane] = make_float4(1.0f, 0.0f, 0.0f, 0.0f);
            }
            M = __shfl_sync(0xffffffffu, mx, 31);
            __syncwarp();
#pragma unroll
            for (int k = 0; k < 32; k++) { // (use: k < np and partition k not empty; O's select keeps a -0)
                const float4 f = fac[k];
                const float no = fa_merge_o(O, so[b][k][lane], f.x, f.y);
                L = __fadd_rn(__fmul_rn(L, f.x), f.z);
                O = use >> k & 1 ? no : O;
            }
            __syncwarp(); // fac and the stage read before they are written again
        }
        asm volatile("cp.async.wait_group 0;\n" ::);
        __syncwarp();
        __nv_bfloat16 *orow = out + ((size_t)t * a.n_heads + head) * HD + d0; // fa_store_head's arithmetic
        if (lane < nd) orow[lane] = __float2bfloat16(O * (1.0f / L));
        // the head's rotated Q (rope_append_kernel's, as the decode kernel computes it) in place
        const int half = HD / 2, i = d0 + lane;
        if (a.rope_inv_freq && i < half) {
            __nv_bfloat16 *qr = q + (size_t)t * rs + (size_t)head * HD;
            float sn, cs, x, y;
            rope_sincos(pos, a.rope_inv_freq[i], sn, cs);
            rope_rot(__bfloat162float(qr[i]), __bfloat162float(qr[i + half]), sn, cs, x, y);
            qr[i] = __float2bfloat16(x), qr[i + half] = __float2bfloat16(y);
        }
    }
    __syncwarp();
    if (lane == 0) { // every block has read the list once the last one counts
        fence_acq_rel();
        if (atomicAdd(list + 1, 1) == (int)gridDim.x - 1) list[0] = 0, list[1] = 0;
    }
}

template <int HDP> static int fa_allow_smem() {
    CUDA_CHECK(cudaFuncSetAttribute(flash_kernel<HDP, false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)fa_cfg<HDP, false>::BYTES));
    CUDA_CHECK(cudaFuncSetAttribute(flash_kernel<HDP, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)fa_cfg<HDP, true>::BYTES));
    CUDA_CHECK(cudaFuncSetAttribute(flash_kernel<HDP, true, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)fa_cfg<HDP, true>::BYTES));
    CUDA_CHECK(cudaFuncSetAttribute(flash_kernel<HDP, false, false, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)fa_cfg<HDP, false>::BYTES));
    CUDA_CHECK(cudaFuncSetAttribute(flash_kernel<HDP, true, false, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)fa_cfg<HDP, true>::BYTES));
    CUDA_CHECK(cudaFuncSetAttribute(flash_kernel<HDP, true, true, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)fa_cfg<HDP, true>::BYTES));
    return 0;
}

// cuda_attn_env.resident's index of a padded head dim (16, 32, 64, 128)
static constexpr int fa_hdp_index(int hdp) { return hdp <= 16 ? 0 : hdp <= 32 ? 1 : hdp <= 64 ? 2 : 3; }

template <int HDP>
static int fa_launch(const struct cuda_attn_env *env, bool dec, dim3 grid, cudaStream_t st, __nv_bfloat16 *o,
                     const __nv_bfloat16 *q, const __nv_bfloat16 *kb, const __nv_bfloat16 *vb, int rs,
                     const struct cuda_attn_args &a) {
    const dim3 T(32 * FA_WARPS);
    // the fused decode kernel starts while the qkv GEMM runs (it waits for it inside)
    // (one wave of blocks: a larger step's blocks would take the GEMM's SMs and gain nothing; a
    // work-sized split's units, at most the blocks the device holds at once)
    const bool wave = a.unit_T ? grid.x <= (unsigned)env->resident[fa_hdp_index(HDP)] : grid.x * grid.y <= (unsigned)env->sms;
    const bool pdl = dec && fa_cfg<HDP, true>::COOP && a.rope_inv_freq && wave;
    const bool f8 = a.kv_fp8 != 0;
    const dim3 cl(1, 1, a.cluster ? grid.z : 1);
    const size_t dec_b = fa_cfg<HDP, true>::BYTES, pre_b = fa_cfg<HDP, false>::BYTES;
    if (dec && a.unit_T && f8) CUDA_CHECK(cuda_launch_pdl(pdl, flash_kernel<HDP, true, true, true>, grid, T, dec_b, st, o, q, kb, vb, rs, a));
    else if (dec && a.unit_T) CUDA_CHECK(cuda_launch_pdl(pdl, flash_kernel<HDP, true, true>, grid, T, dec_b, st, o, q, kb, vb, rs, a));
    else if (dec && f8) CUDA_CHECK(cuda_launch_cluster(pdl, cl, flash_kernel<HDP, true, false, true>, grid, T, dec_b, st, o, q, kb, vb, rs, a));
    else if (dec) CUDA_CHECK(cuda_launch_cluster(pdl, cl, flash_kernel<HDP, true>, grid, T, dec_b, st, o, q, kb, vb, rs, a));
    else if (f8) CUDA_CHECK(cuda_launch(flash_kernel<HDP, false, false, true>, grid, T, pre_b, st, o, q, kb, vb, rs, a));
    else CUDA_CHECK(cuda_launch(flash_kernel<HDP, false>, grid, T, pre_b, st, o, q, kb, vb, rs, a));
    return 0;
}

// Whether the device runs the decode kernel (head dims 64, 128) in clusters of CUDA_ATTN_CLUSTER.
template <int HDP> static bool fa_cluster_fits() {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(1, 1, CUDA_ATTN_CLUSTER);
    cfg.blockDim = dim3(32 * FA_WARPS);
    cfg.dynamicSmemBytes = fa_cfg<HDP, true>::BYTES;
    cudaLaunchAttribute at;
    at.id = cudaLaunchAttributeClusterDimension;
    at.val.clusterDim.x = 1, at.val.clusterDim.y = 1, at.val.clusterDim.z = CUDA_ATTN_CLUSTER;
    cfg.attrs = &at;
    cfg.numAttrs = 1;
    int n = 0;
    if (cudaOccupancyMaxActiveClusters(&n, flash_kernel<HDP, true>, &cfg) != cudaSuccess) {
        cudaGetLastError(); // not an error of a launch: no clusters
        return false;
    }
    return n > 0;
}

// The work-sized split's decode kernel blocks the device holds at once (its units fill them): at least sms.
template <int HDP> static int fa_resident(int sms) {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, flash_kernel<HDP, true, true>, 32 * FA_WARPS,
                                                      fa_cfg<HDP, true>::BYTES) != cudaSuccess) {
        cudaGetLastError();
        n = 1;
    }
    return (n > 0 ? n : 1) * sms;
}

extern "C" int cuda_attention_init(struct cuda_attn_env *env) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&env->sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
        return -2;
    if (fa_allow_smem<16>() | fa_allow_smem<32>() | fa_allow_smem<64>() | fa_allow_smem<128>()) return -2;
    int cl = 0;
    if (cudaDeviceGetAttribute(&cl, cudaDevAttrClusterLaunch, dev) != cudaSuccess) cudaGetLastError(), cl = 0;
    env->cluster = cl && fa_cluster_fits<64>() && fa_cluster_fits<128>();
    env->resident[0] = fa_resident<16>(env->sms), env->resident[1] = fa_resident<32>(env->sms);
    env->resident[2] = fa_resident<64>(env->sms), env->resident[3] = fa_resident<128>(env->sms);
    env->plain_split = false;
    env->wg_prefill = false; // (the backend sets it from its tuning)
    if (fa_prefill_wg_init() || fa_decode_batch_init(env->sms, env->batch_resident)) return -2;
    return 0;
}

// Retrieval heads: this step's K/V rows into their blocks (before attention reads them).
template <bool F8> // F8: the pools are fp8 (cuda_attn_args.kv_fp8)
__global__ void append_full_kernel(const __nv_bfloat16 *kb, const __nv_bfloat16 *vb, int rs, struct cuda_attn_args a) {
    pdl_trigger();
    pdl_wait();
    int t = blockIdx.x, s = a.tok_seq[t], pos = a.pos[t];
    for (int x = threadIdx.x; x < a.n_full * a.head_dim; x += blockDim.x) {
        int h = x / a.head_dim, d = x % a.head_dim;
        size_t src = (size_t)t * rs + (size_t)h * a.head_dim + d;
        size_t dst = full_row(a.k_full, a, s, pos, h) - a.k_full + d;
        kv_put<F8>(a.k_full, dst, kb[src], a.k_scale, h);
        kv_put<F8>(a.v_full, dst, vb[src], a.v_scale, h);
    }
}

// RoPE of q and k in place (as rope_kernel) and, for retrieval heads, the rotated k and the v
// of this step into their blocks: one kernel instead of rope_kernel + append_full_kernel.
// One thread per (token, pair (i, i + hd/2) of a q or k head).
template <bool F8> // F8: the pools are fp8 (cuda_attn_args.kv_fp8)
__global__ void rope_append_kernel(__nv_bfloat16 *qkv, int rs, const float *inv_freq, struct cuda_attn_args a) {
    pdl_trigger();
    pdl_wait();
    const int t = blockIdx.x, hd = a.head_dim, half = hd / 2;
    const int j = blockIdx.y * blockDim.x + threadIdx.x;
    if (j >= (a.n_heads + a.n_kv_heads) * half) return;
    const int h = j / half, i = j % half, pos = a.pos[t];
    __nv_bfloat16 *v = qkv + (size_t)t * rs + (size_t)h * hd;
    float ra, rb;
    rope_pair(__bfloat162float(v[i]), __bfloat162float(v[i + half]), pos, inv_freq[i], ra, rb);
    const __nv_bfloat16 bra = __float2bfloat16(ra), brb = __float2bfloat16(rb);
    v[i] = bra;
    v[i + half] = brb;
    const int kh = h - a.n_heads; // a k head: its retrieval rows go to the pool too
    if (kh >= 0 && kh < a.n_full) {
        size_t dst = full_row(a.k_full, a, a.tok_seq[t], pos, kh) - a.k_full;
        const __nv_bfloat16 *vs = v + (size_t)a.n_kv_heads * hd;
        kv_put<F8>(a.k_full, dst + i, bra, a.k_scale, kh);
        kv_put<F8>(a.k_full, dst + i + half, brb, a.k_scale, kh);
        kv_put<F8>(a.v_full, dst + i, vs[i], a.v_scale, kh);
        kv_put<F8>(a.v_full, dst + i + half, vs[i + half], a.v_scale, kh);
    }
}

// Streaming heads: sink rows and the recent ring, after attention. Of a chunk longer than the
// ring only its last `recent` positions are written, so no two threads share a row.
template <bool F8> // F8: the pools are fp8 (cuda_attn_args.kv_fp8)
__global__ void append_stream_kernel(const __nv_bfloat16 *kb, const __nv_bfloat16 *vb, int rs, struct cuda_attn_args a) {
    pdl_trigger();
    pdl_wait();
    int t = blockIdx.x, s = a.tok_seq[t], pos = a.pos[t];
    int last = a.pos[a.seq_start[s + 1] - 1];
    if (pos >= a.sink && last - pos >= a.recent) return;
    for (int x = threadIdx.x; x < a.n_stream * a.head_dim; x += blockDim.x) {
        int h = x / a.head_dim, d = x % a.head_dim;
        size_t src = (size_t)t * rs + (size_t)(a.n_full + h) * a.head_dim + d;
        size_t dst = stream_off(a, a.stream_slot[s], pos, h) + d;
        kv_put<F8>(a.k_stream, dst, kb[src], a.k_scale, a.n_full + h);
        kv_put<F8>(a.v_stream, dst, vb[src], a.v_scale, a.n_full + h);
    }
}

static long g_batch_launches; // (the op test's check that its steps ran in the batch decode kernel)
extern "C" long cuda_attention_batch_launches(void) { return g_batch_launches; }

extern "C" int cuda_attention(const struct cuda_attn_env *env, void *out, void *qkv, int rs,
                              const struct cuda_attn_args *a, int n_tokens, bool decode, int split,
                              const float *inv_freq, cudaStream_t st) {
    const __nv_bfloat16 *q = (const __nv_bfloat16 *)qkv;
    const __nv_bfloat16 *kb = q + (size_t)a->n_heads * a->head_dim, *vb = kb + (size_t)a->n_kv_heads * a->head_dim;
    __nv_bfloat16 *o = (__nv_bfloat16 *)out;
    const int G = a->n_heads / a->n_kv_heads;
    // the kernel and its split (cuda/attn_plan.c: the rules, tested on the CPU). split (decode
    // steps): partitions in parallel when the step alone would leave SMs idle (a speed choice
    // only: the partition states are merged in the same order either way); every token within 2,
    // 4 or 8 partitions (split 1, 2, 3): a cluster of that many blocks a token and KV head, block z
    // computing partition z; longer (split 4, 5): split by the work (fa_unit_of; PERF_NOTES run 43:
    // 1.2-23x faster than the plain split at 128k-512k); an unsplit decode step of more units than
    // the flash kernel's resident blocks, or a work-sized split past CUDA_ATTN_MERGE_LONG partitions
    // (split 5): the batch decode kernel (cuda/attn_decode.cu; RoPE and the append before it)
    const struct attn_plan_in pin = {a->n_heads, a->n_kv_heads, a->head_dim, a->n_full, a->n_stream, n_tokens, decode,
                                     split, a->ws != NULL, a->part_off != NULL, a->counters != NULL, a->n_counters,
                                     env->resident[fa_hdp_index(a->head_dim)], env->sms, env->cluster, env->plain_split,
                                     fa_decode_batch_takes(*a), env->wg_prefill && fa_prefill_wg_takes(*a),
                                     inv_freq != NULL};
    const struct attn_plan pl = attn_plan_make(&pin);
    const int Z = pl.Z;
    struct cuda_attn_args fa = *a;
    fa.rope_inv_freq = NULL;
    fa.bs_div = cuda_fdiv_make(a->block_size > 0 ? a->block_size : 1);
    fa.g_div = cuda_fdiv_make(G > 0 ? G : 1);
    fa.z_div = cuda_fdiv_make(Z);
    fa.rec_div = cuda_fdiv_make(a->recent > 0 ? a->recent : 1);
    fa.cluster = pl.clus;
    fa.unit_T = pl.unit_T;
    fa.unit_X = pl.X;
    if (!pl.counters) fa.counters = NULL; // (the last flash block of a (token, KV head) merges its states when a counter is there for it)
    if (pl.rope_fused) fa.rope_inv_freq = inv_freq;
    if (inv_freq && !fa.rope_inv_freq) { // RoPE and the retrieval heads' append in one kernel
        if (a->head_dim % 2) return -3;
        unsigned pairs = (unsigned)((a->n_heads + a->n_kv_heads) * (a->head_dim / 2));
        CUDA_CHECK(cuda_launch(a->kv_fp8 ? rope_append_kernel<true> : rope_append_kernel<false>, dim3(n_tokens, cuda_blocks(pairs, 128)), dim3(128), 0, st,
                               (__nv_bfloat16 *)qkv, rs, inv_freq, *a));
    } else if (!inv_freq && a->n_full) {
        CUDA_CHECK(cuda_launch(a->kv_fp8 ? append_full_kernel<true> : append_full_kernel<false>, dim3(n_tokens), dim3(128), 0, st, kb, vb, rs, *a));
    }
    // fa_merge_long_kernel over the split pairs of n tokens a retrieval KV head (a warp a head and
    // 32 dims of each), programmatic: it waits inside for the states
    auto long_merges = [&](int n) {
        const long items = (long)a->n_full * n * G * ((a->head_dim + 31) / 32);
        return cuda_launch_pdl(true, fa_merge_long_kernel, dim3((unsigned)min(items, 8L * env->sms)), dim3(32), 0, st, o,
                               (__nv_bfloat16 *)qkv, rs, fa);
    };
    if (pl.kernel == ATTN_K_BATCH) {
        g_batch_launches++;
        const int rc = fa_decode_batch(o, q, kb, vb, rs, fa, n_tokens, env->batch_resident[a->head_dim == 64 ? 0 : 1], st);
        if (rc) return rc;
        if (pl.long_merges) CUDA_CHECK(long_merges(pl.long_merges)); // the split pairs' merges
    } else if (pl.kernel == ATTN_K_WG_PREFILL) {
        const int rc = fa_prefill_wg(o, q, kb, vb, rs, fa, n_tokens, st);
        if (rc) return rc;
    } else if (pl.kernel == ATTN_K_FLASH) {
        dim3 fgrid = pl.work ? dim3(pl.n_work) : dim3(n_tokens, a->n_kv_heads, Z);
        int rc = a->head_dim <= 16   ? fa_launch<16>(env, decode, fgrid, st, o, q, kb, vb, rs, fa)
                 : a->head_dim <= 32 ? fa_launch<32>(env, decode, fgrid, st, o, q, kb, vb, rs, fa)
                 : a->head_dim <= 64 ? fa_launch<64>(env, decode, fgrid, st, o, q, kb, vb, rs, fa)
                                     : fa_launch<128>(env, decode, fgrid, st, o, q, kb, vb, rs, fa);
        if (rc) return rc;
        if (pl.merge_kernel)
            CUDA_CHECK(cuda_launch(fa_merge_kernel, dim3(n_tokens, (a->n_heads + 3) / 4), dim3(128), 0, st, o, fa));
        // the long merges (split 5), a warp each head and 32 dims, launched early (they wait inside)
        if (pl.long_merges) CUDA_CHECK(long_merges(pl.long_merges));
    } else {
        dim3 grid(n_tokens, a->n_heads), T(32 * ATTN_WARPS);
        const bool f8 = a->kv_fp8 != 0;
        if (a->head_dim > CUDA_ATTN_MAX_HEAD_DIM) return -3; // the engine refuses such models at load
        if (a->head_dim <= 32) CUDA_CHECK(cuda_launch(f8 ? attn_kernel<1, true> : attn_kernel<1>, grid, T, 0, st, o, q, kb, vb, rs, *a));
        else if (a->head_dim <= 64) CUDA_CHECK(cuda_launch(f8 ? attn_kernel<2, true> : attn_kernel<2>, grid, T, 0, st, o, q, kb, vb, rs, *a));
        else if (a->head_dim <= 128) CUDA_CHECK(cuda_launch(f8 ? attn_kernel<4, true> : attn_kernel<4>, grid, T, 0, st, o, q, kb, vb, rs, *a));
        else CUDA_CHECK(cuda_launch(f8 ? attn_kernel<8, true> : attn_kernel<8>, grid, T, 0, st, o, q, kb, vb, rs, *a));
    }
    if (a->n_stream) CUDA_CHECK(cuda_launch(a->kv_fp8 ? append_stream_kernel<true> : append_stream_kernel<false>, dim3(n_tokens), dim3(128), 0, st, kb, vb, rs, *a));
    CUDA_CHECK(cudaGetLastError());
    return 0;
}
