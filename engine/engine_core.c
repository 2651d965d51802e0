#include "engine/core_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- small containers ---- */

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

void core_seq_free(struct core *c, struct core_seq *s) {
    if (!s) return;
    sched_finish(&c->sched, &s->sq);
    kv_seq_free(&s->sq.kv);
    sampler_seq_free(&s->smp);
    grammar_state_free(s->gs);
    free(s->allow);
    if (c->tok) tokenizer_stream_free(&s->detok);
    free(s->tokens);
    free(s->text);
    free(s);
}

static void request_free(struct core_request *r) {
    struct core *c = r->core;
    for (int i = 0; i < r->n_choices; i++) core_seq_free(c, r->seqs[i]);
    free(r->seqs);
    if (r->ge) {
        grammar_cache_measure(c->gcache, r->ge);
        grammar_cache_release(c->gcache, r->ge);
    }
    engine_request_free(r->er);
    free(r->mask);
    free(r);
}

/* Frees the finished requests: at the end of a step or an abort, when nothing points at them. */
void core_reap(struct core *c) {
    while (c->done) {
        struct core_request *r = c->done;
        c->done = r->next_done;
        request_free(r);
    }
}

void core_abort_request(struct core *c, struct core_request *r);

/* ---- requests ---- */

static struct core_seq *seq_new(struct core *c, struct core_request *r, int choice, const int32_t *tokens, int n) {
    struct core_seq *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->req = r;
    s->choice = choice;
    kv_seq_init(&s->sq.kv);
    s->cap = n + r->sp->max_tokens + 1;
    s->tokens = malloc(sizeof(int32_t) * s->cap);
    if (!s->tokens) {
        free(s);
        return NULL;
    }
    memcpy(s->tokens, tokens, sizeof(int32_t) * n);
    s->sq.n_tokens = n;
    s->sq.tokens = s->tokens;
    s->sq.snapshot_at = n; /* the prompt's end (a fork starts there: none for it) */
    return s;
}

/* Starts the per-choice state: sampler and detokenizer primed with the prompt, the grammar at
 * the start of the text (forks start after the prompt, when their parent's state is that too). */
static int seq_start_output(struct core *c, struct core_seq *s) {
    struct core_request *r = s->req;
    uint64_t seed = r->sp->has_seed ? r->sp->seed : util_rng_next(&c->seed_rng);
    if (sampler_seq_init(&s->smp, r->sp, seed, s->choice, c->vocab, r->er->prompt, r->er->n_prompt) != 0) return -1;
    if (r->ge) {
        if (grammar_state_init(&s->gs, grammar_cache_grammar(r->ge)) != 0) return -1;
        if (!(s->allow = malloc(sizeof *s->allow * grammar_cache_mask_words(c->gcache)))) return -1;
    }
    if (c->tok) {
        tokenizer_stream_init(&s->detok, c->tok, r->sp->skip_special_tokens);
        if (tokenizer_stream_prime(&s->detok, r->er->prompt, (size_t)r->er->n_prompt) != 0) return -1;
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
    int capacity = kv_cache_capacity_tokens(c->kv);
    if (total > capacity)
        return util_err(err, errlen, "prompt + max_tokens (%d tokens) exceeds the KV cache capacity of %d tokens",
                        total, capacity), ENGINE_ERR_TOO_LONG;
    return ENGINE_OK;
}

int core_add_owned(struct core *c, struct engine_request *er, struct grammar_cache_entry *ge, core_emit_fn emit,
                   void *ud, struct core_request **out, char *err, size_t errlen) {
    if (out) *out = NULL;
    const struct engine_sampling *sp = &er->sp;
    int rc = core_validate(c, er, err, errlen);
    int unseated, seats_left;
    core_queue_state(c, &unseated, &seats_left);
    if (rc == ENGINE_OK && unseated + (unseated > 0 || sp->n > seats_left) > c->cfg.max_queue)
        rc = (util_err(err, errlen, "the request queue is full (%d waiting for a seat)", unseated), ENGINE_ERR_QUEUE_FULL);
    struct core_request *r = rc == ENGINE_OK ? calloc(1, sizeof *r) : NULL;
    if (rc == ENGINE_OK && !r) rc = (util_err(err, errlen, "out of memory"), ENGINE_ERR_OOM);
    if (rc != ENGINE_OK) {
        if (ge) grammar_cache_release(c->gcache, ge);
        engine_request_free(er);
        return rc;
    }
    r->core = c;
    r->emit = emit;
    r->ud = ud;
    r->er = er;
    r->sp = sp;
    r->ge = ge;
    r->n_choices = sp->n;
    r->t_arrival = util_now();
    r->seqs = calloc((size_t)sp->n, sizeof *r->seqs);
    r->mask = malloc(sizeof(int32_t) * (size_t)(c->n_eos + sp->n_stop_ids + 1));
    bool ok = r->seqs && r->mask;
    if (ok) {
        for (int i = 0; i < c->n_eos; i++)
            if (c->eos[i] >= 0 && c->eos[i] < c->vocab) r->mask[r->n_mask++] = c->eos[i];
        for (int i = 0; i < sp->n_stop_ids; i++) r->mask[r->n_mask++] = sp->stop_ids[i];
        for (int i = 0; i < sp->n_stop; i++)
            if (sp->stop_len[i] > r->max_stop_len) r->max_stop_len = sp->stop_len[i];
    }
    if (ok && sp->grammar.kind != ENGINE_GRAMMAR_NONE) {
        char gerr[200] = "";
        int grc = r->ge ? 0 : grammar_cache_acquire(c->gcache, &sp->grammar, &r->ge, gerr, sizeof gerr);
        if (grc == 0 && !(r->tm = grammar_cache_mask(c->gcache, r->ge))) grc = GRAMMAR_ERR_NOMEM;
        if (grc) {
            request_free(r);
            if (grc == GRAMMAR_ERR_NOMEM) return util_err(err, errlen, "out of memory"), ENGINE_ERR_OOM;
            return util_err(err, errlen, "%s", gerr), ENGINE_ERR_GRAMMAR;
        }
    }
    struct core_seq *s = ok ? seq_new(c, r, 0, er->prompt, er->n_prompt) : NULL;
    if (s) {
        r->seqs[0] = s;
        s->sq.forks_pending = sp->n - 1;
    }
    if (!s || seq_start_output(c, s) != 0 || sched_add(&c->sched, &s->sq) != 0) {
        request_free(r);
        return util_err(err, errlen, "out of memory"), ENGINE_ERR_OOM;
    }
    c->stats.prompt_tokens_total += (uint64_t)er->n_prompt;
    if (out) *out = r;
    return ENGINE_OK;
}

int core_add(struct core *c, const struct engine_request *req, core_emit_fn emit, void *ud, struct core_request **out,
             char *err, size_t errlen) {
    if (out) *out = NULL;
    int rc = core_validate(c, req, err, errlen);
    if (rc != ENGINE_OK) return rc;
    struct engine_request *er = engine_request_clone(req);
    if (!er) return util_err(err, errlen, "out of memory"), ENGINE_ERR_OOM;
    return core_add_owned(c, er, NULL, emit, ud, out, err, errlen);
}

/* Finishes every unfinished choice of r with ENGINE_FINISH_ABORT (r is freed by the next reap). */
void core_abort_request(struct core *c, struct core_request *r) {
    for (int i = r->n_choices - 1; i >= 0 && r->n_done < r->n_choices; i--) {
        struct core_seq *s = r->seqs[i];
        if (s && s->sq.state != SCHED_DONE) core_seq_finish(c, s, ENGINE_FINISH_ABORT, NULL, -1);
    }
}

void core_abort(struct core *c, struct core_request *r) {
    core_abort_request(c, r);
    core_reap(c);
}

/* ---- steps ---- */

/* True when the next token of s is the plain argmax of its logits: greedy, no logprobs, no
 * bias or penalties, and no min_tokens masking left. */
static bool seq_is_plain_greedy(const struct core *c, const struct core_seq *s) {
    const struct engine_sampling *sp = s->req->sp;
    return !(sp->temperature >= 1e-5f) && sp->logprobs < 0 && sp->n_logit_bias == 0 && !s->smp.slot &&
           s->n_generated >= sp->min_tokens && !s->gs;
}

/* After the prompt: the other choices start as copies sharing the prompt's blocks. */
static int fork_choices(struct core *c, struct core_seq *parent) {
    struct core_request *r = parent->req;
    while (parent->sq.forks_pending > 0) {
        int choice = r->n_choices - parent->sq.forks_pending;
        struct core_seq *s = seq_new(c, r, choice, parent->tokens, parent->sq.n_tokens);
        if (!s) return -1;
        if (seq_start_output(c, s) != 0 || sched_fork(&c->sched, &parent->sq, &s->sq) != KV_STATUS_OK) {
            core_seq_free(c, s); /* the choice stays pending on the parent, which finishes it */
            return -1;
        }
        r->seqs[choice] = s;
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

static struct core_seq *plan_seq(const struct core *c, int i) {
    return (struct core_seq *)c->sched.plan.seqs[i]; /* sq is a core_seq's first member */
}

/* Fails the requests of the step's batch after a backend error, and keeps serving others. */
static void fail_batch(struct core *c, int n, const char *during) {
    for (int i = 0; i < n; i++) {
        struct core_seq *s = plan_seq(c, i);
        if (s->sq.state == SCHED_DONE) continue; /* ended with its request (freed after the step) */
        struct engine_event ev = {.type = ENGINE_EVENT_ERROR, .choice = s->choice};
        snprintf(ev.message, sizeof ev.message, "the %s backend failed during %s", c->b->name, during);
        core_emit_event(s->req, &ev);
        core_abort_request(c, s->req);
    }
}

int core_step(struct core *c) {
    int n = sched_step_plan(&c->sched), T = c->sched.plan.n_tokens;
    if (n == 0) return 0;
    const int *want = c->sched.plan.want;
    /* batch arrays */
    int n_blk = 0, row = 0, n_logits = 0;
    for (int i = 0; i < n; i++) n_blk += plan_seq(c, i)->sq.kv.n_blocks;
    if (grow((void **)&c->b_blocks, &c->b_blocks_cap, n_blk + 1, sizeof(int32_t))) return ENGINE_ERR_OOM;
    n_blk = 0;
    for (int i = 0; i < n; i++) {
        struct core_seq *s = plan_seq(c, i);
        c->b_seq_start[i] = row;
        c->b_indptr[i] = n_blk;
        memcpy(c->b_blocks + n_blk, s->sq.kv.blocks, sizeof(int32_t) * s->sq.kv.n_blocks);
        n_blk += s->sq.kv.n_blocks;
        c->b_slots[i] = s->sq.kv.slot;
        for (int k = 0; k < want[i]; k++) {
            c->b_tokens[row] = s->tokens[s->sq.n_computed + k];
            c->b_pos[row] = s->sq.n_computed + k;
            row++;
        }
        if (s->sq.n_computed + want[i] == s->sq.n_tokens) c->b_rows[n_logits++] = row - 1;
    }
    c->b_seq_start[n] = row;
    c->b_indptr[n] = n_blk;
    /* the logits stay in backend memory, where the sample op draws from them, unless a row
     * reports logprobs: then the host needs them whole. The argmax of each row comes with
     * them: the token of plain greedy rows. */
    bool host_logits = false;
    int max_draws = 0; /* each sampling sequence and the choices it forks */
    for (int i = 0; i < n; i++) {
        struct core_seq *s = plan_seq(c, i);
        if (s->sq.n_computed + want[i] != s->sq.n_tokens) continue;
        host_logits |= s->req->sp->logprobs >= 0;
        host_logits |= s->req->ge && !c->b->ops->sample_allow; /* constrained rows sample on the host then */
        max_draws += 1 + s->sq.forks_pending;
    }
    if (draws_reserve(c, max_draws)) return ENGINE_ERR_OOM;
    bool device = n_logits > 0 && !host_logits;
    struct fwd_batch bt = {T, n, c->b_tokens, c->b_pos, c->b_seq_start, c->b_indptr, c->b_blocks, c->b_slots,
                           n_logits, c->b_rows, c->greedy_ids, device};
    double t0 = util_now();
    int rc = model_forward(c->m, c->kv, &bt, c->logits);
    double t1 = util_now();
    c->stats.forward_seconds += t1 - t0;
    if (rc != 0) {
        sched_step_failed(&c->sched);
        fail_batch(c, n, "the forward pass");
        core_reap(c);
        return model_failed(c->m) ? ENGINE_ERR_FATAL : ENGINE_ERR_BACKEND;
    }
    sched_step_done(&c->sched);
    /* each token, in batch order; a parent's forks draw from the same logits row. The draws of
     * the sample op go in one call, then every token is accepted in order. */
    int li = 0, n_draws = 0, n_op = 0;
    for (int i = 0; i < n; i++) {
        struct core_seq *s = plan_seq(c, i);
        if (s->sq.n_computed != s->sq.n_tokens) continue;
        int row = li++;
        struct core_request *r = s->req;
        int first_fork = r->n_choices - s->sq.forks_pending;
        if (s->sq.forks_pending && fork_choices(c, s) != 0) {
            core_abort_request(c, r);
            continue;
        }
        int n_sample = s == r->seqs[0] && first_fork < r->n_choices ? r->n_choices - first_fork + 1 : 1;
        for (int k = 0; k < n_sample; k++) {
            struct core_seq *t = k == 0 ? s : r->seqs[first_fork + k - 1];
            if (r->failed || (t->gs && core_seq_fill_mask(c, t) != 0)) continue;
            int n_mask = core_seq_min_mask(c, t);
            struct core_draw *d = &c->draws[n_draws++];
            *d = (struct core_draw){t, row, -1, 0};
            if (device && seq_is_plain_greedy(c, t)) {
                d->id = c->greedy_ids[row];
            } else if (device) {
                d->op = n_op;
                sampler_row(&c->srows[n_op], &t->smp, r->sp, t->n_generated, r->mask, n_mask);
                c->srows[n_op++].row = row;
            } else {
                memcpy(c->work, c->logits + (size_t)row * c->vocab, sizeof(float) * c->vocab);
                d->id = sampler_pick(&t->smp, r->sp, c->work, c->vocab, t->n_generated, r->mask, n_mask,
                                     c->scratch);
            }
        }
    }
    if (n_op && c->b->ops->sample(c->b, c->sids, c->srows, n_op, c->vocab) != 0) {
        c->n_failed = 0; /* failed requests are in the batch: aborted with it */
        fail_batch(c, n, "sampling");
        core_reap(c);
        return ENGINE_ERR_BACKEND;
    }
    /* finished requests are freed at the end of the step (reap); a failed one gets its ERROR below
     * and its later draws are skipped */
    c->t_tokens = util_now();
    for (int i = 0; i < n_draws; i++) {
        const struct core_draw *d = &c->draws[i];
        if (d->seq->req->failed) continue;
        core_seq_accept(c, d->seq, d->op >= 0 ? c->sids[d->op] : d->id,
                         device ? NULL : c->logits + (size_t)d->row * c->vocab);
    }
    for (int i = 0; i < c->n_failed; i++) {
        struct core_request *r = c->failed[i];
        struct engine_event ev = {.type = ENGINE_EVENT_ERROR};
        snprintf(ev.message, sizeof ev.message, "%s", r->fail_msg);
        core_emit_event(r, &ev);
        core_abort_request(c, r);
    }
    c->n_failed = 0;
    core_reap(c);
    c->stats.sample_seconds += util_now() - t1;
    return T;
}

bool core_has_work(const struct core *c) { return sched_has_work(&c->sched); }

void core_queue_state(const struct core *c, int *unseated, int *seats_left) {
    sched_queue_state(&c->sched, unseated, seats_left);
}

void core_stats(const struct core *c, struct engine_stats *st) {
    *st = c->stats;
    struct kv_cache_usage u;
    kv_cache_usage(c->kv, &u);
    st->num_running = sched_num_running(&c->sched);
    st->num_waiting = sched_num_waiting(&c->sched);
    st->preemptions_total = c->sched.preemptions;
    struct kv_prefix_stats ps;
    kv_cache_prefix_stats(c->kv, &ps);
    st->prefix_cache_queries = ps.queries - c->prefix_base.queries;
    st->prefix_cache_hits = ps.hits - c->prefix_base.hits;
    st->prefix_cache_blocks = ps.cached_blocks;
    st->kv_usage_full = u.n_blocks ? 1.0 - (double)u.n_free_blocks / u.n_blocks : 0.0;
    st->kv_usage_streaming = u.n_slots ? 1.0 - (double)u.n_free_slots / u.n_slots : 0.0;
}

const struct model *core_model(const struct core *c) { return c->m; }
const struct tokenizer *core_tokenizer(const struct core *c) { return c->tok; }
const struct kv_cache *core_kv(const struct core *c) { return c->kv; }
int core_max_model_len(const struct core *c) { return c->max_model_len; }
const char *core_model_dir(const struct core *c) { return c->cfg.model_dir; }
int core_max_queue(const struct core *c) { return c->cfg.max_queue; }
int core_max_num_seqs(const struct core *c) { return c->cfg.max_num_seqs; }
const char *core_device(const struct core *c) { return c->b->name; }
const struct engine_config *core_config(const struct core *c) { return &c->cfg; }
const char *core_kv_dtype(const struct core *c) {
    enum kv_dtype dt = kv_cache_dtype(c->kv);
    if (dt == KV_DTYPE_FP8_E4M3) return "fp8_e4m3";
    return dt == KV_DTYPE_BF16 || c->b->ops->act_size == 2 ? "bfloat16" : "float32";
}
struct grammar_cache *core_grammar_cache(struct core *c) { return c->gcache; }

void core_clear_prefix_cache(struct core *c) { kv_cache_prefix_drop(c->kv); }

void core_reset_stats(struct core *c) {
    int capacity = c->stats.kv_capacity_tokens;
    memset(&c->stats, 0, sizeof c->stats);
    c->sched.preemptions = 0;
    kv_cache_prefix_stats(c->kv, &c->prefix_base);
    c->stats.kv_capacity_tokens = capacity;
}
