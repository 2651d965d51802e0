/* kv_cache_impl: the KV pools' layout, for the code that reads and writes the arrays (the model's
 * forward pass, the backends' tests). The scheduler and the core use engine/kv_cache.h only. */
#ifndef DUO_KV_CACHE_IMPL_H
#define DUO_KV_CACHE_IMPL_H

#include <stdbool.h>

#include "engine/kv_cache.h"

/* One rank's arrays: its heads of every layer. */
struct kv_shard {
    struct backend *b;
    int *n_full, *n_stream;       // [n_layers] this rank's retrieval / streaming KV heads
    void **k_full, **v_full;      // [n_layers] backend arrays (NULL when the rank has no retrieval head there)
    void **k_stream, **v_stream;  // [n_layers] backend arrays (NULL when it has no streaming head there)
    float **k_scale, **v_scale;   // KV_DTYPE_FP8_E4M3: [n_layers] backend f32 [n_full + n_stream]; else NULL
    size_t es;                    // bytes of one element of the arrays
};

struct kv_cache {
    struct backend *b; // shards[0].b
    int n_layers, head_dim, block_size, sink, recent;
    int n_blocks, n_slots;
    enum kv_dtype dtype;      // the arrays' elements
    int n_shards;             // tensor-parallel ranks; 1 without tensor parallelism
    struct kv_shard *shards;  // [n_shards]
    int32_t *ref;                 // [n_blocks] reference counts (0 = free)
    int32_t *free_blocks;         // stack
    int n_free_blocks;
    int32_t *free_slots;          // stack
    uint8_t *slot_used;           // [n_slots]
    int n_free_slots;
    bool has_full;                // some layer of some rank has retrieval heads
    bool has_stream;              // some layer of some rank has streaming heads
    struct kv_prefix *pc;         // prefix caching, or NULL (kv_cache_enable_prefix_caching)
};

/* For tests: adds the blocks and slots the prefix cache's snapshots hold to holders[block] and
 * slot_holders[slot]; whether block id is registered in the prefix cache. */
void kv_cache_snapshot_holders(const struct kv_cache *kv, int *holders, int *slot_holders);
bool kv_cache_block_cached(const struct kv_cache *kv, int32_t id);

#endif
