/* Tests of engine/text/jinja and engine/text/chat_template.
 * Golden: every case of ../shared/chat-templates/expected_renders.json renders to its HF text
 * with the model's own template (DUO_SHARED overrides ../shared; skipped with a message when
 * the fixtures are missing). Unit tests: one per construct, expected strings taken from
 * jinja2 3.1 with transformers' environment (trim_blocks, lstrip_blocks, loopcontrols). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "engine/text/chat_template.h"
#include "engine/text/jinja.h"

/* ---- helpers -------------------------------------------------------------------------- */

static const char *shared_dir(void) {
    const char *d = getenv("DUO_SHARED");
    return d && *d ? d : "../shared";
}

/* Path under the shared fixtures, or NULL (after saying why) when it is missing. */
static char *fixture(const char *rel) {
    size_t n = strlen(shared_dir()) + strlen(rel) + 2;
    char *p = malloc(n);
    assert_non_null(p);
    snprintf(p, n, "%s/%s", shared_dir(), rel);
    if (access(p, R_OK) != 0) {
        print_message("SKIP: fixture %s not found (set DUO_SHARED to the shared/ directory)\n", p);
        free(p);
        return NULL;
    }
    return p;
}

static cJSON *parse_json(const char *text) {
    cJSON *j = cJSON_Parse(text);
    if (!j) fail_msg("bad JSON in test: %s", text);
    return j;
}

/* Renders tpl with HF options and vars (JSON text or NULL); returns the status. */
static int try_render_opts(const char *tpl, const struct jinja_options *opt, const char *vars,
                           const struct jinja_limits *lim, char **out, char *err, size_t errlen) {
    struct jinja_template *t = NULL;
    *out = NULL;
    int rc = jinja_parse(tpl, strlen(tpl), opt, &t, err, errlen);
    if (rc != JINJA_OK) return rc;
    cJSON *v = vars ? parse_json(vars) : NULL;
    rc = jinja_render(t, v, lim, out, NULL, err, errlen);
    cJSON_Delete(v);
    jinja_free(t);
    return rc;
}

static int try_render(const char *tpl, const char *vars, char **out, char *err, size_t errlen) {
    return try_render_opts(tpl, NULL, vars, NULL, out, err, errlen);
}

#define check_render(tpl, vars, expected) check_render_at(tpl, vars, expected, __FILE__, __LINE__)

static void check_render_at(const char *tpl, const char *vars, const char *expected,
                            const char *file, int line) {
    char *out = NULL, err[512] = "";
    int rc = try_render(tpl, vars, &out, err, sizeof err);
    if (rc != JINJA_OK) {
        print_error("%s:%d: render of %s failed (%d): %s\n", file, line, tpl, rc, err);
        _fail(file, line);
    }
    if (strcmp(out, expected) != 0) {
        print_error("%s:%d: template %s\n  got      \"%s\"\n  expected \"%s\"\n", file, line, tpl,
                    out, expected);
        free(out);
        _fail(file, line);
    }
    free(out);
}

/* Expects the render (or parse) to fail with status and a message containing `part`. */
#define check_error(tpl, vars, status, part) \
    check_error_at(tpl, vars, status, part, __FILE__, __LINE__)

static void check_error_at(const char *tpl, const char *vars, int status, const char *part,
                           const char *file, int line) {
    char *out = NULL, err[512] = "";
    int rc = try_render(tpl, vars, &out, err, sizeof err);
    if (rc != status || !strstr(err, part)) {
        print_error("%s:%d: template %s: status %d (want %d), message \"%s\" (want \"%s\"), "
                    "output \"%s\"\n",
                    file, line, tpl, rc, status, err, part, out ? out : "");
        free(out);
        _fail(file, line);
    }
    assert_null(out);
}

/* ---- golden renders against HF ------------------------------------------------------- */

static void check_expected_renders(const char *name) {
    char rel[128];
    snprintf(rel, sizeof rel, "tokenizers/%s", name);
    char *dir = fixture(rel);
    char *exp_path = fixture("chat-templates/expected_renders.json");
    if (!dir || !exp_path) {
        free(dir);
        free(exp_path);
        skip();
    }
    struct chat_template *ct = NULL;
    char err[512] = "";
    int rc = chat_template_load(dir, NULL, &ct, err, sizeof err);
    if (rc != CHAT_TEMPLATE_OK) fail_msg("load %s: %s", dir, err);

    FILE *f = fopen(exp_path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)n + 1);
    assert_non_null(text);
    assert_int_equal(fread(text, 1, (size_t)n, f), (size_t)n);
    text[n] = 0;
    fclose(f);
    cJSON *all = parse_json(text);
    free(text);

    const cJSON *cases = cJSON_GetObjectItemCaseSensitive(all, name);
    assert_true(cJSON_IsObject(cases));
    int total = 0, passed = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(c, "messages");
        const cJSON *gen = cJSON_GetObjectItemCaseSensitive(c, "add_generation_prompt");
        const cJSON *want = cJSON_GetObjectItemCaseSensitive(c, "text");
        assert_true(cJSON_IsArray(msgs) && cJSON_IsBool(gen) && cJSON_IsString(want));
        char *out = NULL;
        total++;
        rc = chat_template_render(ct, msgs, cJSON_IsTrue(gen), chat_template_bos_token(ct),
                                  chat_template_eos_token(ct), NULL, &out, err, sizeof err);
        if (rc != CHAT_TEMPLATE_OK) {
            print_error("%s %s: render failed: %s\n", name, c->string, err);
        } else if (strcmp(out, want->valuestring) != 0) {
            print_error("%s %s:\n  got      \"%s\"\n  expected \"%s\"\n", name, c->string, out,
                        want->valuestring);
        } else {
            passed++;
        }
        free(out);
    }
    print_message("%s: %d/%d expected_renders cases match\n", name, passed, total);
    cJSON_Delete(all);
    chat_template_free(ct);
    free(dir);
    free(exp_path);
    assert_true(total > 0);
    assert_int_equal(passed, total);
}

static void test_expected_renders_llama2(void **state) { check_expected_renders("llama2"); }
static void test_expected_renders_llama3(void **state) { check_expected_renders("llama3"); }
static void test_expected_renders_qwen3(void **state) { check_expected_renders("qwen3"); }

static void test_mistral_v01_has_no_chat_template(void **state) {
    char *dir = fixture("tokenizers/mistral-v0.1");
    if (!dir) skip();
    struct chat_template *ct = (struct chat_template *)1;
    char err[512] = "";
    assert_int_equal(chat_template_load(dir, NULL, &ct, err, sizeof err), CHAT_TEMPLATE_ERR_NONE);
    assert_null(ct);
    assert_non_null(strstr(err, "no chat template"));
    // A server keeping the NULL template gets the same distinct status per chat request.
    cJSON *msgs = parse_json("[{\"role\":\"user\",\"content\":\"hi\"}]");
    char *out = NULL;
    assert_int_equal(
        chat_template_render(NULL, msgs, true, "<s>", "</s>", NULL, &out, err, sizeof err),
        CHAT_TEMPLATE_ERR_NONE);
    assert_null(out);
    assert_non_null(strstr(err, "no chat template"));
    cJSON_Delete(msgs);
    free(dir);
}

static void test_special_tokens_from_tokenizer_config(void **state) {
    char *l2 = fixture("tokenizers/llama2"), *q3 = fixture("tokenizers/qwen3");
    if (!l2 || !q3) {
        free(l2);
        free(q3);
        skip();
    }
    struct chat_template *ct = NULL;
    char err[512];
    assert_int_equal(chat_template_load(l2, NULL, &ct, err, sizeof err), CHAT_TEMPLATE_OK);
    assert_string_equal(chat_template_bos_token(ct), "<s>");
    assert_string_equal(chat_template_eos_token(ct), "</s>");
    chat_template_free(ct);
    assert_int_equal(chat_template_load(q3, NULL, &ct, err, sizeof err), CHAT_TEMPLATE_OK);
    assert_null(chat_template_bos_token(ct)); // "bos_token": null
    assert_string_equal(chat_template_eos_token(ct), "<|im_end|>");
    chat_template_free(ct);
    free(l2);
    free(q3);
}

/* The tool-call syntax a template shows: Qwen's <tool_call> tags, Mistral's [TOOL_CALLS], Llama
 * 3.1's ipython role, or none (llama2, llama3 (3.0)). */
static void test_tool_syntax_from_the_template_text(void **state) {
    static const struct {
        const char *src;
        enum chat_template_tools want;
    } cases[] = {
        {"{{ '<tool_call>' }}{{ messages[0].content }}", CHAT_TEMPLATE_TOOLS_HERMES},
        {"{% if tools %}[AVAILABLE_TOOLS]{% endif %}{{ '[TOOL_CALLS]' }}", CHAT_TEMPLATE_TOOLS_MISTRAL},
        {"{{ '<|start_header_id|>ipython<|end_header_id|>' }}", CHAT_TEMPLATE_TOOLS_LLAMA3},
        {"{{ '<|python_tag|>' }}", CHAT_TEMPLATE_TOOLS_LLAMA3},
        {"{% for m in messages %}{{ m.content }}{% endfor %}", CHAT_TEMPLATE_TOOLS_UNKNOWN},
    };
    char err[256];
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        struct chat_template *ct = NULL;
        assert_int_equal(chat_template_from_string(cases[i].src, strlen(cases[i].src), NULL, NULL, &ct, err, sizeof err),
                         CHAT_TEMPLATE_OK);
        assert_int_equal(chat_template_tool_syntax(ct), cases[i].want);
        chat_template_free(ct);
    }
    assert_int_equal(chat_template_tool_syntax(NULL), CHAT_TEMPLATE_TOOLS_UNKNOWN);
    static const struct {
        const char *dir;
        enum chat_template_tools want;
    } models[] = {{"tokenizers/qwen3", CHAT_TEMPLATE_TOOLS_HERMES},
                  {"tokenizers/llama3", CHAT_TEMPLATE_TOOLS_UNKNOWN},
                  {"tokenizers/llama2", CHAT_TEMPLATE_TOOLS_UNKNOWN}};
    for (size_t i = 0; i < sizeof models / sizeof *models; i++) {
        char *dir = fixture(models[i].dir);
        if (!dir) continue;
        struct chat_template *ct = NULL;
        assert_int_equal(chat_template_load(dir, NULL, &ct, err, sizeof err), CHAT_TEMPLATE_OK);
        assert_int_equal(chat_template_tool_syntax(ct), models[i].want);
        chat_template_free(ct);
        free(dir);
    }
}

static void test_llama2_role_alternation_raises_with_exception_text(void **state) {
    char *dir = fixture("tokenizers/llama2");
    if (!dir) skip();
    struct chat_template *ct = NULL;
    char err[512] = "";
    assert_int_equal(chat_template_load(dir, NULL, &ct, err, sizeof err), CHAT_TEMPLATE_OK);
    cJSON *msgs =
        parse_json("[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\",\"content\":\"b\"}]");
    char *out = NULL;
    assert_int_equal(
        chat_template_render(ct, msgs, true, "<s>", "</s>", NULL, &out, err, sizeof err),
        CHAT_TEMPLATE_ERR_RAISED);
    assert_null(out);
    assert_string_equal(err, "Conversation roles must alternate user/assistant/user/assistant/...");
    cJSON_Delete(msgs);
    chat_template_free(ct);
    free(dir);
}

/* The qwen3 template's tool and reasoning paths, against jinja2's output. */
static void test_qwen3_tools_and_reasoning(void **state) {
    char *dir = fixture("tokenizers/qwen3");
    if (!dir) skip();
    struct chat_template *ct = NULL;
    char err[512] = "";
    assert_int_equal(chat_template_load(dir, NULL, &ct, err, sizeof err), CHAT_TEMPLATE_OK);
    cJSON *msgs = parse_json(
        "[{\"role\":\"user\",\"content\":\"Weather?\"},"
        "{\"role\":\"assistant\",\"content\":\"<think>\\nneed tool\\n</think>\\n\\nLet me check.\","
        "\"tool_calls\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
        "\"arguments\":{\"city\":\"Paris\",\"days\":2}}}]},"
        "{\"role\":\"tool\",\"content\":\"{\\\"temp\\\": 20}\"},"
        "{\"role\":\"tool\",\"content\":\"sunny\"}]");
    cJSON *extra =
        parse_json("{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                   "\"parameters\":{\"type\":\"object\"}}}],\"enable_thinking\":false}");
    char *out = NULL;
    assert_int_equal(
        chat_template_render(ct, msgs, true, NULL, "<|im_end|>", extra, &out, err, sizeof err),
        CHAT_TEMPLATE_OK);
    assert_string_equal(
        out,
        "<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user "
        "query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n"
        "<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
        "\"parameters\": {\"type\": \"object\"}}}\n</tools>\n\nFor each function call, return a "
        "json object with function name and arguments within <tool_call></tool_call> XML tags:\n"
        "<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
        "</tool_call><|im_end|>\n<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n"
        "<think>\nneed tool\n</think>\n\nLet me check.\n<tool_call>\n{\"name\": \"get_weather\", "
        "\"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n{\"temp\": 20}\n</tool_response>\n<tool_response>\n"
        "sunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
    free(out);
    cJSON_Delete(msgs);
    cJSON_Delete(extra);
    chat_template_free(ct);
    free(dir);
}

/* ---- statements ----------------------------------------------------------------------- */

static void test_for_loop_variables(void **state) {
    check_render("{% for x in ['a','b','c'] %}{{ loop.index }}{{ loop.index0 }}{{ x }}"
                 "{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }} {% endfor %}",
                 NULL, "10aTrueFalse33 21bFalseFalse32 32cFalseTrue31 ");
    check_render("{% for x in [1,2,3] %}{{ loop.previtem }}-{{ loop.nextitem }}"
                 "{{ loop.cycle('o','e') }};{% endfor %}",
                 NULL, "-2o;1-3e;2-o;");
}

static void test_for_loop_over_dict_items_keys_and_string(void **state) {
    check_render("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}|"
                 "{% for k in d %}{{ k }}{% endfor %}|{% for k, v in d|items %}{{ v }}{% endfor %}|"
                 "{% for ch in 'hé!' %}[{{ ch }}]{% endfor %}",
                 "{\"d\":{\"b\":1,\"a\":2}}", "b=1;a=2;|ba|12|[h][é][!]");
}

static void test_for_else_filter_and_loop_controls(void **state) {
    check_render("{% for x in [] %}x{% else %}empty{% endfor %}", NULL, "empty");
    check_render("{% for x in [1,2,3,4] if x is even %}{{ x }}/{{ loop.length }} {% endfor %}",
                 NULL, "2/2 4/2 ");
    check_render("{% for x in [1,2,3,4] %}{% if x == 2 %}{% continue %}{% endif %}"
                 "{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}",
                 NULL, "13");
    check_render("{% for r in [[1,2],[3]] %}{% for x in r %}{{ loop.index }}{{ x }}{% endfor %}"
                 "({{ loop.index }}){% endfor %}",
                 NULL, "1122(1)13(2)");
}

static void test_for_loop_body_is_a_fresh_scope(void **state) {
    // jinja: assignments in a loop body do not survive the iteration nor the loop
    check_render("{% set y = 1 %}{% for i in [1,2] %}[{{ y }}]{% set y = 5 %}[{{ y }}]{% endfor %}"
                 "[{{ y }}]",
                 NULL, "[1][5][1][5][1]");
    check_render(
        "{% for i in [1,2] %}{% if i == 1 %}{% set z = 5 %}{% endif %}[{{ z }}]{% endfor %}", NULL,
        "[5][]");
    check_render("{% set x = 1 %}{% if true %}{% set x = 2 %}{% endif %}{{ x }}", NULL, "2");
}

static void test_if_elif_else(void **state) {
    const char *t =
        "{% if n == 1 %}one{% elif n == 2 %}two{% elif n > 2 %}many{% else %}none{% endif %}";
    check_render(t, "{\"n\":1}", "one");
    check_render(t, "{\"n\":2}", "two");
    check_render(t, "{\"n\":7}", "many");
    check_render(t, "{\"n\":0}", "none");
    check_render("{% if [] %}a{% elif {} %}b{% elif '' %}c{% elif 0.0 %}d{% else %}e{% endif %}",
                 NULL, "e");
}

static void test_namespace_set_in_loop(void **state) {
    check_render(
        "{% set ns = namespace(found=false, n=0, last='') %}"
        "{% for m in messages %}{% set ns.n = ns.n + 1 %}"
        "{% if m.role == 'user' %}{% set ns.found = true %}{% set ns.last = m.content %}{% endif %}"
        "{% endfor %}{{ ns.found }} {{ ns.n }} {{ ns.last }} {{ ns.missing is defined }}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"assistant\","
        "\"content\":\"b\"},{\"role\":\"user\",\"content\":\"c\"}]}",
        "True 3 c False");
    check_render("{% set ns = namespace(a=1) %}{% set ns.a = 2 %}{{ ns }}", NULL,
                 "<Namespace {'a': 2}>");
    check_error("{% set d = {} %}{% set d.x = 1 %}", NULL, JINJA_ERR_RENDER, "non-namespace");
}

static void test_set_tuple_and_block_set(void **state) {
    check_render("{% set a, b = 1, 'x' %}{{ a }}{{ b }}{% set c, d = [3, 4] %}{{ c + d }}", NULL,
                 "1x7");
    check_render(
        "{% set x %}in{{ 1 + 1 }}{% endset %}[{{ x }}]{% set y | upper %}s{% endset %}{{ y }}",
        NULL, "[in2]S");
    check_render("{% filter upper %}a{{ 'b' }}{% endfilter %}", NULL, "AB");
    check_render("{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ a }}]", NULL, "3[]");
}

static void test_macros(void **state) {
    check_render("{% macro f(a, b='d') %}[{{ a }}{{ b }}]{% endmacro %}{{ f(1) }}{{ f(1, b=2) }}"
                 "{{ f(b=3, a=4) }}",
                 NULL, "[1d][12][43]");
    check_render(
        "{% macro r(n) %}{% if n > 0 %}{{ n }}{{ r(n - 1) }}{% endif %}{% endmacro %}{{ r(4) }}",
        NULL, "4321");
    check_render("{% macro m() %}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, k=2) }}", NULL,
                 "(1,){'k': 2}");
}

static void test_generation_block_renders_its_body(void **state) {
    check_render("a{% generation %}b{{ 1 }}{% endgeneration %}c", NULL, "ab1c");
}

/* ---- expressions ---------------------------------------------------------------------- */

static void test_comparisons_and_logic(void **state) {
    check_render("{{ 1 < 2 < 3 }}{{ 1 < 2 > 3 }}{{ 1 == 1.0 }}{{ 'a' != 'b' }}{{ [1] == [1] }}"
                 "{{ 'b' >= 'a' }}",
                 NULL, "TrueFalseTrueTrueTrueTrue");
    check_render(
        "{{ not true }}|{{ true and 'x' }}|{{ false or 'y' }}|{{ '' or 0 }}|{{ none and 1 }}", NULL,
        "False|x|y|0|None");
    check_render("{{ 1 in [1,2] }}{{ 'b' in 'abc' }}{{ 'a' in {'a':1} }}{{ 3 not in [1,2] }}", NULL,
                 "TrueTrueTrueTrue");
}

static void test_tests(void **state) {
    check_render("{{ x is defined }}{{ y is defined }}{{ n is none }}{{ 'a' is string }}"
                 "{{ 1 is number }}{{ 1 is integer }}{{ 1.5 is float }}{{ true is boolean }}"
                 "{{ {} is mapping }}{{ [] is iterable }}{{ 3 is odd }}{{ 4 is even }}"
                 "{{ 9 is divisibleby 3 }}{{ f is false }}{{ 0 is false }}{{ n is not none }}"
                 "{{ y is undefined }}{{ 2 is in [1,2] }}{{ 'x' is equalto 'x' }}",
                 "{\"x\":1,\"n\":null,\"f\":false}",
                 "TrueFalseTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueFalseFalseTrueTrueTrue");
}

static void test_arithmetic_python_semantics(void **state) {
    check_render("{{ 7 // 2 }} {{ -7 // 2 }} {{ -3 % 2 }} {{ 7 / 2 }} {{ 4 / 2 }} {{ 2 ** 10 }} "
                 "{{ 1 + 2.5 }} {{ 10 - 2 * 3 }} {{ true + 1 }} {{ 7.5 % 2 }}",
                 NULL, "3 -4 1 3.5 2.0 1024 3.5 4 2 1.5");
    check_render("{{ 'ab' * 3 }}{{ [1] + [2] }}{{ 'a' ~ 1 ~ none ~ true }}{{ 'a' ~ 2 * 3 }}", NULL,
                 "ababab[1, 2]a1NoneTruea6");
    check_error("{{ 1 ~ 2 + 3 }}", NULL, JINJA_ERR_RENDER,
                "unsupported operand"); // ~ binds tighter
    check_error("{{ 'a' + 1 }}", NULL, JINJA_ERR_RENDER, "unsupported operand");
    check_error("{{ 1 // 0 }}", NULL, JINJA_ERR_RENDER, "by zero");
}

static void test_subscripts_slices_and_attributes(void **state) {
    const char *v =
        "{\"m\":[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\",\"content\":\"U\"}]}";
    check_render("{{ m[0].role }}{{ m[-1]['content'] }}{{ m[1:][0].role }}{{ m[::-1][0].role }}"
                 "{{ m|length - 1 }}{{ m[5] is defined }}{{ m[0].nope is defined }}",
                 v, "systemUuseruser1FalseFalse");
    check_render("{{ 'abcdef'[::-1] }} {{ 'abcdef'[1:4] }} {{ 'abcdef'[-2:] }} {{ 'abcdef'[::2] }} "
                 "{{ [1,2,3,4,5][1:4:2] }} {{ 'héllo'[1] }}{{ 'héllo'[::-1] }}",
                 NULL, "fedcba bcd ef ace [2, 4] éolléh");
    check_render("{{ {'a': {'b': [10, 20]}}.a.b[1] }}{{ {'a': 1}['a'] }}{{ [[1,2]][0].1 }}", NULL,
                 "2012");
}

static void test_inline_if_else(void **state) {
    check_render("{{ 'y' if t else 'n' }}{{ 'y' if f else 'n' }}[{{ 'y' if f }}]",
                 "{\"t\":true,\"f\":false}", "yn[]");
}

static void test_value_printing_like_python(void **state) {
    check_render("{{ [1, 'a', none, true, 1.5, {'k': [2]}] }} {{ (1,) }} {{ none }} {{ false }}",
                 NULL, "[1, 'a', None, True, 1.5, {'k': [2]}] (1,) None False");
    check_render(
        "{{ 1.0 }} {{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1e15 }} {{ 0.00001 }} {{ 1 / 3 }} {{ 2.50 }}",
        NULL, "1.0 0.30000000000000004 1e+16 1000000000000000.0 1e-05 0.3333333333333333 2.5");
    check_render("{{ [\"it's\", 'a\"b', 'x\\ny'] }}", NULL, "[\"it's\", 'a\"b', 'x\\ny']");
}

static void test_string_methods(void **state) {
    check_render(
        "{{ '  x  '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ '\\n\\nhi\\n'.lstrip('\\n') }}|"
        "{{ 'hi \\t'.rstrip() }}|{{ 'ab'.startswith('a') }}{{ 'ab'.endswith('b') }}"
        "{{ 'ab'.startswith(('x', 'a')) }}|{{ 'Hi'.upper() }}{{ 'Hi'.lower() }}|"
        "{{ 'a-b'.replace('-', '+') }}|{{ 'aaa'.replace('a', 'b', 2) }}",
        NULL, "x|hi|hi\n|hi|TrueTrueTrue|HIhi|a+b|bba");
    check_render("{{ ' a  b '.split() }}{{ 'a,b,,c'.split(',') }}{{ 'a,b,c'.split(',', 1) }}"
                 "{{ 'a,b,c'.rsplit(',', 1) }}{{ 'x</think>y</think>z'.split('</think>')[-1] }}",
                 NULL, "['a', 'b']['a', 'b', '', 'c']['a', 'b,c']['a,b', 'c']z");
    check_render("{{ 'hello world'.title() }} {{ 'hELLO'.capitalize() }} {{ 'abcabc'.find('c') }} "
                 "{{ 'abc'.find('z') }} {{ 'aaa'.count('a') }} {{ '-'.join(['a', 'b']) }} "
                 "{{ '{} and {name}'.format(1, name='x') }} {{ '%s=%d' % ('k', 5) }}",
                 NULL, "Hello World Hello 2 -1 3 a-b 1 and x k=5");
    check_error("{{ [].append(1) }}", NULL, JINJA_ERR_RENDER, "unsafe");
}

static void test_filters(void **state) {
    check_render(
        "{{ '  x '|trim }}|{{ [1,2,3]|length }}{{ 'héé'|length }}{{ {'a':1}|count }}|"
        "{{ [1,2,3]|first }}{{ [1,2,3]|last }}{{ 'abc'|first }}|{{ [1,'a',none]|join('-') }}|"
        "{{ 5|string ~ '!' }}|{{ x|default('d') }}{{ ''|default('e', true) }}|"
        "{{ {'b':1,'a':2}|items|list }}",
        NULL, "x|331|13a|1-a-None|5!|de|[('b', 1), ('a', 2)]");
    check_render("{{ [3,1,2]|sort }}{{ ['b','A','c']|sort }}{{ [3,1,2]|sort(reverse=true) }}"
                 "{{ [3,1,2]|max }}{{ [3,1,2]|min }}{{ [1,2,3]|sum }}{{ [1,2,3]|reverse|list }}"
                 "{{ [1,1,2]|unique|list }}{{ {'b':1,'a':2}|dictsort }}",
                 NULL, "[1, 2, 3]['A', 'b', 'c'][3, 2, 1]316[3, 2, 1][1, 2][('a', 2), ('b', 1)]");
    check_render(
        "{{ m|map(attribute='role')|join(',') }}|{{ m|selectattr('role', 'equalto', "
        "'user')|list|length }}"
        "|{{ m|rejectattr('role', 'equalto', 'user')|map(attribute='content')|first }}"
        "|{{ [1,2,3,4]|select('odd')|list }}{{ ['a','b']|map('upper')|list }}",
        "{\"m\":[{\"role\":\"user\",\"content\":\"u\"},{\"role\":\"tool\",\"content\":\"t\"}]}",
        "user,tool|1|t|[1, 3]['A', 'B']");
    check_render("{{ 'ab'|upper }}{{ 'AB'|lower }}{{ 'hi there'|title }}{{ 'aBC'|capitalize }}"
                 "{{ '3'|int + 1 }}{{ 2.5|round }}{{ 2.567|round(2) }}{{ -3|abs }}{{ 'a<b'|e }}"
                 "{{ 'a\\nb'|indent(2) }}",
                 NULL, "ABabHi ThereAbc42.02.573a&lt;ba\n  b");
    check_error("{{ 1|nosuchfilter }}", NULL, JINJA_ERR_RENDER, "no filter named 'nosuchfilter'");
}

static void test_tojson_escaping_like_hf(void **state) {
    // HF's tojson is json.dumps(ensure_ascii=False): no HTML escaping, unicode kept.
    check_render("{{ s|tojson }}", "{\"s\":\"q\\\"b\\\\n\\nt\\tc\\u0001<&>é😀\"}",
                 "\"q\\\"b\\\\n\\nt\\tc\\u0001<&>é😀\"");
    check_render("{{ d|tojson }}", "{\"d\":{\"b\":1,\"a\":[true,null,2.5,\"x\"],\"c\":{}}}",
                 "{\"b\": 1, \"a\": [true, null, 2.5, \"x\"], \"c\": {}}");
    check_render("{{ d|tojson(indent=2) }}", "{\"d\":{\"a\":[1,{}],\"b\":[]}}",
                 "{\n  \"a\": [\n    1,\n    {}\n  ],\n  \"b\": []\n}");
    check_render("{{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }}{{ 'é'|tojson(ensure_ascii=true) }}"
                 "{{ [1, 2]|tojson(separators=(',', ':')) }}",
                 NULL, "{\"a\": 2, \"b\": 1}\"\\u00e9\"[1,2]");
    check_error("{{ x|tojson }}", NULL, JINJA_ERR_RENDER, "not JSON serializable");
}

/* ---- whitespace ----------------------------------------------------------------------- */

static void test_whitespace_control_markers(void **state) {
    check_render("a  {%- if true -%}  b  {%- endif -%}  c", NULL, "abc");
    check_render("a \n {{- 'x' -}} \n b", NULL, "axb");
    check_render("{%- for x in [1,2] %}\n  {{- x }}\n{%- endfor %}", NULL, "12");
    check_render("{# comment #}a{#- c -#}  b", NULL, "ab");
}

static void test_trim_blocks_and_lstrip_blocks(void **state) {
    const char *t = "<ul>\n  {% for x in [1, 2] %}\n  <li>{{ x }}</li>\n  {% endfor %}\n</ul>";
    check_render(t, NULL, "<ul>\n  <li>1</li>\n  <li>2</li>\n</ul>");
    // The same template without HF's settings keeps the tag lines.
    struct jinja_options plain = {0};
    char *out, err[256];
    assert_int_equal(try_render_opts(t, &plain, NULL, NULL, &out, err, sizeof err), JINJA_OK);
    assert_string_equal(out, "<ul>\n  \n  <li>1</li>\n  \n  <li>2</li>\n  \n</ul>");
    free(out);
    // lstrip only applies when the tag starts its line; trim_blocks eats the newline after
    // {% endif %} but not after {{ }}; {%+ opts out of lstrip.
    check_render("x {% if true %}y{% endif %}\n{{ 'v' }}\n  {%+ if true %}z{% endif %}", NULL,
                 "x yv\n  z");
    check_render("{% if true +%}\nk{% endif %}", NULL, "\nk");
    check_render("a\n  {# note #}\nb", NULL, "a\nb");
    // Raw blocks are copied verbatim.
    check_render("{% raw %}{{ not parsed }}{% endraw %}", NULL, "{{ not parsed }}");
}

static void test_newlines_normalised_and_one_trailing_newline_dropped(void **state) {
    check_render("a\r\nb\rc\n", NULL, "a\nb\nc");
    check_render("a\n\n", NULL, "a\n");
    struct jinja_options keep = jinja_options_hf;
    keep.keep_trailing_newline = true;
    char *out, err[256];
    assert_int_equal(try_render_opts("a\n", &keep, NULL, NULL, &out, err, sizeof err), JINJA_OK);
    assert_string_equal(out, "a\n");
    free(out);
}

/* ---- undefined and errors ------------------------------------------------------------- */

static void test_undefined_behaves_like_jinja_default(void **state) {
    check_render("[{{ u }}]{{ u is defined }}{{ not u }}{{ u|length }}{{ u ~ 'x' }}"
                 "{% for x in u %}never{% endfor %}{{ u|default('d') }}{{ 'a' in u }}"
                 "{% if u %}t{% else %}f{% endif %}{{ u == u }}{{ d.missing is defined }}",
                 "{\"d\":{}}", "[]FalseTrue0xdFalsefTrueFalse");
    check_error("{{ u.attr }}", NULL, JINJA_ERR_RENDER, "'u' is undefined");
    check_error("{{ u + 1 }}", NULL, JINJA_ERR_RENDER, "'u' is undefined");
    check_error("{{ u() }}", NULL, JINJA_ERR_RENDER, "'u' is undefined");
}

static void test_raise_exception_message_is_exact(void **state) {
    check_error("{% if true %}{{ raise_exception('Roles must alternate: ' ~ 2) }}{% endif %}", NULL,
                JINJA_ERR_RAISED, "Roles must alternate: 2");
    char *out, err[256];
    assert_int_equal(
        try_render("x{{ raise_exception('exact text') }}", NULL, &out, err, sizeof err),
        JINJA_ERR_RAISED);
    assert_string_equal(err, "exact text"); // no "line N:" prefix: it becomes the HTTP 400 text
}

static void test_parse_errors_name_the_line(void **state) {
    check_error("line1\n{% if x %}\n{{ 1 + }}\n{% endif %}", NULL, JINJA_ERR_SYNTAX, "line 3:");
    check_error("a\n\n{% for x in y %}\nbody", NULL, JINJA_ERR_SYNTAX, "line 3:");
    check_error("{% if true %}\n{% endfor %}", NULL, JINJA_ERR_SYNTAX,
                "line 2: unexpected 'endfor'");
    check_error("\n{{ 'unterminated }}", NULL, JINJA_ERR_SYNTAX, "line 2:");
    check_error("{% nosuchtag %}", NULL, JINJA_ERR_SYNTAX, "unknown tag 'nosuchtag'");
    check_error("{{ (1 }}", NULL, JINJA_ERR_SYNTAX, "unexpected '}'");
    check_error("a\nb\n{{ x.y.z }}", NULL, JINJA_ERR_RENDER, "line 3: 'x' is undefined");
}

/* ---- limits --------------------------------------------------------------------------- */

static void test_runaway_recursion_is_stopped(void **state) {
    check_error("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", NULL, JINJA_ERR_LIMIT,
                "nesting");
    // deeply nested template syntax is refused at parse time, not by a crash
    size_t n = 5000;
    char *deep = malloc(2 * n + 8);
    assert_non_null(deep);
    memcpy(deep, "{{ ", 3);
    memset(deep + 3, '(', n);
    memcpy(deep + 3 + n, "1", 1);
    memset(deep + 4 + n, ')', n);
    strcpy(deep + 4 + 2 * n, " }}");
    char *out, err[256];
    assert_int_equal(try_render(deep, NULL, &out, err, sizeof err), JINJA_ERR_SYNTAX);
    assert_non_null(strstr(err, "nested too deeply"));
    free(deep);
}

static void test_output_memory_and_step_limits(void **state) {
    struct jinja_limits lim = jinja_limits_default;
    lim.max_output = 1000;
    char *out, err[256];
    assert_int_equal(try_render_opts("{% for i in range(100) %}0123456789abcdef{% endfor %}", NULL,
                                     NULL, &lim, &out, err, sizeof err),
                     JINJA_ERR_LIMIT);
    assert_non_null(strstr(err, "output longer than 1000"));
    assert_int_equal(try_render_opts("{{ 'x' * 5000 }}", NULL, NULL, &lim, &out, err, sizeof err),
                     JINJA_ERR_LIMIT);
    lim = jinja_limits_default;
    lim.max_steps = 10000;
    assert_int_equal(
        try_render_opts("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}"
                        "{% endfor %}",
                        NULL, NULL, &lim, &out, err, sizeof err),
        JINJA_ERR_LIMIT);
    assert_non_null(strstr(err, "steps"));
    lim = jinja_limits_default;
    lim.max_memory = 1 << 20;
    assert_int_equal(try_render_opts("{% set ns = namespace(s='x') %}{% for i in range(100) %}"
                                     "{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                                     NULL, NULL, &lim, &out, err, sizeof err),
                     JINJA_ERR_LIMIT);
    check_error("{{ range(1000000)|length }}", NULL, JINJA_ERR_LIMIT, "range too big");
    // A within-limits render still works with the same settings.
    assert_int_equal(try_render_opts("{{ 'ok' }}", NULL, NULL, &lim, &out, err, sizeof err),
                     JINJA_OK);
    assert_string_equal(out, "ok");
    free(out);
}

/* ---- chat_template loading and variables ---------------------------------------------- */

static void write_file(const char *dir, const char *name, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void remove_dir(const char *dir) {
    const char *names[] = {"tokenizer_config.json", "chat_template.jinja", "user.jinja"};
    char path[512];
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        unlink(path);
    }
    rmdir(dir);
}

static char *render_ct(const struct chat_template *ct, const char *msgs_json, bool gen,
                       const char *extra_json, int want_rc) {
    cJSON *msgs = parse_json(msgs_json), *extra = extra_json ? parse_json(extra_json) : NULL;
    char *out = NULL, err[512] = "";
    int rc = chat_template_render(ct, msgs, gen, chat_template_bos_token(ct),
                                  chat_template_eos_token(ct), extra, &out, err, sizeof err);
    if (rc != want_rc) fail_msg("render status %d, want %d: %s", rc, want_rc, err);
    cJSON_Delete(msgs);
    cJSON_Delete(extra);
    return out;
}

static void test_load_prefers_chat_template_jinja_and_reads_added_tokens(void **state) {
    char dir[] = "/tmp/test_jinja_XXXXXX";
    assert_non_null(mkdtemp(dir));
    write_file(
        dir, "tokenizer_config.json",
        "{\"bos_token\":{\"__type\":\"AddedToken\",\"content\":\"<B>\"},\"eos_token\":\"<E>\","
        "\"chat_template\":\"from config\"}");
    struct chat_template *ct = NULL;
    char err[512];
    assert_int_equal(chat_template_load(dir, NULL, &ct, err, sizeof err), CHAT_TEMPLATE_OK);
    char *out = render_ct(ct, "[]", false, NULL, CHAT_TEMPLATE_OK);
    assert_string_equal(out, "from config");
    free(out);
    chat_template_free(ct);

    write_file(dir, "chat_template.jinja", "{{ bos_token }}jinja file{{ eos_token }}\n");
    assert_int_equal(chat_template_load(dir, NULL, &ct, err, sizeof err), CHAT_TEMPLATE_OK);
    assert_string_equal(chat_template_bos_token(ct), "<B>");
    out = render_ct(ct, "[]", false, NULL, CHAT_TEMPLATE_OK);
    assert_string_equal(out, "<B>jinja file<E>");
    free(out);
    chat_template_free(ct);

    // --chat-template FILE wins over both; its syntax errors name the file and line.
    write_file(dir, "user.jinja", "user {{ messages|length }}");
    char path[512];
    snprintf(path, sizeof path, "%s/user.jinja", dir);
    assert_int_equal(chat_template_load(dir, path, &ct, err, sizeof err), CHAT_TEMPLATE_OK);
    out = render_ct(ct, "[{\"role\":\"user\",\"content\":\"x\"}]", true, NULL, CHAT_TEMPLATE_OK);
    assert_string_equal(out, "user 1");
    free(out);
    chat_template_free(ct);
    write_file(dir, "user.jinja", "ok\n{% if %}");
    assert_int_equal(chat_template_load(NULL, path, &ct, err, sizeof err),
                     CHAT_TEMPLATE_ERR_SYNTAX);
    assert_null(ct);
    assert_non_null(strstr(err, path));
    assert_non_null(strstr(err, "line 2"));
    snprintf(path, sizeof path, "%s/missing.jinja", dir);
    assert_int_equal(chat_template_load(NULL, path, &ct, err, sizeof err), CHAT_TEMPLATE_ERR_IO);
    remove_dir(dir);
}

static void test_load_named_templates_default_and_tool_use(void **state) {
    char dir[] = "/tmp/test_jinja_XXXXXX";
    assert_non_null(mkdtemp(dir));
    write_file(
        dir, "tokenizer_config.json",
        "{\"chat_template\":[{\"name\":\"tool_use\",\"template\":\"TOOLS {{ tools|length }}\"},"
        "{\"name\":\"default\",\"template\":\"DEFAULT\"}]}");
    struct chat_template *ct = NULL;
    char err[512];
    assert_int_equal(chat_template_load(dir, NULL, &ct, err, sizeof err), CHAT_TEMPLATE_OK);
    char *out = render_ct(ct, "[]", true, NULL, CHAT_TEMPLATE_OK);
    assert_string_equal(out, "DEFAULT");
    free(out);
    out = render_ct(ct, "[]", true, "{\"tools\":[{\"type\":\"function\"}]}", CHAT_TEMPLATE_OK);
    assert_string_equal(out, "TOOLS 1");
    free(out);
    chat_template_free(ct);

    write_file(dir, "tokenizer_config.json",
               "{\"chat_template\":[{\"name\":\"rag\",\"template\":\"R\"}]}");
    assert_int_equal(chat_template_load(dir, NULL, &ct, err, sizeof err), CHAT_TEMPLATE_ERR_NONE);
    write_file(dir, "tokenizer_config.json", "{\"chat_template\": 5}");
    assert_int_equal(chat_template_load(dir, NULL, &ct, err, sizeof err), CHAT_TEMPLATE_ERR_CONFIG);
    write_file(dir, "tokenizer_config.json", "{not json");
    assert_int_equal(chat_template_load(dir, NULL, &ct, err, sizeof err), CHAT_TEMPLATE_ERR_CONFIG);
    remove_dir(dir);
}

static void test_render_variables_like_transformers(void **state) {
    struct chat_template *ct = NULL;
    char err[512];
    const char *t = "{{ tools is none }}|{{ documents is none }}|{{ tools is defined }}|"
                    "{{ enable_thinking is defined }}|{{ date_string }}|{{ messages|length }}|"
                    "{{ add_generation_prompt }}|{{ bos_token is defined }}";
    assert_int_equal(chat_template_from_string(t, strlen(t), NULL, "</s>", &ct, err, sizeof err),
                     CHAT_TEMPLATE_OK);
    char *out =
        render_ct(ct, "[{\"role\":\"user\",\"content\":\"x\"}]", true, NULL, CHAT_TEMPLATE_OK);
    assert_string_equal(out, "True|True|True|False||1|True|False");
    free(out);
    out = render_ct(ct, "[]", false,
                    "{\"tools\":[],\"enable_thinking\":false,\"date_string\":\"26 Jul 2024\","
                    "\"messages\":[1,2,3],\"add_generation_prompt\":true}",
                    CHAT_TEMPLATE_OK);
    assert_string_equal(out, "False|True|True|True|26 Jul 2024|0|False|False");
    free(out);
    cJSON *notarray = parse_json("{}");
    assert_int_equal(
        chat_template_render(ct, notarray, true, NULL, NULL, NULL, &out, err, sizeof err),
        CHAT_TEMPLATE_ERR_INVALID);
    cJSON_Delete(notarray);
    chat_template_free(ct);

    const char *s = "{{ strftime_now('%Y') | length }}";
    assert_int_equal(chat_template_from_string(s, strlen(s), NULL, NULL, &ct, err, sizeof err),
                     CHAT_TEMPLATE_OK);
    out = render_ct(ct, "[]", true, NULL, CHAT_TEMPLATE_OK);
    assert_string_equal(out, "4");
    free(out);
    chat_template_free(ct);
}

/* ---- concurrency ---------------------------------------------------------------------- */

struct thread_arg {
    const struct jinja_template *t;
    const cJSON *vars;
    const char *want;
    int mismatches;
};

static void *render_many(void *p) {
    struct thread_arg *a = p;
    for (int i = 0; i < 200; i++) {
        char *out = NULL, err[256];
        if (jinja_render(a->t, a->vars, NULL, &out, NULL, err, sizeof err) != JINJA_OK ||
            strcmp(out, a->want) != 0)
            a->mismatches++;
        free(out);
    }
    return NULL;
}

static void test_parallel_renders_share_one_parsed_template(void **state) {
    const char *src =
        "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
        "<{{ m.role }}:{{ m.content|trim }}:{{ loop.index }}>{% endfor %}{{ ns.n }}";
    struct jinja_template *t = NULL;
    char err[256];
    assert_int_equal(jinja_parse(src, strlen(src), NULL, &t, err, sizeof err), JINJA_OK);
    cJSON *vars = parse_json("{\"messages\":[{\"role\":\"user\",\"content\":\" a \"},"
                             "{\"role\":\"assistant\",\"content\":\"b\"}]}");
    const char *want = "<user:a:1><assistant:b:2>2";
    struct thread_arg args[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (struct thread_arg){t, vars, want, 0};
        assert_int_equal(pthread_create(&th[i], NULL, render_many, &args[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(args[i].mismatches, 0);
    }
    cJSON_Delete(vars);
    jinja_free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_expected_renders_llama2),
        cmocka_unit_test(test_expected_renders_llama3),
        cmocka_unit_test(test_expected_renders_qwen3),
        cmocka_unit_test(test_mistral_v01_has_no_chat_template),
        cmocka_unit_test(test_special_tokens_from_tokenizer_config),
        cmocka_unit_test(test_llama2_role_alternation_raises_with_exception_text),
        cmocka_unit_test(test_qwen3_tools_and_reasoning),
        cmocka_unit_test(test_for_loop_variables),
        cmocka_unit_test(test_for_loop_over_dict_items_keys_and_string),
        cmocka_unit_test(test_for_else_filter_and_loop_controls),
        cmocka_unit_test(test_for_loop_body_is_a_fresh_scope),
        cmocka_unit_test(test_if_elif_else),
        cmocka_unit_test(test_namespace_set_in_loop),
        cmocka_unit_test(test_set_tuple_and_block_set),
        cmocka_unit_test(test_macros),
        cmocka_unit_test(test_generation_block_renders_its_body),
        cmocka_unit_test(test_comparisons_and_logic),
        cmocka_unit_test(test_tests),
        cmocka_unit_test(test_arithmetic_python_semantics),
        cmocka_unit_test(test_subscripts_slices_and_attributes),
        cmocka_unit_test(test_inline_if_else),
        cmocka_unit_test(test_value_printing_like_python),
        cmocka_unit_test(test_string_methods),
        cmocka_unit_test(test_filters),
        cmocka_unit_test(test_tojson_escaping_like_hf),
        cmocka_unit_test(test_whitespace_control_markers),
        cmocka_unit_test(test_trim_blocks_and_lstrip_blocks),
        cmocka_unit_test(test_newlines_normalised_and_one_trailing_newline_dropped),
        cmocka_unit_test(test_undefined_behaves_like_jinja_default),
        cmocka_unit_test(test_raise_exception_message_is_exact),
        cmocka_unit_test(test_parse_errors_name_the_line),
        cmocka_unit_test(test_runaway_recursion_is_stopped),
        cmocka_unit_test(test_output_memory_and_step_limits),
        cmocka_unit_test(test_load_prefers_chat_template_jinja_and_reads_added_tokens),
        cmocka_unit_test(test_load_named_templates_default_and_tool_use),
        cmocka_unit_test(test_tool_syntax_from_the_template_text),
        cmocka_unit_test(test_render_variables_like_transformers),
        cmocka_unit_test(test_parallel_renders_share_one_parsed_template),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
