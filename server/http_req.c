/* http_req: what every handler does with a request (server/http_impl.h): its answer (status,
 * body and the headers every response carries), its body's share of the server's budget, and
 * its end (engine handles released, log line, counters, memory). The bottom floor of http.c and
 * http_gen.c, which call it and nothing of each other's but http_gen's entry points. */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/engine.h"
#include "server/http_impl.h"
#include "server/log.h"

double http_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void http_make_id(struct http_server *s, char *buf, size_t n, const char *prefix) {
    unsigned long long k = atomic_fetch_add(&s->next_id, 1);
    uint64_t x = s->id_salt ^ (k * 0x9E3779B97F4A7C15ull);
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    snprintf(buf, n, "%s-%016llx%llx", prefix, (unsigned long long)x, k);
}

void http_limits_of(struct http_server *s, struct engine *e, struct openai_limits *lim) {
    *lim = (struct openai_limits){
        .model_name = s->cfg.model_name,
        .vocab_size = engine_vocab_size(e),
        .max_model_len = engine_max_model_len(e),
        .max_n = s->cfg.max_n > 0 ? s->cfg.max_n : engine_max_num_seqs(e),
        .max_request_tokens = s->cfg.max_request_tokens,
        .max_request_logprobs = s->cfg.max_request_logprobs,
    };
}

const char *http_allowed_methods(enum route rt) {
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

/* ---- answers ---- */

/* Drain, X-Request-Id (vLLM's --enable-request-id-headers: the client's id echoed, else the
 * completion id, else a generated one) and CORS. */
void http_common_headers(struct http_req *r, struct hio_headers *h) {
    struct http_server *s = r->srv;
    if (atomic_load(&s->state) == HTTP_STATE_DRAINING) h->close = true;
    if (!r->req_id[0]) {
        if (r->id[0]) snprintf(r->req_id, sizeof r->req_id, "%s", r->id);
        else http_make_id(s, r->req_id, sizeof r->req_id, "req");
    }
    hio_headers_add(h, "X-Request-Id", r->req_id);
    if (r->preflight) {
        const char *acrh = hio_header(r->q, "Access-Control-Request-Headers");
        cors_preflight_headers(&s->cors, r->origin, acrh, h);
    } else {
        cors_add_headers(&s->cors, r->origin, r->has_cookie, h);
    }
}

int http_respond(struct http_req *r, int status, char *body, const char *ctype) {
    if (!body) {
        static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,\"code\":null}}";
        status = 500;
        body = strdup(oom);
        ctype = "application/json";
        if (!body) return -1;
    }
    struct hio_headers h = {0};
    hio_headers_add(&h, "Content-Type", ctype);
    http_common_headers(r, &h);
    if (status == 401) hio_headers_add(&h, "WWW-Authenticate", "Bearer");
    if (status == 429 || status == 503) hio_headers_add(&h, "Retry-After", "1");
    if (status == 405) hio_headers_add(&h, "Allow", http_allowed_methods(r->route));
    r->status = status;
    size_t len = strlen(body);
    if (len > LARGE_REQUEST) r->large = true;
    return hio_respond(r->q, status, &h, body, len);
}

int http_respond_error(struct http_req *r, const struct openai_error *err) {
    free(r->err_msg);
    r->err_msg = strdup(err->message);
    return http_respond(r, err->status, openai_error_json(err), "application/json");
}

int http_fail(struct http_req *r, int status, const char *code, const char *param, const char *fmt, ...) {
    struct openai_error err;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    openai_fail(&err, status, code, param, "%s", msg);
    return http_respond_error(r, &err);
}

/* ---- the body's budget ---- */

bool http_hold_body(struct http_req *r, size_t n) {
    struct http_server *s = r->srv;
    size_t cap = s->cfg.max_buffered_bytes;
    size_t cur = atomic_load(&s->buffered);
    do {
        if (cap && (cur + n > cap || cur + n < cur)) return false;
    } while (!atomic_compare_exchange_weak(&s->buffered, &cur, cur + n));
    r->held += n;
    return true;
}

void http_release_body(struct http_req *r) {
    atomic_fetch_sub(&r->srv->buffered, r->held);
    r->held = 0;
    free(r->body);
    r->body = NULL;
    r->body_len = r->body_cap = 0;
}

/* ---- the end ---- */

int http_req_completion_tokens(const struct http_req *r) {
    int n = 0;
    for (int i = 0; i < r->n_choices; i++) n += r->choices[i].completion_tokens;
    return n;
}

/* Takes r off the active and ready lists and releases its engine handles. */
static void end_generation(struct http_req *r) {
    struct http_server *s = r->srv;
    if (r->gen) {
        pthread_mutex_lock(&s->mu);
        if (r->prev) r->prev->next = r->next;
        else s->active = r->next;
        if (r->next) r->next->prev = r->prev;
        s->n_active--;
        r->gen = false;
        pthread_mutex_unlock(&s->mu);
    }
    // engine_release waits for a notify in progress, which takes srv->mu: not under it.
    for (int p = 0; p < r->n_handles; p++)
        if (r->h[p]) engine_release(r->h[p]);
    r->n_handles = 0;
    pthread_mutex_lock(&s->mu);
    if (r->queued)
        for (struct http_req **p = &s->ready; *p; p = &(*p)->ready_next)
            if (*p == r) {
                *p = r->ready_next;
                break;
            }
    r->queued = false;
    pthread_mutex_unlock(&s->mu);
}

void http_req_end(struct http_req *r, bool completed) {
    struct http_server *s = r->srv;
    bool client_gone = !completed && r->gen; /* before end_generation, which clears r->gen */
    end_generation(r);
    if (r->status == 0) r->status = completed ? 200 : 499;
    if (r->status != 499) metrics_count_status(&s->metrics, r->status);
    const char *finish = r->n_choices > 0 ? openai_finish_reason(r->choices[0].finish) : NULL;
    struct log_request lr = {
        .id = r->id[0] ? r->id : r->req_id[0] ? r->req_id : NULL, .method = r->method, .path = r->path,
        .status = client_gone ? 499 : r->status,
        .prompt_tokens = r->prompt_tokens, .completion_tokens = r->choices ? http_req_completion_tokens(r) : 0,
        .n_choices = r->n_choices, .ttft_s = r->ttft, .e2e_s = http_now() - r->t_start, .finish = finish,
        .error = r->err_msg ? r->err_msg : client_gone ? "client disconnected" : NULL,
    };
    log_request(&lr);
    if (r->large || r->held > LARGE_REQUEST) atomic_store(&s->trim_due, true);
    http_release_body(r);
    openai_request_free(&r->oreq);
    for (int i = 0; r->choices && i < r->n_choices; i++) openai_choice_free(&r->choices[i]);
    free(r->choices);
    free(r->cs);
    free(r->h);
    free(r->h_done);
    free(r->out.s);
    free(r->job_body);
    free(r->err_msg);
    free(r->origin);
    free(r->url);
    free(r);
}
