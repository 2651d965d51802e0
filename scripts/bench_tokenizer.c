/* bench_tokenizer: encoding throughput of the tokenizer.
 *   bench_tokenizer MODEL_DIR TEXT_FILE [SECONDS]
 * Loads MODEL_DIR's tokenizer, encodes the whole of TEXT_FILE (UTF-8) again and again for about
 * SECONDS (default 2) and prints MB/s and tokens/s, plus one decode of the result. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/text/tokenizer.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 20, n = 0;
    char *buf = malloc(cap);
    size_t r;
    while (buf && (r = fread(buf + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) {
            char *p = realloc(buf, cap *= 2);
            if (!p) {
                free(buf);
                buf = NULL;
            }
            buf = p;
        }
    }
    fclose(f);
    if (buf) *len = n;
    return buf;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL_DIR TEXT_FILE [SECONDS]\n", argv[0]);
        return 2;
    }
    double seconds = argc > 3 ? atof(argv[3]) : 2.0;
    char err[512];
    struct tokenizer *tok;
    double t0 = now();
    int rc = tokenizer_load(&tok, argv[1], err, sizeof err);
    if (rc) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    double t_load = now() - t0;
    size_t len;
    char *text = read_all(argv[2], &len);
    if (!text) {
        fprintf(stderr, "%s: cannot read\n", argv[2]);
        tokenizer_free(tok);
        return 1;
    }

    size_t iters = 0, tokens = 0, n_ids = 0;
    int32_t *ids = NULL;
    t0 = now();
    double t = t0;
    do {
        free(ids);
        rc = tokenizer_encode(tok, text, len, false, &ids, &n_ids);
        if (rc) {
            fprintf(stderr, "encode: %s\n", tokenizer_strerror(rc));
            break;
        }
        iters++;
        tokens += n_ids;
        t = now();
    } while (t - t0 < seconds);
    double dt = t - t0;

    double t1 = now();
    char *dec = NULL;
    size_t dec_len = 0;
    if (!rc) rc = tokenizer_decode(tok, ids, n_ids, false, &dec, &dec_len);
    double t_dec = now() - t1;

    if (!rc) {
        printf("load %.3f s; text %zu bytes -> %zu tokens (%.2f bytes/token)\n", t_load, len, n_ids,
               n_ids ? (double)len / (double)n_ids : 0.0);
        printf("encode: %zu iterations in %.2f s: %.2f MB/s, %.0f tokens/s\n", iters, dt,
               (double)len * (double)iters / dt / 1e6, (double)tokens / dt);
        printf("decode: %.2f MB/s; round trip %s\n", (double)dec_len / t_dec / 1e6,
               dec_len == len && !memcmp(dec, text, len) ? "exact" : "differs");
    }
    free(dec);
    free(ids);
    free(text);
    tokenizer_free(tok);
    return rc ? 1 : 0;
}
