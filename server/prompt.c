/* prompt: tokenization and chat templates for requests. */
#include "server/prompt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/text/tokenizer.h"
#include "server/openai_nul.h"
#include "server/openai_tools.h"
#if __has_include("engine/text/chat_template.h")
#include "engine/text/chat_template.h"
#define PROMPT_HAVE_CHAT_TEMPLATE 1
#endif

static int encode(const struct tokenizer *tok, const char *text, bool add_special, struct openai_prompt *p,
                  const char *param, struct openai_error *err) {
    int32_t *ids = NULL;
    size_t n = 0, len;
    char *bytes = openai_bytes(text, &len); // U+0000 is a byte of the prompt like any other
    if (!bytes) return openai_fail(err, 500, NULL, NULL, "out of memory");
    int rc = tokenizer_encode(tok, bytes, len, add_special, &ids, &n);
    free(bytes);
    if (rc == TOKENIZER_ERR_INVALID_UTF8) return openai_fail(err, 400, NULL, param, "the prompt is not valid UTF-8");
    if (rc) return openai_fail(err, 500, NULL, NULL, "tokenizing the prompt failed: %s", tokenizer_strerror(rc));
    if (n > (size_t)INT32_MAX) {
        free(ids);
        return openai_fail(err, 400, "context_length_exceeded", param, "the prompt is too long");
    }
    free(p->ids);
    p->ids = ids;
    p->n_ids = (int)n;
    return 0;
}

static int render_chat(struct openai_request *r, const struct tokenizer *tok, const struct chat_template *ct,
                       struct openai_error *err) {
    if (!ct)
        return openai_fail(err, 400, NULL, "messages",
                           "this model has no chat template: use /v1/completions, or start the server with --chat-template FILE");
#ifdef PROMPT_HAVE_CHAT_TEMPLATE
    /* tools are template variables (as in transformers: the caller's kwargs cannot replace them),
     * and a tool call's JSON-string arguments reach the template parsed, as vLLM passes them */
    cJSON *extra = r->template_kwargs;
    if (r->st.tools) {
        extra = r->template_kwargs ? cJSON_Duplicate(r->template_kwargs, 1) : cJSON_CreateObject();
        cJSON *tools = cJSON_Duplicate(r->st.tools, 1);
        if (extra) cJSON_DeleteItemFromObjectCaseSensitive(extra, "tools");
        if (!extra || !tools || !cJSON_AddItemToObject(extra, "tools", tools)) {
            cJSON_Delete(tools);
            cJSON_Delete(extra);
            return openai_fail(err, 500, NULL, NULL, "out of memory");
        }
    }
    if (openai_tools_template_messages(r->messages)) {
        if (extra != r->template_kwargs) cJSON_Delete(extra);
        return openai_fail(err, 500, NULL, NULL, "out of memory");
    }
    char *text = NULL, msg[400] = "";
    int rc = chat_template_render(ct, r->messages, r->add_generation_prompt, chat_template_bos_token(ct),
                                  chat_template_eos_token(ct), extra, &text, msg, sizeof msg);
    if (extra != r->template_kwargs) cJSON_Delete(extra);
    if (rc == CHAT_TEMPLATE_ERR_NONE)
        return openai_fail(err, 400, NULL, "messages", "this model has no chat template: use /v1/completions");
    if (rc == CHAT_TEMPLATE_ERR_NOMEM) return openai_fail(err, 500, NULL, NULL, "out of memory");
    if (rc == CHAT_TEMPLATE_ERR_RAISED) return openai_fail(err, 400, NULL, "messages", "%s", msg);
    if (rc) return openai_fail(err, 400, NULL, "messages", "the chat template failed on these messages: %s", msg);
    if (!r->prompts) {
        if (!(r->prompts = calloc(1, sizeof *r->prompts))) {
            free(text);
            return openai_fail(err, 500, NULL, NULL, "out of memory");
        }
        r->n_prompts = 1;
    }
    free(r->prompts[0].text);
    r->prompts[0].text = text;
    /* tool_choice required or named: the grammar of the calls in the model's syntax */
    static const enum openai_tool_syntax syntax[] = {
        [CHAT_TEMPLATE_TOOLS_UNKNOWN] = OPENAI_TOOL_SYNTAX_JSON, [CHAT_TEMPLATE_TOOLS_HERMES] = OPENAI_TOOL_SYNTAX_HERMES,
        [CHAT_TEMPLATE_TOOLS_MISTRAL] = OPENAI_TOOL_SYNTAX_MISTRAL, [CHAT_TEMPLATE_TOOLS_LLAMA3] = OPENAI_TOOL_SYNTAX_LLAMA3};
    if (r->kind == OPENAI_CHAT && openai_tools_grammar(r, syntax[chat_template_tool_syntax(ct)], err)) return -1;
    return encode(tok, text, r->add_special_tokens, &r->prompts[0], "messages", err);
#else
    (void)r;
    (void)tok;
    return openai_fail(err, 400, NULL, "messages", "chat templates are not available in this build");
#endif
}

char *prompt_decode(const struct tokenizer *tok, const int32_t *ids, int n, bool skip_special, struct openai_error *err) {
    char *text = NULL;
    size_t len = 0;
    int rc = tokenizer_decode(tok, ids, (size_t)(n > 0 ? n : 0), skip_special, &text, &len);
    if (rc) {
        openai_fail(err, 500, NULL, NULL, "decoding tokens failed: %s", tokenizer_strerror(rc));
        return NULL;
    }
    openai_mark_nul(text, len);
    return text;
}

int prompt_prepare(struct openai_request *r, const struct tokenizer *tok, const struct chat_template *ct,
                   const struct openai_limits *lim, struct openai_error *err) {
    if (r->messages) {
        if (render_chat(r, tok, ct, err)) return -1;
    } else {
        for (int i = 0; i < r->n_prompts; i++) {
            struct openai_prompt *p = &r->prompts[i];
            if (p->text && !p->ids && encode(tok, p->text, r->add_special_tokens, p, "prompt", err)) return -1;
        }
    }
    if (r->kind != OPENAI_COMPLETION && r->kind != OPENAI_CHAT) return 0;
    if (openai_check_prompts(r, lim, err)) return -1;
    if (r->echo) {
        for (int i = 0; i < r->n_prompts; i++) {
            struct openai_prompt *p = &r->prompts[i];
            if (!p->text && !(p->text = prompt_decode(tok, p->ids, p->n_ids, false, err))) return -1;
        }
    }
    return 0;
}

const char *prompt_token_piece(void *ud, int32_t id, char *buf, size_t cap) {
    const struct tokenizer *tok = ud;
    char *text = NULL;
    size_t len = 0;
    if (cap == 0) return "";
    buf[0] = 0;
    if (tokenizer_decode(tok, &id, 1, false, &text, &len) == 0 && text) {
        if (len >= cap) { // cut at a character boundary
            len = cap - 1;
            while (len > 0 && ((unsigned char)text[len] & 0xC0) == 0x80) len--;
        }
        memcpy(buf, text, len);
        buf[len] = 0;
        openai_mark_nul(buf, len);
    }
    free(text);
    return buf;
}

size_t prompt_token_bytes(void *ud, int32_t id, bool first, char *buf, size_t cap) {
    return tokenizer_token_bytes(ud, id, first, buf, cap);
}
