/* log: the daemon's log lines on stderr, as text ("duoserve: level: message") or, after
 * log_set_json(true), one JSON object per line. One line per HTTP request (log_request).
 * Thread-safe: each line is written with one locked stdio call. */
#ifndef DUO_LOG_H
#define DUO_LOG_H

#include <stdbool.h>

void log_set_json(bool json);
bool log_is_json(void);

void log_msg(const char *level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* log_msg(level, "%s", msg): the engine's lines come this way (elog_set_sink). */
void log_sink(const char *level, const char *msg);

struct log_request {
    const char *id;          // request id or NULL
    const char *method, *path;
    int status;
    int prompt_tokens, completion_tokens, n_choices;
    double ttft_s;           // < 0: no token
    double e2e_s;
    const char *finish;      // first choice's finish_reason or NULL
    const char *error;       // error message or NULL
    const char *remote;      // client address or NULL
};
void log_request(const struct log_request *r);

#endif
