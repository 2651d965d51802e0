#include "engine/core_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/text/utf8.h"

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

/* ---- outputs ---- */

void core_emit_event(struct core_request *r, struct engine_event *ev) { r->emit(r->ud, ev); }

/* Length of the longest suffix of text that is a proper prefix of a stop string. */
static size_t stop_holdback(const struct core_request *r, const char *text, size_t len) {
    size_t best = 0;
    for (int i = 0; i < r->sp->n_stop; i++) {
        const char *st = r->sp->stop[i];
        size_t sl = r->sp->stop_len[i];
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

void core_seq_finish(struct core *c, struct core_seq *s, enum engine_finish why, const char *stop_str, int32_t stop_id) {
    struct core_request *r = s->req;
    struct engine_event ev = {.type = ENGINE_EVENT_FINISH, .choice = s->choice, .finish = why,
                              .stop_index = -1, .stop_reason_id = stop_id,
                              .prompt_tokens = r->er->n_prompt, .completion_tokens = s->n_generated,
                              .cached_tokens = r->seqs[0]->sq.n_cached,
                              .ttft_s = s->t_first > 0 ? s->t_first - r->t_arrival : 0};
    double t_end = s->n_generated ? s->t_last : util_now(), t_run = s->sq.t_scheduled > 0 ? s->sq.t_scheduled : t_end;
    ev.queue_s = t_run - r->t_arrival;
    ev.prefill_s = (s->t_first > 0 ? s->t_first : t_end) - t_run;
    ev.decode_s = s->t_first > 0 ? t_end - s->t_first : 0;
    ev.text = dup_range(s->text ? s->text + s->emitted : "", s->text ? s->text_len - s->emitted : 0);
    text_emitted(s, s->text_len);
    for (int i = 0; stop_str && i < r->sp->n_stop; i++)
        if (r->sp->stop[i] == stop_str) ev.stop_index = i;
    sched_finish(&c->sched, &s->sq);
    if (why == ENGINE_FINISH_STOP) c->stats.finished_stop++;
    else if (why == ENGINE_FINISH_LENGTH) c->stats.finished_length++;
    else c->stats.finished_abort++;
    /* choices not yet forked finish with their parent (only on abort or error) */
    int pending = s->sq.forks_pending;
    s->sq.forks_pending = 0;
    r->n_done += 1 + pending;
    core_emit_event(r, &ev);
    for (int i = 0; i < pending; i++) {
        struct engine_event e2 = ev;
        e2.choice = r->n_choices - pending + i;
        e2.completion_tokens = 0;
        e2.text = dup_range("", 0);
        core_emit_event(r, &e2);
    }
    if (r->n_done >= r->n_choices) { /* freed by core_reap(), after the step or abort that ended it */
        r->next_done = c->done;
        c->done = r;
    }
}

static bool is_eos(const struct core *c, int32_t id) {
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos[i] == id) return true;
    return false;
}

/* Marks r failed (once): after this step's tokens it gets an ERROR event and is aborted, and its
 * remaining draws of the step are skipped. Returns -1. */
int core_fail_request(struct core *c, struct core_request *r, const char *fmt, const char *detail) {
    if (r->failed) return -1;
    r->failed = true;
    snprintf(r->fail_msg, sizeof r->fail_msg, fmt, detail);
    c->failed[c->n_failed++] = r;
    return -1;
}

/* Structured output: s's next draw may only take the tokens that keep its text in the grammar
 * (s->allow, which the sampler row points at). Returns 0, or -1 with r failed when no token may
 * follow or the mask cannot be made. */
int core_seq_fill_mask(struct core *c, struct core_seq *s) {
    struct core_request *r = s->req;
    bool at_start = tokenizer_stream_at_start(&s->detok);
    int rc = token_mask_fill(r->tm, s->gs, at_start, s->allow);
    if (rc)
        return core_fail_request(c, r, "structured output: the text cannot go on within the grammar's limits (%s: more "
                                  "than 1024 alternatives alive at once, or nesting deeper than 512)", grammar_strerror(rc));
    size_t words = grammar_cache_mask_words(c->gcache);
    uint32_t any = 0;
    for (size_t i = 0; i < words; i++) any |= s->allow[i];
    if (!any)
        return core_fail_request(c, r, "structured output: %s",
                            "no token of the vocabulary can continue the text here (the output nests deeper than "
                            "the grammar's limits allow)");
    s->smp.allow = s->allow;
    return 0;
}

/* The ids min_tokens masks for s's next draw (EOS and stop ids while it has fewer than
 * min_tokens), none when the grammar allows nothing else: its text is complete, and min_tokens
 * must not push it past its end. */
int core_seq_min_mask(const struct core *c, const struct core_seq *s) {
    const struct core_request *r = s->req;
    if (!s->gs || s->n_generated >= r->sp->min_tokens) return r->n_mask;
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
int core_seq_accept(struct core *c, struct core_seq *s, int32_t id, const float *raw) {
    struct core_request *r = s->req;
    const struct engine_sampling *sp = r->sp;
    /* the grammar first: a token outside the mask (a sampler fault) fails the request */
    bool grammar_eos = false;
    if (s->gs) {
        if (token_mask_accept(r->tm, s->gs, id, tokenizer_stream_at_start(&s->detok)) != 0) {
            char what[48];
            snprintf(what, sizeof what, "%d", (int)id);
            return core_fail_request(c, r, "structured output: the sampler drew token %s, which the grammar does not allow",
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
    s->tokens[s->sq.n_tokens++] = id;
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
    if (!fin && (s->n_generated >= sp->max_tokens || s->sq.n_tokens >= c->max_model_len)) fin = ENGINE_FINISH_LENGTH;
    if (fin) {
        /* the held-back bytes of an unfinished character go out with the finish */
        if (c->tok && !stop_str) {
            const char *piece;
            size_t plen;
            if (tokenizer_stream_flush(&s->detok, &piece, &plen) == 0) text_append(s, piece, plen);
        }
        ev.text = dup_range("", 0);
        ev.token_text_at = (int)(chars_before - s->emitted_chars);
        core_emit_event(r, &ev);
        core_seq_finish(c, s, fin, stop_str, stop_id);
        return 1;
    }
    size_t safe = s->text_len - (sp->n_stop ? stop_holdback(r, s->text + s->emitted, s->text_len - s->emitted) : 0);
    ev.text = dup_range(s->text ? s->text + s->emitted : "", safe > s->emitted ? safe - s->emitted : 0);
    ev.token_text_at = (int)(chars_before - s->emitted_chars);
    text_emitted(s, safe);
    core_emit_event(r, &ev);
    return 0;
}

