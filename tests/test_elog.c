/* The engine's own log lines (engine/elog.c): every line of loading reaches the sink the
 * daemon sets (so --log-format json holds for them), and the progress policy when stderr is
 * not a terminal. */
#include <stdbool.h>

#include "tests/test_common.h"

#include "engine/elog.h"
#include "engine/engine_core.h"

static char sink_lines[8][256];
static char sink_levels[8][16];
static int n_sink;

static void sink(const char *level, const char *msg) {
    if (n_sink < 8) {
        snprintf(sink_levels[n_sink], sizeof sink_levels[0], "%s", level);
        snprintf(sink_lines[n_sink++], sizeof sink_lines[0], "%s", msg);
    }
}

/* Every line of the engine reaches the daemon's sink, the loader's included, and none goes
 * to stderr behind its back. */
static void test_engine_lines_go_to_the_sink(void **state) {
    (void)state;
    n_sink = 0;
    elog_set_sink(sink, false);
    struct engine_config cfg = {.model_dir = "tests/fixtures/hf/llama3", .device = "auto"};
    struct core *c = NULL;
    char err[512] = "";
    assert_int_equal(core_create(&c, &cfg, err, sizeof err), 0);
    core_free(c);
    elog_set_sink(NULL, true);
    bool loaded = false, kv = false;
    for (int i = 0; i < n_sink; i++) {
        loaded |= !strncmp(sink_lines[i], "loaded tests/fixtures/hf/llama3", 31);
        kv |= !strncmp(sink_lines[i], "KV cache:", 9);
        assert_null(strchr(sink_lines[i], '\n'));
    }
    assert_true(loaded && kv);
}

/* Not a terminal: a line when a tenth more is done and 2 s have passed, or after 10 s. */
static void test_progress_lines_policy(void **state) {
    (void)state;
    struct elog_progress p = {.what = "layers loaded:", .total = 32, .t0 = 100, .t_last = 100};
    assert_false(elog_progress_due(&p, 1, 100.5));  /* a fast load prints nothing */
    assert_false(elog_progress_due(&p, 16, 101.9)); /* half done, but under 2 s */
    assert_true(elog_progress_due(&p, 4, 102.0));   /* a tenth done after 2 s */
    assert_false(elog_progress_due(&p, 2, 105.0));  /* under a tenth, under 10 s */
    assert_true(elog_progress_due(&p, 2, 110.0));   /* a slow layer: alive after 10 s */
    assert_false(elog_progress_due(&p, 32, 200.0)); /* the end has its own line */
    p.t_last = 102.0, p.last_tenth = 1;
    assert_false(elog_progress_due(&p, 5, 105.0)); /* still the same tenth */
    assert_true(elog_progress_due(&p, 7, 105.0));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_engine_lines_go_to_the_sink),
        cmocka_unit_test(test_progress_lines_policy),
    };
    return cmocka_run_group_tests_name("elog", tests, NULL, NULL);
}
