/* engine: continuous-batching inference on one model. One engine thread (a libuv loop) owns
 * all inference state: scheduler, KV pools, model, sampler, detokenizers. Other threads (the
 * HTTP side) only call the functions below, which are thread-safe: engine_submit hands a
 * request over, engine_poll pops its output events from a per-request queue, engine_cancel /
 * engine_release mark it for the engine to drop at the next step boundary (its KV is freed
 * there). `notify` is called from the engine thread whenever new events are queued for a
 * request; it must only wake the caller (e.g. queue the request and wake a loop), never block. */
#ifndef DUO_ENGINE_H
#define DUO_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/config.h"
#include "engine/request.h"
#include "engine/stats.h"

struct tokenizer;

struct engine;
struct engine_handle;

/* Loads the model and starts the engine thread. On failure -1 and a one-line message. */
int engine_create(struct engine **out, const struct engine_config *cfg, char *err, size_t errlen);
/* Stops the thread (aborting what is still running) and frees everything; NULL is a no-op. */
void engine_destroy(struct engine *e);

/* Hands a request to the engine. On ENGINE_OK *h is a handle the caller must engine_release. */
int engine_submit(struct engine *e, const struct engine_request *req, void (*notify)(void *ud), void *ud,
                  struct engine_handle **h, char *err, size_t errlen);
/* Pops the next event: 1 = one event written (caller frees ev->text), 0 = none yet. After the
 * last choice's FINISH (or an ERROR) it returns -1: the request is done. */
int engine_poll(struct engine_handle *h, struct engine_event *ev);
/* Asks the engine to stop the request; remaining choices FINISH with ENGINE_FINISH_ABORT. */
void engine_cancel(struct engine_handle *h);
/* The caller is done with h (cancels it if still running); h must not be used afterwards. */
void engine_release(struct engine_handle *h);

/* Stops admitting (submit returns ENGINE_ERR_DRAINING); running requests continue. */
void engine_drain(struct engine *e);
/* Requests running or waiting. */
int engine_num_active(struct engine *e);
/* True once the engine has failed for good (ENGINE_ERR_FATAL): every request was ended with an
 * error, submit refuses new ones; the caller should stop (exit non-zero). */
bool engine_failed(struct engine *e);
/* The counters and histograms (a snapshot taken after each step) and the cache info. */
void engine_get_stats(struct engine *e, struct engine_stats *st);

/* Read-only after engine_create; safe to use from any thread. */
const struct tokenizer *engine_tokenizer(const struct engine *e);
int engine_vocab_size(const struct engine *e);
int engine_max_model_len(const struct engine *e);
int engine_max_num_seqs(const struct engine *e);
const char *engine_model_dir(const struct engine *e); // the model's directory (the built-in demo's when none was given)

#endif
