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

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/backend.h"

enum kv_status { KV_STATUS_OK = 0, KV_STATUS_NO_SPACE = 1, KV_STATUS_OOM = -1 };

struct kv_geometry {
    int n_layers, head_dim, block_size;
    const int *n_full;   // [n_layers] retrieval KV heads R_l
    const int *n_stream; // [n_layers] streaming KV heads S_l
    int sink, recent;    // streaming slot rows: sink + recent
    enum kv_dtype dtype; // the arrays' elements (KV_DTYPE_ACT: the backend's activation dtype)
};

struct kv_cache;

/* A sequence's KV: its full-pool block table (block i holds positions [i * block_size, (i + 1) *
 * block_size)) and its streaming slot (-1: none). Owned by the sequence, changed by the cache. */
struct kv_seq {
    int32_t *blocks;
    int n_blocks, cap;
    int32_t slot;
    uint64_t *hash; // [cap] prefix caching: the chain hash of each full block (n_hashed of them)
    int n_hashed;
};

/* Bytes of one K or V element of type dt in backend b. */
size_t kv_cache_elem_size(const struct backend *b, enum kv_dtype dt);
/* Bytes one full-pool block and one streaming slot take across all layers (K and V). */
size_t kv_cache_block_bytes(const struct kv_geometry *g, size_t elem_size);
size_t kv_cache_slot_bytes(const struct kv_geometry *g, size_t elem_size);

/* A zeroed cache for kv_cache_init(_shards) / model_kv_cache_init; kv_cache_delete frees both. */
struct kv_cache *kv_cache_new(void);
void kv_cache_delete(struct kv_cache *kv);

int kv_cache_init(struct kv_cache *kv, struct backend *b, const struct kv_geometry *g, int n_blocks, int n_slots);
/* The same over n ranks: shard r holds the heads of g[r] in backend b[r] (the geometries differ
 * only in their heads). */
int kv_cache_init_shards(struct kv_cache *kv, int n, struct backend *const *b, const struct kv_geometry *g,
                         int n_blocks, int n_slots);
void kv_cache_free(struct kv_cache *kv);
/* Host-memory pools (the CPU backend) resident now rather than page by page as they are first
 * used: a server's memory then stands still from the start, even as the prefix cache spreads its
 * sequences over the whole pool. */
void kv_cache_prefault(struct kv_cache *kv);
/* KV_DTYPE_FP8_E4M3: sets the scales of layer l of rank r's heads (k and v: [n_full + n_stream] of
 * that rank and layer, retrieval heads first); they are 1 until set. 0, or a backend_status. */
int kv_cache_set_scales(struct kv_cache *kv, int r, int l, const float *k, const float *v);
enum kv_dtype kv_cache_dtype(const struct kv_cache *kv);

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

/* ---- what a scheduler asks of the cache ---- */
struct kv_cache_usage {
    int n_blocks, n_free_blocks; // the full pool (blocks exist without retrieval heads too: bookkeeping only)
    int n_slots, n_free_slots;   // the streaming pool
};
void kv_cache_usage(const struct kv_cache *kv, struct kv_cache_usage *u);
int kv_cache_block_size(const struct kv_cache *kv);
/* Tokens the full pool holds; INT_MAX when there are no retrieval heads (blocks cost nothing). */
int kv_cache_capacity_tokens(const struct kv_cache *kv);

void kv_seq_init(struct kv_seq *t);
/* Frees t's table; t must hold nothing (kv_cache_seq_release first). */
void kv_seq_free(struct kv_seq *t);
/* Makes t's blocks cover positions [0, upto) for a write from position `from` on: new blocks, and a
 * private copy of a shared block it will write into (copy on write). All or nothing: NO_SPACE when
 * the pool lacks blocks, OOM when the table cannot grow. Without retrieval heads: OK, nothing held. */
enum kv_status kv_cache_seq_ensure(struct kv_cache *kv, struct kv_seq *t, int from, int upto);
/* A streaming slot for t (which has none). */
enum kv_status kv_cache_seq_slot(struct kv_cache *kv, struct kv_seq *t);
/* dst (empty) shares src's blocks and gets a copy of src's slot in a new slot when src has one. */
enum kv_status kv_cache_seq_fork(struct kv_cache *kv, struct kv_seq *dst, const struct kv_seq *src);
/* Drops everything t holds (blocks and slot); t's table stays allocated for reuse. */
void kv_cache_seq_release(struct kv_cache *kv, struct kv_seq *t);

/* ---- prefix caching ----
 * Full blocks are content-addressed: block i's hash chains its parent's hash (the salt for block 0)
 * and its tokens; a registered block stays cached after its last holder lets it go (reference count
 * 0, least recently used first) until an allocation needs the room. The streaming heads' slot is a
 * ring of the last `recent` positions, which a prefix of whole blocks cannot restore: a sequence
 * that leaves (finished, cancelled or preempted) keeps a snapshot of where it stood: its slot, its
 * partly filled last block and that block's tokens. A new sequence resumes from the longest
 * snapshot whose tokens begin its own (a copy of the slot; the partial block is shared and copied
 * on write), or, without streaming heads, from the longest chain of cached blocks. Either way the
 * K/V it finds are the bits it would have computed. Snapshots are dropped least recently used first
 * when a slot or a block is needed. Sequences without prefix caching see none of this. */
/* Turns prefix caching on; salt names everything besides the tokens that changes the KV (model,
 * head pattern, sink and recent). 0, or -1 when out of memory. Without retrieval heads it stays off
 * (returns 0): there are no blocks to address. */
int kv_cache_enable_prefix_caching(struct kv_cache *kv, uint64_t salt);
bool kv_cache_prefix_caching(const struct kv_cache *kv);
/* For t (empty): the longest cached prefix of tokens[0, n), leaving at least the last token to
 * compute. t then holds its blocks (and slot). Returns the tokens found (0: none, or caching off). */
int kv_cache_seq_match(struct kv_cache *kv, struct kv_seq *t, const int32_t *tokens, int n);
/* Forgets every snapshot and every cached block that no sequence holds (they go back to the free
 * pools): what the engine's warm-up requests left is no prefix of a user's. */
void kv_cache_prefix_drop(struct kv_cache *kv);
/* Counts one admission's lookup in the prefix cache's statistics: n tokens asked for, found of
 * them found (kv_cache_seq_match does not count: a request may be matched again while it waits). */
void kv_cache_prefix_count(struct kv_cache *kv, int n, int found);
/* Registers t's blocks that positions [0, n_computed) filled (after a step). */
void kv_cache_seq_commit(struct kv_cache *kv, struct kv_seq *t, const int32_t *tokens, int n_computed);
/* t leaves: its blocks are registered and released, a snapshot of where it stood is kept, and
 * t holds nothing afterwards. Without prefix caching: kv_cache_seq_release. */
void kv_cache_seq_retire(struct kv_cache *kv, struct kv_seq *t, const int32_t *tokens, int n_computed);
/* t goes on, but a snapshot of where it stands (n_computed tokens: the end of its prompt) is kept
 * for later sequences that begin the same way; only with streaming heads (whole blocks serve the
 * rest). A chat's next turn holds the previous turn's prompt whatever the tokens of its answer. */
void kv_cache_seq_snapshot(struct kv_cache *kv, struct kv_seq *t, const int32_t *tokens, int n_computed);
struct kv_prefix_stats {
    uint64_t queries, hits; // tokens asked for at admissions (kv_cache_prefix_count), and found
    int cached_blocks;      // registered blocks (in use or not)
    int snapshots;
};
void kv_cache_prefix_stats(const struct kv_cache *kv, struct kv_prefix_stats *st);

#endif
