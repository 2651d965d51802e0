#include "engine/request.h"

#include <stdlib.h>
#include <string.h>

static void *dup_mem(const void *p, size_t n) {
    void *d = malloc(n ? n : 1);
    if (d && n) memcpy(d, p, n);
    return d;
}

/* A copy of s (NULL stays NULL); *ok turns false when out of memory. */
static const char *dup_opt(const char *s, bool *ok) {
    if (!s) return NULL;
    char *d = strdup(s);
    if (!d) *ok = false;
    return d;
}

static bool copy_grammar(struct engine_grammar *g, const struct engine_grammar *from) {
    bool ok = true;
    *g = *from;
    g->schema = dup_opt(from->schema, &ok);
    g->wrap.begin = dup_opt(from->wrap.begin, &ok);
    g->wrap.end = dup_opt(from->wrap.end, &ok);
    g->wrap.sep = dup_opt(from->wrap.sep, &ok);
    g->wrap.item_begin = dup_opt(from->wrap.item_begin, &ok);
    g->wrap.item_end = dup_opt(from->wrap.item_end, &ok);
    return ok;
}

struct engine_request *engine_request_clone(const struct engine_request *src) {
    struct engine_request *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    const struct engine_sampling *sp = &src->sp;
    *r = *src;
    r->prompt = dup_mem(src->prompt, sizeof(int32_t) * (size_t)src->n_prompt);
    r->sp.logit_bias_ids = dup_mem(sp->logit_bias_ids, sizeof(int32_t) * (size_t)sp->n_logit_bias);
    r->sp.logit_bias_vals = dup_mem(sp->logit_bias_vals, sizeof(float) * (size_t)sp->n_logit_bias);
    r->sp.stop_ids = dup_mem(sp->stop_ids, sizeof(int32_t) * (size_t)sp->n_stop_ids);
    char **stop = calloc((size_t)sp->n_stop + 1, sizeof *stop);
    size_t *stop_len = malloc(sizeof *stop_len * ((size_t)sp->n_stop + 1));
    r->sp.stop = stop;
    r->sp.stop_len = stop_len;
    bool ok = r->prompt && r->sp.logit_bias_ids && r->sp.logit_bias_vals && r->sp.stop_ids && stop && stop_len;
    for (int i = 0; ok && i < sp->n_stop; i++) {
        stop_len[i] = sp->stop_len ? sp->stop_len[i] : strlen(sp->stop[i]);
        if ((ok = (stop[i] = malloc(stop_len[i] + 1)) != NULL)) {
            memcpy(stop[i], sp->stop[i], stop_len[i]);
            stop[i][stop_len[i]] = 0;
        }
    }
    if (!copy_grammar(&r->sp.grammar, &sp->grammar)) ok = false;
    if (!ok) {
        engine_request_free(r);
        return NULL;
    }
    return r;
}

void engine_request_free(struct engine_request *r) {
    if (!r) return;
    free((void *)r->prompt);
    free((void *)r->sp.logit_bias_ids);
    free((void *)r->sp.logit_bias_vals);
    free((void *)r->sp.stop_ids);
    for (int i = 0; r->sp.stop && i < r->sp.n_stop; i++) free(r->sp.stop[i]);
    free((void *)r->sp.stop);
    free((void *)r->sp.stop_len);
    struct engine_grammar *g = &r->sp.grammar;
    free((void *)g->schema);
    free((void *)g->wrap.begin), free((void *)g->wrap.end), free((void *)g->wrap.sep);
    free((void *)g->wrap.item_begin), free((void *)g->wrap.item_end);
    free(r);
}

const char *engine_strerror(int status) {
    switch (status) {
    case ENGINE_OK: return "ok";
    case ENGINE_ERR_INVALID: return "invalid request";
    case ENGINE_ERR_TOO_LONG: return "context length exceeded";
    case ENGINE_ERR_QUEUE_FULL: return "queue full";
    case ENGINE_ERR_DRAINING: return "shutting down";
    case ENGINE_ERR_OOM: return "out of memory";
    case ENGINE_ERR_FATAL: return "the backend failed";
    case ENGINE_ERR_GRAMMAR: return "the structured-output schema cannot be used";
    case ENGINE_ERR_BACKEND: return "the backend failed a step";
    }
    return "unknown error";
}
