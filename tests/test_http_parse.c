/* Unit tests of server/http_parse.*: strict request heads (framing that a proxy could read
 * differently is refused) and the chunked body decoder. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "server/http_parse.h"

#define MAX_HEAD 4096
#define MAX_TARGET 256

/* Parses a whole head; returns the status it is refused with, or 0. */
static int parse(const char *text, struct http_head *h, char *buf, size_t cap) {
    struct http_error err = {0};
    size_t n = strlen(text);
    assert_true(n < cap);
    memcpy(buf, text, n + 1);
    long end = http_head_end(buf, n, MAX_HEAD, MAX_TARGET, &err);
    if (end < 0) return err.status;
    assert_int_equal(end, (long)n);
    return http_parse_head(buf, n, MAX_TARGET, h, &err) ? err.status : 0;
}

static int status_of(const char *text) {
    static char buf[MAX_HEAD * 2];
    struct http_head h;
    return parse(text, &h, buf, sizeof buf);
}

static void a_plain_request_parses(void **state) {
    char buf[512];
    struct http_head h;
    assert_int_equal(parse("\r\nPOST /v1/completions HTTP/1.1\r\nHost: x\r\ncontent-length:  12 \r\n"
                           "X-Empty:\r\nExpect: 100-continue\r\n\r\n", &h, buf, sizeof buf), 0);
    assert_string_equal(h.method, "POST");
    assert_string_equal(h.target, "/v1/completions");
    assert_int_equal(h.minor, 1);
    assert_int_equal(h.content_length, 12);
    assert_false(h.chunked);
    assert_true(h.keep_alive);
    assert_true(h.expect_continue);
    assert_string_equal(http_head_field(&h, "CONTENT-LENGTH"), "12");
    assert_string_equal(http_head_field(&h, "x-empty"), "");
    assert_null(http_head_field(&h, "Authorization"));
    assert_int_equal(http_head_count(&h, "host"), 1);

    assert_int_equal(parse("GET /health HTTP/1.0\r\n\r\n", &h, buf, sizeof buf), 0);
    assert_int_equal(h.minor, 0);
    assert_false(h.keep_alive);
    assert_int_equal(h.content_length, -1);
    assert_int_equal(parse("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", &h, buf, sizeof buf), 0);
    assert_true(h.keep_alive);
    assert_int_equal(parse("GET / HTTP/1.1\r\nHost: x\r\nConnection: foo, close\r\n\r\n", &h, buf, sizeof buf), 0);
    assert_false(h.keep_alive);
    assert_int_equal(parse("GET / HTTP/1.2\r\nHost: x\r\n\r\n", &h, buf, sizeof buf), 0); // read as 1.1
    assert_int_equal(h.minor, 1);
}

static void framing_that_could_smuggle_is_400(void **state) {
    assert_int_equal(status_of("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 30\r\nContent-Length: 5\r\n\r\n"), 400);
    assert_int_equal(status_of("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5, 6\r\n\r\n"), 400);
    assert_int_equal(status_of("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n"), 400);
    assert_int_equal(status_of("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n"), 400);
    assert_int_equal(status_of("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1e3\r\n\r\n"), 400);
    assert_int_equal(status_of("POST / HTTP/1.1\r\nHost: x\r\nContent-Length:\r\n\r\n"), 400);
    assert_int_equal(status_of("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n"), 400);
    assert_int_equal(status_of("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n"), 400);
    assert_int_equal(status_of("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, chunked\r\n\r\n"), 400);
    assert_int_equal(status_of("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"), 400);
    assert_int_equal(status_of("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"), 501);
    assert_int_equal(status_of("POST / HTTP/1.1\r\nHost: x\r\nContent-Length : 3\r\n\r\n"), 400);
    assert_int_equal(status_of("POST / HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n folded\r\n\r\n"), 400);
    assert_int_equal(status_of("POST / HTTP/1.1\r\nHost: x\r\nX-A: a\nb\r\n\r\n"), 400);
    assert_int_equal(status_of("POST / HTTP/1.1\r\nHost: x\r\nX-A: a\rb\r\n\r\n"), 400);
    // the same length twice is one length (RFC 9110 8.6)
    assert_int_equal(status_of("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 7\r\nContent-Length: 7, 7\r\n\r\n"), 0);
}

static void host_is_required_once_in_http_1_1(void **state) {
    assert_int_equal(status_of("GET /health HTTP/1.1\r\n\r\n"), 400);
    assert_int_equal(status_of("GET /health HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"), 400);
    assert_int_equal(status_of("GET /health HTTP/1.0\r\n\r\n"), 0);
}

static void versions_targets_and_sizes(void **state) {
    assert_int_equal(status_of("GET / HTTP/2.0\r\nHost: x\r\n\r\n"), 505);
    assert_int_equal(status_of("GET / HTTP/0.9\r\nHost: x\r\n\r\n"), 505);
    assert_int_equal(status_of("GET / HTTP/1\r\nHost: x\r\n\r\n"), 400);
    assert_int_equal(status_of("GET /  HTTP/1.1\r\nHost: x\r\n\r\n"), 400);
    assert_int_equal(status_of("G(T / HTTP/1.1\r\nHost: x\r\n\r\n"), 400);
    char big[MAX_HEAD * 2];
    snprintf(big, sizeof big, "GET /%0*d HTTP/1.1\r\nHost: x\r\n\r\n", MAX_TARGET + 1, 0);
    assert_int_equal(status_of(big), 414);
    snprintf(big, sizeof big, "GET / HTTP/1.1\r\nHost: x\r\nX-A: %0*d\r\n\r\n", MAX_HEAD, 0);
    assert_int_equal(status_of(big), 431);
    char *many = malloc(HTTP_MAX_FIELDS * 16 + 64), *w = many;
    w += sprintf(w, "GET / HTTP/1.1\r\nHost: x\r\n");
    for (int i = 0; i < HTTP_MAX_FIELDS; i++) w += sprintf(w, "X-%d: 1\r\n", i);
    sprintf(w, "\r\n");
    assert_int_equal(status_of(many), 431);
    free(many);
}

static void head_end_waits_then_refuses_early(void **state) {
    struct http_error err;
    const char *part = "POST / HTTP/1.1\r\nHost: x\r\n";
    assert_int_equal(http_head_end(part, strlen(part), MAX_HEAD, MAX_TARGET, &err), 0);
    assert_int_equal(http_head_end("", 0, MAX_HEAD, MAX_TARGET, &err), 0);
    // a request line longer than any valid one is 414 before its end arrives
    char line[MAX_TARGET + 64];
    memset(line, 'a', sizeof line);
    assert_int_equal(http_head_end(line, sizeof line, MAX_HEAD, MAX_TARGET, &err), -1);
    assert_int_equal(err.status, 414);
    char *big = malloc(MAX_HEAD + 2);
    memcpy(big, "GET / HTTP/1.1\r\n", 16);
    memset(big + 16, 'a', MAX_HEAD + 2 - 16);
    assert_int_equal(http_head_end(big, MAX_HEAD + 2, MAX_HEAD, MAX_TARGET, &err), -1);
    assert_int_equal(err.status, 431);
    free(big);
}

/* Feeds body in pieces of `step` bytes; returns the decoded data (malloc'd) or NULL on error. */
static char *dechunk(const char *body, size_t step, size_t *rest, int *status) {
    struct http_chunked c = {0};
    struct http_error err = {0};
    size_t n = strlen(body), at = 0, out_n = 0;
    char *out = calloc(1, n + 1);
    while (at < n) {
        size_t piece = n - at < step ? n - at : step, used, dlen;
        const char *d;
        enum http_chunked_status st = http_chunked_feed(&c, body + at, piece, &used, &d, &dlen, &err);
        memcpy(out + out_n, d ? d : "", dlen);
        out_n += dlen;
        at += used;
        if (st == HTTP_CHUNKED_ERROR) {
            *status = err.status;
            free(out);
            return NULL;
        }
        if (st == HTTP_CHUNKED_DONE) {
            *rest = n - at;
            return out;
        }
    }
    *status = 0;
    free(out);
    return NULL; // incomplete
}

static void chunked_bodies_decode_in_any_pieces(void **state) {
    const char *body = "5\r\nhello\r\n1;ext=1\r\n \r\nA \r\n0123456789\r\n0\r\nX-Trailer: 1\r\n\r\nNEXT";
    for (size_t step = 1; step <= strlen(body); step++) {
        size_t rest = 0;
        int st = -1;
        char *d = dechunk(body, step, &rest, &st);
        assert_non_null(d);
        assert_string_equal(d, "hello 0123456789");
        assert_int_equal(rest, 4);
        free(d);
    }
}

static void bad_chunks_are_400(void **state) {
    const char *bad[] = {
        "zz\r\nabc\r\n0\r\n\r\n",          // not hex
        "3\r\nabcd\r\n0\r\n\r\n",          // more data than the size
        "3\nabc\r\n0\r\n\r\n",             // LF without CR
        "\r\n0\r\n\r\n",                   // no size
        "-3\r\nabc\r\n0\r\n\r\n",
        "fffffffffffffffff\r\n",           // over 64 bits
        "3 4\r\nabc\r\n0\r\n\r\n",
        "0\r\nX: a\x01\r\n\r\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        size_t rest;
        int st = 0;
        char *d = dechunk(bad[i], 3, &rest, &st);
        if (d) fail_msg("accepted: %s", bad[i]);
        assert_int_equal(st, 400);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_plain_request_parses),
        cmocka_unit_test(framing_that_could_smuggle_is_400),
        cmocka_unit_test(host_is_required_once_in_http_1_1),
        cmocka_unit_test(versions_targets_and_sizes),
        cmocka_unit_test(head_end_waits_then_refuses_early),
        cmocka_unit_test(chunked_bodies_decode_in_any_pieces),
        cmocka_unit_test(bad_chunks_are_400),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
