/* kv_cache: the full pool of paged KV blocks. One block id indexes every layer's K and V
 * arrays ([n_blocks][block_size][n_kv_heads][head_dim] per layer, backend memory), so a
 * sequence has one block table for all layers. Block bookkeeping lives on the host; only the
 * engine thread calls these. Allocation that finds no free block returns KV_STATUS_NO_SPACE
 * (not an error: the scheduler preempts). */
#ifndef DUO_KV_CACHE_H
#define DUO_KV_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "engine/backend.h"

enum kv_status { KV_STATUS_OK = 0, KV_STATUS_NO_SPACE = 1, KV_STATUS_OOM = -1 };

struct kv_cache {
    struct backend *b;
    int n_layers, n_kv_heads, head_dim, block_size, n_blocks;
    void **k, **v;      // [n_layers] backend arrays
    int32_t *free_ids;  // stack of free block ids
    int n_free;
};

/* Bytes one block takes across all layers (K and V). */
size_t kv_cache_block_bytes(int n_layers, int n_kv_heads, int head_dim, int block_size, size_t elem_size);

int kv_cache_init(struct kv_cache *kv, struct backend *b, int n_layers, int n_kv_heads, int head_dim,
                  int block_size, int n_blocks);
void kv_cache_free(struct kv_cache *kv);

/* Pops n free block ids into out; all or nothing. */
enum kv_status kv_cache_alloc(struct kv_cache *kv, int n, int32_t *out);
void kv_cache_release(struct kv_cache *kv, const int32_t *ids, int n);

#endif
