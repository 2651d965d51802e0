/* openai_nul: U+0000 in request strings. cJSON's strings end at their first NUL, so the parser
 * (openai.c) reads each escape \u0000 as the byte OPENAI_NUL (0xFF, which is never part of
 * UTF-8): every string of a parsed request keeps its whole length. openai_bytes() gives the real
 * bytes to whatever tokenizes or matches them; openai_mark_nul() marks NULs of decoded text the
 * same way; and every JSON the OpenAI modules write shows OPENAI_NUL as \u0000 again
 * (openai_json_nul()). Pure functions: any thread. */
#ifndef DUO_OPENAI_NUL_H
#define DUO_OPENAI_NUL_H

#include <stddef.h>

#define OPENAI_NUL ((char)0xFF)
/* A malloc'd copy of s with OPENAI_NUL as 0, and its length in *len (NULL: out of memory). */
char *openai_bytes(const char *s, size_t *len);
/* NUL -> OPENAI_NUL in s[0..len), which then is a C string of length len. */
void openai_mark_nul(char *s, size_t len);
/* Takes json and returns it with each OPENAI_NUL written as \u0000 (NULL: out of memory). */
char *openai_json_nul(char *json);
/* The request body body[0..len) with each escape \u0000 replaced by OPENAI_NUL (malloc'd; *n its
 * length), or NULL when it has none (or out of memory). */
char *openai_mark_escaped_nuls(const char *body, size_t len, size_t *n);

#endif
