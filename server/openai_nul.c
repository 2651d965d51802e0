/* openai_nul: U+0000 in request strings (server/openai_nul.h). */
#include "server/openai_nul.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *openai_bytes(const char *s, size_t *len) {
    size_t n = strlen(s);
    char *b = malloc(n + 1);
    if (!b) return NULL;
    for (size_t i = 0; i <= n; i++) b[i] = s[i] == OPENAI_NUL ? 0 : s[i];
    *len = n;
    return b;
}

void openai_mark_nul(char *s, size_t len) {
    for (char *p = s; (p = memchr(p, 0, len - (size_t)(p - s))) != NULL; p++) *p = OPENAI_NUL;
}

char *openai_json_nul(char *json) {
    if (!json || !strchr(json, OPENAI_NUL)) return json;
    size_t n = 0, len = strlen(json);
    for (const char *p = json; (p = strchr(p, OPENAI_NUL)) != NULL; p++) n++;
    char *out = malloc(len + 5 * n + 1), *w = out;
    if (out)
        for (const char *p = json; *p; p++) {
            if (*p == OPENAI_NUL) w += sprintf(w, "\\u0000");
            else *w++ = *p;
        }
    if (out) *w = 0;
    free(json);
    return out;
}

/* A backslash outside a string is invalid JSON either way, so only the pairing of backslashes
 * matters: "\\u0000" (an escaped backslash, then "u0000") stays as it is. */
char *openai_mark_escaped_nuls(const char *body, size_t len, size_t *n) {
    if (!memmem(body, len, "\\u0000", 6)) return NULL;
    char *out = malloc(len + 1);
    if (!out) return NULL;
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        if (body[i] == '\\' && i + 6 <= len && !memcmp(body + i + 1, "u0000", 5)) {
            out[o++] = OPENAI_NUL;
            i += 6;
        } else if (body[i] == '\\' && i + 1 < len) {
            out[o++] = body[i++];
            out[o++] = body[i++];
        } else {
            out[o++] = body[i++];
        }
    }
    out[o] = 0;
    *n = o;
    return out;
}
