/* cors: Cross-Origin Resource Sharing for browser clients, with vLLM's flags and defaults
 * (--allowed-origins, --allowed-methods, --allowed-headers: JSON lists, "*" for any, default
 * ["*"]; --allow-credentials) and the behaviour of Starlette's CORSMiddleware, which vLLM uses:
 * a preflight (OPTIONS with Origin and Access-Control-Request-Method) is answered 200 with the
 * Access-Control-* headers, or 400 naming what is disallowed; any other response to an
 * allowed Origin carries Access-Control-Allow-Origin.
 *
 * Built once at start-up and read-only afterwards, so any thread may use it. */
#ifndef DUO_CORS_H
#define DUO_CORS_H

#include <stdbool.h>
#include <stddef.h>

struct hio_headers;

struct cors_list {
    char **v;  // lower-cased for headers; as given otherwise
    int n;
    bool any;  // the list holds "*"
};

struct cors {
    struct cors_list origins, methods, headers;
    bool credentials;
    char *allow_methods; // Access-Control-Allow-Methods of a preflight
    char *allow_headers; // Access-Control-Allow-Headers of a preflight (NULL: mirror the request's)
};

/* Each list is JSON text such as ["https://example.com"] (NULL: ["*"]). Returns 0, or -1 with a
 * message naming the flag in err (c is then empty). */
int cors_init(struct cors *c, const char *origins, const char *methods, const char *headers, bool credentials,
              char *err, size_t errlen);
void cors_free(struct cors *c);

/* A response to a request from origin (NULL: not a cross-origin request, nothing added). */
void cors_add_headers(const struct cors *c, const char *origin, bool has_cookie, struct hio_headers *resp);

/* Whether a preflight may go ahead: 0 when origin, method and the comma-separated request
 * headers (NULL: none) are all allowed, else -1 with "origin", "method" and/or "headers"
 * listed in what. */
int cors_preflight_check(const struct cors *c, const char *origin, const char *method, const char *req_headers,
                         char *what, size_t whatlen);
/* The Access-Control-* headers of a preflight's answer (allowed or not, as Starlette sends). */
void cors_preflight_headers(const struct cors *c, const char *origin, const char *req_headers, struct hio_headers *resp);

#endif
