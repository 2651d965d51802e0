/* engine/fp8.c: e4m3 (OCP FP8 E4M3FN) conversions. Every code round-trips; values on either side
 * of every midpoint round to the nearer neighbour and ties to the even mantissa; saturation at
 * +-448 (Inf too); NaN stays NaN; and a sweep of random floats agrees with a slow reference that
 * searches the 256 decoded values for the nearest. */
#include <float.h>
#include <math.h>
#include <stdbool.h>

#include "tests/test_common.h"

#include "engine/fp8.h"

static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static bool is_nan_code(int c) { return (c & 0x7f) == 0x7f; }

/* The value of a code from its fields, in double, independently of fp8_e4m3_to_f32. */
static double code_value(int c) {
    int e = (c >> 3) & 15, m = c & 7;
    double v = e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10);
    return c & 0x80 ? -v : v;
}

/* Reference encoder: the nearest of the codes with x's sign (ties: the even mantissa), +-448 beyond
 * the range, NaN for NaN. Slow and obviously right. */
static uint8_t ref_encode(float x) {
    if (isnan(x)) return signbit(x) ? 0xff : 0x7f;
    int sign = signbit(x) ? 0x80 : 0;
    double a = fabs((double)x);
    int best = -1;
    double best_d = INFINITY;
    for (int c = 0; c < 0x7f; c++) { /* 0x00..0x7e: every non-negative finite code */
        double d = fabs(code_value(c) - a);
        if (d < best_d || (d == best_d && (c & 1) == 0)) {
            best = c;
            best_d = d;
        }
    }
    return (uint8_t)(sign | best);
}

static void test_decode_values(void **state) {
    (void)state;
    assert_true(fp8_e4m3_to_f32(0x00) == 0.0f && !signbit(fp8_e4m3_to_f32(0x00)));
    assert_true(fp8_e4m3_to_f32(0x80) == 0.0f && signbit(fp8_e4m3_to_f32(0x80)));
    assert_true(fp8_e4m3_to_f32(0x01) == 0x1p-9f); /* smallest subnormal */
    assert_true(fp8_e4m3_to_f32(0x07) == 7 * 0x1p-9f);
    assert_true(fp8_e4m3_to_f32(0x08) == 0x1p-6f); /* smallest normal */
    assert_true(fp8_e4m3_to_f32(0x38) == 1.0f);
    assert_true(fp8_e4m3_to_f32(0x7e) == 448.0f);
    assert_true(fp8_e4m3_to_f32(0xfe) == -448.0f);
    assert_true(isnan(fp8_e4m3_to_f32(0x7f)) && isnan(fp8_e4m3_to_f32(0xff)));
    for (int c = 0; c < 256; c++)
        if (!is_nan_code(c)) assert_true((double)fp8_e4m3_to_f32((uint8_t)c) == code_value(c));
}

static void test_every_code_round_trips(void **state) {
    (void)state;
    int nans = 0;
    for (int c = 0; c < 256; c++) {
        float v = fp8_e4m3_to_f32((uint8_t)c);
        uint8_t back = fp8_e4m3_from_f32(v);
        if (is_nan_code(c)) {
            nans++;
            assert_true(isnan(v));
            assert_true(is_nan_code(back));
        } else {
            assert_int_equal(back, c);
        }
    }
    assert_int_equal(nans, 2);
}

/* For each finite code and its next larger magnitude: just below the midpoint rounds down, just
 * above rounds up, the midpoint itself to the even mantissa. */
static void test_midpoints_round_to_nearest_even(void **state) {
    (void)state;
    int checked = 0;
    for (int sign = 0; sign <= 0x80; sign += 0x80)
        for (int c = 0; c < 0x7e; c++) {
            int lo = sign | c, hi = sign | (c + 1);
            float a = fp8_e4m3_to_f32((uint8_t)lo), b = fp8_e4m3_to_f32((uint8_t)hi);
            float mid = (a + b) / 2; /* exact: one more mantissa bit than e4m3 */
            assert_true((double)mid == (code_value(lo) + code_value(hi)) / 2);
            float toward_hi = sign ? -INFINITY : INFINITY, toward_lo = sign ? INFINITY : -INFINITY;
            assert_int_equal(fp8_e4m3_from_f32(nextafterf(mid, toward_lo)), lo);
            assert_int_equal(fp8_e4m3_from_f32(nextafterf(mid, toward_hi)), hi);
            assert_int_equal(fp8_e4m3_from_f32(mid), (c & 1) ? hi : lo);
            /* the neighbours' own values and a point a quarter of the way */
            assert_int_equal(fp8_e4m3_from_f32(a + (b - a) / 4), lo);
            assert_int_equal(fp8_e4m3_from_f32(b - (b - a) / 4), hi);
            checked++;
        }
    assert_int_equal(checked, 2 * 126);
}

static void test_saturation(void **state) {
    (void)state;
    const float big[] = {448.0f, nextafterf(448.0f, INFINITY), 460.0f, 464.0f, 465.0f, 479.99f, 480.0f, 512.0f,
                         1e6f, FLT_MAX};
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
        assert_int_equal(fp8_e4m3_from_f32(big[i]), 0x7e);
        assert_int_equal(fp8_e4m3_from_f32(-big[i]), 0xfe);
    }
    /* just below 448: the nearest is 448 or 416 (0x7d) */
    assert_int_equal(fp8_e4m3_from_f32(440.0f), 0x7e);
    assert_int_equal(fp8_e4m3_from_f32(431.0f), 0x7d);
}

static void test_nan_inf_zero(void **state) {
    (void)state;
    assert_int_equal(fp8_e4m3_from_f32(INFINITY), 0x7e);
    assert_int_equal(fp8_e4m3_from_f32(-INFINITY), 0xfe);
    assert_int_equal(fp8_e4m3_from_f32(NAN), 0x7f);
    assert_int_equal(fp8_e4m3_from_f32(-NAN), 0xff);
    float snan;
    uint32_t sb = 0x7f800001u;
    memcpy(&snan, &sb, 4);
    assert_int_equal(fp8_e4m3_from_f32(snan), 0x7f);
    assert_int_equal(fp8_e4m3_from_f32(0.0f), 0x00);
    assert_int_equal(fp8_e4m3_from_f32(-0.0f), 0x80);
    /* below half the smallest subnormal: zero of the same sign; half of it ties to even (zero) */
    assert_int_equal(fp8_e4m3_from_f32(0x1p-11f), 0x00);
    assert_int_equal(fp8_e4m3_from_f32(-0x1p-11f), 0x80);
    assert_int_equal(fp8_e4m3_from_f32(0x1p-10f), 0x00);
    assert_int_equal(fp8_e4m3_from_f32(nextafterf(0x1p-10f, 1.0f)), 0x01);
    assert_int_equal(fp8_e4m3_from_f32(FLT_TRUE_MIN), 0x00);
    assert_int_equal(fp8_e4m3_from_f32(-FLT_MIN), 0x80);
}

static uint64_t rng_next(uint64_t *s) { /* xorshift64* */
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545f4914f6cdd1dull;
}

static void test_random_sweep_against_reference(void **state) {
    (void)state;
    uint64_t s = 0x9e3779b97f4a7c15ull;
    int n = 0;
    for (int i = 0; i < 400000; i++) {
        uint64_t r = rng_next(&s);
        float x;
        if (i % 4 == 0) { /* any bit pattern: NaNs, infinities, huge and tiny values */
            uint32_t u = (uint32_t)(r >> 32);
            memcpy(&x, &u, 4);
        } else { /* the range that matters: a random mantissa, exponents 2^-12 .. 2^10, either sign */
            int e = (int)((r >> 40) % 23) - 12;
            x = ldexpf(1.0f + (float)(r & 0x7fffff) * 0x1p-23f, e);
            if (r >> 63) x = -x;
        }
        uint8_t got = fp8_e4m3_from_f32(x), want = ref_encode(x);
        if (isnan(x)) assert_true(is_nan_code(got) && (got & 0x80) == (signbit(x) ? 0x80 : 0));
        else if (got != want) fail_msg("x = %a (bits %08x): got 0x%02x, want 0x%02x", (double)x, bits(x), got, want);
        n++;
    }
    assert_int_equal(n, 400000);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_values),
        cmocka_unit_test(test_every_code_round_trips),
        cmocka_unit_test(test_midpoints_round_to_nearest_even),
        cmocka_unit_test(test_saturation),
        cmocka_unit_test(test_nan_inf_zero),
        cmocka_unit_test(test_random_sweep_against_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
