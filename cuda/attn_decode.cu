// attn_decode: the batch decode attention (issues 20 and 22), for decode steps of more (token,
// KV head) units than the flash kernel's blocks the device holds at once (b33 and up on
// Llama-3-8B), none split; and for the decode steps of long contexts (a work-sized split: the
// units are runs of a (token, KV head)'s partitions).
//
// Why: the flash kernel gives each unit a block. At b256 and a 128-token context (run 68) its
// decode took 134 us a layer against a 40 us floor: each block pays its metadata round trips
// before its first K/V load and leaves with nothing in flight, two blocks an SM.
//
// Here the device's resident blocks walk the units (unit u = kvh * T + t, KV head major, so a
// block mixes retrieval and streaming heads; block b takes u = b, b + grid, ..) as one stream of
// items (unit, partition) with two loads in flight while one is summed: three K / V buffers in
// rotation, so the next item's K and this one's V load while this one's scores are summed, and the
// next item's K and V during this one's P V (the next unit's Q with them); the next unit's
// metadata loads a unit ahead, its block ids two items ahead. The K / V rows are unpadded, their
// 16-byte chunks swizzled by the row (fa_sw_at), so that two blocks fit an SM. A partition is summed exactly as the flash
// kernel's cooperative decode sums it (attn_common.cuh: fa_tile_scores, fa_tile_mask,
// fa_part_softmax, fa_tile_pv; the merge in order with fa_merge_begin / fa_merge_o), so each
// output has the flash kernel's bits: warp w takes the scores of tile w of the partition into
// shared memory, then every warp runs the partition's softmax and P V for its quarter of the
// head dims.
//
// A work-sized split (a.unit_T: long contexts, issue 22): the streaming (token, KV head) pairs
// are a unit each (their work is sink and recent), then each retrieval KV head's partitions are
// spread over T + X units, token t getting a share in proportion to its partitions (fa_unit_of's
// rule), X chosen so that the blocks walk DB_UNITS_BLOCK units each on average: short units, so
// that blocks that drew streaming units (or short contexts) take their share of the long ones
// and no SM idles while the retrieval heads' keys are read. A unit of a (token, KV head) that
// several units share writes each partition's state (fa_state) instead of merging it;
// fa_merge_long_kernel (attention.cu) folds them in order after the kernel, the same fold as the
// registers' (the same bits).
#include <cuda_bf16.h>
#include <limits.h>
#include <stdint.h>

#include "cuda/attn_common.cuh"
#include "cuda/attn_decode.h"
#include "cuda/cuda_common.h"

#define DB_WARPS 4 // a warp the scores of each tile of a partition
#ifndef DB_UNITS_BLOCK // (a build may set it: scripts/device_pack.sh's VARIANTS)
#define DB_UNITS_BLOCK 4 // a work-sized split's units a block, on average
#endif
static_assert(FA_PT == DB_WARPS, "a warp a tile of the partition");
static_assert(FA_KT * 4 == 32 * DB_WARPS, "four threads a key row");

template <int HD> struct db_cfg {
    static constexpr int LD = HD + 8;            // Q's padded smem rows: conflict-free ldmatrix
    static constexpr int LDS = HD;               // K / V rows, swizzled (fa_sw_at): conflict-free unpadded
    static constexpr int OT = HD / 8 / DB_WARPS; // output n8 tiles a warp (2 or 4)
    static constexpr size_t KV = (size_t)FA_PT * FA_KT * LDS * 2; // a partition's K (or V) rows
    // three K / V buffers, Q (16 rows), then the partition's scores [tile][FA_KT / 8][4][32] f32
    static constexpr size_t Q_OFF = 3 * KV, XS_OFF = Q_OFF + (size_t)16 * LD * 2;
    static constexpr size_t BYTES = XS_OFF + (size_t)FA_PT * (FA_KT / 8) * 4 * 32 * 4;
};

// A unit's metadata: unit u is token (sequence) t and KV head kvh, and of the k units of that
// (token, KV head) the j-th; pos and base (its block table's start, or its streaming slot) loaded
struct db_meta {
    int u, t, kvh, j, k, pos, base;
};
// a unit as the walk computes it: its partitions [pa, pb) (split: its states go to the workspace,
// else the whole (token, KV head) is this unit's and it writes the output); active: it has work
struct db_unit {
    int u, t, kvh, pos, base, pv0, pa, pb;
    bool full, split, active;
    fa_range r;
};
// Unit u's metadata (every thread of the block, the same values). Plain: u = kvh T + t, one unit
// a (token, KV head). Work-sized (work, X, P = part_off[T]): streaming pairs first, then the T + X
// units of each retrieval KV head, numbered KV-head minor (retrieval unit v: head v % n_full's
// v / n_full-th), so that the blocks running at once read every head of the same pool rows (a
// row holds the retrieval heads of a position: one head's 256 bytes are 2 KB apart otherwise);
// token t's share from S(t) = t + floor(X part_off[t] / P) (fa_unit_of's; found by each warp: 32
// tokens a round trip)
__device__ __forceinline__ db_meta db_load(const struct cuda_attn_args &a, int u, int T, bool work, int X, int P) {
    db_meta m;
    m.u = u, m.j = 0, m.k = 1;
    if (!work) {
        m.kvh = u / T, m.t = u - m.kvh * T;
    } else if (u < a.n_stream * T) {
        m.kvh = a.n_full + u / T, m.t = u % T;
    } else {
        const int v = u - a.n_stream * T, per = T + X, r = v / a.n_full;
        m.kvh = v % a.n_full;
        if (T == 1) {
            m.t = 0, m.j = r, m.k = per;
        } else if (X == 0) {
            m.t = r;
        } else {
            const int lane = threadIdx.x % 32;
            m.t = 0;
            for (int t0 = 0; t0 < T; t0 += 32) {
                const int t = t0 + lane;
                int s0 = 0, s1 = 0;
                if (t < T) {
                    s0 = fa_unit_first(a, t, X, P), s1 = fa_unit_first(a, t + 1, X, P);
                }
                const unsigned hit = __ballot_sync(0xffffffffu, t < T && s0 <= r && r < s1);
                if (hit) { // S increases (k_t >= 1): exactly one token's range holds r
                    const int src = __ffs(hit) - 1;
                    m.t = __shfl_sync(0xffffffffu, t, src);
                    m.j = r - __shfl_sync(0xffffffffu, s0, src);
                    m.k = __shfl_sync(0xffffffffu, s1 - s0, src);
                    break;
                }
            }
        }
    }
    m.pos = a.pos[m.t];
    m.base = m.kvh < a.n_full ? a.block_indptr[m.t] : a.stream_slot[m.t];
    return m;
}
// The unit of metadata m (fits: the step's partition states fit the workspace). A retrieval
// (token, KV head) of w partitions from pv0 (the first its window sees) shared by k units: unit j
// takes the j-th of k near-equal runs (fa_unit_of's); unsplit (one unit, or no room for the
// states), its last unit takes them all.
__device__ __forceinline__ db_unit db_make(const struct cuda_attn_args &a, const db_meta &m, bool fits) {
    db_unit x;
    x.u = m.u, x.t = m.t, x.kvh = m.kvh, x.pos = m.pos, x.base = m.base;
    x.full = x.kvh < a.n_full;
    x.r.make(a, x.full, x.pos, x.pos);
    x.pv0 = x.full ? fa_window_part0(a, x.pos) : 0;
    x.pa = 0, x.pb = INT_MAX, x.split = false, x.active = true;
    if (x.full && m.k > 1) {
        const int w = cuda_attn_parts(x.pos) - x.pv0;
        x.split = min(m.k, w) > 1 && fits;
        if (x.split) {
            x.pa = fa_run_at(x.pv0, w, m.j, m.k), x.pb = fa_run_at(x.pv0, w, m.j + 1, m.k);
            x.active = x.pa < x.pb;
        } else {
            x.active = m.j == m.k - 1;
        }
    }
    return x;
}
// unit x's next partition after p (-1: from its first) with tiles to sum, or -1
__device__ __forceinline__ int db_next(const db_unit &x, int p) {
    const int q = x.r.next_part(max(p, x.pa - 1));
    return q >= x.pb ? -1 : q;
}

// F8: the pools are fp8 (cuda_attn_args.kv_fp8): a K/V row's bytes land in the upper half of its
// bf16 row in shared memory, and each thread makes the chunks it loaded bf16 in place after its own
// copies have landed (db_f8_rows), before the barrier that hands the rows to the MMAs
template <int HD, bool F8>
__global__ void __launch_bounds__(32 * DB_WARPS) fa_decode_batch_kernel(__nv_bfloat16 *out, const __nv_bfloat16 *q,
                                                                         const __nv_bfloat16 *kb, const __nv_bfloat16 *vb,
                                                                         int rs, struct cuda_attn_args a, int T) {
    using CF = db_cfg<HD>;
    constexpr int LD = CF::LD, LDS = CF::LDS, OT = CF::OT;
    extern __shared__ __align__(16) unsigned char db_raw[];
    __nv_bfloat16 *const sk = reinterpret_cast<__nv_bfloat16 *>(db_raw);
    auto buf = [&](int b) { return sk + b * (FA_PT * FA_KT * LDS); }; // buffer b of three
    __nv_bfloat16 *sq = reinterpret_cast<__nv_bfloat16 *>(db_raw + CF::Q_OFF);
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, qd = lane % 4;
    const int kr = tid / 4, part = tid % 4; // key row kr of a tile, every 4th 16-byte chunk from part
    const int G = a.n_heads / a.n_kv_heads, stride = (int)gridDim.x;
    // a work-sized split: X units a retrieval KV head beyond one a token (at most one a partition)
    const bool work = a.unit_T > 0;
    const int P = work ? a.part_off[T] : 0;
    const bool fits = work && fa_split_fits_n(a, P);
    const int X = work && a.n_full > 0
                      ? max(0, min((DB_UNITS_BLOCK * stride - a.n_stream * T) / a.n_full - T, P - T))
                      : 0;
    const int n_units = work ? a.n_stream * T + a.n_full * (T + X) : T * a.n_kv_heads;
    const int d0 = warp * OT; // this warp's first output n8 tile
    const bool rows8 = G > 8; // (decode: rows 8-15 are padding unless GQA > 8)
    const float sl2 = a.scale * 1.4426950408889634f;
    float *xs = reinterpret_cast<float *>(db_raw + CF::XS_OFF) + lane; // [tile][n][e], x 32 lanes

    // the pool block of key row kr of each tile of partition p of unit x (0: none)
    auto fetch_blocks = [&](const db_unit &x, int p, int (&blq)[FA_PT]) {
#pragma unroll
        for (int i = 0; i < FA_PT; i++) {
            const int tile = p * FA_PT + i, j = tile * FA_KT + kr;
            blq[i] = p >= 0 && x.full && x.r.has(tile) && j <= x.pos ? a.block_ids[x.base + fdiv(j, a.bs_div)] : 0;
        }
    };
    // K (kv 1) or V (kv 2) row kr of a tile of unit x into buffer i: the pool row, or for a
    // streaming head the step's own row (from q|k|v) or the ring's; zeros past the keys it has
    // (the flash kernel's load_tile at a decode token)
    auto load_tile = [&](const db_unit &x, int i, int tile, int blk, int kv, __nv_bfloat16 *dbuf) {
        const int j = tile * FA_KT + kr;
        const __nv_bfloat16 *src = NULL;
        const __nv_bfloat16 *step = kv == 1 ? kb : vb; // the step's K or V rows (also a zero-fill's dummy address)
        if (x.full) {
            if (j <= x.pos)
                src = (kv == 1 ? a.k_full : a.v_full) + full_pool_row(a, blk, j - fdiv(j, a.bs_div) * a.block_size, x.kvh) * HD;
        } else if (j == x.pos) {
            src = step + (size_t)x.t * rs + (size_t)x.kvh * HD;
        } else if (j < x.pos && (j < a.sink || j >= x.pos - a.recent)) {
            const int rr = stream_ring_row(a, j);
            src = (kv == 1 ? a.k_stream : a.v_stream) + stream_pool_row(a, x.base, rr, x.kvh - a.n_full) * HD;
        }
        if constexpr (F8) { // the row's bytes, 16 a chunk (the step's own row rounded as the pool would hold it)
            uint8_t *e = reinterpret_cast<uint8_t *>(dbuf + (i * FA_KT + kr) * LDS) + HD;
            const bool own = !x.full && j == x.pos;
            const float sc = own ? (kv == 1 ? a.k_scale : a.v_scale)[x.kvh] : 1.0f;
            const __nv_bfloat16 *pool = x.full ? (kv == 1 ? a.k_full : a.v_full) : (kv == 1 ? a.k_stream : a.v_stream);
            // (a pool row's element offset, as bytes of the fp8 pool)
            const uint8_t *b = src && !own ? reinterpret_cast<const uint8_t *>(pool) + (src - pool) : NULL;
            for (int c = part * 16; c < HD; c += 64) {
                if (own) {
                    *reinterpret_cast<uint2 *>(e + c) = kv8_pack8(*reinterpret_cast<const uint4 *>(src + c), sc);
                    *reinterpret_cast<uint2 *>(e + c + 8) = kv8_pack8(*reinterpret_cast<const uint4 *>(src + c + 8), sc);
                } else {
                    fa_cp16(e + c, b ? b + c : (const void *)step, b != NULL);
                }
            }
        } else {
            for (int c = part * 8; c < HD; c += 32)
                fa_cp16(dbuf + fa_sw_at<true, LDS>(i * FA_KT + kr, c), src ? src + c : step, src != NULL);
        }
    };
    // (F8) the chunks this thread loaded of partition p's K (kv 1) or V (kv 2) rows in dbuf, as bf16
    // in place (to their swizzled places): its own copies landed (cp.async.wait_group), the row's
    // four lanes read their bytes, meet (__syncwarp: every byte read before any is overwritten),
    // then write; the barrier after hands the rows to every warp
    auto db_f8_rows = [&](const db_unit &x, int p, int kv, __nv_bfloat16 *dbuf) {
        const float sc = (kv == 1 ? a.k_scale : a.v_scale)[x.kvh];
#pragma unroll
        for (int i = 0; i < FA_PT; i++) {
            if (!x.r.has(p * FA_PT + i)) continue; // (the same for the whole block)
            const int r = i * FA_KT + kr;
            const uint8_t *e = reinterpret_cast<const uint8_t *>(dbuf + r * LDS) + HD;
            uint4 w[HD / 64];
#pragma unroll
            for (int k = 0; k < HD / 64; k++) w[k] = *reinterpret_cast<const uint4 *>(e + part * 16 + k * 64);
            __syncwarp();
#pragma unroll
            for (int k = 0; k < HD / 64; k++) {
                const int c = part * 16 + k * 64;
                *reinterpret_cast<uint4 *>(dbuf + fa_sw_at<true, LDS>(r, c)) = kv8_unpack8(make_uint2(w[k].x, w[k].y), sc);
                *reinterpret_cast<uint4 *>(dbuf + fa_sw_at<true, LDS>(r, c + 8)) = kv8_unpack8(make_uint2(w[k].z, w[k].w), sc);
            }
        }
    };
    auto load_part = [&](const db_unit &x, int p, const int (&blq)[FA_PT], int kv, __nv_bfloat16 *dbuf) { // one commit group
        if (p >= 0)
#pragma unroll
            for (int i = 0; i < FA_PT; i++)
                if (x.r.has(p * FA_PT + i)) load_tile(x, i, p * FA_PT + i, blq[i], kv, dbuf);
        asm volatile("cp.async.commit_group;\n" ::);
    };
    auto load_q = [&](const db_unit &x) { // the G query rows of the unit, zero rows after
        for (int i = tid; i < 16 * (HD / 8); i += 32 * DB_WARPS) {
            const int r = i / (HD / 8), c = (i % (HD / 8)) * 8;
            const bool ok = r < G;
            fa_cp16(sq + r * LD + c, ok ? q + (size_t)x.t * rs + (size_t)(x.kvh * G + r) * HD + c : q, ok);
        }
    };

    // the stream of (unit, partition) items: C / p computed now, L / lp loading next, the metadata
    // of the unit after L's (nm, of unit nu) a unit ahead
    int nu = blockIdx.x, lp = -1;
    db_meta nm;
    if (nu < n_units) nm = db_load(a, nu, T, work, X, P);
    db_unit L;
    // L / lp to the next unit with work and its first partition (false: none is left). The first
    // unit of a split (token, KV head) lists it for fa_merge_long_kernel.
    auto take_unit = [&]() {
        while (nu < n_units) {
            const db_unit x = db_make(a, nm, fits);
            nu += stride;
            if (nu < n_units) nm = db_load(a, nu, T, work, X, P);
            const int q = x.active ? db_next(x, -1) : -1;
            if (q < 0) continue;
            if (x.split && x.pa == x.pv0 && tid == 0) {
                int *list = a.counters + a.n_counters;
                list[2 + atomicAdd(list, 1)] = x.t * a.n_kv_heads + x.kvh;
            }
            L = x, lp = q;
            return true;
        }
        return false;
    };
    if (!take_unit()) return;
    db_unit C = L;
    int p = lp;
    int blq[FA_PT];
    fetch_blocks(L, lp, blq);
    load_q(C);
    load_part(L, lp, blq, 1, buf(0)); // (with Q's copies)
    load_part(L, lp, blq, 2, buf(1));
    auto advance = [&]() { // L / lp to the next item, its block ids fetched
        lp = lp >= 0 ? db_next(L, lp) : -1;
        if (lp < 0 && !take_unit()) lp = -1;
        fetch_blocks(L, lp, blq);
    };
    advance();
    // the loads of item c are K (the 2c-th) and V (2c + 1), into buffer (their number % 3): bk holds
    // K(c), bk + 1 (mod 3) V(c), bk + 2 K(c + 1), whose copies are already in flight; an iteration
    // commits Q(c + 1), V(c + 1), then K(c + 2), so two loads stay in flight while an item is summed
    int bk = 0;
    load_part(L, lp, blq, 1, buf(2));

    // the compute unit's rows: this thread's g and g + 8, at the token's position (padding: -1);
    // row h sees key j iff j <= vhi[h] and (j >= vlo[h] or j < vse) (the flash kernel's mask)
    int vhi[2], vlo[2], vse = 0;
    fa_warp_sight sight;
    auto rows_of = [&](const db_unit &x) {
        int ipos[2];
        for (int h = 0; h < 2; h++) {
            const int i = g + 8 * h < G ? x.pos : -1;
            ipos[h] = i;
            vhi[h] = i;
            vlo[h] = x.full ? (a.sliding_window > 0 ? i - a.sliding_window + 1 : 0) : i - a.recent + 1;
        }
        vse = x.full ? 0 : a.sink;
        sight.make(vhi, vlo, ipos[0] >= 0, ipos[1] >= 0);
    };
    rows_of(C);
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, M[2] = {-INFINITY, -INFINITY}, L2[2] = {0.0f, 0.0f};
    float o[OT][4], O[OT][4]; // the partition's sums and the unit's total, this warp's output tiles
    for (int d = 0; d < OT; d++)
        for (int e = 0; e < 4; e++) o[d][e] = O[d][e] = 0.0f;
    uint32_t qa[HD / 16][4];
    bool fresh = true; // the item is its unit's first: Q into registers

    while (p >= 0) {
        asm volatile("cp.async.wait_group 2;\n" ::); // K of p and Q landed (V of p, K of the next: in flight)
        if constexpr (F8) {
            asm volatile("" ::: "memory"); // (the shared loads after the wait)
            db_f8_rows(C, p, 1, buf(bk));
        }
        __syncthreads();
        if (fresh)
            for (int k = 0; k < HD / 16; k++) fa_ldsm_x4(qa[k], sq + (lane % 16) * LD + k * 16 + (lane / 16) * 8);
        const int tw = p * FA_PT + warp;
        if (C.r.has(tw)) {
            float sc[FA_KT / 8][4];
            fa_tile_scores<HD, true>(qa, buf(bk) + warp * FA_KT * LDS, sc, lane);
#pragma unroll
            for (int n = 0; n < FA_KT / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (e < 2 || rows8) xs[((warp * (FA_KT / 8) + n) * 4 + e) * 32] = sc[n][e];
        }
        asm volatile("cp.async.wait_group 1;\n" ::); // V of p landed (K of the next in flight)
        if constexpr (F8) {
            asm volatile("" ::: "memory");
            db_f8_rows(C, p, 2, buf(bk == 2 ? 0 : bk + 1));
        }
        __syncthreads(); // every score in the exchange; the K buffers and Q free
        const bool next_unit = lp >= 0 && L.u != C.u;
        if (next_unit) load_q(L);
        asm volatile("cp.async.commit_group;\n" ::); // (Q of the next item: its own group)
        load_part(L, lp, blq, 2, buf(bk)); // the next item's V into this item's K buffer
        // the partition's scores from the exchange, masked; its softmax; P V tile by tile
        float sp[FA_PT][FA_KT / 8][4];
        unsigned has = 0;
#pragma unroll
        for (int i = 0; i < FA_PT; i++) {
            const int tile = p * FA_PT + i;
            if (!C.r.has(tile)) continue;
            has |= 1u << i;
#pragma unroll
            for (int n = 0; n < FA_KT / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) sp[i][n][e] = e < 2 || rows8 ? xs[((i * (FA_KT / 8) + n) * 4 + e) * 32] : 0.0f;
            if (!sight.sees_all(tile * FA_KT, tile * FA_KT + FA_KT - 1, vse)) fa_tile_mask(sp[i], tile, qd, vhi, vlo, vse, rows8);
        }
        fa_part_softmax(sp, has, m, l, rows8, sl2);
#pragma unroll
        for (int i = 0; i < FA_PT; i++)
            if (has >> i & 1) fa_tile_pv<HD, OT, true>(o, buf(bk == 2 ? 0 : bk + 1) + i * FA_KT * LDS, sp[i], rows8, d0, lane);
        __syncthreads(); // every warp done with the V buffers and the exchange
        // the partition into the unit's total (the flash kernel's close, unsplit), or its state
        // into the workspace (the flash kernel's write_state: m, the row's full sum, o)
        for (int h = 0; h < 2; h++) {
            float lf = l[h] + __shfl_xor_sync(0xffffffffu, l[h], 1);
            lf += __shfl_xor_sync(0xffffffffu, lf, 2);
            if (C.split) {
                const int r = g + 8 * h;
                if (r < G) {
                    float *st = fa_state(a, C.t, p, C.kvh * G + r);
                    if (qd == 0 && warp == 0) st[0] = m[h], st[1] = lf;
                    for (int d = 0; d < OT; d++) {
                        const int col = (d0 + d) * 8 + 2 * qd;
                        st[2 + col] = o[d][2 * h], st[3 + col] = o[d][2 * h + 1];
                    }
                }
            } else {
                float ca, cb;
                if (fa_merge_begin(M[h], L2[h], m[h], lf, ca, cb))
                    for (int d = 0; d < OT; d++)
                        for (int e = 2 * h; e < 2 * h + 2; e++) O[d][e] = fa_merge_o(O[d][e], o[d][e], ca, cb);
            }
            m[h] = -INFINITY, l[h] = 0.0f;
        }
        for (int d = 0; d < OT; d++)
            for (int e = 0; e < 4; e++) o[d][e] = 0.0f;
        if (lp < 0 || next_unit) { // the unit's last partition: out = O / L (split: the merge's)
            for (int h = 0; h < 2; h++) {
                const int r = g + 8 * h;
                if (r < G && !C.split) {
                    const float inv = 1.0f / L2[h];
                    __nv_bfloat16 *orow = out + ((size_t)C.t * a.n_heads + (size_t)(C.kvh * G + r)) * HD;
                    for (int d = 0; d < OT; d++)
                        *reinterpret_cast<__nv_bfloat162 *>(orow + (d0 + d) * 8 + 2 * qd) =
                            __floats2bfloat162_rn(O[d][2 * h] * inv, O[d][2 * h + 1] * inv);
                }
                M[h] = -INFINITY, L2[h] = 0.0f;
            }
            for (int d = 0; d < OT; d++)
                for (int e = 0; e < 4; e++) O[d][e] = 0.0f;
        }
        fresh = next_unit;
        if (next_unit) {
            C = L;
            rows_of(C);
        }
        p = lp;
        if (p >= 0) advance();
        load_part(L, lp, blq, 1, buf(bk == 2 ? 0 : bk + 1)); // the item after the next: its K into this item's V buffer
        bk = bk == 0 ? 2 : bk - 1;
    }
    asm volatile("cp.async.wait_group 0;\n" ::);
}

// the blocks of fa_decode_batch_kernel<HD, *> an SM holds, the fewer of the bf16 and fp8 forms
template <int HD> static int db_resident(int *per_sm) {
    int n[2] = {0, 0};
    CUDA_CHECK(cudaFuncSetAttribute(fa_decode_batch_kernel<HD, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)db_cfg<HD>::BYTES));
    CUDA_CHECK(cudaFuncSetAttribute(fa_decode_batch_kernel<HD, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)db_cfg<HD>::BYTES));
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n[0], fa_decode_batch_kernel<HD, false>, 32 * DB_WARPS, db_cfg<HD>::BYTES));
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n[1], fa_decode_batch_kernel<HD, true>, 32 * DB_WARPS, db_cfg<HD>::BYTES));
    *per_sm = max(1, min(n[0], n[1]));
    return 0;
}

int fa_decode_batch_init(int sms, int resident[2]) {
    int n64 = 1, n128 = 1;
    if (db_resident<64>(&n64) || db_resident<128>(&n128)) return -2;
    resident[0] = n64 * sms, resident[1] = n128 * sms;
    return 0;
}

bool fa_decode_batch_takes(const struct cuda_attn_args &a) {
    return fa_mma_shape(a.head_dim, a.n_kv_heads > 0 ? a.n_heads / a.n_kv_heads : 0);
}

int fa_decode_batch(__nv_bfloat16 *out, const __nv_bfloat16 *q, const __nv_bfloat16 *kb, const __nv_bfloat16 *vb,
                    int rs, const struct cuda_attn_args &a, int n_tokens, int blocks, cudaStream_t st) {
    // (a work-sized split: every resident block, the units sized to them)
    const int units = a.unit_T ? blocks : n_tokens * a.n_kv_heads;
    const dim3 grid((unsigned)(blocks < units ? blocks : units)), T(32 * DB_WARPS);
    const bool f8 = a.kv_fp8 != 0;
    if (a.head_dim == 64)
        CUDA_CHECK(cuda_launch(f8 ? fa_decode_batch_kernel<64, true> : fa_decode_batch_kernel<64, false>, grid, T,
                               db_cfg<64>::BYTES, st, out, q, kb, vb, rs, a, n_tokens));
    else
        CUDA_CHECK(cuda_launch(f8 ? fa_decode_batch_kernel<128, true> : fa_decode_batch_kernel<128, false>, grid, T,
                               db_cfg<128>::BYTES, st, out, q, kb, vb, rs, a, n_tokens));
    return 0;
}
