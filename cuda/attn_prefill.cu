// attn_prefill: the prefill attention on Hopper's wgmma (issue 21), for head dims 64 and 128.
//
// A block takes 2 x 4 units of one sequence and one KV head (a unit: 16 query rows, the (token,
// head) pairs of TPU consecutive tokens and the G heads of the group, as the flash kernel's
// warps have them), 128 rows in all, and three warpgroups: a producer, whose 128 threads copy a
// partition's K and V rows at a time (cp.async, from the paged pool, the streaming slot or the
// step's batch rows, as the flash kernel's load_tile) into a ring of stages in the 128-byte
// swizzled layout wgmma reads, each thread's copies arriving on the stage's mbarrier; and two
// consumer warpgroups of 64 rows (4 units) each. For each partition a consumer warpgroup
// computes S = Q K^T (wgmma m64n64k16 on each half of the partition's 128 keys, the head dim in
// k16 steps in order; every wgmma of a group issued), the mask of each 32-key tile and the
// partition's softmax (the flash kernel's code on the same accumulator layout: a warp's rows
// 16w + g and + 8, columns 8n + 2q and + 1), then o = P V from registers (wgmma RS, P in bf16 as
// the flash kernel has it at these head dims, the k16 steps in key order) with V from shared memory as an MN-major
// operand, a wgmma group for each 64 head dims over the partition's four tiles.
// A closed partition's state is merged into the running total (in registers) with the flash
// kernel's roundings. Every sum is the flash kernel's, in its order, so a row's bits are those
// of the flash kernel (prefill or decode); keys a warp's rows cannot see add exactly nothing.
#include <cuda_bf16.h>
#include <limits.h>
#include <stdint.h>

#include "cuda/attn_common.cuh"
#include "cuda/attn_prefill.h"
#include "cuda/cuda_common.h"
#include "cuda/hopper.cuh"
#include "cuda/wgmma.cuh"

#define PF_WG 2                        // consumer warpgroups a block
#define PF_THREADS (128 * (PF_WG + 1)) // and the producer's
#define PF_ROWS 64                     // query rows a consumer warpgroup: 4 units

// tokens a unit (16 query rows: the G heads of each token) and a block (2 x 4 units)
__host__ __device__ __forceinline__ int pf_unit_tokens(int G) { return G >= 16 ? 1 : 16 / G; }
__host__ __device__ __forceinline__ int pf_block_tokens(int G) { return pf_unit_tokens(G) * 4 * PF_WG; }

template <int HD> struct pf_cfg {
    static constexpr int Q_BYTES = PF_ROWS * HD * 2;           // a consumer warpgroup's Q rows
    static constexpr int KV_BYTES = CUDA_ATTN_PART * HD * 2;   // a partition's K (or V) rows
    static constexpr int STAGES = HD == 64 ? 6 : 3;
    // (1024: the alignment of the swizzled tiles)
    static constexpr size_t SMEM = 1024 + (size_t)PF_WG * Q_BYTES + (size_t)STAGES * 2 * KV_BYTES + 2 * STAGES * 8 + 8;
};

// a 16-byte copy into shared memory at a 32-bit shared address (zeros when !pred)
__device__ __forceinline__ void pf_cp16(uint32_t dst, const void *gmem, bool pred) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(pred ? 16 : 0));
}
// byte offset of element (row, col) in a tile of `rows` rows of HD bf16, stored as HD / 64 blocks
// of 64 columns, each block's rows 128 bytes, their 16-byte chunks swizzled by the row (128-byte
// swizzle, the pattern wgmma's descriptors name)
__device__ __forceinline__ uint32_t pf_sw(int rows, int row, int col) {
    return (uint32_t)((col / 64) * rows * 128 + row * 128 + ((((col % 64) / 8) ^ (row & 7)) * 16) + (col % 8) * 2);
}


template <int HD, bool F8 = false> // F8: the pools are fp8 (cuda_attn_args.kv_fp8)
__global__ void __launch_bounds__(PF_THREADS, 1)
    fa_prefill_wg_kernel(__nv_bfloat16 *out, const __nv_bfloat16 *q, const __nv_bfloat16 *kb, const __nv_bfloat16 *vb,
                         int rs, struct cuda_attn_args a) {
    using C = pf_cfg<HD>;
    constexpr int ST = C::STAGES, P = CUDA_ATTN_PART;
    extern __shared__ unsigned char pf_raw[];
    const uint32_t base = (smem_u32(pf_raw) + 1023) & ~1023u;
    unsigned char *gbase = pf_raw + (base - smem_u32(pf_raw)); // generic address of base
    auto q_at = [&](int w) { return base + w * C::Q_BYTES; };
    auto k_at = [&](int s) { return base + PF_WG * C::Q_BYTES + s * C::KV_BYTES; };
    auto v_at = [&](int s) { return base + PF_WG * C::Q_BYTES + (ST + s) * C::KV_BYTES; };
    const uint32_t full0 = base + PF_WG * C::Q_BYTES + 2 * ST * C::KV_BYTES, empty0 = full0 + 8 * ST, qbar = empty0 + 8 * ST;

    const int G = a.n_heads / a.n_kv_heads, TPU = pf_unit_tokens(G), CT = pf_block_tokens(G);
    // the block's first token from the list (fa_prefill_plan_kernel), the last blocks (the
    // longest contexts) first; the grid may have a few blocks more than the list
    const int nb = a.pf_list[0], kvh = (int)blockIdx.y;
    if ((int)blockIdx.x >= nb) return;
    const int tb = a.pf_list[nb - (int)blockIdx.x];
    const int s = a.tok_seq[tb], row0 = a.seq_start[s], row_end = a.seq_start[s + 1];
    const bool full = kvh < a.n_full;
    const int pos0 = a.pos[row0], pos_last = a.pos[row_end - 1], pb_first = a.pos[tb];
    const int pb_last = pb_first + min(CT, row_end - tb) - 1;
    fa_range blk;
    blk.make(a, full, pb_first, pb_last); // the block walks these (both warpgroups' tiles)

    if (threadIdx.x == 0) {
        for (int i = 0; i < ST; i++) mbar_init(full0 + 8 * i, 128), mbar_init(empty0 + 8 * i, 4 * PF_WG);
        mbar_init(qbar, 128);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    pdl_wait();

    if (threadIdx.x < 128) { // producer: thread pt copies key row pt of each partition
        asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n");
        const int pt = threadIdx.x;
        // Q: row r of consumer warpgroup w is row r % 16 of unit 4 w + r / 16 (zeros past the unit)
        for (int i = pt; i < PF_WG * PF_ROWS * (HD / 8); i += 128) {
            const int w = i / (PF_ROWS * (HD / 8)), rem = i - w * (PF_ROWS * (HD / 8)), r = rem / (HD / 8), c = rem % (HD / 8);
            const int t0 = tb + (4 * w + r / 16) * TPU, nt = max(0, min(TPU, row_end - t0)), rr = r % 16;
            const bool ok = rr < nt * G;
            const int rt = fdiv(rr, a.g_div);
            const __nv_bfloat16 *src = ok ? q + (size_t)(t0 + rt) * rs + (size_t)(kvh * G + rr - rt * G) * HD + c * 8 : q;
            pf_cp16(q_at(w) + pf_sw(PF_ROWS, r, c * 8), src, ok);
        }
        mbar_arrive_cp_async(qbar);
        const int bbase = full ? a.block_indptr[s] : 0, sslot = full ? 0 : a.stream_slot[s];
        const float ksc = F8 ? a.k_scale[kvh] : 1.0f, vsc = F8 ? a.v_scale[kvh] : 1.0f;
        int st = 0, ph = 0;
        for (int p = blk.next_part(-1); p >= 0; p = blk.next_part(p)) {
            mbar_wait(empty0 + 8 * st, ph ^ 1);
            const int j = p * P + pt;
            { // (the flash kernel's load_tile; invisible rows zero, and the tiles outside the walk: the
              // consumers' MMAs run on every tile of a partition, P = 0 on those, and 0 x stale could be NaN)
                const __nv_bfloat16 *kp = NULL, *vp = NULL; // bf16 rows (the step's own rows with fp8)
                const __nv_bfloat16 *pk = NULL, *pv = NULL; // or a pool's, from element pe
                size_t pe = 0;
                if (!blk.has(j / FA_KT)) {
                } else if (full) {
                    if (j <= pos_last) {
                        const int bi = fdiv(j, a.bs_div);
                        pe = full_pool_row(a, a.block_ids[bbase + bi], j - bi * a.block_size, kvh) * HD;
                        pk = a.k_full, pv = a.v_full;
                    }
                } else if (j >= pos0) {
                    if (j <= pos_last) {
                        const size_t off = (size_t)(row0 + j - pos0) * rs + (size_t)kvh * HD;
                        kp = kb + off;
                        vp = vb + off;
                    }
                } else if (j < a.sink || j >= pos0 - a.recent) {
                    const int rr = stream_ring_row(a, j);
                    pe = stream_pool_row(a, sslot, rr, kvh - a.n_full) * HD;
                    pk = a.k_stream, pv = a.v_stream;
                }
                if constexpr (F8) { // (synchronous: this warpgroup only copies) K, then V, as bf16 of the bytes
                    // (4 chunks of 8 dims in flight: the producer runs on 56 registers, the consumers on 224)
#pragma unroll
                    for (int x = 0; x < 2; x++) {
                        const uint8_t *b8 = (x ? pv : pk) ? reinterpret_cast<const uint8_t *>(x ? pv : pk) + pe : NULL;
                        const __nv_bfloat16 *b16 = x ? vp : kp;
                        const float sc = x ? vsc : ksc;
                        unsigned char *dst = gbase + ((x ? v_at(st) : k_at(st)) - base);
#pragma unroll
                        for (int c0 = 0; c0 < HD / 8; c0 += 4) {
                            uint2 w[4];
#pragma unroll
                            for (int c = 0; c < 4; c++)
                                w[c] = b8    ? *reinterpret_cast<const uint2 *>(b8 + 8 * (c0 + c))
                                       : b16 ? kv8_pack8(*reinterpret_cast<const uint4 *>(b16 + 8 * (c0 + c)), sc)
                                             : make_uint2(0, 0);
#pragma unroll
                            for (int c = 0; c < 4; c++)
                                *reinterpret_cast<uint4 *>(dst + pf_sw(P, pt, 8 * (c0 + c))) =
                                    b8 || b16 ? kv8_unpack8(w[c], sc) : make_uint4(0, 0, 0, 0);
                        }
                    }
                } else { // the warp's 32 rows, HD / 8 lanes a row (lane x copies 16 bytes of the row of
                    // lane src), so that a copy instruction reads whole rows: with a row a lane it read
                    // 16 bytes of each 32-byte sector, and the L2 sent every sector twice (ncu, run 59)
                    if (pk) kp = pk + pe, vp = pv + pe;
                    constexpr int CPR = HD / 8, RPI = 32 / CPR; // lanes a row, rows an instruction
                    const int lane = pt % 32, c = (lane % CPR) * 8;
#pragma unroll
                    for (int i = 0; i < CPR; i++) {
                        const int src = i * RPI + lane / CPR, row = pt - lane + src;
                        const auto *k = reinterpret_cast<const __nv_bfloat16 *>(__shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(kp), src));
                        const auto *v = reinterpret_cast<const __nv_bfloat16 *>(__shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(vp), src));
                        pf_cp16(k_at(st) + pf_sw(P, row, c), k ? k + c : kb, k != NULL);
                        pf_cp16(v_at(st) + pf_sw(P, row, c), v ? v + c : vb, v != NULL);
                    }
                }
            }
            if constexpr (F8) { // the stores made visible to wgmma (the async proxy), then this row's arrival
                asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
                mbar_arrive(full0 + 8 * st);
            } else {
                mbar_arrive_cp_async(full0 + 8 * st);
            }
            if (++st == ST) st = 0, ph ^= 1;
        }
        asm volatile("cp.async.wait_all;\n" ::: "memory");
        return;
    }

    // consumers: warpgroup w, its warp wq computes unit 4 w + wq
    asm volatile("setmaxnreg.inc.sync.aligned.u32 224;\n");
    // (w broadcast from lane 0: a value the compiler knows is warp-uniform can live in uniform
    // registers, so the Q descriptors built from it need no R2UR before each wgmma)
    const int w = __shfl_sync(0xffffffffu, (int)threadIdx.x / 128, 0) - 1, wq = threadIdx.x / 32 % 4, lane = threadIdx.x % 32,
              g = lane / 4, qd = lane % 4;
    const int uw = 4 * w + wq, t0 = tb + uw * TPU, nt = max(0, min(TPU, row_end - t0)), nrows = nt * G;
    const int wt0 = 4 * w * TPU, wnt = max(0, min(4 * TPU, row_end - tb - wt0)); // the warpgroup's tokens
    fa_range mine;
    if (wnt > 0) mine.make(a, full, pb_first + wt0, pb_first + wt0 + wnt - 1);
    else mine.none();
    // the flash kernel's mask: row h (at ipos[h]) sees key j iff j <= vhi[h] and (j >= vlo[h] or j < vse)
    int vhi[2], vlo[2];
    const int vse = full ? 0 : a.sink;
    for (int h = 0; h < 2; h++) {
        const int r = g + 8 * h, i = r < nrows ? pb_first + uw * TPU + fdiv(r, a.g_div) : -1;
        vhi[h] = i;
        vlo[h] = full ? (a.sliding_window > 0 ? i - a.sliding_window + 1 : 0) : i - a.recent + 1;
    }
    const float sl2 = a.scale * 1.4426950408889634f; // the scale in log2 units (fa_part_softmax: 2^x)
    float m[2], l[2], M[2] = {-INFINITY, -INFINITY}, L[2] = {0.0f, 0.0f};
    // S of the partition (n8 block n: keys 8n ..) and the running total (dims 8d ..)
    float sc[P / 2], O[HD / 2];
#pragma unroll
    for (int i = 0; i < HD / 2; i++) O[i] = 0.0f;
    mbar_wait(qbar, 0);
    int st = 0, ph = 0;
    // the steps of a partition p in stage buffer sb
    // S = Q K^T of half hc (64 keys a wgmma group). Every wgmma of a group runs, whatever the tiles
    // the rows see: one issued on a branch inside a group makes ptxas serialize every wgmma (C7520)
    auto issue_s = [&](int hc, int sb) {
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++)
            wgmma_ss<64>(reinterpret_cast<float(&)[32]>(sc[32 * hc]), sw128_desc(q_at(w) + (kk / 4) * PF_ROWS * 128 + (kk % 4) * 32),
                         sw128_desc(k_at(sb) + (kk / 4) * P * 128 + hc * 64 * 128 + (kk % 4) * 32), kk > 0);
    };
    // every row counted (a padding row has vhi -1: then no key is wholly seen)
    fa_warp_sight sight;
    sight.make(vhi, vlo, true, true);
    // sc[16 i + 4 n + e]: tile i's sc[n][e] as the flash kernel has it; the mask (only where a key is
    // invisible to a row of the warp: masking a visible key changes nothing) and the softmax, on
    // every tile (one the rows cannot see is all -inf: p = 0, the same bits as a kernel that skips it)
    auto softmax = [&](int p) {
        auto &xp = *reinterpret_cast<float(*)[FA_PT][FA_KT / 8][4]>(sc);
        if (!sight.sees_all(p * P, p * P + P - 1, vse)) // (warp-uniform)
#pragma unroll
            for (int i = 0; i < FA_PT; i++) fa_tile_mask(xp[i], p * FA_PT + i, qd, vhi, vlo, vse, true);
        fa_part_softmax(xp, (1u << FA_PT) - 1, m, l, true, sl2);
    };
    auto release = [&](int sb) { // this warp is done with stage sb
        __syncwarp();
        if (lane == 0) mbar_arrive(empty0 + 8 * sb);
    };
    // P V and the merge of the closed partition into the running total (the flash kernel's
    // close_partition and its roundings), by 64 head dims at a time: o[hb] = P V of dims 64 hb ..
    // from registers (wgmma RS m64n64k16, P in bf16 (fa_p_split: no remainder at head dims 64 and
    // 128), the k16 steps in key order, V an MN-major operand), a group each, each merged as soon
    // as its group is done
    uint32_t phi[FA_PT][2][4], plo[FA_PT][2][4]; // [tile][k16 step c]
    float ca[2], cb[2];
    bool mg[2];
    auto pv_begin = [&]() { // P split, and the merge's factors (the row's sum over the quad)
#pragma unroll
        for (int t = 0; t < FA_PT; t++)
#pragma unroll
            for (int c = 0; c < 2; c++) { // n8 blocks 2c and 2c + 1 of tile t
                const float *x = sc + 16 * t + 8 * c;
                uint32_t(&h)[4] = phi[t][c], (&r)[4] = plo[t][c];
                pack_p<fa_p_split<HD>>(x[0], x[1], h[0], r[0]), pack_p<fa_p_split<HD>>(x[2], x[3], h[1], r[1]);
                pack_p<fa_p_split<HD>>(x[4], x[5], h[2], r[2]), pack_p<fa_p_split<HD>>(x[6], x[7], h[3], r[3]);
            }
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float lf = l[h] + __shfl_xor_sync(0xffffffffu, l[h], 1);
            lf += __shfl_xor_sync(0xffffffffu, lf, 2);
            mg[h] = fa_merge_begin(M[h], L[h], m[h], lf, ca[h], cb[h]);
        }
    };
    float o[HD / 64][32];
    auto pv_issue = [&](int sb) {
#pragma unroll
        for (int hb = 0; hb < HD / 64; hb++) {
#pragma unroll
            for (int i = 0; i < 32; i++) o[hb][i] = 0.0f;
            wgmma_fence();
#pragma unroll
            for (int t = 0; t < FA_PT; t++)
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    const uint64_t vd = sw128_mn_desc(v_at(sb) + hb * P * 128 + (t * FA_KT + 16 * c) * 128, P * 128);
                    wgmma_rs_mn<64>(o[hb], phi[t][c], vd, 1);
                    if constexpr (fa_p_split<HD>) wgmma_rs_mn<64>(o[hb], plo[t][c], vd, 1); // (never: HD 64, 128)
                }
            wgmma_commit();
        }
    };
    auto pv_merge = [&](int hb) {
#pragma unroll
        for (int h = 0; h < 2; h++)
            if (mg[h])
#pragma unroll
                for (int d = 0; d < 8; d++)
#pragma unroll
                    for (int e = 2 * h; e < 2 * h + 2; e++)
                        O[4 * (8 * hb + d) + e] = fa_merge_o(O[4 * (8 * hb + d) + e], o[hb][4 * d + e], ca[h], cb[h]);
    };
    auto pv_finish = [&](int sb) { // (the waits unconditional, each before its o is read)
        if constexpr (HD == 128) {
            wgmma_wait<1>();
            wgmma_hold<32>(o[0]);
            pv_merge(0);
        }
        wgmma_wait<0>();
        wgmma_hold<32>(o[HD / 64 - 1]);
        release(sb);
        pv_merge(HD / 64 - 1);
    };
    for (int p = blk.next_part(-1); p >= 0; p = blk.next_part(p)) {
        mbar_wait(full0 + 8 * st, ph);
        if (mine.has_part(p)) { // (warpgroup-uniform; each group whole inside the branch)
            wgmma_fence();
            issue_s(0, st);
            issue_s(1, st);
            wgmma_commit();
            wgmma_wait<0>();
            wgmma_hold<P / 2>(sc);
            softmax(p);
            pv_begin();
            pv_issue(st);
            pv_finish(st);
        } else {
            release(st);
        }
        if (++st == ST) st = 0, ph ^= 1;
    }
    // out = O / L
    for (int h = 0; h < 2; h++) {
        const int r = g + 8 * h;
        if (r >= nrows) continue;
        const float inv = 1.0f / L[h];
        const int rt = fdiv(r, a.g_div);
        __nv_bfloat16 *orow = out + ((size_t)(t0 + rt) * a.n_heads + (size_t)(kvh * G + r - rt * G)) * HD;
#pragma unroll
        for (int d = 0; d < HD / 8; d++)
            *reinterpret_cast<__nv_bfloat162 *>(orow + d * 8 + 2 * qd) =
                __floats2bfloat162_rn(O[4 * d + 2 * h] * inv, O[4 * d + 2 * h + 1] * inv);
    }
}

// The block list of a step (the wgmma kernel's grid): list[0] = the count, then the first token
// of each block of CT tokens, each sequence's blocks from its first token, the sequences in order.
// One block of threads: the sequences in chunks of its size, their blocks' offsets by a scan, then
// the chunk's entries written by every thread (a binary search for each entry's sequence).
__global__ void fa_prefill_plan_kernel(const int32_t *seq_start, int n_seqs, int CT, int32_t *list) {
    __shared__ int off[1025], wsum[32], done;
    const int t = threadIdx.x, lane = t % 32, wp = t / 32, nw = blockDim.x / 32;
    if (t == 0) done = 0;
    for (int s0 = 0; s0 < n_seqs; s0 += blockDim.x) {
        const int s = s0 + t;
        const int nb = s < n_seqs ? (seq_start[s + 1] - seq_start[s] + CT - 1) / CT : 0;
        int x = nb; // inclusive scan: the warp's, then the warps' sums
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, x, d);
            if (lane >= d) x += y;
        }
        if (lane == 31) wsum[wp] = x;
        __syncthreads();
        if (wp == 0) {
            int v = lane < nw ? wsum[lane] : 0;
#pragma unroll
            for (int d = 1; d < 32; d <<= 1) {
                const int y = __shfl_up_sync(0xffffffffu, v, d);
                if (lane >= d) v += y;
            }
            if (lane < nw) wsum[lane] = v;
        }
        __syncthreads();
        const int base = done;
        off[t + 1] = base + x + (wp ? wsum[wp - 1] : 0);
        if (t == 0) off[0] = base;
        __syncthreads();
        const int n = min((int)blockDim.x, n_seqs - s0), total = off[n];
        for (int i = base + t; i < total; i += blockDim.x) {
            int lo = 0, hi = n - 1; // the last sequence of the chunk whose offset is <= i
            while (lo < hi) {
                const int mid = (lo + hi + 1) / 2;
                if (off[mid] <= i) lo = mid;
                else hi = mid - 1;
            }
            list[1 + i] = seq_start[s0 + lo] + (i - off[lo]) * CT;
        }
        __syncthreads();
        if (t == 0) done = total;
        __syncthreads();
    }
    if (t == 0) list[0] = done;
}

int fa_prefill_wg_init(void) {
    CUDA_CHECK(cudaFuncSetAttribute(fa_prefill_wg_kernel<64>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)pf_cfg<64>::SMEM));
    CUDA_CHECK(cudaFuncSetAttribute(fa_prefill_wg_kernel<128>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)pf_cfg<128>::SMEM));
    CUDA_CHECK(cudaFuncSetAttribute(fa_prefill_wg_kernel<64, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)pf_cfg<64>::SMEM));
    CUDA_CHECK(cudaFuncSetAttribute(fa_prefill_wg_kernel<128, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)pf_cfg<128>::SMEM));
    return 0;
}

bool fa_prefill_wg_takes(const struct cuda_attn_args &a) {
    return fa_mma_shape(a.head_dim, a.n_kv_heads > 0 ? a.n_heads / a.n_kv_heads : 0);
}

int fa_prefill_wg_wave(int head_dim, int G, int sms, int *block_tokens) {
    if (!fa_mma_shape(head_dim, G)) return 0;
    int per_sm = 0;
    const cudaError_t e = head_dim == 64 ? cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                                               &per_sm, fa_prefill_wg_kernel<64>, PF_THREADS, pf_cfg<64>::SMEM)
                                         : cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                                               &per_sm, fa_prefill_wg_kernel<128>, PF_THREADS, pf_cfg<128>::SMEM);
    if (e != cudaSuccess) {
        cudaGetLastError(); // not a launch's error: no wave model
        return 0;
    }
    *block_tokens = pf_block_tokens(G);
    return per_sm * sms;
}

int fa_prefill_wg(__nv_bfloat16 *out, const __nv_bfloat16 *q, const __nv_bfloat16 *kb, const __nv_bfloat16 *vb, int rs,
                  const struct cuda_attn_args &a, int n_tokens, cudaStream_t st) {
    // the blocks: at most n_tokens, and at most n_tokens / CT + 1 a sequence
    const int CT = pf_block_tokens(a.n_heads / a.n_kv_heads);
    const int nb = min(n_tokens, (n_tokens + CT - 1) / CT + a.n_seqs);
    CUDA_CHECK(cuda_launch(fa_prefill_plan_kernel, dim3(1), dim3(1024), 0, st, a.seq_start, a.n_seqs, CT, a.pf_list));
    const dim3 grid(nb, a.n_kv_heads), T(PF_THREADS);
    static_assert(pf_cfg<128>::SMEM <= 232448 && pf_cfg<64>::SMEM <= 232448, "shared memory");
    const bool f8 = a.kv_fp8 != 0;
    if (a.head_dim == 64)
        CUDA_CHECK(cuda_launch(f8 ? fa_prefill_wg_kernel<64, true> : fa_prefill_wg_kernel<64>, grid, T, pf_cfg<64>::SMEM, st, out, q, kb, vb, rs, a));
    else
        CUDA_CHECK(cuda_launch(f8 ? fa_prefill_wg_kernel<128, true> : fa_prefill_wg_kernel<128>, grid, T, pf_cfg<128>::SMEM, st, out, q, kb, vb, rs, a));
    return 0;
}
