/* openai_request: a parsed request's free and the request id rule (server/openai_request.h). */
#include "server/openai_request.h"

#include <stdlib.h>
#include <string.h>

static void structured_free(struct openai_structured *st) {
    free(st->schema);
    cJSON_Delete(st->tools);
    free(st->tool_name);
    free(st->tool_schema);
    memset(st, 0, sizeof *st);
}

void openai_request_free(struct openai_request *r) {
    if (!r) return;
    free(r->model);
    for (int i = 0; i < r->n_prompts; i++) {
        free(r->prompts[i].text);
        free(r->prompts[i].ids);
    }
    free(r->prompts);
    cJSON_Delete(r->messages);
    cJSON_Delete(r->template_kwargs);
    free(r->logit_bias_ids);
    free(r->logit_bias_vals);
    free(r->stop_ids);
    for (int i = 0; i < r->sp.n_stop; i++) {
        free(r->stop[i]);
        free(r->stop_bytes[i]);
    }
    free(r->stop);
    free(r->stop_bytes);
    free(r->stop_len);
    free(r->user);
    free(r->request_id);
    structured_free(&r->st);
    enum openai_kind kind = r->kind;
    memset(r, 0, sizeof *r);
    r->kind = kind;
}

bool openai_request_id_valid(const char *s) {
    size_t n = 0;
    for (; s[n]; n++)
        if ((unsigned char)s[n] < 0x21 || (unsigned char)s[n] > 0x7E) return false;
    return n >= 1 && n <= OPENAI_MAX_REQUEST_ID;
}
