/* core_bench: benchmark-only hooks into the engine core, for scripts/bench_gpu.c. Nothing the
 * server runs calls them (no file under server/ includes this header, so the daemon's binary does
 * not even link them). Engine thread only, between steps. */
#ifndef DUO_CORE_BENCH_H
#define DUO_CORE_BENCH_H

#include <stddef.h>

#include "engine/engine_core.h"

/* Gives every running sequence that is decoding (all its tokens computed but the last) n more
 * positions of KV cache, never computed, just before its last token: the next decode step then
 * reads a context n longer, as if its prompt had been n tokens longer, without the prefill's time.
 * What those positions hold is whatever their rows hold: the full pool's new blocks as the pool
 * leaves them (zeros in a fresh pool, else K/V rows of an earlier sequence: finite values either
 * way), the streaming slot as it stands (ring rows of positions never written are zeros in a fresh
 * pool, or hold the rows of earlier positions with the same ring index). Their tokens are copies of
 * the token before them. max_model_len grows to fit when it must, also past the model's
 * max_position_embeddings (RoPE takes any position; only the speed is of interest). For speed measurements only: the
 * outputs that follow are meaningless. Refused (-1, a message in err, nothing changed) with prefix
 * caching on (the blocks would be registered as holding those tokens), or when the full pool lacks
 * the blocks (and one to spare a sequence); -1 also when out of memory. Returns the number of
 * sequences extended. */
int core_bench_skip_context(struct core *c, int n, char *err, size_t errlen);

#endif
