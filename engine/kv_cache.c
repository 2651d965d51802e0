#include "engine/kv_cache.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

size_t kv_cache_block_bytes(int n_layers, int n_kv_heads, int head_dim, int block_size, size_t elem_size) {
    return 2 * (size_t)n_layers * block_size * n_kv_heads * head_dim * elem_size;
}

int kv_cache_init(struct kv_cache *kv, struct backend *b, int n_layers, int n_kv_heads, int head_dim,
                  int block_size, int n_blocks) {
    memset(kv, 0, sizeof *kv);
    kv->b = b;
    kv->n_layers = n_layers;
    kv->n_kv_heads = n_kv_heads;
    kv->head_dim = head_dim;
    kv->block_size = block_size;
    kv->n_blocks = n_blocks;
    kv->k = calloc((size_t)n_layers, sizeof *kv->k);
    kv->v = calloc((size_t)n_layers, sizeof *kv->v);
    kv->free_ids = malloc(sizeof *kv->free_ids * (size_t)(n_blocks ? n_blocks : 1));
    if (!kv->k || !kv->v || !kv->free_ids) {
        kv_cache_free(kv);
        return KV_STATUS_OOM;
    }
    size_t bytes = (size_t)n_blocks * block_size * n_kv_heads * head_dim * b->ops->act_size;
    for (int l = 0; l < n_layers; l++) {
        enum backend_status st1, st2;
        kv->k[l] = b->ops->alloc(b, bytes, &st1);
        kv->v[l] = b->ops->alloc(b, bytes, &st2);
        if (st1 || st2) {
            kv_cache_free(kv);
            return KV_STATUS_OOM;
        }
    }
    /* lowest ids on top of the stack, so allocation order is predictable in tests */
    for (int i = 0; i < n_blocks; i++) kv->free_ids[i] = n_blocks - 1 - i;
    kv->n_free = n_blocks;
    return KV_STATUS_OK;
}

void kv_cache_free(struct kv_cache *kv) {
    if (!kv) return;
    for (int l = 0; l < kv->n_layers; l++) {
        if (kv->k) kv->b->ops->free(kv->b, kv->k[l]);
        if (kv->v) kv->b->ops->free(kv->b, kv->v[l]);
    }
    free(kv->k);
    free(kv->v);
    free(kv->free_ids);
    memset(kv, 0, sizeof *kv);
}

enum kv_status kv_cache_alloc(struct kv_cache *kv, int n, int32_t *out) {
    if (n > kv->n_free) return KV_STATUS_NO_SPACE;
    for (int i = 0; i < n; i++) out[i] = kv->free_ids[--kv->n_free];
    return KV_STATUS_OK;
}

void kv_cache_release(struct kv_cache *kv, const int32_t *ids, int n) {
    for (int i = 0; i < n; i++) {
        assert(kv->n_free < kv->n_blocks && ids[i] >= 0 && ids[i] < kv->n_blocks);
        kv->free_ids[kv->n_free++] = ids[i];
    }
}
