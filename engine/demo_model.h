/* demo_model: the built-in demo model. With no -m, duoserve writes a tiny random-weight
 * Llama-architecture checkpoint (fixed seed, so always the same bytes) with a byte-level
 * tokenizer into a cache folder and serves it, so a fresh machine runs with no download.
 * Its text is noise; it exists to exercise every code path. */
#ifndef DUO_DEMO_MODEL_H
#define DUO_DEMO_MODEL_H

#include <stddef.h>

/* Cache folder: $DUOSERVE_CACHE, else $XDG_CACHE_HOME/duoserve, else $HOME/.cache/duoserve. */
int demo_model_dir(char *out, size_t outlen);

/* Ensures the demo model exists under the cache folder (writes it if absent) and returns its
 * directory in out. */
int demo_model_ensure(char *out, size_t outlen, char *err, size_t errlen);

/* Writes the demo model into dir (created if needed). */
int demo_model_write(const char *dir, char *err, size_t errlen);

#endif
