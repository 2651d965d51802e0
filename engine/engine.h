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

#include "engine/grammar.h"

struct tokenizer;
struct chat_template;

struct engine_config {
    const char *model_dir;      // NULL = built-in demo model
    const char *device;         // "cpu" or "cuda"
    const char *gemm;           // CUDA GEMMs: "invariant" (default; batch-invariant) or "cublas"
    int max_num_seqs;           // concurrent running sequences (choices); 0: 64 on the CPU, by the KV plan on a GPU
    int max_num_batched_tokens; // token budget per step (the prefill chunk), default 2048
    int max_model_len;          // prompt + output limit, default the model's max_position_embeddings
    int max_queue;              // waiting requests before submit says ENGINE_ERR_QUEUE_FULL, default 1024
    int block_size;             // full-pool block size in tokens, default 16
    size_t kv_cache_memory;     // CPU: bytes for both KV pools (0 = default 256 MiB)
    float gpu_memory_utilization; // CUDA: fraction of the card, default 0.9
    const char *duo_pattern;    // full_attention_heads.tsv or NULL (all heads retrieval)
    float duo_sparsity;         // fraction of heads made streaming, [0, 1]
    int sink_tokens, recent_tokens; // streaming heads keep these (default 64, 256)
    const char *chat_template_file; // overrides the model's template, or NULL
    int tensor_parallel_size;   // ranks the model is split over (GPUs; threads on the CPU); 0 or 1: none
    const char *load_format;    // "auto" or "safetensors" (NULL: auto): the checkpoint; "dummy": random
                                // weights made from config.json alone
    bool quiet;                 // no start-up log lines (tests)
};

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
    const char *stop_reason_str;   // FINISH by a stop string: which one (owned by the request's handle)
    int stop_index;                // FINISH by a stop string: its index in sp.stop; else -1
    int32_t stop_reason_id;        // FINISH by a stop id: which one; else -1
    double itl_s;                  // TOKEN: seconds since this choice's previous token; < 0 on its first
    int prompt_tokens, completion_tokens; // FINISH: usage of this choice
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
};

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

/* A histogram: per-bucket counts (not cumulative) over ascending upper bounds, +Inf implied. */
#define ENGINE_HIST_MAX_BOUNDS 32
struct engine_hist {
    int n_bounds;
    double bounds[ENGINE_HIST_MAX_BOUNDS];
    uint64_t counts[ENGINE_HIST_MAX_BOUNDS + 1]; // last: above every bound
    double sum;
    uint64_t count;
};
/* vLLM's bucket bounds (vllm/v1/metrics/loggers.py), so dashboards built for it read ours:
 * request latencies (e2e, queue, prefill, decode, inference) and per-token times, the latter
 * with finer bounds under vLLM's first (10 ms) because a decode step here takes a few. */
#define ENGINE_LATENCY_BOUNDS                                                                               \
    {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, \
     960.0, 1920.0, 7680.0}
#define ENGINE_TOKEN_TIME_BOUNDS                                                                           \
    {0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, \
     5.0, 7.5, 10.0, 20.0, 40.0, 80.0}

/* Bounds beyond ENGINE_HIST_MAX_BOUNDS are dropped (their values count in +Inf). */
void engine_hist_init(struct engine_hist *h, const double *bounds, int n_bounds);
void engine_hist_observe(struct engine_hist *h, double v); // NaN and negatives count as 0

/* The engine's histograms, with vLLM's names and bucket bounds (request_*: one observation per
 * finished choice, as vLLM counts each of n samples as a request). */
enum engine_hist_id {
    ENGINE_HIST_QUEUE,            // request_queue_time_seconds: queue_s
    ENGINE_HIST_PREFILL,          // request_prefill_time_seconds: prefill_s
    ENGINE_HIST_DECODE,           // request_decode_time_seconds: decode_s
    ENGINE_HIST_INFERENCE,        // request_inference_time_seconds: prefill_s + decode_s
    ENGINE_HIST_TPOT,             // time_per_output_token_seconds: itl_s of every token after a choice's first
    ENGINE_HIST_REQUEST_TPOT,     // request_time_per_output_token_seconds: decode_s / (tokens - 1), tokens > 1
    ENGINE_HIST_PROMPT_TOKENS,    // request_prompt_tokens
    ENGINE_HIST_GENERATION_TOKENS, // request_generation_tokens
    ENGINE_HIST_ITERATION_TOKENS, // iteration_tokens_total: tokens computed by one engine step
    ENGINE_HIST_N,
};

/* What vLLM publishes as cache_config_info; fixed once the engine is created. */
struct engine_cache_info {
    int block_size, num_gpu_blocks; // the full pool (the KV blocks, on the CPU too)
    int num_streaming_slots, sink_tokens, recent_tokens; // the streaming pool
    float gpu_memory_utilization;
    int cache_dtype_bytes;          // 2: bfloat16, 4: float32
};

struct engine_stats {
    int num_running, num_waiting;
    double kv_usage_full, kv_usage_streaming; // fraction in [0, 1]
    uint64_t prompt_tokens_total, generation_tokens_total, preemptions_total;
    uint64_t finished_stop, finished_length, finished_abort;
    int kv_capacity_tokens; // full-pool tokens
    double forward_seconds, sample_seconds; // cumulative time in the forward pass / in sampling
    /* Filled by engine_get_stats only (engine_core leaves them zero). */
    struct engine_cache_info cache;
    struct engine_hist hist[ENGINE_HIST_N]; // cumulative since start
};
void engine_get_stats(struct engine *e, struct engine_stats *st);

/* Read-only after engine_create; safe to use from any thread. */
const struct tokenizer *engine_tokenizer(const struct engine *e);
const struct chat_template *engine_chat_template(const struct engine *e); // NULL when the model has none
int engine_vocab_size(const struct engine *e);
int engine_max_model_len(const struct engine *e);
int engine_max_num_seqs(const struct engine *e);
const char *engine_model_dir(const struct engine *e);

const char *engine_strerror(int status);

#endif
