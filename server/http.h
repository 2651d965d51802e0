/* http: the HTTP front end. Routes, API-key check, body limits, OpenAI endpoints (non-streamed
 * and Server-Sent Events), /health, /metrics, and the drain, over the transport of http_io.h.
 *
 * Every response carries X-Request-Id (the client's, else the completion id or a generated one)
 * and, for an allowed Origin, the CORS headers (cors.h); a CORS preflight is answered without an
 * API key.
 *
 * Threads: the transport's loop thread runs routing, the small endpoints, the streams and the
 * periodic work (keep-alive comments on idle streams, cancelling requests whose time ran out);
 * its worker threads parse, tokenize and submit generation and tokenize requests and build large
 * responses, so that no request's work holds up another's stream. The engine's notify callback
 * (engine thread) only queues the request and wakes the loop.
 *
 * Engine contract relied on: after engine_release(h) returns, the engine never calls h's
 * notify again and no call of it is still running. */
#ifndef DUO_HTTP_H
#define DUO_HTTP_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>

struct chat_template;
struct engine;

struct http_config {
    const char *host;          // address to bind ("127.0.0.1", "0.0.0.0", "::")
    int port;                  // 0 = any free port (see http_port)
    const char *api_key;       // NULL: no authentication (serve refuses an empty key)
    const char *model_name;    // served model id
    const char *model_root;    // shown as "root" in /v1/models
    const char *metrics_name;  // the model_name label of /metrics (NULL: model_name)
    size_t max_request_bytes;  // larger bodies get 413
    size_t max_buffered_bytes; // request bodies held by all requests together; 503 past it (0: no limit)
    int max_connections;       // one more is answered 503
    int threads;               // worker threads (parsing, tokenizing, large responses)
    int conn_timeout_s;        // idle connection timeout (no request in progress)
    double header_timeout_s;   // a request head must arrive within this (408)
    double body_timeout_s;     // a request body must arrive within this after its head (408)
    double request_timeout_s;  // a request running longer is cancelled (0 = never)
    double keepalive_s;        // SSE comment after this long without output
    int max_n;                 // largest n (0: the engine's max_num_seqs)
    long long max_request_tokens;   // prompts x n x max_tokens of one request (0: no limit)
    long long max_request_logprobs; // ... x top logprobs (0: no limit)
    const char *allowed_origins; // CORS: JSON lists ("*": any; NULL: ["*"], as vLLM)
    const char *allowed_methods;
    const char *allowed_headers;
    bool allow_credentials;
    const char *backend;       // e.g. "device=auto gemm=invariant": part of system_fingerprint
};

enum http_state {
    HTTP_STATE_LOADING,  // /health 503, API 503
    HTTP_STATE_READY,
    HTTP_STATE_DRAINING, // /health 503, new API requests 503, running ones finish
};

struct http_server;

/* Checks what http_start would refuse before listening (the CORS lists): 0, or -1 with a
 * message naming the flag in err. */
int http_check_config(const struct http_config *cfg, char *err, size_t errlen);
/* Starts listening (state LOADING). cfg's strings must outlive the server. A port in use is an
 * error (never shared with another process). */
int http_start(struct http_server **out, const struct http_config *cfg, char *err, size_t errlen);
/* The engine is loaded: requests are served from now on (state READY). e is borrowed. */
/* The engine is loaded: requests are served from now on, chat ones with tmpl (borrowed: it must
 * outlive the server; NULL when the model has no chat template). */
void http_set_engine(struct http_server *s, struct engine *e, const struct chat_template *tmpl);
void http_set_state(struct http_server *s, enum http_state st);
/* /health answers 503 while one of these signals is pending (sent, not yet taken by the
 * caller's sigwait), so that no probe is answered 200 after SIGTERM. Set before http_start. */
void http_set_drain_signals(const sigset_t *set);
int http_port(const struct http_server *s);
/* Requests being prepared, generated or streamed (their response not yet fully sent). */
int http_num_active(struct http_server *s);
/* Cancels every active request (their choices finish with "abort"). */
void http_cancel_all(struct http_server *s);
/* Stops listening, closes every connection and frees s; NULL is a no-op. Call once no request
 * is active (or after http_cancel_all and a short wait), before engine_destroy. */
void http_stop(struct http_server *s);

#endif
