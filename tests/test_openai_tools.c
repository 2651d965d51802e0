/* server/openai_tools: response_format & co. and tools parsed into the engine's grammar (400s
 * naming the field for bad ones); the grammar of forced tool calls in each template family's
 * syntax compiles and accepts exactly the calls; tool-call arguments reach templates parsed; the
 * message and the streamed deltas of tool calls have OpenAI's shape and agree. */
#include "tests/test_common.h"

#include "engine/grammar.h"
#include "server/openai.h"
#include "server/openai_choice.h"
#include "server/openai_response.h"
#include "server/openai_tools.h"

static const struct openai_limits LIM = {.model_name = NULL, .vocab_size = 1000, .max_model_len = 4096, .max_n = 4};

#define MSG "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"
#define TOOLS                                                                                                        \
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"d\",\"parameters\":" \
    "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"unit\":{\"$ref\":\"#/$defs/u\"}},"        \
    "\"required\":[\"city\"],\"$defs\":{\"u\":{\"enum\":[\"C\",\"F\"]}}}}},{\"type\":\"function\",\"function\":"      \
    "{\"name\":\"now\"}}]"

static int parse(const char *body, enum openai_kind kind, struct openai_request *r, struct openai_error *e) {
    return openai_parse_request(body, strlen(body), kind, &LIM, r, e);
}

static void expect_error(const char *body, enum openai_kind kind, const char *param, const char *needle) {
    struct openai_request r;
    struct openai_error e;
    if (parse(body, kind, &r, &e) == 0) {
        openai_request_free(&r);
        fail_msg("accepted: %s", body);
    }
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, param);
    if (!strstr(e.message, needle)) fail_msg("message [%s] lacks [%s]", e.message, needle);
}

static void response_format_becomes_the_grammar(void **state) {
    struct openai_request r;
    struct openai_error e;
    const char *b = "{\"prompt\":\"x\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\","
                    "\"strict\":true,\"schema\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}}}}}";
    assert_int_equal(parse(b, OPENAI_COMPLETION, &r, &e), 0);
    assert_int_equal(r.sp.grammar.kind, ENGINE_GRAMMAR_JSON_SCHEMA);
    assert_string_equal(r.sp.grammar.schema, "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}}");
    assert_false(r.sp.grammar.wrapped);
    openai_request_free(&r);
    assert_int_equal(parse("{" MSG ",\"response_format\":{\"type\":\"json_object\"}}", OPENAI_CHAT, &r, &e), 0);
    assert_int_equal(r.sp.grammar.kind, ENGINE_GRAMMAR_JSON_OBJECT);
    openai_request_free(&r);
    assert_int_equal(parse("{\"prompt\":\"x\",\"response_format\":{\"type\":\"text\"}}", OPENAI_COMPLETION, &r, &e), 0);
    assert_int_equal(r.sp.grammar.kind, ENGINE_GRAMMAR_NONE);
    openai_request_free(&r);
    /* vLLM's fields: guided_json (object or text), structured_outputs */
    assert_int_equal(parse("{\"prompt\":\"x\",\"guided_json\":\"{\\\"type\\\":\\\"boolean\\\"}\"}", OPENAI_COMPLETION, &r, &e), 0);
    assert_string_equal(r.sp.grammar.schema, "{\"type\":\"boolean\"}");
    openai_request_free(&r);
    assert_int_equal(parse("{\"prompt\":\"x\",\"structured_outputs\":{\"json\":{\"type\":\"null\"}}}", OPENAI_COMPLETION, &r, &e), 0);
    assert_string_equal(r.sp.grammar.schema, "{\"type\":\"null\"}");
    openai_request_free(&r);
    assert_int_equal(parse("{\"prompt\":\"x\",\"structured_outputs\":{\"json_object\":true}}", OPENAI_COMPLETION, &r, &e), 0);
    assert_int_equal(r.sp.grammar.kind, ENGINE_GRAMMAR_JSON_OBJECT);
    openai_request_free(&r);
}

static void bad_structured_fields_are_400s(void **state) {
    expect_error("{\"prompt\":\"x\",\"response_format\":\"json\"}", OPENAI_COMPLETION, "response_format", "type");
    expect_error("{\"prompt\":\"x\",\"response_format\":{\"type\":\"yaml\"}}", OPENAI_COMPLETION, "response_format", "yaml");
    expect_error("{\"prompt\":\"x\",\"response_format\":{\"type\":\"json_schema\"}}", OPENAI_COMPLETION, "response_format",
                 "json_schema");
    expect_error("{\"prompt\":\"x\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\"}}}",
                 OPENAI_COMPLETION, "response_format", "schema");
    expect_error("{\"prompt\":\"x\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{},"
                 "\"strict\":1}}}", OPENAI_COMPLETION, "response_format", "strict");
    expect_error("{\"prompt\":\"x\",\"response_format\":{\"type\":\"json_object\",\"extra\":1}}", OPENAI_COMPLETION,
                 "response_format", "extra");
    expect_error("{\"prompt\":\"x\",\"guided_json\":3}", OPENAI_COMPLETION, "guided_json", "JSON Schema");
    expect_error("{\"prompt\":\"x\",\"guided_json\":{},\"response_format\":{\"type\":\"json_object\"}}", OPENAI_COMPLETION,
                 "response_format", "only one");
    expect_error("{\"prompt\":\"x\",\"structured_outputs\":{\"json\":{},\"json_object\":true}}", OPENAI_COMPLETION,
                 "structured_outputs", "one of");
}

static void tools_and_tool_choice(void **state) {
    struct openai_request r;
    struct openai_error e;
    assert_int_equal(parse("{" MSG "," TOOLS "}", OPENAI_CHAT, &r, &e), 0);
    assert_int_equal(r.st.tool_mode, OPENAI_TOOLS_AUTO);
    assert_true(r.st.parallel_tool_calls);
    assert_int_equal(cJSON_GetArraySize(r.st.tools), 2);
    assert_int_equal(r.sp.grammar.kind, ENGINE_GRAMMAR_NONE); /* auto: the model chooses */
    openai_request_free(&r);
    assert_int_equal(parse("{" MSG "," TOOLS ",\"tool_choice\":\"none\"}", OPENAI_CHAT, &r, &e), 0);
    assert_int_equal(r.st.tool_mode, OPENAI_TOOLS_OFF);
    openai_request_free(&r);
    assert_int_equal(parse("{" MSG "," TOOLS ",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"now\"}},"
                           "\"parallel_tool_calls\":false}", OPENAI_CHAT, &r, &e), 0);
    assert_int_equal(r.st.tool_mode, OPENAI_TOOLS_NAMED);
    assert_string_equal(r.st.tool_name, "now");
    assert_false(r.st.parallel_tool_calls);
    openai_request_free(&r);
    /* tokenize renders tools too */
    assert_int_equal(parse("{" MSG "," TOOLS "}", OPENAI_TOKENIZE, &r, &e), 0);
    assert_non_null(r.st.tools);
    openai_request_free(&r);
    expect_error("{" MSG ",\"tools\":{}}", OPENAI_CHAT, "tools", "array");
    expect_error("{" MSG ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a b\"}}]}", OPENAI_CHAT, "tools",
                 "name");
    expect_error("{" MSG ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\",\"parameters\":[]}}]}", OPENAI_CHAT,
                 "tools", "parameters");
    expect_error("{" MSG ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\"}},{\"type\":\"function\","
                 "\"function\":{\"name\":\"a\"}}]}", OPENAI_CHAT, "tools", "twice");
    expect_error("{" MSG ",\"tool_choice\":\"required\"}", OPENAI_CHAT, "tool_choice", "needs 'tools'");
    expect_error("{" MSG "," TOOLS ",\"tool_choice\":\"always\"}", OPENAI_CHAT, "tool_choice", "required");
    expect_error("{" MSG "," TOOLS ",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"x\"}}}", OPENAI_CHAT,
                 "tool_choice", "not in 'tools'");
    expect_error("{" MSG "," TOOLS ",\"parallel_tool_calls\":1}", OPENAI_CHAT, "parallel_tool_calls", "boolean");
    expect_error("{" MSG "," TOOLS ",\"tool_choice\":\"required\",\"response_format\":{\"type\":\"json_object\"}}",
                 OPENAI_CHAT, "tool_choice", "cannot be combined");
}

/* Whether the grammar of r accepts text whole. */
static bool grammar_accepts(const struct openai_request *r, const char *text) {
    struct grammar *g = NULL;
    char err[256];
    const struct engine_grammar *eg = &r->sp.grammar;
    int rc = grammar_compile_wrapped(&g, eg->schema, strlen(eg->schema), eg->wrapped ? &eg->wrap : NULL, NULL, err,
                                     sizeof err);
    if (rc) fail_msg("compile: %s", err);
    struct grammar_state *s;
    assert_int_equal(grammar_state_init(&s, g), 0);
    bool ok = grammar_state_advance(s, text, strlen(text)) == 0 && grammar_state_accepting(s);
    grammar_state_free(s);
    grammar_free(g);
    return ok;
}

/* tool_choice required / named: the calls in each syntax, parameters' $refs still resolving. */
static void forced_calls_grammar_per_syntax(void **state) {
    static const struct {
        enum openai_tool_syntax syntax;
        const char *good, *second, *bad;
    } cases[] = {
        {OPENAI_TOOL_SYNTAX_HERMES, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"unit\": \"C\"}}\n</tool_call>",
         "\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>",
         "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}"},
        {OPENAI_TOOL_SYNTAX_LLAMA3, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}",
         "; {\"name\": \"now\", \"parameters\": {}}", "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}"},
        {OPENAI_TOOL_SYNTAX_MISTRAL, "[{\"name\": \"now\", \"arguments\": {}}", ", {\"name\": \"now\", \"arguments\": {}}",
         "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"unit\": \"K\"}}]"},
        {OPENAI_TOOL_SYNTAX_JSON, "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"\"}}",
         ", {\"name\": \"get_weather\", \"arguments\": {\"city\": \"x\"}}", "[{\"name\": \"later\", \"arguments\": {}}]"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        for (int parallel = 0; parallel < 2; parallel++) {
            struct openai_request r;
            struct openai_error e;
            char body[2048];
            snprintf(body, sizeof body, "{" MSG "," TOOLS ",\"tool_choice\":\"required\",\"parallel_tool_calls\":%s}",
                     parallel ? "true" : "false");
            assert_int_equal(parse(body, OPENAI_CHAT, &r, &e), 0);
            assert_int_equal(openai_tools_grammar(&r, cases[c].syntax, &e), 0);
            bool list = cases[c].syntax == OPENAI_TOOL_SYNTAX_MISTRAL || cases[c].syntax == OPENAI_TOOL_SYNTAX_JSON;
            char one[1024], two[2048];
            snprintf(one, sizeof one, "%s%s", cases[c].good, list ? "]" : "");
            snprintf(two, sizeof two, "%s%s%s", cases[c].good, cases[c].second, list ? "]" : "");
            assert_true(grammar_accepts(&r, one));
            assert_int_equal(grammar_accepts(&r, two), parallel);
            assert_false(grammar_accepts(&r, cases[c].bad));
            openai_request_free(&r);
        }
    }
    /* named: only that function */
    struct openai_request r;
    struct openai_error e;
    assert_int_equal(parse("{" MSG "," TOOLS ",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"now\"}}}",
                           OPENAI_CHAT, &r, &e), 0);
    assert_int_equal(openai_tools_grammar(&r, OPENAI_TOOL_SYNTAX_HERMES, &e), 0);
    assert_true(grammar_accepts(&r, "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>"));
    assert_false(grammar_accepts(&r, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"a\"}}\n</tool_call>"));
    assert_false(grammar_accepts(&r, "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n"
                                     "{\"name\": \"now\", \"arguments\": {}}\n</tool_call>"));
    /* a compile error names the tool and the place in its parameters */
    char m[512];
    openai_tools_grammar_error(&r, "unsupported JSON Schema keyword 'pattern' (at #/properties/arguments/properties/x)", m,
                               sizeof m);
    assert_string_equal(m, "'tools[1].function.parameters': unsupported JSON Schema keyword 'pattern' (at #/properties/x)");
    openai_request_free(&r);
    assert_int_equal(parse("{" MSG "," TOOLS ",\"tool_choice\":\"required\"}", OPENAI_CHAT, &r, &e), 0);
    assert_int_equal(openai_tools_grammar(&r, OPENAI_TOOL_SYNTAX_JSON, &e), 0);
    openai_tools_grammar_error(&r, "bad (at #/anyOf/0/properties/arguments/$defs/u)", m, sizeof m);
    assert_string_equal(m, "'tools[0].function.parameters': bad (at #/$defs/u)");
    openai_request_free(&r);
    assert_int_equal(parse("{\"prompt\":\"x\",\"guided_json\":{}}", OPENAI_COMPLETION, &r, &e), 0);
    openai_tools_grammar_error(&r, "boom", m, sizeof m);
    assert_string_equal(m, "'guided_json': boom");
    openai_request_free(&r);
}

static void tool_call_arguments_reach_templates_parsed(void **state) {
    cJSON *m = cJSON_Parse("[{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"id\":\"a\",\"type\":\"function\","
                           "\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"x\\\": [1, 2]}\"}},{\"id\":\"b\",\"type\":"
                           "\"function\",\"function\":{\"name\":\"g\",\"arguments\":\"not json\"}}]}]");
    assert_int_equal(openai_tools_template_messages(m), 0);
    char *s = cJSON_PrintUnformatted(m);
    assert_non_null(strstr(s, "\"arguments\":{\"x\":[1,2]}"));
    assert_non_null(strstr(s, "\"arguments\":\"not json\""));
    free(s);
    cJSON_Delete(m);
}

/* The same text as a message and as a stream: the deltas reassemble into the message. */
static void message_and_stream_agree(void **state) {
    struct openai_request r;
    struct openai_error e;
    assert_int_equal(parse("{" MSG "," TOOLS "}", OPENAI_CHAT, &r, &e), 0);
    assert_int_equal(openai_tools_grammar(&r, OPENAI_TOOL_SYNTAX_HERMES, &e), 0);
    struct openai_resp_ctx ctx = {.kind = OPENAI_CHAT, .id = "chatcmpl-1", .model = "m", .created = 1, .logprobs = -1};
    const char *pieces[] = {"Sure.", "\n<tool", "_call>\n{\"name\": \"get_", "weather\", \"arguments\": {\"ci",
                            "ty\": \"Oslo\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}",
                            "\n</tool_call>"};
    struct openai_choice plain, streamed;
    openai_choice_init(&plain);
    openai_choice_init(&streamed);
    assert_int_equal(openai_choice_init_tools(&plain, &r, 9), 0);
    assert_int_equal(openai_choice_init_tools(&streamed, &r, 9), 0);
    char content[256] = "", args[2][256] = {"", ""}, names[2][64] = {"", ""}, finish[32] = "";
    int n_calls = 0;
    for (size_t i = 0; i <= sizeof pieces / sizeof *pieces; i++) {
        bool last = i == sizeof pieces / sizeof *pieces;
        struct engine_event ev = {.type = last ? ENGINE_EVENT_FINISH : ENGINE_EVENT_TOKEN, .finish = ENGINE_FINISH_STOP,
                                  .stop_index = -1, .stop_reason_id = -1};
        ev.text = strdup(last ? "" : pieces[i]);
        assert_int_equal(openai_choice_add_event(&plain, &ev, false), 0);
        char *sse = openai_chunk_tools_sse(&ctx, 0, &streamed, &ev);
        assert_non_null(sse);
        for (char *line = strtok(sse, "\n"); line; line = strtok(NULL, "\n")) {
            assert_memory_equal(line, "data: ", 6);
            cJSON *j = cJSON_Parse(line + 6);
            const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
            const cJSON *d = cJSON_GetObjectItem(ch, "delta"), *fr = cJSON_GetObjectItem(ch, "finish_reason");
            if (cJSON_IsString(fr)) snprintf(finish, sizeof finish, "%s", fr->valuestring);
            const cJSON *c = cJSON_GetObjectItem(d, "content");
            if (cJSON_IsString(c)) strcat(content, c->valuestring);
            const cJSON *tc = cJSON_GetArrayItem(cJSON_GetObjectItem(d, "tool_calls"), 0);
            if (tc) {
                int k = (int)cJSON_GetObjectItem(tc, "index")->valuedouble;
                const cJSON *fn = cJSON_GetObjectItem(tc, "function"), *nm = cJSON_GetObjectItem(fn, "name");
                if (nm) {
                    assert_int_equal(k, n_calls++);
                    strcpy(names[k], nm->valuestring);
                    assert_string_equal(cJSON_GetObjectItem(tc, "type")->valuestring, "function");
                    assert_memory_equal(cJSON_GetObjectItem(tc, "id")->valuestring, "call_", 5);
                }
                strcat(args[k], cJSON_GetObjectItem(fn, "arguments")->valuestring);
            }
            cJSON_Delete(j);
        }
        free(sse);
        free(ev.text);
    }
    plain.finish = ENGINE_FINISH_STOP;
    char *resp = openai_response_json(&ctx, &plain, 1, NULL);
    cJSON *j = cJSON_Parse(resp);
    const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    const cJSON *msg = cJSON_GetObjectItem(ch, "message");
    assert_string_equal(cJSON_GetObjectItem(ch, "finish_reason")->valuestring, "tool_calls");
    assert_string_equal(finish, "tool_calls");
    assert_string_equal(cJSON_GetObjectItem(msg, "content")->valuestring, content);
    assert_string_equal(content, "Sure.");
    const cJSON *calls = cJSON_GetObjectItem(msg, "tool_calls");
    assert_int_equal(cJSON_GetArraySize(calls), 2);
    assert_int_equal(n_calls, 2);
    for (int k = 0; k < 2; k++) {
        const cJSON *fn = cJSON_GetObjectItem(cJSON_GetArrayItem(calls, k), "function");
        assert_string_equal(cJSON_GetObjectItem(fn, "name")->valuestring, names[k]);
        assert_string_equal(cJSON_GetObjectItem(fn, "arguments")->valuestring, args[k]);
    }
    assert_string_equal(args[0], "{\"city\": \"Oslo\"}");
    assert_string_equal(names[1], "now");
    cJSON_Delete(j);
    free(resp);
    openai_choice_free(&plain);
    openai_choice_free(&streamed);
    openai_request_free(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(response_format_becomes_the_grammar),
        cmocka_unit_test(bad_structured_fields_are_400s),
        cmocka_unit_test(tools_and_tool_choice),
        cmocka_unit_test(forced_calls_grammar_per_syntax),
        cmocka_unit_test(tool_call_arguments_reach_templates_parsed),
        cmocka_unit_test(message_and_stream_agree),
    };
    return cmocka_run_group_tests_name("openai_tools", tests, NULL, NULL);
}
