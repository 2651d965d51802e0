/* openai_request: a parsed OpenAI request, the data every module of the OpenAI family passes
 * on (openai.c fills it, openai_tools.c its structured-output and tool fields, prompt.c its
 * token ids, http_gen.c hands its sampling to the engine), and the server's limits it was
 * checked against. The bottom floor of the family: types, their free, and what a request id
 * may hold. Any thread. */
#ifndef DUO_OPENAI_REQUEST_H
#define DUO_OPENAI_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "engine/request.h"

enum openai_kind {
    OPENAI_COMPLETION,
    OPENAI_CHAT,
    OPENAI_TOKENIZE,
    OPENAI_DETOKENIZE,
};

/* What the server allows; borrowed by the parser. */
struct openai_limits {
    const char *model_name; // served model id; a request naming another model gets 404
    int vocab_size;         // token ids must lie in [0, vocab_size)
    int max_model_len;      // prompt + max_tokens must fit
    int max_n;              // n in 1..max_n
    long long max_request_tokens;   // prompts x n x max_tokens of one request (0: no limit)
    long long max_request_logprobs; // prompts x n x max_tokens x top logprobs (0: no limit)
};

#define OPENAI_MAX_PROMPTS 64      // prompts in one completion request
#define OPENAI_MAX_STOP 64         // stop strings
#define OPENAI_MAX_STOP_BYTES 1024 // bytes of one stop string
#define OPENAI_MAX_STOP_IDS 1024
#define OPENAI_MAX_LOGIT_BIAS 4096
#define OPENAI_MAX_REQUEST_ID 128  // bytes of a request id (X-Request-Id header or request_id field)

struct openai_prompt {
    char *text;   // the prompt as given when a string (UTF-8), else NULL
    int32_t *ids; // token ids: given, or filled in by tokenization; NULL before
    int n_ids;
};

#define OPENAI_MAX_TOOLS 128

enum openai_tool_mode {
    OPENAI_TOOLS_OFF = 0,  // no tools, or tool_choice "none": the output is text
    OPENAI_TOOLS_AUTO,     // the model may call tools; its text is parsed for calls
    OPENAI_TOOLS_REQUIRED, // at least one call, enforced by the grammar
    OPENAI_TOOLS_NAMED,    // one call of tool_name, enforced by the grammar
};

/* How a model writes tool calls (its chat template says which). */
enum openai_tool_syntax {
    OPENAI_TOOL_SYNTAX_JSON = 0, // a JSON array of {"name", "arguments"} (templates that say nothing)
    OPENAI_TOOL_SYNTAX_HERMES,   // <tool_call>\n{"name", "arguments"}\n</tool_call> per call (Qwen2.5/3)
    OPENAI_TOOL_SYNTAX_LLAMA3,   // {"name", "parameters"}, calls separated by "; " (Llama 3.1/3.2)
    OPENAI_TOOL_SYNTAX_MISTRAL,  // [{"name", "arguments"}, ...] after the [TOOL_CALLS] token
};

/* The request's structured-output and tool fields, parsed by openai_structured_parse
 * (server/openai_tools.h says what they mean). Owned by struct openai_request. */
struct openai_structured {
    enum engine_grammar_kind format; // response_format & co.: NONE (text), JSON_OBJECT or JSON_SCHEMA
    char *schema;                    // JSON_SCHEMA: the schema's JSON text
    const char *param;               // the field it came from (static), for errors
    cJSON *tools;                    // the tools as given (a template variable), or NULL
    enum openai_tool_mode tool_mode;
    char *tool_name;                 // NAMED: the function
    bool parallel_tool_calls;        // default true
    char *tool_schema;               // REQUIRED, NAMED: the schema of one call (made by openai_tools_grammar)
    enum openai_tool_syntax syntax;
};

/* A parsed, validated request. All pointers are owned and freed by openai_request_free. */
struct openai_request {
    enum openai_kind kind;
    char *model;                   // as given, or NULL
    struct openai_prompt *prompts; // completions: 1..OPENAI_MAX_PROMPTS; tokenize: 1
    int n_prompts;
    cJSON *messages;               // chat (and tokenize with messages): normalised copy
    cJSON *template_kwargs;        // chat_template_kwargs object or NULL
    bool add_generation_prompt;    // chat: default true
    bool add_special_tokens;       // tokenizing strings: completions true, chat false
    bool return_token_strs;        // tokenize
    struct engine_sampling sp;     // its arrays point into the fields below
    int32_t *logit_bias_ids;
    float *logit_bias_vals;
    int32_t *stop_ids;
    char **stop;                   // as given (OPENAI_NUL for U+0000, openai_nul.h), for stop_reason
    char **stop_bytes;             // the same with their NULs: what sp.stop points to
    size_t *stop_len;              // their lengths: sp.stop_len
    bool max_tokens_given;         // false: completions use 16, chat the rest of the context
    bool stream, include_usage, echo, return_tokens_as_token_ids;
    int logprobs;                  // -1: none; else top logprobs per token (0..20)
    char *user;
    char *request_id;              // vLLM's request_id: the response id's suffix, or NULL
    struct openai_structured st;   // response_format, tools (server/openai_tools.h); sp.grammar points into it
};

/* Frees what r owns and empties it (its kind stays); NULL is a no-op. */
void openai_request_free(struct openai_request *r);

/* A client-chosen request id is usable in a header and a response id: 1 to
 * OPENAI_MAX_REQUEST_ID characters, each printable ASCII other than space. */
bool openai_request_id_valid(const char *s);

#endif
