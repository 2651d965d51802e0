/* cors: the lists, the preflight answer and the headers of ordinary responses. */
#include "server/cors.h"

#include <ctype.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/http_io.h"

static const char *const ALL_METHODS[] = {"DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT"};
// Request headers a browser may always send (CORS safelist); listed in every explicit answer.
static const char *const SAFELISTED_HEADERS[] = {"accept", "accept-language", "content-language", "content-type"};

static void list_free(struct cors_list *l) {
    for (int i = 0; i < l->n; i++) free(l->v[i]);
    free(l->v);
    memset(l, 0, sizeof *l);
}

static int list_add(struct cors_list *l, const char *s, bool lower) {
    char **v = realloc(l->v, sizeof *v * (size_t)(l->n + 1));
    if (!v) return -1;
    l->v = v;
    if (!(v[l->n] = strdup(s))) return -1;
    if (lower)
        for (char *p = v[l->n]; *p; p++) *p = (char)tolower((unsigned char)*p);
    l->n++;
    if (!strcmp(s, "*")) l->any = true;
    return 0;
}

/* json: a JSON list of non-empty strings without control characters (NULL: ["*"]). */
static int list_parse(struct cors_list *l, const char *json, const char *flag, bool lower, char *err, size_t errlen) {
    if (!json) return list_add(l, "*", false) ? (snprintf(err, errlen, "out of memory"), -1) : 0;
    cJSON *root = cJSON_Parse(json);
    int rc = cJSON_IsArray(root) ? 0 : -1;
    const cJSON *it, *arr = rc ? NULL : root;
    cJSON_ArrayForEach(it, arr) {
        bool ok = cJSON_IsString(it) && it->valuestring[0];
        for (const char *p = ok ? it->valuestring : ""; *p; p++) ok &= (unsigned char)*p >= 0x20 && *p != 0x7f;
        if (!ok || list_add(l, it->valuestring, lower)) {
            rc = -1;
            break;
        }
    }
    cJSON_Delete(root);
    if (rc) {
        snprintf(err, errlen,
                 "--%s: \"%.200s\" is not a JSON list of strings (e.g. '[\"https://example.com\"]', or '[\"*\"]' for any)",
                 flag, json);
        list_free(l);
    }
    return rc;
}

/* The strings joined with ", " (malloc'd). */
static char *join(const char *const *v, int n, const struct cors_list *more) {
    size_t len = 1;
    for (int i = 0; i < n; i++) len += strlen(v[i]) + 2;
    for (int i = 0; more && i < more->n; i++) len += strlen(more->v[i]) + 2;
    char *s = malloc(len);
    if (!s) return NULL;
    s[0] = 0;
    for (int i = 0; i < n + (more ? more->n : 0); i++) {
        const char *x = i < n ? v[i] : more->v[i - n];
        bool dup = false; // headers given twice, or a safelisted one given again
        for (int j = 0; j < i && !dup; j++) dup = !strcmp(j < n ? v[j] : more->v[j - n], x);
        if (dup) continue;
        if (s[0]) strcat(s, ", ");
        strcat(s, x);
    }
    return s;
}

int cors_init(struct cors *c, const char *origins, const char *methods, const char *headers, bool credentials,
              char *err, size_t errlen) {
    memset(c, 0, sizeof *c);
    c->credentials = credentials;
    if (list_parse(&c->origins, origins, "allowed-origins", false, err, errlen) ||
        list_parse(&c->methods, methods, "allowed-methods", false, err, errlen) ||
        list_parse(&c->headers, headers, "allowed-headers", true, err, errlen)) {
        cors_free(c);
        return -1;
    }
    int n_all = (int)(sizeof ALL_METHODS / sizeof ALL_METHODS[0]);
    c->allow_methods = c->methods.any ? join(ALL_METHODS, n_all, NULL)
                                      : join((const char *const *)c->methods.v, c->methods.n, NULL);
    int n_safe = (int)(sizeof SAFELISTED_HEADERS / sizeof SAFELISTED_HEADERS[0]);
    if (!c->headers.any) c->allow_headers = join(SAFELISTED_HEADERS, n_safe, &c->headers);
    if (!c->allow_methods || (!c->headers.any && !c->allow_headers)) {
        snprintf(err, errlen, "out of memory");
        cors_free(c);
        return -1;
    }
    return 0;
}

void cors_free(struct cors *c) {
    if (!c) return;
    list_free(&c->origins);
    list_free(&c->methods);
    list_free(&c->headers);
    free(c->allow_methods);
    free(c->allow_headers);
    memset(c, 0, sizeof *c);
}

static bool list_has(const struct cors_list *l, const char *s, size_t n) {
    for (int i = 0; i < l->n; i++)
        if (strlen(l->v[i]) == n && !memcmp(l->v[i], s, n)) return true;
    return false;
}

static bool origin_allowed(const struct cors *c, const char *origin) {
    return c->origins.any || list_has(&c->origins, origin, strlen(origin));
}

/* Echoing the origin (not "*") is needed when only some origins are allowed, and whenever
 * the browser sends or may send credentials, for which it refuses a "*". */
static bool explicit_origin(const struct cors *c, bool has_cookie) {
    return !c->origins.any || c->credentials || has_cookie;
}

void cors_add_headers(const struct cors *c, const char *origin, bool has_cookie, struct hio_headers *resp) {
    if (!origin || !origin_allowed(c, origin)) return;
    if (explicit_origin(c, has_cookie)) {
        hio_headers_add(resp, "Access-Control-Allow-Origin", origin);
        hio_headers_add(resp, "Vary", "Origin");
    } else {
        hio_headers_add(resp, "Access-Control-Allow-Origin", "*");
    }
    if (c->credentials) hio_headers_add(resp, "Access-Control-Allow-Credentials", "true");
}

/* Every header of a comma-separated Access-Control-Request-Headers is allowed. */
static bool headers_allowed(const struct cors *c, const char *req) {
    const char *p = req;
    while (*p) {
        while (*p == ' ' || *p == '\t' || *p == ',') p++;
        const char *b = p;
        while (*p && *p != ',') p++;
        const char *e = p;
        while (e > b && (e[-1] == ' ' || e[-1] == '\t')) e--;
        if (e == b) continue;
        char name[128];
        size_t n = (size_t)(e - b);
        if (n >= sizeof name) return false;
        for (size_t i = 0; i < n; i++) name[i] = (char)tolower((unsigned char)b[i]);
        bool ok = list_has(&c->headers, name, n);
        for (size_t i = 0; !ok && i < sizeof SAFELISTED_HEADERS / sizeof SAFELISTED_HEADERS[0]; i++)
            ok = strlen(SAFELISTED_HEADERS[i]) == n && !memcmp(SAFELISTED_HEADERS[i], name, n);
        if (!ok) return false;
    }
    return true;
}

static bool method_allowed(const struct cors *c, const char *method) {
    if (!c->methods.any) return list_has(&c->methods, method, strlen(method));
    for (size_t i = 0; i < sizeof ALL_METHODS / sizeof ALL_METHODS[0]; i++)
        if (!strcmp(ALL_METHODS[i], method)) return true;
    return false;
}

int cors_preflight_check(const struct cors *c, const char *origin, const char *method, const char *req_headers,
                         char *what, size_t whatlen) {
    const char *bad[3];
    int n = 0;
    if (!origin_allowed(c, origin)) bad[n++] = "origin";
    if (!method_allowed(c, method)) bad[n++] = "method";
    if (!c->headers.any && req_headers && !headers_allowed(c, req_headers)) bad[n++] = "headers";
    snprintf(what, whatlen, "%s%s%s%s%s", n > 0 ? bad[0] : "", n > 1 ? ", " : "", n > 1 ? bad[1] : "", n > 2 ? ", " : "",
             n > 2 ? bad[2] : "");
    return n ? -1 : 0;
}

void cors_preflight_headers(const struct cors *c, const char *origin, const char *req_headers, struct hio_headers *resp) {
    if (!explicit_origin(c, false)) {
        hio_headers_add(resp, "Access-Control-Allow-Origin", "*");
    } else {
        hio_headers_add(resp, "Vary", "Origin");
        if (origin_allowed(c, origin)) hio_headers_add(resp, "Access-Control-Allow-Origin", origin);
    }
    hio_headers_add(resp, "Access-Control-Allow-Methods", c->allow_methods);
    hio_headers_add(resp, "Access-Control-Max-Age", "600");
    if (c->allow_headers) hio_headers_add(resp, "Access-Control-Allow-Headers", c->allow_headers);
    else if (req_headers) hio_headers_add(resp, "Access-Control-Allow-Headers", req_headers);
    if (c->credentials) hio_headers_add(resp, "Access-Control-Allow-Credentials", "true");
}
