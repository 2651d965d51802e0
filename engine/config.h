/* config: what an engine is created with (engine_create, core_create). */
#ifndef DUO_CONFIG_H
#define DUO_CONFIG_H

#include <stdbool.h>
#include <stddef.h>

struct engine_config {
    const char *model_dir;      // NULL = built-in demo model
    const char *device;         // "cpu" or "cuda"
    const char *gemm;           // CUDA GEMMs: "invariant" (default; batch-invariant) or "cublas"
    int max_num_seqs;           // concurrent running sequences (choices); 0: 64 on the CPU, by the KV plan on a GPU
    int max_num_batched_tokens; // token budget per step (the prefill chunk), default 2048
    int step_cost_budget;       // while requests decode, a step costs at most what this many prompt tokens
                                // from position 0 cost (attention over a long prefix counts extra, so a
                                // prompt's chunks shrink as it grows); 0: max_num_batched_tokens, 1.75 x
                                // that on a backend with prefill waves (a GPU); < 0: no cap
    int max_model_len;          // prompt + output limit, default the model's max_position_embeddings
    int max_queue;              // waiting requests before submit says ENGINE_ERR_QUEUE_FULL, default 1024
    int block_size;             // full-pool block size in tokens, default 16
    size_t kv_cache_memory;     // CPU: bytes for both KV pools (0 = default 256 MiB)
    const char *kv_cache_dtype; // the KV pools' elements: "auto" (NULL; the activation dtype: f32 on the CPU,
                                // bf16 on CUDA), "bf16" ("bfloat16") or "fp8" ("fp8_e4m3": e4m3, 1 byte)
    float gpu_memory_utilization; // CUDA: fraction of the card, default 0.9
    const char *duo_pattern;    // full_attention_heads.tsv or NULL (all heads retrieval)
    float duo_sparsity;         // fraction of heads made streaming, [0, 1]
    int sink_tokens, recent_tokens; // streaming heads keep these (default 64, 256)
    int tensor_parallel_size;   // ranks the model is split over (GPUs; threads on the CPU); 0 or 1: none
    const char *load_format;    // "auto" or "safetensors" (NULL: auto): the checkpoint; "dummy": random
                                // weights made from config.json alone
    bool prefault_kv;           // the KV pools resident from the start (the server), not as first used
    bool no_prefix_caching;     // prefix caching is on unless this says otherwise (--no-enable-prefix-caching)
    bool quiet;                 // no start-up log lines (tests)
};

#endif
