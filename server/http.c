/* http: routing, auth, limits, the small endpoints, a request's life and the lifecycle.
 *
 * Life of a request (one struct http_req per HTTP request), on the transport's loop thread:
 *   on_head: route, method, API key, state, Content-Length; errors here are answered before the
 *      body is read.
 *   on_body: body bytes, bounded by max_request_bytes and, over all requests, max_buffered_bytes.
 *   on_end: the small endpoints answer at once; generation and tokenize requests go to a worker
 *      (http_gen.c).
 *   on_done: http_req_end (http_req.c): engine_release (cancels what still runs), metrics, one
 *      log line, free.
 * Lock order: srv->mu, then the engine's. */
#include "server/http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <malloc.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "engine/engine.h"
#include "server/http_impl.h"
#include "server/log.h"
#include "server/version.h"

static sigset_t drain_signals;
static bool have_drain_signals;

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

/* The path of a request target: the part before any query, percent-decoded (as an OpenAI
 * client sends /v1/completions?api-version=... or /v1/models/a%2Fb). malloc'd; NULL when a
 * %-escape is malformed or stands for NUL. */
static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f') return (c | 0x20) - 'a' + 10;
    return -1;
}

static char *target_path(const char *target) {
    size_t n = strcspn(target, "?#");
    char *p = malloc(n + 1), *w = p;
    if (!p) return NULL;
    for (size_t i = 0; i < n; i++) {
        if (target[i] != '%') {
            *w++ = target[i];
            continue;
        }
        int hi = i + 2 < n ? hex_digit(target[i + 1]) : -1, lo = i + 2 < n ? hex_digit(target[i + 2]) : -1;
        if (hi < 0 || lo < 0 || (hi | lo) == 0) {
            free(p);
            return NULL;
        }
        *w++ = (char)(hi * 16 + lo);
        i += 2;
    }
    *w = 0;
    return p;
}

static bool method_allowed(enum route rt, const char *method) {
    const char *allow = http_allowed_methods(rt);
    size_t n = strlen(method);
    for (const char *p = allow; n && (p = strstr(p, method)); p += n)
        if ((p == allow || p[-1] == ' ') && (p[n] == ',' || !p[n])) return true;
    return false;
}

/* Probes and information that need neither an API key nor a loaded model. */
static bool route_is_open(enum route rt) {
    return rt == ROUTE_HEALTH || rt == ROUTE_PING || rt == ROUTE_VERSION || rt == ROUTE_METRICS;
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
    if (!key) return true;
    const char *h = hio_header(r->q, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7) != 0) return false;
    h += 7;
    while (*h == ' ') h++;
    return key_equal(h, key);
}

/* ---- simple endpoints ---- */

/* A drain signal sent and not yet taken by the serve loop counts as draining already. */
static bool drain_signal_pending(void) {
    sigset_t p;
    if (!have_drain_signals || sigpending(&p)) return false;
    for (int sig = 1; sig < NSIG; sig++)
        if (sigismember(&drain_signals, sig) == 1 && sigismember(&p, sig) == 1) return true;
    return false;
}

static void handle_health(struct http_req *r) {
    int st = atomic_load(&r->srv->state);
    if (st == HTTP_STATE_READY && drain_signal_pending()) st = HTTP_STATE_DRAINING;
    if (st == HTTP_STATE_READY) http_respond(r, 200, strdup("{\"status\":\"ok\"}"), "application/json");
    else http_fail(r, 503, NULL, NULL, st == HTTP_STATE_LOADING ? "the model is loading" : "the server is shutting down");
}

static void handle_version(struct http_req *r) {
    http_respond(r, 200, strdup("{\"version\":\"" DUO_VERSION "\"}"), "application/json");
}

/* A CORS preflight, on any path: answered without routing or the API key (browsers send no
 * credentials with it), like Starlette's CORSMiddleware in front of vLLM. */
static void handle_preflight(struct http_req *r) {
    char what[64];
    const char *method = hio_header(r->q, "Access-Control-Request-Method");
    if (cors_preflight_check(&r->srv->cors, r->origin, method, hio_header(r->q, "Access-Control-Request-Headers"), what,
                             sizeof what))
        http_fail(r, 400, "cors_disallowed", NULL, "Disallowed CORS %s", what);
    else
        http_respond(r, 200, strdup("OK"), "text/plain; charset=utf-8");
}

static void handle_metrics(struct http_req *r) {
    struct http_server *s = r->srv;
    struct engine *e = atomic_load(&s->engine);
    struct engine_stats st;
    if (e) engine_get_stats(e, &st);
    const char *name = s->cfg.metrics_name ? s->cfg.metrics_name : s->cfg.model_name;
    http_respond(r, 200, metrics_render(&s->metrics, e ? &st : NULL, name), "text/plain; version=0.0.4; charset=utf-8");
}

static void handle_models(struct http_req *r) {
    struct http_server *s = r->srv;
    struct engine *e = atomic_load(&s->engine);
    const char *url = r->url;
    if (r->route == ROUTE_MODEL && strcmp(url + 11, s->cfg.model_name) != 0) {
        http_fail(r, 404, "model_not_found", "model", "The model `%.100s` does not exist.", url + 11);
        return;
    }
    char *j = openai_models_json(s->cfg.model_name, s->cfg.model_root, s->created, engine_max_model_len(e));
    if (j && r->route == ROUTE_MODEL) { // the single model object
        cJSON *root = cJSON_Parse(j);
        cJSON *m = root ? cJSON_DetachItemFromArray(cJSON_GetObjectItem(root, "data"), 0) : NULL;
        free(j);
        j = m ? cJSON_PrintUnformatted(m) : NULL;
        cJSON_Delete(m);
        cJSON_Delete(root);
    }
    http_respond(r, 200, j, "application/json");
}

/* ---- body limits ---- */

/* Bodies over --max-request-bytes are read and dropped up to this many bytes, so that the
 * client, which sends its whole body before it reads, gets the 413 instead of a reset
 * connection. Past it the 413 is sent at once. */
static size_t discard_limit(const struct http_server *s) {
    size_t m = s->cfg.max_request_bytes, floor = (size_t)64 << 20;
    return m > SIZE_MAX / 4 ? SIZE_MAX : m * 4 > floor ? m * 4 : floor;
}

static void fail_too_big(struct http_req *r) {
    http_fail(r, 413, "request_too_large", NULL, "the request body is over %zu bytes (--max-request-bytes)",
              r->srv->cfg.max_request_bytes);
}

static void fail_busy(struct http_req *r) {
    http_fail(r, 503, "server_busy", NULL,
              "the server holds too much request data (--max-buffered-bytes %zu); retry later",
              r->srv->cfg.max_buffered_bytes);
}

/* The announced Content-Length: over the limit, a client waiting on "Expect: 100-continue"
 * (or one announcing more than the discard limit) gets the 413 now, before it sends the
 * body; any other has its body read and dropped, then gets the 413. Within the limit, the
 * body's buffer is taken from the server's budget at once (503 when it is spent). */
static void check_length(struct http_req *r) {
    struct http_server *s = r->srv;
    const char *cl = hio_header(r->q, "Content-Length");
    unsigned long long n = cl ? strtoull(cl, NULL, 10) : 0; // digits only (http_parse)
    if (n > s->cfg.max_request_bytes) {
        const char *expect = hio_header(r->q, "Expect");
        bool waits = expect && !strcasecmp(expect, "100-continue");
        if (n > discard_limit(s) || waits) fail_too_big(r);
        else r->too_big = true;
        return;
    }
    if (n == 0) return;
    if (!http_hold_body(r, (size_t)n + 1)) {
        fail_busy(r);
        return;
    }
    if (!(r->body = malloc((size_t)n + 1))) {
        http_respond(r, 500, NULL, NULL);
        return;
    }
    r->body_cap = (size_t)n + 1;
}

/* A piece of the request body: kept, or dropped when the request is over the limit or its
 * route takes no body. */
static void take_body(struct http_req *r, const char *data, size_t n) {
    struct http_server *s = r->srv;
    bool ignored = route_is_open(r->route) || r->preflight;
    if (!r->too_big && !ignored && r->body_len + n > s->cfg.max_request_bytes) {
        r->too_big = true;
        http_release_body(r);
    }
    if (r->too_big || ignored) {
        r->discarded += n;
        if (r->discarded > discard_limit(s)) fail_too_big(r);
        return;
    }
    if (r->body_len + n + 1 > r->body_cap) { // chunked: no length known in advance
        size_t cap = r->body_cap ? r->body_cap : 4096;
        while (cap < r->body_len + n + 1) cap *= 2;
        if (cap > s->cfg.max_request_bytes + 1) cap = s->cfg.max_request_bytes + 1;
        if (!http_hold_body(r, cap - r->body_cap)) {
            fail_busy(r);
            return;
        }
        char *b = realloc(r->body, cap);
        if (!b) {
            http_respond(r, 500, NULL, NULL);
            return;
        }
        r->body = b;
        r->body_cap = cap;
    }
    memcpy(r->body + r->body_len, data, n);
    r->body_len += n;
    r->body[r->body_len] = 0;
    if (r->body_cap > LARGE_REQUEST) r->large = true;
}

/* The head is in: what can be refused before the body is read is refused now. An API key is
 * checked before anything is said about a route other than the open probes (whether it
 * exists, its methods), so that without the key nothing else about the server shows. */
static void first_call(struct http_req *r) {
    struct http_server *s = r->srv;
    if (!r->url) {
        http_fail(r, 400, NULL, NULL, "malformed request target (a %%-escape is not two hex digits, or is %%00)");
        return;
    }
    const char *rid = hio_header(r->q, "X-Request-Id");
    if (rid) {
        if (!openai_request_id_valid(rid)) {
            http_fail(r, 400, NULL, NULL, "the X-Request-Id header must be 1 to %d printable ASCII characters without spaces",
                      OPENAI_MAX_REQUEST_ID);
            return;
        }
        snprintf(r->req_id, sizeof r->req_id, "%s", rid);
        r->req_id_given = true;
    }
    // A preflight is answered once its (empty) body is read.
    r->preflight = !strcmp(r->method, "OPTIONS") && r->origin && hio_header(r->q, "Access-Control-Request-Method");
    if (r->preflight) return;
    // The open probes are public: a wrong method on them may say so without a key.
    if (route_is_open(r->route)) {
        if (!method_allowed(r->route, r->method))
            http_fail(r, 405, "method_not_allowed", NULL, "method %s is not allowed on %.100s", r->method, r->path);
        return; // answered once the (ignored) body is read
    }
    if (s->cfg.api_key) {
        if (hio_header_count(r->q, "Authorization") > 1) {
            http_fail(r, 400, NULL, NULL, "more than one Authorization header");
            return;
        }
        if (!authorized(r)) {
            http_fail(r, 401, "invalid_api_key", NULL, "missing or invalid API key (Authorization: Bearer KEY)");
            return;
        }
    }
    if (r->route == ROUTE_NONE) {
        http_fail(r, 404, "not_found", NULL, "no route %s %.100s", r->method, r->path);
        return;
    }
    if (!method_allowed(r->route, r->method)) {
        http_fail(r, 405, "method_not_allowed", NULL, "method %s is not allowed on %.100s", r->method, r->path);
        return;
    }
    int st = atomic_load(&s->state);
    if (st == HTTP_STATE_READY && drain_signal_pending()) st = HTTP_STATE_DRAINING; /* as /health says */
    if (st != HTTP_STATE_READY) {
        http_fail(r, 503, NULL, NULL, st == HTTP_STATE_LOADING ? "the model is loading" : "the server is shutting down");
        return;
    }
    if (!strcmp(r->method, "POST")) check_length(r);
}

/* ---- the transport's callbacks ---- */

static void *on_head(void *ud, struct hio_req *q) {
    struct http_server *s = ud;
    struct http_req *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->srv = s;
    r->q = q;
    r->t_start = http_now();
    r->ttft = -1;
    snprintf(r->method, sizeof r->method, "%s", hio_method(q));
    snprintf(r->path, sizeof r->path, "%s", hio_target(q));
    r->url = target_path(hio_target(q));
    r->route = r->url ? route_of(r->url) : ROUTE_NONE;
    const char *origin = hio_header(q, "Origin");
    r->origin = origin ? strdup(origin) : NULL;
    r->has_cookie = hio_header(q, "Cookie") != NULL;
    first_call(r);
    return r;
}

static void on_body(void *rq, const char *data, size_t n) {
    take_body(rq, data, n);
}

static void on_end(void *rq) {
    struct http_req *r = rq;
    if (r->too_big) fail_too_big(r);
    else if (r->preflight) handle_preflight(r);
    else if (r->route == ROUTE_HEALTH || r->route == ROUTE_PING) handle_health(r);
    else if (r->route == ROUTE_VERSION) handle_version(r);
    else if (r->route == ROUTE_METRICS) handle_metrics(r);
    else if (r->route == ROUTE_MODELS || r->route == ROUTE_MODEL) handle_models(r);
    else if (r->route != ROUTE_NONE) http_gen_dispatch(r);
    else http_fail(r, 404, "not_found", NULL, "no route %.100s", r->path);
}

static void on_error(void *rq, int status, const char *message) {
    http_fail(rq, status, status == 408 ? "request_timeout" : NULL, NULL, "%s", message);
}

static void on_writable(void *rq) {
    struct http_req *r = rq;
    if (r->blocked) {
        r->blocked = false;
        http_gen_pump(r);
    }
}

static void on_done(void *rq, bool completed) {
    struct http_req *r = rq;
    r->q = NULL;
    if (r->job) { // the worker still holds r: its done callback ends it
        r->gone = true;
        return;
    }
    http_req_end(r, completed);
}

static char *on_reject(void *ud, int status, const char *message, const char *method, const char *target) {
    struct http_server *s = ud;
    metrics_count_status(&s->metrics, status);
    struct log_request lr = {.method = method, .path = target, .status = status, .ttft_s = -1, .error = message};
    log_request(&lr);
    struct openai_error err;
    openai_fail(&err, status, status == 408 ? "request_timeout" : NULL, NULL, "%s", message);
    return openai_error_json(&err);
}

/* Requests the engine notified: their events go out now. The list is copied out under the
 * lock: once off it, a request may be queued again (and its link reused) while we pump. */
static void on_wake(void *ud) {
    struct http_server *s = ud;
    pthread_mutex_lock(&s->mu);
    int n = 0;
    for (struct http_req *r = s->ready; r; r = r->ready_next) n++;
    if (n > s->wake_cap) {
        struct http_req **v = realloc(s->wake, sizeof *v * (size_t)n);
        if (v) s->wake = v, s->wake_cap = n;
    }
    n = 0;
    while (s->ready && n < s->wake_cap) {
        struct http_req *r = s->ready;
        s->ready = r->ready_next;
        r->queued = false;
        s->wake[n++] = r;
    }
    bool more = s->ready != NULL; // out of memory for the copy: the rest at the next wake-up
    pthread_mutex_unlock(&s->mu);
    // A request ends (on_done) on this thread only, never inside a pump: none is freed meanwhile.
    for (int i = 0; i < n; i++) {
        struct http_req *r = s->wake[i];
        if (r->started && !r->job && r->q) http_gen_pump(r);
    }
    if (more) hio_wake(s->io);
}

static void trim_work(void *arg) {
    (void)arg;
    malloc_trim(0);
}

static void trim_done(void *arg) {
    (void)arg;
}

static void on_tick(void *ud) {
    struct http_server *s = ud;
    http_gen_tick(s);
    // Memory a large request took goes back to the system, at most once a second.
    double t = http_now();
    if (atomic_load(&s->trim_due) && t - s->t_trim >= 1.0) {
        s->t_trim = t;
        atomic_store(&s->trim_due, false);
        hio_work(s->io, trim_work, trim_done, NULL);
    }
}

static const struct hio_callbacks callbacks = {
    .on_head = on_head, .on_body = on_body, .on_end = on_end, .on_error = on_error, .on_done = on_done,
    .on_writable = on_writable, .on_reject = on_reject, .on_wake = on_wake, .on_tick = on_tick,
};

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

static void server_free(struct http_server *s) {
    cors_free(&s->cors);
    metrics_free(&s->metrics);
    pthread_mutex_destroy(&s->mu);
    free(s->wake);
    free(s);
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
        server_free(s);
        return -1;
    }
    int fd = open_listener(cfg, err, errlen);
    if (fd < 0) {
        server_free(s);
        return -1;
    }
    struct sockaddr_storage sa;
    socklen_t salen = sizeof sa;
    s->port = cfg->port;
    if (getsockname(fd, (struct sockaddr *)&sa, &salen) == 0) { // the port chosen for --port 0
        bool v6 = sa.ss_family == AF_INET6;
        s->port = ntohs(v6 ? ((struct sockaddr_in6 *)&sa)->sin6_port : ((struct sockaddr_in *)&sa)->sin_port);
    }
    struct hio_config hc = {
        .listen_fd = fd, .max_connections = cfg->max_connections, .max_head = 64u << 10, .max_target = 8u << 10,
        .header_timeout_s = cfg->header_timeout_s, .body_timeout_s = cfg->body_timeout_s,
        .idle_timeout_s = cfg->conn_timeout_s, .workers = cfg->threads > 0 ? cfg->threads : 1,
        .cb = &callbacks, .ud = s,
    };
    if (hio_start(&s->io, &hc, err, errlen)) {
        server_free(s);
        return -1;
    }
    *out = s;
    return 0;
}

void http_set_engine(struct http_server *s, struct engine *e, const struct chat_template *tmpl) {
    s->tmpl = tmpl; /* before the engine: whoever sees the engine sees the template */
    atomic_store(&s->engine, e);
    atomic_store(&s->state, HTTP_STATE_READY);
}

void http_set_state(struct http_server *s, enum http_state st) {
    atomic_store(&s->state, st);
}

void http_set_drain_signals(const sigset_t *set) {
    drain_signals = *set;
    have_drain_signals = true;
}

int http_port(const struct http_server *s) {
    return s->port;
}

int http_num_active(struct http_server *s) {
    pthread_mutex_lock(&s->mu);
    int n = s->n_active + s->n_jobs;
    pthread_mutex_unlock(&s->mu);
    return n;
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
    hio_stop(s->io);
    server_free(s);
}
