/* stats: the engine's counters and histograms, with vLLM's names and bucket bounds (what
 * /metrics publishes). */
#ifndef DUO_STATS_H
#define DUO_STATS_H

#include <stdbool.h>
#include <stdint.h>

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
    const char *cache_dtype;        // the KV pools' elements: "float32", "bfloat16" or "fp8_e4m3" (static)
    bool enable_prefix_caching;
};

struct engine_stats {
    int num_running, num_waiting;
    double kv_usage_full, kv_usage_streaming; // fraction in [0, 1]
    uint64_t prompt_tokens_total, generation_tokens_total, preemptions_total;
    uint64_t prefix_cache_queries, prefix_cache_hits; // prompt tokens looked up in the prefix cache, and found
    int prefix_cache_blocks;                           // full-pool blocks the prefix cache addresses
    uint64_t finished_stop, finished_length, finished_abort;
    int kv_capacity_tokens; // full-pool tokens
    double forward_seconds, sample_seconds; // cumulative time in the forward pass / in sampling
    /* Filled by engine_get_stats only (engine_core leaves them zero). */
    struct engine_cache_info cache;
    struct engine_hist hist[ENGINE_HIST_N]; // cumulative since start
};

#endif
