/* openai_choice: one choice's output accumulated from engine events (server/openai_choice.h). */
#include "server/openai_choice.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/text/utf8.h"
#include "server/tool_parser.h"

static const char *tool_name(const cJSON *tool) {
    return cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(tool, "function"), "name")->valuestring;
}

/* ---- tool calls ---- */

static int append(char **s, size_t *len, size_t *cap, const char *t, size_t n) {
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap : 64;
        while (c < *len + n + 1) c *= 2;
        char *ns = realloc(*s, c);
        if (!ns) return -1;
        *s = ns;
        *cap = c;
    }
    if (n) memcpy(*s + *len, t, n);
    *len += n;
    (*s)[*len] = 0;
    return 0;
}

int openai_choice_init_tools(struct openai_choice *c, const struct openai_request *r, uint64_t seed) {
    const struct openai_structured *st = &r->st;
    if (r->kind != OPENAI_CHAT || st->tool_mode == OPENAI_TOOLS_OFF || st->format != ENGINE_GRAMMAR_NONE) return 0;
    c->tools = tool_parser_new(st->parallel_tool_calls && st->tool_mode != OPENAI_TOOLS_NAMED,
                               st->syntax == OPENAI_TOOL_SYNTAX_MISTRAL, seed);
    c->tres = calloc(1, sizeof *c->tres);
    if (!c->tools || !c->tres) return -1;
    for (const cJSON *t = st->tools->child; t; t = t->next)
        if (st->tool_mode != OPENAI_TOOLS_NAMED || !strcmp(tool_name(t), st->tool_name))
            if (tool_parser_allow_name(c->tools, tool_name(t))) return -1;
    return 0;
}

static void tools_free(struct openai_choice *c) {
    tool_parser_free(c->tools);
    c->tools = NULL;
    if (!c->tres) return;
    for (int i = 0; i < c->tres->n; i++) {
        free(c->tres->calls[i].name);
        free(c->tres->calls[i].args);
    }
    free(c->tres->calls);
    free(c->tres->content);
    free(c->tres);
    c->tres = NULL;
}

static int result_delta(void *ud, const struct tool_delta *d) {
    struct openai_tool_result *res = ud;
    if (d->kind == TOOL_DELTA_CONTENT) return append(&res->content, &res->len, &res->cap, d->text, d->len);
    if (d->kind == TOOL_DELTA_CALL) {
        if (res->n == res->cap_calls) {
            int nc = res->cap_calls ? res->cap_calls * 2 : 4;
            struct openai_tool_call *v = realloc(res->calls, sizeof *v * (size_t)nc);
            if (!v) return -1;
            res->calls = v;
            res->cap_calls = nc;
        }
        struct openai_tool_call *o = &res->calls[res->n];
        memset(o, 0, sizeof *o);
        snprintf(o->id, sizeof o->id, "%s", d->id);
        if (!(o->name = strndup(d->text, d->len)) || append(&o->args, &o->args_len, &o->args_cap, "", 0)) return -1;
        res->n++;
        return 0;
    }
    struct openai_tool_call *o = &res->calls[d->index];
    return append(&o->args, &o->args_len, &o->args_cap, d->text, d->len);
}

static int tools_accumulate(struct openai_choice *c, const struct engine_event *ev) {
    const char *t = ev->text ? ev->text : "";
    return tool_parser_feed(c->tools, t, strlen(t), ev->type == ENGINE_EVENT_FINISH, result_delta, c->tres);
}

/* ---- choice accumulation ---- */

void openai_choice_init(struct openai_choice *c) {
    memset(c, 0, sizeof *c);
    c->stop_reason_id = -1;
}

void openai_choice_free(struct openai_choice *c) {
    if (!c) return;
    free(c->text);
    free(c->tok_ids);
    free(c->tok_lps);
    free(c->tok_offsets);
    free(c->tok_n_top);
    free(c->top_ids);
    free(c->top_lps);
    free(c->stop_reason_str);
    tools_free(c);
    openai_choice_init(c);
}

int openai_choice_append(struct openai_choice *c, const char *s, size_t n) {
    if (c->len + n + 1 > c->cap) {
        size_t cap = c->cap ? c->cap : 64;
        while (cap < c->len + n + 1) cap *= 2;
        char *t = realloc(c->text, cap);
        if (!t) return -1;
        c->text = t;
        c->cap = cap;
    }
    if (n) memcpy(c->text + c->len, s, n);
    c->len += n;
    c->chars += utf8_count(s, n);
    c->text[c->len] = 0;
    return 0;
}

static int grow_tokens(struct openai_choice *c) {
    int cap = c->cap_tok ? c->cap_tok * 2 : 32;
    int32_t *ids = realloc(c->tok_ids, sizeof *ids * (size_t)cap);
    if (ids) c->tok_ids = ids;
    float *lps = realloc(c->tok_lps, sizeof *lps * (size_t)cap);
    if (lps) c->tok_lps = lps;
    size_t *offs = realloc(c->tok_offsets, sizeof *offs * (size_t)cap);
    if (offs) c->tok_offsets = offs;
    int *nt = realloc(c->tok_n_top, sizeof *nt * (size_t)cap);
    if (nt) c->tok_n_top = nt;
    int32_t *ti = realloc(c->top_ids, sizeof *ti * (size_t)cap * ENGINE_MAX_LOGPROBS);
    if (ti) c->top_ids = ti;
    float *tl = realloc(c->top_lps, sizeof *tl * (size_t)cap * ENGINE_MAX_LOGPROBS);
    if (tl) c->top_lps = tl;
    if (!ids || !lps || !offs || !nt || !ti || !tl) return -1;
    c->cap_tok = cap;
    return 0;
}

int openai_choice_add_event(struct openai_choice *c, const struct engine_event *ev, bool keep_logprobs) {
    size_t offset = c->chars + (ev->token_text_at > 0 ? (size_t)ev->token_text_at : 0);
    if (ev->text && openai_choice_append(c, ev->text, strlen(ev->text))) return -1;
    if (c->tools && tools_accumulate(c, ev)) return -1;
    if (ev->type != ENGINE_EVENT_TOKEN) return 0;
    c->completion_tokens++;
    if (!keep_logprobs) return 0;
    if (c->n_tok == c->cap_tok && grow_tokens(c)) return -1;
    int i = c->n_tok++;
    int n_top = ev->n_top < 0 ? 0 : ev->n_top > ENGINE_MAX_LOGPROBS ? ENGINE_MAX_LOGPROBS : ev->n_top;
    if (ev->text_start && c->n_start_tok == i) c->n_start_tok++;
    c->tok_ids[i] = ev->token;
    c->tok_lps[i] = ev->logprob;
    c->tok_offsets[i] = offset;
    c->tok_n_top[i] = n_top;
    memcpy(c->top_ids + (size_t)i * ENGINE_MAX_LOGPROBS, ev->top_ids, sizeof(int32_t) * (size_t)n_top);
    memcpy(c->top_lps + (size_t)i * ENGINE_MAX_LOGPROBS, ev->top_lps, sizeof(float) * (size_t)n_top);
    return 0;
}
