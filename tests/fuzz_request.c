/* libFuzzer harness for request parsing and validation (server/openai.c): every input is
 * parsed as each endpoint's body; accepted requests go through the prompt checks and their
 * fields are read back into a response (chat with tools: the tool-call grammar is built and the
 * prompt's text goes through the tool-call parser, streamed and whole). The input itself is
 * also parsed as a model's output for tool calls, in pieces. Any crash, leak or undefined
 * behaviour is a bug.
 *
 * build: make build/fuzz_request (clang, libFuzzer)
 * run:   build/fuzz_request -max_total_time=600 -max_len=65536 -dict=tests/fuzz_request.dict \
 *          tests/fuzz_corpus/  (new inputs go to the first folder: copy the corpus first) */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/openai.h"
#include "server/openai_choice.h"
#include "server/openai_response.h"
#include "server/openai_tools.h"
#include "server/tool_parser.h"

/* Stands in for the tokenizer: some tokens hold part of a character (a byte >= 0x80). */
static size_t piece(void *ud, int32_t id, bool first, char *buf, size_t cap) {
    (void)ud;
    char tmp[24];
    size_t n = (size_t)snprintf(tmp, sizeof tmp, "%st%d", first ? "" : " ", (int)id);
    if (id % 3 == 0) tmp[n++] = (char)(0x80 | (id & 0x7F));
    memcpy(buf, tmp, n < cap ? n : cap);
    return n;
}

static int no_delta(void *ud, const struct tool_delta *d) {
    (void)ud;
    if (d->kind != TOOL_DELTA_CONTENT && d->kind != TOOL_DELTA_CALL && d->kind != TOOL_DELTA_ARGS) abort();
    return 0;
}

/* Chat with tools: the forced calls' grammar, and the text through the tool-call parser. */
static void tools_path(struct openai_request *r, const struct openai_resp_ctx *ctx, const char *text, size_t seed) {
    struct openai_error err;
    if (openai_tools_grammar(r, (enum openai_tool_syntax)(seed % 4), &err) != 0 && err.status != 500) abort();
    struct openai_choice a, b;
    openai_choice_init(&a);
    openai_choice_init(&b);
    if (openai_choice_init_tools(&a, r, seed) == 0 && openai_choice_init_tools(&b, r, seed) == 0 && a.tools) {
        size_t n = strlen(text), half = n / 2;
        char *first = strndup(text, half), *rest = strdup(text + half);
        struct engine_event e1 = {.type = ENGINE_EVENT_TOKEN, .text = first, .stop_index = -1, .stop_reason_id = -1};
        struct engine_event e2 = {.type = ENGINE_EVENT_FINISH, .text = rest, .finish = ENGINE_FINISH_STOP,
                                  .stop_index = -1, .stop_reason_id = -1};
        char *s1 = openai_chunk_tools_sse(ctx, 0, &a, &e1), *s2 = openai_chunk_tools_sse(ctx, 0, &a, &e2);
        if (!s1 || !s2) abort();
        free(s1), free(s2);
        openai_choice_add_event(&b, &e1, false);
        openai_choice_add_event(&b, &e2, false);
        b.finish = ENGINE_FINISH_STOP;
        char *j = openai_response_json(ctx, &b, 1, NULL);
        if (!j) abort();
        free(j), free(first), free(rest);
    }
    openai_choice_free(&a);
    openai_choice_free(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* the input as a model's output, for tool calls, in pieces of 1..8 bytes */
    struct tool_parser *tp = tool_parser_new(size & 1, size & 2, size);
    for (size_t at = 0, k; tp && at < size; at += k) {
        k = 1 + (size_t)data[at] % 8;
        if (k > size - at) k = size - at;
        if (tool_parser_feed(tp, (const char *)data + at, k, false, no_delta, NULL)) abort();
    }
    if (tp && tool_parser_feed(tp, "", 0, true, no_delta, NULL)) abort();
    tool_parser_free(tp);
    static const struct openai_limits lim = {.model_name = "m", .vocab_size = 512, .max_model_len = 128, .max_n = 8};
    static const enum openai_kind kinds[] = {OPENAI_COMPLETION, OPENAI_CHAT, OPENAI_TOKENIZE, OPENAI_DETOKENIZE};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        struct openai_request r;
        struct openai_error err;
        if (openai_parse_request((const char *)data, size, kinds[k], &lim, &r, &err) != 0) {
            if (err.status < 400 || err.status > 599 || !err.message[0]) abort();
            char *j = openai_error_json(&err);
            if (!j) abort();
            free(j);
            continue;
        }
        // Stand in for the chat template: the messages' JSON text is the prompt.
        if (r.messages && !r.prompts) {
            r.prompts = calloc(1, sizeof *r.prompts);
            r.n_prompts = 1;
            r.prompts[0].text = cJSON_PrintUnformatted(r.messages);
        }
        // Stand in for tokenization: string prompts become their bytes mod the vocabulary.
        for (int i = 0; i < r.n_prompts; i++) {
            struct openai_prompt *p = &r.prompts[i];
            if (p->ids || !p->text) continue;
            size_t n = strlen(p->text);
            p->ids = malloc(sizeof *p->ids * (n + 1));
            for (size_t b = 0; b < n; b++) p->ids[b] = (unsigned char)p->text[b] % lim.vocab_size;
            p->n_ids = (int)n;
        }
        if ((kinds[k] == OPENAI_COMPLETION || kinds[k] == OPENAI_CHAT) && openai_check_prompts(&r, &lim, &err) == 0) {
            if (r.n_prompts < 1 || r.prompts[0].n_ids < 1) abort();
            if (r.sp.n < 1 || r.sp.max_tokens < 1 || r.sp.logprobs > ENGINE_MAX_LOGPROBS) abort();
            if (r.sp.n_stop && !r.sp.stop) abort();
            struct openai_resp_ctx ctx = {.kind = kinds[k], .id = "x", .model = "m", .logprobs = r.logprobs,
                                          .tokens_as_ids = r.return_tokens_as_token_ids, .piece = piece};
            struct openai_choice c;
            openai_choice_init(&c);
            struct engine_event ev = {.type = ENGINE_EVENT_TOKEN, .token = r.prompts[0].ids[0], .text = r.stop ? r.stop[0] : "a",
                                      .logprob = -1.0f, .n_top = r.logprobs > 0 ? r.logprobs : 0};
            for (int t = 0; t < ev.n_top; t++) ev.top_ids[t] = t, ev.top_lps[t] = -(float)t;
            openai_choice_add_event(&c, &ev, r.logprobs >= 0);
            c.finish = ENGINE_FINISH_STOP;
            struct openai_usage u = {r.prompts[0].n_ids, 1};
            char *j = openai_response_json(&ctx, &c, 1, &u);
            char *s = openai_chunk_sse(&ctx, 0, ev.text, &ev, 0, ENGINE_FINISH_NONE, NULL, -1);
            if (!j || !s) abort();
            free(j);
            free(s);
            openai_choice_free(&c);
            if (kinds[k] == OPENAI_CHAT) tools_path(&r, &ctx, r.prompts[0].text ? r.prompts[0].text : "", size);
        }
        openai_request_free(&r);
    }
    return 0;
}
