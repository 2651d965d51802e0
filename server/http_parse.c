/* http_parse: strict HTTP/1.1 request heads and chunked bodies. */
#include "server/http_parse.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#define MAX_METHOD 32         // bytes of a method token
#define MAX_CHUNK_LINE 4096   // bytes of a chunk-size line with its extensions
#define MAX_TRAILERS 16384    // bytes of a chunked body's trailer fields

static int fail(struct http_error *err, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(struct http_error *err, int status, const char *fmt, ...) {
    err->status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    return -1;
}

/* RFC 9110 5.6.2 tchar. */
static bool is_tchar(unsigned char c) {
    if (c >= '0' && c <= '9') return true;
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return true;
    return c && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

static bool is_ws(char c) { return c == ' ' || c == '\t'; }

/* Bytes of empty lines before the request line. */
static size_t leading_crlfs(const char *buf, size_t len) {
    size_t p = 0;
    while (p + 1 < len && buf[p] == '\r' && buf[p + 1] == '\n') p += 2;
    return p;
}

long http_head_end(const char *buf, size_t len, size_t max_head, size_t max_target, struct http_error *err) {
    size_t p = leading_crlfs(buf, len);
    const char *eol = p < len ? memmem(buf + p, len - p, "\r\n", 2) : NULL;
    size_t line = eol ? (size_t)(eol - buf) - p : len - p;
    // method, target, version and their two spaces: anything longer has an over-long target
    if (line > MAX_METHOD + max_target + 2 + 8)
        return fail(err, 414, "the request target is over %zu bytes", max_target);
    const char *end = eol ? memmem(eol, len - (size_t)(eol - buf), "\r\n\r\n", 4) : NULL;
    if (end && (size_t)(end + 4 - buf) <= max_head) return (long)(end + 4 - buf);
    if (end || len > max_head) return fail(err, 431, "the request head is over %zu bytes", max_head);
    return 0;
}

static int parse_request_line(char *p, char *eol, size_t max_target, struct http_head *h, struct http_error *err) {
    char *m = p;
    while (p < eol && is_tchar((unsigned char)*p)) p++;
    if (p == m || p - m > MAX_METHOD || p >= eol || *p != ' ') return fail(err, 400, "malformed request line");
    *p++ = 0;
    h->method = m;
    char *t = p;
    while (p < eol && (unsigned char)*p > 0x20 && (unsigned char)*p < 0x7F) p++;
    if (p == t || p >= eol || *p != ' ') return fail(err, 400, "malformed request line");
    if ((size_t)(p - t) > max_target) return fail(err, 414, "the request target is over %zu bytes", max_target);
    *p++ = 0;
    h->target = t;
    // HTTP-version = "HTTP/" DIGIT "." DIGIT
    if (eol - p != 8 || memcmp(p, "HTTP/", 5) != 0 || p[5] < '0' || p[5] > '9' || p[6] != '.' || p[7] < '0' || p[7] > '9')
        return fail(err, 400, "malformed request line");
    if (p[5] != '1') return fail(err, 505, "HTTP/%c.%c is not supported (HTTP/1.1 and 1.0 are)", p[5], p[7]);
    h->minor = p[7] == '0' ? 0 : 1;
    *eol = 0;
    return 0;
}

/* One field line [p, eol): name, colon, value; NUL-terminates both in place. */
static int parse_field(char *p, char *eol, struct http_head *h, struct http_error *err) {
    if (is_ws(*p)) return fail(err, 400, "header field line folding (obs-fold) is not accepted");
    char *name = p;
    while (p < eol && is_tchar((unsigned char)*p)) p++;
    if (p == name) return fail(err, 400, "malformed header field");
    if (p < eol && is_ws(*p)) return fail(err, 400, "whitespace between a header field name and its colon");
    if (p >= eol || *p != ':') return fail(err, 400, "malformed header field");
    *p++ = 0;
    while (p < eol && is_ws(*p)) p++;
    char *value = p, *last = p;
    for (; p < eol; p++) {
        unsigned char c = (unsigned char)*p;
        if ((c < 0x20 && c != '\t') || c == 0x7F) return fail(err, 400, "control character in header field %.40s", name);
        if (!is_ws(*p)) last = p + 1;
    }
    *last = 0;
    if (h->n_fields >= HTTP_MAX_FIELDS) return fail(err, 431, "more than %d header fields", HTTP_MAX_FIELDS);
    h->fields[h->n_fields++] = (struct http_field){name, value};
    return 0;
}

/* Calls fn on each element of a comma-separated list value (OWS trimmed, empty ones skipped
 * unless keep_empty); stops at the first nonzero return. */
static int each_element(const char *v, bool keep_empty, int (*fn)(const char *s, size_t n, void *ud), void *ud) {
    for (;;) {
        while (is_ws(*v)) v++;
        const char *e = strchr(v, ',');
        size_t n = e ? (size_t)(e - v) : strlen(v);
        while (n && is_ws(v[n - 1])) n--;
        if (n || keep_empty) {
            int rc = fn(v, n, ud);
            if (rc) return rc;
        }
        if (!e) return 0;
        v = e + 1;
    }
}

struct length_state {
    int64_t value; // -1 until the first
    bool bad, conflict;
};

static int length_element(const char *s, size_t n, void *ud) {
    struct length_state *st = ud;
    int64_t v = 0;
    if (n == 0 || n > 18) return st->bad = true, 1; // 18 digits cannot overflow
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return st->bad = true, 1;
        v = v * 10 + (s[i] - '0');
    }
    if (st->value >= 0 && st->value != v) return st->conflict = true, 1;
    st->value = v;
    return 0;
}

struct coding_state {
    int n, chunked_at; // elements seen; index of "chunked" (-1 none)
    char other[32];    // the first coding other than chunked
};

static int coding_element(const char *s, size_t n, void *ud) {
    struct coding_state *st = ud;
    if (n == 7 && !strncasecmp(s, "chunked", 7)) {
        if (st->chunked_at >= 0) st->chunked_at = -2; // twice
        else if (st->chunked_at == -1) st->chunked_at = st->n;
    } else if (!st->other[0]) {
        snprintf(st->other, sizeof st->other, "%.*s", (int)(n < 24 ? n : 24), s);
    }
    st->n++;
    return 0;
}

static int connection_element(const char *s, size_t n, void *ud) {
    struct http_head *h = ud;
    if (n == 5 && !strncasecmp(s, "close", 5)) h->keep_alive = false;
    else if (n == 10 && !strncasecmp(s, "keep-alive", 10) && h->minor == 0) h->keep_alive = true;
    return 0;
}

/* Message framing and the fields that shape the connection (RFC 9112 6, 9.3; RFC 9110 7.2). */
static int check_semantics(struct http_head *h, struct http_error *err) {
    struct length_state len = {.value = -1};
    struct coding_state cod = {.chunked_at = -1};
    int n_len = 0, n_te = 0;
    h->keep_alive = h->minor >= 1;
    for (int i = 0; i < h->n_fields; i++) {
        const struct http_field *f = &h->fields[i];
        if (!strcasecmp(f->name, "Content-Length")) {
            n_len++;
            each_element(f->value, true, length_element, &len);
            if (len.bad) return fail(err, 400, "the Content-Length header is not a number");
            if (len.conflict) return fail(err, 400, "conflicting Content-Length values");
        } else if (!strcasecmp(f->name, "Transfer-Encoding")) {
            n_te++;
            each_element(f->value, false, coding_element, &cod);
        } else if (!strcasecmp(f->name, "Connection")) {
            each_element(f->value, false, connection_element, h);
        } else if (!strcasecmp(f->name, "Expect")) {
            h->expect_continue = h->minor >= 1 && !strcasecmp(f->value, "100-continue");
        }
    }
    int n_host = http_head_count(h, "Host");
    if (n_host > 1) return fail(err, 400, "more than one Host header");
    if (h->minor >= 1 && n_host == 0) return fail(err, 400, "an HTTP/1.1 request needs a Host header");
    if (n_te) {
        if (h->minor == 0) return fail(err, 400, "Transfer-Encoding in an HTTP/1.0 request");
        if (n_len) return fail(err, 400, "both Content-Length and Transfer-Encoding");
        if (cod.other[0]) return fail(err, 501, "Transfer-Encoding %s is not supported (only chunked)", cod.other);
        if (cod.chunked_at != 0 || cod.n != 1) return fail(err, 400, "malformed Transfer-Encoding");
        h->chunked = true;
    }
    h->content_length = n_len ? len.value : -1;
    return 0;
}

int http_parse_head(char *buf, size_t n, size_t max_target, struct http_head *h, struct http_error *err) {
    memset(h, 0, sizeof *h);
    h->content_length = -1;
    char *end = buf + n, *p = buf + leading_crlfs(buf, n);
    char *eol = memmem(p, (size_t)(end - p), "\r\n", 2);
    if (!eol) return fail(err, 400, "malformed request line");
    if (parse_request_line(p, eol, max_target, h, err)) return -1;
    for (p = eol + 2; p < end;) {
        eol = memmem(p, (size_t)(end - p), "\r\n", 2);
        if (!eol) return fail(err, 400, "malformed request head");
        if (eol == p) break; // the blank line
        if (memchr(p, '\n', (size_t)(eol - p)) || memchr(p, 0, (size_t)(eol - p)))
            return fail(err, 400, "control character in the request head");
        if (parse_field(p, eol, h, err)) return -1;
        p = eol + 2;
    }
    return check_semantics(h, err);
}

const char *http_head_field(const struct http_head *h, const char *name) {
    for (int i = 0; i < h->n_fields; i++)
        if (!strcasecmp(h->fields[i].name, name)) return h->fields[i].value;
    return NULL;
}

int http_head_count(const struct http_head *h, const char *name) {
    int n = 0;
    for (int i = 0; i < h->n_fields; i++) n += !strcasecmp(h->fields[i].name, name);
    return n;
}

/* ---- chunked bodies (RFC 9112 7.1) ---- */

enum {
    CK_SIZE,      // hex digits of a chunk size
    CK_SIZE_WS,   // whitespace after the digits (before an extension)
    CK_EXT,       // a chunk extension (ignored)
    CK_SIZE_LF,   // the size line's LF
    CK_DATA,
    CK_DATA_CR,
    CK_DATA_LF,
    CK_TRAILER0,  // the start of a trailer line (CR here: the end)
    CK_TRAILER,
    CK_TRAILER_LF,
    CK_END_LF,
};

static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f') return (c | 0x20) - 'a' + 10;
    return -1;
}

enum http_chunked_status http_chunked_feed(struct http_chunked *c, const char *in, size_t n, size_t *used,
                                           const char **data, size_t *data_len, struct http_error *err) {
    *data = NULL;
    *data_len = 0;
    size_t i = 0;
#define CK_FAIL(...) (*used = i, fail(err, 400, __VA_ARGS__), HTTP_CHUNKED_ERROR)
    while (i < n) {
        char ch = in[i];
        if (c->state == CK_DATA) {
            size_t take = n - i < c->left ? n - i : (size_t)c->left;
            *data = in + i;
            *data_len = take;
            c->left -= take;
            if (c->left == 0) c->state = CK_DATA_CR;
            *used = i + take;
            return HTTP_CHUNKED_MORE;
        }
        i++;
        switch (c->state) {
        case CK_SIZE:
        case CK_SIZE_WS:
        case CK_EXT:
            if (++c->line > MAX_CHUNK_LINE) return CK_FAIL("bad chunked encoding: chunk size line too long");
            if (ch == '\r') {
                if (!c->digits) return CK_FAIL("bad chunked encoding: chunk size missing");
                c->state = CK_SIZE_LF;
            } else if (c->state == CK_EXT) {
                if (((unsigned char)ch < 0x20 && ch != '\t') || ch == 0x7F)
                    return CK_FAIL("bad chunked encoding: control character in a chunk extension");
            } else if (ch == ';' && c->digits) {
                c->state = CK_EXT;
            } else if (is_ws(ch) && c->digits) {
                c->state = CK_SIZE_WS;
            } else if (c->state == CK_SIZE && hex_value(ch) >= 0) {
                if (c->left >> 56) return CK_FAIL("bad chunked encoding: chunk size too large");
                c->left = c->left * 16 + (uint64_t)hex_value(ch);
                c->digits = true;
            } else {
                return CK_FAIL("bad chunked encoding: malformed chunk size");
            }
            break;
        case CK_SIZE_LF:
            if (ch != '\n') return CK_FAIL("bad chunked encoding: CR without LF");
            c->line = 0;
            c->digits = false;
            c->state = c->left ? CK_DATA : CK_TRAILER0;
            break;
        case CK_DATA_CR:
            if (ch != '\r') return CK_FAIL("bad chunked encoding: chunk data longer than its size");
            c->state = CK_DATA_LF;
            break;
        case CK_DATA_LF:
            if (ch != '\n') return CK_FAIL("bad chunked encoding: CR without LF");
            c->state = CK_SIZE;
            break;
        case CK_TRAILER0:
        case CK_TRAILER:
            if (++c->trailers > MAX_TRAILERS) return CK_FAIL("bad chunked encoding: trailer fields too long");
            if (ch == '\r') c->state = c->state == CK_TRAILER0 ? CK_END_LF : CK_TRAILER_LF;
            else if (((unsigned char)ch < 0x20 && ch != '\t') || ch == 0x7F)
                return CK_FAIL("bad chunked encoding: control character in a trailer field");
            else c->state = CK_TRAILER;
            break;
        case CK_TRAILER_LF:
            if (ch != '\n') return CK_FAIL("bad chunked encoding: CR without LF");
            c->state = CK_TRAILER0;
            break;
        case CK_END_LF:
            if (ch != '\n') return CK_FAIL("bad chunked encoding: CR without LF");
            *used = i;
            return HTTP_CHUNKED_DONE;
        }
    }
#undef CK_FAIL
    *used = i;
    return HTTP_CHUNKED_MORE;
}

const char *http_reason(int status) {
    switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 417: return "Expectation Failed";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "";
    }
}
