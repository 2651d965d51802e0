/* openai_error: the error shape (server/openai_error.h). */
#include "server/openai_error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "server/openai_nul.h"

static const char *type_for_status(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    case 503: return "service_unavailable_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

int openai_fail(struct openai_error *err, int status, const char *code, const char *param, const char *fmt, ...) {
    if (!err) return -1;
    err->status = status;
    err->type = type_for_status(status);
    err->code = code;
    snprintf(err->param, sizeof err->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    return -1;
}

static cJSON *error_object(const struct openai_error *err) {
    cJSON *root = cJSON_CreateObject();
    cJSON *e = cJSON_AddObjectToObject(root, "error");
    if (!e) {
        cJSON_Delete(root);
        return NULL;
    }
    cJSON_AddStringToObject(e, "message", err->message);
    cJSON_AddStringToObject(e, "type", err->type ? err->type : type_for_status(err->status));
    if (err->param[0]) cJSON_AddStringToObject(e, "param", err->param);
    else cJSON_AddNullToObject(e, "param");
    if (err->code) cJSON_AddStringToObject(e, "code", err->code);
    else cJSON_AddNullToObject(e, "code");
    return root;
}

char *openai_error_json(const struct openai_error *err) {
    cJSON *root = error_object(err);
    char *s = root ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    return openai_json_nul(s);
}

char *openai_error_sse(const struct openai_error *err) {
    char *j = openai_error_json(err);
    if (!j) return NULL;
    size_t n = strlen(j) + 16;
    char *s = malloc(n);
    if (s) snprintf(s, n, "data: %s\n\n", j);
    free(j);
    return s;
}
