/* cuda_attention: arguments of the attention kernels (device pointers), shared by
 * cuda/attention.cu and cuda/backend_cuda.cu. */
#ifndef DUO_CUDA_ATTENTION_H
#define DUO_CUDA_ATTENTION_H

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#define CUDA_ATTN_MAX_HEAD_DIM 256

/* n / d for 0 <= n < 2^31 by a multiply and a shift (d >= 1; the kernels' runtime divisors) */
struct cuda_fdiv {
    unsigned m, s;
};
static inline struct cuda_fdiv cuda_fdiv_make(int d) {
    unsigned s = 0;
    while (s < 31 && (1u << s) < (unsigned)d) s++;
    struct cuda_fdiv f = {(unsigned)((((uint64_t)1 << 32) * (((uint64_t)1 << s) - (uint64_t)d)) / (uint64_t)d + 1), s};
    return f;
}

struct cuda_attn_args {
    int n_heads, n_kv_heads, head_dim, n_full, n_stream, block_size, sink, recent, sliding_window;
    float scale;
    __nv_bfloat16 *k_full, *v_full, *k_stream, *v_stream;
    const int32_t *pos, *tok_seq, *seq_start, *block_indptr, *block_ids, *stream_slot; // batch, device
    // split decode (flash-decoding): part_off[t] = first partition-state slot of token t, [T+1]
    // (prefix sums of cuda_attn_parts(pos)); ws holds ws_floats floats of partition states
    const int32_t *part_off;
    float *ws;
    size_t ws_floats;
    // per (token, KV head) of a split step: the blocks done (the last one merges the states and
    // sets it back to 0), zero between launches; n_counters of them. NULL, or fewer than the
    // step's tokens x KV heads: fa_merge_kernel merges instead. After them (2 n_counters + 2 ints
    // in all), the long merges of a work-sized split: [n_counters] the (token, KV head) pairs
    // listed, [n_counters + 1] a count of the merging blocks done, then the pairs (t * n_kv_heads
    // + kvh); zero between launches
    int *counters;
    int n_counters;
    // set by cuda_attention only: a decode step's RoPE is fused into the decode attention kernel
    const float *rope_inv_freq;
    // and the flash kernel's divisors: block_size, the GQA group, the split (gridDim.z), recent
    struct cuda_fdiv bs_div, g_div, z_div, rec_div;
    int cluster;         // a split step's blocks of a (token, KV head) form a cluster and merge in shared memory
    // a work-sized split (decode steps of split level 4 and 5): the step's tokens (0: the grid is
    // (token, KV head, split) instead), and the units each retrieval KV head gets beyond one a token
    int unit_T, unit_X;
    // an fp8 KV cache (KV_DTYPE_FP8_E4M3): the four pools hold bytes, e4m3(x / scale) of each
    // element x of KV head h, scale k_scale[h] or v_scale[h] ([n_kv_heads] f32, device); the append
    // kernels write them, the attention kernels read them back as bf16(e4m3 * scale), and round
    // the step's own K/V rows (read from q|k|v) the same way. 0: the pools hold bf16
    int kv_fp8;
    const float *k_scale, *v_scale;
    // the step's sequences, and room for the wgmma prefill kernel's block list (attn_prefill.cu:
    // a count, then the first token of each block; n_tokens + 1 ints, device)
    int n_seqs;
    int32_t *pf_list;
};

/* Keys are summed in partitions of this many absolute positions, each from an empty softmax
 * state, the partitions' states merged in order; decode steps compute partitions in parallel.
 * Small, so a decode token's keys spread over many blocks even at a few hundred positions (one
 * busy warp walks a 32-key tile in ~2.4 us). */
#define CUDA_ATTN_PART 128

/* The partitions of a token at position pos (keys 0..pos): the split decode's states a token,
 * the prefix sums in part_off, and whether its decode splits at all (more than one). */
#ifdef __CUDACC__
__host__ __device__
#endif
static inline int cuda_attn_parts(int pos) { return pos / CUDA_ATTN_PART + 1; }

#ifdef __cplusplus
extern "C" {
#endif
/* A split decode step whose tokens each span at most 2, 4 or this many partitions runs them in
 * one thread-block cluster of that many blocks a (token, KV head), which merges the partition
 * states through distributed shared memory (no round trip through global memory); longer
 * contexts merge through the workspace. */
#define CUDA_ATTN_CLUSTER 8
/* A work-sized split merges the partition states of a token of up to this many partitions in the
 * decode kernel's last block of its (token, KV head); longer ones in a merge kernel of one warp a
 * head and 32 dims (split level 5). */
#define CUDA_ATTN_MERGE_LONG 32

/* What cuda_attention needs of its device, found by cuda_attention_init. */
struct cuda_attn_env {
    int sms;      // the device's SMs (split decode sizing)
    bool cluster; // split decode steps of short contexts may merge in a thread-block cluster
    int resident[4]; // decode kernel blocks the device holds at once, head dims 16, 32, 64, 128
    int batch_resident[2]; // the batch decode kernel's (cuda/attn_decode.cu), head dims 64, 128
    // BACKEND_CUDA_PLAIN_SPLIT (the op test): long decode steps split each (token, KV head) into
    // the same number of blocks, as when the work-sized split cannot run
    bool plain_split;
    // DUOSERVE_ATTN_WG (cuda_tuning, on by default): prefill steps at head dims 64 and 128 through the
    // wgmma kernel (cuda/attn_prefill.cu); off, through the flash kernel (the same bits, slower)
    bool wg_prefill;
};

/* With the device current, before any launch there: the attention kernels' opt-in shared memory,
 * and env. 0, or -2 on a CUDA error. */
int cuda_attention_init(struct cuda_attn_env *env);

/* decode: every sequence has one token in the step, token t of sequence t (the decode kernel: a
 * block's warps share the token); split: and some token spans more than one partition (they may
 * then run in parallel): 1, 2, 3 when every token spans at most 2, 4, 8 partitions (a cluster
 * of that many blocks, where the step splits), 4 when some token spans more, 5 when some token
 * spans more than CUDA_ATTN_MERGE_LONG (the launches are a function of n_tokens, split and the
 * layer: CUDA graphs are keyed by them); inv_freq: RoPE q and k first (in place, as cuda_rope),
 * fused with the KV append; NULL: qkv is already rotated */
int cuda_attention(const struct cuda_attn_env *env, void *out, void *qkv, int row_stride,
                   const struct cuda_attn_args *a, int n_tokens, bool decode, int split, const float *inv_freq,
                   cudaStream_t st);
/* The decode steps that ran in the batch decode kernel so far (launches or graph captures: the
 * op test's check that a case took it). */
long cuda_attention_batch_launches(void);
#ifdef __cplusplus
}
#endif

#endif
