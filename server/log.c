/* log: text or JSON lines on stderr. */
#include "server/log.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static bool log_json;

void log_set_json(bool json) {
    log_json = json;
}

bool log_is_json(void) {
    return log_json;
}

static void timestamp(char *buf, size_t n) {
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    size_t k = strftime(buf, n, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf + k, n - k, ".%03ldZ", ts.tv_nsec / 1000000);
}

/* Text lines: control characters (C0, DEL, C1) in any field are written escaped (\n, \r,
 * \t, \xNN, \u00NN), so that a field a client chose (a model name, a path, an error message
 * quoting either) can never start a line of its own or drive the terminal. JSON lines need
 * nothing more: cJSON escapes them. Returns out. */
static const char *escaped(const char *in, char *out, size_t cap) {
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)(in ? in : ""); *p && o + 8 < cap; p++) {
        if (*p == '\n') o += (size_t)snprintf(out + o, cap - o, "\\n");
        else if (*p == '\r') o += (size_t)snprintf(out + o, cap - o, "\\r");
        else if (*p == '\t') o += (size_t)snprintf(out + o, cap - o, "\\t");
        else if (*p < 0x20 || *p == 0x7F) o += (size_t)snprintf(out + o, cap - o, "\\x%02x", *p);
        else if (*p == 0xC2 && p[1] >= 0x80 && p[1] <= 0x9F) o += (size_t)snprintf(out + o, cap - o, "\\u00%02x", *++p);
        else out[o++] = (char)*p;
    }
    out[o] = 0;
    return out;
}

static void emit(cJSON *o) {
    char *s = cJSON_PrintUnformatted(o);
    if (s) fprintf(stderr, "%s\n", s);
    free(s);
    cJSON_Delete(o);
}

void log_msg(const char *level, const char *fmt, ...) {
    char msg[2048], ts[40];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    timestamp(ts, sizeof ts);
    if (!log_json) {
        char esc[sizeof msg * 2];
        fprintf(stderr, "%s duoserve: %s: %s\n", ts, level, escaped(msg, esc, sizeof esc));
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "ts", ts);
    cJSON_AddStringToObject(o, "level", level);
    cJSON_AddStringToObject(o, "msg", msg);
    emit(o);
}

void log_sink(const char *level, const char *msg) {
    log_msg(level, "%s", msg);
}

void log_request(const struct log_request *r) {
    char ts[40];
    timestamp(ts, sizeof ts);
    if (!log_json) {
        char ttft[32] = "-", id[300], method[64], path[600], finish[64], error[2048];
        if (r->ttft_s >= 0) snprintf(ttft, sizeof ttft, "%.3fs", r->ttft_s);
        fprintf(stderr, "%s duoserve: request %s %s %s %d prompt=%d completion=%d n=%d ttft=%s e2e=%.3fs%s%s%s%s\n", ts,
                r->id ? escaped(r->id, id, sizeof id) : "-", r->method ? escaped(r->method, method, sizeof method) : "-",
                r->path ? escaped(r->path, path, sizeof path) : "-", r->status, r->prompt_tokens, r->completion_tokens,
                r->n_choices, ttft, r->e2e_s, r->finish ? " finish=" : "", r->finish ? escaped(r->finish, finish, sizeof finish) : "",
                r->error ? " error=" : "", r->error ? escaped(r->error, error, sizeof error) : "");
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "ts", ts);
    cJSON_AddStringToObject(o, "level", "info");
    cJSON_AddStringToObject(o, "msg", "request");
    if (r->id) cJSON_AddStringToObject(o, "id", r->id);
    if (r->remote) cJSON_AddStringToObject(o, "remote", r->remote);
    cJSON_AddStringToObject(o, "method", r->method ? r->method : "");
    cJSON_AddStringToObject(o, "path", r->path ? r->path : "");
    cJSON_AddNumberToObject(o, "status", r->status);
    cJSON_AddNumberToObject(o, "prompt_tokens", r->prompt_tokens);
    cJSON_AddNumberToObject(o, "completion_tokens", r->completion_tokens);
    cJSON_AddNumberToObject(o, "n", r->n_choices);
    if (r->ttft_s >= 0) cJSON_AddNumberToObject(o, "ttft_s", r->ttft_s);
    else cJSON_AddNullToObject(o, "ttft_s");
    cJSON_AddNumberToObject(o, "e2e_s", r->e2e_s);
    if (r->finish) cJSON_AddStringToObject(o, "finish_reason", r->finish);
    if (r->error) cJSON_AddStringToObject(o, "error", r->error);
    emit(o);
}
