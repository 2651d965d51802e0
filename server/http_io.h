/* http_io: the server's HTTP/1.1 transport. One libuv loop, on a thread of its own, accepts
 * connections, frames requests (http_parse.h) and writes responses, whole or streamed
 * (chunked); a few worker threads run the work the application hands them (hio_work), so that
 * parsing or tokenizing one request never holds up another's I/O.
 *
 * Limits enforced here; every refusal goes out in the application's error shape (on_reject,
 * on_error) with Connection: close:
 *   max_connections     one connection more is answered 503 at once and closed;
 *   max_head, max_target, HTTP_MAX_FIELDS      431, 414, 431;
 *   header_timeout_s    a request head must be complete this long after its first byte (408);
 *   body_timeout_s      a request body must be complete this long after its head (408);
 *   idle_timeout_s      a connection with no request in progress is closed after this long.
 * A connection whose request body was not read to its end (an early answer, an error) is
 * closed gracefully: shut down for writing, the client's remaining bytes read and dropped for
 * up to 2 s, so that it reads the answer instead of a reset.
 *
 * Threads: every callback runs on the loop thread; hio_wake, hio_work and hio_stop may be
 * called from any thread, everything else only on the loop thread. A struct hio_req is valid
 * from on_head until its on_done returns. */
#ifndef DUO_HTTP_IO_H
#define DUO_HTTP_IO_H

#include <stdbool.h>
#include <stddef.h>

struct hio_server;
struct hio_req;

struct hio_callbacks {
    /* A request head has arrived: returns the application's request object (NULL: out of
     * memory; the request is refused with 500). The application may answer at once. */
    void *(*on_head)(void *ud, struct hio_req *q);
    /* A run of body bytes (only while the request is not answered). */
    void (*on_body)(void *rq, const char *data, size_t n);
    /* The body is complete and the request not answered yet. */
    void (*on_end)(void *rq);
    /* The transport cannot go on with the request (a bad chunked body, the body timeout):
     * status and message say why. The application answers it (hio_respond) if it is not
     * answered yet; the connection is closed afterwards. */
    void (*on_error)(void *rq, int status, const char *message);
    /* The request is over: its response was sent (completed) or the connection was lost.
     * rq must not be used by the transport afterwards; the application frees it. */
    void (*on_done)(void *rq, bool completed);
    /* A streamed response's unsent bytes fell below HIO_LOW_WATER. */
    void (*on_writable)(void *rq);
    /* The body (malloc'd JSON) of a refusal made before any request object exists: a bad
     * head, a head timeout, the connection limit. method and target are NULL when unknown. */
    char *(*on_reject)(void *ud, int status, const char *message, const char *method, const char *target);
    /* After hio_wake (coalesced: one call may answer several wakes). */
    void (*on_wake)(void *ud);
    /* About every 100 ms. */
    void (*on_tick)(void *ud);
};

struct hio_config {
    int listen_fd;            // a listening socket, taken over
    int max_connections;
    size_t max_head;          // request line and header fields
    size_t max_target;        // request target
    double header_timeout_s, body_timeout_s, idle_timeout_s;
    int workers;              // threads of hio_work
    const struct hio_callbacks *cb;
    void *ud;
};

#define HIO_LOW_WATER (256u << 10) // bytes of a response not yet sent below which a stream may write more

/* Starts the loop thread and the workers. 0, or -1 with a message in err (fd then closed). */
int hio_start(struct hio_server **out, const struct hio_config *cfg, char *err, size_t errlen);
/* Stops accepting, waits for the work in hand (hio_work jobs), closes every connection
 * (on_done(rq, false) for requests still open), joins the threads and frees s; NULL: no-op. */
void hio_stop(struct hio_server *s);
/* Calls on_wake soon on the loop thread. */
void hio_wake(struct hio_server *s);
/* Runs work(arg) on a worker thread, then done(arg) on the loop thread. 0 or -1 (memory). */
int hio_work(struct hio_server *s, void (*work)(void *arg), void (*done)(void *arg), void *arg);
/* Open connections (refused ones excluded). */
int hio_num_connections(struct hio_server *s);

/* ---- a request ---- */

const char *hio_method(const struct hio_req *q);
const char *hio_target(const struct hio_req *q);
int hio_http_minor(const struct hio_req *q);
/* The first field called name, or NULL; and how many there are. */
const char *hio_header(const struct hio_req *q, const char *name);
int hio_header_count(const struct hio_req *q, const char *name);

/* Response header fields, beyond those the transport writes itself (Date, Content-Length,
 * Transfer-Encoding, Connection). Values lose any CR or LF. */
struct hio_headers {
    char buf[2048];
    size_t len;
    bool close; // Connection: close (the connection ends after this response)
};
void hio_headers_add(struct hio_headers *h, const char *name, const char *value);

/* A whole response; takes body (malloc'd; NULL with len 0: empty). HEAD requests get the head
 * alone. 0, or -1 when the request was already answered (body freed). */
int hio_respond(struct hio_req *q, int status, const struct hio_headers *h, char *body, size_t len);
/* A streamed response: the head now, the body in pieces (chunked; close-delimited in HTTP/1.0). */
int hio_stream_start(struct hio_req *q, int status, const struct hio_headers *h);
/* Copies data[0..n) out. */
int hio_stream_write(struct hio_req *q, const char *data, size_t n);
int hio_stream_end(struct hio_req *q);
/* Bytes handed to the transport and not yet sent. */
size_t hio_unsent(const struct hio_req *q);

#endif
