/* server/tool_parser: tool calls found in each template family's syntax, content kept apart,
 * lookalikes left as content, and the same deltas however the text is cut into pieces. */
#include "tests/test_common.h"

#include <ctype.h>

#include "server/tool_parser.h"

#define MAXCALLS 8

struct result {
    char content[4096];
    size_t content_len;
    int n;
    char name[MAXCALLS][64], id[MAXCALLS][40], args[MAXCALLS][1024];
    int order[64]; // kinds of the deltas, adjacent ones of a kind merged
    int n_order;
};

static int collect(void *ud, const struct tool_delta *d) {
    struct result *r = ud;
    if (r->n_order == 0 || r->order[r->n_order - 1] != (int)d->kind || d->kind == TOOL_DELTA_CALL) {
        assert_true(r->n_order < 64);
        r->order[r->n_order++] = (int)d->kind;
    }
    if (d->kind == TOOL_DELTA_CONTENT) {
        assert_true(r->content_len + d->len < sizeof r->content);
        memcpy(r->content + r->content_len, d->text, d->len);
        r->content[r->content_len += d->len] = 0;
    } else if (d->kind == TOOL_DELTA_CALL) {
        assert_int_equal(d->index, r->n);
        assert_true(r->n < MAXCALLS);
        snprintf(r->name[r->n], sizeof r->name[0], "%.*s", (int)d->len, d->text);
        snprintf(r->id[r->n], sizeof r->id[0], "%s", d->id);
        r->n++;
    } else {
        assert_int_equal(d->index, r->n - 1);
        char *a = r->args[d->index];
        size_t l = strlen(a);
        assert_true(l + d->len < sizeof r->args[0]);
        memcpy(a + l, d->text, d->len);
        a[l + d->len] = 0;
    }
    return 0;
}

/* Parses text whole (pieces 0) or in pieces of 1..pieces bytes chosen by seed. */
static void parse(const char *text, int pieces, uint64_t seed, bool parallel, const char *const *names,
                  struct result *r) {
    memset(r, 0, sizeof *r);
    struct tool_parser *p = tool_parser_new(parallel, false, 42);
    for (int i = 0; names && names[i]; i++) assert_int_equal(tool_parser_allow_name(p, names[i]), 0);
    size_t n = strlen(text), at = 0;
    while (pieces && at < n) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        size_t k = 1 + (seed >> 33) % (uint64_t)pieces;
        if (k > n - at) k = n - at;
        assert_int_equal(tool_parser_feed(p, text + at, k, false, collect, r), 0);
        at += k;
    }
    assert_int_equal(tool_parser_feed(p, text + at, n - at, true, collect, r), 0);
    assert_int_equal(tool_parser_calls(p), r->n);
    tool_parser_free(p);
}

static const char *const weather[] = {"get_weather", "get_time", NULL};

static const struct {
    const char *text;
    const char *content;
    int n;
    const char *calls[3][2]; // name, arguments
} cases[] = {
    /* Hermes / Qwen: content before, two calls */
    {"Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
     "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\", \"n\": [1, {\"x\": \"}\"}]}}\n</tool_call>",
     "Let me check.", 2,
     {{"get_weather", "{\"city\": \"Paris\"}"}, {"get_time", "{\"tz\": \"CET\", \"n\": [1, {\"x\": \"}\"}]}"}}},
    /* Llama 3.x JSON at the start, "parameters", and ; between calls */
    {"  {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}; {\"name\": \"get_time\", \"parameters\": {}}",
     "", 2, {{"get_weather", "{\"city\": \"Oslo\"}"}, {"get_time", "{}"}}},
    /* Llama 3.1 python_tag */
    {"<|python_tag|>{\"name\": \"get_time\", \"parameters\": {\"tz\": \"UTC\"}}", "", 1, {{"get_time", "{\"tz\": \"UTC\"}"}}},
    /* Mistral: marker and a list; a bare list */
    {"[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}, {\"name\": \"get_time\", "
     "\"arguments\": {\"tz\": \"X\"}}]", "", 2, {{"get_weather", "{\"city\": \"Rome\"}"}, {"get_time", "{\"tz\": \"X\"}"}}},
    {"[{\"name\":\"get_time\",\"arguments\":{\"tz\":\"A\\\"B\"}}]", "", 1, {{"get_time", "{\"tz\":\"A\\\"B\"}"}}},
    /* keys in another order, arguments as a JSON string, no arguments: given whole */
    {"{\"arguments\": {\"city\": \"Lima\"}, \"name\": \"get_weather\"}", "", 1, {{"get_weather", "{\"city\":\"Lima\"}"}}},
    {"<tool_call>{\"name\": \"get_time\", \"arguments\": \"{\\\"tz\\\": 1}\"}</tool_call>", "", 1,
     {{"get_time", "{\"tz\": 1}"}}},
    {"<tool_call>{\"name\": \"get_time\"}</tool_call>", "", 1, {{"get_time", "{}"}}},
    /* lookalikes are content: JSON without a known name, a marker followed by text, a partial marker */
    {"{\"answer\": 42, \"name\": \"x\"}", "{\"answer\": 42, \"name\": \"x\"}", 0, {{0}}},
    {"{\"name\": \"launch\", \"arguments\": {}}", "{\"name\": \"launch\", \"arguments\": {}}", 0, {{0}}},
    {"Use <tool_call> tags. <tool_cal", "Use <tool_call> tags. <tool_cal", 0, {{0}}},
    {"Plain answer.\n", "Plain answer.\n", 0, {{0}}},
    {"x [TOOL_CALLS] y", "x [TOOL_CALLS] y", 0, {{0}}},
    /* content after a call; whitespace around calls is not content */
    {"<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>\n\nDone.  \n", "Done.", 1,
     {{"get_time", "{}"}}},
    /* a cut-off call keeps what was written */
    {"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par", "", 1,
     {{"get_weather", "{\"city\": \"Par"}}},
    /* a call, then a broken object: the broken one is content */
    {"<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call><tool_call>{oops}</tool_call>",
     "<tool_call>{oops}</tool_call>", 1, {{"get_time", "{}"}}},
};

static void check(const struct result *r, int c) {
    if (strcmp(r->content, cases[c].content)) fail_msg("case %d: content [%s], want [%s]", c, r->content, cases[c].content);
    assert_int_equal(r->n, cases[c].n);
    for (int k = 0; k < r->n; k++) {
        assert_string_equal(r->name[k], cases[c].calls[k][0]);
        if (strcmp(r->args[k], cases[c].calls[k][1]))
            fail_msg("case %d call %d: arguments [%s], want [%s]", c, k, r->args[k], cases[c].calls[k][1]);
        assert_int_equal(strlen(r->id[k]), 29);
        assert_memory_equal(r->id[k], "call_", 5);
    }
}

static void test_syntaxes(void **state) {
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        struct result r;
        parse(cases[c].text, 0, 0, true, weather, &r);
        check(&r, (int)c);
    }
}

/* Any cutting of the text gives the same deltas (content, calls, arguments, in the same order). */
static void test_pieces_give_the_same_deltas(void **state) {
    static struct result whole, cut;
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        parse(cases[c].text, 0, 0, true, weather, &whole);
        for (int seed = 1; seed <= 60; seed++) {
            parse(cases[c].text, 1 + seed % 9, (uint64_t)seed, true, weather, &cut);
            check(&cut, (int)c);
            assert_int_equal(cut.n_order, whole.n_order);
            assert_memory_equal(cut.order, whole.order, sizeof(int) * (size_t)whole.n_order);
            for (int k = 0; k < whole.n; k++) assert_string_equal(cut.id[k], whole.id[k]);
        }
    }
}

/* Without parallel calls only the first is kept; without names any name is a call; short ids. */
static void test_parallel_names_ids(void **state) {
    struct result r;
    parse(cases[0].text, 3, 5, false, weather, &r);
    assert_int_equal(r.n, 1);
    assert_string_equal(r.name[0], "get_weather");
    assert_string_equal(r.content, "Let me check.");
    parse("{\"name\": \"launch\", \"arguments\": {\"a\": 1}}", 0, 0, true, NULL, &r);
    assert_int_equal(r.n, 1);
    assert_string_equal(r.name[0], "launch");
    struct tool_parser *p = tool_parser_new(true, true, 7);
    memset(&r, 0, sizeof r);
    const char *t = "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {}}]";
    assert_int_equal(tool_parser_feed(p, t, strlen(t), true, collect, &r), 0);
    assert_int_equal(r.n, 1);
    assert_int_equal(strlen(r.id[0]), 9);
    for (int i = 0; i < 9; i++) assert_true(isalnum((unsigned char)r.id[0][i]));
    tool_parser_free(p);
    tool_parser_free(NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_syntaxes),
        cmocka_unit_test(test_pieces_give_the_same_deltas),
        cmocka_unit_test(test_parallel_names_ids),
    };
    return cmocka_run_group_tests_name("tool_parser", tests, NULL, NULL);
}
