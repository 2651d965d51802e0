/* openai_fields: which fields a request may carry (server/openai_fields.h). */
#include "server/openai_fields.h"

#include <stdio.h>
#include <string.h>

/* Every top-level key is looked up here before anything is parsed, so no field is ever
 * silently ignored:
 *   FIELD_USED     parsed (openai.c, openai_tools.c);
 *   FIELD_NOOP     accepted and ignored: it cannot change the output (metadata, store, ...);
 *   FIELD_REFUSE   a field of the OpenAI or vLLM API that this server does not implement and
 *                  that would change the output: 400 naming it, unless its value is the one
 *                  that means "off" (use_beam_search false, tools [], response_format text, ...);
 *   anything else  400 "Unrecognized request argument supplied", as OpenAI's API answers, so
 *                  a misspelt field (temprature) is an error, not a different output. */

enum field_class { FIELD_USED, FIELD_NOOP, FIELD_REFUSE };

enum field_off { // the value a refused field may take because it asks for nothing
    OFF_NONE,    // any non-null value is refused
    OFF_FALSE,
    OFF_TRUE,
    OFF_ZERO,
    OFF_EMPTY,   // [] or {}
    OFF_AUTO,    // "none" or "auto" (tool_choice without tools)
    OFF_TEXT,    // response_format {"type": "text"}, modalities ["text"]
};

#define K_CMPL (1u << OPENAI_COMPLETION)
#define K_CHAT (1u << OPENAI_CHAT)
#define K_TOK (1u << OPENAI_TOKENIZE)
#define K_DETOK (1u << OPENAI_DETOKENIZE)
#define K_GEN (K_CMPL | K_CHAT)

struct field_rule {
    const char *name;
    unsigned kinds; // endpoints that know the field
    enum field_class cls;
    enum field_off off;
};

static const struct field_rule field_rules[] = {
    // parsed
    {"model", K_GEN | K_TOK | K_DETOK, FIELD_USED, OFF_NONE},
    {"prompt", K_CMPL | K_TOK, FIELD_USED, OFF_NONE},
    {"messages", K_CHAT | K_TOK, FIELD_USED, OFF_NONE},
    {"tokens", K_DETOK, FIELD_USED, OFF_NONE},
    {"add_special_tokens", K_GEN | K_TOK, FIELD_USED, OFF_NONE},
    {"add_generation_prompt", K_CHAT | K_TOK, FIELD_USED, OFF_NONE},
    {"chat_template_kwargs", K_CHAT | K_TOK, FIELD_USED, OFF_NONE},
    {"return_token_strs", K_TOK, FIELD_USED, OFF_NONE},
    {"echo", K_CMPL, FIELD_USED, OFF_NONE},
    {"stream", K_GEN, FIELD_USED, OFF_NONE},
    {"stream_options", K_GEN, FIELD_USED, OFF_NONE},
    {"n", K_GEN, FIELD_USED, OFF_NONE},
    {"best_of", K_GEN, FIELD_USED, OFF_NONE},
    {"max_tokens", K_GEN, FIELD_USED, OFF_NONE},
    {"max_completion_tokens", K_CHAT, FIELD_USED, OFF_NONE},
    {"temperature", K_GEN, FIELD_USED, OFF_NONE},
    {"top_p", K_GEN, FIELD_USED, OFF_NONE},
    {"top_k", K_GEN, FIELD_USED, OFF_NONE},
    {"min_p", K_GEN, FIELD_USED, OFF_NONE},
    {"presence_penalty", K_GEN, FIELD_USED, OFF_NONE},
    {"frequency_penalty", K_GEN, FIELD_USED, OFF_NONE},
    {"repetition_penalty", K_GEN, FIELD_USED, OFF_NONE},
    {"seed", K_GEN, FIELD_USED, OFF_NONE},
    {"min_tokens", K_GEN, FIELD_USED, OFF_NONE},
    {"ignore_eos", K_GEN, FIELD_USED, OFF_NONE},
    {"include_stop_str_in_output", K_GEN, FIELD_USED, OFF_NONE},
    {"skip_special_tokens", K_GEN, FIELD_USED, OFF_NONE},
    {"stop", K_GEN, FIELD_USED, OFF_NONE},
    {"stop_token_ids", K_GEN, FIELD_USED, OFF_NONE},
    {"logit_bias", K_GEN, FIELD_USED, OFF_NONE},
    {"logprobs", K_GEN, FIELD_USED, OFF_NONE},
    {"top_logprobs", K_CHAT, FIELD_USED, OFF_NONE},
    {"return_tokens_as_token_ids", K_GEN, FIELD_USED, OFF_NONE},
    {"user", K_GEN, FIELD_USED, OFF_NONE},
    {"request_id", K_GEN, FIELD_USED, OFF_NONE},
    {"response_format", K_GEN, FIELD_USED, OFF_NONE},     // server/openai_tools.c
    {"guided_json", K_GEN, FIELD_USED, OFF_NONE},
    {"structured_outputs", K_GEN, FIELD_USED, OFF_NONE},
    {"tools", K_CHAT | K_TOK, FIELD_USED, OFF_NONE},
    {"tool_choice", K_CHAT, FIELD_USED, OFF_NONE},
    {"parallel_tool_calls", K_CHAT, FIELD_USED, OFF_NONE},
    // accepted, no effect on the output
    {"metadata", K_GEN, FIELD_NOOP, OFF_NONE},
    {"store", K_GEN, FIELD_NOOP, OFF_NONE},
    {"service_tier", K_GEN, FIELD_NOOP, OFF_NONE},
    {"prompt_cache_key", K_GEN, FIELD_NOOP, OFF_NONE},
    {"safety_identifier", K_GEN, FIELD_NOOP, OFF_NONE},
    {"cache_salt", K_GEN, FIELD_NOOP, OFF_NONE},
    {"kv_transfer_params", K_GEN, FIELD_NOOP, OFF_NONE},
    {"prediction", K_CHAT, FIELD_NOOP, OFF_NONE},           // a latency hint; the output is the same
    {"length_penalty", K_GEN, FIELD_NOOP, OFF_NONE},        // beam search only
    {"guided_decoding_backend", K_GEN, FIELD_NOOP, OFF_NONE},
    {"guided_whitespace_pattern", K_GEN, FIELD_NOOP, OFF_NONE},
    {"mm_processor_kwargs", K_CHAT | K_TOK, FIELD_NOOP, OFF_NONE}, // text-only models
    // refused: they would change the output
    {"suffix", K_CMPL, FIELD_REFUSE, OFF_NONE},
    {"prompt_embeds", K_CMPL, FIELD_REFUSE, OFF_NONE},
    {"guided_regex", K_GEN, FIELD_REFUSE, OFF_NONE},
    {"guided_choice", K_GEN, FIELD_REFUSE, OFF_NONE},
    {"guided_grammar", K_GEN, FIELD_REFUSE, OFF_NONE},
    {"logits_processors", K_GEN, FIELD_REFUSE, OFF_NONE},
    {"vllm_xargs", K_GEN, FIELD_REFUSE, OFF_NONE},
    {"allowed_token_ids", K_GEN, FIELD_REFUSE, OFF_NONE},
    {"bad_words", K_GEN, FIELD_REFUSE, OFF_NONE},
    {"prompt_logprobs", K_GEN, FIELD_REFUSE, OFF_NONE},
    {"truncate_prompt_tokens", K_GEN, FIELD_REFUSE, OFF_NONE},
    {"use_beam_search", K_GEN, FIELD_REFUSE, OFF_FALSE},
    {"return_token_ids", K_GEN, FIELD_REFUSE, OFF_FALSE},
    {"spaces_between_special_tokens", K_GEN, FIELD_REFUSE, OFF_TRUE},
    {"priority", K_GEN, FIELD_REFUSE, OFF_ZERO},
    {"functions", K_CHAT, FIELD_REFUSE, OFF_EMPTY},
    {"function_call", K_CHAT, FIELD_REFUSE, OFF_AUTO},
    {"modalities", K_CHAT, FIELD_REFUSE, OFF_TEXT},
    {"audio", K_CHAT, FIELD_REFUSE, OFF_NONE},
    {"reasoning_effort", K_CHAT, FIELD_REFUSE, OFF_NONE},
    {"verbosity", K_CHAT, FIELD_REFUSE, OFF_NONE},
    {"web_search_options", K_CHAT, FIELD_REFUSE, OFF_NONE},
    {"include_reasoning", K_CHAT, FIELD_REFUSE, OFF_TRUE},
    {"echo", K_CHAT, FIELD_REFUSE, OFF_FALSE},
    {"continue_final_message", K_CHAT | K_TOK, FIELD_REFUSE, OFF_FALSE},
    {"documents", K_CHAT | K_TOK, FIELD_REFUSE, OFF_NONE},
    {"chat_template", K_CHAT | K_TOK, FIELD_REFUSE, OFF_NONE},
};

/* stream_options' keys (the object is checked the same way). */
static const struct field_rule stream_option_rules[] = {
    {"include_usage", K_GEN, FIELD_USED, OFF_NONE},
    {"include_obfuscation", K_GEN, FIELD_NOOP, OFF_NONE}, // padding against side channels; none is sent
    {"continuous_usage_stats", K_GEN, FIELD_REFUSE, OFF_FALSE},
};

static bool is_off(const cJSON *v, enum field_off off) {
    switch (off) {
    case OFF_FALSE: return cJSON_IsFalse(v);
    case OFF_TRUE: return cJSON_IsTrue(v);
    case OFF_ZERO: return cJSON_IsNumber(v) && v->valuedouble == 0;
    case OFF_EMPTY: return (cJSON_IsArray(v) || cJSON_IsObject(v)) && !v->child;
    case OFF_AUTO: return cJSON_IsString(v) && (!strcmp(v->valuestring, "none") || !strcmp(v->valuestring, "auto"));
    case OFF_TEXT: { // {"type": "text"} or ["text"]
        const cJSON *t = NULL;
        if (cJSON_IsObject(v)) t = cJSON_GetObjectItemCaseSensitive(v, "type");
        else if (cJSON_IsArray(v) && cJSON_GetArraySize(v) == 1) t = v->child;
        return cJSON_IsString(t) && !strcmp(t->valuestring, "text");
    }
    default: return false;
    }
}

static const char *off_hint(enum field_off off) {
    switch (off) {
    case OFF_FALSE: return " (only false)";
    case OFF_TRUE: return " (only true)";
    case OFF_ZERO: return " (only 0)";
    case OFF_EMPTY: return " (only empty)";
    case OFF_AUTO: return " (only \"none\" or \"auto\")";
    case OFF_TEXT: return " (only \"text\")";
    default: return "";
    }
}

/* Checks every key of obj (JSON nulls count as absent) against rules; prefix names the
 * object in messages and param ("" at the top level). */
static int check_keys(const cJSON *obj, const struct field_rule *rules, size_t n_rules, enum openai_kind kind,
                      const char *prefix, struct openai_error *err) {
    const cJSON *it;
    cJSON_ArrayForEach(it, obj) {
        if (cJSON_IsNull(it)) continue;
        const char *k = it->string ? it->string : "";
        char param[sizeof err->param];
        snprintf(param, sizeof param, "%s%.40s", prefix, k);
        const struct field_rule *rule = NULL;
        for (size_t i = 0; i < n_rules && !rule; i++)
            if ((rules[i].kinds & (1u << kind)) && !strcmp(rules[i].name, k)) rule = &rules[i];
        if (!rule) return openai_fail(err, 400, NULL, param, "Unrecognized request argument supplied: %s", param);
        if (rule->cls == FIELD_REFUSE && !is_off(it, rule->off))
            return openai_fail(err, 400, "unsupported_parameter", param, "'%s' is not supported by this server%s", param,
                               off_hint(rule->off));
    }
    return 0;
}

int openai_fields_check(const cJSON *root, enum openai_kind kind, struct openai_error *err) {
    if (check_keys(root, field_rules, sizeof field_rules / sizeof field_rules[0], kind, "", err)) return -1;
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
    if (cJSON_IsObject(so) &&
        check_keys(so, stream_option_rules, sizeof stream_option_rules / sizeof stream_option_rules[0], kind,
                   "stream_options.", err))
        return -1;
    return 0;
}
