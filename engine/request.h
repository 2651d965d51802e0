/* request: a request to the engine (prompt ids, sampling and stopping, structured output), the
 * events it produces, and the engine's status codes. The bottom floor of the engine: the core,
 * the sampler, the engine thread and the server all speak these types. engine_request_clone makes
 * the one owned copy that travels from the submitting thread to the core. */
#ifndef DUO_REQUEST_H
#define DUO_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/grammar.h"

/* Structured output: every choice's text is a text of a grammar (engine/grammar.h says which
 * texts): tokens that would leave it are never drawn (the mask is applied to the logits first,
 * before bias, penalties and temperature); a choice ends with ENGINE_FINISH_STOP as soon as its
 * text is complete and nothing may follow, or on an EOS the grammar allows there (whatever
 * ignore_eos and min_tokens say: min_tokens never forces text past the grammar's end). Stop
 * strings and stop ids still apply; logprobs are the model's, before the mask. */
enum engine_grammar_kind {
    ENGINE_GRAMMAR_NONE = 0,
    ENGINE_GRAMMAR_JSON_OBJECT, // any JSON object (response_format json_object)
    ENGINE_GRAMMAR_JSON_SCHEMA, // a value of `schema` (response_format json_schema, tool calls)
};

struct engine_grammar {
    enum engine_grammar_kind kind;
    const char *schema;      // JSON_SCHEMA: the schema as JSON text (NUL-terminated)
    bool wrapped;            // the values sit between the literal texts of wrap (tool calls)
    struct grammar_wrap wrap;
};

/* Sampling and stopping for one request (OpenAI + vLLM semantics). */
struct engine_sampling {
    int n;                     // choices, >= 1
    int max_tokens;            // >= 1
    int min_tokens;            // EOS and stop ids/strings ignored before this many tokens
    float temperature;         // 0 = greedy
    float top_p;               // (0, 1]
    int top_k;                 // <= 0: off
    float min_p;               // [0, 1]
    float presence_penalty, frequency_penalty; // [-2, 2]
    float repetition_penalty;  // > 0, 1 = off
    bool has_seed;
    uint64_t seed;
    int n_logit_bias;
    const int32_t *logit_bias_ids; // token ids (in the vocabulary)
    const float *logit_bias_vals;  // [-100, 100]
    int n_stop_ids;
    const int32_t *stop_ids;   // extra stop token ids
    int n_stop;
    char *const *stop;         // stop strings (UTF-8), matched on the detokenized text
    const size_t *stop_len;    // their lengths in bytes (a stop string may hold NUL); NULL: strlen of each
    bool ignore_eos;
    bool include_stop_str_in_output;
    bool skip_special_tokens;  // default true
    int logprobs;              // -1: none; 0..20: sampled token's logprob + this many top
    struct engine_grammar grammar; // structured output; kind NONE: unconstrained
};

/* A request. engine_submit copies everything it needs; the caller keeps ownership. */
struct engine_request {
    const int32_t *prompt;
    int n_prompt;
    struct engine_sampling sp;
};

enum engine_finish { ENGINE_FINISH_NONE = 0, ENGINE_FINISH_STOP, ENGINE_FINISH_LENGTH, ENGINE_FINISH_ABORT };

enum engine_event_type {
    ENGINE_EVENT_TOKEN,  // one generated token of one choice (text may be empty: held back UTF-8)
    ENGINE_EVENT_FINISH, // a choice finished; text holds any flushed tail
    ENGINE_EVENT_ERROR,  // the request failed (message); no more events follow
};

#define ENGINE_MAX_LOGPROBS 20

struct engine_event {
    enum engine_event_type type;
    int choice;                    // index among the request's n choices
    int32_t token;                 // TOKEN: the sampled id
    char *text;                    // malloc'd UTF-8 delta (never splits a character); caller frees
    int token_text_at;             // TOKEN: the token's own text starts this many characters (code
                                   // points) into `text`: text held back before (a possible stop
                                   // string) comes first; past its end when the token's is held back
    bool text_start;               // TOKEN: no text came before the token, prompt included, so the
                                   // decoders' first-token rules apply (tokenizer_token_bytes)
    float logprob;                 // TOKEN with logprobs >= 0: log p(token) (before temperature)
    int n_top;
    int32_t top_ids[ENGINE_MAX_LOGPROBS];
    float top_lps[ENGINE_MAX_LOGPROBS];
    enum engine_finish finish;     // FINISH
    const char *stop_reason_str;   // never set by the engine (its copy of the request dies with it): a
                                   // consumer's own copy of the stop string that stop_index names
    int stop_index;                // FINISH by a stop string: its index in sp.stop; else -1
    int32_t stop_reason_id;        // FINISH by a stop id: which one; else -1
    double itl_s;                  // TOKEN: seconds since this choice's previous token; < 0 on its first
    int prompt_tokens, completion_tokens; // FINISH: usage of this choice
    int cached_tokens;             // FINISH: prompt tokens the prefix cache held when the request started
    double ttft_s;                 // FINISH: time to first token of this choice
    /* FINISH: the choice's phases, as vLLM's request stats: queue = arrival to first scheduled
     * (preemptions do not restart it), prefill = first scheduled to first token, decode = first
     * to last token. A choice that ends earlier ends the running phase at its end. */
    double queue_s, prefill_s, decode_s;
    char message[256];             // ERROR
};

enum engine_status {
    ENGINE_OK = 0,
    ENGINE_ERR_INVALID = -1,      // a parameter is out of range (message says which)
    ENGINE_ERR_TOO_LONG = -2,     // prompt + max_tokens over max_model_len or the whole KV pool
    ENGINE_ERR_QUEUE_FULL = -3,   // try later (HTTP 429)
    ENGINE_ERR_DRAINING = -4,     // shutting down (HTTP 503)
    ENGINE_ERR_OOM = -5,
    ENGINE_ERR_FATAL = -6,        // the backend failed for good (a tensor-parallel rank): no more steps
    ENGINE_ERR_GRAMMAR = -7,      // sp.grammar does not compile (message: the unsupported keyword, the limit)
    ENGINE_ERR_BACKEND = -8,      // the backend failed one step (its batch's requests got an ERROR); others go on
};

/* A deep copy of src (prompt, bias, stop ids and strings, the grammar's texts) that
 * engine_request_free frees; NULL when out of memory. Stop strings are copied by length (they may
 * hold NUL) and the copy always has stop_len. */
struct engine_request *engine_request_clone(const struct engine_request *src);
/* Frees a copy made by engine_request_clone; NULL is a no-op. */
void engine_request_free(struct engine_request *r);

const char *engine_strerror(int status);

#endif
