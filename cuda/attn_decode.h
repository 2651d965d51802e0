/* attn_decode: the batch decode attention (cuda/attn_decode.cu), called by cuda_attention
 * (cuda/attention.cu) for decode steps of more (token, KV head) units than the flash kernel's
 * blocks the device holds at once. C++ (CUDA sources) only. */
#ifndef DUO_ATTN_DECODE_H
#define DUO_ATTN_DECODE_H

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cuda/cuda_attention.h"

/* With the device current: the kernel's opt-in shared memory, and the blocks of it the device
 * holds at once for head dims 64 and 128 (resident[0], [1]). 0, or -2 on a CUDA error. */
int fa_decode_batch_init(int sms, int resident[2]);
/* Whether the kernel takes these heads and pools: head dims 64 and 128, GQA groups up to 16, bf16. */
bool fa_decode_batch_takes(const struct cuda_attn_args &a);
/* A decode step's attention (token t is sequence t's only row; q|k|v rows of row_stride rs,
 * rotated, the retrieval heads' K/V of the step appended to the full pool before; a's divisors
 * set as the flash kernel's) by `blocks` resident blocks that walk the n_tokens x n_kv_heads
 * units, or with a.unit_T set (a work-sized split: a.ws, a.part_off and the long-merge list after
 * a.counters ready) runs of the units' partitions, whose split (token, KV head) pairs it lists for
 * fa_merge_long_kernel, which must run after it; each output the flash kernel's bits. 0, or -2. */
int fa_decode_batch(__nv_bfloat16 *out, const __nv_bfloat16 *q, const __nv_bfloat16 *kb, const __nv_bfloat16 *vb,
                    int rs, const struct cuda_attn_args &a, int n_tokens, int blocks, cudaStream_t st);

#endif
