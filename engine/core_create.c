#include "engine/core_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/demo_model.h"
#include "engine/duo_pattern.h"
#include "engine/elog.h"

/* ---- creation ---- */

/* What besides the tokens makes the KV: the model, the head pattern and its sparsity, sink and
 * recent, the pools' dtype (all fixed for the process; the salt keeps a cache entry from ever
 * meaning two things). */
static uint64_t prefix_salt(const struct core *c) {
    char key[4200];
    snprintf(key, sizeof key, "%s|%s|%.6f|%d|%d|%d|%d", c->cfg.model_dir, c->cfg.duo_pattern ? c->cfg.duo_pattern : "",
             (double)c->cfg.duo_sparsity, c->cfg.sink_tokens, c->cfg.recent_tokens, c->cfg.block_size,
             (int)kv_cache_dtype(c->kv));
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (const char *p = key; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    return h;
}

/* Attention's speed per FLOP relative to the linear layers' GEMMs, in the scheduler's step cost.
 * Provenance: docs/PERF_NOTES.md run 66 (an H100: the same bf16 tensor-core rate as the H200),
 * Llama-3-8B shape, the default GEMMs, two prompts alone through the server (bench_long.py's fit
 * of TTFT = a N + b N^2 / 2 over 65,536 and 131,072 tokens): 28.34 us a token for the linear
 * layers (2 x 6.98e9 FLOPs: ~493 TFLOP/s) and 1,223 ps a query-key pair (524,288 FLOPs: ~429
 * TFLOP/s), 0.87; set a little lower, so that a step near the cap errs toward the decodes. (It was
 * 0.26 with the flash kernel's prefill at ~113 TFLOP/s.) To be measured again when the attention
 * kernel changes (docs/ARCHITECTURE.md, "Step cost"). */
#define CORE_ATTN_EFFICIENCY 0.85

/* The default --step-cost-budget with the wave model, in --max-num-batched-tokens. The waves charge
 * a chunk at a long prefix for the blocks it leaves idle too, so at 1 x a prompt beside a stream
 * would get fewer tokens a step than a step's time allows. A model of the steps (run 66's fit,
 * docs/PERF_NOTES.md "The next run (after runs 68-69)"; unmeasured) gives, for 131,072 tokens of
 * Llama-3-8B beside a stream on an H100, +4.7% over alone at full attention and +45% at duo 0.5 at
 * 1 x; +3.7% and +18% at 1.75 x (3,584 tokens at 2048), steps of ~105 ms, within the 150 ms a
 * stream's token may wait. */
#define CORE_WAVE_BUDGET 1.75

/* The wave model of the prefill attention, when the backend has one (a GPU): a part for each
 * layer, its retrieval heads on the busiest rank, whose per_key is that rank's share (a rank does
 * 1 / tp of the linear layers, so its heads count tp times); the least chunk one wave of the layer
 * with the most retrieval heads (sched_wave_chunk). -1: out of memory. */
static int wave_model(struct core *c, struct sched_cost *sc, double per_key) {
    const struct model_config *k = &c->m->cfg;
    int L = k->n_layers, tb, h_max = 0;
    int *heads = malloc(sizeof *heads * (size_t)L);
    if (!heads) return -1;
    int wave = model_prefill_waves(c->m, &tb, heads);
    for (int l = 0; l < L; l++) h_max = heads[l] > h_max ? heads[l] : h_max;
    if (wave == 0 || h_max == 0) { /* no blocks, or no retrieval heads to run in them */
        free(heads);
        return 0;
    }
    if (!(c->wave_parts = malloc(sizeof *c->wave_parts * (size_t)L))) {
        free(heads);
        return -1;
    }
    double share = per_key * model_tp_size(c->m) / ((double)k->n_kv_heads * L);
    for (int l = 0; l < L; l++) c->wave_parts[l] = (struct sched_wave_part){share * heads[l], heads[l]};
    free(heads);
    sc->waves = (struct sched_waves){wave, tb, L, c->wave_parts};
    sc->min_chunk = sched_wave_chunk(&sc->waves, c->cfg.block_size);
    return 0;
}

/* The scheduler's step cost from the model's shape and head pattern, in token-equivalents (a
 * token's linear layers = 1). FLOPs: the linear layers 2 a weight a token (the LM head, once per
 * sampling sequence, left out); attention 4 x head_dim a query head a visible key (QK^T and PV),
 * retrieval heads seeing every earlier key (or the sliding window), streaming heads sink + recent;
 * on a GPU the retrieval heads of a prefill chunk by their waves (wave_model). -1: out of memory. */
static int step_cost_model(struct core *c, struct sched_cost *sc) {
    const struct model_config *k = &c->m->cfg;
    double qd = (double)k->n_heads * k->head_dim, kd = (double)k->n_kv_heads * k->head_dim;
    double linear = 2.0 * k->n_layers * (k->dim * (qd + 2 * kd) + qd * k->dim + 3.0 * k->dim * k->hidden_dim);
    double attn = 4.0 * k->head_dim * k->n_heads * k->n_layers;
    int n_stream = 0;
    for (int l = 0; l < k->n_layers; l++) n_stream += c->m->n_stream[l];
    double stream_share = (double)n_stream / ((double)k->n_layers * k->n_kv_heads);
    double per_key = attn / linear / CORE_ATTN_EFFICIENCY;
    int window = c->cfg.sink_tokens + c->cfg.recent_tokens;
    if (k->sliding_window > 0 && k->sliding_window < window) window = k->sliding_window;
    sc->attn[0] = (struct sched_attn_cost){per_key * (1 - stream_share), k->sliding_window};
    sc->attn[1] = (struct sched_attn_cost){per_key * stream_share, window};
    sc->min_chunk = c->cfg.block_size;
    if (wave_model(c, sc, per_key) != 0) return -1;
    int n = c->cfg.step_cost_budget;
    if (n == 0) n = sc->waves.wave ? (int)(CORE_WAVE_BUDGET * c->max_batch) : c->max_batch;
    sc->step_budget = n < 0 ? 0 : sched_chunk_cost(sc, 0, n);
    return 0;
}

/* One line on the step cost: what a query-key pair costs, the prefill waves, the cap, and the
 * prefill chunks it leaves beside decodes as a prompt grows. */
static void log_step_cost(const struct core *c, const struct sched_cost *sc) {
    if (sc->step_budget <= 0) {
        elog("info", "step cost: no cap (prefill chunks of --max-num-batched-tokens beside decodes)");
        return;
    }
    static const int at[] = {0, 8192, 32768, 131072, 1048576};
    char chunks[160], waves[160] = "";
    size_t o = 0;
    for (size_t i = 0; i < sizeof at / sizeof at[0] && at[i] < c->max_model_len; i++) {
        int n = sched_chunk_size(sc, at[i], c->max_batch, sc->step_budget, true);
        o += (size_t)snprintf(chunks + o, sizeof chunks - o, "%s%d at %dk", i ? ", " : "", n, at[i] / 1024);
    }
    if (sc->waves.wave)
        snprintf(waves, sizeof waves,
                 "; a prefill chunk's retrieval heads by waves of %d blocks of %d tokens a KV head, at least one "
                 "wave (%d tokens)",
                 sc->waves.wave, sc->waves.block_tokens, sc->min_chunk);
    elog("info",
         "step cost: attention %.3g a query-key pair (a token's linear layers = 1; retrieval heads %.3g, "
         "streaming %.3g)%s; while requests decode a step costs at most %.0f: prefill chunks of %s tokens of "
         "prefix",
         sc->attn[0].per_key + sc->attn[1].per_key, sc->attn[0].per_key, sc->attn[1].per_key, waves,
         sc->step_budget, chunks);
}

static int plan_memory(struct core *c, char *err, size_t errlen) {
    struct kv_geometry g;
    model_kv_geometry(c->m, c->cfg.block_size, c->cfg.sink_tokens, c->cfg.recent_tokens, &g);
    size_t es = kv_cache_elem_size(c->b, c->m->kv_dtype);
    size_t block_bytes = kv_cache_block_bytes(&g, es), slot_bytes = kv_cache_slot_bytes(&g, es);
    size_t budget = c->cfg.kv_cache_memory ? c->cfg.kv_cache_memory : (size_t)256 << 20;
    size_t dev_free = 0, dev_total = 0;
    c->b->ops->mem_info(c->b, &dev_free, &dev_total);
    if (dev_total && !c->cfg.kv_cache_memory) {
        /* GPU: the card's share minus what weights and activations already hold, less a
         * reserve for logits and cuBLAS workspaces; with tensor parallelism the tightest GPU's */
        float util = c->cfg.gpu_memory_utilization > 0 ? c->cfg.gpu_memory_utilization : 0.9f;
        double want;
        if (model_kv_budget(c->m, c->cfg.block_size, c->cfg.sink_tokens, c->cfg.recent_tokens, util, &want, err,
                            errlen) != 0)
            return -1;
        budget = (size_t)want;
    }
    if (c->cfg.max_num_seqs <= 0) { /* not given: 64 on the CPU; on a GPU as many as the pool holds at
                                       1024 tokens each (a chat turn), 64 to 512 (the decode graphs) */
        int n = 64;
        if (dev_total) {
            size_t per = (block_bytes ? 1024 / (size_t)c->cfg.block_size * block_bytes : 0) + slot_bytes;
            size_t fit = per ? budget / per : 512;
            n = fit < 64 ? 64 : fit > 512 ? 512 : (int)fit;
        }
        c->cfg.max_num_seqs = n;
    }
    /* with prefix caching, half as many again for the snapshots of sequences that left (a chat
     * turn's streaming rows, waiting for the next turn) */
    bool caching = !c->cfg.no_prefix_caching && block_bytes;
    int n_slots = slot_bytes ? c->cfg.max_num_seqs + (caching ? (c->cfg.max_num_seqs + 1) / 2 : 0) : 0;
    if ((size_t)n_slots * slot_bytes > budget)
        return util_err(err, errlen, "KV budget of %zu bytes cannot hold %d streaming slots of %zu bytes", budget,
                        n_slots, slot_bytes);
    size_t left = budget - (size_t)n_slots * slot_bytes;
    /* no retrieval heads at all: blocks cost nothing, one per block_size tokens of every sequence */
    size_t n_blocks = block_bytes ? left / block_bytes
                                  : (size_t)c->cfg.max_num_seqs * (c->max_model_len / c->cfg.block_size + 1);
    if (n_blocks > (1u << 30)) n_blocks = 1u << 30;
    if (block_bytes && n_blocks < 1) return util_err(err, errlen, "KV budget of %zu bytes holds no block", budget);
    if (!(c->kv = kv_cache_new()) ||
        model_kv_cache_init(c->m, c->kv, c->cfg.block_size, c->cfg.sink_tokens, c->cfg.recent_tokens, (int)n_blocks,
                            n_slots) != KV_STATUS_OK)
        return util_err(err, errlen, "out of memory for the KV pools (%zu bytes)", budget);
    if (c->cfg.prefault_kv) kv_cache_prefault(c->kv);
    if (caching && kv_cache_enable_prefix_caching(c->kv, prefix_salt(c)) != 0)
        return util_err(err, errlen, "out of memory for the prefix cache");
    struct sched_config sc = {.max_num_seqs = c->cfg.max_num_seqs, .max_batch_tokens = c->max_batch};
    if (step_cost_model(c, &sc.cost) != 0 || sched_init(&c->sched, &sc, c->kv) != 0)
        return util_err(err, errlen, "out of memory");
    c->stats.kv_capacity_tokens = block_bytes ? (int)(n_blocks * c->cfg.block_size) : 0;
    const struct model_config *mc = &c->m->cfg;
    int n_stream_total = 0;
    for (int l = 0; l < mc->n_layers; l++) n_stream_total += c->m->n_stream[l];
    if (c->cfg.quiet) return 0;
    elog("info",
         "KV cache: %s, full pool %zu blocks x %d tokens = %zu tokens (%zu B/token), streaming pool %d slots "
         "x %d tokens (%zu B/slot); %d of %d KV heads streaming; max concurrency at %d tokens: %zu; prefix "
         "caching %s",
         core_kv_dtype(c), n_blocks, c->cfg.block_size, n_blocks * c->cfg.block_size, block_bytes / c->cfg.block_size, n_slots,
         c->cfg.sink_tokens + c->cfg.recent_tokens, slot_bytes, n_stream_total, mc->n_layers * mc->n_kv_heads,
         c->max_model_len,
         block_bytes ? n_blocks / ((size_t)(c->max_model_len + c->cfg.block_size - 1) / c->cfg.block_size)
                     : (size_t)n_slots,
         !caching ? "off" : slot_bytes ? "on (with snapshots of the streaming heads' slots)" : "on");
    if (n_stream_total) {
        char line[1024];
        size_t o = 0;
        for (int l = 0; l < mc->n_layers && o < sizeof line - 8; l++)
            o += (size_t)snprintf(line + o, sizeof line - o, "%s%d", l ? " " : "", c->m->n_stream[l]);
        elog("info", "streaming KV heads per layer: %s (sink %d, recent %d)", line, c->cfg.sink_tokens,
             c->cfg.recent_tokens);
    }
    log_step_cost(c, &sc.cost);
    return 0;
}

static void fill_defaults(struct engine_config *cfg) {
    if (cfg->max_num_batched_tokens <= 0) cfg->max_num_batched_tokens = 2048;
    if (cfg->max_queue <= 0) cfg->max_queue = 1024;
    if (cfg->block_size <= 0) cfg->block_size = 16;
    if (cfg->sink_tokens <= 0) cfg->sink_tokens = 64;
    if (cfg->recent_tokens <= 0) cfg->recent_tokens = 256;
    if (!cfg->device) cfg->device = "cpu";
}

/* The backend --device names ("auto": the GPU when there is one, else the CPU). *why and *why_level
 * say why auto fell back to the CPU (said after loading, so that a bad model directory is one line). */
static int pick_backend(struct core *c, int cuda_flags, char *why, size_t whylen, const char **why_level, char *err,
                        size_t errlen) {
    if (!strcmp(c->cfg.device, "auto")) {
        int probe = backend_cuda_probe(0, why, whylen);
        if (probe == BACKEND_CUDA_BAD_SETTING) return util_err(err, errlen, "%s", why); /* not a reason to run on the CPU */
        if (probe == BACKEND_CUDA_OK) c->b = backend_cuda_create(0, cuda_flags, why, whylen);
        c->cfg.device = c->b ? "cuda" : "cpu";
        /* no GPU is the normal case on a CPU machine; a GPU it cannot use is worth a warning */
        if (!c->b) *why_level = probe == BACKEND_CUDA_NONE ? "info" : "warning";
    }
    if (c->b) return 0;
    if (!strcmp(c->cfg.device, "cuda")) {
        c->b = backend_cuda_create(0, cuda_flags, why, whylen);
        if (!c->b) {
            char tmp[300];
            bool setting = backend_cuda_probe(0, tmp, sizeof tmp) == BACKEND_CUDA_BAD_SETTING; /* not the GPU's fault */
            return util_err(err, errlen, "--device cuda: %s%s", why,
                            setting ? "" : "; --device auto or cpu runs on the CPU");
        }
    } else if (!(c->b = backend_cpu_create())) {
        return util_err(err, errlen, "out of memory");
    }
    return 0;
}

/* --max-model-len: the model's max_position_embeddings when not given; longer only with
 * DUOSERVE_ALLOW_LONG_MAX_MODEL_LEN=1 (vLLM's VLLM_ALLOW_LONG_MAX_MODEL_LEN: positions past what the
 * model was trained on may give wrong outputs), never cut short in silence. */
static int set_max_model_len(struct core *c, char *err, size_t errlen) {
    int want = c->cfg.max_model_len, max_pos = c->m->cfg.max_pos;
    const char *allow = getenv("DUOSERVE_ALLOW_LONG_MAX_MODEL_LEN");
    c->max_model_len = want > 0 ? want : max_pos;
    if (want <= max_pos) return 0;
    if (!allow || strcmp(allow, "1"))
        return util_err(err, errlen,
                        "--max-model-len %d is longer than the model's max_position_embeddings (%d): outputs past "
                        "that may be wrong; set DUOSERVE_ALLOW_LONG_MAX_MODEL_LEN=1 to allow it",
                        want, max_pos);
    if (!c->cfg.quiet)
        elog("warning", "--max-model-len %d is longer than the model's max_position_embeddings (%d) "
                        "(DUOSERVE_ALLOW_LONG_MAX_MODEL_LEN=1)", want, max_pos);
    return 0;
}

/* --kv-cache-dtype on the backend chosen: auto (the activation dtype), bf16 (the activation dtype on
 * a bf16 backend) or fp8 (e4m3). */
static int kv_dtype_of(const struct core *c, enum kv_dtype *out, char *err, size_t errlen) {
    const char *v = c->cfg.kv_cache_dtype;
    *out = KV_DTYPE_ACT;
    if (!v || !strcmp(v, "auto")) return 0;
    if (!strcmp(v, "bf16") || !strcmp(v, "bfloat16")) *out = c->b->ops->act_size == 2 ? KV_DTYPE_ACT : KV_DTYPE_BF16;
    else if (!strcmp(v, "fp8") || !strcmp(v, "fp8_e4m3")) *out = KV_DTYPE_FP8_E4M3;
    else return util_err(err, errlen, "kv cache dtype \"%s\" is not auto, bf16, bfloat16, fp8 or fp8_e4m3", v);
    if (*out != KV_DTYPE_ACT && !(c->b->ops->kv_dtypes & 1u << *out))
        return util_err(err, errlen, "--kv-cache-dtype %s is not implemented on the %s backend yet", v,
                        !strcmp(c->b->name, "cuda") ? "CUDA" : c->b->name);
    return 0;
}

/* The head pattern (--duo-pattern) as a streaming mask [n_layers * n_kv_heads] checked against the
 * model's shape; *out NULL without a pattern. */
static int load_pattern(const struct core *c, const struct model_config *mc, uint8_t **out, char *err, size_t errlen) {
    *out = NULL;
    if (!c->cfg.duo_pattern) return 0;
    struct duo_pattern p;
    if (duo_pattern_load(&p, c->cfg.duo_pattern, err, errlen) != 0) return -1;
    int rc = 0;
    if (p.n_layers != mc->n_layers || p.n_kv_heads != mc->n_kv_heads)
        rc = util_err(err, errlen, "%s: pattern has %d layers x %d KV heads, the model %d x %d", c->cfg.duo_pattern,
                      p.n_layers, p.n_kv_heads, mc->n_layers, mc->n_kv_heads);
    else if (!(c->cfg.duo_sparsity >= 0.0f && c->cfg.duo_sparsity <= 1.0f))
        rc = util_err(err, errlen, "--duo-sparsity must be in [0, 1]");
    else if (!(*out = calloc((size_t)mc->n_layers * mc->n_kv_heads, 1)))
        rc = util_err(err, errlen, "out of memory");
    else
        duo_pattern_streaming(&p, c->cfg.duo_sparsity, *out);
    duo_pattern_free(&p);
    return rc;
}

static void log_loaded(const struct core *c, const char *dir, bool dummy, double t_load) {
    const struct model_config *k = &c->m->cfg;
    double qd = (double)k->n_heads * k->head_dim, kd = (double)k->n_kv_heads * k->head_dim;
    double params = (double)k->vocab_size * k->dim * (k->tie_embeddings ? 1 : 2) + k->dim +
                    (double)k->n_layers * (k->dim * (qd + 2 * kd) + qd * k->dim + 3.0 * k->dim * k->hidden_dim + 2.0 * k->dim);
    char where[48];
    int tp = model_tp_size(c->m);
    if (tp > 1) snprintf(where, sizeof where, "%s, tensor parallel over %d", c->b->name, tp);
    else snprintf(where, sizeof where, "%s", c->b->name);
    elog("info", "loaded %s (%s, %d layers, %.2f%s parameters, %.2f GiB on %s%s) in %.1f s", dir,
         model_arch_name(k->arch), k->n_layers, params >= 1e9 ? params / 1e9 : params / 1e6,
         params >= 1e9 ? "B" : "M", params * c->b->ops->act_size / 1073741824.0, where,
         dummy ? ", dummy weights" : "", util_now() - t_load);
}

/* The tokenizer (when the model has one) and the EOS ids: config.json's and the tokenizer's. */
static int load_tokenizer(struct core *c, const char *dir, char *err, size_t errlen) {
    char terr[512];
    char *tj = util_path_join(dir, "tokenizer.json");
    bool has_tok_file = tj && access(tj, R_OK) == 0;
    free(tj);
    if (has_tok_file) {
        if (tokenizer_load(&c->tok, dir, terr, sizeof terr) != 0) return util_err(err, errlen, "%s", terr);
    } else if (!c->cfg.quiet) {
        elog("info", "%s has no tokenizer.json: token ids only (no text prompts or stop strings)", dir);
    }
    for (int i = 0; i < c->m->cfg.n_eos && c->n_eos < 16; i++) c->eos[c->n_eos++] = c->m->cfg.eos_ids[i];
    if (c->tok) {
        const int32_t *ids;
        size_t n = tokenizer_eos_ids(c->tok, &ids);
        for (size_t i = 0; i < n && c->n_eos < 16; i++) {
            bool dup = false;
            for (int j = 0; j < c->n_eos; j++) dup |= c->eos[j] == ids[i];
            if (!dup && ids[i] >= 0 && ids[i] < c->vocab) c->eos[c->n_eos++] = ids[i];
        }
    }
    if (c->tok && grammar_cache_create(&c->gcache, c->tok, c->vocab) != 0) return util_err(err, errlen, "out of memory");
    return 0;
}

/* The step's host arrays. */
static int alloc_step_arrays(struct core *c) {
    int S = c->cfg.max_num_seqs, T = c->max_batch, V = c->vocab;
    c->b_tokens = malloc(sizeof(int32_t) * T);
    c->b_pos = malloc(sizeof(int32_t) * T);
    c->b_seq_start = malloc(sizeof(int32_t) * (S + 1));
    c->b_indptr = malloc(sizeof(int32_t) * (S + 1));
    c->b_slots = malloc(sizeof(int32_t) * S);
    c->b_rows = malloc(sizeof(int32_t) * S);
    c->logits = malloc(sizeof(float) * (size_t)S * V);
    c->greedy_ids = malloc(sizeof(int32_t) * S);
    c->work = malloc(sizeof(float) * V);
    c->scratch = malloc(sizeof(float) * SAMPLER_SCRATCH_ROWS * (size_t)V);
    c->lp = malloc(sizeof(float) * V);
    c->draws_cap = S;
    c->draws = malloc(sizeof *c->draws * S);
    c->srows = malloc(sizeof *c->srows * S);
    c->sids = malloc(sizeof *c->sids * S);
    c->failed = malloc(sizeof *c->failed * S);
    c->work_bits = malloc(sizeof *c->work_bits * (((size_t)V + 31) / 32));
    bool ok = c->failed && c->work_bits && c->b_tokens && c->b_pos && c->b_seq_start && c->b_indptr && c->b_slots &&
              c->b_rows && c->logits && c->greedy_ids && c->work && c->scratch && c->lp && c->draws && c->srows && c->sids;
    return ok ? 0 : -1;
}

int core_create(struct core **out, const struct engine_config *cfg_in, char *err, size_t errlen) {
    *out = NULL;
    struct core *c = calloc(1, sizeof *c);
    if (!c) return util_err(err, errlen, "out of memory");
    c->cfg = *cfg_in;
    fill_defaults(&c->cfg);
    static char demo_dir[4096];
    const char *dir = c->cfg.model_dir;
    if (!dir) {
        if (demo_model_ensure(demo_dir, sizeof demo_dir, err, errlen) != 0) goto fail;
        dir = demo_dir;
        elog("info", "no -m given: using the built-in demo model (random weights, its text is noise) in %s", dir);
    }
    c->cfg.model_dir = dir;
    if (model_config_check_dir(dir, err, errlen) != 0) goto fail;
    int cuda_flags = 0;
    if (c->cfg.gemm && !strcmp(c->cfg.gemm, "cublas")) cuda_flags |= BACKEND_CUDA_CUBLAS;
    else if (c->cfg.gemm && strcmp(c->cfg.gemm, "invariant")) {
        util_err(err, errlen, "gemm \"%s\" is not invariant or cublas", c->cfg.gemm);
        goto fail;
    }
    char why[300] = "";
    const char *why_level = NULL;
    if (pick_backend(c, cuda_flags, why, sizeof why, &why_level, err, errlen) != 0) goto fail;
    struct model_config mc;
    uint8_t *streaming = NULL;
    enum kv_dtype kv_dtype;
    if (kv_dtype_of(c, &kv_dtype, err, errlen) != 0) goto fail;
    if (model_config_load(&mc, dir, err, errlen) != 0 || load_pattern(c, &mc, &streaming, err, errlen) != 0) goto fail;
    if (!strcmp(c->cfg.device, "cuda") && mc.head_dim > 256) {
        util_err(err, errlen, "%s: head_dim %d is larger than the CUDA attention kernels support (256)", dir, mc.head_dim);
        free(streaming);
        goto fail;
    }
    c->max_batch = c->cfg.max_num_batched_tokens;
    util_rng_seed(&c->seed_rng, (uint64_t)(util_now() * 1e9) ^ (uint64_t)getpid());
    double t_load = util_now();
    bool dummy = c->cfg.load_format && !strcmp(c->cfg.load_format, "dummy");
    if (c->cfg.load_format && !dummy && strcmp(c->cfg.load_format, "auto") && strcmp(c->cfg.load_format, "safetensors")) {
        util_err(err, errlen, "load format \"%s\" is not auto, safetensors or dummy", c->cfg.load_format);
        free(streaming);
        goto fail;
    }
    struct model_load_opts lo = {.max_tokens = c->max_batch, .streaming = streaming,
                                 .tensor_parallel_size = c->cfg.tensor_parallel_size, .cuda_flags = cuda_flags,
                                 .dummy = dummy, .kv_dtype = kv_dtype};
    int rc = model_load_with(&c->m, dir, c->b, &lo, err, errlen);
    free(streaming);
    if (rc) goto fail;
    if (!c->cfg.quiet) log_loaded(c, dir, dummy, t_load);
    if (why_level && !c->cfg.quiet) elog(why_level, "running on the CPU: %s", why);
    c->vocab = c->m->cfg.vocab_size;
    if (set_max_model_len(c, err, errlen) != 0) goto fail;
    if (load_tokenizer(c, dir, err, errlen) != 0 || plan_memory(c, err, errlen) != 0) goto fail;
    if (alloc_step_arrays(c) != 0) {
        util_err(err, errlen, "out of memory");
        goto fail;
    }
    *out = c;
    return 0;
fail:
    core_free(c);
    return -1;
}

void core_free(struct core *c) {
    if (!c) return;
    for (struct sched_seq *q; c->kv && (q = sched_any(&c->sched));)
        core_abort_request(c, ((struct core_seq *)q)->req);
    core_reap(c);
    sched_free(&c->sched);
    free(c->wave_parts);
    kv_cache_delete(c->kv);
    model_free(c->m);
    grammar_cache_free(c->gcache);
    tokenizer_free(c->tok);
    backend_destroy(c->b);
    free(c->b_tokens);
    free(c->b_pos);
    free(c->b_seq_start);
    free(c->b_indptr);
    free(c->b_blocks);
    free(c->b_slots);
    free(c->b_rows);
    free(c->logits);
    free(c->greedy_ids);
    free(c->work);
    free(c->scratch);
    free(c->lp);
    free(c->draws);
    free(c->srows);
    free(c->sids);
    free(c->failed);
    free(c->work_bits);
    free(c);
}

