// Batch-invariant bf16 GEMM: y[t][n] = sum_k x[t][k] * w[n][k] (+ bias[n]), f32 accumulation,
// bf16 or f32 output. Shapes take different kernels by batch size (a weight stream of one warp
// per 16 weight rows at decode batch sizes, M <= 32; above, gemm_wg.cu's wgmma tiles), but
// each output element is always summed the same way: K is cut into chunks of GEMM_KC; within a
// chunk one f32 accumulator is fed by mma.m16n8k16 (or wgmma m64nNk16: the same rounding) over
// k = 0, 16, 32, ... in order (weights the A operand, tokens B); the chunk sums are added in
// order into a zero-started total; then the bias. Whether the chunks are summed in registers or
// by separate blocks (split-K, with the partials added in chunk order) is only a matter of speed. So a
// token's output does not depend on how many other tokens share the step (cuBLAS picks split-K
// and tile shapes by M, which changes the rounding), which is what keeps greedy outputs
// identical alone, batched and chunked.
//
// Weights with K % 8 == 0 live in device memory "packed" (gemm_pack below): for each 16-row x
// 16-k block, the 512 bytes a warp's A fragments hold, lane by lane, so one 16-byte load per
// lane gives a thread its mma fragment (no shared memory or ldmatrix at decode, and a strip of
// 16 rows is one contiguous stream). Rows and k are zero-padded to multiples of 16. Weights
// with other K (tiny models) stay row-major and take a plain CUDA-core kernel that is equally
// order-fixed.
#include <cuda_bf16.h>
#include <stdint.h>

#include <atomic>

#include "cuda/cuda_common.h"
#include "cuda/cuda_gemm.h"
#include "cuda/gemm_common.cuh"
#include "cuda/gemm_wg.h"
#include "cuda/rmsnorm.cuh"


__device__ __forceinline__ void mma_bf16(float *c, const uint32_t *a, const uint32_t *b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}



// One thread per 16-byte lane slot of rows [0, rows) of a row-major src (rows of K) into the
// packed dst (the slots of those rows' 16-row blocks; rows past `rows` and k past K are zeros).
__global__ void gemm_pack_kernel(__nv_bfloat16 *__restrict__ dst, const __nv_bfloat16 *__restrict__ src, int rows,
                                 int K, size_t slots) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= slots) return;
    const int KB = (K + 15) / 16, lane = (int)(i % 32), kb = (int)(i / 32 % KB), rb = (int)(i / 32 / KB);
    const int g = lane / 4, q = lane % 4;
    __align__(16) __nv_bfloat16 v[8];
#pragma unroll
    for (int e = 0; e < 8; e++) {
        int r = rb * 16 + g + ((e >> 1) & 1) * 8, k = kb * 16 + (e >> 2) * 8 + 2 * q + (e & 1);
        v[e] = r < rows && k < K ? src[(size_t)r * K + k] : __float2bfloat16(0.0f);
    }
    *reinterpret_cast<uint4 *>(dst + i * 8) = *reinterpret_cast<const uint4 *>(v);
}


// The same sums for one token (M = 1) of a 16-row strip, spread over the warp so that every
// partial is loaded in one round trip (chunks <= 32): lane r + 16h loads chunks [hH, hH + H) of
// row strip_row0 + r; lane r adds its own in order from zero and lane r + 16 goes on from that
// sum. Returns row strip_row0 + (lane / 4) in lo and row strip_row0 + 8 + lane / 4 in hi (the mma
// fragment's rows g and g + 8).
__device__ __forceinline__ void partials_in_order_row16(const float *ws, int chunks, int N, int strip_row0, int lane,
                                                        float &lo, float &hi) {
    const int r = lane & 15, h = lane >> 4, H = (chunks + 1) / 2, cb = h * H, n = strip_row0 + r;
    float p[16];
#pragma unroll
    for (int u = 0; u < 16; u++) p[u] = u < H && cb + u < chunks && n < N ? __ldcg(ws + (size_t)(cb + u) * N + n) : 0.0f;
    float v = 0.0f;
    if (h == 0)
#pragma unroll
        for (int u = 0; u < 16; u++)
            if (u < H) v += p[u];
    v = __shfl_sync(0xffffffffu, v, r);
    if (h == 1)
#pragma unroll
        for (int u = 0; u < 16; u++)
            if (u < H && cb + u < chunks) v += p[u];
    lo = __shfl_sync(0xffffffffu, v, 16 + lane / 4);
    hi = __shfl_sync(0xffffffffu, v, 24 + lane / 4);
}



// NORM weight streams (M = 1): the input row is x + y through RMSNorm (rms_row, the norm
// kernels' own code, so the bits are theirs), made by each block in shared memory; block 0
// also stores x + y to x_out for the next residual add.
#define GEMM_NORM_MAX 4096 // the longest input row (rms_row with the block's 128 threads)
struct gemm_norm_args {
    const __nv_bfloat16 *x, *y, *w;
    __nv_bfloat16 *x_out;
    float eps;
};

// The weight stream (M <= 8 * NT). A warp's work is a range [u0, u1) of units, unit u being K
// chunk u % chunks of 16-row strip u / chunks of the packed weights: by strip (!SK), warp w of
// block (b, gy) takes strip 4b + w, chunks [gy * cpg, (gy + 1) * cpg) (every chunk when the grid
// has one row); stream-K (SK), the grid's warps share the units of all strips evenly in order (a
// warp's range may end or begin mid-strip), so that every resident warp streams the same number
// of bytes (a template argument, so that the strip of a by-strip warp stays a constant). A warp holding a whole strip sums its chunks in registers; otherwise
// each chunk's sum is a partial of its own and the strip's last warp to finish adds them in
// chunk order (the same adds). The A fragments are 16-byte loads of a contiguous stream, U k
// steps at a time and the next U in flight (across unit ends too); the tokens' B fragments come
// from global (L1).
#define GEMM_STREAM_WARPS 4
#define GEMM_STREAM_U 8
template <int NT, typename OUT, bool SW, bool NORM, bool SK>
__global__ void __launch_bounds__(32 * GEMM_STREAM_WARPS, NT == 1 ? 4 : 1)
    gemm_stream_kernel(OUT *__restrict__ y, const __nv_bfloat16 *__restrict__ x, const __nv_bfloat16 *__restrict__ w,
                       const __nv_bfloat16 *__restrict__ bias, int M, int N, int K, float *__restrict__ ws,
                       int *__restrict__ counters, int cpg, struct gemm_norm_args nrm) {
    static_assert(!NORM || NT == 1, "the normalised input is one token");
    constexpr int U = GEMM_STREAM_U, CKB = GEMM_KC / 16; // k blocks a chunk
    const int lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
    const int warp_id = blockIdx.x * GEMM_STREAM_WARPS + threadIdx.x / 32;
    const int NB = (N + 15) / 16, KB = (K + 15) / 16, chunks = (K + GEMM_KC - 1) / GEMM_KC;
    int u0 = 0, u1 = 0;
    if constexpr (SK) {
        const long long W = (long long)gridDim.x * GEMM_STREAM_WARPS, units = (long long)NB * chunks;
        u0 = (int)(warp_id * units / W), u1 = (int)((warp_id + 1) * units / W);
    } else if (warp_id < NB) {
        const int c_lo = blockIdx.y * cpg, c_hi = gridDim.y > 1 ? min(chunks, c_lo + cpg) : chunks;
        u0 = warp_id * chunks + c_lo, u1 = warp_id * chunks + c_hi;
    }
    if (!NORM && u0 >= u1) return; // (NORM: every thread makes the input row first)
    __shared__ __align__(16) uint4 hs[NORM ? GEMM_NORM_MAX / 8 : 1]; // NORM: the normalised row
    const uint32_t *hs32 = reinterpret_cast<const uint32_t *>(hs);
    const uint4 *w16 = reinterpret_cast<const uint4 *>(w) + lane;
    auto strip_of = [&](int u) { return SK ? u / chunks : warp_id; };
    auto strip_w = [&](int u) { return w16 + (size_t)strip_of(u) * KB * 32; }; // + kb * 32
    const uint32_t *x32 = reinterpret_cast<const uint32_t *>(x);

    auto load_a = [&](uint4 *a, const uint4 *wp, int kb, int kb_end) {
#pragma unroll
        for (int u = 0; u < U; u++) a[u] = kb + u < kb_end ? __ldcs(wp + (size_t)(kb + u) * 32) : make_uint4(0, 0, 0, 0);
    };
    // U k steps from kb: B fragments (token j*8 + g: b0 = x[k + 2q, +1], b1 = x[k + 8 + 2q, +1]) and mma
    float total[NT][4], acc[NT][4];
    // f(n, t, v[j][e]) for each output of strip s this lane holds in v (acc or total): rows g,
    // g + 8; tokens j * 8 + 2q, +1
    auto each_out = [&](int s, float (&v)[NT][4], auto &&f) {
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int n = s * 16 + g + 8 * (e >> 1), t = j * 8 + 2 * q + (e & 1);
                if (n < N && t < M) f(n, t, v[j][e]);
            }
    };
    auto steps = [&](const uint4 *a, int kb, int kb_end) {
        uint32_t b[U][NT][2];
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int j = 0; j < NT; j++) {
                int t = j * 8 + g, k = (kb + u) * 16 + 2 * q;
                bool ok = t < M && kb + u < kb_end;
                if constexpr (NORM) {
                    b[u][j][0] = ok && k < K ? hs32[k / 2] : 0u;
                    b[u][j][1] = ok && k + 8 < K ? hs32[k / 2 + 4] : 0u;
                } else {
                    const uint32_t *xr = x32 + ((size_t)t * K + k) / 2;
                    b[u][j][0] = ok && k < K ? __ldg(xr) : 0u;
                    b[u][j][1] = ok && k + 8 < K ? __ldg(xr + 4) : 0u;
                }
            }
#pragma unroll
        for (int u = 0; u < U; u++)
            if (kb + u < kb_end) {
                uint32_t av[4] = {a[u].x, a[u].y, a[u].z, a[u].w};
#pragma unroll
                for (int j = 0; j < NT; j++) mma_bf16(acc[j], av, b[u][j]);
            }
    };
    // strip s's outputs from total
    auto store = [&](int s) {
        if constexpr (SW) { // total[j][e] is row g, total[j][2 + e] row g + 8
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    int n = s * 16 + g, t = j * 8 + 2 * q + e;
                    if (n < N && t < M) store_swiglu(y, N, n, t, total[j][e], total[j][2 + e]);
                }
        } else {
            each_out(s, total, [&](int n, int t, float &v) { store_out(y + (size_t)t * N + n, out_value(v, bias, n)); });
        }
    };

    uint4 a0[U], a1[U];
    bool a1_loaded = false;
    // one chunk (k blocks kb..kb_end of the strip at wp) summed into acc: a0 holds its first U
    // steps on entry and the next chunk's (nkb of the strip at nwp; nkb < 0: none) on exit
    auto chunk = [&](const uint4 *wp, int kb, int kb_end, const uint4 *nwp, int nkb, int nkb_end) {
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[j][e] = 0.0f;
        // steps alternate between the two buffers
        for (int st = kb; st < kb_end; st += 2 * U) {
            if (a1_loaded) a1_loaded = false; // (the first one, before the wait)
            else if (st + U < kb_end) load_a(a1, wp, st + U, kb_end);
            else if (nkb >= 0) load_a(a1, nwp, nkb, nkb_end);
            steps(a0, st, kb_end);
            if (st + U >= kb_end) { // a1 holds the next chunk's first steps (or nothing)
#pragma unroll
                for (int v = 0; v < U; v++) a0[v] = a1[v];
                break;
            }
            if (st + 2 * U < kb_end) load_a(a0, wp, st + 2 * U, kb_end);
            else if (nkb >= 0) load_a(a0, nwp, nkb, nkb_end);
            steps(a1, st + U, kb_end);
        }
    };
    // chunk c's sum (acc) as a partial of its own, whoever adds it
    auto partial = [&](int s, int c) {
        float *part = ws + (size_t)c * M * N;
        each_out(s, acc, [&](int n, int t, float &v) { part[(size_t)t * N + n] = v; });
    };
    // this warp's `held` partials of strip s are written: the strip's last warp to finish adds all
    // of them in chunk order into total (true) and stores nothing else
    auto add_partials = [&](int s, int held) {
        fence_acq_rel();
        __syncwarp();
        int last = 0;
        if (lane == 0) last = atomicAdd(&counters[s], held) == chunks - held;
        if (!__shfl_sync(0xffffffffu, last, 0)) return false;
        fence_acq_rel();
        if (NT == 1 && M == 1 && chunks <= 32) { // one token: all partials in one round trip
            partials_in_order_row16(ws, chunks, N, s * 16, lane, total[0][0], total[0][2]);
        } else { // every partial of this lane's outputs, in chunk order
            float v[NT * 4];
            partials_in_order<NT * 4, 8 / NT>(ws, chunks, M, N, [&](int o, int &n, int &t) {
                n = s * 16 + g + 8 * ((o % 4) >> 1);
                t = o / 4 * 8 + 2 * q + (o & 1);
            }, v);
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) total[j][e] = v[j * 4 + e];
        }
        if (lane == 0) counters[s] = 0;
        return true;
    };
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) total[j][e] = 0.0f;

    // weights first, the first two buffers: they do not depend on the kernel before (PDL)
    if (u0 < u1) {
        const int kb = (u0 - strip_of(u0) * chunks) * CKB, kb_end = min(KB, kb + CKB);
        load_a(a0, strip_w(u0), kb, kb_end);
        if (!NORM && kb + U < kb_end) load_a(a1, strip_w(u0), kb + U, kb_end), a1_loaded = true; // (NORM: registers)
    }
    pdl_wait();
    pdl_trigger(); // the next kernel may launch now (the decode attention: its prologue overlaps this)
    if constexpr (NORM) { // the input row, normalised (block 0 also stores x + y for the next add)
        rms_row(nrm.x, nrm.y, nrm.w, blockIdx.x == 0 && blockIdx.y == 0 ? nrm.x_out : NULL, K, nrm.eps,
                [&](int c, uint4 v) { hs[c] = v; });
        __syncthreads();
        if (u0 >= u1) return;
    }
    if constexpr (!SK) { // one strip, chunks c_lo..c_hi - 1: split (some of them) or whole
        const int s = warp_id, c_lo = u0 - s * chunks, c_hi = u1 - s * chunks;
        const bool split = c_hi - c_lo < chunks;
        const uint4 *wp = strip_w(u0);
        for (int c = c_lo; c < c_hi; c++) {
            const int kb = c * CKB, kb_end = min(KB, kb + CKB);
            const int nkb = kb_end < KB && c + 1 < c_hi ? kb_end : -1, nkb_end = min(KB, nkb + CKB);
            chunk(wp, kb, kb_end, wp, nkb, nkb_end);
            if (split) partial(s, c);
            else
#pragma unroll
                for (int j = 0; j < NT; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) total[j][e] += acc[j][e];
        }
        if (split && !add_partials(s, c_hi - c_lo)) return;
        store(s);
    } else {
        // the chunks of strip s this warp holds: [seg_lo(s), seg_hi(s)); a range holds at most
        // `chunks` units (the host sees to it), so it is a whole strip or parts of at most two
        auto seg_lo = [&](int s) { return max(u0, s * chunks); };
        auto seg_hi = [&](int s) { return min(u1, (s + 1) * chunks); };
        for (int u = u0; u < u1; u++) {
            const int s = strip_of(u), c = u - s * chunks, kb = c * CKB, kb_end = min(KB, kb + CKB);
            // the next unit's first steps, for the prefetch past this chunk's end
            const int nkb = u + 1 < u1 ? (u + 1 - strip_of(u + 1) * chunks) * CKB : -1, nkb_end = min(KB, nkb + CKB);
            chunk(strip_w(u), kb, kb_end, strip_w(u + 1), nkb, nkb_end);
            if (seg_hi(s) - seg_lo(s) < chunks) partial(s, c);
            else // (a whole strip: the range's only one)
#pragma unroll
                for (int j = 0; j < NT; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) total[j][e] += acc[j][e];
        }
        const int s_first = strip_of(u0), s_last = strip_of(u1 - 1);
        if (seg_hi(s_last) - seg_lo(s_last) == chunks) {
            store(s_last);
            return;
        }
        // the strips held in part (after the loop, when the stream's registers are free)
#pragma unroll 1
        for (int s = s_first; s <= s_last; s++)
            if (add_partials(s, seg_hi(s) - seg_lo(s))) store(s);
    }
}

// K % 8 != 0 (row-major weights): one thread per output, k in order (tiny models only).
template <typename OUT>
__global__ void gemm_plain_kernel(OUT *y, const __nv_bfloat16 *x, const __nv_bfloat16 *w, const __nv_bfloat16 *bias,
                                  int M, int N, int K) {
    pdl_trigger();
    pdl_wait();
    int n = blockIdx.x * blockDim.x + threadIdx.x, t = blockIdx.y;
    if (n >= N) return;
    const __nv_bfloat16 *xr = x + (size_t)t * K, *wr = w + (size_t)n * K;
    float total = 0.0f;
    for (int k0 = 0; k0 < K; k0 += GEMM_KC) {
        float acc = 0.0f;
        for (int k = k0; k < min(K, k0 + GEMM_KC); k++) acc = fmaf(__bfloat162float(xr[k]), __bfloat162float(wr[k]), acc);
        total += acc;
    }
    store_out(y + (size_t)t * N + n, out_value(total, bias, n));
}

// Tile shapes by batch size above the weight stream. Each sums in the same order (see the top).
#define GEMM_STREAM_M 32           // M <= 32: the weight stream (n8 token tiles: 1, 2 or 4)
// Weight streams of at least this many strips fill the GPU with one warp each: each warp sums its
// strip's chunks in registers, no partials (a speed choice only).
#define GEMM_NOSPLIT_STRIPS 1024

// Whether the chunks' partials fit the workspace (else every block sums all chunks itself).
static bool split_fits(unsigned chunks, int M, int N, unsigned tiles) {
    return chunks > 1 && tiles <= GEMM_COUNTERS && (size_t)chunks * M * N <= GEMM_WS_FLOATS;
}

// Blocks of weight-stream kernel KERN an SM holds (at least 1). Asked once a process: it depends
// on the kernel and the architecture only (every device here is sm_90), and the tensor-parallel
// ranks' threads may ask at once.
template <auto KERN> static int stream_blocks_an_sm() {
    static std::atomic<int> cached{0};
    int n = cached.load(std::memory_order_relaxed);
    if (n) return n;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, KERN, 32 * GEMM_STREAM_WARPS, 0) != cudaSuccess)
        cudaGetLastError(), n = 0; // not an error of the launch: assume one block an SM
    n = max(1, n);
    cached.store(n, std::memory_order_relaxed);
    return n;
}

// Weight streams launch programmatically: their first two weight buffers load while the kernel
// before runs (they wait before reading x or writing).
template <int NT, typename OUT, bool SW, bool NORM = false>
static int launch_stream(const struct cuda_gemm *g, OUT *y, const void *x, const void *w, const void *bias, int M,
                         int N, int K, cudaStream_t s, struct gemm_norm_args nrm = {}) {
    unsigned strips = (unsigned)((N + 15) / 16), chunks = (unsigned)((K + GEMM_KC - 1) / GEMM_KC);
    bool split = split_fits(chunks, M, N, strips) && strips < GEMM_NOSPLIT_STRIPS;
    constexpr auto kern = gemm_stream_kernel<NT, OUT, SW, NORM, false>;
    const unsigned blocks = (strips + GEMM_STREAM_WARPS - 1) / GEMM_STREAM_WARPS;
    // split: K in groups of cpg chunks, as many groups as keep the grid one wave of resident
    // blocks (a second, partial wave is a tail as long as the first)
    const unsigned wave = (unsigned)(stream_blocks_an_sm<kern>() * g->sms); // blocks one wave holds
    unsigned cpg = 1;
    if (split) {
        unsigned groups = max(1u, min(chunks, wave / blocks));
        cpg = (chunks + groups - 1) / groups;
        split = cpg < chunks;
    }
    dim3 grid(blocks, split ? (chunks + cpg - 1) / cpg : 1);
    // stream-K: a grid short of a full wave leaves SMs with fewer warps than others, and a
    // weight stream's time is that of the SM streaming the most bytes; the units of all strips
    // spread evenly over a full wave instead (a warp's range holds at most `chunks` units: the
    // kernel counts on it). Only for launches of at least stream_k_min_units units (K chunks of
    // 16-row strips): at Llama-3-8B's shapes the gate|up GEMM (14,336 units); the smaller ones
    // keep their grids: they start under PDL while the kernel before them still holds SM slots,
    // and a full-wave grid waits for those.
    const size_t units = (size_t)strips * chunks;
    if (grid.x * grid.y < wave && units >= g->stream_k_min_units && split_fits(chunks, M, N, strips)) {
        constexpr auto kern_sk = gemm_stream_kernel<NT, OUT, SW, NORM, true>;
        const size_t wave_sk = (size_t)stream_blocks_an_sm<kern_sk>() * g->sms;
        const unsigned blocks_sk = (unsigned)min(wave_sk, (units + GEMM_STREAM_WARPS - 1) / GEMM_STREAM_WARPS);
        const size_t W = (size_t)blocks_sk * GEMM_STREAM_WARPS;
        if ((units + W - 1) / W <= chunks) {
            CUDA_CHECK(cuda_launch_pdl(true, kern_sk, dim3(blocks_sk), dim3(32 * GEMM_STREAM_WARPS), 0, s, y,
                                       (const __nv_bfloat16 *)x, (const __nv_bfloat16 *)w, (const __nv_bfloat16 *)bias,
                                       M, N, K, g->ws, g->counters, 1, nrm));
            return 0;
        }
    }
    CUDA_CHECK(cuda_launch_pdl(true, kern, grid, dim3(32 * GEMM_STREAM_WARPS), 0, s, y, (const __nv_bfloat16 *)x,
                               (const __nv_bfloat16 *)w, (const __nv_bfloat16 *)bias, M, N, K, g->ws, g->counters,
                               (int)cpg, nrm));
    return 0;
}

// The kernel a shape takes: the plain kernel (row-major weights), the weight stream with 1, 2
// or 4 token tiles, or the wgmma tiles.
enum gemm_path { GEMM_PLAIN, GEMM_STREAM1, GEMM_STREAM2, GEMM_STREAM4, GEMM_WG };
static enum gemm_path gemm_path_of(int M, int N, int K) {
    if (K % 8) return GEMM_PLAIN;
    if (M <= 8) return GEMM_STREAM1;
    if (M <= 16) return GEMM_STREAM2;
    if (M <= GEMM_STREAM_M) return GEMM_STREAM4;
    return GEMM_WG;
}

// SW: the fused SwiGLU epilogue (y is [M][N / 2], N % 16 == 0, no bias; packed weights only)
template <typename OUT, bool SW = false>
static int gemm(const struct cuda_gemm *g, OUT *y, const void *x, const void *w, const void *bias, int M, int N, int K,
                cudaStream_t s) {
    if (M <= 0 || N <= 0) return 0;
    if (SW && (K % 8 || N % 16 || bias)) return -1;
    const enum gemm_path path = gemm_path_of(M, N, K);
    if (path == GEMM_PLAIN) {
        dim3 grid(cuda_blocks((size_t)N, 128), (unsigned)M);
        CUDA_CHECK(cuda_launch(gemm_plain_kernel<OUT>, grid, dim3(128), 0, s, y, (const __nv_bfloat16 *)x,
                               (const __nv_bfloat16 *)w, (const __nv_bfloat16 *)bias, M, N, K));
        return 0;
    }
    if (((uintptr_t)x | (uintptr_t)w) % 16) { // a different kernel would change the rounding
        fprintf(stderr, "duoserve: GEMM operands not 16-byte aligned (x %p, w %p)\n", x, w);
        return -1;
    }
    if (path == GEMM_STREAM1) return launch_stream<1, OUT, SW>(g, y, x, w, bias, M, N, K, s);
    if (path == GEMM_STREAM2) return launch_stream<2, OUT, SW>(g, y, x, w, bias, M, N, K, s);
    if (path == GEMM_STREAM4) return launch_stream<4, OUT, SW>(g, y, x, w, bias, M, N, K, s);
    const struct gemm_wg_env env = {g->ws, g->sms};
    if constexpr (sizeof(OUT) == 4) return gemm_wg_f32((float *)y, x, w, bias, M, N, K, &env, s);
    else return gemm_wg_bf16((__nv_bfloat16 *)y, x, w, bias, M, N, K, SW, &env, s);
}

// Row tokens[t] of a packed table (dim % 8 == 0), a block a token. Elements k, k + 1 (k even) are
// adjacent in their lane slot: one 32-bit load a pair, EMBED_AHEAD of a thread's loads issued
// before its first store (restrict: one round trip a row, not one an element).
#define EMBED_AHEAD 8
__global__ void embed_packed_kernel(__nv_bfloat16 *__restrict__ out, const __nv_bfloat16 *__restrict__ table,
                                    const int32_t *__restrict__ tokens, int dim) {
    pdl_trigger();
    pdl_wait();
    const int t = blockIdx.x, row = tokens[t], KB = (dim + 15) / 16, pairs = dim / 2;
    uint32_t *orow = reinterpret_cast<uint32_t *>(out + (size_t)t * dim);
    for (int i0 = threadIdx.x; i0 < pairs; i0 += EMBED_AHEAD * blockDim.x) {
        uint32_t v[EMBED_AHEAD];
#pragma unroll
        for (int u = 0; u < EMBED_AHEAD; u++) {
            const int i = i0 + u * blockDim.x;
            v[u] = i < pairs ? *reinterpret_cast<const uint32_t *>(table + packed_index(row, 2 * i, KB)) : 0u;
        }
#pragma unroll
        for (int u = 0; u < EMBED_AHEAD; u++)
            if (i0 + u * (int)blockDim.x < pairs) orow[i0 + u * blockDim.x] = v[u];
    }
}

extern "C" {

int cuda_gemm_init(struct cuda_gemm *g, unsigned stream_k_min_units) {
    int dev = 0;
    g->stream_k_min_units = stream_k_min_units;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&g->sms, cudaDevAttrMultiProcessorCount, dev));
    CUDA_CHECK(cudaMalloc(&g->ws, (size_t)GEMM_WS_FLOATS * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&g->counters, GEMM_COUNTERS * sizeof(int)));
    CUDA_CHECK(cudaMemset(g->counters, 0, GEMM_COUNTERS * sizeof(int)));
    return gemm_wg_init() ? -2 : 0;
}

void cuda_gemm_free(struct cuda_gemm *g) {
    cudaFree(g->ws);
    cudaFree(g->counters);
    g->ws = NULL;
    g->counters = NULL;
}

size_t cuda_gemm_weight_bytes(int64_t N, int64_t K) {
    if (K % 8) return (size_t)(N * K * 2);
    return (size_t)((N + 15) / 16) * (size_t)((K + 15) / 16) * 512;
}

int cuda_gemm_pack(void *dst, const void *src, int64_t row0, int rows, int K, cudaStream_t s) {
    if (rows <= 0) return 0;
    if (row0 % 16 || K % 8) return -1;
    size_t KB = (size_t)(K + 15) / 16, slots = (size_t)((rows + 15) / 16) * KB * 32;
    __nv_bfloat16 *d = (__nv_bfloat16 *)dst + (size_t)(row0 / 16) * KB * 256;
    CUDA_CHECK(cuda_launch(gemm_pack_kernel, dim3(cuda_blocks(slots, 256)), dim3(256), 0, s, d,
                           (const __nv_bfloat16 *)src, rows, K, slots));
    return 0;
}

int cuda_embed_packed(void *out, const void *table, const int32_t *tokens, int n, int dim, cudaStream_t s) {
    if (n == 0) return 0;
    CUDA_CHECK(cuda_launch(embed_packed_kernel, dim3(n), dim3(256), 0, s, (__nv_bfloat16 *)out,
                           (const __nv_bfloat16 *)table, tokens, dim));
    return 0;
}

int cuda_gemm_bf16(const struct cuda_gemm *g, void *y, const void *x, const void *w, const void *bias, int M, int N,
                   int K, cudaStream_t s) {
    return gemm(g, (__nv_bfloat16 *)y, x, w, bias, M, N, K, s);
}

int cuda_gemm_f32out(const struct cuda_gemm *g, float *y, const void *x, const void *w, int M, int N, int K,
                     cudaStream_t s) {
    return gemm(g, y, x, w, NULL, M, N, K, s);
}

int cuda_gemm_swiglu(const struct cuda_gemm *g, void *act, const void *x, const void *w, int M, int F, int K,
                     cudaStream_t s) {
    return gemm<__nv_bfloat16, true>(g, (__nv_bfloat16 *)act, x, w, NULL, M, 2 * F, K, s);
}

int cuda_gemm_norm_swiglu(const struct cuda_gemm *g, void *act, void *x_out, const void *x, const void *y,
                          const void *nw, float eps, const void *w, int M, int N, int K, cudaStream_t s) {
    if (M != 1 || K % 8 || K > GEMM_NORM_MAX || rms_threads(K, x, y, nw, x_out) != 32 * GEMM_STREAM_WARPS ||
        (uintptr_t)w % 16 || N % 16)
        return 1;
    struct gemm_norm_args nrm = {(const __nv_bfloat16 *)x, (const __nv_bfloat16 *)y, (const __nv_bfloat16 *)nw,
                                 (__nv_bfloat16 *)x_out, eps};
    return launch_stream<1, __nv_bfloat16, true, true>(g, (__nv_bfloat16 *)act, x, w, NULL, M, N, K, s, nrm);
}

const char *cuda_gemm_kind(int M, int N, int K) {
    switch (gemm_path_of(M, N, K)) {
    case GEMM_PLAIN: return "plain kernel";
    case GEMM_WG: return M <= 64 ? "wgmma 128x64 tiles" : M > WG_T192_MIN ? "wgmma 128x192 tiles" : "wgmma 128x64|128 tiles";
    default: return "weight stream";
    }
}

}  // extern "C"
