// Sampling on the device: the backend's sample op (engine/backend.h struct sample_row), the same
// pipeline as engine/sampler.c's sampler_run, on the f32 logits the last logits() call left in
// device memory. One block per draw:
//   1. when the draw has an allow bitset (structured output), a bias, mask or penalty list, the row
//      is copied to the draw's work row (ids outside allow as -inf) and the lists are applied there
//      (in the CPU's order, with the same f32 operations);
//   2. greedy draws take the first index of the maximum;
//   3. else x = logit / temperature; top-k finds the k-th largest x exactly with a radix search over
//      order-preserving 32-bit keys (11 + 11 + 10 bits, shared-memory histograms), after a cheap
//      lower bound (the k-th largest of the threads' maxima) has left out most of the row;
//   4. softmax: e = exp(x - max) (in double, rounded to f32 as the CPU's expf rounds it), the sum
//      in double; p = e / sum, min-p against (float)(1 / sum), the largest probability;
//   5. top-p: the same radix search, weighted by the probabilities in 2^-62 fixed point, finds the
//      largest p whose tail mass (p' >= p) reaches top_p * total (ties at the cut kept);
//   6. the draw: kept mass per chunk of 32+ ids, a scan over the chunks, then one warp scans the
//      chunk that holds u * total. Fixed-point sums make every step deterministic.
// No sort and no device allocation per call; the work rows and staging grow with the batch.
#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "engine/backend.h"
}
#include "cuda/cuda_common.h"

#define SAMP_THREADS 512
#define SAMP_WARPS (SAMP_THREADS / 32)
#define SAMP_MAX_CHUNKS 4096
#define SAMP_FX_ONE 4611686018427387904.0 // 2^62: probability 1 in fixed point

typedef unsigned long long u64;

// One draw as the kernel reads it; lists are offsets (in int32 units) into the pool that follows
// the params in the same upload.
struct samp_param {
    int32_t row, top_k, n_bias, n_mask, n_seen, pad;
    float temperature, top_p, min_p, rep, pres, freq, u;
    int64_t bias_ids, bias_vals, mask_ids, seen;
    int64_t allow; // (V + 31) / 32 words of the allow bitset, or -1: every id
};

struct samp_smem {
    union {
        u64 hist[2048];            // radix histogram: counts (top-k) or fixed-point masses (top-p)
        u64 chunk[SAMP_MAX_CHUNKS]; // kept mass of each chunk of ids (the draw)
    } u;
    u64 red_u[SAMP_WARPS];
    double red_d[SAMP_WARPS];
    float red_f[SAMP_WARPS];
    int red_i[SAMP_WARPS];
    uint32_t digit;
    u64 need;
    int owner_chunk;
    u64 owner_base;
};

__device__ __forceinline__ int lane_id() { return threadIdx.x & 31; }
__device__ __forceinline__ int warp_id() { return threadIdx.x >> 5; }

// f32 -> a 32-bit key with the same order (larger float, larger key; -0 just below +0)
__device__ __forceinline__ uint32_t float_key(float x) {
    uint32_t b = __float_as_uint(x);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float key_float(uint32_t k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// at least one unit for a kept probability: an id the CPU's draw can reach (u = 0 takes the first
// id of non-zero mass, however small) must not round away
__device__ __forceinline__ u64 prob_fx(float p) {
    const u64 m = (u64)((double)p * SAMP_FX_ONE);
    return p > 0.0f && m == 0 ? 1 : m;
}

__device__ __forceinline__ u64 warp_sum_u64(u64 v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Block-wide reductions: every thread gets the result; fixed order, so deterministic. All
// threads of the block must call them.
__device__ double block_sum_d(double v, samp_smem &sm) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads(); // red_d may still be read by a previous call
    if (lane_id() == 0) sm.red_d[warp_id()] = v;
    __syncthreads();
    double r = sm.red_d[0];
    for (int w = 1; w < SAMP_WARPS; w++) r += sm.red_d[w];
    return r;
}

__device__ u64 block_sum_u(u64 v, samp_smem &sm) {
    v = warp_sum_u64(v);
    __syncthreads();
    if (lane_id() == 0) sm.red_u[warp_id()] = v;
    __syncthreads();
    u64 r = 0;
    for (int w = 0; w < SAMP_WARPS; w++) r += sm.red_u[w];
    return r;
}

// max ignoring NaN
__device__ float block_max_f(float v, samp_smem &sm) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if (lane_id() == 0) sm.red_f[warp_id()] = v;
    __syncthreads();
    float r = sm.red_f[0];
    for (int w = 1; w < SAMP_WARPS; w++) r = fmaxf(r, sm.red_f[w]);
    return r;
}

__device__ int block_min_i(int v, samp_smem &sm) {
    for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if (lane_id() == 0) sm.red_i[warp_id()] = v;
    __syncthreads();
    int r = sm.red_i[0];
    for (int w = 1; w < SAMP_WARPS; w++) r = min(r, sm.red_i[w]);
    return r;
}

// Exclusive prefix sum of v over the threads in thread order; *total gets the sum.
__device__ u64 block_excl_scan(u64 v, samp_smem &sm, u64 *total) {
    u64 x = v;
    for (int o = 1; o < 32; o <<= 1) {
        u64 y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane_id() >= o) x += y;
    }
    __syncthreads();
    if (lane_id() == 31) sm.red_u[warp_id()] = x;
    __syncthreads();
    u64 base = 0, tot = 0;
    for (int w = 0; w < SAMP_WARPS; w++) {
        u64 t = sm.red_u[w];
        if (w < warp_id()) base += t;
        tot += t;
    }
    *total = tot;
    return base + x - v;
}

// First index of the maximum of x[V] (torch.argmax's rule, as sampler_argmax).
__device__ int block_argmax(const float *x, int V, samp_smem &sm) {
    float best = -INFINITY;
    int bi = INT_MAX;
    for (int i = threadIdx.x; i < V; i += SAMP_THREADS) argmax_take(best, bi, x[i], i);
    warp_argmax(best, bi);
    __syncthreads();
    if (lane_id() == 0) sm.red_f[warp_id()] = best, sm.red_i[warp_id()] = bi;
    __syncthreads();
    best = sm.red_f[0];
    bi = sm.red_i[0];
    for (int w = 1; w < SAMP_WARPS; w++) argmax_take(best, bi, sm.red_f[w], sm.red_i[w]);
    return bi == INT_MAX ? 0 : bi;
}

// Radix search from the top: the largest 32-bit key K such that the weight of the elements with
// keys >= K reaches need (>= 1): the need-th largest key for weights of 1, the top-p cut for
// probability masses. each(f) calls f(key, weight) for every element of this thread, the same
// ones on every call. Returns false (all threads) when the total weight is below need.
template <typename Each>
__device__ bool radix_top(Each each, u64 need, samp_smem &sm, uint32_t *key_out) {
    const int widths[3] = {11, 11, 10};
    uint32_t hi = 0;
    int shift = 32;
#pragma unroll
    for (int pass = 0; pass < 3; pass++) {
        int width = widths[pass], nbins = 1 << width, above_shift = shift;
        shift -= width;
        for (int b = threadIdx.x; b < nbins; b += SAMP_THREADS) sm.u.hist[b] = 0;
        __syncthreads();
        each([&](uint32_t key, u64 w) {
            if (pass == 0 || (key >> above_shift) == hi) atomicAdd(&sm.u.hist[(key >> shift) & (nbins - 1)], w);
        });
        __syncthreads();
        // thread t owns bins top, top-1, ..., top-per+1: an exclusive scan gives the weight above
        int per = nbins / SAMP_THREADS, top = nbins - 1 - (int)threadIdx.x * per;
        u64 mine = 0;
        for (int j = 0; j < per; j++) mine += sm.u.hist[top - j];
        u64 tot;
        u64 above = block_excl_scan(mine, sm, &tot);
        if (pass == 0 && tot < need) return false;
        if (above < need && need <= above + mine) { // exactly one thread
            u64 c = above;
            for (int j = 0; j < per; j++) {
                u64 h = sm.u.hist[top - j];
                if (c + h >= need) {
                    sm.digit = (uint32_t)(top - j);
                    sm.need = need - c;
                    break;
                }
                c += h;
            }
        }
        __syncthreads();
        hi = (hi << width) | sm.digit;
        need = sm.need;
    }
    *key_out = hi;
    return true;
}

__global__ void __launch_bounds__(SAMP_THREADS)
    sample_kernel(int32_t *ids, const float *logits, float *work, const samp_param *params,
                  const int32_t *__restrict__ pool, int V, int chunk_len, int n_chunks) {
    pdl_trigger();
    pdl_wait();
    __shared__ samp_smem sm;
    const samp_param p = params[blockIdx.x];
    const float *src = logits + (size_t)p.row * V;
    float *w = work + (size_t)blockIdx.x * V;
    const int tid = threadIdx.x;

    // 1. allow, bias, mask, penalties on a copy of the row (forks may draw from the same row)
    bool mods = p.n_bias > 0 || p.n_mask > 0 || p.n_seen > 0 || p.allow >= 0;
    const float *in = mods ? w : src;
    if (mods) {
        if (p.allow >= 0) {
            const uint32_t *allow = (const uint32_t *)(pool + p.allow);
            for (int i = tid; i < V; i += SAMP_THREADS) w[i] = (allow[i >> 5] >> (i & 31)) & 1u ? src[i] : -INFINITY;
        } else {
            for (int i = tid; i < V; i += SAMP_THREADS) w[i] = src[i];
        }
        __syncthreads();
        const int32_t *bid = pool + p.bias_ids;
        const float *bval = (const float *)(pool + p.bias_vals);
        for (int j = tid; j < p.n_bias; j += SAMP_THREADS) { // the first entry of an id adds all of its, in order
            int id = bid[j];
            bool first = id >= 0 && id < V;
            for (int k = 0; first && k < j; k++) first = bid[k] != id;
            if (!first) continue;
            float v = w[id];
            for (int k = j; k < p.n_bias; k++)
                if (bid[k] == id) v = __fadd_rn(v, bval[k]);
            w[id] = v;
        }
        __syncthreads();
        const int32_t *mid = pool + p.mask_ids;
        for (int j = tid; j < p.n_mask; j += SAMP_THREADS)
            if (mid[j] >= 0 && mid[j] < V) w[mid[j]] = -INFINITY;
        __syncthreads();
        const int32_t *seen = pool + p.seen; // (id, count, in_prompt), distinct ids
        bool rep = p.rep != 1.0f && p.rep > 0.0f, pen = p.pres != 0.0f || p.freq != 0.0f;
        for (int j = tid; j < p.n_seen; j += SAMP_THREADS) {
            int id = seen[3 * j], count = seen[3 * j + 1], in_prompt = seen[3 * j + 2];
            if (id < 0 || id >= V) continue;
            float v = w[id];
            if (rep && (in_prompt || count > 0)) v = v > 0 ? __fdiv_rn(v, p.rep) : __fmul_rn(v, p.rep);
            if (pen && count > 0) v = __fsub_rn(v, __fadd_rn(__fmul_rn(p.freq, (float)count), p.pres));
            w[id] = v;
        }
        __syncthreads();
    }

    // 2. greedy
    if (!(p.temperature >= 1e-5f)) {
        int id = block_argmax(in, V, sm);
        if (tid == 0) ids[blockIdx.x] = id;
        return;
    }

    // 3. temperature, the maximum, top-k
    const float T = p.temperature;
    bool topk = p.top_k > 0 && p.top_k < V;
    float mx = -INFINITY;
    uint32_t tmax = 0; // this thread's largest key (0: none; no float maps to 0 but one NaN)
    for (int i = tid; i < V; i += SAMP_THREADS) {
        float x = __fdiv_rn(in[i], T);
        mx = fmaxf(mx, x);
        if (!isnan(x)) tmax = max(tmax, float_key(x));
    }
    mx = block_max_f(mx, sm);
    float kth = -INFINITY;
    if (topk) {
        // the k-th largest of the threads' maxima bounds the k-th largest of the row from below
        uint32_t lb = 0, kkey;
        if (p.top_k <= min(V, SAMP_THREADS)) {
            auto each_max = [&](auto f) {
                if (tmax) f(tmax, 1ull);
            };
            if (!radix_top(each_max, (u64)p.top_k, sm, &lb)) lb = 0;
        }
        auto each_x = [&](auto f) {
            for (int i = tid; i < V; i += SAMP_THREADS) {
                float x = __fdiv_rn(in[i], T);
                uint32_t k = float_key(x);
                if (!isnan(x) && k >= lb) f(k, 1ull);
            }
        };
        if (radix_top(each_x, (u64)p.top_k, sm, &kkey)) kth = key_float(kkey);
    }

    // 4. softmax (e into the work row), min-p (p into the work row)
    double sum = 0.0;
    int fb = INT_MAX; // the argmax after top-k: the CPU's answer when the sum is not usable
    for (int i = tid; i < V; i += SAMP_THREADS) {
        float x = __fdiv_rn(in[i], T);
        bool drop = x < kth || x == -INFINITY;
        float e = drop ? 0.0f : (float)exp((double)__fsub_rn(x, mx));
        if ((drop ? -INFINITY : x) == mx && i < fb) fb = i;
        w[i] = e;
        sum += (double)e;
    }
    sum = block_sum_d(sum, sm);
    fb = block_min_i(fb, sm);
    if (fb == INT_MAX) fb = 0;
    if (!(sum > 0.0) || !isfinite(sum)) {
        if (tid == 0) ids[blockIdx.x] = fb;
        return;
    }
    const float pmax = (float)(1.0 / sum); // e = 1 at the maximum
    const float min_keep = p.min_p > 0.0f ? __fmul_rn(p.min_p, pmax) : 0.0f;
    u64 tot = 0;
    for (int i = tid; i < V; i += SAMP_THREADS) {
        float q = (float)((double)w[i] / sum);
        if (q < min_keep) q = 0.0f;
        w[i] = q;
        tot += prob_fx(q);
    }
    tot = block_sum_u(tot, sm);

    // 5. top-p: probabilities below eps cannot reach the cut (their mass is under half of
    // (1 - top_p) * total), so they stay out of the histograms
    float cut = 0.0f;
    if (p.top_p < 1.0f && tot > 0) {
        double t = ceil((double)p.top_p * (double)tot);
        u64 need = t < 1.0 ? 1 : (t >= (double)tot ? tot : (u64)t);
        float eps = (float)(0.5 * (1.0 - (double)p.top_p) * (double)pmax / (double)V);
        auto each_p = [&](auto f) {
            for (int i = tid; i < V; i += SAMP_THREADS) {
                float q = w[i];
                if (q > 0.0f && q >= eps) f(__float_as_uint(q), prob_fx(q));
            }
        };
        uint32_t ckey;
        if (radix_top(each_p, need, sm, &ckey)) cut = __uint_as_float(ckey);
    }

    // 6. the draw: kept mass per chunk (a warp's 32 ids lie in one chunk), the chunk that holds
    // r = u * total, then the id inside it
    for (int c = tid; c < n_chunks; c += SAMP_THREADS) sm.u.chunk[c] = 0;
    __syncthreads();
    for (int base = 0; base < V; base += SAMP_THREADS) {
        int i = base + tid;
        float q = i < V ? w[i] : 0.0f;
        u64 m = q > 0.0f && q >= cut ? prob_fx(q) : 0;
        if (__any_sync(0xffffffffu, m != 0)) {
            m = warp_sum_u64(m);
            if (lane_id() == 0 && m) atomicAdd(&sm.u.chunk[(base + warp_id() * 32) / chunk_len], m);
        }
    }
    __syncthreads();
    int per = (n_chunks + SAMP_THREADS - 1) / SAMP_THREADS, c0 = tid * per, c1 = min(c0 + per, n_chunks);
    u64 mine = 0;
    for (int c = c0; c < c1; c++) mine += sm.u.chunk[c];
    u64 total;
    u64 base = block_excl_scan(mine, sm, &total);
    if (total == 0) { // not reached: the maximum always stays
        if (tid == 0) ids[blockIdx.x] = fb;
        return;
    }
    double rd = (double)p.u * (double)total; // the CPU's u * tot
    u64 r = rd > 0.0 ? (u64)rd : 0;
    if (r >= total) r = total - 1;
    if (tid == 0) sm.owner_chunk = -1;
    __syncthreads();
    if (base <= r && r < base + mine) {
        u64 acc = base;
        for (int c = c0; c < c1; c++) {
            if (r < acc + sm.u.chunk[c]) {
                sm.owner_chunk = c;
                sm.owner_base = acc;
                break;
            }
            acc += sm.u.chunk[c];
        }
    }
    __syncthreads();
    if (warp_id() != 0) return;
    int c = sm.owner_chunk, id = fb;
    if (c >= 0) {
        u64 acc = sm.owner_base;
        int end = min((c + 1) * chunk_len, V);
        for (int off = c * chunk_len; off < end; off += 32) {
            int i = off + lane_id();
            float q = i < end ? w[i] : 0.0f;
            u64 m = q > 0.0f && q >= cut ? prob_fx(q) : 0, incl = m;
            for (int o = 1; o < 32; o <<= 1) {
                u64 y = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane_id() >= o) incl += y;
            }
            unsigned hit = __ballot_sync(0xffffffffu, r < acc + incl);
            if (hit) {
                id = off + __ffs(hit) - 1;
                break;
            }
            acc += __shfl_sync(0xffffffffu, incl, 31);
        }
    }
    if (lane_id() == 0) ids[blockIdx.x] = id;
}

// The op's state: the work rows and one staging area (params, then the lists) in pinned and in
// device memory. Grows with the batch; nothing is allocated while it fits.
struct cuda_sampler {
    float *d_work; // [work_rows][vocab]
    size_t work_rows;
    int vocab;
    char *h_stage, *d_stage;
    size_t stage_cap;
    int32_t *d_ids, *h_ids;
    int ids_cap;
};

static int sampler_reserve(struct cuda_sampler *sp, int n, int vocab, size_t stage_bytes) {
    if ((size_t)n > sp->work_rows || vocab != sp->vocab) {
        size_t rows = sp->work_rows ? sp->work_rows : 64;
        while (rows < (size_t)n) rows *= 2;
        CUDA_CHECK(cudaFree(sp->d_work));
        sp->d_work = NULL;
        sp->work_rows = 0;
        if (cudaMalloc(&sp->d_work, rows * vocab * sizeof(float)) != cudaSuccess) {
            cudaGetLastError();
            return BACKEND_ERR_OOM;
        }
        sp->work_rows = rows;
        sp->vocab = vocab;
    }
    if (stage_bytes > sp->stage_cap) {
        size_t cap = sp->stage_cap ? sp->stage_cap : (size_t)1 << 20;
        while (cap < stage_bytes) cap *= 2;
        CUDA_CHECK(cudaFreeHost(sp->h_stage));
        CUDA_CHECK(cudaFree(sp->d_stage));
        sp->h_stage = sp->d_stage = NULL;
        sp->stage_cap = 0;
        if (cudaMallocHost(&sp->h_stage, cap) != cudaSuccess || cudaMalloc(&sp->d_stage, cap) != cudaSuccess) {
            cudaGetLastError();
            return BACKEND_ERR_OOM;
        }
        sp->stage_cap = cap;
    }
    if (n > sp->ids_cap) {
        int cap = n > 256 ? n : 256;
        CUDA_CHECK(cudaFree(sp->d_ids));
        CUDA_CHECK(cudaFreeHost(sp->h_ids));
        sp->d_ids = sp->h_ids = NULL;
        sp->ids_cap = 0;
        if (cudaMalloc(&sp->d_ids, cap * sizeof(int32_t)) != cudaSuccess ||
            cudaMallocHost(&sp->h_ids, cap * sizeof(int32_t)) != cudaSuccess) {
            cudaGetLastError();
            return BACKEND_ERR_OOM;
        }
        sp->ids_cap = cap;
    }
    return 0;
}

extern "C" {

// Launcher on raw device pointers: n draws of params (lists in pool) from logits[][V] into ids.
int cuda_sample_rows(int32_t *ids, const float *logits, float *work, const samp_param *params, const int32_t *pool,
                     int n, int V, cudaStream_t s) {
    if (n == 0) return 0;
    int chunk_len = 32 * ((V + 32 * SAMP_MAX_CHUNKS - 1) / (32 * SAMP_MAX_CHUNKS));
    int n_chunks = (V + chunk_len - 1) / chunk_len;
    CUDA_CHECK(cuda_launch(sample_kernel, dim3(n), dim3(SAMP_THREADS), 0, s, ids, logits, work, params, pool, V,
                           chunk_len, n_chunks));
    return 0;
}

// The public entry: checks the draws, stages their params and lists in one upload, samples, and
// returns once host_ids holds the ids. logits holds n_rows rows of vocab. Returns a backend_status.
int cuda_sample(struct cuda_sampler **state, int32_t *host_ids, const struct sample_row *rows, int n,
                const float *logits, int n_rows, int vocab, cudaStream_t s) {
    if (n < 0 || vocab < 1 || !logits) return BACKEND_ERR_ARG;
    if (n == 0) return BACKEND_OK;
    size_t n_pool = 0, words = ((size_t)vocab + 31) / 32; // int32s; words of an allow bitset
    for (int i = 0; i < n; i++) {
        const struct sample_row *r = &rows[i];
        if (r->row < 0 || r->row >= n_rows || r->n_bias < 0 || r->n_mask < 0 || r->n_seen < 0) return BACKEND_ERR_ARG;
        n_pool += 2 * (size_t)r->n_bias + (size_t)r->n_mask + 3 * (size_t)r->n_seen + (r->allow ? words : 0);
    }
    if (!*state && !(*state = (struct cuda_sampler *)calloc(1, sizeof **state))) return BACKEND_ERR_OOM;
    struct cuda_sampler *sp = *state;
    size_t head = (size_t)n * sizeof(samp_param);
    int rc = sampler_reserve(sp, n, vocab, head + n_pool * sizeof(int32_t));
    if (rc) return rc;
    samp_param *hp = (samp_param *)sp->h_stage;
    int32_t *pool = (int32_t *)(sp->h_stage + head);
    int64_t off = 0;
    for (int i = 0; i < n; i++) {
        const struct sample_row *r = &rows[i];
        samp_param *q = &hp[i];
        memset(q, 0, sizeof *q);
        q->row = r->row;
        q->top_k = r->top_k;
        q->n_bias = r->n_bias;
        q->n_mask = r->n_mask;
        q->n_seen = r->n_seen;
        q->temperature = r->temperature;
        q->top_p = r->top_p;
        q->min_p = r->min_p;
        q->rep = r->repetition_penalty;
        q->pres = r->presence_penalty;
        q->freq = r->frequency_penalty;
        q->u = r->u;
        q->bias_ids = off;
        if (r->n_bias) memcpy(pool + off, r->bias_ids, sizeof(int32_t) * r->n_bias);
        off += r->n_bias;
        q->bias_vals = off;
        if (r->n_bias) memcpy(pool + off, r->bias_vals, sizeof(float) * r->n_bias);
        off += r->n_bias;
        q->mask_ids = off;
        if (r->n_mask) memcpy(pool + off, r->mask_ids, sizeof(int32_t) * r->n_mask);
        off += r->n_mask;
        q->seen = off;
        for (int j = 0; j < r->n_seen; j++) {
            pool[off++] = r->seen[j].id;
            pool[off++] = r->seen[j].count;
            pool[off++] = r->seen[j].in_prompt;
        }
        q->allow = r->allow ? off : -1;
        if (r->allow) memcpy(pool + off, r->allow, sizeof(uint32_t) * words);
        off += r->allow ? (int64_t)words : 0;
    }
    CUDA_CHECK(cudaMemcpyAsync(sp->d_stage, sp->h_stage, head + n_pool * sizeof(int32_t), cudaMemcpyHostToDevice, s));
    if (cuda_sample_rows(sp->d_ids, logits, sp->d_work, (const samp_param *)sp->d_stage,
                         (const int32_t *)(sp->d_stage + head), n, vocab, s))
        return BACKEND_ERR_DEVICE;
    CUDA_CHECK(cudaMemcpyAsync(sp->h_ids, sp->d_ids, (size_t)n * sizeof(int32_t), cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    memcpy(host_ids, sp->h_ids, (size_t)n * sizeof(int32_t));
    return BACKEND_OK;
}

void cuda_sampler_free(struct cuda_sampler *sp) {
    if (!sp) return;
    cudaFree(sp->d_work);
    cudaFree(sp->d_stage);
    cudaFreeHost(sp->h_stage);
    cudaFree(sp->d_ids);
    cudaFreeHost(sp->h_ids);
    free(sp);
}
}
