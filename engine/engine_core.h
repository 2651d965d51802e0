/* engine_core: the synchronous heart of the engine: request admission, each step's batch from the
 * scheduler (engine/sched.h) over the two KV pools (engine/kv_cache.h), the forward pass, sampling,
 * incremental detokenization, structured output and stop conditions. Single-threaded: engine.c
 * runs it on the engine thread; tests drive it directly, step by step. */
#ifndef DUO_ENGINE_CORE_H
#define DUO_ENGINE_CORE_H

#include <stdbool.h>

#include "engine/config.h"
#include "engine/kv_cache.h"
#include "engine/model.h"
#include "engine/request.h"
#include "engine/stats.h"

struct core;
struct core_request;
struct grammar_cache_entry;

/* Receives each event of a request; takes ownership of ev->text. Called on the core's thread. */
typedef void (*core_emit_fn)(void *ud, const struct engine_event *ev);

int core_create(struct core **out, const struct engine_config *cfg, char *err, size_t errlen);
void core_free(struct core *c);

/* Validates and queues a request, taking er (from engine_request_clone) and ge (its compiled grammar,
 * held; NULL: compiled here if the request has one) in every case: freed on error. Returns an
 * engine_status; on error a message in err. The core frees the request after the step (or abort)
 * that ends its last choice. */
int core_add_owned(struct core *c, struct engine_request *er, struct grammar_cache_entry *ge, core_emit_fn emit,
                   void *ud, struct core_request **out, char *err, size_t errlen);
/* The same for a request the caller keeps (it is copied). */
int core_add(struct core *c, const struct engine_request *req, core_emit_fn emit, void *ud, struct core_request **out,
             char *err, size_t errlen);
/* The checks core_add makes that depend only on the request and immutable configuration:
 * thread-safe, so a submitting thread can refuse bad requests at once. */
int core_validate(const struct core *c, const struct engine_request *req, char *err, size_t errlen);
/* Finishes every unfinished choice of r with ENGINE_FINISH_ABORT now (KV freed); r is freed. Not
 * during a step (emit callbacks must not call it). */
void core_abort(struct core *c, struct core_request *r);

/* Runs one scheduler step (one forward pass). Returns the number of tokens computed, 0 when
 * there was nothing to do, or a negative engine_status: ENGINE_ERR_BACKEND when the backend
 * failed the step (every request in the batch then got an ERROR event), ENGINE_ERR_FATAL when the
 * model cannot run another step (a tensor-parallel rank failed), ENGINE_ERR_OOM when the host is
 * out of memory for the step's arrays. */
int core_step(struct core *c);
bool core_has_work(const struct core *c);
/* The waiting requests no free seat can take (FCFS: every one from the first that does not
 * fit), and the seats left after those that fit. What the queue limit counts: requests a
 * seat is free for are not queued (the token budget and the KV pool may still hold them a
 * step or two). */
void core_queue_state(const struct core *c, int *unseated, int *seats_left);
void core_stats(const struct core *c, struct engine_stats *st);
/* Zeroes the counters core_stats reports (not the capacity): requests the engine made itself,
 * such as its warm-up, are nobody's. */
void core_reset_stats(struct core *c);
/* Empties the prefix cache (no sequence may be running): what the engine's own requests left is
 * no prefix of a user's. */
void core_clear_prefix_cache(struct core *c);

const struct model *core_model(const struct core *c);
const struct tokenizer *core_tokenizer(const struct core *c);
const struct kv_cache *core_kv(const struct core *c);
int core_max_model_len(const struct core *c);
const char *core_model_dir(const struct core *c);
int core_max_queue(const struct core *c);
int core_max_num_seqs(const struct core *c);
const char *core_device(const struct core *c); // the backend's name: "cpu" or "cuda"
/* The configuration with its defaults filled in. */
const struct engine_config *core_config(const struct core *c);
const char *core_kv_dtype(const struct core *c); // the KV pools' elements: "float32", "bfloat16" or "fp8_e4m3"
/* The compiled grammars of structured output (thread-safe; NULL when the model has no tokenizer). */
struct grammar_cache *core_grammar_cache(struct core *c);

#endif
