// attn_common.cuh: what the attention kernels share (cuda/attention.cu's flash kernel, cuda/
// attn_prefill.cu's wgmma prefill kernel): the pools' layouts, the copies, and the roundings of
// the probabilities and of the partition merge, so that every kernel sums alike.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>

#include "cuda/cuda_attention.h"

// keys are walked in tiles of FA_KT absolute positions, FA_PT tiles a partition
#define FA_KT 32
#define FA_PT (CUDA_ATTN_PART / FA_KT)

// the shapes the wgmma prefill and batch decode kernels take: head dims 64 and 128, 1 to 16 query
// heads a KV head
static inline bool fa_mma_shape(int head_dim, int G) { return (head_dim == 64 || head_dim == 128) && G >= 1 && G <= 16; }

__device__ __forceinline__ int fdiv(int n, const struct cuda_fdiv &f) {
    return (int)((__umulhi((unsigned)n, f.m) + (unsigned)n) >> f.s);
}

// The two pools' layouts, in rows of head_dim: full pool [block][in_blk][n_full head]; streaming
// pool [slot][ring row r][n_stream head], r = p for the sinks, sink + (p - sink) % recent after
// (every kernel that addresses a pool goes through these)
__device__ __forceinline__ size_t full_pool_row(const struct cuda_attn_args &a, int blk, int in_blk, int h) {
    return ((size_t)blk * a.block_size + (size_t)in_blk) * a.n_full + (size_t)h;
}
__device__ __forceinline__ size_t stream_pool_row(const struct cuda_attn_args &a, int slot, int r, int h) {
    return ((size_t)slot * (a.sink + a.recent) + (size_t)r) * a.n_stream + (size_t)h;
}
// the ring row r of position p in a streaming slot (a.rec_div: the divisor of a.recent)
__device__ __forceinline__ int stream_ring_row(const struct cuda_attn_args &a, int p) {
    return p < a.sink ? p : a.sink + (p - a.sink) - fdiv(p - a.sink, a.rec_div) * a.recent;
}

// Partition states in a.ws: slot ((part_off[t] + p) * n_heads + head) * (HD + 2) = {m, l, o[HD]}.
__device__ __forceinline__ float *fa_state(const struct cuda_attn_args &a, int t, int p, int head) {
    return a.ws + ((size_t)(a.part_off[t] + p) * a.n_heads + head) * (a.head_dim + 2);
}
// A work-sized split's units of a retrieval KV head: T + X, token t's from S(t) = t + floor(X
// part_off[t] / P) to S(t + 1) (P = part_off[T]: a unit a token, the X others in proportion to its
// partitions)
__device__ __forceinline__ int fa_unit_first(const struct cuda_attn_args &a, int t, int X, long long P) {
    return t + (int)((long long)X * a.part_off[t] / P);
}
// the first partition a retrieval head's keys at position pos are seen from (its sliding window's)
__device__ __forceinline__ int fa_window_part0(const struct cuda_attn_args &a, int pos) {
    return a.sliding_window > 0 ? max(0, pos - a.sliding_window + 1) / CUDA_ATTN_PART : 0;
}
// w partitions from p0 in k near-equal runs: run j is [fa_run_at(p0, w, j, k), fa_run_at(p0, w, j + 1, k))
__device__ __forceinline__ int fa_run_at(int p0, int w, int j, int k) { return p0 + (int)((long long)j * w / k); }
// Whether a decode step's partitions go through the workspace (else block z = 0 does it all).
// (parts_total: part_off[n_tokens], the step's partition states a head)
__device__ __forceinline__ bool fa_split_fits_n(const struct cuda_attn_args &a, int parts_total) {
    return (size_t)parts_total * a.n_heads * (a.head_dim + 2) <= a.ws_floats;
}

// The tiles a query range [pf, pl] sees: [lo0, hi0] then [lo1, hi1] (retrieval heads: from the
// sliding window's start, else 0, to pl; streaming heads: the sink's, then the recent window's)
struct fa_range {
    int lo0, hi0, lo1, hi1;
    __device__ void make(const struct cuda_attn_args &a, bool full, int pf, int pl) {
        lo1 = 1, hi1 = 0;
        if (full) {
            int first = a.sliding_window > 0 ? max(0, pf - a.sliding_window + 1) : 0;
            lo0 = first / FA_KT;
            hi0 = pl / FA_KT;
        } else {
            int sink_end = min(a.sink, pl + 1);
            lo0 = 0;
            hi0 = sink_end > 0 ? (sink_end - 1) / FA_KT : -1;
            lo1 = max(hi0 + 1, max(0, pf - a.recent + 1) / FA_KT);
            hi1 = pl / FA_KT;
        }
    }
    __device__ void none() { lo0 = lo1 = 1, hi0 = hi1 = 0; }
    __device__ bool has(int t) const { return (t >= lo0 && t <= hi0) || (t >= lo1 && t <= hi1); }
    // whether any of tiles t0 .. t1 is in the range
    __device__ bool has_tiles(int t0, int t1) const {
        return max(t0, lo0) <= min(t1, hi0) || max(t0, lo1) <= min(t1, hi1); // (an empty range has none)
    }
    __device__ bool has_part(int p) const { return has_tiles(p * FA_PT, p * FA_PT + FA_PT - 1); }
    // the next partition after p (-1: from the start) with a tile in the range, or -1
    __device__ int next_part(int p) const {
        int t = (p + 1) * FA_PT;
        if (t <= hi0) t = max(t, lo0);
        else if (t <= hi1) t = max(t, lo1);
        else return -1;
        return t / FA_PT;
    }
};

__device__ __forceinline__ void fa_cp16(void *smem, const void *gmem, bool pred) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(pred ? 16 : 0));
}
// Two probabilities as bf16 pairs: head (x rounded) and remainder (x - head, rounded).
// P V's precision by the padded head dim: at 64 and 128 (the models' heads, where the wgmma
// prefill kernel runs) P is rounded to bf16, one MMA a k16 step, as FlashAttention does; below,
// P is its bf16 head and remainder (pack_p<true>, two MMAs: ~16 bits), which keeps stories260k's
// greedy ids on the golden file (P in bf16 alone parted them at token 185: runs 53-56). Every
// kernel of a head dim uses the same rule, so their bits stay equal.
template <int HDP> constexpr bool fa_p_split = HDP < 64;
// P's bf16 pair (x0, x1), and with fa_p_split its remainder too: the head is the same either way
template <bool SPLIT> __device__ __forceinline__ void pack_p(float x0, float x1, uint32_t &hi, uint32_t &lo) {
    __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
    hi = *reinterpret_cast<uint32_t *>(&h);
    if constexpr (SPLIT) {
        float2 hf = __bfloat1622float2(h);
        __nv_bfloat162 l = __floats2bfloat162_rn(x0 - hf.x, x1 - hf.y);
        lo = *reinterpret_cast<uint32_t *>(&l);
    }
}

// Adds a partition's softmax state (its rows' max m, full sum l, and o) to a running total (M,
// L, O). Every rounding is explicit (O: one fma of O ca and the rounded o cb), so the flash kernel,
// which merges in registers, and fa_merge_kernel, which merges states from memory, compute the same bits. An
// empty partition (m = -inf: the row sees none of its keys) adds nothing at all.
__device__ __forceinline__ bool fa_merge_begin(float &M, float &L, float m, float l, float &ca, float &cb) {
    if (m == -INFINITY) return false;
    float mn = fmaxf(M, m);
    ca = exp2f(M - mn); // 0 while the total is empty
    cb = exp2f(m - mn);
    L = __fadd_rn(__fmul_rn(L, ca), __fmul_rn(l, cb));
    M = mn;
    return true;
}
__device__ __forceinline__ float fa_merge_o(float O, float o, float ca, float cb) {
    return __fmaf_rn(O, ca, __fmul_rn(o, cb));
}

// The fp8 KV cache's element (cuda_attn_args.kv_fp8): e4m3 of x / scale, nearest even, saturating
// at +-448, NaN kept (engine/fp8.h's encoding, which the CPU backend uses), and back as
// e4m3 * scale rounded to bf16 (exact for power-of-two scales: an e4m3 value has 4 significant bits).
__device__ __forceinline__ uint8_t kv8_enc(float x, float scale) {
    return (uint8_t)__nv_cvt_float_to_fp8(x / scale, __NV_SATFINITE, __NV_E4M3);
}
__device__ __forceinline__ float kv8_dec(uint8_t b, float scale) {
    return __half2float(__half(__nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)b, __NV_E4M3))) * scale;
}
// a pool byte as the kernels use it: bf16(e4m3 * scale)
__device__ __forceinline__ __nv_bfloat16 kv8_get(uint8_t b, float scale) { return __float2bfloat16(kv8_dec(b, scale)); }
// a bf16 value as the fp8 pool would give it back
__device__ __forceinline__ __nv_bfloat16 kv8_round(__nv_bfloat16 x, float scale) {
    return kv8_get(kv8_enc(__bfloat162float(x), scale), scale);
}
// 8 pool bytes (consecutive dims) as 8 bf16
__device__ __forceinline__ uint4 kv8_unpack8(uint2 w, float scale) {
    const uint8_t *b = reinterpret_cast<const uint8_t *>(&w);
    uint4 r;
    uint32_t *o = reinterpret_cast<uint32_t *>(&r);
#pragma unroll
    for (int i = 0; i < 4; i++) { // two bytes a conversion (exact: e4m3 fits f16)
        const __half2 h2 = __half2(__nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(b[2 * i] | b[2 * i + 1] << 8), __NV_E4M3));
        const float2 f = __half22float2(h2);
        __nv_bfloat162 h = __floats2bfloat162_rn(f.x * scale, f.y * scale);
        o[i] = *reinterpret_cast<uint32_t *>(&h);
    }
    return r;
}
// 8 bf16 (a row's consecutive dims, the step's own K/V) as 8 pool bytes
__device__ __forceinline__ uint2 kv8_pack8(uint4 x, float scale) {
    const __nv_bfloat16 *h = reinterpret_cast<const __nv_bfloat16 *>(&x);
    uint2 r;
    uint8_t *b = reinterpret_cast<uint8_t *>(&r);
#pragma unroll
    for (int i = 0; i < 8; i++) b[i] = kv8_enc(__bfloat162float(h[i]), scale);
    return r;
}
// an 8-byte copy into shared memory (zeros when !pred): the fp8 pools' rows
__device__ __forceinline__ void fa_cp8(void *smem, const void *gmem, bool pred) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(s), "l"(gmem), "r"(pred ? 8 : 0));
}
// stores x (a bf16 K or V element of KV head h) at element e of a pool (F8: e4m3 with the head's scale)
template <bool F8>
__device__ __forceinline__ void kv_put(__nv_bfloat16 *pool, size_t e, __nv_bfloat16 x, const float *scales, int h) {
    if constexpr (F8) reinterpret_cast<uint8_t *>(pool)[e] = kv8_enc(__bfloat162float(x), scales[h]);
    else pool[e] = x;
}

// The keys that every counted row of a warp sees (counted[h]: this thread's row h counts; the
// mask test of fa_tile_mask): keys k0 .. k1 are all visible to each of them iff sees_all. Masking
// can be skipped there (masking a visible key changes nothing). Every lane calls make.
struct fa_warp_sight {
    int hi, lo; // the least vhi and the greatest vlo of the counted rows
    __device__ void make(const int (&vhi)[2], const int (&vlo)[2], bool counted0, bool counted1) {
        hi = INT_MAX, lo = INT_MIN;
        if (counted0) hi = min(hi, vhi[0]), lo = max(lo, vlo[0]);
        if (counted1) hi = min(hi, vhi[1]), lo = max(lo, vlo[1]);
#pragma unroll
        for (int x = 1; x < 32; x <<= 1) hi = min(hi, __shfl_xor_sync(0xffffffffu, hi, x)), lo = max(lo, __shfl_xor_sync(0xffffffffu, lo, x));
    }
    __device__ bool sees_all(int k0, int k1, int vse) const { return k1 <= hi && (k0 >= lo || k1 < vse); }
};

// A 32-key tile's scores on the mma accumulator layout (this thread's rows g and g + 8, h = 0 and 1;
// keys 8n + 2 qd + e), as every attention kernel masks them (the same code, the same bits): row h
// sees key j iff j <= vhi[h] and (j >= vlo[h] or j < vse), an invisible key -inf (evaluated without
// branches: the && / || form compiled into divergent branches that cost ~900 cycles a tile); the
// visible ones are left as they are (fa_part_softmax scales them). !rows8: row g + 8 is padding
// (left as is).
__device__ __forceinline__ void fa_tile_mask(float (&sc)[FA_KT / 8][4], int tile, int qd, const int (&vhi)[2],
                                             const int (&vlo)[2], int vse, bool rows8) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
        if (h && !rows8) continue;
#pragma unroll
        for (int n = 0; n < FA_KT / 8; n++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int j = tile * FA_KT + n * 8 + 2 * qd + e;
                const bool vis = (j <= vhi[h]) & ((j >= vlo[h]) | (j < vse)); // no branches
                sc[n][2 * h + e] = vis ? sc[n][2 * h + e] : -INFINITY;
            }
    }
}
// 2^x, flushing a result below 2^-126 to 0 (one MUFU.EX2; exp2f adds three instructions for the
// subnormal range)
__device__ __forceinline__ float fa_ex2(float x) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}
// The softmax of a partition (every attention kernel's, the same code, the same bits): x[i] is
// tile i's masked scores (fa_tile_mask, or unmasked where every key is visible) on the mma
// accumulator layout, for the tiles with bit i of `has` set (the others are not read: a tile none
// of the thread's rows sees adds nothing). Per row h, in log2 units (sl2: the scale times log2 e):
// m = sl2 times the max of its scores (the max of the scaled scores: rounding is monotonic), x
// becomes p = 2^(x sl2 - m) (one fma, fa_ex2), and l = this thread's sum of its p in order (tile,
// n, e); the quad's four sums are added at the partition's close. A row that sees none of the
// partition's keys keeps m = -inf, p = 0, l = 0 (an empty state).
// !rows8: row g + 8 is padding (its m and l untouched, its p left as they are: never read).
template <int NT>
__device__ __forceinline__ void fa_part_softmax(float (&x)[NT][FA_KT / 8][4], unsigned has, float (&m)[2], float (&l)[2],
                                                bool rows8, float sl2) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
        if (h && !rows8) continue;
        float mx = -INFINITY;
#pragma unroll
        for (int i = 0; i < NT; i++)
            if (has >> i & 1)
#pragma unroll
                for (int n = 0; n < FA_KT / 8; n++)
#pragma unroll
                    for (int e = 0; e < 2; e++) mx = fmaxf(mx, x[i][n][2 * h + e]);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float ms = __fmul_rn(mx, sl2), mr = mx == -INFINITY ? 0.0f : ms; // (-inf - -inf would be NaN)
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < NT; i++)
            if (has >> i & 1)
#pragma unroll
                for (int n = 0; n < FA_KT / 8; n++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const float p = fa_ex2(__fmaf_rn(x[i][n][2 * h + e], sl2, -mr)); // (-inf: 0)
                        x[i][n][2 * h + e] = p;
                        sum += p;
                    }
        m[h] = ms;
        l[h] = sum;
    }
}

__device__ __forceinline__ void fa_ldsm_x4(uint32_t *r, const void *p) {
    unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}
__device__ __forceinline__ void fa_ldsm_x4_t(uint32_t *r, const void *p) {
    unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}
// Not volatile: registers only, so the compiler may interleave independent MMAs.
__device__ __forceinline__ void fa_mma(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// SW: rows of LD bf16 whose 16-byte chunks are XOR-swizzled by the row (chunk c of row r at c ^ (r
// & 7): ldmatrix conflict-free without padding; rows of at least 8 chunks), else plain rows of LD
template <bool SW, int LD>
__device__ __forceinline__ int fa_sw_at(int row, int col) { // col: a multiple of 8
    static_assert(!SW || LD % 64 == 0, "a swizzled row holds at least 8 chunks");
    return row * LD + (SW ? ((col >> 3) ^ (row & 7)) << 3 : col);
}
// One tile's sums on mma.sync, each the same code wherever it runs (the flash kernel's lone
// prefill warp and its COOP decode warps, the batch decode kernel), so a row's bits never depend
// on the kernel that computed it. Shared-memory rows of HDP + 8 bf16 (conflict-free ldmatrix).
// S = Q K^T: 16 rows (qa: Q's A fragments) x FA_KT keys from the tile's K rows ck. The k steps of
// the FA_KT / 8 key groups are interleaved (each group's own sum still runs k = 0, 16, ... in
// order), so consecutive MMAs are independent.
template <int HDP, bool SW = false>
__device__ __forceinline__ void fa_tile_scores(const uint32_t (&qa)[HDP / 16][4], const __nv_bfloat16 *ck,
                                               float (&sc)[FA_KT / 8][4], int lane) {
    constexpr int LD = SW ? HDP : HDP + 8;
#pragma unroll
    for (int n = 0; n < FA_KT / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) sc[n][e] = 0.0f;
#pragma unroll
    for (int k = 0; k < HDP / 16; k += 2) {
        uint32_t b[FA_KT / 8][4]; // keys n*8 + lane%8, dims k*16 + (lane/8)*8: two k16 steps at once
        const bool two = k + 1 < HDP / 16;
#pragma unroll
        for (int n = 0; n < FA_KT / 8; n++)
            fa_ldsm_x4(b[n], ck + fa_sw_at<SW, LD>(n * 8 + lane % 8, k * 16 + (two ? lane / 8 : (lane / 8) % 2) * 8));
#pragma unroll
        for (int n = 0; n < FA_KT / 8; n++) fa_mma(sc[n], qa[k], b[n][0], b[n][1]);
        if (two)
#pragma unroll
            for (int n = 0; n < FA_KT / 8; n++) fa_mma(sc[n], qa[k + 1], b[n][2], b[n][3]);
    }
}
// o += P V for one tile of the partition, for the OT output n8 tiles from d0 (OT even): P straight
// from the score registers as the A operand, in bf16 at HDP 64 and 128; below, split into a bf16
// head and a bf16 remainder (two MMAs: P keeps ~16 bits; P in bf16 alone parted stories260k's
// greedy ids from the golden file at token 185): fa_p_split. !rows8: rows 8-15 are padding.
template <int HDP, int OT, bool SW = false>
__device__ __forceinline__ void fa_tile_pv(float (&o)[OT][4], const __nv_bfloat16 *cv, const float (&sc)[FA_KT / 8][4],
                                           bool rows8, int d0, int lane) {
    constexpr int LD = SW ? HDP : HDP + 8;
#pragma unroll
    for (int c = 0; c < FA_KT / 16; c++) {
        constexpr bool SP = fa_p_split<HDP>;
        uint32_t ph[4], pl[4];
        pack_p<SP>(sc[2 * c][0], sc[2 * c][1], ph[0], pl[0]);
        pack_p<SP>(sc[2 * c + 1][0], sc[2 * c + 1][1], ph[2], pl[2]);
        if (rows8) {
            pack_p<SP>(sc[2 * c][2], sc[2 * c][3], ph[1], pl[1]);
            pack_p<SP>(sc[2 * c + 1][2], sc[2 * c + 1][3], ph[3], pl[3]);
        } else {
            ph[1] = pl[1] = ph[3] = pl[3] = 0u; // pack_p(0, 0)
        }
        // every V fragment of the 16 keys first, then the head MMAs of the output tiles d0 ..
        // d0 + OT - 1 (pairs dd of them a fragment), then the remainder's (per output still head
        // then remainder, c in order; no remainder at HDP 64 and 128: fa_p_split)
        uint32_t b[OT / 2][4]; // keys c*16 + lane%16, dims (d0/2 + dd)*16 + (lane/16)*8, transposed
#pragma unroll
        for (int dd = 0; dd < OT / 2; dd++)
            fa_ldsm_x4_t(b[dd], cv + fa_sw_at<SW, LD>(c * 16 + lane % 16, (d0 / 2 + dd) * 16 + (lane / 16) * 8));
#pragma unroll
        for (int dd = 0; dd < OT / 2; dd++) {
            fa_mma(o[2 * dd], ph, b[dd][0], b[dd][1]);
            fa_mma(o[2 * dd + 1], ph, b[dd][2], b[dd][3]);
        }
        if constexpr (SP) {
#pragma unroll
            for (int dd = 0; dd < OT / 2; dd++) {
                fa_mma(o[2 * dd], pl, b[dd][0], b[dd][1]);
                fa_mma(o[2 * dd + 1], pl, b[dd][2], b[dd][3]);
            }
        }
    }
}
