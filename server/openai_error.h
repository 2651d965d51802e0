/* openai_error: the one shape of an error for the client, OpenAI's
 * {"error": {"message", "type", "param", "code"}} with its HTTP status. Client mistakes become
 * these bodies here and nowhere else: every other server module reports them by filling a
 * struct openai_error (openai_fail) and sends openai_error_json() or openai_error_sse().
 * Pure functions: any thread. */
#ifndef DUO_OPENAI_ERROR_H
#define DUO_OPENAI_ERROR_H

struct openai_error {
    int status;        // HTTP status (400, 401, 404, 405, 413, 429, 503, 500)
    const char *type;  // "invalid_request_error", "authentication_error", ... (static string)
    const char *code;  // static string or NULL (JSON null)
    char param[64];    // offending field, "" for JSON null
    char message[512];
};

/* Fills err and returns -1, so callers can `return openai_fail(...)`. param and code may be
 * NULL. The type follows from the status. */
int openai_fail(struct openai_error *err, int status, const char *code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* The JSON body of err (malloc'd, NUL-terminated; NULL only when out of memory). */
char *openai_error_json(const struct openai_error *err);
/* An error inside an open stream: "data: {"error":{...}}\n\n" (malloc'd; NULL: out of memory). */
char *openai_error_sse(const struct openai_error *err);

#endif
