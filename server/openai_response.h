/* openai_response: the JSON of what goes back to the client, in OpenAI's (and for the
 * extensions vLLM's) shapes: whole non-streamed responses from accumulated choices
 * (server/openai_choice.h), stream chunks (text deltas with logprobs, tool-call deltas, the
 * role, usage and finish chunks), /v1/models, /tokenize and /detokenize. Token ids are turned
 * into token strings (for logprobs) through a caller-supplied function.
 *
 * Pure functions on caller memory, no engine or tokenizer calls: any thread. */
#ifndef DUO_OPENAI_RESPONSE_H
#define DUO_OPENAI_RESPONSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/request.h"
#include "server/openai_choice.h"
#include "server/openai_request.h"

/* Token id -> the bytes the token adds to the text, for logprobs (not always whole UTF-8: a
 * token may hold part of a character); first: the token begins the text (engine_event's
 * text_start). Writes min(len, cap) bytes into buf, returns len. ("token_id:N" is handled by the
 * caller, not by the callback.) */
typedef size_t (*openai_piece_fn)(void *ud, int32_t id, bool first, char *buf, size_t cap);

/* What every response of one request shares. */
struct openai_resp_ctx {
    enum openai_kind kind;       // OPENAI_COMPLETION or OPENAI_CHAT
    const char *id;              // "cmpl-..." / "chatcmpl-..."
    const char *model;
    long long created;           // unix seconds
    const char *system_fingerprint; // NULL: left out
    int logprobs;                // -1 none, else top logprobs per token
    bool tokens_as_ids;          // return_tokens_as_token_ids
    openai_piece_fn piece;
    void *piece_ud;
};

struct openai_usage {
    int prompt_tokens, completion_tokens;
    int cached_tokens; // prompt tokens found in the prefix cache (usage.prompt_tokens_details.cached_tokens)
};

const char *openai_finish_reason(enum engine_finish f); // "stop", "length", "abort" or NULL

/* A whole non-streamed response (malloc'd JSON). choices[i] has index i. */
char *openai_response_json(const struct openai_resp_ctx *ctx, const struct openai_choice *choices, int n_choices,
                           const struct openai_usage *usage);

/* One streamed chunk for choice `index`: text delta (may be NULL), the event's logprobs when
 * ev is a TOKEN event and ctx->logprobs >= 0 (text_offset: the characters of the choice's text
 * streamed before this delta; the token's offset adds ev->token_text_at), finish (NONE: not
 * finished) with its stop reason. Returns the malloc'd SSE frame "data: {...}\n\n". */
char *openai_chunk_sse(const struct openai_resp_ctx *ctx, int index, const char *text, const struct engine_event *ev,
                       size_t text_offset, enum engine_finish finish, const char *stop_str, int32_t stop_id);
/* Chat only: the first chunk of a choice, delta {"role":"assistant","content":""}. */
char *openai_chunk_role_sse(const struct openai_resp_ctx *ctx, int index);
/* The include_usage chunk: empty choices and the usage. */
char *openai_chunk_usage_sse(const struct openai_resp_ctx *ctx, const struct openai_usage *usage);
/* Chat with tools: the SSE frames for one event of choice `index` (c->tools set; its parser is
 * fed here): content and tool-call deltas, and with a FINISH the finish chunk ("tool_calls"
 * when there were calls). Returns a malloc'd string (possibly empty), NULL when out of memory. */
char *openai_chunk_tools_sse(const struct openai_resp_ctx *ctx, int index, struct openai_choice *c,
                            const struct engine_event *ev);

/* GET /v1/models. */
char *openai_models_json(const char *model_name, const char *root, long long created, int max_model_len);
/* POST /tokenize response; token_strs NULL gives JSON null. */
char *openai_tokenize_json(const int32_t *ids, int n, int max_model_len, char *const *token_strs);
/* POST /detokenize response. */
char *openai_detokenize_json(const char *text);

#endif
