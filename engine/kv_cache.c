#include "engine/kv_cache.h"

#include <assert.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static size_t sum_heads(const int *h, int n) {
    size_t s = 0;
    for (int i = 0; i < n; i++) s += (size_t)h[i];
    return s;
}

size_t kv_cache_block_bytes(const struct kv_geometry *g, size_t es) {
    return 2 * sum_heads(g->n_full, g->n_layers) * (size_t)g->block_size * g->head_dim * es;
}

size_t kv_cache_slot_bytes(const struct kv_geometry *g, size_t es) {
    return 2 * sum_heads(g->n_stream, g->n_layers) * (size_t)(g->sink + g->recent) * g->head_dim * es;
}

int kv_cache_init(struct kv_cache *kv, struct backend *b, const struct kv_geometry *g, int n_blocks, int n_slots) {
    return kv_cache_init_shards(kv, 1, &b, g, n_blocks, n_slots);
}

/* Rank shard's arrays for n_blocks blocks and n_slots slots. */
static int shard_init(struct kv_shard *sh, struct backend *b, const struct kv_geometry *g, int n_blocks, int n_slots) {
    int L = g->n_layers;
    sh->b = b;
    sh->n_full = malloc(sizeof(int) * L);
    sh->n_stream = malloc(sizeof(int) * L);
    sh->k_full = calloc(L, sizeof(void *));
    sh->v_full = calloc(L, sizeof(void *));
    sh->k_stream = calloc(L, sizeof(void *));
    sh->v_stream = calloc(L, sizeof(void *));
    if (!sh->n_full || !sh->n_stream || !sh->k_full || !sh->v_full || !sh->k_stream || !sh->v_stream) return -1;
    memcpy(sh->n_full, g->n_full, sizeof(int) * L);
    memcpy(sh->n_stream, g->n_stream, sizeof(int) * L);
    size_t es = b->ops->act_size;
    for (int l = 0; l < L; l++) {
        size_t fb = (size_t)n_blocks * g->block_size * g->n_full[l] * g->head_dim * es;
        size_t sb = (size_t)n_slots * (g->sink + g->recent) * g->n_stream[l] * g->head_dim * es;
        enum backend_status s[4] = {0};
        if (fb) {
            sh->k_full[l] = b->ops->alloc(b, fb, &s[0]);
            sh->v_full[l] = b->ops->alloc(b, fb, &s[1]);
        }
        if (sb) {
            sh->k_stream[l] = b->ops->alloc(b, sb, &s[2]);
            sh->v_stream[l] = b->ops->alloc(b, sb, &s[3]);
        }
        if (s[0] || s[1] || s[2] || s[3]) return -1;
    }
    return 0;
}

static void shard_free(struct kv_shard *sh, int n_layers) {
    void **arrs[4] = {sh->k_full, sh->v_full, sh->k_stream, sh->v_stream};
    for (int i = 0; i < 4; i++)
        for (int l = 0; arrs[i] && l < n_layers; l++) sh->b->ops->free(sh->b, arrs[i][l]);
    for (int i = 0; i < 4; i++) free(arrs[i]);
    free(sh->n_full);
    free(sh->n_stream);
}

int kv_cache_init_shards(struct kv_cache *kv, int n, struct backend *const *b, const struct kv_geometry *g,
                         int n_blocks, int n_slots) {
    memset(kv, 0, sizeof *kv);
    kv->b = b[0];
    kv->n_layers = g[0].n_layers;
    kv->head_dim = g[0].head_dim;
    kv->block_size = g[0].block_size;
    kv->sink = g[0].sink;
    kv->recent = g[0].recent;
    kv->n_blocks = n_blocks;
    kv->n_slots = n_slots;
    kv->n_shards = n;
    kv->shards = calloc((size_t)n, sizeof *kv->shards);
    kv->ref = calloc((size_t)n_blocks + 1, sizeof(int32_t));
    kv->free_blocks = malloc(sizeof(int32_t) * ((size_t)n_blocks + 1));
    kv->free_slots = malloc(sizeof(int32_t) * ((size_t)n_slots + 1));
    kv->slot_used = calloc((size_t)n_slots + 1, 1);
    bool ok = kv->shards && kv->ref && kv->free_blocks && kv->free_slots && kv->slot_used;
    for (int r = 0; ok && r < n; r++) ok = shard_init(&kv->shards[r], b[r], &g[r], n_blocks, n_slots) == 0;
    if (!ok) {
        kv_cache_free(kv);
        return KV_STATUS_OOM;
    }
    /* lowest ids on top of the stacks, so allocation order is predictable */
    for (int i = 0; i < n_blocks; i++) kv->free_blocks[i] = n_blocks - 1 - i;
    kv->n_free_blocks = n_blocks;
    for (int i = 0; i < n_slots; i++) kv->free_slots[i] = n_slots - 1 - i;
    kv->n_free_slots = n_slots;
    return KV_STATUS_OK;
}

void kv_cache_free(struct kv_cache *kv) {
    if (!kv || !kv->b) return;
    for (int r = 0; kv->shards && r < kv->n_shards; r++)
        if (kv->shards[r].b) shard_free(&kv->shards[r], kv->n_layers);
    free(kv->shards);
    free(kv->ref);
    free(kv->free_blocks);
    free(kv->free_slots);
    free(kv->slot_used);
    memset(kv, 0, sizeof *kv);
}

enum kv_status kv_cache_alloc(struct kv_cache *kv, int n, int32_t *out) {
    if (n > kv->n_free_blocks) return KV_STATUS_NO_SPACE;
    for (int i = 0; i < n; i++) {
        int32_t id = kv->free_blocks[--kv->n_free_blocks];
        assert(kv->ref[id] == 0);
        kv->ref[id] = 1;
        out[i] = id;
    }
    return KV_STATUS_OK;
}

void kv_cache_ref(struct kv_cache *kv, int32_t id) {
    assert(id >= 0 && id < kv->n_blocks && kv->ref[id] > 0);
    kv->ref[id]++;
}

void kv_cache_release(struct kv_cache *kv, const int32_t *ids, int n) {
    for (int i = 0; i < n; i++) {
        int32_t id = ids[i];
        assert(id >= 0 && id < kv->n_blocks && kv->ref[id] > 0);
        if (--kv->ref[id] == 0) kv->free_blocks[kv->n_free_blocks++] = id;
    }
}

void kv_cache_copy_block(struct kv_cache *kv, int32_t dst, int32_t src) {
    for (int r = 0; r < kv->n_shards; r++) {
        const struct kv_shard *sh = &kv->shards[r];
        size_t es = sh->b->ops->act_size;
        for (int l = 0; l < kv->n_layers; l++) {
            size_t row = (size_t)kv->block_size * sh->n_full[l] * kv->head_dim * es;
            if (!row) continue;
            sh->b->ops->copy(sh->b, (char *)sh->k_full[l] + dst * row, (const char *)sh->k_full[l] + src * row, row);
            sh->b->ops->copy(sh->b, (char *)sh->v_full[l] + dst * row, (const char *)sh->v_full[l] + src * row, row);
        }
    }
}

enum kv_status kv_cache_alloc_slot(struct kv_cache *kv, int32_t *slot) {
    if (kv->n_free_slots == 0) return KV_STATUS_NO_SPACE;
    *slot = kv->free_slots[--kv->n_free_slots];
    assert(!kv->slot_used[*slot]);
    kv->slot_used[*slot] = 1;
    return KV_STATUS_OK;
}

void kv_cache_release_slot(struct kv_cache *kv, int32_t slot) {
    assert(slot >= 0 && slot < kv->n_slots && kv->slot_used[slot]);
    kv->slot_used[slot] = 0;
    kv->free_slots[kv->n_free_slots++] = slot;
}

void kv_cache_copy_slot(struct kv_cache *kv, int32_t dst, int32_t src) {
    for (int r = 0; r < kv->n_shards; r++) {
        const struct kv_shard *sh = &kv->shards[r];
        size_t es = sh->b->ops->act_size;
        for (int l = 0; l < kv->n_layers; l++) {
            size_t row = (size_t)(kv->sink + kv->recent) * sh->n_stream[l] * kv->head_dim * es;
            if (!row) continue;
            sh->b->ops->copy(sh->b, (char *)sh->k_stream[l] + dst * row, (const char *)sh->k_stream[l] + src * row,
                             row);
            sh->b->ops->copy(sh->b, (char *)sh->v_stream[l] + dst * row, (const char *)sh->v_stream[l] + src * row,
                             row);
        }
    }
}

int kv_cache_has_full(const struct kv_cache *kv) {
    for (int r = 0; r < kv->n_shards; r++)
        for (int l = 0; l < kv->n_layers; l++)
            if (kv->shards[r].n_full[l]) return 1;
    return 0;
}

int kv_cache_has_stream(const struct kv_cache *kv) {
    for (int r = 0; r < kv->n_shards; r++)
        for (int l = 0; l < kv->n_layers; l++)
            if (kv->shards[r].n_stream[l]) return 1;
    return 0;
}
