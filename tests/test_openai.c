/* Unit tests of server/openai.*: request parsing and validation into engine requests, the
 * error shape, and response / stream chunk building. Pure functions only (no engine). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "server/openai.h"
#include "server/openai_choice.h"
#include "server/openai_nul.h"
#include "server/openai_response.h"

static const struct openai_limits LIM = {.model_name = "m", .vocab_size = 512, .max_model_len = 64, .max_n = 8};

static int parse(const char *body, enum openai_kind kind, struct openai_request *r, struct openai_error *e) {
    return openai_parse_request(body, strlen(body), kind, &LIM, r, e);
}

/* Parses body, expects failure with status and (when given) param and code. */
static void expect_error(const char *body, enum openai_kind kind, int status, const char *param, const char *code) {
    struct openai_request r;
    struct openai_error e;
    int rc = parse(body, kind, &r, &e);
    if (rc == 0) {
        openai_request_free(&r);
        fail_msg("accepted: %s", body);
    }
    assert_int_equal(e.status, status);
    if (param) assert_string_equal(e.param, param);
    if (code) assert_non_null(e.code), assert_string_equal(e.code, code);
    assert_true(strlen(e.message) > 0);
}

static void completion_defaults_match_openai(void **state) {
    (void)state;
    struct openai_request r;
    struct openai_error e;
    assert_int_equal(parse("{\"prompt\":\"hi\"}", OPENAI_COMPLETION, &r, &e), 0);
    assert_int_equal(r.n_prompts, 1);
    assert_string_equal(r.prompts[0].text, "hi");
    assert_null(r.prompts[0].ids);
    assert_int_equal(r.sp.n, 1);
    assert_int_equal(r.sp.max_tokens, 16);
    assert_true(r.sp.temperature == 1.0f);
    assert_true(r.sp.top_p == 1.0f);
    assert_true(r.sp.repetition_penalty == 1.0f);
    assert_true(r.sp.skip_special_tokens);
    assert_int_equal(r.sp.logprobs, -1);
    assert_false(r.stream);
    assert_true(r.add_special_tokens);
    openai_request_free(&r);
}

static void completion_all_fields_are_parsed(void **state) {
    (void)state;
    const char *body = "{\"model\":\"m\",\"prompt\":[1,2,3],\"max_tokens\":5,\"temperature\":0,\"top_p\":0.5,\"n\":2,"
                       "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"stop\":[\"a\",\"bc\"],\"seed\":-1,"
                       "\"logprobs\":3,\"presence_penalty\":1,\"frequency_penalty\":-1,\"logit_bias\":{\"7\":-100,\"9\":5.5},"
                       "\"user\":\"u\",\"top_k\":40,\"min_p\":0.1,\"repetition_penalty\":1.2,\"min_tokens\":2,\"ignore_eos\":true,"
                       "\"stop_token_ids\":[4,5],\"include_stop_str_in_output\":true,\"skip_special_tokens\":false,"
                       "\"return_tokens_as_token_ids\":true,\"best_of\":2}";
    struct openai_request r;
    struct openai_error e;
    assert_int_equal(parse(body, OPENAI_COMPLETION, &r, &e), 0);
    assert_int_equal(r.n_prompts, 1);
    assert_int_equal(r.prompts[0].n_ids, 3);
    assert_int_equal(r.prompts[0].ids[2], 3);
    assert_int_equal(r.sp.max_tokens, 5);
    assert_true(r.sp.temperature == 0.0f);
    assert_true(r.sp.top_p == 0.5f);
    assert_int_equal(r.sp.n, 2);
    assert_true(r.stream && r.include_usage);
    assert_int_equal(r.sp.n_stop, 2);
    assert_string_equal(r.sp.stop[1], "bc");
    assert_true(r.sp.has_seed);
    assert_true(r.sp.seed == UINT64_MAX);
    assert_int_equal(r.sp.logprobs, 3);
    assert_int_equal(r.logprobs, 3);
    assert_int_equal(r.sp.n_logit_bias, 2);
    assert_int_equal(r.sp.logit_bias_ids[0], 7);
    assert_true(r.sp.logit_bias_vals[0] == -100.0f);
    assert_true(r.sp.logit_bias_vals[1] == 5.5f);
    assert_string_equal(r.user, "u");
    assert_int_equal(r.sp.top_k, 40);
    assert_true(r.sp.min_p == 0.1f);
    assert_true(r.sp.repetition_penalty == 1.2f);
    assert_int_equal(r.sp.min_tokens, 2);
    assert_true(r.sp.ignore_eos && r.sp.include_stop_str_in_output && !r.sp.skip_special_tokens);
    assert_int_equal(r.sp.n_stop_ids, 2);
    assert_int_equal(r.sp.stop_ids[1], 5);
    assert_true(r.return_tokens_as_token_ids);
    openai_request_free(&r);
}

static void prompt_forms_string_array_ids_and_arrays(void **state) {
    (void)state;
    struct openai_request r;
    struct openai_error e;
    assert_int_equal(parse("{\"prompt\":[\"a\",\"b\",\"c\"]}", OPENAI_COMPLETION, &r, &e), 0);
    assert_int_equal(r.n_prompts, 3);
    assert_string_equal(r.prompts[2].text, "c");
    openai_request_free(&r);
    assert_int_equal(parse("{\"prompt\":[[1,2],[3]]}", OPENAI_COMPLETION, &r, &e), 0);
    assert_int_equal(r.n_prompts, 2);
    assert_int_equal(r.prompts[0].n_ids, 2);
    assert_int_equal(r.prompts[1].ids[0], 3);
    openai_request_free(&r);
    expect_error("{\"prompt\":[\"a\",[1]]}", OPENAI_COMPLETION, 400, "prompt", NULL);
    expect_error("{\"prompt\":[1,\"a\"]}", OPENAI_COMPLETION, 400, "prompt", NULL);
    expect_error("{\"prompt\":[]}", OPENAI_COMPLETION, 400, "prompt", NULL);
    expect_error("{\"prompt\":[[]]}", OPENAI_COMPLETION, 400, "prompt", NULL);
    expect_error("{\"prompt\":{}}", OPENAI_COMPLETION, 400, "prompt", NULL);
    expect_error("{}", OPENAI_COMPLETION, 400, "prompt", NULL);
}

static void out_of_range_values_are_400(void **state) {
    (void)state;
    expect_error("{\"prompt\":[1],\"temperature\":2.01}", OPENAI_COMPLETION, 400, "temperature", NULL);
    expect_error("{\"prompt\":[1],\"temperature\":-0.1}", OPENAI_COMPLETION, 400, "temperature", NULL);
    expect_error("{\"prompt\":[1],\"temperature\":1e999}", OPENAI_COMPLETION, 400, "temperature", NULL);
    expect_error("{\"prompt\":[1],\"temperature\":\"1\"}", OPENAI_COMPLETION, 400, "temperature", NULL);
    expect_error("{\"prompt\":[1],\"top_p\":0}", OPENAI_COMPLETION, 400, "top_p", NULL);
    expect_error("{\"prompt\":[1],\"top_p\":1.5}", OPENAI_COMPLETION, 400, "top_p", NULL);
    expect_error("{\"prompt\":[1],\"max_tokens\":0}", OPENAI_COMPLETION, 400, "max_tokens", NULL);
    expect_error("{\"prompt\":[1],\"max_tokens\":2.5}", OPENAI_COMPLETION, 400, "max_tokens", NULL);
    expect_error("{\"prompt\":[1],\"max_tokens\":1e999}", OPENAI_COMPLETION, 400, "max_tokens", NULL);
    expect_error("{\"prompt\":[1],\"max_tokens\":-1e999}", OPENAI_COMPLETION, 400, "max_tokens", NULL);
    expect_error("{\"prompt\":[1],\"n\":0}", OPENAI_COMPLETION, 400, "n", NULL);
    expect_error("{\"prompt\":[1],\"n\":9}", OPENAI_COMPLETION, 400, "n", NULL);
    expect_error("{\"prompt\":[1],\"logprobs\":21}", OPENAI_COMPLETION, 400, "logprobs", NULL);
    expect_error("{\"prompt\":[1],\"logprobs\":true}", OPENAI_COMPLETION, 400, "logprobs", NULL);
    expect_error("{\"prompt\":[1],\"presence_penalty\":2.5}", OPENAI_COMPLETION, 400, "presence_penalty", NULL);
    expect_error("{\"prompt\":[1],\"repetition_penalty\":0}", OPENAI_COMPLETION, 400, "repetition_penalty", NULL);
    expect_error("{\"prompt\":[1],\"min_p\":1.5}", OPENAI_COMPLETION, 400, "min_p", NULL);
    expect_error("{\"prompt\":[1],\"top_k\":-2}", OPENAI_COMPLETION, 400, "top_k", NULL);
    expect_error("{\"prompt\":[1],\"seed\":1.5}", OPENAI_COMPLETION, 400, "seed", NULL);
    expect_error("{\"prompt\":[1],\"seed\":1e30}", OPENAI_COMPLETION, 400, "seed", NULL);
    expect_error("{\"prompt\":[1],\"stream\":1}", OPENAI_COMPLETION, 400, "stream", NULL);
    expect_error("{\"prompt\":[1],\"stream_options\":{\"include_usage\":true}}", OPENAI_COMPLETION, 400, "stream_options", NULL);
    expect_error("{\"prompt\":[1],\"min_tokens\":5,\"max_tokens\":4}", OPENAI_COMPLETION, 400, "min_tokens", NULL);
    expect_error("{\"prompt\":[1],\"best_of\":3}", OPENAI_COMPLETION, 400, "best_of", NULL);
    expect_error("{\"prompt\":[1],\"suffix\":\"x\"}", OPENAI_COMPLETION, 400, "suffix", NULL);
    expect_error("{\"prompt\":[1],\"echo\":true,\"logprobs\":1}", OPENAI_COMPLETION, 400, "echo", NULL);
}

static void token_ids_outside_the_vocabulary_are_400(void **state) {
    (void)state;
    expect_error("{\"prompt\":[512]}", OPENAI_COMPLETION, 400, "prompt", NULL);
    expect_error("{\"prompt\":[-1]}", OPENAI_COMPLETION, 400, "prompt", NULL);
    expect_error("{\"prompt\":[1.5]}", OPENAI_COMPLETION, 400, "prompt", NULL);
    expect_error("{\"prompt\":[1e999]}", OPENAI_COMPLETION, 400, "prompt", NULL);
    expect_error("{\"prompt\":[[1],[600]]}", OPENAI_COMPLETION, 400, "prompt", NULL);
    expect_error("{\"prompt\":[1],\"stop_token_ids\":[512]}", OPENAI_COMPLETION, 400, "stop_token_ids", NULL);
    expect_error("{\"prompt\":[1],\"logit_bias\":{\"512\":1}}", OPENAI_COMPLETION, 400, "logit_bias", NULL);
    expect_error("{\"prompt\":[1],\"logit_bias\":{\"-1\":1}}", OPENAI_COMPLETION, 400, "logit_bias", NULL);
    expect_error("{\"prompt\":[1],\"logit_bias\":{\"1x\":1}}", OPENAI_COMPLETION, 400, "logit_bias", NULL);
    expect_error("{\"prompt\":[1],\"logit_bias\":{\"1\":100.5}}", OPENAI_COMPLETION, 400, "logit_bias", NULL);
    expect_error("{\"tokens\":[512]}", OPENAI_DETOKENIZE, 400, "tokens", NULL);
}

static void bad_json_utf8_and_nesting_are_400(void **state) {
    (void)state;
    expect_error("{\"prompt\":", OPENAI_COMPLETION, 400, NULL, NULL);
    expect_error("", OPENAI_COMPLETION, 400, NULL, NULL);
    expect_error("[1]", OPENAI_COMPLETION, 400, NULL, NULL);
    expect_error("{\"prompt\":[1]} x", OPENAI_COMPLETION, 400, NULL, NULL);
    expect_error("{\"prompt\":\"\xff\"}", OPENAI_COMPLETION, 400, NULL, NULL);
    expect_error("{\"prompt\":\"\xed\xa0\x80\"}", OPENAI_COMPLETION, 400, NULL, NULL); // UTF-8 surrogate
    expect_error("{\"prompt\":\"\\udc00\"}", OPENAI_COMPLETION, 400, NULL, NULL);
    size_t n = 200000;
    char *deep = malloc(2 * n + 1);
    memset(deep, '[', n);
    memset(deep + n, ']', n);
    deep[2 * n] = 0;
    expect_error(deep, OPENAI_COMPLETION, 400, NULL, NULL);
    free(deep);
    // A body with a NUL inside is not silently truncated into something valid.
    struct openai_request r;
    struct openai_error e;
    assert_int_not_equal(openai_parse_request("{\"prompt\":[1]}\0junk", 19, OPENAI_COMPLETION, &LIM, &r, &e), 0);
    assert_int_equal(e.status, 400);
}

static void unknown_model_is_404_model_not_found(void **state) {
    (void)state;
    expect_error("{\"model\":\"other\",\"prompt\":[1]}", OPENAI_COMPLETION, 404, "model", "model_not_found");
    expect_error("{\"model\":5,\"prompt\":[1]}", OPENAI_COMPLETION, 400, "model", NULL);
}

static void null_fields_mean_not_given(void **state) {
    (void)state;
    struct openai_request r;
    struct openai_error e;
    assert_int_equal(parse("{\"prompt\":[1],\"max_tokens\":null,\"temperature\":null,\"stop\":null,\"logprobs\":null,"
                           "\"suffix\":null,\"seed\":null}", OPENAI_COMPLETION, &r, &e), 0);
    assert_int_equal(r.sp.max_tokens, 16);
    assert_false(r.sp.has_seed);
    assert_int_equal(r.logprobs, -1);
    openai_request_free(&r);
}

/* A field is refused (400, param = its name, code unsupported_parameter) on endpoint kind. */
static void expect_refused(const char *field_json, enum openai_kind kind, const char *param) {
    char body[512];
    const char *base = kind == OPENAI_CHAT ? "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]" : "\"prompt\":[1]";
    snprintf(body, sizeof body, "{%s,%s}", base, field_json);
    expect_error(body, kind, 400, param, "unsupported_parameter");
}

static void expect_accepted(const char *field_json, enum openai_kind kind) {
    char body[512];
    const char *base = kind == OPENAI_CHAT ? "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]" : "\"prompt\":[1]";
    snprintf(body, sizeof body, "{%s,%s}", base, field_json);
    struct openai_request r;
    struct openai_error e;
    if (parse(body, kind, &r, &e)) fail_msg("refused (%s): %s", e.message, body);
    openai_request_free(&r);
}

static void fields_that_change_the_output_are_refused_by_name(void **state) {
    (void)state;
    static const char *const both[][2] = {
        {"\"guided_regex\":\"a+\"", "guided_regex"},
        {"\"guided_choice\":[\"a\"]", "guided_choice"}, {"\"guided_grammar\":\"g\"", "guided_grammar"},
        {"\"structured_outputs\":{\"regex\":\"a+\"}", "structured_outputs"}, {"\"logits_processors\":[]", "logits_processors"},
        {"\"prompt_logprobs\":0", "prompt_logprobs"}, {"\"use_beam_search\":true", "use_beam_search"},
        {"\"allowed_token_ids\":[1]", "allowed_token_ids"}, {"\"bad_words\":[\"x\"]", "bad_words"},
        {"\"truncate_prompt_tokens\":2", "truncate_prompt_tokens"}, {"\"priority\":1", "priority"},
        {"\"spaces_between_special_tokens\":false", "spaces_between_special_tokens"},
        {"\"return_token_ids\":true", "return_token_ids"}, {"\"vllm_xargs\":{}", "vllm_xargs"},
        {"\"stream\":true,\"stream_options\":{\"continuous_usage_stats\":true}", "stream_options.continuous_usage_stats"},
    };
    for (size_t i = 0; i < sizeof both / sizeof both[0]; i++) {
        expect_refused(both[i][0], OPENAI_COMPLETION, both[i][1]);
        expect_refused(both[i][0], OPENAI_CHAT, both[i][1]);
    }
    expect_refused("\"suffix\":\"x\"", OPENAI_COMPLETION, "suffix");
    static const char *const chat[][2] = {
        {"\"tools\":[{\"type\":\"retrieval\"}]", "tools"}, {"\"functions\":[{}]", "functions"}, {"\"function_call\":{\"name\":\"f\"}", "function_call"},
        {"\"modalities\":[\"text\",\"audio\"]", "modalities"}, {"\"audio\":{}", "audio"},
        {"\"reasoning_effort\":\"low\"", "reasoning_effort"}, {"\"echo\":true", "echo"},
        {"\"continue_final_message\":true", "continue_final_message"}, {"\"chat_template\":\"x\"", "chat_template"},
        {"\"include_reasoning\":false", "include_reasoning"}, {"\"documents\":[]", "documents"},
    };
    for (size_t i = 0; i < sizeof chat / sizeof chat[0]; i++)
        if (chat[i][1]) expect_refused(chat[i][0], OPENAI_CHAT, chat[i][1]);
    expect_error("{\"prompt\":\"hi\",\"chat_template\":\"x\"}", OPENAI_TOKENIZE, 400, "chat_template", "unsupported_parameter");
}

static void unknown_fields_are_refused_by_name(void **state) {
    (void)state;
    struct openai_request r;
    struct openai_error e;
    assert_int_equal(parse("{\"prompt\":[1],\"temprature\":0}", OPENAI_COMPLETION, &r, &e), -1);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, "temprature");
    assert_null(e.code); // as OpenAI's "Unrecognized request argument supplied"
    assert_non_null(strstr(e.message, "temprature"));
    // A field of one endpoint is unknown on another.
    expect_error("{\"prompt\":[1],\"max_completion_tokens\":2}", OPENAI_COMPLETION, 400, "max_completion_tokens", NULL);
    expect_error("{\"prompt\":[1],\"top_logprobs\":2}", OPENAI_COMPLETION, 400, "top_logprobs", NULL);
    expect_error("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"prompt\":\"p\"}", OPENAI_CHAT, 400, "prompt", NULL);
    expect_error("{\"tokens\":[1],\"prompt\":\"p\"}", OPENAI_DETOKENIZE, 400, "prompt", NULL);
    expect_error("{\"prompt\":\"p\",\"max_tokens\":3}", OPENAI_TOKENIZE, 400, "max_tokens", NULL);
    expect_error("{\"prompt\":[1],\"stream\":true,\"stream_options\":{\"x\":1}}", OPENAI_COMPLETION, 400, "stream_options.x", NULL);
    // null means "not given", for unknown fields too
    assert_int_equal(parse("{\"prompt\":[1],\"whatever\":null,\"guided_json\":null}", OPENAI_COMPLETION, &r, &e), 0);
    openai_request_free(&r);
}

static void fields_without_effect_and_off_values_are_accepted(void **state) {
    (void)state;
    static const char *const both[] = {
        "\"user\":\"u\"", "\"metadata\":{\"a\":\"b\"}", "\"store\":true", "\"service_tier\":\"auto\"",
        "\"prompt_cache_key\":\"k\"", "\"safety_identifier\":\"s\"", "\"cache_salt\":\"c\"", "\"kv_transfer_params\":{}",
        "\"length_penalty\":1", "\"guided_decoding_backend\":\"xgrammar\"", "\"use_beam_search\":false",
        "\"response_format\":{\"type\":\"text\"}", "\"priority\":0", "\"spaces_between_special_tokens\":true",
        "\"return_token_ids\":false", "\"stream\":true,\"stream_options\":{\"include_usage\":true,\"include_obfuscation\":false,"
                                      "\"continuous_usage_stats\":false}",
    };
    for (size_t i = 0; i < sizeof both / sizeof both[0]; i++) {
        expect_accepted(both[i], OPENAI_COMPLETION);
        expect_accepted(both[i], OPENAI_CHAT);
    }
    static const char *const chat[] = {
        "\"tools\":[]", "\"tool_choice\":\"none\"", "\"tool_choice\":\"auto\"", "\"functions\":[]", "\"function_call\":\"none\"",
        "\"parallel_tool_calls\":true", "\"modalities\":[\"text\"]", "\"prediction\":{\"type\":\"content\",\"content\":\"x\"}",
        "\"echo\":false", "\"continue_final_message\":false", "\"include_reasoning\":true", "\"mm_processor_kwargs\":{}",
    };
    for (size_t i = 0; i < sizeof chat / sizeof chat[0]; i++) expect_accepted(chat[i], OPENAI_CHAT);
}

static void request_id_and_tokenize_template_kwargs_are_parsed(void **state) {
    (void)state;
    struct openai_request r;
    struct openai_error e;
    assert_int_equal(parse("{\"prompt\":[1],\"request_id\":\"abc-1\"}", OPENAI_COMPLETION, &r, &e), 0);
    assert_string_equal(r.request_id, "abc-1");
    openai_request_free(&r);
    expect_error("{\"prompt\":[1],\"request_id\":\"a b\"}", OPENAI_COMPLETION, 400, "request_id", NULL);
    expect_error("{\"prompt\":[1],\"request_id\":\"\"}", OPENAI_COMPLETION, 400, "request_id", NULL);
    expect_error("{\"prompt\":[1],\"request_id\":7}", OPENAI_COMPLETION, 400, "request_id", NULL);
    assert_true(openai_request_id_valid("x"));
    assert_true(openai_request_id_valid("0f8fad5b-d9cb-469f-a165-70867728950e"));
    assert_false(openai_request_id_valid(""));
    assert_false(openai_request_id_valid("tab\there"));
    assert_false(openai_request_id_valid("\xc3\xa9"));
    char longest[OPENAI_MAX_REQUEST_ID + 2];
    memset(longest, 'a', sizeof longest - 1);
    longest[sizeof longest - 1] = 0;
    assert_false(openai_request_id_valid(longest));
    longest[OPENAI_MAX_REQUEST_ID] = 0;
    assert_true(openai_request_id_valid(longest));
    // /tokenize with messages renders with chat_template_kwargs, as the chat endpoint does.
    assert_int_equal(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"chat_template_kwargs\":{\"t\":true}}",
                           OPENAI_TOKENIZE, &r, &e), 0);
    assert_non_null(r.template_kwargs);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(r.template_kwargs, "t")));
    openai_request_free(&r);
}

static void system_fingerprint_is_left_out_when_unset(void **state) {
    (void)state;
    struct openai_resp_ctx ctx = {.kind = OPENAI_COMPLETION, .id = "cmpl-1", .model = "m", .logprobs = -1};
    struct openai_choice c;
    openai_choice_init(&c);
    char *j = openai_response_json(&ctx, &c, 1, NULL);
    assert_null(strstr(j, "system_fingerprint"));
    free(j);
    ctx.system_fingerprint = "duoserve-x";
    j = openai_response_json(&ctx, &c, 1, NULL);
    assert_non_null(strstr(j, "\"system_fingerprint\":\"duoserve-x\""));
    free(j);
    j = openai_chunk_sse(&ctx, 0, "a", NULL, 0, ENGINE_FINISH_NONE, NULL, -1);
    assert_non_null(strstr(j, "\"system_fingerprint\":\"duoserve-x\""));
    free(j);
    openai_choice_free(&c);
}

static void stop_accepts_string_or_list_and_rejects_empty(void **state) {
    (void)state;
    struct openai_request r;
    struct openai_error e;
    assert_int_equal(parse("{\"prompt\":[1],\"stop\":\"\\n\"}", OPENAI_COMPLETION, &r, &e), 0);
    assert_int_equal(r.sp.n_stop, 1);
    assert_string_equal(r.sp.stop[0], "\n");
    openai_request_free(&r);
    expect_error("{\"prompt\":[1],\"stop\":\"\"}", OPENAI_COMPLETION, 400, "stop", NULL);
    expect_error("{\"prompt\":[1],\"stop\":[1]}", OPENAI_COMPLETION, 400, "stop", NULL);
}

/* \u0000 inside a string keeps what follows: prompts, stop strings (whose engine copies carry
 * their length), message content; an escaped backslash before "u0000" is no NUL; the JSON
 * written back shows it as \u0000. */
static void nul_in_strings_keeps_the_whole_string(void **state) {
    (void)state;
    struct openai_request r;
    struct openai_error e;
    assert_int_equal(parse("{\"prompt\":\"Once\\u0000 upon\",\"stop\":[\"a\\u0000zzz\",\"\\\\u0000\"]}", OPENAI_COMPLETION,
                           &r, &e), 0);
    assert_int_equal(strlen(r.prompts[0].text), 10);
    assert_int_equal(r.prompts[0].text[4], OPENAI_NUL);
    size_t n;
    char *bytes = openai_bytes(r.prompts[0].text, &n);
    assert_int_equal(n, 10);
    assert_memory_equal(bytes, "Once\0 upon", 10);
    free(bytes);
    assert_int_equal(r.sp.n_stop, 2);
    assert_int_equal(r.sp.stop_len[0], 5);
    assert_memory_equal(r.sp.stop[0], "a\0zzz", 5);
    assert_int_equal(r.sp.stop_len[1], 6); // "\\u0000" is a backslash and "u0000"
    assert_string_equal(r.sp.stop[1], "\\u0000");
    openai_request_free(&r);
    assert_int_equal(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"x\\u0000y\"}]}", OPENAI_CHAT, &r, &e), 0);
    const char *content = cJSON_GetObjectItem(cJSON_GetArrayItem(r.messages, 0), "content")->valuestring;
    assert_int_equal(strlen(content), 3);
    openai_request_free(&r);
    // a stop string of one NUL is not empty
    assert_int_equal(parse("{\"prompt\":[1],\"stop\":\"\\u0000\"}", OPENAI_COMPLETION, &r, &e), 0);
    assert_int_equal(r.sp.stop_len[0], 1);
    openai_request_free(&r);
    // written back as \u0000
    expect_error("{\"prompt\":[1],\"model\":\"m\\u0000x\"}", OPENAI_COMPLETION, 404, "model", "model_not_found");
    struct openai_error e2;
    openai_fail(&e2, 400, NULL, NULL, "a%cb", OPENAI_NUL);
    char *j = openai_error_json(&e2);
    assert_non_null(strstr(j, "a\\u0000b"));
    free(j);
    char text[] = "a\0b";
    openai_mark_nul(text, 3);
    assert_int_equal(strlen(text), 3);
}

/* The work of one request is bounded: prompts x n x max_tokens, and x top logprobs; chat's
 * default max_tokens (the rest of the context) counts. */
static void work_per_request_is_bounded(void **state) {
    (void)state;
    struct openai_limits lim = LIM;
    lim.max_request_tokens = 100;
    lim.max_request_logprobs = 150;
    struct openai_request r;
    struct openai_error e;
    assert_int_equal(parse("{\"prompt\":[[1],[2]],\"n\":5,\"max_tokens\":10}", OPENAI_COMPLETION, &r, &e), 0);
    assert_int_equal(openai_check_prompts(&r, &lim, &e), 0); // 2 x 5 x 10 = 100
    openai_request_free(&r);
    assert_int_equal(parse("{\"prompt\":[[1],[2]],\"n\":5,\"max_tokens\":11}", OPENAI_COMPLETION, &r, &e), 0);
    assert_int_equal(openai_check_prompts(&r, &lim, &e), -1);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.code, "request_too_large");
    assert_non_null(strstr(e.message, "--max-request-tokens"));
    assert_non_null(strstr(e.message, "110"));
    openai_request_free(&r);
    assert_int_equal(parse("{\"prompt\":[1],\"max_tokens\":10,\"logprobs\":20}", OPENAI_COMPLETION, &r, &e), 0);
    assert_int_equal(openai_check_prompts(&r, &lim, &e), -1); // 10 x 20 = 200 > 150
    assert_non_null(strstr(e.message, "--max-request-logprobs"));
    assert_string_equal(e.param, "logprobs");
    openai_request_free(&r);
    assert_int_equal(parse("{\"prompt\":[1],\"max_tokens\":60,\"logprobs\":0}", OPENAI_COMPLETION, &r, &e), 0);
    assert_int_equal(openai_check_prompts(&r, &lim, &e), 0); // logprobs 0: one entry a token
    openai_request_free(&r);
    // chat without max_tokens: 3 prompt tokens leave 61; n=2 asks for 122
    assert_int_equal(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":2}", OPENAI_CHAT, &r, &e), 0);
    r.prompts = calloc(1, sizeof *r.prompts);
    r.n_prompts = 1;
    r.prompts[0].ids = malloc(3 * sizeof(int32_t));
    r.prompts[0].ids[0] = r.prompts[0].ids[1] = r.prompts[0].ids[2] = 1;
    r.prompts[0].n_ids = 3;
    assert_int_equal(openai_check_prompts(&r, &lim, &e), -1);
    assert_non_null(strstr(e.message, "122"));
    openai_request_free(&r);
    lim.max_request_tokens = lim.max_request_logprobs = 0; // no limits
    assert_int_equal(parse("{\"prompt\":[[1],[2]],\"n\":8,\"max_tokens\":60,\"logprobs\":20}", OPENAI_COMPLETION, &r, &e), 0);
    assert_int_equal(openai_check_prompts(&r, &lim, &e), 0);
    openai_request_free(&r);
}

static void context_length_is_checked_after_tokenization(void **state) {
    (void)state;
    struct openai_request r;
    struct openai_error e;
    assert_int_equal(parse("{\"prompt\":[1,2,3],\"max_tokens\":61}", OPENAI_COMPLETION, &r, &e), 0);
    assert_int_equal(openai_check_prompts(&r, &LIM, &e), 0); // 3 + 61 = 64 fits
    openai_request_free(&r);
    assert_int_equal(parse("{\"prompt\":[1,2,3],\"max_tokens\":62}", OPENAI_COMPLETION, &r, &e), 0);
    assert_int_equal(openai_check_prompts(&r, &LIM, &e), -1);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.code, "context_length_exceeded");
    openai_request_free(&r);
    // a prompt that fills the context leaves no room
    char body[512] = "{\"prompt\":[";
    for (int i = 0; i < 64; i++) strcat(body, i ? ",1" : "1");
    strcat(body, "],\"max_tokens\":1}");
    assert_int_equal(parse(body, OPENAI_COMPLETION, &r, &e), 0);
    assert_int_equal(openai_check_prompts(&r, &LIM, &e), -1);
    assert_string_equal(e.code, "context_length_exceeded");
    openai_request_free(&r);
}

static void chat_messages_are_normalised_and_max_tokens_defaults_to_the_rest(void **state) {
    (void)state;
    struct openai_request r;
    struct openai_error e;
    const char *body = "{\"messages\":[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":"
                       "[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]},{\"role\":\"assistant\","
                       "\"content\":null}],\"logprobs\":true,\"top_logprobs\":2}";
    assert_int_equal(parse(body, OPENAI_CHAT, &r, &e), 0);
    assert_int_equal(cJSON_GetArraySize(r.messages), 3);
    cJSON *u = cJSON_GetArrayItem(r.messages, 1);
    assert_string_equal(cJSON_GetObjectItem(u, "content")->valuestring, "a\nb");
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(r.messages, 2), "content")->valuestring, "");
    assert_int_equal(r.logprobs, 2);
    assert_false(r.add_special_tokens);
    assert_true(r.add_generation_prompt);
    // as if the template rendered 10 tokens
    r.prompts = calloc(1, sizeof *r.prompts);
    r.n_prompts = 1;
    r.prompts[0].ids = calloc(10, sizeof(int32_t));
    r.prompts[0].n_ids = 10;
    assert_int_equal(openai_check_prompts(&r, &LIM, &e), 0);
    assert_int_equal(r.sp.max_tokens, 54);
    openai_request_free(&r);
    // max_completion_tokens wins over max_tokens
    assert_int_equal(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":9,\"max_completion_tokens\":3}",
                           OPENAI_CHAT, &r, &e), 0);
    assert_int_equal(r.sp.max_tokens, 3);
    openai_request_free(&r);
    expect_error("{\"messages\":[]}", OPENAI_CHAT, 400, "messages", NULL);
    expect_error("{\"messages\":[{\"content\":\"x\"}]}", OPENAI_CHAT, 400, "messages", NULL);
    expect_error("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", OPENAI_CHAT, 400, "messages", NULL);
    expect_error("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":2}", OPENAI_CHAT, 400, "top_logprobs", NULL);
    expect_error("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":1}", OPENAI_CHAT, 400, "logprobs", NULL);
    expect_error("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{}]}", OPENAI_CHAT, 400, "tools", NULL);
}

static void error_json_has_the_openai_shape(void **state) {
    (void)state;
    struct openai_error e;
    assert_int_equal(openai_fail(&e, 400, "context_length_exceeded", "max_tokens", "too %s", "long"), -1);
    char *j = openai_error_json(&e);
    assert_string_equal(j, "{\"error\":{\"message\":\"too long\",\"type\":\"invalid_request_error\",\"param\":\"max_tokens\","
                           "\"code\":\"context_length_exceeded\"}}");
    free(j);
    openai_fail(&e, 401, NULL, NULL, "no key");
    j = openai_error_json(&e);
    assert_string_equal(j, "{\"error\":{\"message\":\"no key\",\"type\":\"authentication_error\",\"param\":null,\"code\":null}}");
    free(j);
    openai_fail(&e, 429, "queue_full", NULL, "busy");
    j = openai_error_sse(&e);
    assert_true(strncmp(j, "data: {\"error\":", 15) == 0);
    assert_true(strcmp(j + strlen(j) - 2, "\n\n") == 0);
    free(j);
}

/* engine_submit's refusals: one mapping to HTTP statuses, codes and params. */
static void engine_refusals_map_to_http_statuses(void **state) {
    (void)state;
    struct openai_request r;
    struct openai_error e;
    const char *body = "{\"prompt\":\"x\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
                       "{\"name\":\"n\",\"schema\":{\"type\":\"object\"}}}}";
    assert_int_equal(parse(body, OPENAI_COMPLETION, &r, &e), 0);
    const struct {
        int status, http;
        const char *code, *param, *message;
    } cases[] = {
        {ENGINE_ERR_QUEUE_FULL, 429, "queue_full", "", "the server is busy (request queue full); retry later"},
        {ENGINE_ERR_DRAINING, 503, NULL, "", "the server is shutting down"},
        {ENGINE_ERR_TOO_LONG, 400, "context_length_exceeded", "max_tokens", "engine says"},
        {ENGINE_ERR_INVALID, 400, NULL, "", "engine says"},
        {ENGINE_ERR_GRAMMAR, 400, NULL, "response_format", "'response_format': engine says"},
        {ENGINE_ERR_OOM, 500, NULL, "", "engine says"},
        {ENGINE_ERR_FATAL, 500, NULL, "", "engine says"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memset(&e, 0, sizeof e);
        assert_int_equal(openai_submit_error(&r, cases[i].status, "engine says", &e), -1);
        assert_int_equal(e.status, cases[i].http);
        if (cases[i].code) assert_string_equal(e.code, cases[i].code);
        else assert_null(e.code);
        assert_string_equal(e.param, cases[i].param);
        assert_string_equal(e.message, cases[i].message);
    }
    assert_string_equal(e.type, "server_error");
    openai_submit_error(&r, ENGINE_ERR_QUEUE_FULL, "", &e);
    assert_string_equal(e.type, "rate_limit_error");
    openai_request_free(&r);
}

static size_t fake_piece(void *ud, int32_t id, bool first, char *buf, size_t cap) {
    (void)ud;
    (void)first;
    char tmp[32];
    size_t n = (size_t)snprintf(tmp, sizeof tmp, "<%d>", (int)id);
    memcpy(buf, tmp, n < cap ? n : cap);
    return n;
}

static struct engine_event token_event(int32_t id, const char *text, float lp) {
    struct engine_event ev = {.type = ENGINE_EVENT_TOKEN, .token = id, .text = (char *)text, .logprob = lp, .n_top = 2};
    ev.top_ids[0] = id;
    ev.top_lps[0] = lp;
    ev.top_ids[1] = id + 1;
    ev.top_lps[1] = lp - 1;
    return ev;
}

static void completion_response_with_legacy_logprobs(void **state) {
    (void)state;
    struct openai_choice c;
    openai_choice_init(&c);
    struct engine_event a = token_event(5, "h\xc3\xa9", -0.5f), b = token_event(6, " x", -1.0f);
    assert_int_equal(openai_choice_add_event(&c, &a, true), 0);
    assert_int_equal(openai_choice_add_event(&c, &b, true), 0);
    struct engine_event fin = {.type = ENGINE_EVENT_FINISH, .text = "!", .finish = ENGINE_FINISH_STOP};
    assert_int_equal(openai_choice_add_event(&c, &fin, true), 0);
    c.finish = ENGINE_FINISH_STOP;
    c.stop_reason_str = strdup("END");
    assert_int_equal(c.completion_tokens, 2);
    struct openai_resp_ctx ctx = {.kind = OPENAI_COMPLETION, .id = "cmpl-1", .model = "m", .created = 7, .logprobs = 1,
                                  .piece = fake_piece};
    struct openai_usage u = {3, 2, 1};
    char *j = openai_response_json(&ctx, &c, 1, &u);
    cJSON *root = cJSON_Parse(j);
    assert_non_null(root);
    assert_string_equal(cJSON_GetObjectItem(root, "object")->valuestring, "text_completion");
    cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "choices"), 0);
    assert_string_equal(cJSON_GetObjectItem(ch, "text")->valuestring, "h\xc3\xa9 x!");
    assert_string_equal(cJSON_GetObjectItem(ch, "finish_reason")->valuestring, "stop");
    assert_string_equal(cJSON_GetObjectItem(ch, "stop_reason")->valuestring, "END");
    cJSON *lp = cJSON_GetObjectItem(ch, "logprobs");
    assert_string_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "tokens"), 1)->valuestring, "<6>");
    assert_true(cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "token_logprobs"), 0)->valuedouble == -0.5);
    // text_offset counts characters: "hé" is 2
    assert_int_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "text_offset"), 1)->valueint, 2);
    cJSON *top0 = cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "top_logprobs"), 0);
    assert_int_equal(cJSON_GetArraySize(top0), 1); // logprobs=1: the top one, which is the sampled one
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(root, "usage"), "total_tokens")->valueint, 5);
    cJSON *details = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "usage"), "prompt_tokens_details");
    assert_int_equal(cJSON_GetObjectItem(details, "cached_tokens")->valueint, 1);
    cJSON_Delete(root);
    free(j);
    openai_choice_free(&c);
}

static void chat_response_and_chunks_have_the_openai_shape(void **state) {
    (void)state;
    struct openai_resp_ctx ctx = {.kind = OPENAI_CHAT, .id = "chatcmpl-1", .model = "m", .created = 7, .logprobs = 1,
                                  .piece = fake_piece, .system_fingerprint = "fp-1"};
    struct openai_choice c;
    openai_choice_init(&c);
    struct engine_event a = token_event(5, "hi", -0.25f);
    openai_choice_add_event(&c, &a, true);
    c.finish = ENGINE_FINISH_LENGTH;
    char *j = openai_response_json(&ctx, &c, 1, NULL);
    cJSON *root = cJSON_Parse(j);
    assert_string_equal(cJSON_GetObjectItem(root, "object")->valuestring, "chat.completion");
    assert_string_equal(cJSON_GetObjectItem(root, "system_fingerprint")->valuestring, "fp-1");
    cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "choices"), 0);
    cJSON *msg = cJSON_GetObjectItem(ch, "message");
    assert_string_equal(cJSON_GetObjectItem(msg, "role")->valuestring, "assistant");
    assert_string_equal(cJSON_GetObjectItem(msg, "content")->valuestring, "hi");
    cJSON *content = cJSON_GetObjectItem(cJSON_GetObjectItem(ch, "logprobs"), "content");
    cJSON *e0 = cJSON_GetArrayItem(content, 0);
    assert_string_equal(cJSON_GetObjectItem(e0, "token")->valuestring, "<5>");
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(e0, "bytes")), 3);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(e0, "top_logprobs")), 1);
    assert_string_equal(cJSON_GetObjectItem(ch, "finish_reason")->valuestring, "length");
    cJSON_Delete(root);
    free(j);
    openai_choice_free(&c);

    char *role = openai_chunk_role_sse(&ctx, 0);
    assert_non_null(strstr(role, "\"delta\":{\"role\":\"assistant\",\"content\":\"\"}"));
    assert_non_null(strstr(role, "chat.completion.chunk"));
    assert_non_null(strstr(role, "\"system_fingerprint\":\"fp-1\""));
    free(role);
    char *chunk = openai_chunk_sse(&ctx, 1, "yo", &a, 0, ENGINE_FINISH_NONE, NULL, -1);
    assert_true(strncmp(chunk, "data: {", 7) == 0);
    root = cJSON_Parse(chunk + 6);
    ch = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "choices"), 0);
    assert_int_equal(cJSON_GetObjectItem(ch, "index")->valueint, 1);
    assert_string_equal(cJSON_GetObjectItem(root, "system_fingerprint")->valuestring, "fp-1");
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(ch, "delta"), "content")->valuestring, "yo");
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(ch, "finish_reason")));
    cJSON_Delete(root);
    free(chunk);
    struct openai_usage u = {4, 6, 0};
    char *us = openai_chunk_usage_sse(&ctx, &u);
    root = cJSON_Parse(us + 6);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(root, "choices")), 0);
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(root, "usage"), "total_tokens")->valueint, 10);
    assert_string_equal(cJSON_GetObjectItem(root, "system_fingerprint")->valuestring, "fp-1");
    cJSON_Delete(root);
    free(us);
}

static void stream_finish_chunk_carries_reason_and_stop_id(void **state) {
    (void)state;
    struct openai_resp_ctx ctx = {.kind = OPENAI_COMPLETION, .id = "c", .model = "m", .logprobs = -1};
    char *chunk = openai_chunk_sse(&ctx, 0, "", NULL, 0, ENGINE_FINISH_STOP, NULL, 42);
    cJSON *root = cJSON_Parse(chunk + 6);
    cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "choices"), 0);
    assert_string_equal(cJSON_GetObjectItem(ch, "finish_reason")->valuestring, "stop");
    assert_int_equal(cJSON_GetObjectItem(ch, "stop_reason")->valueint, 42);
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(ch, "logprobs")));
    cJSON_Delete(root);
    free(chunk);
}

static void tokens_as_ids_and_minus_infinity_logprobs(void **state) {
    (void)state;
    struct openai_resp_ctx ctx = {.kind = OPENAI_COMPLETION, .id = "c", .model = "m", .logprobs = 0, .tokens_as_ids = true};
    struct engine_event a = token_event(9, "z", -INFINITY);
    a.n_top = 0;
    char *chunk = openai_chunk_sse(&ctx, 0, "z", &a, 3, ENGINE_FINISH_NONE, NULL, -1);
    assert_non_null(strstr(chunk, "\"tokens\":[\"token_id:9\"]"));
    assert_non_null(strstr(chunk, "\"token_logprobs\":[-9999]"));
    assert_non_null(strstr(chunk, "\"text_offset\":[3]"));
    free(chunk);
}

static void models_and_tokenize_shapes(void **state) {
    (void)state;
    char *j = openai_models_json("m", "/models/m", 5, 512);
    assert_string_equal(j, "{\"object\":\"list\",\"data\":[{\"id\":\"m\",\"object\":\"model\",\"created\":5,\"owned_by\":"
                           "\"duoserve\",\"root\":\"/models/m\",\"parent\":null,\"max_model_len\":512}]}");
    free(j);
    int32_t ids[2] = {1, 2};
    j = openai_tokenize_json(ids, 2, 512, NULL);
    assert_string_equal(j, "{\"count\":2,\"max_model_len\":512,\"tokens\":[1,2],\"token_strs\":null}");
    free(j);
    j = openai_detokenize_json("a\"b");
    assert_string_equal(j, "{\"prompt\":\"a\\\"b\"}");
    free(j);
    struct openai_request r;
    struct openai_error e;
    assert_int_equal(parse("{\"prompt\":\"x\",\"add_special_tokens\":false,\"return_token_strs\":true}", OPENAI_TOKENIZE, &r, &e), 0);
    assert_false(r.add_special_tokens);
    assert_true(r.return_token_strs);
    openai_request_free(&r);
    assert_int_equal(parse("{\"tokens\":[]}", OPENAI_DETOKENIZE, &r, &e), 0);
    assert_int_equal(r.prompts[0].n_ids, 0);
    openai_request_free(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(completion_defaults_match_openai),
        cmocka_unit_test(completion_all_fields_are_parsed),
        cmocka_unit_test(prompt_forms_string_array_ids_and_arrays),
        cmocka_unit_test(out_of_range_values_are_400),
        cmocka_unit_test(token_ids_outside_the_vocabulary_are_400),
        cmocka_unit_test(bad_json_utf8_and_nesting_are_400),
        cmocka_unit_test(unknown_model_is_404_model_not_found),
        cmocka_unit_test(null_fields_mean_not_given),
        cmocka_unit_test(fields_that_change_the_output_are_refused_by_name),
        cmocka_unit_test(unknown_fields_are_refused_by_name),
        cmocka_unit_test(fields_without_effect_and_off_values_are_accepted),
        cmocka_unit_test(request_id_and_tokenize_template_kwargs_are_parsed),
        cmocka_unit_test(system_fingerprint_is_left_out_when_unset),
        cmocka_unit_test(stop_accepts_string_or_list_and_rejects_empty),
        cmocka_unit_test(context_length_is_checked_after_tokenization),
        cmocka_unit_test(nul_in_strings_keeps_the_whole_string),
        cmocka_unit_test(work_per_request_is_bounded),
        cmocka_unit_test(chat_messages_are_normalised_and_max_tokens_defaults_to_the_rest),
        cmocka_unit_test(error_json_has_the_openai_shape),
        cmocka_unit_test(engine_refusals_map_to_http_statuses),
        cmocka_unit_test(completion_response_with_legacy_logprobs),
        cmocka_unit_test(chat_response_and_chunks_have_the_openai_shape),
        cmocka_unit_test(stream_finish_chunk_carries_reason_and_stop_id),
        cmocka_unit_test(tokens_as_ids_and_minus_infinity_logprobs),
        cmocka_unit_test(models_and_tokenize_shapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
