/* util: small helpers shared by the engine modules: file reading, error messages,
 * half-precision conversions, a seeded RNG. Thread-safe (no global state). */
#ifndef DUO_UTIL_H
#define DUO_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Writes a printf-style message into err[errlen] (no-op when err is NULL); returns -1 so
 * callers can `return util_err(err, errlen, "...")`. */
int util_err(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Reads a whole file into a NUL-terminated malloc'd buffer. Returns 0, or -1 with errno set. */
int util_read_file(const char *path, char **out, size_t *len);

/* Writes len bytes to path atomically (temp file + rename). Returns 0 or -1 with errno set. */
int util_write_file(const char *path, const void *data, size_t len);

/* Joins dir and name into a malloc'd path. */
char *util_path_join(const char *dir, const char *name);

/* Monotonic seconds. */
double util_now(void);

static inline float util_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even, as torch does; NaN stays NaN. */
static inline uint16_t util_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float util_f16_to_f32(uint16_t h);

/* xoshiro-style 64-bit generator (splitmix64 seeding): reproducible per seed. */
struct util_rng {
    uint64_t s[4];
};
void util_rng_seed(struct util_rng *r, uint64_t seed);
uint64_t util_rng_next(struct util_rng *r);
/* Uniform in [0, 1) with 24 bits of precision. */
float util_rng_uniform(struct util_rng *r);
/* Standard normal (Box-Muller). */
float util_rng_normal(struct util_rng *r);

#endif
