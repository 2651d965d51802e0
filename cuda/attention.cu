// Attention over the two KV pools on the GPU: appending K/V to the paged full pool and to the
// streaming slots, and one kernel for prefill and decode with the same masks as the CPU
// reference (engine/backend_cpu.c): retrieval heads are causal (and windowed when the model
// says so), a streaming head's query at position i sees key j iff j <= i and
// (j < sink or i - j < recent). Keys of the current chunk are read from the batch, older ones
// from the pools, so results do not depend on chunking.
//
// Layout: one thread block per (query token, query head); its 4 warps take every 4th visible
// key, lanes split the head dimension, each warp keeps an online softmax, and the warps merge
// at the end. Lane l owns dims l, l + 32, ... (coalesced loads). K/V rows of a GQA group are read once per query head (not yet shared).
#include <cuda_bf16.h>
#include <stdint.h>

#include "cuda/cuda_attention.h"
#include "cuda/cuda_common.h"

#define ATTN_WARPS 4
#define ATTN_UNROLL 4

__device__ __forceinline__ const __nv_bfloat16 *full_row(const __nv_bfloat16 *cache, const struct cuda_attn_args &a,
                                                         int s, int p, int h) {
    int blk = a.block_ids[a.block_indptr[s] + p / a.block_size];
    size_t row = ((size_t)blk * a.block_size + (size_t)(p % a.block_size)) * a.n_full + (size_t)h;
    return cache + row * a.head_dim;
}

__device__ __forceinline__ size_t stream_off(const struct cuda_attn_args &a, int slot, int p, int h) {
    int r = p < a.sink ? p : a.sink + (p - a.sink) % a.recent;
    return (((size_t)slot * (a.sink + a.recent) + (size_t)r) * a.n_stream + (size_t)h) * a.head_dim;
}

// One visible key per call: the number of visible keys and the j of the v-th one.
struct key_range {
    int a0, a1, b0, b1; // keys [a0, a1) then [b0, b1)
    __device__ int count() const { return (a1 - a0) + (b1 - b0); }
    __device__ int key(int v) const { return v < a1 - a0 ? a0 + v : b0 + (v - (a1 - a0)); }
};

template <int PER>
__global__ void attn_kernel(__nv_bfloat16 *out, const __nv_bfloat16 *q, const __nv_bfloat16 *kb,
                            const __nv_bfloat16 *vb, int rs, struct cuda_attn_args a) {
    // lane owns dims lane, lane + 32, ... (PER of them, the last ones masked when hd < 32 * PER)
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
    // ATTN_UNROLL keys per warp iteration: their loads and shuffle reductions are independent,
    // so their latencies overlap (one key at a time left the SMs waiting on memory and shuffles)
    for (int base = warp * ATTN_UNROLL; base < n; base += ATTN_WARPS * ATTN_UNROLL) {
        float d[ATTN_UNROLL];
        const __nv_bfloat16 *vp[ATTN_UNROLL];
        for (int u = 0; u < ATTN_UNROLL; u++) {
            int vi = base + u;
            d[u] = 0.0f;
            vp[u] = NULL;
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
            } else {
                size_t off = stream_off(a, a.stream_slot[s], j, kvh - a.n_full);
                kp = a.k_stream + off;
                vp[u] = a.v_stream + off;
            }
            for (int i = 0; i < PER; i++)
                if (i * 32 + lane < HD) d[u] += qv[i] * __bfloat162float(kp[i * 32 + lane]);
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
                if (i * 32 + lane < HD) acc[i] += p * __bfloat162float(vp[u][i * 32 + lane]);
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

// Retrieval heads: this step's K/V rows into their blocks (before attention reads them).
__global__ void append_full_kernel(const __nv_bfloat16 *kb, const __nv_bfloat16 *vb, int rs, struct cuda_attn_args a) {
    int t = blockIdx.x, s = a.tok_seq[t], pos = a.pos[t];
    for (int x = threadIdx.x; x < a.n_full * a.head_dim; x += blockDim.x) {
        int h = x / a.head_dim, d = x % a.head_dim;
        size_t src = (size_t)t * rs + (size_t)h * a.head_dim + d;
        size_t dst = full_row(a.k_full, a, s, pos, h) - a.k_full + d;
        a.k_full[dst] = kb[src];
        a.v_full[dst] = vb[src];
    }
}

// Streaming heads: sink rows and the recent ring, after attention. Of a chunk longer than the
// ring only its last `recent` positions are written, so no two threads share a row.
__global__ void append_stream_kernel(const __nv_bfloat16 *kb, const __nv_bfloat16 *vb, int rs, struct cuda_attn_args a) {
    int t = blockIdx.x, s = a.tok_seq[t], pos = a.pos[t];
    int last = a.pos[a.seq_start[s + 1] - 1];
    if (pos >= a.sink && last - pos >= a.recent) return;
    for (int x = threadIdx.x; x < a.n_stream * a.head_dim; x += blockDim.x) {
        int h = x / a.head_dim, d = x % a.head_dim;
        size_t src = (size_t)t * rs + (size_t)(a.n_full + h) * a.head_dim + d;
        size_t dst = stream_off(a, a.stream_slot[s], pos, h) + d;
        a.k_stream[dst] = kb[src];
        a.v_stream[dst] = vb[src];
    }
}

extern "C" int cuda_attention(void *out, const void *qkv, int rs, const struct cuda_attn_args *a, int n_tokens,
                              cudaStream_t st) {
    const __nv_bfloat16 *q = (const __nv_bfloat16 *)qkv;
    const __nv_bfloat16 *kb = q + (size_t)a->n_heads * a->head_dim, *vb = kb + (size_t)a->n_kv_heads * a->head_dim;
    if (a->n_full) append_full_kernel<<<n_tokens, 128, 0, st>>>(kb, vb, rs, *a);
    dim3 grid(n_tokens, a->n_heads);
    __nv_bfloat16 *o = (__nv_bfloat16 *)out;
    const __nv_bfloat16 *qb = q;
    if (a->head_dim <= 32) attn_kernel<1><<<grid, 32 * ATTN_WARPS, 0, st>>>(o, qb, kb, vb, rs, *a);
    else if (a->head_dim <= 64) attn_kernel<2><<<grid, 32 * ATTN_WARPS, 0, st>>>(o, qb, kb, vb, rs, *a);
    else if (a->head_dim <= 128) attn_kernel<4><<<grid, 32 * ATTN_WARPS, 0, st>>>(o, qb, kb, vb, rs, *a);
    else if (a->head_dim <= CUDA_ATTN_MAX_HEAD_DIM) attn_kernel<8><<<grid, 32 * ATTN_WARPS, 0, st>>>(o, qb, kb, vb, rs, *a);
    else return -3; // the engine refuses such models at load
    if (a->n_stream) append_stream_kernel<<<n_tokens, 128, 0, st>>>(kb, vb, rs, *a);
    CUDA_CHECK(cudaGetLastError());
    return 0;
}
