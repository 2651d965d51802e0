#include "engine/kv_cache_impl.h"

#include <assert.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* A snapshot of a sequence that left: the first n_full * block_size + n_tail tokens. */
struct kv_snap {
    uint64_t base;    // chain hash of its last full block (the salt when it has none)
    int n_full, n_tail;
    int32_t *tail;    // [block_size] the tokens of its partial block
    int32_t block;    // its partial block (held), or -1 when n_tail is 0
    int32_t slot;     // its streaming slot (held), or -1
    uint64_t used;    // last use (clock), for least-recently-used eviction
};

struct kv_prefix {
    uint64_t salt;
    uint64_t *hash, *parent;   // [n_blocks] a registered block's chain hash and its parent's
    int32_t *tokens;           // [n_blocks * block_size] its tokens
    uint8_t *reg;              // [n_blocks] registered
    int32_t *bucket, *chain;   // hash table: [n_buckets] first block, [n_blocks] next block (-1 ends)
    int n_buckets;             // a power of two
    int32_t *prev, *next;      // [n_blocks] cached blocks nobody holds, least recently used first
    int32_t head, tail;
    int n_idle;
    int n_reg;
    struct kv_snap *snaps;
    int n_snaps, max_snaps;
    uint64_t clock, queries, hits;
};

static size_t sum_heads(const int *h, int n) {
    size_t s = 0;
    for (int i = 0; i < n; i++) s += (size_t)h[i];
    return s;
}

size_t kv_cache_elem_size(const struct backend *b, enum kv_dtype dt) {
    return dt == KV_DTYPE_FP8_E4M3 ? 1 : dt == KV_DTYPE_BF16 ? 2 : b->ops->act_size;
}

size_t kv_cache_block_bytes(const struct kv_geometry *g, size_t es) {
    return 2 * sum_heads(g->n_full, g->n_layers) * (size_t)g->block_size * g->head_dim * es;
}

size_t kv_cache_slot_bytes(const struct kv_geometry *g, size_t es) {
    return 2 * sum_heads(g->n_stream, g->n_layers) * (size_t)(g->sink + g->recent) * g->head_dim * es;
}

struct kv_cache *kv_cache_new(void) { return calloc(1, sizeof(struct kv_cache)); }

void kv_cache_delete(struct kv_cache *kv) {
    kv_cache_free(kv);
    free(kv);
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
    bool fp8 = g->dtype == KV_DTYPE_FP8_E4M3;
    if (fp8) {
        sh->k_scale = calloc(L, sizeof(float *));
        sh->v_scale = calloc(L, sizeof(float *));
        if (!sh->k_scale || !sh->v_scale) return -1;
    }
    if (!sh->n_full || !sh->n_stream || !sh->k_full || !sh->v_full || !sh->k_stream || !sh->v_stream) return -1;
    memcpy(sh->n_full, g->n_full, sizeof(int) * L);
    memcpy(sh->n_stream, g->n_stream, sizeof(int) * L);
    size_t es = sh->es = kv_cache_elem_size(b, g->dtype);
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
        int nh = g->n_full[l] + g->n_stream[l];
        if (fp8 && nh) { /* scales of 1 until kv_cache_set_scales */
            float *ones = malloc(sizeof(float) * (size_t)nh);
            if (!ones) return -1;
            for (int h = 0; h < nh; h++) ones[h] = 1.0f;
            sh->k_scale[l] = b->ops->alloc(b, sizeof(float) * (size_t)nh, &s[0]);
            sh->v_scale[l] = b->ops->alloc(b, sizeof(float) * (size_t)nh, &s[1]);
            if (!s[0] && !s[1]) s[0] = b->ops->upload_f32(b, sh->k_scale[l], ones, (size_t)nh);
            if (!s[0] && !s[1]) s[1] = b->ops->upload_f32(b, sh->v_scale[l], ones, (size_t)nh);
            free(ones);
            if (s[0] || s[1]) return -1;
        }
    }
    return 0;
}

void kv_cache_prefault(struct kv_cache *kv) {
    for (int r = 0; r < kv->n_shards; r++) {
        struct kv_shard *sh = &kv->shards[r];
        if (!sh->b->ops->prefault) continue;
        for (int l = 0; l < kv->n_layers; l++) {
            size_t fb = (size_t)kv->n_blocks * kv->block_size * sh->n_full[l] * kv->head_dim * sh->es;
            size_t sb = (size_t)kv->n_slots * (kv->sink + kv->recent) * sh->n_stream[l] * kv->head_dim * sh->es;
            if (sh->k_full[l]) sh->b->ops->prefault(sh->b, sh->k_full[l], fb), sh->b->ops->prefault(sh->b, sh->v_full[l], fb);
            if (sh->k_stream[l])
                sh->b->ops->prefault(sh->b, sh->k_stream[l], sb), sh->b->ops->prefault(sh->b, sh->v_stream[l], sb);
        }
    }
}

static void shard_free(struct kv_shard *sh, int n_layers) {
    void **arrs[6] = {sh->k_full, sh->v_full, sh->k_stream, sh->v_stream, (void **)sh->k_scale, (void **)sh->v_scale};
    for (int i = 0; i < 6; i++)
        for (int l = 0; arrs[i] && l < n_layers; l++) sh->b->ops->free(sh->b, arrs[i][l]);
    for (int i = 0; i < 6; i++) free(arrs[i]);
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
    kv->dtype = g[0].dtype;
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
    kv->has_full = kv_cache_has_full(kv);
    kv->has_stream = kv_cache_has_stream(kv);
    return KV_STATUS_OK;
}

int kv_cache_set_scales(struct kv_cache *kv, int r, int l, const float *k, const float *v) {
    const struct kv_shard *sh = &kv->shards[r];
    size_t nh = (size_t)(sh->n_full[l] + sh->n_stream[l]);
    if (kv->dtype != KV_DTYPE_FP8_E4M3 || !nh) return 0;
    int rc = sh->b->ops->upload_f32(sh->b, sh->k_scale[l], k, nh);
    return rc ? rc : sh->b->ops->upload_f32(sh->b, sh->v_scale[l], v, nh);
}

enum kv_dtype kv_cache_dtype(const struct kv_cache *kv) { return kv->dtype; }

static void prefix_free(struct kv_prefix *pc);

void kv_cache_free(struct kv_cache *kv) {
    if (!kv || !kv->b) return;
    prefix_free(kv->pc);
    for (int r = 0; kv->shards && r < kv->n_shards; r++)
        if (kv->shards[r].b) shard_free(&kv->shards[r], kv->n_layers);
    free(kv->shards);
    free(kv->ref);
    free(kv->free_blocks);
    free(kv->free_slots);
    free(kv->slot_used);
    memset(kv, 0, sizeof *kv);
}

static bool evict_block(struct kv_cache *kv);
static void snap_drop(struct kv_cache *kv, int i);
enum snap_want { SNAP_ANY, SNAP_SLOT, SNAP_BLOCK };
static int evict_snapshot(struct kv_cache *kv, enum snap_want want, int keep);
static void idle_remove(struct kv_prefix *pc, int32_t id);
static void idle_push(struct kv_prefix *pc, int32_t id);

enum kv_status kv_cache_alloc(struct kv_cache *kv, int n, int32_t *out) {
    if (kv->pc) { /* the free stack first, then cached blocks nobody holds, then snapshots' blocks */
        struct kv_cache_usage u;
        kv_cache_usage(kv, &u);
        if (n > u.n_free_blocks) return KV_STATUS_NO_SPACE;
        while (kv->n_free_blocks < n && (evict_block(kv) || evict_snapshot(kv, SNAP_BLOCK, -1) >= 0)) {
        }
    }
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
    assert(id >= 0 && id < kv->n_blocks && (kv->ref[id] > 0 || (kv->pc && kv->pc->reg[id])));
    if (kv->ref[id] == 0) idle_remove(kv->pc, id); /* a cached block back in use */
    kv->ref[id]++;
}

void kv_cache_release(struct kv_cache *kv, const int32_t *ids, int n) {
    for (int i = 0; i < n; i++) {
        int32_t id = ids[i];
        assert(id >= 0 && id < kv->n_blocks && kv->ref[id] > 0);
        if (--kv->ref[id] > 0) continue;
        if (kv->pc && kv->pc->reg[id]) idle_push(kv->pc, id); /* stays cached until the room is needed */
        else kv->free_blocks[kv->n_free_blocks++] = id;
    }
}

void kv_cache_copy_block(struct kv_cache *kv, int32_t dst, int32_t src) {
    for (int r = 0; r < kv->n_shards; r++) {
        const struct kv_shard *sh = &kv->shards[r];
        size_t es = sh->es;
        for (int l = 0; l < kv->n_layers; l++) {
            size_t row = (size_t)kv->block_size * sh->n_full[l] * kv->head_dim * es;
            if (!row) continue;
            sh->b->ops->copy(sh->b, (char *)sh->k_full[l] + dst * row, (const char *)sh->k_full[l] + src * row, row);
            sh->b->ops->copy(sh->b, (char *)sh->v_full[l] + dst * row, (const char *)sh->v_full[l] + src * row, row);
        }
    }
}

enum kv_status kv_cache_alloc_slot(struct kv_cache *kv, int32_t *slot) {
    while (kv->n_free_slots == 0 && kv->pc && evict_snapshot(kv, SNAP_SLOT, -1) >= 0) {
    }
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
        size_t es = sh->es;
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

void kv_cache_usage(const struct kv_cache *kv, struct kv_cache_usage *u) {
    *u = (struct kv_cache_usage){kv->n_blocks, kv->n_free_blocks, kv->n_slots, kv->n_free_slots};
    if (!kv->pc) return;
    /* what eviction gives back counts as free: idle cached blocks, snapshots' slots and the partial
     * blocks only a snapshot holds */
    u->n_free_blocks += kv->pc->n_idle;
    for (int i = 0; i < kv->pc->n_snaps; i++) {
        const struct kv_snap *sn = &kv->pc->snaps[i];
        u->n_free_blocks += sn->block >= 0 && kv->ref[sn->block] == 1;
        u->n_free_slots += sn->slot >= 0;
    }
}

int kv_cache_block_size(const struct kv_cache *kv) { return kv->block_size; }

int kv_cache_capacity_tokens(const struct kv_cache *kv) {
    if (!kv->has_full) return INT_MAX;
    long long t = (long long)kv->n_blocks * kv->block_size;
    return t > INT_MAX ? INT_MAX : (int)t;
}

void kv_seq_init(struct kv_seq *t) { *t = (struct kv_seq){.slot = -1}; }

void kv_seq_free(struct kv_seq *t) {
    assert(t->n_blocks == 0 && t->slot < 0);
    free(t->blocks);
    free(t->hash);
    kv_seq_init(t);
}

static bool seq_table_grow(struct kv_seq *t, int need) {
    if (need <= t->cap) return true;
    int nc = t->cap ? t->cap : 16;
    while (nc < need) nc *= 2;
    int32_t *nb = realloc(t->blocks, sizeof(int32_t) * (size_t)nc);
    if (nb) t->blocks = nb;
    uint64_t *nh = realloc(t->hash, sizeof(uint64_t) * (size_t)nc);
    if (nh) t->hash = nh;
    if (!nb || !nh) return false;
    t->cap = nc;
    return true;
}

enum kv_status kv_cache_seq_ensure(struct kv_cache *kv, struct kv_seq *t, int from, int upto) {
    if (!kv->has_full) return KV_STATUS_OK;
    int bs = kv->block_size;
    int need = (upto + bs - 1) / bs;
    int first_write = from / bs;
    bool cow = first_write < t->n_blocks && kv->ref[t->blocks[first_write]] > 1;
    int new_blocks = (need > t->n_blocks ? need - t->n_blocks : 0) + (cow ? 1 : 0);
    struct kv_cache_usage u;
    kv_cache_usage(kv, &u);
    if (cow && new_blocks > u.n_free_blocks && kv->pc) {
        /* the block's other holders are snapshots only: take it over (drop them) rather than copy */
        int32_t b = t->blocks[first_write];
        int by_snaps = 0;
        for (int i = 0; i < kv->pc->n_snaps; i++) by_snaps += kv->pc->snaps[i].block == b;
        if (kv->ref[b] - by_snaps == 1 && new_blocks - 1 <= u.n_free_blocks) {
            for (int i = 0; i < kv->pc->n_snaps;)
                if (kv->pc->snaps[i].block == b) snap_drop(kv, i);
                else i++;
            cow = false;
            new_blocks--;
            kv_cache_usage(kv, &u);
        }
    }
    if (new_blocks > u.n_free_blocks) return KV_STATUS_NO_SPACE;
    if (!seq_table_grow(t, need + 1)) return KV_STATUS_OOM;
    if (cow) {
        int32_t nb;
        kv_cache_alloc(kv, 1, &nb);
        kv_cache_copy_block(kv, nb, t->blocks[first_write]);
        kv_cache_release(kv, &t->blocks[first_write], 1);
        t->blocks[first_write] = nb;
    }
    if (need > t->n_blocks) {
        kv_cache_alloc(kv, need - t->n_blocks, t->blocks + t->n_blocks);
        t->n_blocks = need;
    }
    return KV_STATUS_OK;
}

enum kv_status kv_cache_seq_slot(struct kv_cache *kv, struct kv_seq *t) {
    assert(t->slot < 0);
    return kv_cache_alloc_slot(kv, &t->slot);
}

enum kv_status kv_cache_seq_fork(struct kv_cache *kv, struct kv_seq *dst, const struct kv_seq *src) {
    assert(dst->n_blocks == 0 && dst->slot < 0);
    if (!seq_table_grow(dst, src->n_blocks + 1)) return KV_STATUS_OOM;
    if (src->slot >= 0) {
        enum kv_status st = kv_cache_alloc_slot(kv, &dst->slot);
        if (st != KV_STATUS_OK) return st;
        kv_cache_copy_slot(kv, dst->slot, src->slot);
    }
    memcpy(dst->blocks, src->blocks, sizeof(int32_t) * (size_t)src->n_blocks);
    dst->n_blocks = src->n_blocks;
    memcpy(dst->hash, src->hash, sizeof(uint64_t) * (size_t)src->n_hashed);
    dst->n_hashed = src->n_hashed;
    for (int i = 0; i < dst->n_blocks; i++) kv_cache_ref(kv, dst->blocks[i]);
    return KV_STATUS_OK;
}

void kv_cache_seq_release(struct kv_cache *kv, struct kv_seq *t) {
    for (int i = t->n_blocks - 1; i >= 0; i--) kv_cache_release(kv, &t->blocks[i], 1); /* leaves first: evicted first */
    t->n_blocks = 0;
    t->n_hashed = 0;
    if (t->slot >= 0) kv_cache_release_slot(kv, t->slot);
    t->slot = -1;
}

/* ---- prefix caching ---- */

static uint64_t mix64(uint64_t x) { /* splitmix64's finalizer */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t chain_hash(uint64_t parent, const int32_t *tokens, int n) {
    uint64_t h = mix64(parent ^ 0x9e3779b97f4a7c15ull);
    for (int i = 0; i < n; i++) h = mix64(h ^ (uint32_t)tokens[i]);
    return h;
}

static void prefix_free(struct kv_prefix *pc) {
    if (!pc) return;
    free(pc->hash), free(pc->parent), free(pc->tokens), free(pc->reg);
    free(pc->bucket), free(pc->chain), free(pc->prev), free(pc->next);
    for (int i = 0; i < pc->n_snaps; i++) free(pc->snaps[i].tail);
    free(pc->snaps);
    free(pc);
}

int kv_cache_enable_prefix_caching(struct kv_cache *kv, uint64_t salt) {
    if (kv->pc || !kv->has_full) return 0;
    struct kv_prefix *pc = calloc(1, sizeof *pc);
    if (!pc) return -1;
    size_t nb = (size_t)kv->n_blocks;
    pc->n_buckets = 16;
    while ((size_t)pc->n_buckets < 2 * nb && pc->n_buckets < (1 << 30)) pc->n_buckets *= 2;
    pc->salt = salt;
    pc->hash = malloc(sizeof(uint64_t) * nb);
    pc->parent = malloc(sizeof(uint64_t) * nb);
    pc->tokens = malloc(sizeof(int32_t) * nb * (size_t)kv->block_size);
    pc->reg = calloc(nb, 1);
    pc->bucket = malloc(sizeof(int32_t) * (size_t)pc->n_buckets);
    pc->chain = malloc(sizeof(int32_t) * nb);
    pc->prev = malloc(sizeof(int32_t) * nb);
    pc->next = malloc(sizeof(int32_t) * nb);
    /* a snapshot per slot at most, and some for sequences without streaming heads (partial blocks) */
    pc->max_snaps = kv->n_slots > 0 ? kv->n_slots : 256;
    pc->snaps = calloc((size_t)pc->max_snaps, sizeof *pc->snaps);
    pc->head = pc->tail = -1;
    if (!pc->hash || !pc->parent || !pc->tokens || !pc->reg || !pc->bucket || !pc->chain || !pc->prev || !pc->next ||
        !pc->snaps) {
        prefix_free(pc);
        return -1;
    }
    for (int i = 0; i < pc->n_buckets; i++) pc->bucket[i] = -1;
    kv->pc = pc;
    return 0;
}

bool kv_cache_prefix_caching(const struct kv_cache *kv) { return kv->pc != NULL; }

/* ---- the table of registered blocks ---- */

static int32_t table_find(const struct kv_cache *kv, uint64_t parent, uint64_t h, const int32_t *tokens) {
    const struct kv_prefix *pc = kv->pc;
    int bs = kv->block_size;
    for (int32_t id = pc->bucket[h & (uint64_t)(pc->n_buckets - 1)]; id >= 0; id = pc->chain[id])
        if (pc->hash[id] == h && pc->parent[id] == parent &&
            !memcmp(pc->tokens + (size_t)id * bs, tokens, sizeof(int32_t) * (size_t)bs))
            return id;
    return -1;
}

static void table_insert(struct kv_cache *kv, int32_t id, uint64_t parent, uint64_t h, const int32_t *tokens) {
    struct kv_prefix *pc = kv->pc;
    size_t b = h & (uint64_t)(pc->n_buckets - 1);
    pc->hash[id] = h;
    pc->parent[id] = parent;
    memcpy(pc->tokens + (size_t)id * kv->block_size, tokens, sizeof(int32_t) * (size_t)kv->block_size);
    pc->reg[id] = 1;
    pc->chain[id] = pc->bucket[b];
    pc->bucket[b] = id;
    pc->n_reg++;
}

static void table_remove(struct kv_cache *kv, int32_t id) {
    struct kv_prefix *pc = kv->pc;
    for (int32_t *p = &pc->bucket[pc->hash[id] & (uint64_t)(pc->n_buckets - 1)]; *p >= 0; p = &pc->chain[*p])
        if (*p == id) {
            *p = pc->chain[id];
            break;
        }
    pc->reg[id] = 0;
    pc->n_reg--;
}

/* ---- cached blocks nobody holds, least recently used first ---- */

static void idle_push(struct kv_prefix *pc, int32_t id) {
    pc->prev[id] = pc->tail;
    pc->next[id] = -1;
    if (pc->tail >= 0) pc->next[pc->tail] = id;
    else pc->head = id;
    pc->tail = id;
    pc->n_idle++;
}

static void idle_remove(struct kv_prefix *pc, int32_t id) {
    if (pc->prev[id] >= 0) pc->next[pc->prev[id]] = pc->next[id];
    else pc->head = pc->next[id];
    if (pc->next[id] >= 0) pc->prev[pc->next[id]] = pc->prev[id];
    else pc->tail = pc->prev[id];
    pc->n_idle--;
}

/* The least recently used idle cached block goes back to the free stack. */
static bool evict_block(struct kv_cache *kv) {
    struct kv_prefix *pc = kv->pc;
    int32_t id = pc->head;
    if (id < 0) return false;
    idle_remove(pc, id);
    table_remove(kv, id);
    kv->free_blocks[kv->n_free_blocks++] = id;
    return true;
}

/* ---- snapshots ---- */

static void snap_drop(struct kv_cache *kv, int i) {
    struct kv_prefix *pc = kv->pc;
    struct kv_snap *sn = &pc->snaps[i];
    if (sn->block >= 0) kv_cache_release(kv, &sn->block, 1);
    if (sn->slot >= 0) kv_cache_release_slot(kv, sn->slot);
    free(sn->tail);
    pc->snaps[i] = pc->snaps[--pc->n_snaps];
}

/* Drops the least recently used snapshot (SNAP_SLOT: one holding a slot; SNAP_BLOCK: one whose
 * partial block nobody else holds) but snapshot `keep`,
 * and returns its index (where the last snapshot moved), or -1 when there is none to drop. */
static int evict_snapshot(struct kv_cache *kv, enum snap_want want, int keep) {
    struct kv_prefix *pc = kv->pc;
    int best = -1;
    for (int i = 0; i < pc->n_snaps; i++) {
        const struct kv_snap *sn = &pc->snaps[i];
        if (i == keep || (want == SNAP_SLOT && sn->slot < 0)) continue;
        if (want == SNAP_BLOCK && !(sn->block >= 0 && kv->ref[sn->block] == 1)) continue; /* frees none */
        if (best < 0 || sn->used < pc->snaps[best].used) best = i;
    }
    if (best >= 0) snap_drop(kv, best);
    return best;
}

/* ---- what sequences do ---- */

void kv_cache_seq_commit(struct kv_cache *kv, struct kv_seq *t, const int32_t *tokens, int n_computed) {
    struct kv_prefix *pc = kv->pc;
    if (!pc) return;
    int bs = kv->block_size, full = n_computed / bs;
    if (full > t->n_blocks) full = t->n_blocks;
    for (int i = t->n_hashed; i < full; i++) {
        uint64_t parent = i ? t->hash[i - 1] : pc->salt;
        uint64_t h = chain_hash(parent, tokens + (size_t)i * bs, bs);
        t->hash[i] = h;
        int32_t id = t->blocks[i];
        /* a block computed twice (two sequences at once) is cached once: the first one stays */
        if (!pc->reg[id] && table_find(kv, parent, h, tokens + (size_t)i * bs) < 0) table_insert(kv, id, parent, h, tokens + (size_t)i * bs);
    }
    if (full > t->n_hashed) t->n_hashed = full;
}

/* Keeps a snapshot of t at n_computed tokens: t's slot and partial block move to it (move), or the
 * slot is copied into a new one and the partial block shared (!move: t goes on). Returns whether a
 * snapshot was made (false: none needed, one of the same tokens stands, or no room). */
static bool snap_take(struct kv_cache *kv, struct kv_seq *t, const int32_t *tokens, int n_computed, bool move) {
    struct kv_prefix *pc = kv->pc;
    kv_cache_seq_commit(kv, t, tokens, n_computed);
    int bs = kv->block_size, n_full = n_computed / bs, n_tail = n_computed % bs;
    if (!(n_full <= t->n_hashed && (n_tail > 0 || t->slot >= 0) && (n_tail == 0 || n_full < t->n_blocks)))
        return false;
    uint64_t base = n_full ? t->hash[n_full - 1] : pc->salt;
    for (int i = 0; i < pc->n_snaps; i++) { /* the same tokens: the one that stands is used again */
        struct kv_snap *sn = &pc->snaps[i];
        if (sn->base == base && sn->n_full == n_full && sn->n_tail == n_tail &&
            !memcmp(sn->tail, tokens + (size_t)n_full * bs, sizeof(int32_t) * (size_t)n_tail)) {
            sn->used = ++pc->clock;
            return false;
        }
    }
    int32_t slot = -1;
    if (!move && t->slot >= 0 && kv_cache_alloc_slot(kv, &slot) != KV_STATUS_OK) return false;
    int32_t *tail = malloc(sizeof(int32_t) * (size_t)bs);
    if (!tail || (pc->n_snaps == pc->max_snaps && evict_snapshot(kv, SNAP_ANY, -1) < 0)) {
        free(tail);
        if (slot >= 0) kv_cache_release_slot(kv, slot);
        return false;
    }
    memcpy(tail, tokens + (size_t)n_full * bs, sizeof(int32_t) * (size_t)n_tail);
    struct kv_snap *sn = &pc->snaps[pc->n_snaps++];
    *sn = (struct kv_snap){.base = base, .n_full = n_full, .n_tail = n_tail, .tail = tail, .block = -1, .slot = -1,
                           .used = ++pc->clock};
    if (n_tail && move) { /* the partial block moves to the snapshot */
        sn->block = t->blocks[n_full];
        t->blocks[n_full] = t->blocks[--t->n_blocks]; /* the rest is released by the caller, in any order */
    } else if (n_tail) { /* shared: t's next write copies it */
        sn->block = t->blocks[n_full];
        kv_cache_ref(kv, sn->block);
    }
    if (move) {
        sn->slot = t->slot;
        t->slot = -1;
    } else if (slot >= 0) {
        kv_cache_copy_slot(kv, slot, t->slot);
        sn->slot = slot;
    }
    return true;
}

void kv_cache_seq_retire(struct kv_cache *kv, struct kv_seq *t, const int32_t *tokens, int n_computed) {
    if (kv->pc && n_computed > 0) snap_take(kv, t, tokens, n_computed, true);
    kv_cache_seq_release(kv, t);
}

void kv_cache_seq_snapshot(struct kv_cache *kv, struct kv_seq *t, const int32_t *tokens, int n_computed) {
    if (kv->pc && kv->has_stream && n_computed > 0 && t->slot >= 0) snap_take(kv, t, tokens, n_computed, false);
}

int kv_cache_seq_match(struct kv_cache *kv, struct kv_seq *t, const int32_t *tokens, int n) {
    struct kv_prefix *pc = kv->pc;
    if (!pc || n < 2) return 0;
    assert(t->n_blocks == 0 && t->slot < 0);
    int bs = kv->block_size, max = n - 1; /* the last token is computed: its logits are needed */
    if (!seq_table_grow(t, max / bs + 2)) return 0;
    /* the chain of cached blocks */
    int depth = 0;
    uint64_t parent = pc->salt;
    while ((depth + 1) * bs <= max) {
        uint64_t h = chain_hash(parent, tokens + (size_t)depth * bs, bs);
        int32_t id = table_find(kv, parent, h, tokens + (size_t)depth * bs);
        if (id < 0) break;
        t->blocks[depth] = id;
        t->hash[depth++] = h;
        parent = h;
    }
    /* the longest snapshot on it */
    struct kv_snap *best = NULL;
    for (int i = 0; i < pc->n_snaps; i++) {
        struct kv_snap *sn = &pc->snaps[i];
        int len = sn->n_full * bs + sn->n_tail;
        if (sn->n_full > depth || len > max || (best && len <= best->n_full * bs + best->n_tail)) continue;
        if (sn->base != (sn->n_full ? t->hash[sn->n_full - 1] : pc->salt)) continue;
        if (kv->has_stream && sn->slot < 0) continue;
        if (memcmp(sn->tail, tokens + (size_t)sn->n_full * bs, sizeof(int32_t) * (size_t)sn->n_tail)) continue;
        best = sn;
    }
    int n_full = best ? best->n_full : kv->has_stream ? 0 : depth;
    if (best && !kv->has_stream && best->n_full * bs + best->n_tail <= depth * bs) { /* the chain is longer */
        best = NULL;
        n_full = depth;
    }
    if (!best && kv->has_stream) return 0; /* the streaming heads' rows need a snapshot */
    if (best) {
        best->used = ++pc->clock;
        if (best->slot >= 0) {
            int32_t slot;
            int bi = (int)(best - pc->snaps);
            while (kv->n_free_slots == 0) { /* room for a copy: other snapshots go first */
                int last = pc->n_snaps - 1, d = evict_snapshot(kv, SNAP_SLOT, bi);
                if (d < 0) break;
                if (bi == last) bi = d;
            }
            best = &pc->snaps[bi];
            /* (with none free, kv_cache_alloc_slot would evict this very snapshot) */
            if (kv->n_free_slots > 0 && kv_cache_alloc_slot(kv, &slot) == KV_STATUS_OK) {
                kv_cache_copy_slot(kv, slot, best->slot);
                t->slot = slot;
            } else { /* the snapshot's own slot is the only one left: take it over */
                t->slot = best->slot;
                best->slot = -1;
            }
        }
    }
    for (int i = 0; i < n_full; i++) kv_cache_ref(kv, t->blocks[i]);
    t->n_blocks = t->n_hashed = n_full;
    int found = n_full * bs;
    if (best && best->n_tail) {
        kv_cache_ref(kv, best->block); /* shared: the first write copies it */
        t->blocks[t->n_blocks++] = best->block;
        found += best->n_tail;
    }
    if (best && best->slot < 0 && kv->has_stream) { /* its slot was taken over: nothing left to restore */
        int i = (int)(best - pc->snaps);
        snap_drop(kv, i);
    }
    return found;
}

void kv_cache_prefix_drop(struct kv_cache *kv) {
    struct kv_prefix *pc = kv->pc;
    if (!pc) return;
    while (pc->n_snaps > 0) snap_drop(kv, pc->n_snaps - 1);
    while (evict_block(kv)) {
    }
}

void kv_cache_prefix_count(struct kv_cache *kv, int n, int found) {
    if (!kv->pc || n < 2) return;
    kv->pc->queries += (uint64_t)n;
    kv->pc->hits += (uint64_t)found;
}

void kv_cache_prefix_stats(const struct kv_cache *kv, struct kv_prefix_stats *st) {
    *st = (struct kv_prefix_stats){0};
    if (!kv->pc) return;
    st->queries = kv->pc->queries;
    st->hits = kv->pc->hits;
    st->cached_blocks = kv->pc->n_reg;
    st->snapshots = kv->pc->n_snaps;
}

void kv_cache_snapshot_holders(const struct kv_cache *kv, int *holders, int *slot_holders) {
    for (int i = 0; kv->pc && i < kv->pc->n_snaps; i++) {
        const struct kv_snap *sn = &kv->pc->snaps[i];
        if (sn->block >= 0) holders[sn->block]++;
        if (sn->slot >= 0) slot_holders[sn->slot]++;
    }
}

bool kv_cache_block_cached(const struct kv_cache *kv, int32_t id) { return kv->pc && kv->pc->reg[id]; }
