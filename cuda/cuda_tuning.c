/* cuda_tuning: the CUDA backend's tuning switches and their one parse rule (cuda_tuning.h). */
#include "cuda/cuda_tuning.h"

#include <stdint.h>
#include <stdlib.h>

#include "engine/util.h"

/* name, range and default of each switch (an on/off switch: 0..1) */
struct tuning_switch {
    const char *name;
    unsigned lo, hi, def;
};

enum { SW_NO_GRAPHS, SW_OP_TIMING, SW_NORM_PDL, SW_ATTN_WG, SW_STREAM_K_MIN_UNITS, SW_COUNT };

static const struct tuning_switch switches[SW_COUNT] = {
    [SW_NO_GRAPHS] = {"DUOSERVE_NO_CUDA_GRAPHS", 0, 1, 0},
    [SW_OP_TIMING] = {"DUOSERVE_OP_TIMING", 0, 1, 0},
    [SW_NORM_PDL] = {"DUOSERVE_NORM_PDL", 0, 1, 1},
    [SW_ATTN_WG] = {"DUOSERVE_ATTN_WG", 0, 1, 1},
    [SW_STREAM_K_MIN_UNITS] = {"DUOSERVE_STREAM_K_MIN_UNITS", 0, 1u << 30, 8192},
};

/* The value of switch s: its default when unset, else the decimal number it holds (digits
 * only, within [lo, hi]), else -1 with the message in err. */
static int switch_value(const struct tuning_switch *s, unsigned *out, char *err, size_t errlen) {
    *out = s->def;
    const char *v = getenv(s->name);
    if (!v) return 0;
    uint64_t n = 0;
    const char *p = v;
    for (; *p >= '0' && *p <= '9' && n <= s->hi; p++) n = n * 10 + (uint64_t)(*p - '0');
    if (p == v || *p || n < s->lo || n > s->hi) {
        if (s->hi == 1) return util_err(err, errlen, "%s=\"%s\": it takes 0 or 1", s->name, v);
        return util_err(err, errlen, "%s=\"%s\": it takes a whole number from %u to %u", s->name, v, s->lo, s->hi);
    }
    *out = (unsigned)n;
    return 0;
}

int cuda_tuning_parse(struct cuda_tuning *t, char *err, size_t errlen) {
    unsigned v[SW_COUNT];
    int rc = 0;
    for (int i = 0; i < SW_COUNT && rc == 0; i++) rc = switch_value(&switches[i], &v[i], err, errlen);
    if (rc) // the defaults
        for (int i = 0; i < SW_COUNT; i++) v[i] = switches[i].def;
    t->no_graphs = v[SW_NO_GRAPHS] != 0;
    t->op_timing = v[SW_OP_TIMING] != 0;
    t->norm_pdl = v[SW_NORM_PDL] != 0;
    t->attn_wg = v[SW_ATTN_WG] != 0;
    t->stream_k_min_units = v[SW_STREAM_K_MIN_UNITS];
    return rc;
}
