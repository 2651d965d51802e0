/* core_impl: the engine core's private types, shared by its three files: engine_core.c (admission,
 * steps, freeing), core_create.c (loading and the memory plan) and core_output.c (tokens to text,
 * stop conditions, structured output's masks, finishing a choice). */
#ifndef DUO_CORE_IMPL_H
#define DUO_CORE_IMPL_H

#include "engine/engine_core.h"
#include "engine/grammar_cache.h"
#include "engine/sampler.h"
#include "engine/sched.h"
#include "engine/text/tokenizer.h"
#include "engine/util.h"

struct core_seq {
    struct sched_seq sq; // the scheduler's part: tokens and computed counts, KV, forks pending
    struct core_request *req;
    int choice;
    int32_t *tokens; // prompt + generated: sq.n_tokens
    int cap;
    struct sampler_seq smp;
    struct tokenizer_stream detok;
    char *text;      // generated text (after any stop-string cut)
    size_t text_len, text_cap, emitted;
    size_t text_chars, emitted_chars; // code points in text[0, text_len) and text[0, emitted)
    int n_generated;
    double t_first, t_last; // first and last token
    struct grammar_state *gs; // structured output: where the text is in the grammar (kept across preemptions:
                              // the generated tokens are kept, only their KV is recomputed)
    uint32_t *allow;          // [mask words] the tokens of the next draw (sampler_seq.allow points here)
};

struct core_request {
    struct core *core;
    core_emit_fn emit;
    void *ud;
    struct engine_request *er;         // the request as submitted (owned)
    const struct engine_sampling *sp;  // &er->sp
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
    struct core_request *next_done; // on the core's list of finished requests, freed at a safe point
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
    struct kv_cache *kv;
    struct sched sched;
    struct sched_wave_part *wave_parts; // [n_layers] the step cost's wave model (sched.cfg.cost.waves), or NULL
    int vocab, max_model_len, max_batch;
    int32_t eos[16];
    int n_eos;
    struct core_request *done;        // finished requests, freed by core_reap() once no step uses them
    // step scratch
    int32_t *b_tokens, *b_pos, *b_seq_start, *b_indptr, *b_blocks, *b_slots, *b_rows;
    int b_blocks_cap;
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
    struct kv_prefix_stats prefix_base; // the cache's counters at the last core_reset_stats
    struct util_rng seed_rng; // seeds of requests that give none
};

/* core_output.c */
void core_emit_event(struct core_request *r, struct engine_event *ev);
/* Ends choice s (KV back to the cache, FINISH events for it and its unforked choices); the request
 * goes on the core's done list with its last choice. */
void core_seq_finish(struct core *c, struct core_seq *s, enum engine_finish why, const char *stop_str, int32_t stop_id);
int core_fail_request(struct core *c, struct core_request *r, const char *fmt, const char *detail);
int core_seq_fill_mask(struct core *c, struct core_seq *s);
int core_seq_min_mask(const struct core *c, const struct core_seq *s);
int core_seq_accept(struct core *c, struct core_seq *s, int32_t id, const float *raw);

/* engine_core.c */
void core_seq_free(struct core *c, struct core_seq *s);
void core_reap(struct core *c);
void core_abort_request(struct core *c, struct core_request *r);

#endif
