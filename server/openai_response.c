/* openai_response: the JSON of responses, stream chunks, models and tokenize/detokenize
 * (server/openai_response.h). */
#include "server/openai_response.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "engine/text/utf8.h"
#include "server/openai_nul.h"
#include "server/tool_parser.h"

/* ---- helpers ---- */

const char *openai_finish_reason(enum engine_finish f) {
    switch (f) {
    case ENGINE_FINISH_STOP: return "stop";
    case ENGINE_FINISH_LENGTH: return "length";
    case ENGINE_FINISH_ABORT: return "abort";
    default: return NULL;
    }
}

/* A growing output buffer: the JSON written without cJSON, a run of SSE frames. */
struct jbuf {
    char *s;
    size_t len, cap;
    bool oom;
};

static void jb_put(struct jbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n + 1) cap *= 2;
        char *t = realloc(b->s, cap);
        if (!t) {
            b->oom = true;
            return;
        }
        b->s = t;
        b->cap = cap;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = 0;
}

/* JSON cannot hold -inf; vLLM clamps the same way. */
static double clamp_lp(float lp) {
    return isnan(lp) ? -9999.0 : lp < -9999.0f ? -9999.0 : (double)lp;
}

/* A token as logprobs show it. */
struct lp_token {
    char raw[512];   // the bytes it adds to the text (cut at 512)
    size_t n_raw;
    char shown[2100]; // NUL-terminated string for "token" and the top_logprobs keys
};

/* Fills t for id: "token_id:N" when asked for; else the token's text when its bytes are whole
 * UTF-8, else (a token holding part of a character) its bytes escaped as \xNN, after "bytes:"
 * in completions' logprobs, as OpenAI shows them (chat gives the raw bytes in "bytes"). */
static const char *lp_token(const struct openai_resp_ctx *ctx, int32_t id, bool first, struct lp_token *t) {
    t->n_raw = 0;
    if (ctx->tokens_as_ids || !ctx->piece) {
        snprintf(t->shown, sizeof t->shown, "token_id:%d", (int)id);
        return t->shown;
    }
    size_t n = ctx->piece(ctx->piece_ud, id, first, t->raw, sizeof t->raw);
    t->n_raw = n < sizeof t->raw ? n : sizeof t->raw;
    if (utf8_valid(t->raw, t->n_raw) && !memchr(t->raw, 0, t->n_raw)) {
        memcpy(t->shown, t->raw, t->n_raw);
        t->shown[t->n_raw] = 0;
        return t->shown;
    }
    size_t o = (size_t)snprintf(t->shown, sizeof t->shown, "%s", ctx->kind == OPENAI_CHAT ? "" : "bytes:");
    for (size_t i = 0; i < t->n_raw; i++) {
        unsigned char b = (unsigned char)t->raw[i];
        if (b == '\\') o += (size_t)snprintf(t->shown + o, sizeof t->shown - o, "\\\\");
        else if (b >= 0x20 && b < 0x7F) t->shown[o++] = (char)b;
        else o += (size_t)snprintf(t->shown + o, sizeof t->shown - o, "\\x%02x", b);
    }
    t->shown[o] = 0;
    return t->shown;
}

/* Chat's "bytes": the token's own bytes (for "token_id:N", those of that string). */
static cJSON *bytes_array(const struct lp_token *t) {
    const unsigned char *p = (const unsigned char *)(t->n_raw ? t->raw : t->shown);
    size_t n = t->n_raw ? t->n_raw : strlen(t->shown);
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; a && i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(p[i]));
    return a;
}

static void add_common(cJSON *root, const struct openai_resp_ctx *ctx, bool chunk) {
    cJSON_AddStringToObject(root, "id", ctx->id);
    const char *object = ctx->kind == OPENAI_CHAT ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
    cJSON_AddStringToObject(root, "object", object);
    cJSON_AddNumberToObject(root, "created", (double)ctx->created);
    cJSON_AddStringToObject(root, "model", ctx->model);
    if (ctx->system_fingerprint) cJSON_AddStringToObject(root, "system_fingerprint", ctx->system_fingerprint);
}

static void add_usage(cJSON *root, const struct openai_usage *u) {
    cJSON *usage = cJSON_AddObjectToObject(root, "usage");
    cJSON_AddNumberToObject(usage, "prompt_tokens", u->prompt_tokens);
    cJSON_AddNumberToObject(usage, "completion_tokens", u->completion_tokens);
    cJSON_AddNumberToObject(usage, "total_tokens", (double)u->prompt_tokens + u->completion_tokens);
    cJSON *details = cJSON_AddObjectToObject(usage, "prompt_tokens_details");
    cJSON_AddNumberToObject(details, "cached_tokens", u->cached_tokens);
}

static void add_stop_reason(cJSON *choice, enum engine_finish finish, const char *stop_str, int32_t stop_id) {
    if (finish == ENGINE_FINISH_STOP && stop_str) cJSON_AddStringToObject(choice, "stop_reason", stop_str);
    else if (finish == ENGINE_FINISH_STOP && stop_id >= 0) cJSON_AddNumberToObject(choice, "stop_reason", stop_id);
    else cJSON_AddNullToObject(choice, "stop_reason");
}

static void add_finish(cJSON *choice, enum engine_finish finish) {
    const char *fr = openai_finish_reason(finish);
    if (fr) cJSON_AddStringToObject(choice, "finish_reason", fr);
    else cJSON_AddNullToObject(choice, "finish_reason");
}

/* One position of legacy (completions) logprobs, appended to the four parallel arrays. */
static void legacy_lp_add(const struct openai_resp_ctx *ctx, cJSON *tokens, cJSON *token_lps, cJSON *top, cJSON *offsets,
                          int32_t id, bool first, float lp, int n_top, const int32_t *top_ids, const float *top_lps,
                          size_t offset) {
    struct lp_token t;
    cJSON_AddItemToArray(tokens, cJSON_CreateString(lp_token(ctx, id, first, &t)));
    cJSON_AddItemToArray(token_lps, cJSON_CreateNumber(clamp_lp(lp)));
    cJSON *d = cJSON_CreateObject();
    int k_max = n_top < ctx->logprobs ? n_top : ctx->logprobs;
    for (int k = 0; d && k < k_max; k++) {
        const char *s = lp_token(ctx, top_ids[k], first, &t);
        if (!cJSON_GetObjectItemCaseSensitive(d, s)) cJSON_AddNumberToObject(d, s, clamp_lp(top_lps[k]));
    }
    const char *s = lp_token(ctx, id, first, &t); // the sampled token is always listed
    if (d && !cJSON_GetObjectItemCaseSensitive(d, s)) cJSON_AddNumberToObject(d, s, clamp_lp(lp));
    cJSON_AddItemToArray(top, d);
    cJSON_AddItemToArray(offsets, cJSON_CreateNumber((double)offset));
}

static cJSON *chat_lp_entry(const struct openai_resp_ctx *ctx, int32_t id, bool first, float lp) {
    struct lp_token t;
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "token", lp_token(ctx, id, first, &t));
    cJSON_AddNumberToObject(e, "logprob", clamp_lp(lp));
    cJSON_AddItemToObject(e, "bytes", bytes_array(&t));
    return e;
}

static cJSON *chat_lp_add(const struct openai_resp_ctx *ctx, cJSON *content, int32_t id, bool first, float lp, int n_top,
                          const int32_t *top_ids, const float *top_lps) {
    cJSON *e = chat_lp_entry(ctx, id, first, lp);
    cJSON *tops = cJSON_AddArrayToObject(e, "top_logprobs");
    int k_max = n_top < ctx->logprobs ? n_top : ctx->logprobs;
    for (int k = 0; k < k_max; k++) cJSON_AddItemToArray(tops, chat_lp_entry(ctx, top_ids[k], first, top_lps[k]));
    cJSON_AddItemToArray(content, e);
    return e;
}

static char *print_and_free(cJSON *root) {
    char *s = root ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    return openai_json_nul(s);
}

static char *sse_frame(cJSON *root) {
    char *j = print_and_free(root);
    if (!j) return NULL;
    size_t n = strlen(j) + 9;
    char *s = malloc(n);
    if (s) snprintf(s, n, "data: %s\n\n", j);
    free(j);
    return s;
}

/* ---- responses ---- */

/* A chat message's "content" and "tool_calls" from what c's tool parser found; returns the
 * finish_reason to report ("tool_calls" when there are calls and the choice stopped). */
static const char *tool_message(const struct openai_choice *c, cJSON *msg) {
    const struct openai_tool_result *res = c->tres;
    if (res->n && !res->len) cJSON_AddNullToObject(msg, "content");
    else cJSON_AddStringToObject(msg, "content", res->content ? res->content : "");
    if (!res->n) return openai_finish_reason(c->finish);
    cJSON *calls = cJSON_AddArrayToObject(msg, "tool_calls");
    for (int i = 0; calls && i < res->n; i++) {
        cJSON *tc = cJSON_CreateObject(), *fn = cJSON_CreateObject();
        cJSON_AddItemToArray(calls, tc);
        cJSON_AddStringToObject(tc, "id", res->calls[i].id);
        cJSON_AddStringToObject(tc, "type", "function");
        cJSON_AddItemToObject(tc, "function", fn);
        cJSON_AddStringToObject(fn, "name", res->calls[i].name);
        cJSON_AddStringToObject(fn, "arguments", res->calls[i].args);
    }
    return c->finish == ENGINE_FINISH_STOP ? "tool_calls" : openai_finish_reason(c->finish);
}

char *openai_response_json(const struct openai_resp_ctx *ctx, const struct openai_choice *choices, int n_choices,
                           const struct openai_usage *usage) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    add_common(root, ctx, false);
    cJSON *arr = cJSON_AddArrayToObject(root, "choices");
    for (int i = 0; i < n_choices; i++) {
        const struct openai_choice *c = &choices[i];
        cJSON *ch = cJSON_CreateObject();
        cJSON_AddItemToArray(arr, ch);
        cJSON_AddNumberToObject(ch, "index", i);
        const char *text = c->text ? c->text : "";
        const char *finish_reason = NULL; /* tool calls: "tool_calls" */
        if (ctx->kind == OPENAI_CHAT) {
            cJSON *msg = cJSON_AddObjectToObject(ch, "message");
            cJSON_AddStringToObject(msg, "role", "assistant");
            if (c->tres) finish_reason = tool_message(c, msg);
            else cJSON_AddStringToObject(msg, "content", text);
        } else {
            cJSON_AddStringToObject(ch, "text", text);
        }
        if (ctx->logprobs < 0) {
            cJSON_AddNullToObject(ch, "logprobs");
        } else if (ctx->kind == OPENAI_CHAT) {
            cJSON *lp = cJSON_AddObjectToObject(ch, "logprobs");
            cJSON *content = cJSON_AddArrayToObject(lp, "content");
            for (int t = 0; t < c->n_tok; t++)
                chat_lp_add(ctx, content, c->tok_ids[t], t < c->n_start_tok, c->tok_lps[t], c->tok_n_top[t],
                            c->top_ids + (size_t)t * ENGINE_MAX_LOGPROBS, c->top_lps + (size_t)t * ENGINE_MAX_LOGPROBS);
        } else {
            cJSON *lp = cJSON_AddObjectToObject(ch, "logprobs");
            cJSON *tokens = cJSON_AddArrayToObject(lp, "tokens");
            cJSON *token_lps = cJSON_AddArrayToObject(lp, "token_logprobs");
            cJSON *top = cJSON_AddArrayToObject(lp, "top_logprobs");
            cJSON *offsets = cJSON_AddArrayToObject(lp, "text_offset");
            for (int t = 0; t < c->n_tok; t++) // a token cut off by a stop string starts at the end
                legacy_lp_add(ctx, tokens, token_lps, top, offsets, c->tok_ids[t], t < c->n_start_tok, c->tok_lps[t],
                              c->tok_n_top[t], c->top_ids + (size_t)t * ENGINE_MAX_LOGPROBS, c->top_lps + (size_t)t * ENGINE_MAX_LOGPROBS,
                              c->tok_offsets[t] < c->chars ? c->tok_offsets[t] : c->chars);
        }
        if (finish_reason) cJSON_AddStringToObject(ch, "finish_reason", finish_reason);
        else add_finish(ch, c->finish);
        add_stop_reason(ch, c->finish, c->stop_reason_str, c->stop_reason_id);
    }
    if (usage) add_usage(root, usage);
    return print_and_free(root);
}

/* A stream chunk (id, object, created, model) holding one choice {"index": index}, in *ch. */
static cJSON *chunk_with_choice(const struct openai_resp_ctx *ctx, int index, cJSON **ch) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    add_common(root, ctx, true);
    cJSON *arr = cJSON_AddArrayToObject(root, "choices");
    *ch = cJSON_CreateObject();
    cJSON_AddItemToArray(arr, *ch);
    cJSON_AddNumberToObject(*ch, "index", index);
    return root;
}

char *openai_chunk_sse(const struct openai_resp_ctx *ctx, int index, const char *text, const struct engine_event *ev,
                       size_t text_offset, enum engine_finish finish, const char *stop_str, int32_t stop_id) {
    cJSON *ch;
    cJSON *root = chunk_with_choice(ctx, index, &ch);
    if (!root) return NULL;
    bool with_lp = ctx->logprobs >= 0 && ev && ev->type == ENGINE_EVENT_TOKEN;
    if (ctx->kind == OPENAI_CHAT) {
        cJSON *delta = cJSON_AddObjectToObject(ch, "delta");
        if (text && (text[0] || finish == ENGINE_FINISH_NONE)) cJSON_AddStringToObject(delta, "content", text);
        if (!with_lp) {
            cJSON_AddNullToObject(ch, "logprobs");
        } else {
            cJSON *lp = cJSON_AddObjectToObject(ch, "logprobs");
            cJSON *content = cJSON_AddArrayToObject(lp, "content");
            chat_lp_add(ctx, content, ev->token, ev->text_start, ev->logprob, ev->n_top, ev->top_ids, ev->top_lps);
        }
    } else {
        cJSON_AddStringToObject(ch, "text", text ? text : "");
        if (!with_lp) {
            cJSON_AddNullToObject(ch, "logprobs");
        } else {
            cJSON *lp = cJSON_AddObjectToObject(ch, "logprobs");
            legacy_lp_add(ctx, cJSON_AddArrayToObject(lp, "tokens"), cJSON_AddArrayToObject(lp, "token_logprobs"),
                          cJSON_AddArrayToObject(lp, "top_logprobs"), cJSON_AddArrayToObject(lp, "text_offset"),
                          ev->token, ev->text_start, ev->logprob, ev->n_top, ev->top_ids, ev->top_lps,
                          text_offset + (ev->token_text_at > 0 ? (size_t)ev->token_text_at : 0));
        }
    }
    add_finish(ch, finish);
    if (finish != ENGINE_FINISH_NONE) add_stop_reason(ch, finish, stop_str, stop_id);
    return sse_frame(root);
}

char *openai_chunk_role_sse(const struct openai_resp_ctx *ctx, int index) {
    cJSON *ch;
    cJSON *root = chunk_with_choice(ctx, index, &ch);
    if (!root) return NULL;
    cJSON *delta = cJSON_AddObjectToObject(ch, "delta");
    cJSON_AddStringToObject(delta, "role", "assistant");
    cJSON_AddStringToObject(delta, "content", "");
    cJSON_AddNullToObject(ch, "logprobs");
    cJSON_AddNullToObject(ch, "finish_reason");
    return sse_frame(root);
}

char *openai_chunk_usage_sse(const struct openai_resp_ctx *ctx, const struct openai_usage *usage) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    add_common(root, ctx, true);
    cJSON_AddArrayToObject(root, "choices");
    add_usage(root, usage);
    return sse_frame(root);
}

/* ---- tool calls, streamed ---- */

struct sse_out {
    const struct openai_resp_ctx *ctx;
    int index;
    struct jbuf b;
};

/* Takes frame (NULL: out of memory). */
static int put_frame(struct sse_out *o, char *frame) {
    if (!frame) return -1;
    jb_put(&o->b, frame, strlen(frame));
    free(frame);
    return o->b.oom ? -1 : 0;
}

static int sse_delta(void *ud, const struct tool_delta *d) {
    struct sse_out *o = ud;
    if (d->kind == TOOL_DELTA_CONTENT) {
        char *t = strndup(d->text, d->len);
        int rc = t ? put_frame(o, openai_chunk_sse(o->ctx, o->index, t, NULL, 0, ENGINE_FINISH_NONE, NULL, -1)) : -1;
        free(t);
        return rc;
    }
    cJSON *ch, *root = chunk_with_choice(o->ctx, o->index, &ch);
    if (!root) return -1;
    cJSON *delta = cJSON_AddObjectToObject(ch, "delta");
    cJSON *calls = cJSON_AddArrayToObject(delta, "tool_calls"), *tc = cJSON_CreateObject(), *fn = cJSON_CreateObject();
    char *text = strndup(d->text, d->len);
    cJSON_AddItemToArray(calls, tc);
    cJSON_AddNumberToObject(tc, "index", d->index);
    if (d->kind == TOOL_DELTA_CALL) {
        cJSON_AddStringToObject(tc, "id", d->id);
        cJSON_AddStringToObject(tc, "type", "function");
    }
    cJSON_AddItemToObject(tc, "function", fn);
    if (d->kind == TOOL_DELTA_CALL) cJSON_AddStringToObject(fn, "name", text ? text : "");
    cJSON_AddStringToObject(fn, "arguments", d->kind == TOOL_DELTA_CALL ? "" : text ? text : "");
    cJSON_AddNullToObject(ch, "logprobs");
    cJSON_AddNullToObject(ch, "finish_reason");
    int rc = text ? put_frame(o, sse_frame(root)) : (cJSON_Delete(root), -1);
    free(text);
    return rc;
}

char *openai_chunk_tools_sse(const struct openai_resp_ctx *ctx, int index, struct openai_choice *c,
                            const struct engine_event *ev) {
    struct sse_out o = {.ctx = ctx, .index = index};
    const char *t = ev->text ? ev->text : "";
    bool final = ev->type == ENGINE_EVENT_FINISH;
    jb_put(&o.b, "", 0);
    int rc = (o.b.oom ? -1 : 0) | tool_parser_feed(c->tools, t, strlen(t), final, sse_delta, &o);
    if (!rc && final) {
        if (tool_parser_calls(c->tools) && ev->finish == ENGINE_FINISH_STOP) {
            cJSON *ch, *root = chunk_with_choice(ctx, index, &ch);
            if (root) {
                cJSON_AddObjectToObject(ch, "delta");
                cJSON_AddNullToObject(ch, "logprobs");
                cJSON_AddStringToObject(ch, "finish_reason", "tool_calls");
                cJSON_AddNullToObject(ch, "stop_reason");
            }
            rc = root ? put_frame(&o, sse_frame(root)) : -1;
        } else {
            rc = put_frame(&o, openai_chunk_sse(ctx, index, "", NULL, 0, ev->finish, ev->stop_reason_str,
                                                ev->stop_reason_id));
        }
    }
    if (rc) {
        free(o.b.s);
        return NULL;
    }
    return o.b.s;
}

/* ---- models, tokenize, detokenize ---- */

char *openai_models_json(const char *model_name, const char *root_dir, long long created, int max_model_len) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    cJSON_AddStringToObject(root, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(root, "data");
    cJSON *m = cJSON_CreateObject();
    cJSON_AddItemToArray(data, m);
    cJSON_AddStringToObject(m, "id", model_name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)created);
    cJSON_AddStringToObject(m, "owned_by", "duoserve");
    cJSON_AddStringToObject(m, "root", root_dir ? root_dir : model_name);
    cJSON_AddNullToObject(m, "parent");
    cJSON_AddNumberToObject(m, "max_model_len", max_model_len);
    return print_and_free(root);
}

/* s as a JSON string (OPENAI_NUL as \u0000). */
static void jb_string(struct jbuf *b, const char *s) {
    jb_put(b, "\"", 1);
    for (const char *p = s, *run = s;; p++) {
        unsigned char c = (unsigned char)*p;
        if (c && c != '"' && c != '\\' && c >= 0x20 && *p != OPENAI_NUL) continue;
        jb_put(b, run, (size_t)(p - run));
        if (!c) break;
        char esc[8];
        if (c == '"' || c == '\\') snprintf(esc, sizeof esc, "\\%c", c);
        else snprintf(esc, sizeof esc, "\\u%04x", *p == OPENAI_NUL ? 0 : c);
        jb_put(b, esc, strlen(esc));
        run = p + 1;
    }
    jb_put(b, "\"", 1);
}

/* Written without cJSON: a /tokenize of a whole request body can hold millions of ids, which
 * as cJSON nodes would take gigabytes. */
char *openai_tokenize_json(const int32_t *ids, int n, int max_model_len, char *const *token_strs) {
    struct jbuf b = {0};
    char num[48];
    jb_put(&b, num, (size_t)snprintf(num, sizeof num, "{\"count\":%d,\"max_model_len\":%d,\"tokens\":[", n, max_model_len));
    for (int i = 0; i < n; i++) jb_put(&b, num, (size_t)snprintf(num, sizeof num, i ? ",%d" : "%d", (int)ids[i]));
    jb_put(&b, "],\"token_strs\":", 15);
    if (token_strs) {
        jb_put(&b, "[", 1);
        for (int i = 0; i < n; i++) {
            if (i) jb_put(&b, ",", 1);
            jb_string(&b, token_strs[i] ? token_strs[i] : "");
        }
        jb_put(&b, "]}", 2);
    } else {
        jb_put(&b, "null}", 5);
    }
    if (b.oom) {
        free(b.s);
        return NULL;
    }
    return b.s;
}

char *openai_detokenize_json(const char *text) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    cJSON_AddStringToObject(root, "prompt", text ? text : "");
    return print_and_free(root);
}
