/* attn_prefill: the wgmma prefill attention (cuda/attn_prefill.cu), called by cuda_attention
 * (cuda/attention.cu) for the steps that are not decode steps; its waves are the CUDA backend's
 * prefill_blocks (engine/backend.h). C++ (CUDA sources) only. */
#ifndef DUO_ATTN_PREFILL_H
#define DUO_ATTN_PREFILL_H

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cuda/cuda_attention.h"

/* With the device current: the kernel's opt-in shared memory. 0, or -2 on a CUDA error. */
int fa_prefill_wg_init(void);
/* Whether the kernel takes these heads: head dims 64 and 128, GQA groups up to 16. */
bool fa_prefill_wg_takes(const struct cuda_attn_args &a);
/* With the device current: the kernel's blocks that run at once on sms SMs (a wave), and the
 * query tokens of one KV head a block takes for GQA group G (*block_tokens); 0 when it does not
 * take these heads or the occupancy query fails. */
int fa_prefill_wg_wave(int head_dim, int G, int sms, int *block_tokens);
/* The attention of a step's n_tokens rows (q|k|v rows of row_stride rs; a's divisors set as the
 * flash kernel's), the K/V of the step appended to the full pool before; 0, or -2. */
int fa_prefill_wg(__nv_bfloat16 *out, const __nv_bfloat16 *q, const __nv_bfloat16 *kb, const __nv_bfloat16 *vb, int rs,
                  const struct cuda_attn_args &a, int n_tokens, cudaStream_t st);

#endif
