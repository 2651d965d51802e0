/* http_gen: completions, chat completions, /tokenize and /detokenize.
 *
 * A request's parsing, tokenizing and submission run on a worker (gen_work, tok_work); its
 * answer then goes out on the loop thread:
 *   non-streamed: each engine notify queues the request on srv->ready and wakes the loop, which
 *      pops its events into the choices; once every choice finished, the JSON (built on a
 *      worker when it is large) is the response;
 *   streamed: each wake-up turns the new events into SSE frames written at once; while the
 *      client has more than HIGH_WATER bytes unread, events wait in the engine's queue. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/engine.h"
#include "server/http_impl.h"
#include "server/prompt.h"

#define HIGH_WATER (1u << 20)   // unsent bytes of a stream past which it waits for the client
#define BUILD_ON_WORKER 4096    // response entries (tokens x (1 + logprobs)) past which the JSON is built on a worker

static int sbuf_put(struct sbuf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n + 1) cap *= 2;
        char *t = realloc(b->s, cap);
        if (!t) return -1;
        b->s = t;
        b->cap = cap;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    return 0;
}

/* Takes ownership of frame (NULL: out of memory, reported as -1). */
static int sbuf_put_owned(struct sbuf *b, char *frame) {
    if (!frame) return -1;
    int rc = sbuf_put(b, frame, strlen(frame));
    free(frame);
    return rc;
}

/* ---- the engine's side ---- */

void http_gen_notify(void *ud) {
    struct http_req *r = ud;
    struct http_server *s = r->srv;
    pthread_mutex_lock(&s->mu);
    if (!r->queued) {
        r->queued = true;
        r->ready_next = s->ready;
        s->ready = r;
    }
    pthread_mutex_unlock(&s->mu);
    hio_wake(s->io);
}

static void record_token_timing(struct http_req *r, int choice) {
    double t = http_now();
    struct metrics *m = &r->srv->metrics;
    if (r->ttft < 0) {
        r->ttft = t - r->t_start;
        metrics_observe(m, METRICS_TTFT, r->ttft);
    }
    struct choice_state *cs = &r->cs[choice];
    if (cs->t_last > 0) metrics_observe(m, METRICS_ITL, t - cs->t_last);
    cs->t_last = t;
}

/* The stop string that ended a choice, as the request gave it (with OPENAI_NUL where the
 * engine's copy has NUL bytes). */
static const char *stop_reason(const struct http_req *r, const struct engine_event *ev) {
    if (ev->stop_index >= 0 && ev->stop_index < r->oreq.sp.n_stop) return r->oreq.stop[ev->stop_index];
    return ev->stop_reason_str;
}

/* Streams one event of choice ci as SSE. */
static int stream_event(struct http_req *r, int ci, const struct engine_event *ev) {
    if (r->choices[ci].tools) { // content and tool-call deltas
        struct engine_event tev = *ev;
        tev.stop_reason_str = stop_reason(r, ev);
        return sbuf_put_owned(&r->out, openai_chunk_tools_sse(&r->rctx, ci, &r->choices[ci], &tev));
    }
    const char *text = ev->text ? ev->text : "";
    struct choice_state *cs = &r->cs[ci];
    size_t offset = cs->chars;
    for (const char *p = text; *p; p++) cs->chars += ((unsigned char)*p & 0xC0) != 0x80;
    if (ev->type == ENGINE_EVENT_TOKEN) {
        if (!text[0] && r->rctx.logprobs < 0) return 0; // nothing to say yet (held-back bytes)
        return sbuf_put_owned(&r->out, openai_chunk_sse(&r->rctx, ci, text, ev, offset, ENGINE_FINISH_NONE, NULL, -1));
    }
    // FINISH: the tail and the finish reason in one chunk.
    return sbuf_put_owned(&r->out, openai_chunk_sse(&r->rctx, ci, text, NULL, offset, ev->finish, stop_reason(r, ev),
                                                    ev->stop_reason_id));
}

static int accumulate_event(struct http_req *r, int ci, const struct engine_event *ev) {
    struct openai_choice *c = &r->choices[ci];
    if (openai_choice_add_event(c, ev, r->rctx.logprobs >= 0)) return -1;
    if (ev->type == ENGINE_EVENT_FINISH) {
        c->finish = ev->finish;
        c->done = true;
        c->stop_reason_id = ev->stop_reason_id;
        const char *stop = stop_reason(r, ev);
        if (stop && !(c->stop_reason_str = strdup(stop))) return -1;
        if (ev->completion_tokens > 0) c->completion_tokens = ev->completion_tokens;
    }
    return 0;
}

/* Pops every queued event of every prompt; sets r->finished when all are done. Returns -1
 * when out of memory (the request then fails). */
static int pump(struct http_req *r) {
    int n = r->oreq.sp.n, rc = 0;
    for (int p = 0; p < r->n_handles; p++) {
        if (r->h_done[p]) continue;
        struct engine_event ev;
        int got;
        while ((got = engine_poll(r->h[p], &ev)) == 1) {
            if (ev.type == ENGINE_EVENT_ERROR) {
                if (!r->failed) {
                    r->failed = true;
                    openai_fail(&r->ferr, 500, NULL, NULL, "%s", ev.message);
                }
            } else if (ev.choice >= 0 && ev.choice < n) {
                int ci = p * n + ev.choice;
                struct openai_choice *c = &r->choices[ci];
                if (ev.type == ENGINE_EVENT_TOKEN) record_token_timing(r, ci);
                if (ev.type == ENGINE_EVENT_FINISH && ev.choice == 0) r->cached_tokens += ev.cached_tokens;
                if (!r->stream) {
                    if (accumulate_event(r, ci, &ev)) rc = -1;
                } else {
                    // streamed: choices[] keeps only the usage and finish reason
                    if (ev.type == ENGINE_EVENT_TOKEN) c->completion_tokens++;
                    if (ev.type == ENGINE_EVENT_FINISH) {
                        c->finish = ev.finish;
                        c->done = true;
                        if (ev.completion_tokens > 0) c->completion_tokens = ev.completion_tokens;
                    }
                    if (stream_event(r, ci, &ev)) rc = -1;
                }
            }
            free(ev.text);
        }
        if (got < 0) r->h_done[p] = true;
    }
    bool all = true;
    for (int p = 0; p < r->n_handles; p++) all &= r->h_done[p];
    if (all && !r->finished) {
        r->finished = true;
        metrics_observe(&r->srv->metrics, METRICS_E2E, http_now() - r->t_start);
    }
    return rc;
}

static struct openai_usage usage_of(const struct http_req *r) {
    return (struct openai_usage){.prompt_tokens = r->prompt_tokens, .completion_tokens = http_req_completion_tokens(r),
                                 .cached_tokens = r->cached_tokens};
}

static void cancel_handles(struct http_req *r) {
    for (int p = 0; p < r->n_handles; p++)
        if (!r->h_done[p]) engine_cancel(r->h[p]);
}

/* ---- work on a worker ---- */

static void job_start(struct http_req *r, void (*work)(void *)) ;

static void build_work(void *arg) {
    struct http_req *r = arg;
    struct openai_usage u = usage_of(r);
    r->job_body = openai_response_json(&r->rctx, r->choices, r->n_choices, &u);
    if (!r->job_body) openai_fail(&r->jerr, 500, NULL, NULL, "out of memory");
}

/* The non-streamed answer, once every choice finished. */
static void pump_plain(struct http_req *r) {
    if (r->status) return;
    if (pump(r)) {
        r->failed = true;
        openai_fail(&r->ferr, 500, NULL, NULL, "out of memory");
        cancel_handles(r);
    }
    if (!r->finished) return;
    if (r->failed) {
        http_respond_error(r, &r->ferr);
        return;
    }
    long long entries = (long long)http_req_completion_tokens(r) * (1 + (r->rctx.logprobs > 0 ? r->rctx.logprobs : 0));
    if (entries > BUILD_ON_WORKER) {
        r->large = true;
        job_start(r, build_work);
        return;
    }
    struct openai_usage u = usage_of(r);
    http_respond(r, 200, openai_response_json(&r->rctx, r->choices, r->n_choices, &u), "application/json");
}

/* Chat role chunks and echoed prompts: what a stream says before its first token. */
static int stream_begin(struct http_req *r) {
    int n = r->oreq.sp.n;
    for (int ci = 0; ci < r->n_choices; ci++) {
        if (r->oreq.kind == OPENAI_CHAT && sbuf_put_owned(&r->out, openai_chunk_role_sse(&r->rctx, ci))) return -1;
        const char *echo = r->oreq.echo ? r->oreq.prompts[ci / n].text : NULL;
        if (echo && echo[0]) {
            for (const char *p = echo; *p; p++) r->cs[ci].chars += ((unsigned char)*p & 0xC0) != 0x80;
            if (sbuf_put_owned(&r->out, openai_chunk_sse(&r->rctx, ci, echo, NULL, 0, ENGINE_FINISH_NONE, NULL, -1)))
                return -1;
        }
    }
    return 0;
}

static void stream_flush(struct http_req *r) {
    if (r->out.len) {
        if (hio_stream_write(r->q, r->out.s, r->out.len)) cancel_handles(r);
        r->out.len = 0;
        r->t_last_write = http_now();
    }
    if (r->stream_closed) hio_stream_end(r->q);
    else if (hio_unsent(r->q) > HIGH_WATER) r->blocked = true;
}

static void pump_stream(struct http_req *r) {
    if (r->stream_closed || r->blocked) return;
    int rc = pump(r);
    if (rc && !r->failed) {
        r->failed = true;
        openai_fail(&r->ferr, 500, NULL, NULL, "out of memory");
        cancel_handles(r);
        r->finished = true; // what is left is not waited for
    }
    if (r->finished) {
        r->stream_closed = true;
        if (r->failed) sbuf_put_owned(&r->out, openai_error_sse(&r->ferr));
        if (r->oreq.include_usage && !r->failed) {
            struct openai_usage u = usage_of(r);
            sbuf_put_owned(&r->out, openai_chunk_usage_sse(&r->rctx, &u));
        }
        sbuf_put(&r->out, "data: [DONE]\n\n", 14);
    }
    stream_flush(r);
}

void http_gen_pump(struct http_req *r) {
    if (!r->q || r->job || !r->started) return;
    if (r->stream) pump_stream(r);
    else pump_plain(r);
}

static void add_active(struct http_req *r) {
    struct http_server *s = r->srv;
    pthread_mutex_lock(&s->mu);
    r->next = s->active;
    if (s->active) s->active->prev = r;
    s->active = r;
    s->n_active++;
    r->gen = true;
    pthread_mutex_unlock(&s->mu);
}

/* Worker: parse, tokenize, submit. A refusal is left in r->jerr. */
static void gen_work(void *arg) {
    struct http_req *r = arg;
    struct http_server *s = r->srv;
    struct engine *e = atomic_load(&s->engine);
    struct openai_limits lim;
    http_limits_of(s, e, &lim);
    enum openai_kind kind = r->route == ROUTE_CHAT ? OPENAI_CHAT : OPENAI_COMPLETION;
    struct openai_request *q = &r->oreq;
    struct openai_error *err = &r->jerr;
    int prc = openai_parse_request(r->body ? r->body : "", r->body_len, kind, &lim, q, err);
    http_release_body(r); // parsed: the request's own copy holds what is needed
    if (prc) return;
    const struct tokenizer *tok = engine_tokenizer(e);
    if (prompt_prepare(q, tok, s->tmpl, &lim, err)) return;

    // The client's request id (header first, then the body's request_id) names the response, as in vLLM.
    const char *prefix = kind == OPENAI_CHAT ? "chatcmpl" : "cmpl";
    const char *given = r->req_id_given ? r->req_id : q->request_id;
    if (given) snprintf(r->id, sizeof r->id, "%s-%.*s", prefix, OPENAI_MAX_REQUEST_ID, given);
    else http_make_id(s, r->id, sizeof r->id, prefix);
    r->rctx = (struct openai_resp_ctx){
        .kind = kind, .id = r->id, .model = s->cfg.model_name, .created = (long long)time(NULL),
        .system_fingerprint = s->fingerprint,
        .logprobs = q->logprobs, .tokens_as_ids = q->return_tokens_as_token_ids,
        .piece = prompt_token_bytes, .piece_ud = (void *)tok,
    };
    r->stream = q->stream;
    r->n_handles = q->n_prompts;
    r->n_choices = q->n_prompts * q->sp.n;
    r->h = calloc((size_t)r->n_handles, sizeof *r->h);
    r->h_done = calloc((size_t)r->n_handles, sizeof *r->h_done);
    r->choices = calloc((size_t)r->n_choices, sizeof *r->choices);
    r->cs = calloc((size_t)r->n_choices, sizeof *r->cs);
    if (!r->h || !r->h_done || !r->choices || !r->cs) {
        r->n_handles = 0;
        openai_fail(err, 500, NULL, NULL, "out of memory");
        return;
    }
    for (int i = 0; i < r->n_choices; i++) {
        openai_choice_init(&r->choices[i]);
        const char *echo = q->echo && !r->stream ? q->prompts[i / q->sp.n].text : NULL;
        if ((echo && openai_choice_append(&r->choices[i], echo, strlen(echo))) ||
            openai_choice_init_tools(&r->choices[i], q, (uint64_t)(http_now() * 1e9) ^ (uintptr_t)r ^ (uint64_t)i << 48)) {
            r->n_handles = 0;
            openai_fail(err, 500, NULL, NULL, "out of memory");
            return;
        }
    }
    for (int p = 0; p < q->n_prompts; p++) r->prompt_tokens += q->prompts[p].n_ids;

    // Submit every prompt; on a refusal withdraw those already submitted.
    for (int p = 0; p < q->n_prompts; p++) {
        struct engine_request er = {.prompt = q->prompts[p].ids, .n_prompt = q->prompts[p].n_ids, .sp = q->sp};
        char msg[256] = "";
        int rc = engine_submit(e, &er, http_gen_notify, r, &r->h[p], msg, sizeof msg);
        if (rc == ENGINE_OK) continue;
        r->n_handles = p; // http_req_end releases these
        cancel_handles(r);
        openai_submit_error(q, rc, msg[0] ? msg : engine_strerror(rc), err);
        return;
    }
    add_active(r);
}

/* Worker: /tokenize and /detokenize. */
static void tok_work(void *arg) {
    struct http_req *r = arg;
    struct engine *e = atomic_load(&r->srv->engine);
    const struct tokenizer *tok = engine_tokenizer(e);
    struct openai_limits lim;
    http_limits_of(r->srv, e, &lim);
    struct openai_error *err = &r->jerr;
    struct openai_request *q = &r->oreq;
    enum openai_kind kind = r->route == ROUTE_TOKENIZE ? OPENAI_TOKENIZE : OPENAI_DETOKENIZE;
    int prc = openai_parse_request(r->body ? r->body : "", r->body_len, kind, &lim, q, err);
    http_release_body(r);
    if (prc) return;
    if (kind == OPENAI_DETOKENIZE) {
        char *text = prompt_decode(tok, q->prompts[0].ids, q->prompts[0].n_ids, false, err);
        if (text) r->job_body = openai_detokenize_json(text);
        free(text);
    } else if (!prompt_prepare(q, tok, r->srv->tmpl, &lim, err)) {
        const struct openai_prompt *p = &q->prompts[0];
        // A token string costs a JSON string each: bounded like a prompt, by the context.
        if (q->return_token_strs && p->n_ids > lim.max_model_len) {
            openai_fail(err, 400, "request_too_large", "return_token_strs",
                        "'return_token_strs' is limited to prompts of at most max_model_len (%d) tokens; this one has %d",
                        lim.max_model_len, p->n_ids);
            return;
        }
        char **strs = NULL;
        if (q->return_token_strs && p->n_ids > 0 && (strs = calloc((size_t)p->n_ids, sizeof *strs))) {
            for (int i = 0; i < p->n_ids; i++) {
                char buf[256];
                strs[i] = strdup(prompt_token_piece((void *)tok, p->ids[i], buf, sizeof buf));
            }
        }
        r->job_body = openai_tokenize_json(p->ids, p->n_ids, lim.max_model_len, q->return_token_strs ? strs : NULL);
        if (strs)
            for (int i = 0; i < p->n_ids; i++) free(strs[i]);
        free(strs);
    }
    if (!err->status && !r->job_body) openai_fail(err, 500, NULL, NULL, "out of memory");
}

/* Loop thread: the job of r ended. */
static void job_done(void *arg) {
    struct http_req *r = arg;
    struct http_server *s = r->srv;
    r->job = false;
    pthread_mutex_lock(&s->mu);
    s->n_jobs--;
    pthread_mutex_unlock(&s->mu);
    if (r->gone) {
        http_req_end(r, false); // the connection closed while the job ran
        return;
    }
    if (r->jerr.status) {
        http_respond_error(r, &r->jerr);
        return;
    }
    if (r->job_body) {
        char *body = r->job_body;
        r->job_body = NULL;
        http_respond(r, 200, body, "application/json");
        return;
    }
    r->started = true;
    r->t_last_write = http_now();
    if (!r->stream) {
        pump_plain(r);
        return;
    }
    struct hio_headers h = {0};
    hio_headers_add(&h, "Content-Type", "text/event-stream; charset=utf-8");
    hio_headers_add(&h, "Cache-Control", "no-cache");
    hio_headers_add(&h, "X-Accel-Buffering", "no");
    http_common_headers(r, &h);
    r->status = 200;
    if (hio_stream_start(r->q, 200, &h) || stream_begin(r)) {
        cancel_handles(r);
        return;
    }
    pump_stream(r);
}

static void job_start(struct http_req *r, void (*work)(void *)) {
    struct http_server *s = r->srv;
    r->job = true;
    pthread_mutex_lock(&s->mu);
    s->n_jobs++;
    pthread_mutex_unlock(&s->mu);
    if (hio_work(s->io, work, job_done, r)) {
        r->job = false;
        pthread_mutex_lock(&s->mu);
        s->n_jobs--;
        pthread_mutex_unlock(&s->mu);
        http_respond(r, 500, NULL, NULL);
    }
}

void http_gen_dispatch(struct http_req *r) {
    job_start(r, r->route == ROUTE_TOKENIZE || r->route == ROUTE_DETOKENIZE ? tok_work : gen_work);
}

/* ---- periodic work and the end ---- */

void http_gen_tick(struct http_server *s) {
    double t = http_now();
    pthread_mutex_lock(&s->mu);
    for (struct http_req *r = s->active; r; r = r->next) {
        if (s->cfg.request_timeout_s > 0 && t - r->t_start > s->cfg.request_timeout_s && !r->cancelled) {
            r->cancelled = true;
            for (int p = 0; p < r->n_handles; p++) engine_cancel(r->h[p]);
        }
        // a stream quiet for keepalive_s (queued, or prefilling a long prompt) gets a comment
        if (r->stream && r->started && !r->job && r->q && !r->stream_closed && !r->blocked && s->cfg.keepalive_s > 0 &&
            t - r->t_last_write >= s->cfg.keepalive_s) {
            hio_stream_write(r->q, ": keep-alive\n\n", 14);
            r->t_last_write = t;
        }
    }
    pthread_mutex_unlock(&s->mu);
}
