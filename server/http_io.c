/* http_io: HTTP/1.1 connections on a libuv loop, and the worker threads.
 *
 * A connection carries one request at a time:
 *   CONN_HEAD   reading a head (t_phase: its first byte, or when the connection went idle);
 *   CONN_BODY   reading the body (t_phase: the end of the head); bytes go to on_body until the
 *               request is answered, then are dropped;
 *   CONN_WAIT   the body is in, the application works on the answer; bytes of a next
 *               (pipelined) request wait in the buffer;
 *   CONN_LINGER shut down for writing, reading and dropping until EOF or LINGER_S.
 * When a response has been written whole and its body read whole, on_done runs and the
 * connection goes back to CONN_HEAD (keep-alive) or lingers. on_done also runs when the
 * connection is closed under a request; it never runs inside a hio_* call. */
#include "server/http_io.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "server/http_parse.h"

#define LINGER_S 2.0              // a closing connection drops the client's bytes this long
#define LINGER_BYTES (4u << 20)   // ... or this many
#define READ_CHUNK (64u << 10)
#define MAX_REFUSING 64           // connections over the limit being answered 503 at once
#define TICK_MS 100

enum conn_state { CONN_HEAD, CONN_BODY, CONN_WAIT, CONN_LINGER };

struct hio_req {
    struct hio_conn *c;
    char *head_buf;
    struct http_head head;
    void *app;
    bool is_head;        // a HEAD request: responses without their body
    bool keep_alive;
    bool chunked;
    struct http_chunked ck;
    uint64_t body_left;  // Content-Length bytes not read yet
    bool body_done;
    bool answered;       // a response (or its head) was queued
    bool streamed, chunked_out, ended;
};

struct hio_conn {
    uv_tcp_t tcp;
    struct hio_server *s;
    struct hio_conn *prev, *next;
    char *buf;
    size_t len, cap;
    enum conn_state st;
    double t_phase;
    bool reading, closing, refusing, kicked;
    int writes;          // uv_write requests in flight
    size_t dropped;      // bytes read and dropped while lingering
    struct hio_req *req;
    struct hio_conn *kick_next;
};

struct job {
    void (*work)(void *), (*done)(void *);
    void *arg;
    struct job *next;
};

struct hio_server {
    struct hio_config cfg;
    uv_loop_t loop;
    uv_tcp_t listener;
    uv_async_t async;
    uv_timer_t timer;
    pthread_t thread;
    struct hio_conn *conns;
    int n_conns, n_refusing;
    bool closing_all;       // loop thread: the listener and timer are closed
    struct hio_conn *kicked; // connections to move on at the next wake-up
    char date[40];
    time_t date_t;

    pthread_mutex_t mu;     // guards everything below
    pthread_cond_t cv;
    _Atomic bool stop;
    bool quit_workers;
    struct job *queue, *queue_tail, *done;
    int jobs;               // queued, running or waiting for their done callback
    pthread_t *workers;
    int n_workers;
    int n_conns_shared;     // n_conns, for hio_num_connections
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- writing ---- */

struct wreq {
    uv_write_t w;
    char *a, *b; // freed when written
};

static void conn_close(struct hio_conn *c);
static void conn_process(struct hio_conn *c);
static void conn_read(struct hio_conn *c);

/* Moves c on at the next wake-up rather than inside the caller's call. */
static void conn_kick(struct hio_conn *c) {
    if (c->kicked) return;
    c->kicked = true;
    c->kick_next = c->s->kicked;
    c->s->kicked = c;
    uv_async_send(&c->s->async);
}

static void on_written(uv_write_t *w, int status) {
    struct wreq *wr = (struct wreq *)w;
    struct hio_conn *c = w->data;
    free(wr->a);
    free(wr->b);
    free(wr);
    c->writes--;
    if (c->closing) return;
    if (status < 0) {
        conn_close(c);
        return;
    }
    struct hio_req *q = c->req;
    if (q && q->streamed && !q->ended && hio_unsent(q) < HIO_LOW_WATER) c->s->cfg.cb->on_writable(q->app);
    conn_process(c);
}

/* Queues a[0..na) then b[0..nb) and frees both once written (or on failure). */
static int conn_write(struct hio_conn *c, char *a, size_t na, char *b, size_t nb) {
    struct wreq *wr = calloc(1, sizeof *wr);
    if (!wr || c->closing) {
        free(wr);
        free(a);
        free(b);
        return -1;
    }
    wr->a = a;
    wr->b = b;
    wr->w.data = c;
    uv_buf_t bufs[2] = {uv_buf_init(a, (unsigned)na), uv_buf_init(b ? b : "", (unsigned)nb)};
    int rc = uv_write(&wr->w, (uv_stream_t *)&c->tcp, bufs, b && nb ? 2 : 1, on_written);
    if (rc) {
        free(a);
        free(b);
        free(wr);
        return -1;
    }
    c->writes++;
    return 0;
}

static const char *date_header(struct hio_server *s) {
    time_t t = time(NULL);
    if (t != s->date_t) {
        struct tm tm;
        gmtime_r(&t, &tm);
        strftime(s->date, sizeof s->date, "%a, %d %b %Y %H:%M:%S GMT", &tm);
        s->date_t = t;
    }
    return s->date;
}

void hio_headers_add(struct hio_headers *h, const char *name, const char *value) {
    size_t room = sizeof h->buf - h->len;
    int n = snprintf(h->buf + h->len, room, "%s: %s\r\n", name, value ? value : "");
    if (n < 0 || (size_t)n >= room) {
        h->buf[h->len] = 0; // dropped whole rather than cut
        return;
    }
    // a value with CR or LF would start a line of its own
    for (char *p = h->buf + h->len + strlen(name) + 2; p < h->buf + h->len + n - 2; p++)
        if (*p == '\r' || *p == '\n') *p = ' ';
    h->len += (size_t)n;
}

/* The response head: status line, Date, the application's fields, framing, connection. */
static char *response_head(struct hio_req *q, int status, const struct hio_headers *h, const char *framing, size_t *n) {
    struct hio_conn *c = q->c;
    q->keep_alive = q->keep_alive && !(h && h->close) && q->body_done && !atomic_load(&c->s->stop);
    const char *conn = !q->keep_alive ? "Connection: close\r\n" : q->head.minor == 0 ? "Connection: keep-alive\r\n" : "";
    size_t cap = 256 + (h ? h->len : 0);
    char *head = malloc(cap);
    if (!head) return NULL;
    *n = (size_t)snprintf(head, cap, "HTTP/1.1 %d %s\r\nDate: %s\r\n%s%s%s\r\n", status, http_reason(status),
                          date_header(c->s), h ? h->buf : "", framing, conn);
    return head;
}

int hio_respond(struct hio_req *q, int status, const struct hio_headers *h, char *body, size_t len) {
    if (q->answered) {
        free(body);
        return -1;
    }
    q->answered = q->ended = true;
    char framing[48];
    snprintf(framing, sizeof framing, "Content-Length: %zu\r\n", len);
    size_t n;
    char *head = response_head(q, status, h, framing, &n);
    if (!head) {
        free(body);
        conn_close(q->c);
        return -1;
    }
    if (q->is_head) {
        free(body);
        body = NULL;
        len = 0;
    }
    return conn_write(q->c, head, n, body, len);
}

int hio_stream_start(struct hio_req *q, int status, const struct hio_headers *h) {
    if (q->answered) return -1;
    q->answered = q->streamed = true;
    q->chunked_out = q->head.minor >= 1;
    if (!q->chunked_out) q->keep_alive = false; // the end of the body is the end of the connection
    size_t n;
    char *head = response_head(q, status, h, q->chunked_out ? "Transfer-Encoding: chunked\r\n" : "", &n);
    if (!head) {
        conn_close(q->c);
        return -1;
    }
    if (q->is_head) q->ended = true;
    return conn_write(q->c, head, n, NULL, 0);
}

int hio_stream_write(struct hio_req *q, const char *data, size_t n) {
    if (!q->streamed || q->ended) return -1;
    if (n == 0) return 0;
    char *frame = malloc(n + 24);
    if (!frame) return -1;
    size_t k = q->chunked_out ? (size_t)snprintf(frame, 24, "%zx\r\n", n) : 0;
    memcpy(frame + k, data, n);
    k += n;
    if (q->chunked_out) memcpy(frame + k, "\r\n", 2), k += 2;
    return conn_write(q->c, frame, k, NULL, 0);
}

int hio_stream_end(struct hio_req *q) {
    if (!q->streamed || q->ended) return -1;
    q->ended = true;
    if (!q->chunked_out) { // nothing to write: a close-delimited body ends with the connection
        conn_kick(q->c);
        return 0;
    }
    char *last = strdup("0\r\n\r\n");
    return last ? conn_write(q->c, last, 5, NULL, 0) : -1;
}

size_t hio_unsent(const struct hio_req *q) {
    return uv_stream_get_write_queue_size((const uv_stream_t *)&q->c->tcp);
}

const char *hio_method(const struct hio_req *q) { return q->head.method; }
const char *hio_target(const struct hio_req *q) { return q->head.target; }
int hio_http_minor(const struct hio_req *q) { return q->head.minor; }
const char *hio_header(const struct hio_req *q, const char *name) { return http_head_field(&q->head, name); }
int hio_header_count(const struct hio_req *q, const char *name) { return http_head_count(&q->head, name); }

/* ---- closing ---- */

static void on_closed(uv_handle_t *h) {
    struct hio_conn *c = h->data;
    struct hio_server *s = c->s;
    if (c->prev) c->prev->next = c->next;
    else s->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    if (c->refusing) s->n_refusing--;
    else s->n_conns--;
    for (struct hio_conn **k = &s->kicked; *k; k = &(*k)->kick_next)
        if (*k == c) {
            *k = c->kick_next;
            break;
        }
    pthread_mutex_lock(&s->mu);
    s->n_conns_shared = s->n_conns;
    pthread_mutex_unlock(&s->mu);
    struct hio_req *q = c->req;
    if (q) {
        c->req = NULL;
        if (q->app) s->cfg.cb->on_done(q->app, false);
        free(q->head_buf);
        free(q);
    }
    free(c->buf);
    free(c);
}

static void conn_close(struct hio_conn *c) {
    if (c->closing) return;
    c->closing = true;
    uv_close((uv_handle_t *)&c->tcp, on_closed);
}

static void on_shutdown(uv_shutdown_t *sd, int status) {
    free(sd);
}

/* Shuts the connection down for writing once its writes are out, then reads and drops
 * what the client still sends, so that closing does not reset the connection under the
 * answer the client has yet to read. */
static void conn_linger(struct hio_conn *c) {
    if (c->closing || c->st == CONN_LINGER) return;
    c->st = CONN_LINGER;
    c->t_phase = now_s();
    c->len = 0;
    uv_shutdown_t *sd = malloc(sizeof *sd);
    if (!sd || uv_shutdown(sd, (uv_stream_t *)&c->tcp, on_shutdown)) {
        free(sd);
        conn_close(c);
        return;
    }
}

/* A refusal before any request object exists, then the connection lingers. */
static void conn_refuse(struct hio_conn *c, int status, const char *message, const struct http_head *h) {
    struct hio_server *s = c->s;
    char *body = s->cfg.cb->on_reject(s->cfg.ud, status, message, h ? h->method : NULL, h ? h->target : NULL);
    struct hio_req q = {.c = c, .head = {.minor = 1}};
    struct hio_headers hd = {.close = true};
    hio_headers_add(&hd, "Content-Type", "application/json");
    if (status == 503) hio_headers_add(&hd, "Retry-After", "1");
    hio_respond(&q, status, &hd, body, body ? strlen(body) : 0);
    conn_linger(c);
}

/* ---- reading ---- */

static void consume(struct hio_conn *c, size_t n) {
    memmove(c->buf, c->buf + n, c->len - n);
    c->len -= n;
}

/* A transport failure of a request the application holds (bad chunk, body timeout). */
static void req_fail(struct hio_conn *c, int status, const char *message) {
    struct hio_req *q = c->req;
    q->keep_alive = false;
    if (!q->answered) c->s->cfg.cb->on_error(q->app, status, message);
    if (!q->answered) {
        conn_close(c);
        return;
    }
    q->body_done = true; // nothing more is read for it
    c->st = CONN_WAIT;
}

/* The head buf[0..end) is in: a new request. */
static void start_request(struct hio_conn *c, size_t end) {
    struct hio_server *s = c->s;
    struct hio_req *q = calloc(1, sizeof *q);
    char *hb = q ? malloc(end) : NULL;
    if (!hb) {
        free(q);
        conn_refuse(c, 500, "out of memory", NULL);
        return;
    }
    memcpy(hb, c->buf, end);
    consume(c, end);
    q->c = c;
    q->head_buf = hb;
    struct http_error err;
    if (http_parse_head(hb, end, s->cfg.max_target, &q->head, &err)) {
        conn_refuse(c, err.status, err.message, q->head.method && q->head.target ? &q->head : NULL);
        free(hb);
        free(q);
        return;
    }
    q->is_head = !strcmp(q->head.method, "HEAD");
    q->keep_alive = q->head.keep_alive;
    q->chunked = q->head.chunked;
    q->body_left = q->head.content_length > 0 ? (uint64_t)q->head.content_length : 0;
    q->body_done = !q->chunked && q->body_left == 0;
    c->req = q;
    c->st = CONN_BODY;
    c->t_phase = now_s();
    if (!(q->app = s->cfg.cb->on_head(s->cfg.ud, q))) {
        c->req = NULL;
        free(hb);
        free(q);
        conn_refuse(c, 500, "out of memory", NULL);
        return;
    }
    if (!q->answered && !q->body_done && q->head.expect_continue) {
        char *cont = strdup("HTTP/1.1 100 Continue\r\n\r\n");
        if (cont) conn_write(c, cont, strlen(cont), NULL, 0);
    }
}

/* Body bytes from the buffer. */
static void feed_body(struct hio_conn *c) {
    struct hio_req *q = c->req;
    const struct hio_callbacks *cb = c->s->cfg.cb;
    while (c->len && !q->body_done && !c->closing && c->req == q) {
        if (!q->chunked) {
            size_t take = c->len < q->body_left ? c->len : (size_t)q->body_left;
            if (!q->answered) cb->on_body(q->app, c->buf, take);
            consume(c, take);
            q->body_left -= take;
            q->body_done = q->body_left == 0;
            continue;
        }
        size_t used, n;
        const char *data;
        struct http_error err;
        enum http_chunked_status st = http_chunked_feed(&q->ck, c->buf, c->len, &used, &data, &n, &err);
        if (n && !q->answered) cb->on_body(q->app, data, n);
        if (st == HTTP_CHUNKED_ERROR) {
            req_fail(c, err.status, err.message);
            return;
        }
        consume(c, used);
        q->body_done = st == HTTP_CHUNKED_DONE;
    }
}

/* Moves the connection on as far as the bytes and the response allow. */
static void conn_process(struct hio_conn *c) {
    struct hio_server *s = c->s;
    while (!c->closing) {
        struct hio_req *q = c->req;
        // The request is over once its answer is out and its body read (or never to be read:
        // an early answer closes the connection).
        if (q && q->ended && c->writes == 0 && (q->body_done || !q->keep_alive)) {
            c->req = NULL;
            bool keep = q->keep_alive && !atomic_load(&s->stop);
            void *app = q->app;
            free(q->head_buf);
            free(q);
            s->cfg.cb->on_done(app, true);
            if (!keep) {
                conn_linger(c);
                return;
            }
            c->st = CONN_HEAD;
            c->t_phase = now_s();
            conn_read(c);
            continue;
        }
        if (c->st == CONN_HEAD) {
            if (!c->len) return;
            struct http_error err;
            long end = http_head_end(c->buf, c->len, s->cfg.max_head, s->cfg.max_target, &err);
            if (end < 0) conn_refuse(c, err.status, err.message, NULL);
            if (end <= 0) return;
            start_request(c, (size_t)end);
            continue;
        }
        if (c->st == CONN_BODY) {
            feed_body(c);
            if (c->closing || c->req != q || !q->body_done || c->st != CONN_BODY) return;
            c->st = CONN_WAIT;
            if (!q->answered) s->cfg.cb->on_end(q->app);
            continue;
        }
        return; // CONN_WAIT with the answer still coming, or CONN_LINGER
    }
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
    struct hio_conn *c = h->data;
    size_t max = c->s->cfg.max_head + READ_CHUNK;
    if (c->st == CONN_LINGER) c->len = 0;
    if (c->cap - c->len < READ_CHUNK && c->cap < max) {
        size_t cap = c->len + READ_CHUNK < max ? c->len + READ_CHUNK : max;
        char *b = realloc(c->buf, cap);
        if (b) c->buf = b, c->cap = cap;
    }
    *buf = uv_buf_init(c->buf + c->len, (unsigned)(c->cap - c->len));
}

static void on_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf) {
    struct hio_conn *c = st->data;
    if (c->closing) return;
    if (n < 0) {
        conn_close(c);
        return;
    }
    if (c->st == CONN_LINGER) {
        c->dropped += (size_t)n;
        if (c->dropped > LINGER_BYTES) conn_close(c);
        return;
    }
    if (c->st == CONN_HEAD && c->len == 0 && n > 0) c->t_phase = now_s(); // a head begins
    c->len += (size_t)n;
    conn_process(c);
    // Pipelined bytes wait while a request is handled; past a head's worth, stop reading.
    if (!c->closing && c->len >= c->s->cfg.max_head && c->reading && c->st != CONN_HEAD) {
        uv_read_stop(st);
        c->reading = false;
    }
}

static void conn_read(struct hio_conn *c) {
    if (!c->reading && !c->closing && uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) == 0) c->reading = true;
}

/* ---- accepting ---- */

static void on_connection(uv_stream_t *l, int status) {
    struct hio_server *s = l->data;
    if (status < 0) return;
    struct hio_conn *c = calloc(1, sizeof *c);
    if (!c) return;
    c->s = s;
    uv_tcp_init(&s->loop, &c->tcp);
    c->tcp.data = c;
    c->next = s->conns;
    if (s->conns) s->conns->prev = c;
    s->conns = c;
    c->refusing = s->n_conns >= s->cfg.max_connections;
    if (c->refusing) s->n_refusing++;
    else s->n_conns++;
    pthread_mutex_lock(&s->mu);
    s->n_conns_shared = s->n_conns;
    pthread_mutex_unlock(&s->mu);
    c->t_phase = now_s();
    if (uv_accept(l, (uv_stream_t *)&c->tcp)) {
        conn_close(c);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    conn_read(c);
    if (c->refusing) {
        if (s->n_refusing > MAX_REFUSING) {
            conn_close(c);
            return;
        }
        char msg[96];
        snprintf(msg, sizeof msg, "too many connections (--max-connections %d); retry later", s->cfg.max_connections);
        conn_refuse(c, 503, msg, NULL);
    }
}

/* ---- deadlines ---- */

static void on_tick(uv_timer_t *t) {
    struct hio_server *s = t->data;
    double now = now_s();
    char msg[96];
    for (struct hio_conn *c = s->conns, *nx; c; c = nx) {
        nx = c->next;
        if (c->closing) continue;
        double age = now - c->t_phase;
        if (c->st == CONN_LINGER && age > LINGER_S) {
            conn_close(c);
        } else if (c->st == CONN_HEAD && c->len == 0 && age > s->cfg.idle_timeout_s) {
            conn_close(c);
        } else if (c->st == CONN_HEAD && c->len > 0 && age > s->cfg.header_timeout_s) {
            snprintf(msg, sizeof msg, "the request head did not arrive within %g s", s->cfg.header_timeout_s);
            conn_refuse(c, 408, msg, NULL);
        } else if (c->st == CONN_BODY && age > s->cfg.body_timeout_s) {
            snprintf(msg, sizeof msg, "the request body did not arrive within %g s", s->cfg.body_timeout_s);
            if (c->req->answered) conn_close(c);
            else req_fail(c, 408, msg);
        }
    }
    if (!s->closing_all) s->cfg.cb->on_tick(s->cfg.ud);
}

/* ---- workers and cross-thread wake-ups ---- */

static void *worker_main(void *arg) {
    struct hio_server *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->queue && !s->quit_workers) pthread_cond_wait(&s->cv, &s->mu);
        if (!s->queue) break;
        struct job *j = s->queue;
        s->queue = j->next;
        if (!s->queue) s->queue_tail = NULL;
        pthread_mutex_unlock(&s->mu);
        j->work(j->arg);
        pthread_mutex_lock(&s->mu);
        j->next = s->done;
        s->done = j;
        uv_async_send(&s->async);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

int hio_work(struct hio_server *s, void (*work)(void *), void (*done)(void *), void *arg) {
    struct job *j = malloc(sizeof *j);
    if (!j) return -1;
    *j = (struct job){.work = work, .done = done, .arg = arg};
    pthread_mutex_lock(&s->mu);
    if (s->queue_tail) s->queue_tail->next = j;
    else s->queue = j;
    s->queue_tail = j;
    s->jobs++;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

void hio_wake(struct hio_server *s) {
    uv_async_send(&s->async);
}

int hio_num_connections(struct hio_server *s) {
    pthread_mutex_lock(&s->mu);
    int n = s->n_conns_shared;
    pthread_mutex_unlock(&s->mu);
    return n;
}

static void close_all(struct hio_server *s) {
    s->closing_all = true;
    uv_close((uv_handle_t *)&s->listener, NULL);
    uv_close((uv_handle_t *)&s->timer, NULL);
    uv_close((uv_handle_t *)&s->async, NULL);
    for (struct hio_conn *c = s->conns; c; c = c->next) conn_close(c);
}

static void on_async(uv_async_t *a) {
    struct hio_server *s = a->data;
    pthread_mutex_lock(&s->mu);
    struct job *done = s->done;
    s->done = NULL;
    pthread_mutex_unlock(&s->mu);
    // oldest first
    struct job *fifo = NULL;
    while (done) {
        struct job *nx = done->next;
        done->next = fifo;
        fifo = done;
        done = nx;
    }
    for (struct job *j = fifo, *nx; j; j = nx) {
        nx = j->next;
        j->done(j->arg);
        free(j);
        pthread_mutex_lock(&s->mu);
        s->jobs--;
        pthread_mutex_unlock(&s->mu);
    }
    if (s->closing_all) return;
    while (s->kicked) {
        struct hio_conn *c = s->kicked;
        s->kicked = c->kick_next;
        c->kicked = false;
        conn_process(c);
    }
    s->cfg.cb->on_wake(s->cfg.ud);
    pthread_mutex_lock(&s->mu);
    bool stop = atomic_load(&s->stop) && s->jobs == 0;
    pthread_mutex_unlock(&s->mu);
    if (stop) close_all(s);
}

static void *loop_main(void *arg) {
    struct hio_server *s = arg;
    uv_run(&s->loop, UV_RUN_DEFAULT);
    return NULL;
}

int hio_start(struct hio_server **out, const struct hio_config *cfg, char *err, size_t errlen) {
    struct hio_server *s = calloc(1, sizeof *s);
    if (!s) {
        close(cfg->listen_fd);
        return snprintf(err, errlen, "out of memory"), -1;
    }
    s->cfg = *cfg;
    if (s->cfg.workers < 1) s->cfg.workers = 1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    uv_loop_init(&s->loop);
    uv_tcp_init(&s->loop, &s->listener);
    uv_async_init(&s->loop, &s->async, on_async);
    uv_timer_init(&s->loop, &s->timer);
    s->listener.data = s->async.data = s->timer.data = s;
    int rc = uv_tcp_open(&s->listener, cfg->listen_fd);
    if (rc) close(cfg->listen_fd);
    if (!rc) rc = uv_listen((uv_stream_t *)&s->listener, SOMAXCONN, on_connection);
    if (!rc) rc = uv_timer_start(&s->timer, on_tick, TICK_MS, TICK_MS);
    s->workers = calloc((size_t)s->cfg.workers, sizeof *s->workers);
    if (!rc && !s->workers) rc = UV_ENOMEM;
    for (int i = 0; !rc && i < s->cfg.workers; i++, s->n_workers++)
        if (pthread_create(&s->workers[i], NULL, worker_main, s)) rc = UV_EAGAIN;
    if (!rc && pthread_create(&s->thread, NULL, loop_main, s)) rc = UV_EAGAIN;
    if (rc) {
        snprintf(err, errlen, "cannot start the HTTP server: %s", uv_strerror(rc));
        s->closing_all = true;
        close_all(s);
        uv_run(&s->loop, UV_RUN_DEFAULT);
        pthread_mutex_lock(&s->mu);
        s->quit_workers = true;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        for (int i = 0; i < s->n_workers; i++) pthread_join(s->workers[i], NULL);
        uv_loop_close(&s->loop);
        free(s->workers);
        free(s);
        return -1;
    }
    *out = s;
    return 0;
}

void hio_stop(struct hio_server *s) {
    if (!s) return;
    atomic_store(&s->stop, true);
    uv_async_send(&s->async);
    pthread_join(s->thread, NULL);
    pthread_mutex_lock(&s->mu);
    s->quit_workers = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < s->n_workers; i++) pthread_join(s->workers[i], NULL);
    uv_loop_close(&s->loop);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s->workers);
    free(s);
}
