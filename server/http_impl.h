/* http_impl: what the three files of the HTTP front end share, private to them. Each calls
 * only those below it:
 *   http.c      routing, the API key, body limits, the small endpoints, the transport's
 *               callbacks and the server's lifecycle;
 *   http_gen.c  completions, chat, tokenize: parsing and submitting on a worker, answering on
 *               the loop thread;
 *   http_req.c  what every handler does with a request: answer it, count its body against the
 *               server's budget, end it.
 *
 * Which thread touches what of a struct http_req: the loop thread everything, except while a
 * job for it runs on a worker (r->job), when the worker owns the request's generation fields
 * and the loop thread only reads or writes job, gone and the transport's handles. The ready
 * list and the active list are under srv->mu. */
#ifndef DUO_HTTP_IMPL_H
#define DUO_HTTP_IMPL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <pthread.h>

#include "server/cors.h"
#include "server/http.h"
#include "server/http_io.h"
#include "server/metrics.h"
#include "server/openai.h"
#include "server/openai_choice.h"
#include "server/openai_response.h"

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

struct http_req;

struct http_server {
    struct http_config cfg;
    struct hio_server *io;
    int port;
    _Atomic int state;              // enum http_state
    struct engine *_Atomic engine;  // set once by http_set_engine
    const struct chat_template *tmpl; // the chat template (set with the engine), or NULL
    struct metrics metrics;
    long long created;              // unix seconds at start (for /v1/models)
    pthread_mutex_t mu;             // guards the active and ready lists
    struct http_req *active;        // generation requests, from submit to their end
    int n_active;
    int n_jobs;                     // requests whose work runs on a worker (counted as active)
    struct http_req *ready;         // notified by the engine, to pump on the loop thread
    struct http_req **wake;         // loop thread: on_wake's copy of the ready list
    int wake_cap;
    atomic_ullong next_id;
    uint64_t id_salt;
    struct cors cors;
    char fingerprint[48];
    atomic_size_t buffered;         // request body bytes held by all requests
    atomic_bool trim_due;           // a large request ended: give its memory back to the system
    double t_trim;                  // loop thread: the last malloc_trim
};

struct choice_state {
    size_t chars;    // code points streamed so far (text_offset)
    double t_last;   // time of its last token (inter-token latency)
};

struct sbuf {
    char *s;
    size_t len, cap;
};

struct http_req {
    struct http_server *srv;
    struct hio_req *q;              // the transport's request (until done)
    enum route route;
    char method[12];
    char path[128];                 // the request target as sent (cut), for the log line
    char *url;                      // its path, decoded (NULL: malformed)
    double t_start;
    int status;
    char *err_msg;                  // for the log line
    char req_id[OPENAI_MAX_REQUEST_ID + 32]; // X-Request-Id: the client's, else the completion id or a generated one
    bool req_id_given;
    bool preflight;                 // a CORS preflight: its own Access-Control-* headers
    char *origin;                   // Origin, for CORS headers (copied: workers build responses)
    bool has_cookie;

    char *body;
    size_t body_len, body_cap;
    size_t held;                    // bytes of body counted in srv->buffered
    bool too_big;                   // answered 413 once the body has been read (and discarded)
    size_t discarded;               // body bytes read and dropped

    // work on a worker thread
    bool job;                       // loop thread: a job runs for r; r lives on until it ends
    bool gone;                      // loop thread: the connection ended while the job ran
    struct openai_error jerr;       // the job's refusal (jerr.status 0: none)
    char *job_body;                 // the job's response body
    bool large;                     // r held enough memory that malloc_trim is worth it afterwards

    // generation (route COMPLETIONS or CHAT after submit)
    bool gen;                       // on the active list
    bool started;                   // loop thread: submitted and the response under way
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
    int cached_tokens;              // of the prompts, found in the prefix cache
    double ttft;                    // < 0 until the first token
    bool finished;                  // every handle returned -1
    bool failed;
    struct openai_error ferr;
    bool cancelled;                 // by the tick (timeout) or drain; under srv->mu
    bool stream;
    bool stream_closed;             // [DONE] written
    bool blocked;                   // the stream waits for the client to read
    struct sbuf out;
    double t_last_write;

    bool queued;                    // on srv->ready (srv->mu)
    struct http_req *ready_next;
    struct http_req *prev, *next;   // the active list
};

#define LARGE_REQUEST (1u << 20) // bytes held past which a request's end calls for malloc_trim

/* http_req.c */
double http_now(void); // monotonic seconds
/* A fresh id "PREFIX-..." (unique in this process, not guessable across runs). Any thread. */
void http_make_id(struct http_server *s, char *buf, size_t n, const char *prefix);
/* What the parser allows, from the server's flags and the engine. */
void http_limits_of(struct http_server *s, struct engine *e, struct openai_limits *lim);
/* The Allow header of a route (the methods http.c admits on it). */
const char *http_allowed_methods(enum route rt);

/* Answers r: body (malloc'd, taken over; NULL = out of memory, answered 500). */
int http_respond(struct http_req *r, int status, char *body, const char *ctype);
int http_respond_error(struct http_req *r, const struct openai_error *err);
int http_fail(struct http_req *r, int status, const char *code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* The headers every response carries (X-Request-Id, CORS, Connection: close while draining). */
void http_common_headers(struct http_req *r, struct hio_headers *h);

/* Counts n more body bytes of r against the server's budget; false (nothing counted) past it. */
bool http_hold_body(struct http_req *r, size_t n);
/* Frees r's body and gives its bytes back to the server's budget. */
void http_release_body(struct http_req *r);

/* The tokens r's choices generated. */
int http_req_completion_tokens(const struct http_req *r);
/* The end of r (loop thread; completed: its response was sent whole): its engine handles
 * released (what still runs is cancelled), off the server's lists, its log line and counters,
 * then its memory. */
void http_req_end(struct http_req *r, bool completed);

/* http_gen.c */
/* Starts a completion, chat or tokenize request on a worker (the body is in). */
void http_gen_dispatch(struct http_req *r);
/* Pumps the engine's events of r into its response (loop thread). */
void http_gen_pump(struct http_req *r);
/* The engine's notify callback. */
void http_gen_notify(void *ud);
/* Loop thread, each tick: keep-alive comments and request timeouts of the active requests. */
void http_gen_tick(struct http_server *s);

#endif
