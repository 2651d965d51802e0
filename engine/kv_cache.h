/* kv_cache: the two KV pools of DuoAttention.
 * - Full pool: paged blocks of block_size tokens holding K and V of every retrieval head of
 *   every layer. One block id indexes every layer's arrays ([n_blocks][block_size][R_l][hd] per
 *   layer, backend memory), so a sequence has one block table for all layers. Blocks are
 *   reference counted so n > 1 choices share their prompt's blocks (copy on write).
 * - Streaming pool: one constant-size slot per running sequence holding the first `sink` and
 *   the last `recent` tokens of every streaming head of every layer
 *   ([n_slots][sink + recent][S_l][hd] per layer; the recent part is a ring indexed by position).
 * Bookkeeping lives on the host. Engine thread only. Running out is not an error:
 * KV_STATUS_NO_SPACE tells the scheduler to preempt.
 * Tensor parallelism: each rank holds the arrays of its own KV heads (a shard, in its backend's
 * memory); block ids and slots are the same on every rank, so one set of bookkeeping serves all. */
#ifndef DUO_KV_CACHE_H
#define DUO_KV_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "engine/backend.h"

enum kv_status { KV_STATUS_OK = 0, KV_STATUS_NO_SPACE = 1, KV_STATUS_OOM = -1 };

struct kv_geometry {
    int n_layers, head_dim, block_size;
    const int *n_full;   // [n_layers] retrieval KV heads R_l
    const int *n_stream; // [n_layers] streaming KV heads S_l
    int sink, recent;    // streaming slot rows: sink + recent
};

/* One rank's arrays: its heads of every layer. */
struct kv_shard {
    struct backend *b;
    int *n_full, *n_stream;       // [n_layers] this rank's retrieval / streaming KV heads
    void **k_full, **v_full;      // [n_layers] backend arrays (NULL when the rank has no retrieval head there)
    void **k_stream, **v_stream;  // [n_layers] backend arrays (NULL when it has no streaming head there)
};

struct kv_cache {
    struct backend *b; // shards[0].b
    int n_layers, head_dim, block_size, sink, recent;
    int n_blocks, n_slots;
    int n_shards;             // tensor-parallel ranks; 1 without tensor parallelism
    struct kv_shard *shards;  // [n_shards]
    int32_t *ref;                 // [n_blocks] reference counts (0 = free)
    int32_t *free_blocks;         // stack
    int n_free_blocks;
    int32_t *free_slots;          // stack
    uint8_t *slot_used;           // [n_slots]
    int n_free_slots;
};

/* Bytes one full-pool block and one streaming slot take across all layers (K and V). */
size_t kv_cache_block_bytes(const struct kv_geometry *g, size_t elem_size);
size_t kv_cache_slot_bytes(const struct kv_geometry *g, size_t elem_size);

int kv_cache_init(struct kv_cache *kv, struct backend *b, const struct kv_geometry *g, int n_blocks, int n_slots);
/* The same over n ranks: shard r holds the heads of g[r] in backend b[r] (the geometries differ
 * only in their heads). */
int kv_cache_init_shards(struct kv_cache *kv, int n, struct backend *const *b, const struct kv_geometry *g,
                         int n_blocks, int n_slots);
void kv_cache_free(struct kv_cache *kv);

/* Pops n free blocks (ref = 1) into out; all or nothing. */
enum kv_status kv_cache_alloc(struct kv_cache *kv, int n, int32_t *out);
/* Drops one reference of each block; a block whose count reaches 0 is free again. */
void kv_cache_release(struct kv_cache *kv, const int32_t *ids, int n);
void kv_cache_ref(struct kv_cache *kv, int32_t id);
/* Copies block src's K/V of every layer (and rank) into dst. */
void kv_cache_copy_block(struct kv_cache *kv, int32_t dst, int32_t src);

enum kv_status kv_cache_alloc_slot(struct kv_cache *kv, int32_t *slot);
void kv_cache_release_slot(struct kv_cache *kv, int32_t slot);
void kv_cache_copy_slot(struct kv_cache *kv, int32_t dst, int32_t src);

/* Whether any layer (of any rank) has retrieval heads / streaming heads. */
int kv_cache_has_full(const struct kv_cache *kv);
int kv_cache_has_stream(const struct kv_cache *kv);

#endif
