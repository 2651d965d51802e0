/* check_kv_dtype: what a KV cache dtype costs in accuracy, on the CPU. For each prompt, the greedy
 * continuation under f32 KV is the reference; under each KV dtype (f32, bf16, fp8 e4m3):
 * - teacher-forced: the prompt and the reference continuation in one prefill: the logprob of each
 *   reference token and the argmax there;
 * - free-running: its own greedy continuation.
 * Printed for bf16 vs f32, fp8 vs f32 and fp8 vs bf16: max and mean |d logprob| of the reference
 * tokens, how often the argmax agrees, and how many free-running ids agree before the first
 * difference (summed over the prompts).
 * Prompts: each --prompt-ids list (at most 8), else the cases of DIR/expected.json (the HF parity
 * fixtures), else BOS alone.
 * The stored K and V values' relative RMS rounding error is measured without a pattern (every
 * head in the full pool).
 *   make build/check_kv_dtype && build/check_kv_dtype MODEL_DIR [--new N] [--pattern TSV --sparsity S]
 *                                                     [--sink N --recent N] [--prompt-ids 1,2,3 ...] */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/duo_pattern.h"
#include "engine/fp8.h"
#include "engine/kv_cache_impl.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "engine/util.h"

#define MAXP 8
#define BS 16

struct opts {
    const char *dir, *pattern;
    const char *prompt_ids[MAXP]; // --prompt-ids lists, in place of the model's prompts
    int n_prompt_ids;
    float sparsity;
    int n_new, sink, recent;
};

struct prompt {
    int32_t *ids; // [n + n_new]: the prompt, then the reference continuation
    int n;
};

static struct model *load(const struct opts *o, struct backend *b, enum kv_dtype dt, int max_tokens) {
    struct model_config mc;
    char err[512];
    uint8_t *streaming = NULL;
    if (model_config_load(&mc, o->dir, err, sizeof err)) goto fail;
    if (o->pattern) {
        struct duo_pattern p;
        if (duo_pattern_load(&p, o->pattern, err, sizeof err)) goto fail;
        streaming = calloc((size_t)mc.n_layers * mc.n_kv_heads, 1);
        duo_pattern_streaming(&p, o->sparsity, streaming);
        duo_pattern_free(&p);
    }
    struct model_load_opts lo = {.max_tokens = max_tokens, .streaming = streaming, .tensor_parallel_size = 1,
                                 .kv_dtype = dt};
    struct model *m;
    int rc = model_load_with(&m, o->dir, b, &lo, err, sizeof err);
    free(streaming);
    if (!rc) return m;
fail:
    fprintf(stderr, "check_kv_dtype: %s\n", err);
    exit(1);
}

/* Runs toks[0, n) through m in one prefill from an empty cache; logits of every row when lg. */
static void prefill(struct model *m, const struct opts *o, struct kv_cache *kv, const int32_t *toks, int n,
                    float *lg) {
    int nb = (n + BS - 1) / BS;
    if (model_kv_cache_init(m, kv, BS, o->sink, o->recent, nb, 1) != KV_STATUS_OK) exit(1);
    int32_t *blocks = malloc(sizeof(int32_t) * (size_t)nb), *pos = malloc(sizeof(int32_t) * (size_t)n);
    int32_t *rows = malloc(sizeof(int32_t) * (size_t)n);
    kv_cache_alloc(kv, nb, blocks);
    for (int i = 0; i < n; i++) pos[i] = rows[i] = i;
    int32_t seq_start[2] = {0, n}, indptr[2] = {0, nb}, slot = 0;
    struct fwd_batch bt = {n, 1, toks, pos, seq_start, indptr, blocks, &slot, lg ? n : 0, rows, NULL, false};
    if (model_forward(m, kv, &bt, lg)) exit(1);
    free(blocks), free(pos), free(rows);
}

/* The greedy continuation of toks[0, n) (n_new ids into toks[n...]), one token a step. */
static void greedy(struct model *m, const struct opts *o, int32_t *toks, int n, int n_new) {
    int total = n + n_new, nb = (total + BS - 1) / BS, V = m->cfg.vocab_size;
    struct kv_cache kv;
    if (model_kv_cache_init(m, &kv, BS, o->sink, o->recent, nb, 1) != KV_STATUS_OK) exit(1);
    int32_t *blocks = malloc(sizeof(int32_t) * (size_t)nb), *pos = malloc(sizeof(int32_t) * (size_t)total);
    float *lg = malloc(sizeof(float) * (size_t)V);
    kv_cache_alloc(&kv, nb, blocks);
    for (int i = 0; i < total; i++) pos[i] = i;
    for (int done = 0, k = n; k < total; k++) {
        int32_t seq_start[2] = {0, k - done}, indptr[2] = {0, nb}, slot = 0, row = k - done - 1;
        struct fwd_batch bt = {k - done, 1, toks + done, pos + done, seq_start, indptr, blocks, &slot, 1, &row, NULL,
                               false};
        if (model_forward(m, &kv, &bt, lg)) exit(1);
        done = k;
        toks[k] = sampler_argmax(lg, V);
    }
    kv_cache_free(&kv);
    free(blocks), free(pos), free(lg);
}

/* The relative RMS rounding error of the K and V values the pools hold in dtype dt (with m's
 * scales) over the f32 runs of every prompt, and the share of them below e4m3's normal range. */
static void stored_error(const struct model *m, const struct opts *o, const struct model *m32, struct prompt *ps,
                         int np, enum kv_dtype dt, double err[2], double sub[2]) {
    int KV = m->sh.n_kv_heads, hd = m->cfg.head_dim;
    double e2[2] = {0}, x2[2] = {0}, ns[2] = {0}, cnt[2] = {0};
    for (int p = 0; p < np; p++) {
        struct kv_cache kv;
        prefill((struct model *)m32, o, &kv, ps[p].ids, ps[p].n + o->n_new, NULL);
        const struct kv_shard *sh = &kv.shards[0];
        for (int l = 0; l < m->cfg.n_layers; l++)
            for (int w = 0; w < 2; w++) {
                const float *a = w ? sh->v_full[l] : sh->k_full[l];
                size_t n = (size_t)(ps[p].n + o->n_new) * sh->n_full[l] * hd; /* blocks 0.. in position order */
                for (size_t i = 0; i < n; i++) {
                    float sc = dt == KV_DTYPE_FP8_E4M3 ? (w ? m->v_scale : m->k_scale)[l * KV + i / hd % sh->n_full[l]]
                                                       : 1.0f;
                    float x = a[i], y = x / sc;
                    float q = dt == KV_DTYPE_FP8_E4M3 ? fp8_e4m3_to_f32(fp8_e4m3_from_f32(y)) * sc
                                                      : util_bf16_to_f32(util_f32_to_bf16(x));
                    e2[w] += (double)(q - x) * (q - x);
                    x2[w] += (double)x * x;
                    ns[w] += fabsf(y) < 0x1p-6f;
                    cnt[w]++;
                }
            }
        kv_cache_free(&kv);
    }
    for (int w = 0; w < 2; w++) {
        err[w] = sqrt(e2[w] / x2[w]);
        sub[w] = ns[w] / cnt[w];
    }
}

/* ---- prompts ---- */

static int read_prompts(const struct opts *o, struct prompt *ps) {
    char *path = util_path_join(o->dir, "expected.json"), *text;
    size_t len;
    int np = 0;
    for (; np < o->n_prompt_ids; np++) {
        struct prompt *p = &ps[np];
        p->n = 1;
        for (const char *c = o->prompt_ids[np]; *c; c++) p->n += *c == ',';
        p->ids = malloc(sizeof(int32_t) * (size_t)(p->n + o->n_new));
        const char *c = o->prompt_ids[np];
        for (int i = 0; i < p->n; i++) {
            char *e;
            p->ids[i] = (int32_t)strtol(c, &e, 10);
            c = *e ? e + 1 : e;
        }
    }
    if (np) {
    } else if (util_read_file(path, &text, &len) == 0) {
        cJSON *j = cJSON_ParseWithLength(text, len), *c;
        cJSON_ArrayForEach(c, cJSON_GetObjectItem(j, "cases")) {
            const cJSON *ids = cJSON_GetObjectItem(c, "prompt_ids"), *it;
            if (np == MAXP) break;
            struct prompt *p = &ps[np++];
            p->n = cJSON_GetArraySize(ids);
            p->ids = malloc(sizeof(int32_t) * (size_t)(p->n + o->n_new));
            int i = 0;
            cJSON_ArrayForEach(it, ids) p->ids[i++] = (int32_t)it->valuedouble;
        }
        cJSON_Delete(j);
        free(text);
    } else {
        ps[0].n = 1;
        ps[0].ids = malloc(sizeof(int32_t) * (size_t)(1 + o->n_new));
        ps[0].ids[0] = 1; /* BOS */
        np = 1;
    }
    free(path);
    return np;
}

int main(int argc, char **argv) {
    struct opts o = {.n_new = 64, .sink = 4, .recent = 32, .sparsity = 0.5f};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(a, "--new")) o.n_new = atoi(v), i++;
        else if (!strcmp(a, "--pattern")) o.pattern = v, i++;
        else if (!strcmp(a, "--sparsity")) o.sparsity = (float)atof(v), i++;
        else if (!strcmp(a, "--sink")) o.sink = atoi(v), i++;
        else if (!strcmp(a, "--recent")) o.recent = atoi(v), i++;
        else if (!strcmp(a, "--prompt-ids") && o.n_prompt_ids < MAXP) o.prompt_ids[o.n_prompt_ids++] = v, i++;
        else if (a[0] != '-' && !o.dir) o.dir = a;
        else {
            fprintf(stderr,
                    "usage: %s MODEL_DIR [--new N] [--pattern TSV --sparsity S] [--sink N --recent N] "
                    "[--prompt-ids 1,2,3 ...]\n",
                    argv[0]);
            return 2;
        }
    }
    if (!o.dir) return 2;
    struct prompt ps[MAXP];
    int np = read_prompts(&o, ps), max_len = 0;
    for (int p = 0; p < np; p++) max_len = ps[p].n + o.n_new > max_len ? ps[p].n + o.n_new : max_len;
    struct backend *b = backend_cpu_create();
    struct model *m32 = load(&o, b, KV_DTYPE_ACT, max_len);
    int V = m32->cfg.vocab_size, N = np * o.n_new;
    float *lg = malloc(sizeof(float) * (size_t)max_len * V), *lp = malloc(sizeof(float) * V);
    /* per dtype (f32, bf16, fp8): teacher-forced logprob and argmax at each reference position, and
     * its own greedy continuation */
    enum { ND = 3 };
    const enum kv_dtype dts[ND] = {KV_DTYPE_ACT, KV_DTYPE_BF16, KV_DTYPE_FP8_E4M3};
    const char *names[ND] = {"f32", "bf16", "fp8"};
    float *tlp[ND];
    int32_t *targ[ND], *run[ND];
    for (int p = 0; p < np; p++) greedy(m32, &o, ps[p].ids, ps[p].n, o.n_new); /* the reference continuation */
    for (int d = 0; d < ND; d++) {
        struct model *m = d ? load(&o, b, dts[d], max_len) : m32;
        tlp[d] = malloc(sizeof(float) * (size_t)N);
        targ[d] = malloc(sizeof(int32_t) * (size_t)N);
        run[d] = malloc(sizeof(int32_t) * (size_t)N);
        for (int p = 0; p < np; p++) {
            struct kv_cache kv;
            prefill(m, &o, &kv, ps[p].ids, ps[p].n + o.n_new, lg);
            kv_cache_free(&kv);
            for (int i = 0; i < o.n_new; i++) {
                const float *row = lg + (size_t)(ps[p].n - 1 + i) * V;
                sampler_log_softmax(row, V, lp);
                tlp[d][p * o.n_new + i] = lp[ps[p].ids[ps[p].n + i]];
                targ[d][p * o.n_new + i] = sampler_argmax(row, V);
            }
            int32_t *mine = malloc(sizeof(int32_t) * (size_t)(ps[p].n + o.n_new));
            memcpy(mine, ps[p].ids, sizeof(int32_t) * (size_t)ps[p].n);
            greedy(m, &o, mine, ps[p].n, o.n_new);
            memcpy(run[d] + p * o.n_new, mine + ps[p].n, sizeof(int32_t) * (size_t)o.n_new);
            free(mine);
        }
        if (d && !o.pattern) {
            double err[2], sub[2];
            stored_error(m, &o, m32, ps, np, dts[d], err, sub);
            printf("%-4s stored K, V: rel RMS rounding error %.2f%%, %.2f%%", names[d], 100 * err[0], 100 * err[1]);
            if (dts[d] == KV_DTYPE_FP8_E4M3)
                printf("; e4m3 subnormal (|x / scale| < 2^-6) %.2f%%, %.2f%%", 100 * sub[0], 100 * sub[1]);
            printf("\n");
        }
        if (d) model_free(m);
    }
    const int pairs[3][2] = {{1, 0}, {2, 0}, {2, 1}};
    for (int k = 0; k < 3; k++) {
        int x = pairs[k][0], y = pairs[k][1], agree = 0, runs = 0;
        double max_d = 0, sum_d = 0;
        for (int i = 0; i < N; i++) {
            double dl = fabs((double)tlp[x][i] - tlp[y][i]);
            max_d = dl > max_d ? dl : max_d;
            sum_d += dl;
            agree += targ[x][i] == targ[y][i];
        }
        for (int p = 0; p < np; p++)
            for (int i = 0; i < o.n_new && run[x][p * o.n_new + i] == run[y][p * o.n_new + i]; i++) runs++;
        printf("%-4s vs %-4s %s: %d tokens, |d logprob| max %.2e mean %.2e; greedy ids agree %d/%d teacher-forced, "
               "%d/%d free-running (before the first difference)\n",
               names[x], names[y], o.pattern ? "duo " : "full", N, max_d, sum_d / N, agree, N, runs, N);
    }
    for (int d = 0; d < ND; d++) free(tlp[d]), free(targ[d]), free(run[d]);
    for (int p = 0; p < np; p++) free(ps[p].ids);
    free(lg), free(lp);
    model_free(m32);
    backend_destroy(b);
    return 0;
}
