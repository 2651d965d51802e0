/* http_parse: an HTTP/1.1 request head (RFC 9112) and a chunked request body, parsed strictly.
 *
 * Strict wherever a lenient reading would let a proxy in front and this server frame a request
 * differently (request smuggling): at most one Content-Length value, never both it and
 * Transfer-Encoding, no whitespace before a field's colon, no obsolete line folding, CRLF line
 * ends only, no control characters in a field, exactly one Host in HTTP/1.1.
 *
 * Pure functions on caller memory: any thread may call them; the unit tests drive them. */
#ifndef DUO_HTTP_PARSE_H
#define DUO_HTTP_PARSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define HTTP_MAX_FIELDS 100 // header fields of one request (431 past it)

/* Why a request cannot be served: the HTTP status (400, 413, 414, 431, 501, 505) and a
 * sentence for the client. */
struct http_error {
    int status;
    char message[160];
};

struct http_field {
    const char *name, *value; // NUL-terminated, inside the parsed buffer; value without surrounding spaces
};

struct http_head {
    const char *method;  // a token, as sent (methods are case-sensitive)
    const char *target;  // the request target, as sent
    int minor;           // HTTP/1.minor: 0 or 1 (1.2 and later are read as 1.1)
    struct http_field fields[HTTP_MAX_FIELDS];
    int n_fields;
    int64_t content_length; // -1: none
    bool chunked;           // Transfer-Encoding: chunked
    bool keep_alive;        // the connection may carry another request after this one
    bool expect_continue;   // Expect: 100-continue (HTTP/1.1)
};

/* Where the head in buf[0..len) ends (the byte after its blank line), 0 while it is not all
 * there, or -1 with err when it cannot become a head within max_head bytes (431) or its
 * request target is over max_target bytes (414). Empty lines before the request line count
 * as part of the head (RFC 9112 2.2). */
long http_head_end(const char *buf, size_t len, size_t max_head, size_t max_target, struct http_error *err);

/* Parses the head buf[0..n) (as delimited by http_head_end) in place: NULs are written into
 * buf, and h points into it. Returns 0, or -1 with err. */
int http_parse_head(char *buf, size_t n, size_t max_target, struct http_head *h, struct http_error *err);

/* The value of the first field called name (case-insensitive), or NULL. */
const char *http_head_field(const struct http_head *h, const char *name);
/* How many fields are called name. */
int http_head_count(const struct http_head *h, const char *name);

/* A chunked body, decoded as its bytes arrive. Zero-initialise before the first byte. */
struct http_chunked {
    int state;
    uint64_t left;   // data bytes left in the current chunk
    size_t line;     // bytes of the current size or trailer line
    size_t trailers; // bytes of trailer fields so far
    bool digits;     // the size line has a digit
};

enum http_chunked_status { HTTP_CHUNKED_MORE, HTTP_CHUNKED_DONE, HTTP_CHUNKED_ERROR };

/* Consumes bytes of a chunked body from in[0..n): *used is how many it took; when some of them
 * are body data, *data and *data_len name that run (inside in), else *data_len is 0. Returns
 * MORE (call again with in + *used while bytes remain), DONE (the last chunk and the trailers
 * are in; the bytes from in + *used on belong to the next request) or ERROR (err: 400). */
enum http_chunked_status http_chunked_feed(struct http_chunked *c, const char *in, size_t n, size_t *used,
                                           const char **data, size_t *data_len, struct http_error *err);

/* The reason phrase of a status code ("OK", "Bad Request", ...; "" when unknown). */
const char *http_reason(int status);

#endif
