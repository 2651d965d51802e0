// attn_prefill: the prefill attention on Hopper's wgmma (issue 21), for head dims 64 and 128.
//
// A block takes 2 x 4 units of one sequence and one KV head (a unit: 16 query rows, the (token,
// head) pairs of TPU consecutive tokens and the G heads of the group, as the flash kernel's
// warps have them), 128 rows in all, and three warpgroups: a producer, whose 128 threads copy a
// partition's K and V rows at a time (cp.async, from the paged pool, the streaming slot or the
// step's batch rows, as the flash kernel's load_tile) into a ring of stages in the 128-byte
// swizzled layout wgmma reads, each thread's copies arriving on the stage's mbarrier; and two
// consumer warpgroups of 64 rows (4 units) each. For each partition a consumer warpgroup
// computes S = Q K^T (wgmma m64nNk16, the head dim in k16 steps in order; N: all 128 keys at
// head dim 64, 64 at a time at 128; a half with no visible tile skipped), then walks S's 32-key
// tiles in order: the mask and the online softmax of the flash kernel (the same code on the
// same accumulator layout: a warp's rows 16w + g and + 8, columns 8n + 2q and + 1), then P V
// from registers (wgmma RS, P as a bf16 head and its remainder, each k16 step head then
// remainder, in key order) with V from shared memory as an MN-major operand.
// A closed partition's state is merged into the running total (in registers) with the flash
// kernel's roundings. Every sum is the flash kernel's, in its order, so a row's bits are those
// of the flash kernel (prefill or decode); tiles a warp's rows cannot see add exactly nothing.
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

template <int HD> struct pf_cfg {
    static constexpr int Q_BYTES = PF_ROWS * HD * 2;           // a consumer warpgroup's Q rows
    static constexpr int KV_BYTES = CUDA_ATTN_PART * HD * 2;   // a partition's K (or V) rows
    static constexpr int STAGES = HD == 64 ? 6 : 3;
    // S is computed SN keys at a time: half a partition at head dim 128, where a whole one's S would
    // not fit in registers beside the partition's O and the running total
    static constexpr int SN = HD == 128 ? CUDA_ATTN_PART / 2 : CUDA_ATTN_PART;
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

    const int G = a.n_heads / a.n_kv_heads, TPU = G >= 16 ? 1 : 16 / G;
    const int CT = TPU * 4 * PF_WG; // tokens a block
    // the last tokens (the longest contexts) first
    const int tb = (int)(gridDim.x - 1 - blockIdx.x), kvh = (int)blockIdx.y;
    const int s = a.tok_seq[tb], row0 = a.seq_start[s], row_end = a.seq_start[s + 1];
    if ((tb - row0) % CT) return; // not the first token of a block's units
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
            if (blk.has(j / FA_KT)) { // (the flash kernel's load_tile; invisible rows zero)
                const __nv_bfloat16 *kp = NULL, *vp = NULL; // bf16 rows (the step's own rows with fp8)
                const __nv_bfloat16 *pk = NULL, *pv = NULL; // or a pool's, from element pe
                size_t pe = 0;
                if (full) {
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
                    const int rr = j < a.sink ? j : a.sink + (j - a.sink) - fdiv(j - a.sink, a.rec_div) * a.recent;
                    pe = stream_pool_row(a, sslot, rr, kvh - a.n_full) * HD;
                    pk = a.k_stream, pv = a.v_stream;
                }
                if constexpr (F8) { // (synchronous: this warpgroup only copies) K, then V, as bf16 of the bytes
                    // (4 chunks of 8 dims in flight: the producer runs on 56 registers)
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
                } else {
                    if (pk) kp = pk + pe, vp = pv + pe;
#pragma unroll
                    for (int c = 0; c < HD; c += 8) {
                        pf_cp16(k_at(st) + pf_sw(P, pt, c), kp ? kp + c : kb, kp != NULL);
                        pf_cp16(v_at(st) + pf_sw(P, pt, c), vp ? vp + c : vb, vp != NULL);
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
    const int w = threadIdx.x / 128 - 1, wq = threadIdx.x / 32 % 4, lane = threadIdx.x % 32, g = lane / 4, qd = lane % 4;
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
    const float sl2 = a.scale * 1.4426950408889634f; // scores in log2 units: exp2f
    constexpr int SN = C::SN, TS = SN / FA_KT; // S's keys a wgmma group, and its tiles
    float m[2], l[2], M[2] = {-INFINITY, -INFINITY}, L[2] = {0.0f, 0.0f};
    // S of SN keys (n8 block n: keys 8n ..), O of the partition and the running total (dims 8d ..)
    float sc[SN / 2], o[HD / 2], O[HD / 2];
#pragma unroll
    for (int i = 0; i < HD / 2; i++) O[i] = 0.0f;
    mbar_wait(qbar, 0);
    int st = 0, ph = 0;
    for (int p = blk.next_part(-1); p >= 0; p = blk.next_part(p)) {
        mbar_wait(full0 + 8 * st, ph);
        if (mine.has_part(p)) { // (warpgroup-uniform)
            for (int h = 0; h < 2; h++) m[h] = -INFINITY, l[h] = 0.0f;
#pragma unroll
            for (int i = 0; i < HD / 2; i++) o[i] = 0.0f;
#pragma unroll
            for (int hc = 0; hc < P / SN; hc++) {
                const int th = p * FA_PT + hc * TS; // the half's first tile
                if (!mine.has_tiles(th, th + TS - 1)) continue; // (warpgroup-uniform)
                wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < HD / 16; kk++)
                    wgmma_ss<SN>(sc, sw128_desc(q_at(w) + (kk / 4) * PF_ROWS * 128 + (kk % 4) * 32),
                                 sw128_desc(k_at(st) + (kk / 4) * P * 128 + hc * SN * 128 + (kk % 4) * 32), kk > 0);
                wgmma_commit();
                wgmma_wait<0>();
                wgmma_hold<SN / 2>(sc);
#pragma unroll
                for (int i = 0; i < TS; i++) {
                    const int tile = p * FA_PT + hc * TS + i;
                    if (!mine.has(tile)) continue; // (warpgroup-uniform)
                    float *x = sc + 16 * i;        // x[4 n + e]: the flash kernel's sc[n][e] of this tile
                    auto &xt = *reinterpret_cast<float(*)[FA_KT / 8][4]>(x);
                    fa_tile_mask(xt, tile, qd, vhi, vlo, vse, sl2, true);
                    float corr[2];
                    fa_tile_softmax(xt, m, l, corr, true); // o rescaled below
#pragma unroll
                    for (int d = 0; d < HD / 8; d++) o[4 * d] *= corr[0], o[4 * d + 1] *= corr[0], o[4 * d + 2] *= corr[1], o[4 * d + 3] *= corr[1];
                    // O += P V: per k16 step c, the head then the remainder of P (the flash kernel's tile_pv)
                    uint32_t ph_[2][4], pl_[2][4];
#pragma unroll
                    for (int c = 0; c < FA_KT / 16; c++) {
                        split_p(x[4 * (2 * c)], x[4 * (2 * c) + 1], ph_[c][0], pl_[c][0]);
                        split_p(x[4 * (2 * c + 1)], x[4 * (2 * c + 1) + 1], ph_[c][2], pl_[c][2]);
                        split_p(x[4 * (2 * c) + 2], x[4 * (2 * c) + 3], ph_[c][1], pl_[c][1]);
                        split_p(x[4 * (2 * c + 1) + 2], x[4 * (2 * c + 1) + 3], ph_[c][3], pl_[c][3]);
                    }
                    wgmma_fence();
#pragma unroll
                    for (int c = 0; c < FA_KT / 16; c++) {
                        const uint64_t vd = sw128_mn_desc(v_at(st) + (tile % FA_PT * FA_KT + 16 * c) * 128, P * 128);
                        wgmma_rs_mn<HD>(o, ph_[c], vd, 1);
                        wgmma_rs_mn<HD>(o, pl_[c], vd, 1);
                    }
                    wgmma_commit();
                    wgmma_wait<0>();
                    wgmma_hold<HD / 2>(o);
                }
            }
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(empty0 + 8 * st); // this warp is done with the stage
        if (mine.has_part(p)) { // the partition closed: its state into the total (the flash kernel's close_partition)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float lf = l[h] + __shfl_xor_sync(0xffffffffu, l[h], 1);
                lf += __shfl_xor_sync(0xffffffffu, lf, 2);
                float ca, cb;
                if (fa_merge_begin(M[h], L[h], m[h], lf, ca, cb))
#pragma unroll
                    for (int d = 0; d < HD / 8; d++)
#pragma unroll
                        for (int e = 2 * h; e < 2 * h + 2; e++)
                            O[4 * d + e] = fa_merge_o(O[4 * d + e], o[4 * d + e], ca, cb);
            }
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

int fa_prefill_wg_init(void) {
    CUDA_CHECK(cudaFuncSetAttribute(fa_prefill_wg_kernel<64>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)pf_cfg<64>::SMEM));
    CUDA_CHECK(cudaFuncSetAttribute(fa_prefill_wg_kernel<128>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)pf_cfg<128>::SMEM));
    CUDA_CHECK(cudaFuncSetAttribute(fa_prefill_wg_kernel<64, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)pf_cfg<64>::SMEM));
    CUDA_CHECK(cudaFuncSetAttribute(fa_prefill_wg_kernel<128, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)pf_cfg<128>::SMEM));
    return 0;
}

bool fa_prefill_wg_takes(const struct cuda_attn_args &a) {
    const int G = a.n_kv_heads > 0 ? a.n_heads / a.n_kv_heads : 0;
    return (a.head_dim == 64 || a.head_dim == 128) && G >= 1 && G <= 16;
}

int fa_prefill_wg(__nv_bfloat16 *out, const __nv_bfloat16 *q, const __nv_bfloat16 *kb, const __nv_bfloat16 *vb, int rs,
                  const struct cuda_attn_args &a, int n_tokens, cudaStream_t st) {
    const dim3 grid(n_tokens, a.n_kv_heads), T(PF_THREADS);
    static_assert(pf_cfg<128>::SMEM <= 232448 && pf_cfg<64>::SMEM <= 232448, "shared memory");
    const bool f8 = a.kv_fp8 != 0;
    if (a.head_dim == 64)
        CUDA_CHECK(cuda_launch(f8 ? fa_prefill_wg_kernel<64, true> : fa_prefill_wg_kernel<64>, grid, T, pf_cfg<64>::SMEM, st, out, q, kb, vb, rs, a));
    else
        CUDA_CHECK(cuda_launch(f8 ? fa_prefill_wg_kernel<128, true> : fa_prefill_wg_kernel<128>, grid, T, pf_cfg<128>::SMEM, st, out, q, kb, vb, rs, a));
    return 0;
}
