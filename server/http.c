/* http: libmicrohttpd daemon, routing, auth, limits, generation requests and SSE, drain.
 *
 * Life of a generation request (one struct http_req per HTTP request):
 *   1st access-handler call (headers only): route, method, API key, state, Content-Length;
 *      errors here are answered before the body is read.
 *   further calls: body bytes, bounded by max_request_bytes.
 *   last call: parse + validate (openai.c), tokenize (prompt.c), engine_submit per prompt.
 *      Non-streamed: the connection is suspended; each engine notify resumes it, the handler
 *      runs again, pops events, and queues the JSON once every choice finished.
 *      Streamed: a callback response is queued at once; its reader pops events into SSE
 *      frames and suspends the connection when it has nothing to send.
 *   completion callback: engine_release (cancels what still runs), metrics, one log line.
 * A request is on the server's active list from submit until its completion callback; the
 * tick walks that list. Lock order: srv->mu, then r->mu; no engine call under r->mu. */
#include "server/http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "engine/engine.h"
#include "server/cors.h"
#include "server/log.h"
#include "server/metrics.h"
#include "server/openai.h"
#include "server/prompt.h"
#include "server/version.h"

struct http_req;

struct http_server {
    struct http_config cfg;
    struct MHD_Daemon *daemon;
    int port;
    _Atomic int state;              // enum http_state
    struct engine *_Atomic engine;  // set once by http_set_engine
    struct metrics metrics;
    long long created;              // unix seconds at start (for /v1/models)
    pthread_mutex_t mu;             // guards the active list
    struct http_req *active;
    int n_active;
    atomic_ullong next_id;
    uint64_t id_salt;
    struct cors cors;
    char fingerprint[48];           // system_fingerprint of every completion
};

enum route {
    ROUTE_NONE,
    ROUTE_HEALTH,
    ROUTE_PING,
    ROUTE_VERSION,
    ROUTE_METRICS,
    ROUTE_MODELS,
    ROUTE_MODEL,
    ROUTE_COMPLETIONS,
    ROUTE_CHAT,
    ROUTE_TOKENIZE,
    ROUTE_DETOKENIZE,
};

struct choice_state {
    size_t chars;    // code points streamed so far (text_offset)
    double t_last;   // time of its last token (inter-token latency)
};

struct sbuf {
    char *s;
    size_t len, cap, off; // off: bytes already handed to libmicrohttpd
};

struct http_req {
    struct http_server *srv;
    struct MHD_Connection *conn;
    enum route route;
    char method[12];
    char path[128];
    double t_start;
    int status;
    char *err_msg;                  // for the log line
    char req_id[OPENAI_MAX_REQUEST_ID + 32]; // X-Request-Id: the client's, else the completion id or a generated one
    bool req_id_given;
    bool preflight;                 // a CORS preflight: its own Access-Control-* headers

    char *body;
    size_t body_len, body_cap;
    bool too_big;                   // answered 413 once the body has been read (and discarded)
    size_t discarded;               // body bytes read and dropped

    // generation (route COMPLETIONS or CHAT after submit)
    bool gen;                       // on the active list
    struct openai_request oreq;
    struct openai_resp_ctx rctx;
    char id[OPENAI_MAX_REQUEST_ID + 32]; // "chatcmpl-" + the request id
    int n_handles;
    struct engine_handle **h;
    bool *h_done;
    int n_choices;                  // n_prompts * n
    struct openai_choice *choices;  // non-streamed output
    struct choice_state *cs;
    int prompt_tokens;
    double ttft;                    // < 0 until the first token
    bool finished;                  // every handle returned -1
    bool failed;
    struct openai_error ferr;
    bool cancelled;                 // by the tick (client gone or timeout) or drain; under srv->mu
    bool stream;
    bool stream_started;            // role chunks / echo sent
    bool stream_closed;             // [DONE] queued
    struct sbuf out;
    _Atomic double t_last_write;    // read by the tick

    // wakeups; under mu
    pthread_mutex_t mu;
    bool suspended;                 // we suspended the connection and nobody resumed it yet
    bool pending;                   // notify came since the last pump
    bool keepalive_due;

    struct http_req *prev, *next;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void make_id(struct http_server *s, char *buf, size_t n, const char *prefix) {
    unsigned long long k = atomic_fetch_add(&s->next_id, 1);
    uint64_t x = s->id_salt ^ (k * 0x9E3779B97F4A7C15ull);
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    snprintf(buf, n, "%s-%016llx%llx", prefix, (unsigned long long)x, k);
}

/* ---- output buffer ---- */

static int sbuf_put(struct sbuf *b, const char *s, size_t n) {
    if (b->off == b->len) b->off = b->len = 0;
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

/* ---- routes ---- */

static enum route route_of(const char *url) {
    if (!strcmp(url, "/health")) return ROUTE_HEALTH;
    if (!strcmp(url, "/ping")) return ROUTE_PING;
    if (!strcmp(url, "/version")) return ROUTE_VERSION;
    if (!strcmp(url, "/metrics")) return ROUTE_METRICS;
    if (!strcmp(url, "/v1/models")) return ROUTE_MODELS;
    if (!strncmp(url, "/v1/models/", 11) && url[11]) return ROUTE_MODEL;
    if (!strcmp(url, "/v1/completions")) return ROUTE_COMPLETIONS;
    if (!strcmp(url, "/v1/chat/completions")) return ROUTE_CHAT;
    if (!strcmp(url, "/tokenize")) return ROUTE_TOKENIZE;
    if (!strcmp(url, "/detokenize")) return ROUTE_DETOKENIZE;
    return ROUTE_NONE;
}

/* The Allow header of a route (and the methods first_call admits). */
static const char *allowed_methods(enum route rt) {
    switch (rt) {
    case ROUTE_HEALTH:
    case ROUTE_VERSION:
    case ROUTE_METRICS:
    case ROUTE_MODELS:
    case ROUTE_MODEL: return "GET, HEAD";
    case ROUTE_PING: return "GET, HEAD, POST"; // SageMaker's probe; vLLM answers both
    default: return "POST";
    }
}

static bool method_allowed(enum route rt, const char *method) {
    const char *allow = allowed_methods(rt);
    size_t n = strlen(method);
    for (const char *p = allow; n && (p = strstr(p, method)); p += n)
        if ((p == allow || p[-1] == ' ') && (p[n] == ',' || !p[n])) return true;
    return false;
}

/* Probes and information that need neither an API key nor a loaded model. */
static bool route_is_open(enum route rt) {
    return rt == ROUTE_HEALTH || rt == ROUTE_PING || rt == ROUTE_VERSION || rt == ROUTE_METRICS;
}

/* ---- responses ---- */

static const char *header(const struct http_req *r, const char *name) {
    return MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, name);
}

/* Drain, X-Request-Id (vLLM's --enable-request-id-headers: the client's id echoed, else the
 * completion id, else a generated one) and CORS. */
static void add_common_headers(struct http_req *r, struct MHD_Response *resp) {
    struct http_server *s = r->srv;
    if (atomic_load(&s->state) == HTTP_STATE_DRAINING) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    if (!r->req_id[0]) {
        if (r->id[0]) snprintf(r->req_id, sizeof r->req_id, "%s", r->id);
        else make_id(s, r->req_id, sizeof r->req_id, "req");
    }
    MHD_add_response_header(resp, "X-Request-Id", r->req_id);
    const char *origin = header(r, "Origin");
    if (r->preflight) cors_preflight_headers(&s->cors, origin, header(r, "Access-Control-Request-Headers"), resp);
    else cors_add_headers(&s->cors, origin, header(r, MHD_HTTP_HEADER_COOKIE) != NULL, resp);
}

/* Queues body (malloc'd, taken over; NULL = out of memory) with status. */
static enum MHD_Result respond(struct http_req *r, int status, char *body, const char *ctype) {
    if (!body) {
        static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,\"code\":null}}";
        status = 500;
        body = strdup(oom);
        ctype = "application/json";
        if (!body) return MHD_NO;
    }
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    add_common_headers(r, resp);
    if (status == 401) MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (status == 429 || status == 503) MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    if (status == 405) MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, allowed_methods(r->route));
    r->status = status;
    enum MHD_Result ret = MHD_queue_response(r->conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    return ret;
}

static enum MHD_Result respond_error(struct http_req *r, const struct openai_error *err) {
    free(r->err_msg);
    r->err_msg = strdup(err->message);
    return respond(r, err->status, openai_error_json(err), "application/json");
}

static enum MHD_Result fail(struct http_req *r, int status, const char *code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static enum MHD_Result fail(struct http_req *r, int status, const char *code, const char *param, const char *fmt, ...) {
    struct openai_error err;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    openai_fail(&err, status, code, param, "%s", msg);
    return respond_error(r, &err);
}

/* ---- auth ---- */

/* Compares in time that depends only on the length of the expected key. */
static bool key_equal(const char *given, const char *expected) {
    size_t ng = strlen(given), ne = strlen(expected);
    volatile unsigned char diff = (unsigned char)(ng != ne);
    for (size_t i = 0; i < ne; i++) diff |= (unsigned char)(expected[i] ^ (ng ? given[i % ng] : 0));
    return diff == 0;
}

static bool authorized(struct http_req *r) {
    const char *key = r->srv->cfg.api_key;
    if (!key || !key[0]) return true;
    const char *h = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncasecmp(h, "Bearer ", 7) != 0) return false;
    h += 7;
    while (*h == ' ') h++;
    return key_equal(h, key);
}

/* ---- simple endpoints ---- */

static enum MHD_Result handle_health(struct http_req *r) {
    int st = atomic_load(&r->srv->state);
    if (st == HTTP_STATE_READY) return respond(r, 200, strdup("{\"status\":\"ok\"}"), "application/json");
    return fail(r, 503, NULL, NULL, st == HTTP_STATE_LOADING ? "the model is loading" : "the server is shutting down");
}

static enum MHD_Result handle_version(struct http_req *r) {
    return respond(r, 200, strdup("{\"version\":\"" DUO_VERSION "\"}"), "application/json");
}

/* A CORS preflight, on any path: answered without routing or the API key (browsers send no
 * credentials with it), like Starlette's CORSMiddleware in front of vLLM. */
static enum MHD_Result handle_preflight(struct http_req *r) {
    char what[64];
    const char *origin = header(r, "Origin"), *method = header(r, "Access-Control-Request-Method");
    if (cors_preflight_check(&r->srv->cors, origin, method, header(r, "Access-Control-Request-Headers"), what, sizeof what))
        return fail(r, 400, "cors_disallowed", NULL, "Disallowed CORS %s", what);
    return respond(r, 200, strdup("OK"), "text/plain; charset=utf-8");
}

static enum MHD_Result handle_metrics(struct http_req *r) {
    struct engine *e = atomic_load(&r->srv->engine);
    struct engine_stats st;
    if (e) engine_get_stats(e, &st);
    return respond(r, 200, metrics_render(&r->srv->metrics, e ? &st : NULL, r->srv->cfg.model_name),
                   "text/plain; version=0.0.4; charset=utf-8");
}

static enum MHD_Result handle_models(struct http_req *r, const char *url) {
    struct http_server *s = r->srv;
    struct engine *e = atomic_load(&s->engine);
    if (r->route == ROUTE_MODEL && strcmp(url + 11, s->cfg.model_name) != 0)
        return fail(r, 404, "model_not_found", "model", "The model `%.200s` does not exist.", url + 11);
    char *j = openai_models_json(s->cfg.model_name, s->cfg.model_root, s->created, engine_max_model_len(e));
    if (j && r->route == ROUTE_MODEL) { // the single model object
        cJSON *root = cJSON_Parse(j);
        cJSON *m = root ? cJSON_DetachItemFromArray(cJSON_GetObjectItem(root, "data"), 0) : NULL;
        free(j);
        j = m ? cJSON_PrintUnformatted(m) : NULL;
        cJSON_Delete(m);
        cJSON_Delete(root);
    }
    return respond(r, 200, j, "application/json");
}

static void limits_of(struct http_server *s, struct engine *e, struct openai_limits *lim) {
    lim->model_name = s->cfg.model_name;
    lim->vocab_size = engine_vocab_size(e);
    lim->max_model_len = engine_max_model_len(e);
    lim->max_n = s->cfg.max_n > 0 ? s->cfg.max_n : engine_max_num_seqs(e);
}

static enum MHD_Result handle_tokenize(struct http_req *r) {
    struct engine *e = atomic_load(&r->srv->engine);
    const struct tokenizer *tok = engine_tokenizer(e);
    struct openai_limits lim;
    limits_of(r->srv, e, &lim);
    struct openai_error err;
    struct openai_request q;
    enum openai_kind kind = r->route == ROUTE_TOKENIZE ? OPENAI_TOKENIZE : OPENAI_DETOKENIZE;
    if (openai_parse_request(r->body ? r->body : "", r->body_len, kind, &lim, &q, &err)) return respond_error(r, &err);
    char *j = NULL;
    if (kind == OPENAI_DETOKENIZE) {
        char *text = prompt_decode(tok, q.prompts[0].ids, q.prompts[0].n_ids, false, &err);
        if (!text) {
            openai_request_free(&q);
            return respond_error(r, &err);
        }
        j = openai_detokenize_json(text);
        free(text);
    } else {
        if (prompt_prepare(&q, tok, engine_chat_template(e), &lim, &err)) {
            openai_request_free(&q);
            return respond_error(r, &err);
        }
        const struct openai_prompt *p = &q.prompts[0];
        char **strs = NULL;
        if (q.return_token_strs && p->n_ids > 0 && (strs = calloc((size_t)p->n_ids, sizeof *strs))) {
            for (int i = 0; i < p->n_ids; i++) {
                char buf[256];
                strs[i] = strdup(prompt_token_piece((void *)tok, p->ids[i], buf, sizeof buf));
            }
        }
        j = openai_tokenize_json(p->ids, p->n_ids, lim.max_model_len, q.return_token_strs ? strs : NULL);
        if (strs)
            for (int i = 0; i < p->n_ids; i++) free(strs[i]);
        free(strs);
    }
    openai_request_free(&q);
    return respond(r, 200, j, "application/json");
}

/* ---- generation ---- */

static void on_notify(void *ud) {
    struct http_req *r = ud;
    pthread_mutex_lock(&r->mu);
    r->pending = true;
    if (r->suspended) {
        r->suspended = false;
        MHD_resume_connection(r->conn);
    }
    pthread_mutex_unlock(&r->mu);
}

/* Suspends the connection unless a notify came since the last pump. True when suspended. */
static bool try_suspend(struct http_req *r) {
    pthread_mutex_lock(&r->mu);
    bool ok = !r->pending && !r->keepalive_due;
    if (ok) {
        r->suspended = true;
        MHD_suspend_connection(r->conn);
    }
    pthread_mutex_unlock(&r->mu);
    return ok;
}

static void clear_pending(struct http_req *r) {
    pthread_mutex_lock(&r->mu);
    r->pending = false;
    pthread_mutex_unlock(&r->mu);
}

static void record_token_timing(struct http_req *r, int choice) {
    double t = now_s();
    struct metrics *m = &r->srv->metrics;
    if (r->ttft < 0) {
        r->ttft = t - r->t_start;
        metrics_observe(m, METRICS_TTFT, r->ttft);
    }
    struct choice_state *cs = &r->cs[choice];
    if (cs->t_last > 0) metrics_observe(m, METRICS_ITL, t - cs->t_last);
    cs->t_last = t;
}

/* Streams one event of choice ci as SSE. */
static int stream_event(struct http_req *r, int ci, const struct engine_event *ev) {
    if (r->choices[ci].tools) // content and tool-call deltas (server/openai_tools.c)
        return sbuf_put_owned(&r->out, openai_tools_event_sse(&r->rctx, ci, &r->choices[ci], ev));
    const char *text = ev->text ? ev->text : "";
    struct choice_state *cs = &r->cs[ci];
    size_t offset = cs->chars;
    for (const char *p = text; *p; p++) cs->chars += ((unsigned char)*p & 0xC0) != 0x80;
    if (ev->type == ENGINE_EVENT_TOKEN) {
        if (!text[0] && r->rctx.logprobs < 0) return 0; // nothing to say yet (held-back bytes)
        return sbuf_put_owned(&r->out, openai_chunk_sse(&r->rctx, ci, text, ev, offset, ENGINE_FINISH_NONE, NULL, -1));
    }
    // FINISH: the tail and the finish reason in one chunk.
    return sbuf_put_owned(&r->out, openai_chunk_sse(&r->rctx, ci, text, NULL, offset, ev->finish, ev->stop_reason_str,
                                                    ev->stop_reason_id));
}

static int accumulate_event(struct http_req *r, int ci, const struct engine_event *ev) {
    struct openai_choice *c = &r->choices[ci];
    if (openai_choice_add_event(c, ev, r->rctx.logprobs >= 0)) return -1;
    if (ev->type == ENGINE_EVENT_FINISH) {
        c->finish = ev->finish;
        c->done = true;
        c->stop_reason_id = ev->stop_reason_id;
        if (ev->stop_reason_str && !(c->stop_reason_str = strdup(ev->stop_reason_str))) return -1;
        if (ev->completion_tokens > 0) c->completion_tokens = ev->completion_tokens;
    }
    return 0;
}

static int completion_tokens(const struct http_req *r) {
    int n = 0;
    for (int i = 0; i < r->n_choices; i++) n += r->choices[i].completion_tokens;
    return n;
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
        metrics_observe(&r->srv->metrics, METRICS_E2E, now_s() - r->t_start);
    }
    return rc;
}

static struct openai_usage usage_of(const struct http_req *r) {
    return (struct openai_usage){.prompt_tokens = r->prompt_tokens, .completion_tokens = completion_tokens(r)};
}

static void cancel_handles(struct http_req *r) {
    for (int p = 0; p < r->n_handles; p++)
        if (!r->h_done[p]) engine_cancel(r->h[p]);
}

/* The non-streamed path: called on the last body call and after each resume. */
static enum MHD_Result drive_plain(struct http_req *r) {
    for (;;) {
        clear_pending(r);
        if (pump(r)) {
            r->failed = true;
            openai_fail(&r->ferr, 500, NULL, NULL, "out of memory");
            cancel_handles(r);
        }
        if (r->finished) {
            if (r->failed) return respond_error(r, &r->ferr);
            struct openai_usage u = usage_of(r);
            return respond(r, 200, openai_response_json(&r->rctx, r->choices, r->n_choices, &u), "application/json");
        }
        if (try_suspend(r)) return MHD_YES;
    }
}

/* Starts the stream: chat role chunks, echoed prompts. */
static int stream_start(struct http_req *r) {
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

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    struct http_req *r = cls;
    (void)pos;
    for (;;) {
        if (r->out.off < r->out.len) {
            size_t n = r->out.len - r->out.off;
            if (n > max) n = max;
            memcpy(buf, r->out.s + r->out.off, n);
            r->out.off += n;
            r->t_last_write = now_s();
            return (ssize_t)n;
        }
        if (r->stream_closed) return MHD_CONTENT_READER_END_OF_STREAM;
        if (!r->stream_started) {
            r->stream_started = true;
            if (stream_start(r)) return MHD_CONTENT_READER_END_WITH_ERROR;
            continue;
        }
        pthread_mutex_lock(&r->mu);
        r->pending = false;
        bool ka = r->keepalive_due;
        r->keepalive_due = false;
        pthread_mutex_unlock(&r->mu);
        if (pump(r)) {
            cancel_handles(r);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (r->finished) {
            r->stream_closed = true;
            int rc = 0;
            if (r->failed) rc |= sbuf_put_owned(&r->out, openai_error_sse(&r->ferr));
            if (r->oreq.include_usage && !r->failed) {
                struct openai_usage u = usage_of(r);
                rc |= sbuf_put_owned(&r->out, openai_chunk_usage_sse(&r->rctx, &u));
            }
            rc |= sbuf_put(&r->out, "data: [DONE]\n\n", 14);
            if (rc) return MHD_CONTENT_READER_END_WITH_ERROR;
            continue;
        }
        if (r->out.off < r->out.len) continue;
        if (ka) {
            if (sbuf_put(&r->out, ": keep-alive\n\n", 14)) return MHD_CONTENT_READER_END_WITH_ERROR;
            continue;
        }
        if (try_suspend(r)) return 0;
    }
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

static enum MHD_Result handle_generate(struct http_req *r) {
    struct http_server *s = r->srv;
    struct engine *e = atomic_load(&s->engine);
    struct openai_limits lim;
    limits_of(s, e, &lim);
    struct openai_error err;
    enum openai_kind kind = r->route == ROUTE_CHAT ? OPENAI_CHAT : OPENAI_COMPLETION;
    struct openai_request *q = &r->oreq;
    if (openai_parse_request(r->body ? r->body : "", r->body_len, kind, &lim, q, &err)) return respond_error(r, &err);
    const struct tokenizer *tok = engine_tokenizer(e);
    if (prompt_prepare(q, tok, engine_chat_template(e), &lim, &err)) return respond_error(r, &err);

    // The client's request id (header first, then the body's request_id) names the response, as in vLLM.
    const char *prefix = kind == OPENAI_CHAT ? "chatcmpl" : "cmpl";
    const char *given = r->req_id_given ? r->req_id : q->request_id;
    if (given) snprintf(r->id, sizeof r->id, "%s-%.*s", prefix, OPENAI_MAX_REQUEST_ID, given);
    else make_id(s, r->id, sizeof r->id, prefix);
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
    if (!r->h || !r->h_done || !r->choices || !r->cs) return respond(r, 500, NULL, NULL);
    for (int i = 0; i < r->n_choices; i++) {
        openai_choice_init(&r->choices[i]);
        const char *echo = q->echo && !r->stream ? q->prompts[i / q->sp.n].text : NULL;
        if (echo && openai_choice_append(&r->choices[i], echo, strlen(echo))) return respond(r, 500, NULL, NULL);
        if (openai_tools_choice_init(&r->choices[i], q, (uint64_t)(now_s() * 1e9) ^ (uintptr_t)r ^ (uint64_t)i << 48))
            return respond(r, 500, NULL, NULL);
    }
    for (int p = 0; p < q->n_prompts; p++) r->prompt_tokens += q->prompts[p].n_ids;

    // Submit every prompt; on a refusal withdraw those already submitted.
    for (int p = 0; p < q->n_prompts; p++) {
        struct engine_request er = {.prompt = q->prompts[p].ids, .n_prompt = q->prompts[p].n_ids, .sp = q->sp};
        char msg[256] = "";
        int rc = engine_submit(e, &er, on_notify, r, &r->h[p], msg, sizeof msg);
        if (rc == ENGINE_OK) continue;
        r->n_handles = p; // the completion callback releases these
        cancel_handles(r);
        switch (rc) {
        case ENGINE_ERR_QUEUE_FULL:
            return fail(r, 429, "queue_full", NULL, "the server is busy (request queue full); retry later");
        case ENGINE_ERR_DRAINING: return fail(r, 503, NULL, NULL, "the server is shutting down");
        case ENGINE_ERR_TOO_LONG:
            return fail(r, 400, "context_length_exceeded", "max_tokens", "%s", msg[0] ? msg : engine_strerror(rc));
        case ENGINE_ERR_INVALID: return fail(r, 400, NULL, NULL, "%s", msg[0] ? msg : engine_strerror(rc));
        case ENGINE_ERR_GRAMMAR: { // the schema of response_format & co. or of the tools does not compile
            char m[512];
            openai_tools_grammar_error(q, msg, m, sizeof m);
            return fail(r, 400, NULL, q->st.param, "%s", m);
        }
        default: return fail(r, 500, NULL, NULL, "%s", msg[0] ? msg : engine_strerror(rc));
        }
    }
    r->t_last_write = now_s();
    add_active(r);
    if (!r->stream) return drive_plain(r);

    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_reader, r, NULL);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream; charset=utf-8");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    add_common_headers(r, resp);
    r->status = 200;
    enum MHD_Result ret = MHD_queue_response(r->conn, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    return ret;
}

/* ---- libmicrohttpd callbacks ---- */

/* Bodies over --max-request-bytes are read and dropped up to this many bytes, so that the
 * client, which sends its whole body before it reads, gets the 413 instead of a reset
 * connection (closing a socket with unread input sends RST). Past it the 413 is sent at once. */
static size_t discard_limit(const struct http_server *s) {
    size_t m = s->cfg.max_request_bytes, floor = (size_t)64 << 20;
    return m > SIZE_MAX / 4 ? SIZE_MAX : m * 4 > floor ? m * 4 : floor;
}

static enum MHD_Result fail_too_big(struct http_req *r) {
    return fail(r, 413, "request_too_large", NULL, "the request body is over %zu bytes", r->srv->cfg.max_request_bytes);
}

/* Over the limit by its Content-Length: a client waiting on "Expect: 100-continue" (or one
 * announcing more than the discard limit) gets the 413 now, before it sends the body; any
 * other has its body read and dropped, then gets the 413. */
static enum MHD_Result check_length(struct http_req *r) {
    struct http_server *s = r->srv;
    const char *cl = header(r, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (!cl) return MHD_YES;
    char *end;
    errno = 0;
    unsigned long long n = strtoull(cl, &end, 10);
    if (!errno && end != cl && n <= s->cfg.max_request_bytes) return MHD_YES;
    const char *expect = header(r, MHD_HTTP_HEADER_EXPECT);
    bool waits = expect && !strcasecmp(expect, "100-continue");
    if (errno || end == cl || n > discard_limit(s) || waits) return fail_too_big(r);
    r->too_big = true;
    return MHD_YES;
}

static enum MHD_Result first_call(struct http_req *r, const char *url, const char *method) {
    struct http_server *s = r->srv;
    const char *rid = header(r, "X-Request-Id");
    if (rid) {
        if (!openai_request_id_valid(rid))
            return fail(r, 400, NULL, NULL,
                        "the X-Request-Id header must be 1 to %d printable ASCII characters without spaces",
                        OPENAI_MAX_REQUEST_ID);
        snprintf(r->req_id, sizeof r->req_id, "%s", rid);
        r->req_id_given = true;
    }
    // A preflight is answered on the last call: answering before its (empty) body is read would
    // make libmicrohttpd close the connection.
    r->preflight = !strcmp(method, "OPTIONS") && header(r, "Origin") && header(r, "Access-Control-Request-Method");
    if (r->preflight) return MHD_YES;
    if (r->route == ROUTE_NONE) return fail(r, 404, "not_found", NULL, "no route %s %.100s", method, url);
    if (!method_allowed(r->route, method))
        return fail(r, 405, "method_not_allowed", NULL, "method %s is not allowed on %.100s", method, url);
    if (route_is_open(r->route)) return MHD_YES; // answered once the (ignored) body is read
    if (!authorized(r)) return fail(r, 401, "invalid_api_key", NULL, "missing or invalid API key (Authorization: Bearer KEY)");
    int st = atomic_load(&s->state);
    if (st != HTTP_STATE_READY)
        return fail(r, 503, NULL, NULL, st == HTTP_STATE_LOADING ? "the model is loading" : "the server is shutting down");
    return strcmp(method, "POST") ? MHD_YES : check_length(r);
}

/* A piece of the request body: kept, or dropped when the request is over the limit or its
 * route takes no body. */
static enum MHD_Result take_body(struct http_req *r, const char *data, size_t n) {
    struct http_server *s = r->srv;
    bool ignored = route_is_open(r->route) || r->preflight;
    if (!r->too_big && !ignored && r->body_len + n > s->cfg.max_request_bytes) r->too_big = true;
    if (r->too_big || ignored) {
        r->discarded += n;
        return r->discarded > discard_limit(s) ? fail_too_big(r) : MHD_YES;
    }
    if (r->body_len + n + 1 > r->body_cap) {
        size_t cap = r->body_cap ? r->body_cap : 4096;
        while (cap < r->body_len + n + 1) cap *= 2;
        char *b = realloc(r->body, cap);
        if (!b) return MHD_NO;
        r->body = b;
        r->body_cap = cap;
    }
    memcpy(r->body + r->body_len, data, n);
    r->body_len += n;
    r->body[r->body_len] = 0;
    return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size, void **con_cls) {
    struct http_server *s = cls;
    struct http_req *r = *con_cls;
    (void)version;
    if (!r) {
        if (!(r = calloc(1, sizeof *r))) return MHD_NO;
        pthread_mutex_init(&r->mu, NULL);
        r->srv = s;
        r->conn = conn;
        r->t_start = now_s();
        r->ttft = -1;
        r->route = route_of(url);
        snprintf(r->method, sizeof r->method, "%s", method);
        snprintf(r->path, sizeof r->path, "%s", url);
        *con_cls = r;
        return first_call(r, url, method);
    }
    if (r->gen) return drive_plain(r); // resumed while waiting for a non-streamed result
    if (r->status) return MHD_YES;     // answered while the body was arriving
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        return take_body(r, upload_data, n);
    }
    if (r->too_big) return fail_too_big(r);
    if (r->preflight) return handle_preflight(r);
    switch (r->route) {
    case ROUTE_HEALTH:
    case ROUTE_PING: return handle_health(r);
    case ROUTE_VERSION: return handle_version(r);
    case ROUTE_METRICS: return handle_metrics(r);
    case ROUTE_MODELS:
    case ROUTE_MODEL: return handle_models(r, url);
    case ROUTE_COMPLETIONS:
    case ROUTE_CHAT: return handle_generate(r);
    case ROUTE_TOKENIZE:
    case ROUTE_DETOKENIZE: return handle_tokenize(r);
    default: return fail(r, 404, "not_found", NULL, "no route %.100s", url);
    }
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe) {
    struct http_server *s = cls;
    struct http_req *r = *con_cls;
    (void)conn;
    if (!r) return;
    *con_cls = NULL;
    if (r->gen) {
        pthread_mutex_lock(&s->mu);
        if (r->prev) r->prev->next = r->next;
        else s->active = r->next;
        if (r->next) r->next->prev = r->prev;
        s->n_active--;
        pthread_mutex_unlock(&s->mu);
    }
    for (int p = 0; p < r->n_handles; p++)
        if (r->h[p]) engine_release(r->h[p]);
    if (r->status == 0) r->status = toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? 200 : 499;
    if (r->status != 499) metrics_count_status(&s->metrics, r->status);

    const char *finish = NULL;
    if (r->n_choices > 0) finish = openai_finish_reason(r->choices[0].finish);
    bool client_gone = toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && r->gen;
    struct log_request lr = {
        .id = r->id[0] ? r->id : r->req_id[0] ? r->req_id : NULL, .method = r->method, .path = r->path,
        .status = client_gone ? 499 : r->status,
        .prompt_tokens = r->prompt_tokens, .completion_tokens = r->choices ? completion_tokens(r) : 0,
        .n_choices = r->n_choices, .ttft_s = r->ttft, .e2e_s = now_s() - r->t_start, .finish = finish,
        .error = r->err_msg ? r->err_msg : client_gone ? "client disconnected" : NULL,
    };
    log_request(&lr);

    openai_request_free(&r->oreq);
    for (int i = 0; r->choices && i < r->n_choices; i++) openai_choice_free(&r->choices[i]);
    free(r->choices);
    free(r->cs);
    free(r->h);
    free(r->h_done);
    free(r->out.s);
    free(r->body);
    free(r->err_msg);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

/* ---- lifecycle ---- */

int http_check_config(const struct http_config *cfg, char *err, size_t errlen) {
    struct cors c;
    if (cors_init(&c, cfg->allowed_origins, cfg->allowed_methods, cfg->allowed_headers, cfg->allow_credentials, err, errlen))
        return -1;
    cors_free(&c);
    return 0;
}

/* "duoserve-VERSION-HASH8": HASH8 of what changes outputs for a given seed (the model and the
 * backend settings), as vLLM's system_fingerprint. FNV-1a: stable across runs and builds. */
static void make_fingerprint(const struct http_config *cfg, char *buf, size_t n) {
    const char *parts[] = {DUO_VERSION, cfg->model_name, cfg->model_root, cfg->backend};
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        for (const char *p = parts[i] ? parts[i] : ""; ; p++) { // the NUL too, so parts cannot run together
            h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
            if (!*p) break;
        }
    snprintf(buf, n, "duoserve-%s-%08llx", DUO_VERSION, (unsigned long long)(h >> 32));
}

/* libmicrohttpd's own messages (a malformed request, a header too big, a failed accept) as
 * the daemon's log lines, so that under --log-format json every line on stderr is JSON. */
static void mhd_log(void *cls, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));
static void mhd_log(void *cls, const char *fmt, va_list ap) {
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n > 0 && (msg[n - 1] == '\n' || msg[n - 1] == '\r')) msg[--n] = 0;
    log_msg("warning", "libmicrohttpd: %s", msg);
}

/* The listening socket, made here so that it has SO_REUSEADDR (a restart may bind while old
 * connections linger in TIME_WAIT) and never SO_REUSEPORT: a second server on a port in use
 * must fail, not share the port with the first. */
static int open_listener(const struct http_config *cfg, char *err, size_t errlen) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", cfg->port);
    int gai = getaddrinfo(cfg->host, port, &hints, &ai);
    if (gai) return snprintf(err, errlen, "--host %s: %s", cfg->host, gai_strerror(gai)), -1;
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol), one = 1;
    if (fd >= 0) {
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (ai->ai_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) || listen(fd, SOMAXCONN)) {
            int e = errno;
            close(fd);
            fd = -1;
            errno = e;
        }
    }
    if (fd < 0) {
        bool v6 = strchr(cfg->host, ':') != NULL;
        snprintf(err, errlen, "cannot listen on %s%s%s:%d: %s", v6 ? "[" : "", cfg->host, v6 ? "]" : "", cfg->port,
                 errno == EADDRINUSE ? "address in use (another process holds the port)" : strerror(errno));
    }
    freeaddrinfo(ai);
    return fd;
}

int http_start(struct http_server **out, const struct http_config *cfg, char *err, size_t errlen) {
    struct http_server *s = calloc(1, sizeof *s);
    if (!s) return snprintf(err, errlen, "out of memory"), -1;
    s->cfg = *cfg;
    metrics_init(&s->metrics);
    pthread_mutex_init(&s->mu, NULL);
    atomic_store(&s->state, HTTP_STATE_LOADING);
    s->created = (long long)time(NULL);
    if (getrandom(&s->id_salt, sizeof s->id_salt, 0) != (ssize_t)sizeof s->id_salt) s->id_salt = (uint64_t)time(NULL) * 2654435761u;
    make_fingerprint(cfg, s->fingerprint, sizeof s->fingerprint);
    if (cors_init(&s->cors, cfg->allowed_origins, cfg->allowed_methods, cfg->allowed_headers, cfg->allow_credentials, err,
                  errlen)) {
        http_stop(s);
        return -1;
    }
    int fd = open_listener(cfg, err, errlen);
    if (fd < 0) {
        http_stop(s);
        return -1;
    }
    struct sockaddr_storage sa;
    socklen_t salen = sizeof sa;
    bool v6 = false;
    s->port = cfg->port;
    if (getsockname(fd, (struct sockaddr *)&sa, &salen) == 0) { // the port chosen for --port 0
        v6 = sa.ss_family == AF_INET6;
        s->port = ntohs(v6 ? ((struct sockaddr_in6 *)&sa)->sin6_port : ((struct sockaddr_in *)&sa)->sin_port);
    }
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ITC |
                     MHD_USE_ERROR_LOG | (v6 ? MHD_USE_IPv6 : 0);
    s->daemon = MHD_start_daemon(
        flags, (uint16_t)s->port, NULL, NULL, on_request, s,
        MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL, // MHD_USE_ERROR_LOG's lines
        MHD_OPTION_LISTEN_SOCKET, fd, // libmicrohttpd closes it when it stops
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)cfg->max_connections,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)cfg->conn_timeout_s,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(64 * 1024),
        MHD_OPTION_THREAD_POOL_SIZE, (unsigned)(cfg->threads > 0 ? cfg->threads : 1),
        /* chat templates render recursively on these threads: a generous stack, whatever the ulimit */
        MHD_OPTION_THREAD_STACK_SIZE, (size_t)(8u << 20),
        MHD_OPTION_END);
    if (!s->daemon) {
        // Whether libmicrohttpd closed fd on this path is not documented: leaving it open (the
        // process is about to exit) is better than closing a descriptor twice.
        snprintf(err, errlen, "cannot start the HTTP server on %s:%d", cfg->host, s->port);
        http_stop(s);
        return -1;
    }
    *out = s;
    return 0;
}

void http_set_engine(struct http_server *s, struct engine *e) {
    atomic_store(&s->engine, e);
    atomic_store(&s->state, HTTP_STATE_READY);
}

void http_set_state(struct http_server *s, enum http_state st) {
    atomic_store(&s->state, st);
}

int http_port(const struct http_server *s) {
    return s->port;
}

int http_num_active(struct http_server *s) {
    pthread_mutex_lock(&s->mu);
    int n = s->n_active;
    pthread_mutex_unlock(&s->mu);
    return n;
}

/* True when the peer closed its side or the socket failed (peeking, never reading). */
static bool client_gone(struct MHD_Connection *conn) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return false;
    char c;
    ssize_t n = recv(ci->connect_fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) return true;
    return n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

void http_tick(struct http_server *s) {
    double t = now_s();
    pthread_mutex_lock(&s->mu);
    for (struct http_req *r = s->active; r; r = r->next) {
        bool cancel = false;
        pthread_mutex_lock(&r->mu);
        if (r->suspended && !r->cancelled && client_gone(r->conn)) cancel = true;
        if (s->cfg.request_timeout_s > 0 && t - r->t_start > s->cfg.request_timeout_s && !r->cancelled) cancel = true;
        if (r->stream && r->suspended && s->cfg.keepalive_s > 0 && t - r->t_last_write >= s->cfg.keepalive_s) {
            r->keepalive_due = true;
            r->suspended = false;
            MHD_resume_connection(r->conn);
        }
        pthread_mutex_unlock(&r->mu);
        if (cancel) {
            r->cancelled = true;
            for (int p = 0; p < r->n_handles; p++) engine_cancel(r->h[p]);
        }
    }
    pthread_mutex_unlock(&s->mu);
}

void http_cancel_all(struct http_server *s) {
    pthread_mutex_lock(&s->mu);
    for (struct http_req *r = s->active; r; r = r->next) {
        r->cancelled = true;
        for (int p = 0; p < r->n_handles; p++) engine_cancel(r->h[p]);
    }
    pthread_mutex_unlock(&s->mu);
}

void http_stop(struct http_server *s) {
    if (!s) return;
    if (s->daemon) {
        // libmicrohttpd requires every suspended connection to be resumed before it stops.
        pthread_mutex_lock(&s->mu);
        for (struct http_req *r = s->active; r; r = r->next) {
            pthread_mutex_lock(&r->mu);
            if (r->suspended) {
                r->suspended = false;
                MHD_resume_connection(r->conn);
            }
            pthread_mutex_unlock(&r->mu);
        }
        pthread_mutex_unlock(&s->mu);
        MHD_stop_daemon(s->daemon);
    }
    cors_free(&s->cors);
    metrics_free(&s->metrics);
    pthread_mutex_destroy(&s->mu);
    free(s);
}
