/* cuda_attention: arguments of the attention kernels (device pointers), shared by
 * cuda/attention.cu and cuda/backend_cuda.cu. */
#ifndef DUO_CUDA_ATTENTION_H
#define DUO_CUDA_ATTENTION_H

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#define CUDA_ATTN_MAX_HEAD_DIM 256

struct cuda_attn_args {
    int n_heads, n_kv_heads, head_dim, n_full, n_stream, block_size, sink, recent, sliding_window;
    float scale;
    __nv_bfloat16 *k_full, *v_full, *k_stream, *v_stream;
    const int32_t *pos, *tok_seq, *seq_start, *block_indptr, *block_ids, *stream_slot; // batch, device
};

#ifdef __cplusplus
extern "C" {
#endif
int cuda_attention(void *out, const void *qkv, int row_stride, const struct cuda_attn_args *a, int n_tokens,
                   cudaStream_t st);
#ifdef __cplusplus
}
#endif

#endif
