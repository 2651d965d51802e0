#include "engine/engine_core.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/demo_model.h"
#include "engine/duo_pattern.h"
#include "engine/elog.h"
#include "engine/grammar_cache.h"
#include "engine/sampler.h"
#include "engine/text/tokenizer.h"
#include "engine/text/utf8.h"
#include "engine/util.h"

enum seq_state { SEQ_WAITING, SEQ_RUNNING, SEQ_DONE };

struct core_seq {
    struct core_request *req;
    int choice;
    enum seq_state state;
    int32_t *tokens; // prompt + generated
    int n_tokens, cap;
    int n_computed;  // tokens whose K/V are in the pools
    int32_t *blocks; // full-pool block table
    int n_blocks, blocks_cap;
    int32_t slot;    // streaming slot or -1
    int forks_pending; // choices still to fork from this one once its prompt is computed
    uint64_t admit_order;
    struct sampler_seq smp;
    struct tokenizer_stream detok;
    char *text;      // generated text (after any stop-string cut)
    size_t text_len, text_cap, emitted;
    size_t text_chars, emitted_chars; // code points in text[0, text_len) and text[0, emitted)
    int n_generated;
    double t_scheduled, t_first, t_last; // first admission (kept across preemptions), first and last token
    struct grammar_state *gs; // structured output: where the text is in the grammar (kept across preemptions:
                              // the generated tokens are kept, only their KV is recomputed)
    uint32_t *allow;          // [mask words] the tokens of the next draw (sampler_seq.allow points here)
};

struct core_request {
    struct core *core;
    core_emit_fn emit;
    void *ud;
    struct engine_sampling sp; // owns the arrays below
    int32_t *prompt;
    int n_prompt;
    int32_t *mask;             // [n_mask] EOS and stop ids: masked while a choice has fewer than min_tokens
    int n_mask;
    int n_choices, n_done;
    struct core_seq **seqs;    // [n_choices], created lazily by forks
    size_t max_stop_len;
    double t_arrival;
    struct grammar_cache_entry *ge; // structured output: the grammar (held), or NULL
    struct token_mask *tm;          // its token masks (the entry's)
    bool failed;                    // a choice left the grammar this step: ERROR, then aborted
    char fail_msg[200];
};

struct seq_list {
    struct core_seq **v;
    int n, cap;
};

/* A token a step samples: from logits row `row`, by the sample op (op >= 0: its index there) or
 * already known (id). */
struct core_draw {
    struct core_seq *seq;
    int row, op;
    int32_t id;
};

struct core {
    struct engine_config cfg;
    struct backend *b;
    struct model *m;
    struct tokenizer *tok;
    struct kv_cache kv;
    bool has_full, has_stream;
    int vocab, max_model_len, max_batch;
    int32_t eos[16];
    int n_eos;
    struct seq_list waiting, running; // running ordered by admit_order
    int reserved;                     // seats and slots promised to forks of running parents
    uint64_t next_admit;
    // step scratch
    int32_t *b_tokens, *b_pos, *b_seq_start, *b_indptr, *b_blocks, *b_slots, *b_rows;
    int b_blocks_cap;
    struct core_seq **b_seqs;
    int *b_want;
    float *logits, *work, *scratch, *lp; // scratch: [SAMPLER_SCRATCH_ROWS * vocab]
    int32_t *greedy_ids; // [max_num_seqs] argmax of each logits row, when the step needs no more
    uint32_t *work_bits; // [(vocab + 31) / 32] a mask's scratch copy
    struct core_draw *draws;  // [draws_cap] this step's tokens, in accept order
    struct sample_row *srows; // [draws_cap] the draws the sample op makes
    int32_t *sids;            // [draws_cap] their ids
    int draws_cap;
    double t_tokens; // when this step's tokens come out
    struct grammar_cache *gcache;     // compiled grammars (NULL without a tokenizer)
    struct core_request **failed;     // [max_num_seqs] requests that failed this step
    int n_failed;
    struct engine_stats stats;
    struct util_rng seed_rng; // seeds of requests that give none
};

/* ---- small containers ---- */

static int list_push(struct seq_list *l, struct core_seq *s) {
    if (l->n == l->cap) {
        int nc = l->cap ? l->cap * 2 : 16;
        struct core_seq **nv = realloc(l->v, sizeof *nv * nc);
        if (!nv) return -1;
        l->v = nv;
        l->cap = nc;
    }
    l->v[l->n++] = s;
    return 0;
}

static int list_push_front(struct seq_list *l, struct core_seq *s) {
    if (list_push(l, s)) return -1;
    memmove(l->v + 1, l->v, sizeof *l->v * (l->n - 1));
    l->v[0] = s;
    return 0;
}

static void list_remove(struct seq_list *l, struct core_seq *s) {
    for (int i = 0; i < l->n; i++)
        if (l->v[i] == s) {
            memmove(l->v + i, l->v + i + 1, sizeof *l->v * (l->n - i - 1));
            l->n--;
            return;
        }
}

static int grow(void **p, int *cap, int need, size_t elem) {
    if (need <= *cap) return 0;
    int nc = *cap ? *cap : 16;
    while (nc < need) nc *= 2;
    void *np = realloc(*p, elem * (size_t)nc);
    if (!np) return -1;
    *p = np;
    *cap = nc;
    return 0;
}

static int text_append(struct core_seq *s, const char *p, size_t n) {
    if (s->text_len + n + 1 > s->text_cap) {
        size_t nc = s->text_cap ? s->text_cap * 2 : 256;
        while (nc < s->text_len + n + 1) nc *= 2;
        char *nt = realloc(s->text, nc);
        if (!nt) return -1;
        s->text = nt;
        s->text_cap = nc;
    }
    memcpy(s->text + s->text_len, p, n);
    s->text_len += n;
    s->text[s->text_len] = 0;
    s->text_chars += utf8_count(p, n);
    return 0;
}

/* Marks text up to byte `upto` as sent. */
static void text_emitted(struct core_seq *s, size_t upto) {
    if (upto <= s->emitted) return;
    s->emitted_chars += utf8_count(s->text + s->emitted, upto - s->emitted);
    s->emitted = upto;
}

/* ---- creation ---- */

static int plan_memory(struct core *c, char *err, size_t errlen) {
    struct kv_geometry g;
    model_kv_geometry(c->m, c->cfg.block_size, c->cfg.sink_tokens, c->cfg.recent_tokens, &g);
    size_t es = c->b->ops->act_size;
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
    int n_slots = slot_bytes ? c->cfg.max_num_seqs : 0;
    if ((size_t)n_slots * slot_bytes > budget)
        return util_err(err, errlen, "KV budget of %zu bytes cannot hold %d streaming slots of %zu bytes", budget,
                        n_slots, slot_bytes);
    size_t left = budget - (size_t)n_slots * slot_bytes;
    /* no retrieval heads at all: blocks cost nothing, one per block_size tokens of every sequence */
    size_t n_blocks = block_bytes ? left / block_bytes
                                  : (size_t)c->cfg.max_num_seqs * (c->max_model_len / c->cfg.block_size + 1);
    if (n_blocks > (1u << 30)) n_blocks = 1u << 30;
    if (block_bytes && n_blocks < 1) return util_err(err, errlen, "KV budget of %zu bytes holds no block", budget);
    if (model_kv_cache_init(c->m, &c->kv, c->cfg.block_size, c->cfg.sink_tokens, c->cfg.recent_tokens, (int)n_blocks,
                            n_slots) != KV_STATUS_OK)
        return util_err(err, errlen, "out of memory for the KV pools (%zu bytes)", budget);
    c->has_full = block_bytes > 0;
    c->has_stream = slot_bytes > 0;
    c->stats.kv_capacity_tokens = c->has_full ? (int)(n_blocks * c->cfg.block_size) : 0;
    const struct model_config *mc = &c->m->cfg;
    int n_stream_total = 0;
    for (int l = 0; l < mc->n_layers; l++) n_stream_total += c->m->n_stream[l];
    if (c->cfg.quiet) return 0;
    elog("info",
         "KV cache: full pool %zu blocks x %d tokens = %zu tokens (%zu B/token), streaming pool %d slots "
         "x %d tokens (%zu B/slot); %d of %d KV heads streaming; max concurrency at %d tokens: %zu",
         n_blocks, c->cfg.block_size, n_blocks * c->cfg.block_size, block_bytes / c->cfg.block_size, n_slots,
         c->cfg.sink_tokens + c->cfg.recent_tokens, slot_bytes, n_stream_total, mc->n_layers * mc->n_kv_heads,
         c->max_model_len,
         c->has_full ? n_blocks / ((size_t)(c->max_model_len + c->cfg.block_size - 1) / c->cfg.block_size)
                     : (size_t)n_slots);
    if (n_stream_total) {
        char line[1024];
        size_t o = 0;
        for (int l = 0; l < mc->n_layers && o < sizeof line - 8; l++)
            o += (size_t)snprintf(line + o, sizeof line - o, "%s%d", l ? " " : "", c->m->n_stream[l]);
        elog("info", "streaming KV heads per layer: %s (sink %d, recent %d)", line, c->cfg.sink_tokens,
             c->cfg.recent_tokens);
    }
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

int core_create(struct core **out, const struct engine_config *cfg_in, char *err, size_t errlen) {
    *out = NULL;
    struct core *c = calloc(1, sizeof *c);
    if (!c) return util_err(err, errlen, "out of memory");
    c->cfg = *cfg_in;
    fill_defaults(&c->cfg);
    static char demo_dir[4096];
    int rc = 0;
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
    const char *why_level = NULL; /* said after loading, so that a bad model directory is one line */
    if (!strcmp(c->cfg.device, "auto")) { /* the GPU when there is one, else the CPU */
        int probe = backend_cuda_probe(0, why, sizeof why);
        if (probe == BACKEND_CUDA_OK) c->b = backend_cuda_create(0, cuda_flags, why, sizeof why);
        c->cfg.device = c->b ? "cuda" : "cpu";
        /* no GPU is the normal case on a CPU machine; a GPU it cannot use is worth a warning */
        if (!c->b) why_level = probe == BACKEND_CUDA_NONE ? "info" : "warning";
    }
    if (c->b) {
    } else if (!strcmp(c->cfg.device, "cuda")) {
        c->b = backend_cuda_create(0, cuda_flags, why, sizeof why);
        if (!c->b) util_err(err, errlen, "--device cuda: %s; --device auto or cpu runs on the CPU", why);
    } else {
        c->b = backend_cpu_create();
        if (!c->b) util_err(err, errlen, "out of memory");
    }
    if (!c->b) goto fail;
    /* head pattern -> streaming mask, checked against the model's shape */
    struct model_config mc;
    uint8_t *streaming = NULL;
    if (model_config_load(&mc, dir, err, errlen) != 0) goto fail;
    if (c->cfg.duo_pattern) {
        struct duo_pattern p;
        if (duo_pattern_load(&p, c->cfg.duo_pattern, err, errlen) != 0) goto fail;
        if (p.n_layers != mc.n_layers || p.n_kv_heads != mc.n_kv_heads) {
            util_err(err, errlen, "%s: pattern has %d layers x %d KV heads, the model %d x %d", c->cfg.duo_pattern,
                     p.n_layers, p.n_kv_heads, mc.n_layers, mc.n_kv_heads);
            duo_pattern_free(&p);
            goto fail;
        }
        if (!(c->cfg.duo_sparsity >= 0.0f && c->cfg.duo_sparsity <= 1.0f)) {
            util_err(err, errlen, "--duo-sparsity must be in [0, 1]");
            duo_pattern_free(&p);
            goto fail;
        }
        streaming = calloc((size_t)mc.n_layers * mc.n_kv_heads, 1);
        if (streaming) duo_pattern_streaming(&p, c->cfg.duo_sparsity, streaming);
        duo_pattern_free(&p);
        if (!streaming) {
            util_err(err, errlen, "out of memory");
            goto fail;
        }
    }
    if (!strcmp(c->cfg.device, "cuda") && mc.head_dim > 256) {
        util_err(err, errlen, "%s: head_dim %d is larger than the CUDA attention kernels support (256)", dir, mc.head_dim);
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
                                 .dummy = dummy};
    rc = model_load_with(&c->m, dir, c->b, &lo, err, errlen);
    free(streaming);
    if (rc) goto fail;
    if (!c->cfg.quiet) {
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
    if (why_level && !c->cfg.quiet) elog(why_level, "running on the CPU: %s", why);
    c->vocab = c->m->cfg.vocab_size;
    c->max_model_len = c->cfg.max_model_len > 0 && c->cfg.max_model_len < c->m->cfg.max_pos ? c->cfg.max_model_len
                                                                                              : c->m->cfg.max_pos;
    char terr[512];
    char *tj = util_path_join(dir, "tokenizer.json");
    bool has_tok_file = tj && access(tj, R_OK) == 0;
    free(tj);
    if (has_tok_file) {
        if (tokenizer_load(&c->tok, dir, terr, sizeof terr) != 0) {
            util_err(err, errlen, "%s", terr);
            goto fail;
        }
    } else {
        if (!c->cfg.quiet) elog("info", "%s has no tokenizer.json: token ids only (no text prompts or stop strings)", dir);
    }
    /* EOS ids: config.json's and the tokenizer's */
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
    if (c->tok && grammar_cache_create(&c->gcache, c->tok, c->vocab) != 0) {
        util_err(err, errlen, "out of memory");
        goto fail;
    }
    if (plan_memory(c, err, errlen) != 0) goto fail;
    int S = c->cfg.max_num_seqs, T = c->max_batch, V = c->vocab;
    c->b_tokens = malloc(sizeof(int32_t) * T);
    c->b_pos = malloc(sizeof(int32_t) * T);
    c->b_seq_start = malloc(sizeof(int32_t) * (S + 1));
    c->b_indptr = malloc(sizeof(int32_t) * (S + 1));
    c->b_slots = malloc(sizeof(int32_t) * S);
    c->b_rows = malloc(sizeof(int32_t) * S);
    c->b_seqs = malloc(sizeof(*c->b_seqs) * S);
    c->b_want = malloc(sizeof(int) * S);
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
    if (!c->failed || !c->work_bits || !c->b_tokens || !c->b_pos || !c->b_seq_start || !c->b_indptr || !c->b_slots || !c->b_rows || !c->b_seqs ||
        !c->b_want || !c->logits || !c->greedy_ids || !c->work || !c->scratch || !c->lp || !c->draws || !c->srows ||
        !c->sids) {
        util_err(err, errlen, "out of memory");
        goto fail;
    }
    *out = c;
    return 0;
fail:
    core_free(c);
    return -1;
}

static void seq_free(struct core *c, struct core_seq *s) {
    if (!s) return;
    if (s->n_blocks) kv_cache_release(&c->kv, s->blocks, s->n_blocks);
    if (s->slot >= 0) kv_cache_release_slot(&c->kv, s->slot);
    sampler_seq_free(&s->smp);
    grammar_state_free(s->gs);
    free(s->allow);
    if (c->tok) tokenizer_stream_free(&s->detok);
    free(s->tokens);
    free(s->blocks);
    free(s->text);
    free(s);
}

static void request_free(struct core_request *r) {
    struct core *c = r->core;
    for (int i = 0; i < r->n_choices; i++) {
        struct core_seq *s = r->seqs[i];
        if (!s) continue;
        list_remove(&c->waiting, s);
        list_remove(&c->running, s);
        seq_free(c, s);
    }
    free(r->seqs);
    if (r->ge) {
        grammar_cache_measure(c->gcache, r->ge);
        grammar_cache_release(c->gcache, r->ge);
    }
    free(r->prompt);
    free(r->mask);
    free((void *)r->sp.logit_bias_ids);
    free((void *)r->sp.logit_bias_vals);
    free((void *)r->sp.stop_ids);
    for (int i = 0; r->sp.stop && i < r->sp.n_stop; i++) free(r->sp.stop[i]);
    free((void *)r->sp.stop);
    free((void *)r->sp.stop_len);
    free(r);
}

void core_free(struct core *c) {
    if (!c) return;
    while (c->running.n) core_abort(c, c->running.v[0]->req);
    while (c->waiting.n) core_abort(c, c->waiting.v[0]->req);
    free(c->waiting.v);
    free(c->running.v);
    kv_cache_free(&c->kv);
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
    free(c->b_seqs);
    free(c->b_want);
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

/* ---- requests ---- */

static struct core_seq *seq_new(struct core *c, struct core_request *r, int choice, const int32_t *tokens, int n) {
    struct core_seq *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->req = r;
    s->choice = choice;
    s->slot = -1;
    s->cap = n + r->sp.max_tokens + 1;
    s->tokens = malloc(sizeof(int32_t) * s->cap);
    if (!s->tokens) {
        free(s);
        return NULL;
    }
    memcpy(s->tokens, tokens, sizeof(int32_t) * n);
    s->n_tokens = n;
    return s;
}

/* Starts the per-choice state: sampler and detokenizer primed with the prompt, the grammar at
 * the start of the text (forks start after the prompt, when their parent's state is that too). */
static int seq_start_output(struct core *c, struct core_seq *s) {
    struct core_request *r = s->req;
    uint64_t seed = r->sp.has_seed ? r->sp.seed : util_rng_next(&c->seed_rng);
    if (sampler_seq_init(&s->smp, &r->sp, seed, s->choice, c->vocab, r->prompt, r->n_prompt) != 0) return -1;
    if (r->ge) {
        if (grammar_state_init(&s->gs, grammar_cache_grammar(r->ge)) != 0) return -1;
        if (!(s->allow = malloc(sizeof *s->allow * grammar_cache_mask_words(c->gcache)))) return -1;
    }
    if (c->tok) {
        tokenizer_stream_init(&s->detok, c->tok, r->sp.skip_special_tokens);
        if (tokenizer_stream_prime(&s->detok, r->prompt, (size_t)r->n_prompt) != 0) return -1;
    }
    return 0;
}

int core_validate(const struct core *c, const struct engine_request *req, char *err, size_t errlen) {
    const struct engine_sampling *sp = &req->sp;
    if (req->n_prompt < 1) return util_err(err, errlen, "the prompt is empty"), ENGINE_ERR_INVALID;
    for (int i = 0; i < req->n_prompt; i++)
        if (req->prompt[i] < 0 || req->prompt[i] >= c->vocab)
            return util_err(err, errlen, "prompt token %d is outside the vocabulary (0..%d)", req->prompt[i],
                            c->vocab - 1), ENGINE_ERR_INVALID;
    if (sp->n < 1 || sp->n > c->cfg.max_num_seqs)
        return util_err(err, errlen, "n must be in 1..%d", c->cfg.max_num_seqs), ENGINE_ERR_INVALID;
    if (sp->max_tokens < 1) return util_err(err, errlen, "max_tokens must be at least 1"), ENGINE_ERR_INVALID;
    if (sp->min_tokens < 0 || sp->min_tokens > sp->max_tokens)
        return util_err(err, errlen, "min_tokens must be in 0..max_tokens"), ENGINE_ERR_INVALID;
    if (!(sp->temperature >= 0.0f && sp->temperature <= 2.0f) || !(sp->top_p > 0.0f && sp->top_p <= 1.0f) ||
        !(sp->min_p >= 0.0f && sp->min_p <= 1.0f) || !(sp->repetition_penalty > 0.0f) ||
        !(fabsf(sp->presence_penalty) <= 2.0f) || !(fabsf(sp->frequency_penalty) <= 2.0f))
        return util_err(err, errlen, "a sampling parameter is out of range"), ENGINE_ERR_INVALID;
    if (sp->logprobs > ENGINE_MAX_LOGPROBS)
        return util_err(err, errlen, "logprobs must be at most %d", ENGINE_MAX_LOGPROBS), ENGINE_ERR_INVALID;
    for (int i = 0; i < sp->n_logit_bias; i++)
        if (sp->logit_bias_ids[i] < 0 || sp->logit_bias_ids[i] >= c->vocab || !isfinite(sp->logit_bias_vals[i]))
            return util_err(err, errlen, "logit_bias token %d is outside the vocabulary", sp->logit_bias_ids[i]),
                   ENGINE_ERR_INVALID;
    for (int i = 0; i < sp->n_stop_ids; i++)
        if (sp->stop_ids[i] < 0 || sp->stop_ids[i] >= c->vocab)
            return util_err(err, errlen, "stop token id %d is outside the vocabulary", sp->stop_ids[i]),
                   ENGINE_ERR_INVALID;
    for (int i = 0; i < sp->n_stop; i++)
        if (!sp->stop[i] || !(sp->stop_len ? sp->stop_len[i] : strlen(sp->stop[i])))
            return util_err(err, errlen, "stop strings must not be empty"), ENGINE_ERR_INVALID;
    if (sp->n_stop && !c->tok)
        return util_err(err, errlen, "stop strings need a tokenizer, and this model has none"), ENGINE_ERR_INVALID;
    if (sp->grammar.kind != ENGINE_GRAMMAR_NONE && !c->gcache)
        return util_err(err, errlen, "structured output needs a tokenizer, and this model has none"), ENGINE_ERR_INVALID;
    int total = req->n_prompt + sp->max_tokens;
    if (total > c->max_model_len)
        return util_err(err, errlen,
                        "This model's maximum context length is %d tokens. However, you requested %d tokens (%d in "
                        "the prompt, %d for the completion). Please reduce the prompt or max_tokens.",
                        c->max_model_len, total, req->n_prompt, sp->max_tokens), ENGINE_ERR_TOO_LONG;
    if (c->has_full && (total + c->cfg.block_size - 1) / c->cfg.block_size > c->kv.n_blocks)
        return util_err(err, errlen, "prompt + max_tokens (%d tokens) exceeds the KV cache capacity of %d tokens",
                        total, c->kv.n_blocks * c->cfg.block_size), ENGINE_ERR_TOO_LONG;
    return ENGINE_OK;
}

int core_add(struct core *c, const struct engine_request *req, core_emit_fn emit, void *ud, struct core_request **out,
             char *err, size_t errlen) {
    const struct engine_sampling *sp = &req->sp;
    if (out) *out = NULL;
    int vrc = core_validate(c, req, err, errlen);
    if (vrc != ENGINE_OK) return vrc;
    int unseated, seats_left;
    core_queue_state(c, &unseated, &seats_left);
    if (unseated + (unseated > 0 || sp->n > seats_left) > c->cfg.max_queue)
        return util_err(err, errlen, "the request queue is full (%d waiting for a seat)", unseated), ENGINE_ERR_QUEUE_FULL;

    struct core_request *r = calloc(1, sizeof *r);
    if (!r) return util_err(err, errlen, "out of memory"), ENGINE_ERR_OOM;
    r->core = c;
    r->emit = emit;
    r->ud = ud;
    r->sp = *sp;
    r->n_choices = sp->n;
    r->n_prompt = req->n_prompt;
    r->t_arrival = util_now();
    r->prompt = malloc(sizeof(int32_t) * req->n_prompt);
    r->seqs = calloc((size_t)sp->n, sizeof *r->seqs);
    r->sp.logit_bias_ids = malloc(sizeof(int32_t) * (sp->n_logit_bias + 1));
    r->sp.logit_bias_vals = malloc(sizeof(float) * (sp->n_logit_bias + 1));
    r->sp.stop_ids = malloc(sizeof(int32_t) * (sp->n_stop_ids + 1));
    r->sp.stop = calloc((size_t)sp->n_stop + 1, sizeof(char *));
    size_t *stop_len = malloc(sizeof(size_t) * ((size_t)sp->n_stop + 1));
    r->sp.stop_len = stop_len;
    r->mask = malloc(sizeof(int32_t) * (size_t)(c->n_eos + sp->n_stop_ids + 1));
    bool ok = r->prompt && r->seqs && r->sp.logit_bias_ids && r->sp.logit_bias_vals && r->sp.stop_ids && r->sp.stop &&
              stop_len && r->mask;
    if (ok) {
        memcpy(r->prompt, req->prompt, sizeof(int32_t) * req->n_prompt);
        for (int i = 0; i < c->n_eos; i++)
            if (c->eos[i] >= 0 && c->eos[i] < c->vocab) r->mask[r->n_mask++] = c->eos[i];
        for (int i = 0; i < sp->n_stop_ids; i++) r->mask[r->n_mask++] = sp->stop_ids[i];
        if (sp->n_logit_bias) {
            memcpy((void *)r->sp.logit_bias_ids, sp->logit_bias_ids, sizeof(int32_t) * sp->n_logit_bias);
            memcpy((void *)r->sp.logit_bias_vals, sp->logit_bias_vals, sizeof(float) * sp->n_logit_bias);
        }
        if (sp->n_stop_ids) memcpy((void *)r->sp.stop_ids, sp->stop_ids, sizeof(int32_t) * sp->n_stop_ids);
        for (int i = 0; ok && i < sp->n_stop; i++) { // stop strings may hold NUL: copied by length
            size_t l = stop_len[i] = sp->stop_len ? sp->stop_len[i] : strlen(sp->stop[i]);
            char *copy = malloc(l + 1);
            if ((ok = copy != NULL)) {
                memcpy(copy, sp->stop[i], l);
                copy[l] = 0;
            }
            ((char **)r->sp.stop)[i] = copy;
            if (l > r->max_stop_len) r->max_stop_len = l;
        }
    }
    if (ok && sp->grammar.kind != ENGINE_GRAMMAR_NONE) {
        char gerr[200] = "";
        int grc = grammar_cache_acquire(c->gcache, &sp->grammar, &r->ge, gerr, sizeof gerr);
        if (grc == 0 && !(r->tm = grammar_cache_mask(c->gcache, r->ge))) grc = GRAMMAR_ERR_NOMEM;
        if (grc) {
            request_free(r);
            if (grc == GRAMMAR_ERR_NOMEM) return util_err(err, errlen, "out of memory"), ENGINE_ERR_OOM;
            return util_err(err, errlen, "%s", gerr), ENGINE_ERR_GRAMMAR;
        }
        r->sp.grammar = (struct engine_grammar){.kind = sp->grammar.kind}; /* the caller's texts are not kept */
    }
    struct core_seq *s = ok ? seq_new(c, r, 0, req->prompt, req->n_prompt) : NULL;
    if (!s || seq_start_output(c, s) != 0 || list_push(&c->waiting, s) != 0) {
        if (s) r->seqs[0] = s;
        request_free(r);
        return util_err(err, errlen, "out of memory"), ENGINE_ERR_OOM;
    }
    s->forks_pending = sp->n - 1;
    r->seqs[0] = s;
    c->stats.prompt_tokens_total += (uint64_t)req->n_prompt;
    if (out) *out = r;
    return ENGINE_OK;
}

/* ---- outputs ---- */

static void emit_event(struct core_request *r, struct engine_event *ev) { r->emit(r->ud, ev); }

/* Length of the longest suffix of text that is a proper prefix of a stop string. */
static size_t stop_holdback(const struct core_request *r, const char *text, size_t len) {
    size_t best = 0;
    for (int i = 0; i < r->sp.n_stop; i++) {
        const char *st = r->sp.stop[i];
        size_t sl = r->sp.stop_len[i];
        for (size_t k = sl - 1 < len ? sl - 1 : len; k > best; k--)
            if (!memcmp(text + len - k, st, k)) {
                best = k;
                break;
            }
    }
    return best;
}

static char *dup_range(const char *p, size_t n) {
    char *s = malloc(n + 1);
    if (s) {
        memcpy(s, p, n);
        s[n] = 0;
    }
    return s;
}

static void seq_finish(struct core *c, struct core_seq *s, enum engine_finish why, const char *stop_str, int32_t stop_id) {
    struct core_request *r = s->req;
    struct engine_event ev = {.type = ENGINE_EVENT_FINISH, .choice = s->choice, .finish = why,
                              .stop_reason_str = stop_str, .stop_index = -1, .stop_reason_id = stop_id,
                              .prompt_tokens = r->n_prompt, .completion_tokens = s->n_generated,
                              .ttft_s = s->t_first > 0 ? s->t_first - r->t_arrival : 0};
    double t_end = s->n_generated ? s->t_last : util_now(), t_run = s->t_scheduled > 0 ? s->t_scheduled : t_end;
    ev.queue_s = t_run - r->t_arrival;
    ev.prefill_s = (s->t_first > 0 ? s->t_first : t_end) - t_run;
    ev.decode_s = s->t_first > 0 ? t_end - s->t_first : 0;
    ev.text = dup_range(s->text ? s->text + s->emitted : "", s->text ? s->text_len - s->emitted : 0);
    text_emitted(s, s->text_len);
    for (int i = 0; stop_str && i < r->sp.n_stop; i++)
        if (r->sp.stop[i] == stop_str) ev.stop_index = i;
    if (s->state == SEQ_RUNNING) {
        list_remove(&c->running, s);
        c->reserved -= s->forks_pending;
    } else if (s->state == SEQ_WAITING) {
        list_remove(&c->waiting, s);
    }
    s->state = SEQ_DONE;
    if (s->n_blocks) kv_cache_release(&c->kv, s->blocks, s->n_blocks);
    s->n_blocks = 0;
    if (s->slot >= 0) kv_cache_release_slot(&c->kv, s->slot);
    s->slot = -1;
    if (why == ENGINE_FINISH_STOP) c->stats.finished_stop++;
    else if (why == ENGINE_FINISH_LENGTH) c->stats.finished_length++;
    else c->stats.finished_abort++;
    /* choices not yet forked finish with their parent (only on abort or error) */
    int pending = s->forks_pending;
    s->forks_pending = 0;
    r->n_done += 1 + pending;
    emit_event(r, &ev);
    for (int i = 0; i < pending; i++) {
        struct engine_event e2 = ev;
        e2.choice = r->n_choices - pending + i;
        e2.completion_tokens = 0;
        e2.text = dup_range("", 0);
        emit_event(r, &e2);
    }
    if (r->n_done >= r->n_choices) request_free(r);
}

void core_abort(struct core *c, struct core_request *r) {
    /* finish from the last choice: the request is freed with its last one */
    int n = r->n_choices;
    for (int i = n - 1; i >= 0; i--) {
        struct core_seq *s = r->seqs[i];
        if (s && s->state != SEQ_DONE) {
            bool last = r->n_done + 1 + s->forks_pending >= r->n_choices;
            seq_finish(c, s, ENGINE_FINISH_ABORT, NULL, -1);
            if (last) return;
        }
    }
}

static bool is_eos(const struct core *c, int32_t id) {
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos[i] == id) return true;
    return false;
}

/* Marks r failed (once): after this step's tokens it gets an ERROR event and is aborted, and its
 * remaining draws of the step are skipped. Returns -1. */
static int fail_request(struct core *c, struct core_request *r, const char *fmt, const char *detail) {
    if (r->failed) return -1;
    r->failed = true;
    snprintf(r->fail_msg, sizeof r->fail_msg, fmt, detail);
    c->failed[c->n_failed++] = r;
    return -1;
}

/* Structured output: s's next draw may only take the tokens that keep its text in the grammar
 * (s->allow, which the sampler row points at). Returns 0, or -1 with r failed when no token may
 * follow or the mask cannot be made. */
static int seq_fill_mask(struct core *c, struct core_seq *s) {
    struct core_request *r = s->req;
    bool at_start = tokenizer_stream_at_start(&s->detok);
    int rc = token_mask_fill(r->tm, s->gs, at_start, s->allow);
    if (rc)
        return fail_request(c, r, "structured output: the text cannot go on within the grammar's limits (%s: more "
                                  "than 1024 alternatives alive at once, or nesting deeper than 512)", grammar_strerror(rc));
    size_t words = grammar_cache_mask_words(c->gcache);
    uint32_t any = 0;
    for (size_t i = 0; i < words; i++) any |= s->allow[i];
    if (!any)
        return fail_request(c, r, "structured output: %s",
                            "no token of the vocabulary can continue the text here (the output nests deeper than "
                            "the grammar's limits allow)");
    s->smp.allow = s->allow;
    return 0;
}

/* The ids min_tokens masks for s's next draw (EOS and stop ids while it has fewer than
 * min_tokens), none when the grammar allows nothing else: its text is complete, and min_tokens
 * must not push it past its end. */
static int seq_min_mask(const struct core *c, const struct core_seq *s) {
    const struct core_request *r = s->req;
    if (!s->gs || s->n_generated >= r->sp.min_tokens) return r->n_mask;
    size_t words = grammar_cache_mask_words(c->gcache);
    uint32_t *tmp = c->work_bits;
    memcpy(tmp, s->allow, sizeof *tmp * words);
    for (int i = 0; i < r->n_mask; i++) tmp[r->mask[i] / 32] &= ~(1u << (r->mask[i] % 32));
    for (size_t i = 0; i < words; i++)
        if (tmp[i]) return r->n_mask;
    return 0;
}

/* Applies a sampled token to a choice: text, stop conditions, events. Returns 1 when the choice
 * is done, 0 when it goes on, -1 when the token leaves its grammar (the request is failed). */
static int seq_accept_token(struct core *c, struct core_seq *s, int32_t id, const float *raw) {
    struct core_request *r = s->req;
    const struct engine_sampling *sp = &r->sp;
    /* the grammar first: a token outside the mask (a sampler fault) fails the request */
    bool grammar_eos = false;
    if (s->gs) {
        if (token_mask_accept(r->tm, s->gs, id, tokenizer_stream_at_start(&s->detok)) != 0) {
            char what[48];
            snprintf(what, sizeof what, "%d", (int)id);
            return fail_request(c, r, "structured output: the sampler drew token %s, which the grammar does not allow",
                                what);
        }
        grammar_eos = is_eos(c, id); /* accepted: the text is complete */
    }
    struct engine_event ev = {.type = ENGINE_EVENT_TOKEN, .choice = s->choice, .token = id, .stop_index = -1,
                              .stop_reason_id = -1};
    if (sp->logprobs >= 0) {
        sampler_log_softmax(raw, c->vocab, c->lp);
        ev.logprob = c->lp[id];
        ev.n_top = sp->logprobs;
        if (ev.n_top) sampler_top_k(c->lp, c->vocab, ev.n_top, ev.top_ids, ev.top_lps);
    }
    s->tokens[s->n_tokens++] = id;
    s->n_generated++;
    sampler_seq_accept(&s->smp, id);
    ev.itl_s = s->n_generated > 1 ? c->t_tokens - s->t_last : -1;
    if (s->n_generated == 1) s->t_first = c->t_tokens;
    s->t_last = c->t_tokens;
    c->stats.generation_tokens_total++;

    enum engine_finish fin = ENGINE_FINISH_NONE;
    const char *stop_str = NULL;
    size_t stop_len = 0;
    int32_t stop_id = -1;
    bool past_min = s->n_generated >= sp->min_tokens;
    bool stop_token = grammar_eos || (past_min && !sp->ignore_eos && is_eos(c, id));
    for (int i = 0; past_min && i < sp->n_stop_ids; i++)
        if (sp->stop_ids[i] == id) stop_token = true, stop_id = id;
    if (stop_token) fin = ENGINE_FINISH_STOP;

    size_t chars_before = s->text_chars;
    ev.text_start = c->tok && tokenizer_stream_at_start(&s->detok);
    if (c->tok && (!stop_token || sp->include_stop_str_in_output)) {
        const char *piece;
        size_t plen;
        if (tokenizer_stream_push(&s->detok, id, &piece, &plen) == 0) {
            chars_before += utf8_count(piece, tokenizer_stream_carried(&s->detok)); // earlier bytes' U+FFFDs
            text_append(s, piece, plen);
        }
        /* stop strings: earliest match in the text not yet sent (matches may straddle tokens) */
        if (!fin && past_min && sp->n_stop) {
            size_t from = s->emitted;
            size_t best_at = (size_t)-1;
            for (int i = 0; i < sp->n_stop; i++) {
                const char *hit = memmem(s->text + from, s->text_len - from, sp->stop[i], sp->stop_len[i]);
                if (hit && (size_t)(hit - s->text) < best_at) {
                    best_at = (size_t)(hit - s->text);
                    stop_str = sp->stop[i];
                    stop_len = sp->stop_len[i];
                }
            }
            if (stop_str) {
                fin = ENGINE_FINISH_STOP;
                size_t cut = best_at + (sp->include_stop_str_in_output ? stop_len : 0);
                s->text_chars -= utf8_count(s->text + cut, s->text_len - cut);
                s->text_len = cut;
                s->text[s->text_len] = 0;
            }
        }
    }
    /* a complete text that nothing may follow ends here, whatever ignore_eos says */
    if (!fin && s->gs && grammar_state_accepting(s->gs) && !grammar_state_can_continue(s->gs)) fin = ENGINE_FINISH_STOP;
    if (!fin && (s->n_generated >= sp->max_tokens || s->n_tokens >= c->max_model_len)) fin = ENGINE_FINISH_LENGTH;
    if (fin) {
        /* the held-back bytes of an unfinished character go out with the finish */
        if (c->tok && !stop_str) {
            const char *piece;
            size_t plen;
            if (tokenizer_stream_flush(&s->detok, &piece, &plen) == 0) text_append(s, piece, plen);
        }
        ev.text = dup_range("", 0);
        ev.token_text_at = (int)(chars_before - s->emitted_chars);
        emit_event(r, &ev);
        seq_finish(c, s, fin, stop_str, stop_id);
        return 1;
    }
    size_t safe = s->text_len - (sp->n_stop ? stop_holdback(r, s->text + s->emitted, s->text_len - s->emitted) : 0);
    ev.text = dup_range(s->text ? s->text + s->emitted : "", safe > s->emitted ? safe - s->emitted : 0);
    ev.token_text_at = (int)(chars_before - s->emitted_chars);
    text_emitted(s, safe);
    emit_event(r, &ev);
    return 0;
}

/* ---- scheduling ---- */

/* Makes s's block table cover positions [0, upto), copying a shared block it will write into.
 * All or nothing; false when the pool lacks blocks. */
static bool ensure_blocks(struct core *c, struct core_seq *s, int upto) {
    if (!c->has_full) return true;
    int bs = c->cfg.block_size;
    int need = (upto + bs - 1) / bs;
    int first_write = s->n_computed / bs;
    bool cow = first_write < s->n_blocks && c->kv.ref[s->blocks[first_write]] > 1;
    int new_blocks = (need > s->n_blocks ? need - s->n_blocks : 0) + (cow ? 1 : 0);
    if (new_blocks > c->kv.n_free_blocks) return false;
    if (grow((void **)&s->blocks, &s->blocks_cap, need + 1, sizeof(int32_t))) return false;
    if (cow) {
        int32_t nb;
        kv_cache_alloc(&c->kv, 1, &nb);
        kv_cache_copy_block(&c->kv, nb, s->blocks[first_write]);
        kv_cache_release(&c->kv, &s->blocks[first_write], 1);
        s->blocks[first_write] = nb;
    }
    if (need > s->n_blocks) {
        kv_cache_alloc(&c->kv, need - s->n_blocks, s->blocks + s->n_blocks);
        s->n_blocks = need;
    }
    return true;
}

/* Recompute preemption: the sequence loses its KV and waits at the front of the queue. */
static void preempt(struct core *c, struct core_seq *s) {
    list_remove(&c->running, s);
    c->reserved -= s->forks_pending;
    if (s->n_blocks) kv_cache_release(&c->kv, s->blocks, s->n_blocks);
    s->n_blocks = 0;
    if (s->slot >= 0) kv_cache_release_slot(&c->kv, s->slot);
    s->slot = -1;
    s->n_computed = 0;
    s->state = SEQ_WAITING;
    list_push_front(&c->waiting, s);
    c->stats.preemptions_total++;
}

/* Fills the batch: running sequences first (decodes and unfinished prefills, oldest first),
 * then waiting ones, FCFS, within the token budget. Returns the number of sequences. */
static int schedule(struct core *c, int *n_tokens) {
    int budget = c->max_batch, n = 0;
    for (int i = 0; i < c->running.n && budget > 0;) {
        struct core_seq *s = c->running.v[i];
        int want = s->n_tokens - s->n_computed;
        if (want > budget) want = budget;
        bool preempted_self = false;
        while (!ensure_blocks(c, s, s->n_computed + want)) {
            struct core_seq *victim = c->running.v[c->running.n - 1];
            preempt(c, victim);
            if (victim == s) {
                preempted_self = true;
                break;
            }
        }
        if (preempted_self) continue; /* running.v[i] is now the next sequence (or none) */
        c->b_seqs[n] = s;
        c->b_want[n++] = want;
        budget -= want;
        i++;
    }
    while (c->waiting.n && budget > 0) {
        struct core_seq *s = c->waiting.v[0];
        int seats = 1 + s->forks_pending;
        if (c->running.n + c->reserved + seats > c->cfg.max_num_seqs) break;
        if (c->has_stream && c->kv.n_free_slots - c->reserved < seats) break;
        int want = s->n_tokens - s->n_computed;
        if (want > budget) want = budget;
        if (!ensure_blocks(c, s, s->n_computed + want)) break;
        if (c->has_stream) kv_cache_alloc_slot(&c->kv, &s->slot);
        if (s->t_scheduled <= 0) s->t_scheduled = util_now();
        list_remove(&c->waiting, s);
        s->state = SEQ_RUNNING;
        s->admit_order = c->next_admit++;
        c->reserved += s->forks_pending;
        list_push(&c->running, s);
        c->b_seqs[n] = s;
        c->b_want[n++] = want;
        budget -= want;
    }
    *n_tokens = c->max_batch - budget;
    return n;
}

/* True when the next token of s is the plain argmax of its logits: greedy, no logprobs, no
 * bias or penalties, and no min_tokens masking left. */
static bool seq_is_plain_greedy(const struct core *c, const struct core_seq *s) {
    const struct engine_sampling *sp = &s->req->sp;
    return !(sp->temperature >= 1e-5f) && sp->logprobs < 0 && sp->n_logit_bias == 0 && !s->smp.slot &&
           s->n_generated >= sp->min_tokens && !s->gs;
}

/* After the prompt: the other choices start as copies sharing the prompt's blocks. */
static int fork_choices(struct core *c, struct core_seq *parent) {
    struct core_request *r = parent->req;
    while (parent->forks_pending > 0) {
        int choice = r->n_choices - parent->forks_pending;
        struct core_seq *s = seq_new(c, r, choice, parent->tokens, parent->n_tokens);
        if (!s) return -1;
        if (seq_start_output(c, s) != 0 || grow((void **)&s->blocks, &s->blocks_cap, parent->n_blocks + 1, sizeof(int32_t)) ||
            (c->has_stream && kv_cache_alloc_slot(&c->kv, &s->slot) != KV_STATUS_OK)) {
            seq_free(c, s); /* the choice stays pending on the parent, which finishes it */
            return -1;
        }
        r->seqs[choice] = s;
        memcpy(s->blocks, parent->blocks, sizeof(int32_t) * parent->n_blocks);
        s->n_blocks = parent->n_blocks;
        for (int i = 0; i < s->n_blocks; i++) kv_cache_ref(&c->kv, s->blocks[i]);
        if (c->has_stream) kv_cache_copy_slot(&c->kv, s->slot, parent->slot); /* slot reserved at admission */
        s->n_computed = parent->n_computed;
        s->t_scheduled = parent->t_scheduled;
        s->state = SEQ_RUNNING;
        s->admit_order = c->next_admit++;
        list_push(&c->running, s);
        parent->forks_pending--;
        c->reserved--;
    }
    return 0;
}

/* Room for n draws in the step arrays. Returns 0 or -1 (out of memory). */
static int draws_reserve(struct core *c, int n) {
    if (n <= c->draws_cap) return 0;
    struct core_draw *d = realloc(c->draws, sizeof *d * n);
    if (d) c->draws = d;
    struct sample_row *sr = realloc(c->srows, sizeof *sr * n);
    if (sr) c->srows = sr;
    int32_t *si = realloc(c->sids, sizeof *si * n);
    if (si) c->sids = si;
    if (!d || !sr || !si) return -1;
    c->draws_cap = n;
    return 0;
}

/* Fails the requests of the step's batch after a backend error, and keeps serving others. */
static void fail_batch(struct core *c, int n, const char *during) {
    for (int i = 0; i < n; i++) {
        struct core_seq *s = c->b_seqs[i];
        bool alive = false; /* an earlier abort may have freed it with its request */
        for (int j = 0; j < c->running.n && !alive; j++) alive = c->running.v[j] == s;
        if (!alive) continue;
        struct engine_event ev = {.type = ENGINE_EVENT_ERROR, .choice = s->choice};
        snprintf(ev.message, sizeof ev.message, "the %s backend failed during %s", c->b->name, during);
        emit_event(s->req, &ev);
        core_abort(c, s->req);
    }
}

int core_step(struct core *c) {
    int T;
    int n = schedule(c, &T);
    if (n == 0) return 0;
    /* batch arrays */
    int n_blk = 0, row = 0, n_logits = 0;
    for (int i = 0; i < n; i++) n_blk += c->b_seqs[i]->n_blocks;
    if (grow((void **)&c->b_blocks, &c->b_blocks_cap, n_blk + 1, sizeof(int32_t))) return ENGINE_ERR_OOM;
    n_blk = 0;
    for (int i = 0; i < n; i++) {
        struct core_seq *s = c->b_seqs[i];
        c->b_seq_start[i] = row;
        c->b_indptr[i] = n_blk;
        memcpy(c->b_blocks + n_blk, s->blocks, sizeof(int32_t) * s->n_blocks);
        n_blk += s->n_blocks;
        c->b_slots[i] = s->slot;
        for (int k = 0; k < c->b_want[i]; k++) {
            c->b_tokens[row] = s->tokens[s->n_computed + k];
            c->b_pos[row] = s->n_computed + k;
            row++;
        }
        if (s->n_computed + c->b_want[i] == s->n_tokens) c->b_rows[n_logits++] = row - 1;
    }
    c->b_seq_start[n] = row;
    c->b_indptr[n] = n_blk;
    /* the logits stay in backend memory, where the sample op draws from them, unless a row
     * reports logprobs: then the host needs them whole. The argmax of each row comes with
     * them: the token of plain greedy rows. */
    bool host_logits = false;
    int max_draws = 0; /* each sampling sequence and the choices it forks */
    for (int i = 0; i < n; i++) {
        struct core_seq *s = c->b_seqs[i];
        if (s->n_computed + c->b_want[i] != s->n_tokens) continue;
        host_logits |= s->req->sp.logprobs >= 0;
        host_logits |= s->req->ge && !c->b->ops->sample_allow; /* constrained rows sample on the host then */
        max_draws += 1 + s->forks_pending;
    }
    if (draws_reserve(c, max_draws)) return ENGINE_ERR_OOM;
    bool device = n_logits > 0 && !host_logits;
    struct fwd_batch bt = {T, n, c->b_tokens, c->b_pos, c->b_seq_start, c->b_indptr, c->b_blocks, c->b_slots,
                           n_logits, c->b_rows, c->greedy_ids, device};
    double t0 = util_now();
    int rc = model_forward(c->m, &c->kv, &bt, c->logits);
    double t1 = util_now();
    c->stats.forward_seconds += t1 - t0;
    if (rc != 0) {
        fail_batch(c, n, "the forward pass");
        return model_failed(c->m) ? ENGINE_ERR_FATAL : ENGINE_ERR_OOM;
    }
    /* each token, in batch order; a parent's forks draw from the same logits row. The draws of
     * the sample op go in one call, then every token is accepted in order. */
    int li = 0, n_draws = 0, n_op = 0;
    for (int i = 0; i < n; i++) {
        struct core_seq *s = c->b_seqs[i];
        s->n_computed += c->b_want[i];
        if (s->n_computed != s->n_tokens) continue;
        int row = li++;
        struct core_request *r = s->req;
        int first_fork = r->n_choices - s->forks_pending;
        if (s->forks_pending && fork_choices(c, s) != 0) {
            core_abort(c, r);
            continue;
        }
        int n_sample = s == r->seqs[0] && first_fork < r->n_choices ? r->n_choices - first_fork + 1 : 1;
        for (int k = 0; k < n_sample; k++) {
            struct core_seq *t = k == 0 ? s : r->seqs[first_fork + k - 1];
            if (r->failed || (t->gs && seq_fill_mask(c, t) != 0)) continue;
            int n_mask = seq_min_mask(c, t);
            struct core_draw *d = &c->draws[n_draws++];
            *d = (struct core_draw){t, row, -1, 0};
            if (device && seq_is_plain_greedy(c, t)) {
                d->id = c->greedy_ids[row];
            } else if (device) {
                d->op = n_op;
                sampler_row(&c->srows[n_op], &t->smp, &r->sp, t->n_generated, r->mask, n_mask);
                c->srows[n_op++].row = row;
            } else {
                memcpy(c->work, c->logits + (size_t)row * c->vocab, sizeof(float) * c->vocab);
                d->id = sampler_pick(&t->smp, &r->sp, c->work, c->vocab, t->n_generated, r->mask, n_mask,
                                     c->scratch);
            }
        }
    }
    if (n_op && c->b->ops->sample(c->b, c->sids, c->srows, n_op, c->vocab) != 0) {
        c->n_failed = 0; /* failed requests are in the batch: aborted with it */
        fail_batch(c, n, "sampling");
        return ENGINE_ERR_OOM;
    }
    /* a request is freed with its last choice, which is its last draw here; a failed one is not
     * freed before its ERROR below (its failing choice is not done), and its later draws are skipped */
    c->t_tokens = util_now();
    for (int i = 0; i < n_draws; i++) {
        const struct core_draw *d = &c->draws[i];
        if (d->seq->req->failed) continue;
        seq_accept_token(c, d->seq, d->op >= 0 ? c->sids[d->op] : d->id,
                         device ? NULL : c->logits + (size_t)d->row * c->vocab);
    }
    for (int i = 0; i < c->n_failed; i++) {
        struct core_request *r = c->failed[i];
        struct engine_event ev = {.type = ENGINE_EVENT_ERROR};
        snprintf(ev.message, sizeof ev.message, "%s", r->fail_msg);
        emit_event(r, &ev);
        core_abort(c, r);
    }
    c->n_failed = 0;
    c->stats.sample_seconds += util_now() - t1;
    return T;
}

bool core_has_work(const struct core *c) { return c->running.n > 0 || c->waiting.n > 0; }
int core_num_waiting(const struct core *c) { return c->waiting.n; }

void core_queue_state(const struct core *c, int *unseated, int *seats_left) {
    int free = c->cfg.max_num_seqs - c->running.n - c->reserved, n = 0;
    for (int i = 0; i < c->waiting.n; i++) {
        int seats = 1 + c->waiting.v[i]->forks_pending;
        if (n == 0 && seats <= free) free -= seats;
        else n++;
    }
    *unseated = n;
    *seats_left = free > 0 ? free : 0;
}

void core_stats(const struct core *c, struct engine_stats *st) {
    *st = c->stats;
    st->num_running = c->running.n;
    st->num_waiting = c->waiting.n;
    st->kv_usage_full = c->kv.n_blocks ? 1.0 - (double)c->kv.n_free_blocks / c->kv.n_blocks : 0.0;
    st->kv_usage_streaming = c->kv.n_slots ? 1.0 - (double)c->kv.n_free_slots / c->kv.n_slots : 0.0;
}

const struct model *core_model(const struct core *c) { return c->m; }
const struct tokenizer *core_tokenizer(const struct core *c) { return c->tok; }
const struct kv_cache *core_kv(const struct core *c) { return &c->kv; }
int core_max_model_len(const struct core *c) { return c->max_model_len; }
const char *core_model_dir(const struct core *c) { return c->cfg.model_dir; }
int core_max_queue(const struct core *c) { return c->cfg.max_queue; }
int core_max_num_seqs(const struct core *c) { return c->cfg.max_num_seqs; }
const char *core_device(const struct core *c) { return c->b->name; }
struct grammar_cache *core_grammar_cache(struct core *c) { return c->gcache; }

void core_reset_stats(struct core *c) {
    int capacity = c->stats.kv_capacity_tokens;
    memset(&c->stats, 0, sizeof c->stats);
    c->stats.kv_capacity_tokens = capacity;
}
