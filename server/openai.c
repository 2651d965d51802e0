/* openai: request parsing and validation (server/openai.h). */
#include "server/openai.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "engine/engine.h" // the ENGINE_ERR_* statuses
#include "engine/text/utf8.h"
#include "server/openai_fields.h"
#include "server/openai_nul.h"
#include "server/openai_tools.h"

/* ---- field helpers: each returns 0 (absent or valid) or -1 with err set ---- */

#define BAD(param, ...) openai_fail(err, 400, NULL, param, __VA_ARGS__)
#define NOMEM() openai_fail(err, 500, NULL, NULL, "out of memory")

/* The field, or NULL when absent or JSON null (OpenAI treats null as "not given"). */
static const cJSON *field(const cJSON *obj, const char *name) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(obj, name);
    return f && !cJSON_IsNull(f) ? f : NULL;
}

static int get_bool(const cJSON *obj, const char *name, bool *out, struct openai_error *err) {
    const cJSON *f = field(obj, name);
    if (!f) return 0;
    if (!cJSON_IsBool(f)) return BAD(name, "'%s' must be a boolean", name);
    *out = cJSON_IsTrue(f);
    return 0;
}

/* A finite number in [lo, hi]. */
static int get_float(const cJSON *obj, const char *name, double lo, double hi, float *out, struct openai_error *err) {
    const cJSON *f = field(obj, name);
    if (!f) return 0;
    if (!cJSON_IsNumber(f)) return BAD(name, "'%s' must be a number", name);
    double v = f->valuedouble;
    if (!isfinite(v) || v < lo || v > hi) return BAD(name, "'%s' must be in [%g, %g], got %g", name, lo, hi, v);
    *out = (float)v;
    return 0;
}

/* An integral number in [lo, hi]. Checked on the double, never cast while out of range. */
static int as_int(const cJSON *f, const char *name, double lo, double hi, long long *out, struct openai_error *err) {
    if (!cJSON_IsNumber(f)) return BAD(name, "'%s' must be an integer", name);
    double v = f->valuedouble;
    if (!isfinite(v) || v != floor(v)) return BAD(name, "'%s' must be an integer", name);
    if (v < lo || v > hi) return BAD(name, "'%s' must be in [%.0f, %.0f], got %g", name, lo, hi, v);
    *out = (long long)v;
    return 0;
}

static int get_int(const cJSON *obj, const char *name, double lo, double hi, int *out, struct openai_error *err) {
    const cJSON *f = field(obj, name);
    if (!f) return 0;
    long long v;
    if (as_int(f, name, lo, hi, &v, err)) return -1;
    *out = (int)v;
    return 0;
}

/* Token id in [0, vocab). */
static int as_token(const cJSON *f, const char *name, int vocab, int32_t *out, struct openai_error *err) {
    if (!cJSON_IsNumber(f)) return BAD(name, "'%s' must hold integer token ids", name);
    double v = f->valuedouble;
    if (!isfinite(v) || v != floor(v)) return BAD(name, "'%s' must hold integer token ids", name);
    if (v < 0 || v >= vocab) return BAD(name, "token id %g in '%s' is outside the vocabulary [0, %d)", v, name, vocab);
    *out = (int32_t)v;
    return 0;
}

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* ---- prompts ---- */

static int parse_ids_array(const cJSON *arr, const char *name, int vocab, struct openai_prompt *p,
                           struct openai_error *err) {
    int n = cJSON_GetArraySize(arr);
    p->ids = malloc(sizeof *p->ids * (size_t)(n > 0 ? n : 1));
    if (!p->ids) return NOMEM();
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        if (as_token(it, name, vocab, &p->ids[p->n_ids], err)) return -1;
        p->n_ids++;
    }
    return 0;
}

static int parse_prompt(const cJSON *root, const struct openai_limits *lim, struct openai_request *r,
                        struct openai_error *err) {
    const cJSON *p = field(root, "prompt");
    if (!p) return BAD("prompt", "'prompt' is required");
    if (cJSON_IsString(p)) {
        r->prompts = calloc(1, sizeof *r->prompts);
        if (!r->prompts) return NOMEM();
        r->n_prompts = 1;
        if (!(r->prompts[0].text = dup_str(p->valuestring))) return NOMEM();
        return 0;
    }
    if (!cJSON_IsArray(p)) return BAD("prompt", "'prompt' must be a string, an array of strings, an array of token ids or an array of arrays of token ids");
    int n = cJSON_GetArraySize(p);
    if (n == 0) return BAD("prompt", "'prompt' must not be empty");
    const cJSON *first = p->child;
    if (cJSON_IsNumber(first)) { // one prompt of ids
        r->prompts = calloc(1, sizeof *r->prompts);
        if (!r->prompts) return NOMEM();
        r->n_prompts = 1;
        return parse_ids_array(p, "prompt", lim->vocab_size, &r->prompts[0], err);
    }
    if (n > OPENAI_MAX_PROMPTS) return BAD("prompt", "at most %d prompts per request, got %d", OPENAI_MAX_PROMPTS, n);
    r->prompts = calloc((size_t)n, sizeof *r->prompts);
    if (!r->prompts) return NOMEM();
    const cJSON *it;
    cJSON_ArrayForEach(it, p) {
        struct openai_prompt *q = &r->prompts[r->n_prompts++];
        if (cJSON_IsString(first) && cJSON_IsString(it)) {
            if (!(q->text = dup_str(it->valuestring))) return NOMEM();
        } else if (cJSON_IsArray(first) && cJSON_IsArray(it)) {
            if (cJSON_GetArraySize(it) == 0) return BAD("prompt", "'prompt' must not hold an empty array");
            if (parse_ids_array(it, "prompt", lim->vocab_size, q, err)) return -1;
        } else {
            return BAD("prompt", "'prompt' must be a string, an array of strings, an array of token ids or an array of arrays of token ids");
        }
    }
    return 0;
}

/* ---- chat messages ---- */

/* Content as a string: a string, null, or an array of {"type":"text","text":...} parts
 * (joined with "\n", as vLLM does). Returns a malloc'd string or NULL with err set. */
static char *content_string(const cJSON *c, struct openai_error *err) {
    if (!c) return dup_str("");
    if (cJSON_IsString(c)) return dup_str(c->valuestring);
    if (!cJSON_IsArray(c)) {
        BAD("messages", "message 'content' must be a string or an array of content parts");
        return NULL;
    }
    size_t total = 1;
    const cJSON *part;
    cJSON_ArrayForEach(part, c) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsObject(part) || !cJSON_IsString(type) || strcmp(type->valuestring, "text") != 0) {
            BAD("messages", "only content parts of type 'text' are supported");
            return NULL;
        }
        if (!cJSON_IsString(text)) {
            BAD("messages", "a 'text' content part needs a string 'text'");
            return NULL;
        }
        total += strlen(text->valuestring) + 1;
    }
    char *s = malloc(total), *w = s;
    if (!s) {
        NOMEM();
        return NULL;
    }
    cJSON_ArrayForEach(part, c) {
        const char *t = cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring;
        if (w != s) *w++ = '\n';
        size_t n = strlen(t);
        memcpy(w, t, n);
        w += n;
    }
    *w = 0;
    return s;
}

/* Copies messages with content normalised to strings; keeps name, tool_calls, tool_call_id. */
static int parse_messages(const cJSON *root, struct openai_request *r, struct openai_error *err) {
    const cJSON *m = field(root, "messages");
    if (!m) return BAD("messages", "'messages' is required");
    if (!cJSON_IsArray(m) || cJSON_GetArraySize(m) == 0) return BAD("messages", "'messages' must be a non-empty array");
    if (!(r->messages = cJSON_CreateArray())) return NOMEM();
    const cJSON *msg;
    cJSON_ArrayForEach(msg, m) {
        if (!cJSON_IsObject(msg)) return BAD("messages", "each message must be an object");
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(msg, "role");
        if (!cJSON_IsString(role) || !role->valuestring[0]) return BAD("messages", "each message needs a string 'role'");
        const cJSON *content = field(msg, "content");
        char *text = content_string(content, err);
        if (!text) return -1;
        cJSON *out = cJSON_CreateObject();
        if (!out) {
            free(text);
            return NOMEM();
        }
        cJSON_AddItemToArray(r->messages, out);
        cJSON_AddStringToObject(out, "role", role->valuestring);
        cJSON_AddStringToObject(out, "content", text);
        free(text);
        const cJSON *name = field(msg, "name");
        if (name) {
            if (!cJSON_IsString(name)) return BAD("messages", "message 'name' must be a string");
            cJSON_AddStringToObject(out, "name", name->valuestring);
        }
        static const char *const keep[] = {"tool_calls", "tool_call_id"};
        for (size_t k = 0; k < sizeof keep / sizeof keep[0]; k++) {
            const cJSON *f = field(msg, keep[k]);
            if (f) cJSON_AddItemToObject(out, keep[k], cJSON_Duplicate(f, 1));
        }
    }
    return 0;
}

/* ---- sampling ---- */

static int parse_stop(const cJSON *root, struct openai_request *r, struct openai_error *err) {
    const cJSON *s = field(root, "stop");
    if (!s) return 0;
    int n = cJSON_IsString(s) ? 1 : cJSON_IsArray(s) ? cJSON_GetArraySize(s) : -1;
    if (n < 0) return BAD("stop", "'stop' must be a string or an array of strings");
    if (n > OPENAI_MAX_STOP) return BAD("stop", "at most %d stop strings, got %d", OPENAI_MAX_STOP, n);
    if (n == 0) return 0;
    r->stop = calloc((size_t)n, sizeof *r->stop);
    r->stop_bytes = calloc((size_t)n, sizeof *r->stop_bytes);
    r->stop_len = calloc((size_t)n, sizeof *r->stop_len);
    if (!r->stop || !r->stop_bytes || !r->stop_len) return NOMEM();
    const cJSON *it = cJSON_IsString(s) ? s : s->child;
    for (int i = 0; i < n; i++, it = it->next) {
        if (!cJSON_IsString(it)) return BAD("stop", "'stop' must be a string or an array of strings");
        size_t len = strlen(it->valuestring);
        if (len == 0) return BAD("stop", "stop strings must not be empty");
        if (len > OPENAI_MAX_STOP_BYTES) return BAD("stop", "a stop string is at most %d bytes", OPENAI_MAX_STOP_BYTES);
        if (!(r->stop[i] = dup_str(it->valuestring))) return NOMEM();
        if (!(r->stop_bytes[i] = openai_bytes(it->valuestring, &r->stop_len[i]))) {
            free(r->stop[i]);
            r->stop[i] = NULL;
            return NOMEM();
        }
        r->sp.n_stop++;
    }
    return 0;
}

static int parse_stop_ids(const cJSON *root, const struct openai_limits *lim, struct openai_request *r,
                          struct openai_error *err) {
    const cJSON *s = field(root, "stop_token_ids");
    if (!s) return 0;
    if (!cJSON_IsArray(s)) return BAD("stop_token_ids", "'stop_token_ids' must be an array of token ids");
    int n = cJSON_GetArraySize(s);
    if (n > OPENAI_MAX_STOP_IDS) return BAD("stop_token_ids", "at most %d stop_token_ids", OPENAI_MAX_STOP_IDS);
    if (n == 0) return 0;
    if (!(r->stop_ids = malloc(sizeof *r->stop_ids * (size_t)n))) return NOMEM();
    const cJSON *it;
    cJSON_ArrayForEach(it, s) {
        if (as_token(it, "stop_token_ids", lim->vocab_size, &r->stop_ids[r->sp.n_stop_ids], err)) return -1;
        r->sp.n_stop_ids++;
    }
    return 0;
}

/* logit_bias: {"token id as a string": bias in [-100, 100]}. */
static int parse_logit_bias(const cJSON *root, const struct openai_limits *lim, struct openai_request *r,
                            struct openai_error *err) {
    const cJSON *b = field(root, "logit_bias");
    if (!b) return 0;
    if (!cJSON_IsObject(b)) return BAD("logit_bias", "'logit_bias' must be an object mapping token ids to biases");
    int n = cJSON_GetArraySize(b);
    if (n > OPENAI_MAX_LOGIT_BIAS) return BAD("logit_bias", "at most %d logit_bias entries", OPENAI_MAX_LOGIT_BIAS);
    if (n == 0) return 0;
    r->logit_bias_ids = malloc(sizeof *r->logit_bias_ids * (size_t)n);
    r->logit_bias_vals = malloc(sizeof *r->logit_bias_vals * (size_t)n);
    if (!r->logit_bias_ids || !r->logit_bias_vals) return NOMEM();
    const cJSON *it;
    cJSON_ArrayForEach(it, b) {
        const char *k = it->string;
        char *end;
        long id = -1;
        if (k && *k >= '0' && *k <= '9' && strlen(k) <= 10) id = strtol(k, &end, 10);
        else end = (char *)"x";
        if (*end || id < 0 || id >= lim->vocab_size)
            return BAD("logit_bias", "logit_bias key \"%.32s\" is not a token id in [0, %d)", k ? k : "", lim->vocab_size);
        if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble) || it->valuedouble < -100 || it->valuedouble > 100)
            return BAD("logit_bias", "logit_bias values must be numbers in [-100, 100]");
        r->logit_bias_ids[r->sp.n_logit_bias] = (int32_t)id;
        r->logit_bias_vals[r->sp.n_logit_bias] = (float)it->valuedouble;
        r->sp.n_logit_bias++;
    }
    return 0;
}

static int parse_sampling(const cJSON *root, const struct openai_limits *lim, struct openai_request *r,
                          struct openai_error *err) {
    struct engine_sampling *sp = &r->sp;
    int max_n = lim->max_n > 0 ? lim->max_n : 1;
    if (get_int(root, "n", 1, max_n, &sp->n, err)) return -1;
    const cJSON *best_of = field(root, "best_of");
    if (best_of) {
        long long v;
        if (as_int(best_of, "best_of", 1, max_n, &v, err)) return -1;
        if (v != sp->n) return BAD("best_of", "'best_of' other than n is not supported");
    }
    // max_completion_tokens (chat) takes precedence over the deprecated max_tokens.
    const char *mt = r->kind == OPENAI_CHAT && field(root, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    if (field(root, mt)) {
        if (get_int(root, mt, 1, 1e9, &sp->max_tokens, err)) return -1;
        r->max_tokens_given = true;
    }
    if (get_float(root, "temperature", 0, 2, &sp->temperature, err)) return -1;
    const cJSON *tp = field(root, "top_p");
    if (tp && (!cJSON_IsNumber(tp) || !isfinite(tp->valuedouble) || tp->valuedouble <= 0 || tp->valuedouble > 1))
        return BAD("top_p", "'top_p' must be a number in (0, 1]");
    if (tp) sp->top_p = (float)tp->valuedouble;
    if (get_int(root, "top_k", -1, 1e9, &sp->top_k, err)) return -1;
    if (get_float(root, "min_p", 0, 1, &sp->min_p, err)) return -1;
    if (get_float(root, "presence_penalty", -2, 2, &sp->presence_penalty, err)) return -1;
    if (get_float(root, "frequency_penalty", -2, 2, &sp->frequency_penalty, err)) return -1;
    const cJSON *rp = field(root, "repetition_penalty");
    if (rp && (!cJSON_IsNumber(rp) || !isfinite(rp->valuedouble) || rp->valuedouble <= 0 || rp->valuedouble > 100))
        return BAD("repetition_penalty", "'repetition_penalty' must be a number in (0, 100]");
    if (rp) sp->repetition_penalty = (float)rp->valuedouble;
    const cJSON *seed = field(root, "seed");
    if (seed) {
        // Any integer in [-2^63, 2^64): negative seeds wrap as two's complement.
        double v = cJSON_IsNumber(seed) ? seed->valuedouble : NAN;
        if (!isfinite(v) || v != floor(v) || v < -9223372036854775808.0 || v >= 18446744073709551616.0)
            return BAD("seed", "'seed' must be an integer");
        sp->has_seed = true;
        sp->seed = v < 0 ? (uint64_t)(int64_t)v : (uint64_t)v;
    }
    if (get_int(root, "min_tokens", 0, 1e9, &sp->min_tokens, err)) return -1;
    if (r->max_tokens_given && sp->min_tokens > sp->max_tokens)
        return BAD("min_tokens", "'min_tokens' (%d) must not exceed max_tokens (%d)", sp->min_tokens, sp->max_tokens);
    if (get_bool(root, "ignore_eos", &sp->ignore_eos, err)) return -1;
    if (get_bool(root, "include_stop_str_in_output", &sp->include_stop_str_in_output, err)) return -1;
    if (get_bool(root, "skip_special_tokens", &sp->skip_special_tokens, err)) return -1;
    if (parse_stop(root, r, err) || parse_stop_ids(root, lim, r, err) || parse_logit_bias(root, lim, r, err)) return -1;
    sp->stop = r->stop_bytes;
    sp->stop_len = r->stop_len;
    sp->stop_ids = r->stop_ids;
    sp->logit_bias_ids = r->logit_bias_ids;
    sp->logit_bias_vals = r->logit_bias_vals;

    // logprobs: completions take an integer 0..20; chat a boolean plus top_logprobs 0..20.
    if (r->kind == OPENAI_COMPLETION) {
        if (get_int(root, "logprobs", 0, ENGINE_MAX_LOGPROBS, &r->logprobs, err)) return -1;
    } else {
        bool lp = false;
        int top = 0;
        if (get_bool(root, "logprobs", &lp, err)) return -1;
        if (get_int(root, "top_logprobs", 0, ENGINE_MAX_LOGPROBS, &top, err)) return -1;
        if (field(root, "top_logprobs") && !lp && top > 0)
            return BAD("top_logprobs", "'top_logprobs' needs 'logprobs' set to true");
        r->logprobs = lp ? top : -1;
    }
    sp->logprobs = r->logprobs;
    return 0;
}

static int parse_template_kwargs(const cJSON *root, struct openai_request *r, struct openai_error *err) {
    const cJSON *kw = field(root, "chat_template_kwargs");
    if (!kw) return 0;
    if (!cJSON_IsObject(kw)) return BAD("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    if (!(r->template_kwargs = cJSON_Duplicate(kw, 1))) return NOMEM();
    return 0;
}

static int parse_model(const cJSON *root, const struct openai_limits *lim, struct openai_request *r,
                       struct openai_error *err) {
    const cJSON *m = field(root, "model");
    if (!m) return 0;
    if (!cJSON_IsString(m)) return BAD("model", "'model' must be a string");
    if (lim->model_name && strcmp(m->valuestring, lim->model_name) != 0)
        return openai_fail(err, 404, "model_not_found", "model", "The model `%.200s` does not exist.", m->valuestring);
    if (!(r->model = dup_str(m->valuestring))) return NOMEM();
    return 0;
}

static int parse_body(const cJSON *root, enum openai_kind kind, const struct openai_limits *lim,
                      struct openai_request *r, struct openai_error *err) {
    if (!cJSON_IsObject(root)) return BAD(NULL, "the request body must be a JSON object");
    if (openai_fields_check(root, kind, err) || parse_model(root, lim, r, err)) return -1;

    if (kind == OPENAI_DETOKENIZE) {
        const cJSON *t = field(root, "tokens");
        if (!t || !cJSON_IsArray(t)) return BAD("tokens", "'tokens' must be an array of token ids");
        if (!(r->prompts = calloc(1, sizeof *r->prompts))) return NOMEM();
        r->n_prompts = 1;
        return parse_ids_array(t, "tokens", lim->vocab_size, &r->prompts[0], err);
    }
    if (kind == OPENAI_TOKENIZE) {
        if (get_bool(root, "return_token_strs", &r->return_token_strs, err)) return -1;
        if (field(root, "messages")) {
            r->add_special_tokens = false;
            if (get_bool(root, "add_generation_prompt", &r->add_generation_prompt, err)) return -1;
            if (get_bool(root, "add_special_tokens", &r->add_special_tokens, err)) return -1;
            if (parse_template_kwargs(root, r, err)) return -1;
            if (openai_structured_parse(root, r, err)) return -1;
            return parse_messages(root, r, err);
        }
        if (get_bool(root, "add_special_tokens", &r->add_special_tokens, err)) return -1;
        const cJSON *p = field(root, "prompt");
        if (!p || !cJSON_IsString(p)) return BAD("prompt", "'prompt' (a string) or 'messages' is required");
        if (!(r->prompts = calloc(1, sizeof *r->prompts))) return NOMEM();
        r->n_prompts = 1;
        if (!(r->prompts[0].text = dup_str(p->valuestring))) return NOMEM();
        return 0;
    }

    if (kind == OPENAI_COMPLETION) {
        if (parse_prompt(root, lim, r, err)) return -1;
        if (get_bool(root, "echo", &r->echo, err)) return -1;
    } else {
        if (parse_messages(root, r, err)) return -1;
        r->add_special_tokens = false;
        if (get_bool(root, "add_generation_prompt", &r->add_generation_prompt, err)) return -1;
        if (parse_template_kwargs(root, r, err)) return -1;
    }
    if (get_bool(root, "add_special_tokens", &r->add_special_tokens, err)) return -1;
    if (get_bool(root, "stream", &r->stream, err)) return -1;
    const cJSON *so = field(root, "stream_options");
    if (so) {
        if (!cJSON_IsObject(so)) return BAD("stream_options", "'stream_options' must be an object");
        if (!r->stream) return BAD("stream_options", "'stream_options' is only allowed when 'stream' is true");
        if (get_bool(so, "include_usage", &r->include_usage, err)) return -1;
    }
    if (get_bool(root, "return_tokens_as_token_ids", &r->return_tokens_as_token_ids, err)) return -1;
    const cJSON *user = field(root, "user");
    if (user) {
        if (!cJSON_IsString(user)) return BAD("user", "'user' must be a string");
        if (!(r->user = dup_str(user->valuestring))) return NOMEM();
    }
    const cJSON *rid = field(root, "request_id");
    if (rid) {
        if (!cJSON_IsString(rid) || !openai_request_id_valid(rid->valuestring))
            return BAD("request_id", "'request_id' must be 1 to %d printable ASCII characters without spaces",
                       OPENAI_MAX_REQUEST_ID);
        if (!(r->request_id = dup_str(rid->valuestring))) return NOMEM();
    }
    if (parse_sampling(root, lim, r, err)) return -1;
    if (openai_structured_parse(root, r, err)) return -1;
    if (r->echo && r->logprobs >= 0)
        return BAD("echo", "'echo' together with 'logprobs' needs prompt logprobs, which this server does not compute");
    return 0;
}

int openai_parse_request(const char *body, size_t len, enum openai_kind kind, const struct openai_limits *lim,
                         struct openai_request *out, struct openai_error *err) {
    memset(out, 0, sizeof *out);
    out->kind = kind;
    out->logprobs = -1;
    out->add_special_tokens = true;
    out->add_generation_prompt = true;
    out->sp = (struct engine_sampling){
        .n = 1, .max_tokens = 16, .temperature = 1.0f, .top_p = 1.0f, .top_k = 0, .repetition_penalty = 1.0f,
        .skip_special_tokens = true, .logprobs = -1,
    };
    if (!utf8_valid(body, len)) return BAD(NULL, "the request body is not valid UTF-8");
    size_t marked_len = 0;
    char *marked = openai_mark_escaped_nuls(body, len, &marked_len);
    if (marked) body = marked, len = marked_len; // byte offsets below count each \u0000 as one byte
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, false);
    if (!root) {
        size_t at = end && end >= body ? (size_t)(end - body) : 0;
        free(marked);
        return BAD(NULL, "the request body is not valid JSON (or is nested too deeply) near byte %zu", at);
    }
    // Only whitespace may follow the value.
    for (const char *p = end; p && p < body + len; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            cJSON_Delete(root);
            free(marked);
            return BAD(NULL, "the request body is not valid JSON: extra data after the value");
        }
    }
    free(marked);
    int rc = parse_body(root, kind, lim, out, err);
    cJSON_Delete(root);
    if (rc) openai_request_free(out);
    return rc;
}

/* The work one request may ask for (its generated tokens, and the logprob entries of its
 * answer) within the server's limits: a small request must not be able to take the server
 * for minutes or make it build a body of hundreds of MB (as vLLM bounds n). */
static int check_work(const struct openai_request *r, const struct openai_limits *lim, struct openai_error *err) {
    long long tokens = (long long)r->n_prompts * r->sp.n * r->sp.max_tokens;
    const char *mt = r->kind == OPENAI_CHAT && r->max_tokens_given ? "max_completion_tokens" : "max_tokens";
    if (lim->max_request_tokens > 0 && tokens > lim->max_request_tokens)
        return openai_fail(err, 400, "request_too_large", r->sp.n > 1 ? "n" : mt,
                           "this request may generate up to %lld tokens (%d prompt%s x n=%d x %s %d), over this "
                           "server's limit of %lld a request (--max-request-tokens)", tokens, r->n_prompts,
                           r->n_prompts == 1 ? "" : "s", r->sp.n, mt, r->sp.max_tokens, lim->max_request_tokens);
    if (r->logprobs < 0) return 0;
    long long entries = tokens * (r->logprobs > 0 ? r->logprobs : 1);
    if (lim->max_request_logprobs > 0 && entries > lim->max_request_logprobs)
        return openai_fail(err, 400, "request_too_large", r->kind == OPENAI_CHAT ? "top_logprobs" : "logprobs",
                           "this request may return up to %lld logprobs (%lld tokens x %d), over this server's limit "
                           "of %lld a request (--max-request-logprobs)", entries, tokens,
                           r->logprobs > 0 ? r->logprobs : 1, lim->max_request_logprobs);
    return 0;
}

int openai_check_prompts(struct openai_request *r, const struct openai_limits *lim, struct openai_error *err) {
    for (int i = 0; i < r->n_prompts; i++) {
        const struct openai_prompt *p = &r->prompts[i];
        if (p->n_ids == 0) return BAD(r->kind == OPENAI_CHAT ? "messages" : "prompt", "the prompt is empty");
        for (int k = 0; k < p->n_ids; k++)
            if (p->ids[k] < 0 || p->ids[k] >= lim->vocab_size)
                return BAD("prompt", "token id %d is outside the vocabulary [0, %d)", (int)p->ids[k], lim->vocab_size);
        if (p->n_ids >= lim->max_model_len)
            return openai_fail(err, 400, "context_length_exceeded", r->kind == OPENAI_CHAT ? "messages" : "prompt",
                               "This model's maximum context length is %d tokens. However, your prompt has %d tokens, "
                               "leaving no room for the completion.", lim->max_model_len, p->n_ids);
        int max_tokens = r->sp.max_tokens;
        if (!r->max_tokens_given && r->kind == OPENAI_CHAT) {
            max_tokens = lim->max_model_len - p->n_ids;
            if (r->sp.min_tokens > max_tokens) max_tokens = r->sp.min_tokens;
        }
        if ((long long)p->n_ids + max_tokens > lim->max_model_len)
            return openai_fail(err, 400, "context_length_exceeded", r->kind == OPENAI_CHAT ? "max_tokens" : "max_tokens",
                               "This model's maximum context length is %d tokens. However, you requested %lld tokens "
                               "(%d in the prompt, %d for the completion). Please reduce the prompt or max_tokens.",
                               lim->max_model_len, (long long)p->n_ids + max_tokens, p->n_ids, max_tokens);
        if (r->kind == OPENAI_CHAT && !r->max_tokens_given) r->sp.max_tokens = max_tokens;
    }
    if (r->sp.min_tokens > r->sp.max_tokens)
        return BAD("min_tokens", "'min_tokens' (%d) must not exceed max_tokens (%d)", r->sp.min_tokens, r->sp.max_tokens);
    return check_work(r, lim, err);
}

int openai_submit_error(const struct openai_request *r, int status, const char *msg, struct openai_error *err) {
    switch (status) {
    case ENGINE_ERR_QUEUE_FULL:
        return openai_fail(err, 429, "queue_full", NULL, "the server is busy (request queue full); retry later");
    case ENGINE_ERR_DRAINING: return openai_fail(err, 503, NULL, NULL, "the server is shutting down");
    case ENGINE_ERR_TOO_LONG: return openai_fail(err, 400, "context_length_exceeded", "max_tokens", "%s", msg);
    case ENGINE_ERR_INVALID: return openai_fail(err, 400, NULL, NULL, "%s", msg);
    case ENGINE_ERR_GRAMMAR: { // the schema of response_format & co. or of the tools does not compile
        char named[512];
        openai_tools_grammar_error(r, msg, named, sizeof named);
        return openai_fail(err, 400, NULL, r->st.param, "%s", named);
    }
    default: return openai_fail(err, 500, NULL, NULL, "%s", msg);
    }
}
