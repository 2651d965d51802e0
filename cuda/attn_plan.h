/* attn_plan: which attention kernel a step runs and how its keys are split (cuda_attention's
 * choice), as a function of the step's shape and the device's figures only, so that the rules
 * that tie a split to its merge are tested without a GPU (tests/test_attn_plan.c). Plain C, no
 * CUDA: it builds (and its unit test runs) without nvcc. */
#ifndef DUO_ATTN_PLAN_H
#define DUO_ATTN_PLAN_H

#include <stdbool.h>

/* split decode (flash-decoding): blocks a (token, KV head) up to ATTN_MAX_SPLIT, aiming at
 * ATTN_SPLIT_FILL blocks an SM */
#define ATTN_MAX_SPLIT 32
#define ATTN_SPLIT_FILL 2

struct attn_plan_in {
    int n_heads, n_kv_heads, head_dim, n_full, n_stream; // the layer
    int n_tokens;
    bool decode; // every sequence one token
    int split;   // cuda_ctx.split_decode: 0, 1-3 (every token within 2, 4, 8 partitions), 4, 5
    bool has_ws, has_part_off, has_counters; // the split's workspace, partition offsets, counters
    int n_counters;                          // (token, KV head) counters there are
    int resident;    // the flash kernel's blocks the device holds at once at this head dim
    int sms;
    bool cluster;     // thread-block clusters usable
    bool plain_split; // the work-sized split off (the op test's other split)
    bool batch_takes; // fa_decode_batch_takes: the batch decode kernel takes the layer's shape
    bool wg_takes;    // the wgmma prefill kernel is on and takes the layer's shape
    bool rope;        // RoPE (and the append) asked of this call
};

enum attn_kernel {
    ATTN_K_BATCH,      // fa_decode_batch_kernel (cuda/attn_decode.cu)
    ATTN_K_WG_PREFILL, // fa_prefill_wg_kernel (cuda/attn_prefill.cu)
    ATTN_K_FLASH,      // flash_kernel (cuda/attention.cu)
    ATTN_K_CORE,       // attn_kernel, CUDA cores
};

struct attn_plan {
    enum attn_kernel kernel;
    bool work;         // a work-sized split (the flash kernel's 1-D grid of units, or the batch kernel's)
    int X;             // retrieval units a KV head beyond one a token (the flash kernel's)
    int n_work;        // the flash kernel's units (work)
    int Z;             // blocks a (token, KV head) of the plain split (1: none)
    bool clus;         // the plain split merged in a cluster
    bool counters;     // the split's counters passed to the kernel (the last block merges)
    int unit_T;        // cuda_attn_args.unit_T: the kernel splits by the work (0: it does not)
    bool rope_fused;   // RoPE and the append inside the flash kernel (else rope_append_kernel)
    bool merge_kernel; // fa_merge_kernel after the flash kernel (the plain split without counters)
    int long_merges;   // tokens whose split pairs fa_merge_long_kernel folds after the kernel (0: none)
};

#ifdef __cplusplus
extern "C" {
#endif
struct attn_plan attn_plan_make(const struct attn_plan_in *in);
#ifdef __cplusplus
}
#endif

#endif
