/* The CUDA backend's tuning switches (cuda/cuda_tuning.c): the defaults when unset, 0 and 1,
 * numbers, and every malformed value refused with a message that names the variable. */
#include <stdbool.h>

#include "tests/test_common.h"

#include "cuda/cuda_tuning.h"

static const char *const names[] = {"DUOSERVE_NO_CUDA_GRAPHS", "DUOSERVE_OP_TIMING", "DUOSERVE_NORM_PDL",
                                    "DUOSERVE_ATTN_WG", "DUOSERVE_STREAM_K_MIN_UNITS"};
#define N_ON_OFF 4 /* the on/off switches come first */
#define N_NAMES (sizeof names / sizeof names[0])

static int unset_all(void **state) {
    (void)state;
    for (size_t i = 0; i < N_NAMES; i++) unsetenv(names[i]);
    return 0;
}

/* A tuning filled with values no parse gives, so that a field the parse forgets shows. */
static struct cuda_tuning poisoned(void) {
    struct cuda_tuning t;
    memset(&t, 0xA5, sizeof t);
    return t;
}

static void assert_defaults(const struct cuda_tuning *t) {
    assert_false(t->no_graphs);
    assert_false(t->op_timing);
    assert_true(t->norm_pdl);
    assert_true(t->attn_wg);
    assert_int_equal(t->stream_k_min_units, 8192);
}

static void test_unset_gives_defaults(void **state) {
    (void)state;
    struct cuda_tuning t = poisoned();
    char err[256] = "";
    assert_int_equal(cuda_tuning_parse(&t, err, sizeof err), 0);
    assert_defaults(&t);
    assert_string_equal(err, "");
}

static void test_zero(void **state) {
    (void)state;
    for (size_t i = 0; i < N_NAMES; i++) setenv(names[i], "0", 1);
    struct cuda_tuning t = poisoned();
    char err[256] = "";
    assert_int_equal(cuda_tuning_parse(&t, err, sizeof err), 0);
    assert_false(t.no_graphs); /* DUOSERVE_NO_CUDA_GRAPHS=0: graphs stay on */
    assert_false(t.op_timing);
    assert_false(t.norm_pdl);
    assert_false(t.attn_wg);
    assert_int_equal(t.stream_k_min_units, 0); /* stream-K at every size (the op test's check) */
}

static void test_one(void **state) {
    (void)state;
    for (size_t i = 0; i < N_NAMES; i++) setenv(names[i], "1", 1);
    struct cuda_tuning t = poisoned();
    char err[256] = "";
    assert_int_equal(cuda_tuning_parse(&t, err, sizeof err), 0);
    assert_true(t.no_graphs);
    assert_true(t.op_timing);
    assert_true(t.norm_pdl);
    assert_true(t.attn_wg);
    assert_int_equal(t.stream_k_min_units, 1);
}

/* Each switch alone: the others keep their defaults. */
static void test_each_switch_alone(void **state) {
    (void)state;
    struct cuda_tuning t = poisoned();
    char err[256] = "";
    setenv("DUOSERVE_NO_CUDA_GRAPHS", "1", 1);
    assert_int_equal(cuda_tuning_parse(&t, err, sizeof err), 0);
    assert_true(t.no_graphs);
    assert_false(t.op_timing);
    assert_true(t.norm_pdl);
    assert_true(t.attn_wg);
    assert_int_equal(t.stream_k_min_units, 8192);
    unset_all(NULL);
    setenv("DUOSERVE_STREAM_K_MIN_UNITS", "0016384", 1); /* leading zeros: still decimal */
    t = poisoned();
    assert_int_equal(cuda_tuning_parse(&t, err, sizeof err), 0);
    assert_false(t.no_graphs);
    assert_true(t.norm_pdl);
    assert_int_equal(t.stream_k_min_units, 16384);
    setenv("DUOSERVE_STREAM_K_MIN_UNITS", "1073741824", 1); /* the largest it takes, 2^30 */
    assert_int_equal(cuda_tuning_parse(&t, err, sizeof err), 0);
    assert_int_equal(t.stream_k_min_units, 1u << 30);
}

/* A malformed value of one switch: -1, the message names the variable and the value, and the
 * tuning holds the defaults (nothing half-applied). */
static void expect_refused(const char *name, const char *value, const char *takes) {
    unset_all(NULL);
    setenv("DUOSERVE_OP_TIMING", "1", 1); /* a good value beside it is not taken either */
    if (!strcmp(name, "DUOSERVE_OP_TIMING")) unsetenv("DUOSERVE_OP_TIMING");
    setenv(name, value, 1);
    struct cuda_tuning t = poisoned();
    char err[256] = "", want[200];
    assert_int_equal(cuda_tuning_parse(&t, err, sizeof err), -1);
    snprintf(want, sizeof want, "%s=\"%s\": it takes %s", name, value, takes);
    assert_string_equal(err, want);
    assert_defaults(&t);
}

static void test_junk_is_an_error(void **state) {
    (void)state;
    static const char *const on_off_junk[] = {"", "2", "10", "yes", "true", "on", "-1",
                                              "+1", " 1", "1 ", "1x", "0x1", "01a"};
    for (size_t i = 0; i < N_ON_OFF; i++)
        for (size_t j = 0; j < sizeof on_off_junk / sizeof on_off_junk[0]; j++)
            expect_refused(names[i], on_off_junk[j], "0 or 1");
    static const char *const number_junk[] = {"", "-1", "+8192", "8k", "8192 ", "1.5", "1e4", "1073741825",
                                              "99999999999999999999999"};
    for (size_t j = 0; j < sizeof number_junk / sizeof number_junk[0]; j++)
        expect_refused("DUOSERVE_STREAM_K_MIN_UNITS", number_junk[j], "a whole number from 0 to 1073741824");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_unset_gives_defaults, unset_all),
        cmocka_unit_test_setup(test_zero, unset_all),
        cmocka_unit_test_setup(test_one, unset_all),
        cmocka_unit_test_setup(test_each_switch_alone, unset_all),
        cmocka_unit_test_setup(test_junk_is_an_error, unset_all),
    };
    return cmocka_run_group_tests_name("cuda_tuning", tests, NULL, NULL);
}
