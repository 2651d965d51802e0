/* openai: OpenAI API requests. Parses and validates request bodies of /v1/completions,
 * /v1/chat/completions, /tokenize and /detokenize into struct openai_request
 * (server/openai_request.h; its `sp` is the engine_sampling the engine gets), checks the
 * prompts once they are tokenized, and turns the engine's refusal of a request into the error
 * the client gets.
 *
 * The family, each file calling only those below it:
 *   openai.c           parsing and validation (this header)
 *   openai_fields.c    which fields a body may carry
 *   openai_tools.c     response_format and tools: their fields and the grammar of tool calls
 *   openai_response.c  the JSON of responses and stream chunks
 *   openai_choice.c    a choice's output accumulated from engine events
 *   openai_error.c     the error body, the one place client mistakes become JSON
 *   openai_request.c   the request's types and free; openai_nul.c: U+0000 in strings
 *
 * Pure functions on caller memory, no engine or tokenizer calls, so any thread may call them
 * and the unit tests and the fuzzer drive them directly. */
#ifndef DUO_OPENAI_H
#define DUO_OPENAI_H

#include <stddef.h>

#include "server/openai_error.h"
#include "server/openai_request.h"

/* Parses body[0..len) (need not be NUL-terminated) for the endpoint `kind` and checks every
 * field's type and range. String prompts are kept as text (tokenize later); id prompts are
 * checked against lim->vocab_size. Returns 0, or -1 with err filled (out is then empty). */
int openai_parse_request(const char *body, size_t len, enum openai_kind kind, const struct openai_limits *lim,
                         struct openai_request *out, struct openai_error *err);

/* After every prompt has ids: rejects empty prompts and ids outside the vocabulary, sets the
 * default max_tokens (chat: what is left of the context), and checks prompt + max_tokens
 * against lim->max_model_len (400, code context_length_exceeded). */
int openai_check_prompts(struct openai_request *r, const struct openai_limits *lim, struct openai_error *err);

/* The error for engine_submit's refusal of r: status an ENGINE_ERR_*, msg the engine's message
 * (engine_submit's, or engine_strerror(status) when it gave none). The one mapping of engine
 * statuses to HTTP: QUEUE_FULL 429, DRAINING 503, TOO_LONG 400 context_length_exceeded,
 * INVALID 400, GRAMMAR 400 naming the field whose schema does not compile, anything else 500.
 * Returns -1. */
int openai_submit_error(const struct openai_request *r, int status, const char *msg, struct openai_error *err);

#endif
