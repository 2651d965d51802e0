/* openai: the OpenAI API's JSON. Parses and validates request bodies of /v1/completions,
 * /v1/chat/completions, /tokenize and /detokenize into struct openai_request (whose `sp` is
 * the engine_sampling the engine gets), and builds responses, stream chunks and the error
 * body. Client mistakes become OpenAI error bodies here and nowhere else: every other server
 * module reports them through struct openai_error and openai_error_json().
 *
 * Pure functions on caller memory, no engine or tokenizer calls, so any thread may call them
 * and the unit tests and the fuzzer drive them directly. Token ids are turned into token
 * strings (for logprobs) through a caller-supplied function. */
#ifndef DUO_OPENAI_H
#define DUO_OPENAI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "engine/engine.h"
#include "server/openai_tools.h"

enum openai_kind {
    OPENAI_COMPLETION,
    OPENAI_CHAT,
    OPENAI_TOKENIZE,
    OPENAI_DETOKENIZE,
};

/* U+0000 in request strings. cJSON's strings end at their first NUL, so the parser reads each
 * escape \u0000 as the byte OPENAI_NUL (0xFF, which is never part of UTF-8): every string of a
 * parsed request keeps its whole length. openai_bytes() gives the real bytes to whatever
 * tokenizes or matches them; openai_mark_nul() marks NULs of decoded text the same way; and
 * every JSON this module writes shows OPENAI_NUL as \u0000 again. */
#define OPENAI_NUL ((char)0xFF)
/* A malloc'd copy of s with OPENAI_NUL as 0, and its length in *len (NULL: out of memory). */
char *openai_bytes(const char *s, size_t *len);
/* NUL -> OPENAI_NUL in s[0..len), which then is a C string of length len. */
void openai_mark_nul(char *s, size_t len);
/* Takes json and returns it with each OPENAI_NUL written as \u0000 (NULL: out of memory). */
char *openai_json_nul(char *json);
/* The request body body[0..len) with each escape \u0000 replaced by OPENAI_NUL (malloc'd; *n its
 * length), or NULL when it has none (or out of memory). */
char *openai_mark_escaped_nuls(const char *body, size_t len, size_t *n);

/* An error for the client: HTTP status plus OpenAI's {"error":{message,type,param,code}}. */
struct openai_error {
    int status;        // HTTP status (400, 401, 404, 405, 413, 429, 503, 500)
    const char *type;  // "invalid_request_error", "authentication_error", ... (static string)
    const char *code;  // static string or NULL (JSON null)
    char param[64];    // offending field, "" for JSON null
    char message[512];
};

/* Fills err and returns -1, so callers can `return openai_fail(...)`. param and code may be
 * NULL. The type follows from the status. */
int openai_fail(struct openai_error *err, int status, const char *code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* The JSON body of err (malloc'd, NUL-terminated; NULL only when out of memory). */
char *openai_error_json(const struct openai_error *err);

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
    char **stop;                   // as given (OPENAI_NUL for U+0000), for stop_reason
    char **stop_bytes;             // the same with their NULs: what sp.stop points to
    size_t *stop_len;              // their lengths: sp.stop_len
    bool max_tokens_given;         // false: completions use 16, chat the rest of the context
    bool stream, include_usage, echo, return_tokens_as_token_ids;
    int logprobs;                  // -1: none; else top logprobs per token (0..20)
    char *user;
    char *request_id;              // vLLM's request_id: the response id's suffix, or NULL
    struct openai_structured st;   // response_format, tools (server/openai_tools.h); sp.grammar points into it
};

/* Parses body[0..len) (need not be NUL-terminated) for the endpoint `kind` and checks every
 * field's type and range. String prompts are kept as text (tokenize later); id prompts are
 * checked against lim->vocab_size. Returns 0, or -1 with err filled (out is then empty). */
int openai_parse_request(const char *body, size_t len, enum openai_kind kind, const struct openai_limits *lim,
                         struct openai_request *out, struct openai_error *err);
void openai_request_free(struct openai_request *r);

/* A client-chosen request id is usable in a header and a response id: 1 to
 * OPENAI_MAX_REQUEST_ID characters, each printable ASCII other than space. */
bool openai_request_id_valid(const char *s);

/* After every prompt has ids: rejects empty prompts and ids outside the vocabulary, sets the
 * default max_tokens (chat: what is left of the context), and checks prompt + max_tokens
 * against lim->max_model_len (400, code context_length_exceeded). */
int openai_check_prompts(struct openai_request *r, const struct openai_limits *lim, struct openai_error *err);

/* Token id -> the bytes the token adds to the text, for logprobs (not always whole UTF-8: a
 * token may hold part of a character); first: the token begins the text (engine_event's
 * text_start). Writes min(len, cap) bytes into buf, returns len. ("token_id:N" is handled by the
 * caller, not by the callback.) */
typedef size_t (*openai_piece_fn)(void *ud, int32_t id, bool first, char *buf, size_t cap);

/* Output of one choice, accumulated from engine events (non-streamed responses). */
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
    struct tool_parser *tools;     // chat with tools: the output's tool-call parser (openai_tools), or NULL
    struct openai_tool_result *tres; // non-streamed: what it found
};

void openai_choice_init(struct openai_choice *c);
void openai_choice_free(struct openai_choice *c);
/* Appends text; 0 or -1 when out of memory. */
int openai_choice_append(struct openai_choice *c, const char *s, size_t n);
/* Records a TOKEN event (its text and, when keep_logprobs, its logprobs); 0 or -1 (memory). */
int openai_choice_add_event(struct openai_choice *c, const struct engine_event *ev, bool keep_logprobs);

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
 * streamed before this delta; the token's offset adds ev->token_text_at), finish (NONE: not finished) with its stop reason. Returns the malloc'd
 * SSE frame "data: {...}\n\n". */
char *openai_chunk_sse(const struct openai_resp_ctx *ctx, int index, const char *text, const struct engine_event *ev,
                       size_t text_offset, enum engine_finish finish, const char *stop_str, int32_t stop_id);
/* Chat only: the first chunk of a choice, delta {"role":"assistant","content":""}. */
char *openai_chunk_role_sse(const struct openai_resp_ctx *ctx, int index);
/* The include_usage chunk: empty choices and the usage. */
char *openai_chunk_usage_sse(const struct openai_resp_ctx *ctx, const struct openai_usage *usage);
/* A stream chunk (id, object, created, model) with one choice {"index": index}, returned in
 * *choice, for callers that fill the rest; openai_sse_frame prints it ("data: ...\n\n") and
 * frees it. */
cJSON *openai_chunk_object(const struct openai_resp_ctx *ctx, int index, cJSON **choice);
char *openai_sse_frame(cJSON *root);
/* An error inside an open stream: "data: {"error":{...}}\n\n". */
char *openai_error_sse(const struct openai_error *err);

/* GET /v1/models. */
char *openai_models_json(const char *model_name, const char *root, long long created, int max_model_len);
/* POST /tokenize response; token_strs NULL gives JSON null. */
char *openai_tokenize_json(const int32_t *ids, int n, int max_model_len, char *const *token_strs);
/* POST /detokenize response. */
char *openai_detokenize_json(const char *text);

#endif
