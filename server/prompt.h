/* prompt: turns a parsed request's prompts into token ids: tokenizes string prompts, renders
 * chat messages through the model's chat template, decodes id prompts that must be echoed;
 * and names tokens for logprobs. The only server module that calls the tokenizer and the
 * chat template. Failures become struct openai_error (400 for the client's input, 500 for
 * ours). Any HTTP thread: tokenizer and template are immutable once loaded. */
#ifndef DUO_PROMPT_H
#define DUO_PROMPT_H

#include <stddef.h>
#include <stdint.h>

#include "server/openai.h"
#include "server/openai_response.h"

struct tokenizer;
struct chat_template;

/* Fills r->prompts[*].ids (chat: renders r->messages into prompts[0]); for completions and
 * chat then runs openai_check_prompts. ct may be NULL (chat then fails with 400). */
int prompt_prepare(struct openai_request *r, const struct tokenizer *tok, const struct chat_template *ct,
                   const struct openai_limits *lim, struct openai_error *err);

/* Decodes ids (skip_special as given) into a malloc'd string (NUL bytes as OPENAI_NUL); NULL
 * with err set on failure. */
char *prompt_decode(const struct tokenizer *tok, const int32_t *ids, int n, bool skip_special, struct openai_error *err);

/* The text of one token decoded alone, as vLLM's /tokenize token_strs report it. */
const char *prompt_token_piece(void *ud, int32_t id, char *buf, size_t cap);
/* openai_piece_fn over a struct tokenizer (ud): the bytes a generated token adds to the text
 * (tokenizer_token_bytes), for logprobs. */
size_t prompt_token_bytes(void *ud, int32_t id, bool first, char *buf, size_t cap);

#endif
