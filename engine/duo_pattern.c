#include "engine/duo_pattern.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/util.h"

void duo_pattern_free(struct duo_pattern *p) {
    if (!p) return;
    free(p->gates);
    memset(p, 0, sizeof *p);
}

int duo_pattern_parse(struct duo_pattern *p, const char *text, char *err, size_t errlen) {
    memset(p, 0, sizeof *p);
    size_t cap = 64, n = 0;
    float *g = malloc(cap * sizeof *g);
    int rows = 0, cols = -1;
    const char *s = text;
    while (g && *s) {
        const char *eol = strchr(s, '\n');
        if (!eol) eol = s + strlen(s);
        int c = 0;
        const char *q = s;
        while (q < eol) {
            while (q < eol && (*q == ' ' || *q == '\t' || *q == '\r')) q++;
            if (q >= eol) break;
            char *end;
            errno = 0;
            float v = strtof(q, &end);
            if (end == q || end > eol || errno || !isfinite(v)) {
                free(g);
                return util_err(err, errlen, "line %d: not a number", rows + 1);
            }
            if (n == cap) {
                float *ng = realloc(g, (cap *= 2) * sizeof *g);
                if (!ng) break;
                g = ng;
            }
            g[n++] = v;
            c++;
            q = end;
        }
        if (c > 0) {
            if (cols >= 0 && c != cols) {
                free(g);
                return util_err(err, errlen, "line %d has %d gates, line 1 has %d", rows + 1, c, cols);
            }
            cols = c;
            rows++;
        }
        s = *eol ? eol + 1 : eol;
    }
    if (!g) return util_err(err, errlen, "out of memory");
    if (rows == 0) {
        free(g);
        return util_err(err, errlen, "no gates");
    }
    p->gates = g;
    p->n_layers = rows;
    p->n_kv_heads = cols;
    return 0;
}

int duo_pattern_load(struct duo_pattern *p, const char *path, char *err, size_t errlen) {
    char *text;
    if (util_read_file(path, &text, NULL) != 0) return util_err(err, errlen, "%s: %s", path, strerror(errno));
    char why[256];
    int rc = duo_pattern_parse(p, text, why, sizeof why);
    free(text);
    if (rc) util_err(err, errlen, "%s: %s", path, why);
    return rc;
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

float duo_pattern_quantile(const struct duo_pattern *p, float q) {
    size_t n = (size_t)p->n_layers * p->n_kv_heads;
    float *s = malloc(n * sizeof *s);
    if (!s) return NAN;
    memcpy(s, p->gates, n * sizeof *s);
    qsort(s, n, sizeof *s, cmp_float);
    double idx = (double)q * (double)(n - 1);
    size_t lo = (size_t)floor(idx), hi = lo + 1 < n ? lo + 1 : lo;
    double frac = idx - (double)lo;
    float r = (float)((double)s[lo] + frac * ((double)s[hi] - (double)s[lo]));
    free(s);
    return r;
}

int duo_pattern_streaming(const struct duo_pattern *p, float sparsity, uint8_t *is_streaming) {
    float thr = duo_pattern_quantile(p, sparsity);
    int n = 0;
    for (int i = 0; i < p->n_layers * p->n_kv_heads; i++) {
        is_streaming[i] = p->gates[i] < thr;
        n += is_streaming[i];
    }
    return n;
}
