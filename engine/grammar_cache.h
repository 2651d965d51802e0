/* grammar_cache: the compiled grammars of structured-output requests (engine/grammar.h), one
 * per grammar text (struct engine_grammar: kind, schema text, wrapper), shared by the requests
 * that use it, with the token_mask (engine/token_mask.h) that turns its states into masks over
 * the model's vocabulary. A schema is compiled once, by the first request that names it; the
 * token mask's caches, the costly part, live as long as the entry. Entries nobody holds are
 * dropped least recently used first once there are more than GRAMMAR_CACHE_MAX_ENTRIES or their
 * memory passes GRAMMAR_CACHE_MAX_BYTES.
 *
 * Threads: acquire and release from any thread (one mutex; a compile, and the vocabulary trie
 * built for the first constrained request, run on the calling thread outside the entry table's
 * lock), so a submitting thread learns at once that a schema does not compile. An entry's token
 * mask is touched only by the engine thread, and only while it holds the entry: an entry nobody
 * holds is never in use, so whichever thread evicts it may free it. */
#ifndef DUO_GRAMMAR_CACHE_H
#define DUO_GRAMMAR_CACHE_H

#include <stddef.h>

#include "engine/request.h"
#include "engine/grammar.h"
#include "engine/token_mask.h"

#define GRAMMAR_CACHE_MAX_ENTRIES 64
#define GRAMMAR_CACHE_MAX_BYTES ((size_t)512 << 20)

struct grammar_cache;
struct grammar_cache_entry;
struct tokenizer;

/* tok (borrowed, must outlive the cache) gives the token bytes; n_vocab is the model's
 * vocabulary (masks have that many bits). Returns 0 or GRAMMAR_ERR_NOMEM. */
int grammar_cache_create(struct grammar_cache **out, const struct tokenizer *tok, int n_vocab);
void grammar_cache_free(struct grammar_cache *gc); // every entry must be released first

/* The entry of spec (kind != ENGINE_GRAMMAR_NONE), compiled on a miss; the caller holds it until
 * grammar_cache_release. Returns 0, or a negative grammar_status with a one-line message in err
 * (the compile error: the unsupported keyword, the limit). */
int grammar_cache_acquire(struct grammar_cache *gc, const struct engine_grammar *spec, struct grammar_cache_entry **out,
                          char *err, size_t errlen);
/* NULL is a no-op. */
void grammar_cache_release(struct grammar_cache *gc, struct grammar_cache_entry *e);

const struct grammar *grammar_cache_grammar(const struct grammar_cache_entry *e);
/* Engine thread, on a held entry: its token mask, made on first use. NULL when out of memory. */
struct token_mask *grammar_cache_mask(struct grammar_cache *gc, struct grammar_cache_entry *e);
/* Engine thread, on a held entry: records the memory its token mask holds now (the caches grow
 * as requests use them), which eviction goes by. */
void grammar_cache_measure(struct grammar_cache *gc, struct grammar_cache_entry *e);
/* 32-bit words of a mask (token_mask_words). */
size_t grammar_cache_mask_words(const struct grammar_cache *gc);

struct grammar_cache_stats {
    int entries;
    size_t bytes;                   // grammars and token masks, as last measured
    unsigned long long hits, misses, evictions;
};
void grammar_cache_stats(struct grammar_cache *gc, struct grammar_cache_stats *st);

#endif
