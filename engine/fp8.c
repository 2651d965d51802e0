#include "engine/fp8.h"

#include <math.h>
#include <string.h>

uint8_t fp8_e4m3_from_f32(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7f; /* NaN */
    if (a >= 0x43e00000u) return sign | 0x7e; /* >= 448, Inf included: saturate */
    if (a < 0x3c800000u) {                    /* below 2^-6: a multiple of 2^-9 (8 of them is 2^-6, code 0x08) */
        float x = fabsf(f) * 512.0f;          /* exact: a power-of-two scaling up */
        uint32_t m = (uint32_t)x;
        float frac = x - (float)m;
        if (frac > 0.5f || (frac == 0.5f && (m & 1u))) m++;
        return sign | (uint8_t)m;
    }
    /* normal: keep 3 of the 23 mantissa bits, ties to even (a carry moves into the exponent), then
     * rebias the exponent from 127 to 7; below 448 nothing rounds past 0x7E */
    uint32_t r = (a + 0x7ffffu + ((a >> 20) & 1u)) >> 20;
    return sign | (uint8_t)(r - (120u << 3));
}

float fp8_e4m3_to_f32(uint8_t b) {
    uint32_t e = (b >> 3) & 15u, m = b & 7u, sign = (uint32_t)(b & 0x80u) << 24;
    float v;
    if (e == 15 && m == 7) {
        v = NAN;
    } else if (e == 0) {
        v = (float)m * 0x1p-9f; /* subnormal */
    } else {
        uint32_t u = ((e + 120u) << 23) | (m << 20);
        memcpy(&v, &u, 4);
    }
    uint32_t u;
    memcpy(&u, &v, 4);
    u |= sign;
    memcpy(&v, &u, 4);
    return v;
}
