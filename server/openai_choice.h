/* openai_choice: the output of one choice, accumulated from the engine's events for a
 * non-streamed response: its text, its tokens' logprobs, its finish, and (chat with tools) the
 * tool calls server/tool_parser.h finds in the text. openai_response.h turns choices into JSON;
 * a streamed choice keeps only its counts and finish here, and its tool parser.
 * One thread at a time per choice (the request's). */
#ifndef DUO_OPENAI_CHOICE_H
#define DUO_OPENAI_CHOICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/request.h"
#include "server/openai_request.h"

struct tool_parser;

/* A tool call found in a non-streamed choice's text. */
struct openai_tool_call {
    char id[40];
    char *name;
    char *args;                    // the arguments' JSON text as the model wrote it
    size_t args_len, args_cap;
};

/* What a non-streamed choice's tool parser found: the text around the calls, and the calls. */
struct openai_tool_result {
    char *content;
    size_t len, cap;
    struct openai_tool_call *calls;
    int n, cap_calls;
};

struct openai_choice {
    char *text; // NUL-terminated
    size_t len, cap;
    size_t chars;                  // code points in text
    int n_tok, cap_tok;            // generated tokens with logprobs (only when logprobs >= 0)
    int n_start_tok;               // the first n_start_tok of them begin the text (text_start)
    int32_t *tok_ids;
    float *tok_lps;
    size_t *tok_offsets;           // character offset of each token's text in `text`
    int *tok_n_top;
    int32_t *top_ids;              // [cap_tok][ENGINE_MAX_LOGPROBS]
    float *top_lps;
    enum engine_finish finish;
    char *stop_reason_str;         // owned copy
    int32_t stop_reason_id;        // -1 none
    int completion_tokens;
    bool done;
    struct tool_parser *tools;     // chat with tools: the output's tool-call parser, or NULL
    struct openai_tool_result *tres; // non-streamed: what it found
};

void openai_choice_init(struct openai_choice *c);
void openai_choice_free(struct openai_choice *c);
/* Appends text; 0 or -1 when out of memory. */
int openai_choice_append(struct openai_choice *c, const char *s, size_t n);
/* Records an event: its text (fed to the tool parser when there is one) and, for a TOKEN event,
 * its count and, when keep_logprobs, its logprobs; 0 or -1 (memory). */
int openai_choice_add_event(struct openai_choice *c, const struct engine_event *ev, bool keep_logprobs);
/* Gives choice c a tool parser when r's output is parsed for tool calls (chat, tools, no
 * response_format); seed makes its call ids. 0 or -1 (memory). */
int openai_choice_init_tools(struct openai_choice *c, const struct openai_request *r, uint64_t seed);

#endif
