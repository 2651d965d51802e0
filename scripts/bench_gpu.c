/* bench_gpu: speed of the engine on one model and backend: load time, the memory plan (logged
 * by the engine), decode ms/token at several batch sizes, prefill tokens/s at several lengths.
 *
 *   build/bench_gpu MODEL_DIR [cuda|cpu] [--decode 1,8,64,256] [--decode-ctx 128] [--runs BxCTX,..]
 *                   [--steps 64] [--skip-prefill] [--mixed L] [--prefill 2048,32768] [--gemm cublas] [--tp N]
 *                   [--load-format dummy]
 *                   [--duo-pattern FILE --duo-sparsity S] [--gpu-memory-utilization F]
 *
 * --tp N splits the model over N GPUs (tensor parallelism); --load-format dummy makes random
 * weights from MODEL_DIR/config.json alone (shapes whose checkpoints are not at hand);
 * --duo-pattern and --duo-sparsity are the server's (DuoAttention's streaming heads).
 *
 * Decode: B requests with 128-token prompts (--decode-ctx) are prefilled, then the time of decode steps
 * (every running sequence emits one token per step) is measured over 64 steps (--steps); --runs
 * 1x131072,8x98304 lists batch size x context pairs instead of --decode at --decode-ctx. --skip-prefill
 * makes the context without a prefill (a benchmark-only hook, engine/core_bench.h): one-token
 * prompts, then decode-ctx - 1 positions of KV cache that were never computed (zeros in a fresh
 * pool), so contexts up to 1,048,576 take no prefill time; decode costs the same whatever the
 * K/V values. --mixed L: after each decode run's timed steps, a prompt of L tokens (max_tokens 1,
 * missing the prefix cache) joins the B decoding sequences, and the steps until it finishes (each a
 * mixed step: a chunk of it beside the B decodes, as the scheduler sizes them) are timed; one line
 * a run: "mixed batch B, context x, prompt L: N steps, M ms/step (decode alone D ms/step; C from
 * the prefix cache)", D the run's decode-only time just before, C the prompt tokens the cache held
 * (0). Prefill: one request of L tokens with max_tokens 1, token budget L (one step, or chunks
 * of 8192). */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/core_bench.h"
#include "engine/engine_core.h"
#include "engine/model_config.h"
#include "engine/util.h"

/* ud: NULL, or an int that a FINISH event's cached prompt tokens go to */
static void on_event(void *ud, const struct engine_event *ev) {
    if (ud && ev->type == ENGINE_EVENT_FINISH) *(int *)ud = ev->cached_tokens;
    free(ev->text);
}

static int parse_list(const char *s, int *out, int max) {
    int n = 0;
    while (*s && n < max) {
        out[n++] = atoi(s);
        const char *c = strchr(s, ',');
        if (!c) break;
        s = c + 1;
    }
    return n;
}

static struct engine_sampling greedy(int n) {
    return (struct engine_sampling){.n = 1, .max_tokens = n, .top_p = 1, .repetition_penalty = 1, .ignore_eos = true,
                                    .skip_special_tokens = true, .logprobs = -1};
}

#ifdef FA_CLOCKS
int cuda_attention_clocks(long long *out);
#endif
/* An FA_CLOCKS build (profiling): the last decode attention call's phase stamps, block (0, 0, 0):
 * cycles from entry of stamps 1..42, then %globaltimer ns from entry: 50 the q|k|v wait returned,
 * 51 RoPE done, 49 the partition loop done; 52 / 53 the merge of (token 0, KV head 0) began / ended. */
static void print_fa_clocks(void) {
#ifdef FA_CLOCKS
    long long c[64];
    if (cuda_attention_clocks(c) != 64) return;
    printf("  flash stamps (cycles):");
    for (int i = 1; i <= 42; i++)
        if (c[i] > c[0]) printf(" %d:%lld", i, c[i] - c[0]);
    printf("\n  flash globaltimer (ns from entry):");
    for (int i = 49; i <= 53; i++)
        if (c[i] > c[48]) printf(" %d:%lld", i, c[i] - c[48]);
    printf("\n");
#endif
}

#define BENCH_MAX_CTX (1 << 21) /* contexts and prompts: up to 2,097,152 positions */
#define BENCH_MIN_LEN 65536     /* --max-model-len at least this (or the model's, if shorter; longer when a
                                   run needs it: past the model's, DUOSERVE_ALLOW_LONG_MAX_MODEL_LEN=1) */

/* "1x131072,8x98304": batch size x context pairs; returns how many (0 on a malformed list) */
static int parse_runs(const char *s, int (*out)[2], int max) {
    int n = 0;
    while (*s && n < max) {
        char *e;
        long bsz = strtol(s, &e, 10), ctx = *e == 'x' ? strtol(e + 1, &e, 10) : 0;
        if (bsz < 1 || ctx < 1 || (*e && *e != ',')) return 0;
        out[n][0] = (int)bsz, out[n++][1] = (int)ctx;
        s = *e ? e + 1 : e;
    }
    return n;
}

/* the command line */
struct bench_opts {
    const char *model, *dev, *gemm, *load_format, *pattern, *kv_dtype;
    int dec[16], n_dec, pre[16], n_pre, runs[32][2], n_runs, dctx, tp, steps;
    int mixed; // --mixed L: a prompt of L tokens beside each decode run (0: none)
    float sparsity, util;
    bool skip;
};

/* 0, or 2 after the message (a malformed --runs) */
static int parse_opts(int argc, char **argv, struct bench_opts *o) {
    *o = (struct bench_opts){.model = argv[1], .dev = argc > 2 && argv[2][0] != '-' ? argv[2] : "cuda",
                             .dec = {1, 8, 64, 256}, .n_dec = 4, .pre = {2048, 32768}, .n_pre = 2, .dctx = 128,
                             .tp = 1, .steps = 64};
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--skip-prefill")) o->skip = true;
        if (i + 1 >= argc) continue;
        if (!strcmp(argv[i], "--decode-ctx")) o->dctx = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--decode")) o->n_dec = parse_list(argv[i + 1], o->dec, 16);
        if (!strcmp(argv[i], "--runs") && !(o->n_runs = parse_runs(argv[i + 1], o->runs, 32))) {
            fprintf(stderr, "bench_gpu: --runs takes BATCHxCONTEXT pairs, e.g. 1x131072,8x98304\n");
            return 2;
        }
        if (!strcmp(argv[i], "--steps")) o->steps = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--mixed")) o->mixed = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--prefill")) o->n_pre = parse_list(argv[i + 1], o->pre, 16);
        if (!strcmp(argv[i], "--gemm")) o->gemm = argv[i + 1];
        if (!strcmp(argv[i], "--tp")) o->tp = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--load-format")) o->load_format = argv[i + 1];
        if (!strcmp(argv[i], "--duo-pattern")) o->pattern = argv[i + 1];
        if (!strcmp(argv[i], "--kv-cache-dtype")) o->kv_dtype = argv[i + 1];
        if (!strcmp(argv[i], "--duo-sparsity")) o->sparsity = (float)atof(argv[i + 1]);
        if (!strcmp(argv[i], "--gpu-memory-utilization")) o->util = (float)atof(argv[i + 1]);
    }
    /* the decode runs: --runs, else every batch size of --decode at --decode-ctx */
    if (!o->n_runs)
        for (int i = 0; i < o->n_dec; i++) o->runs[o->n_runs][0] = o->dec[i], o->runs[o->n_runs++][1] = o->dctx;
    if (o->steps < 1) o->steps = 1;
    if (o->mixed < 0) o->mixed = 0;
    return 0;
}

/* The most steps a --mixed prompt of L tokens is given (the scheduler gives the oldest prefill at
 * least min_chunk tokens a step, a KV block of 16 or more), and the tokens a decode run's
 * sequences generate at most: the prefill's, the warm-up and timed steps', and with --mixed those
 * steps' and one more, so that all of them still decode when the prompt finishes. */
static int mixed_steps(int L) { return L / 16 + 16; }
static int decode_tokens(const struct bench_opts *o, int warm) {
    return o->steps + warm + 2 + (o->mixed ? mixed_steps(o->mixed) + 1 : 0);
}

/* BENCH_PROFILE: per-op times at batch 1 on this model's shapes, then each GEMM at decode and
 * prefill batch sizes: time and the weight bandwidth it implies */
static void profile_ops(struct core *c) {
    const struct model *m = core_model(c);
    struct backend *b = m->b;
    const struct backend_ops *op = b->ops;
    int D = m->cfg.dim, F = m->cfg.hidden_dim, QKV = (m->cfg.n_heads + 2 * m->cfg.n_kv_heads) * m->cfg.head_dim;
    int V = m->cfg.vocab_size;
    int32_t tok = 5, pos = 100, ss[2] = {0, 1}, ip[2] = {0, 0}, row = 0;
    struct fwd_batch bt = {1, 1, &tok, &pos, ss, ip, NULL, NULL, 1, &row, NULL, false};
    op->begin_step(b, &bt);
    op->sync(b);
    const struct layer_weights *w = &m->layers[0];
    struct {
        const char *name;
        int kind;
    } ops[] = {{"add_rmsnorm 4096", 0}, {"silu_mul 14336", 4}, {"rope", 6}, {"begin_step+sync", 8}};
    for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
        int reps = 200;
        op->sync(b);
        double t1 = util_now();
        for (int r = 0; r < reps; r++) {
            switch (ops[k].kind) {
            case 0: op->add_rmsnorm(b, m->h, m->x, m->o, w->attn_norm, 1, D, 1e-5f); break;
            case 4: op->silu_mul(b, m->act, m->gu, 1, F); break;
            case 6: op->rope(b, m->qkv, m->cfg.n_heads + m->cfg.n_kv_heads, m->cfg.head_dim, QKV, m->inv_freq); break;
            case 8: op->begin_step(b, &bt); op->sync(b); break;
            }
        }
        op->sync(b);
        printf("profile %-28s %8.1f us\n", ops[k].name, (util_now() - t1) / reps * 1e6);
    }
    int Ms[] = {1, 8, 16, 32, 64, 256, 2048};
    for (int g = 0; g < 5; g++) {
        const char *gname[] = {"qkv", "wo", "gate|up", "down", "logits"};
        int gn[] = {QKV, D, 2 * F, D, V}, gk[] = {D, m->cfg.n_heads * m->cfg.head_dim, D, F, D};
        const void *gw[] = {w->wqkv, w->wo, w->w_gateup, w->w_down, m->lm_head};
        void *gout[] = {m->qkv, m->o, m->gu, m->o, NULL};
        const void *gin[] = {m->h, m->att, m->h, m->act, m->h};
        for (int mi = 0; mi < (int)(sizeof Ms / sizeof Ms[0]); mi++) {
            int M = Ms[mi], reps = M >= 2048 ? 5 : 50;
            if (M > m->max_tokens || (g == 4 && M > 256)) continue;
            op->sync(b);
            double t1 = 0;
            for (int r = -1; r < reps; r++) { /* r = -1: warm-up (first logits call sizes buffers) */
                if (r == 0) op->sync(b), t1 = util_now();
                if (g == 4) op->logits(b, NULL, gin[g], gw[g], M, gn[g], gk[g]);
                else op->matmul(b, gout[g], gin[g], gw[g], NULL, M, gn[g], gk[g]);
            }
            op->sync(b);
            double us = (util_now() - t1) / reps * 1e6;
            printf("profile gemm %-8s M %5d  N %6d K %5d %9.1f us  %6.0f GB/s  %6.1f TFLOP/s\n", gname[g], M, gn[g],
                   gk[g], us, (double)gn[g] * gk[g] * 2 / us * 1e-3, 2.0 * M * gn[g] * gk[g] / us * 1e-6);
        }
    }
}

/* --mixed, after decode run k's timed steps (B sequences decoding at context x, ms_decode a step):
 * a prompt of L tokens (max_tokens 1) joins them, its first token one that no earlier prompt had
 * (nor run_prefill's), so that the prefix cache misses, and the steps until it finishes are timed
 * (at most mixed_steps(L); "[unfinished]" when it took more, and it is aborted). */
static void run_mixed(struct core *c, const struct bench_opts *o, int32_t *prompt, int V, int k, int B, int x,
                      double ms_decode) {
    char err[512];
    const int L = o->mixed, max_steps = mixed_steps(L);
    const int32_t first = prompt[0];
    struct engine_request r = {prompt, L, greedy(1)};
    prompt[0] = (int32_t)((first + 1 + o->n_pre + k) % V); /* run_prefill's are first + 1 .. first + n_pre */
    int cached = -1, n = 0;
    struct core_request *req;
    int rc = core_add(c, &r, on_event, &cached, &req, err, sizeof err);
    prompt[0] = first;
    if (rc) {
        fprintf(stderr, "bench_gpu: --mixed %d: %s\n", L, err);
        return;
    }
    double t1 = util_now();
    while (cached < 0 && n < max_steps) {
        core_step(c);
        n++;
    }
    double dt = util_now() - t1;
    const bool finished = cached >= 0;
    if (!finished) core_abort(c, req); /* (its FINISH event, into cached, comes now) */
    printf("mixed batch %4d, context %5d, prompt %6d: %4d steps, %7.2f ms/step (decode alone %7.2f ms/step; %d from "
           "the prefix cache)%s\n",
           B, x, L, n, dt / n * 1e3, ms_decode, finished ? cached : -1, finished ? "" : " [unfinished]");
    fflush(stdout);
}

/* Aborts those of the n requests that have not finished (fin[i] < 0: no FINISH event yet, so the
 * request is still there), so that no event of theirs comes after fin is gone. */
static void abort_unfinished(struct core *c, struct core_request **reqs, const int *fin, int n) {
    for (int i = 0; i < n; i++)
        if (fin[i] < 0) core_abort(c, reqs[i]);
}

/* Each decode run: B sequences at context x (prefilled, or made without a prefill with
 * --skip-prefill), then steps timed steps, then with --mixed the mixed steps (run_mixed), after
 * which the B sequences are aborted. 0, or 1 after the message. */
static int run_decode(struct core *c, const struct bench_opts *o, int32_t *prompt, int V, int warm) {
    char err[512];
    for (int k = 0; k < o->n_runs; k++) {
        int B = o->runs[k][0], x = o->runs[k][1], plen = o->skip ? 1 : x, steps = o->steps;
        /* each request, and its FINISH event's count (-1 before it): unfinished ones may be aborted */
        struct core_request **reqs = malloc(sizeof *reqs * (size_t)B);
        int *fin = malloc(sizeof *fin * (size_t)B);
        if (!reqs || !fin) {
            fprintf(stderr, "bench_gpu: out of memory\n");
            free(reqs), free(fin);
            return 1;
        }
        for (int i = 0; i < B; i++) {
            struct engine_request r = {prompt + i, plen, greedy(decode_tokens(o, warm))};
            fin[i] = -1;
            if (core_add(c, &r, on_event, &fin[i], &reqs[i], err, sizeof err)) {
                fprintf(stderr, "bench_gpu: %s\n", err);
                abort_unfinished(c, reqs, fin, i);
                free(reqs), free(fin);
                return 1;
            }
        }
        /* prefill (and the first token) until every sequence decodes one token per step */
        while (core_step(c) != B) {
        }
        if (o->skip) { /* the context without its prefill, then steps at it until its graph is captured */
            if (core_bench_skip_context(c, x - 1, err, sizeof err) != B) {
                fprintf(stderr, "bench_gpu: --skip-prefill at context %d, batch %d: %s\n", x, B, err);
                abort_unfinished(c, reqs, fin, B);
                free(reqs), free(fin);
                return 1;
            }
            for (int s = 0; s < warm; s++) core_step(c);
        }
        struct engine_stats s0, s1;
        core_stats(c, &s0);
        double t1 = util_now();
        for (int s = 0; s < steps; s++) core_step(c);
        double dt = util_now() - t1;
        core_stats(c, &s1);
        printf("decode batch %4d, context %5d: %7.2f ms/step, %9.1f tokens/s (forward %.2f ms, sampling %.2f ms per step)%s\n", B,
               x, dt / steps * 1e3, B * steps / dt, (s1.forward_seconds - s0.forward_seconds) / steps * 1e3,
               (s1.sample_seconds - s0.sample_seconds) / steps * 1e3, o->skip ? " [skipped prefill]" : "");
        fflush(stdout);
        print_fa_clocks();
        if (o->mixed) {
            run_mixed(c, o, prompt, V, k, B, x, dt / steps * 1e3);
            abort_unfinished(c, reqs, fin, B); /* (they have tokens left: decode_tokens) */
        }
        while (core_has_work(c)) core_step(c);
        free(reqs), free(fin);
    }
    return 0;
}

/* Each prefill: a prompt of L tokens alone (after a short warm-up prompt), its time. Each measured
 * prompt starts with a token of its own, so that none of its blocks is in the prefix cache (the
 * decode runs', the warm-up's and the earlier prefills' prompts are prefixes of the same array);
 * the line says how many prompt tokens the cache held (0; -1 if the request never finished). */
static void run_prefill(struct core *c, const struct bench_opts *o, int32_t *prompt, int V) {
    char err[512];
    const int32_t first = prompt[0];
    for (int k = 0; k < o->n_pre; k++) {
        int L = o->pre[k];
        if (L <= 0) continue;
        struct engine_request r = {prompt, L, greedy(1)};
        /* warm-up on a short prompt, then the measured one */
        struct engine_request w = {prompt, 64, greedy(1)};
        prompt[0] = first;
        core_add(c, &w, on_event, NULL, NULL, err, sizeof err);
        while (core_has_work(c)) core_step(c);
        prompt[0] = (int32_t)((first + 1 + k) % V);
        int cached = -1;
        double t1 = util_now();
        if (core_add(c, &r, on_event, &cached, NULL, err, sizeof err)) {
            fprintf(stderr, "bench_gpu: %s\n", err);
            continue;
        }
        while (core_has_work(c)) core_step(c);
        double dt = util_now() - t1;
        printf("prefill %6d tokens: %8.1f ms, %9.1f tokens/s (%d from the prefix cache)\n", L, dt * 1e3, L / dt, cached);
    }
    prompt[0] = first;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL_DIR [cuda|cpu] [--decode 1,8,64,256] [--decode-ctx 128] [--runs BxCTX,..] "
                        "[--steps 64] [--skip-prefill] [--mixed L] [--prefill 2048,32768] "
                        "[--duo-pattern FILE --duo-sparsity S] [--kv-cache-dtype auto|bf16|fp8]\n",
                argv[0]);
        return 2;
    }
    struct bench_opts o;
    if (parse_opts(argc, argv, &o)) return 2;
    const int warm = 2; /* decode steps before the timed ones (--skip-prefill) */
    /* the prompt array: every prefill (--mixed's too), and a prefilled context for each sequence of a
     * batch (sequence i's prompt starts at i); --max-model-len: those and their tokens (skipped
     * contexts: core_bench makes room); seats: the largest batch, and the --mixed prompt beside it */
    struct model_config mc;
    char err[512];
    int max_b = 1, n_prompt = 64,
        max_len = model_config_load(&mc, o.model, err, sizeof err) == 0 && mc.max_pos < BENCH_MIN_LEN ? mc.max_pos
                                                                                                      : BENCH_MIN_LEN;
    for (int i = 0; i < o.n_runs; i++) {
        int B = o.runs[i][0], x = o.runs[i][1], len = (o.skip ? 1 : x) + decode_tokens(&o, warm);
        if (x > BENCH_MAX_CTX) {
            fprintf(stderr, "bench_gpu: batch %d at context %d: contexts go up to %d\n", B, x, BENCH_MAX_CTX);
            return 2;
        }
        max_b = B > max_b ? B : max_b;
        if (B + 1 > n_prompt) n_prompt = B + 1;
        if (len > max_len) max_len = len; /* the prompt and every token it decodes */
        if (o.skip) continue;
        if (x + B > n_prompt) n_prompt = x + B;
    }
    if (o.mixed > BENCH_MAX_CTX) {
        fprintf(stderr, "bench_gpu: --mixed %d: prompts go up to %d\n", o.mixed, BENCH_MAX_CTX);
        return 2;
    }
    if (o.mixed > n_prompt) n_prompt = o.mixed;
    if (o.mixed + 2 > max_len) max_len = o.mixed + 2;
    for (int k = 0; k < o.n_pre; k++) {
        if (o.pre[k] > BENCH_MAX_CTX) {
            fprintf(stderr, "bench_gpu: prefill %d: prompts go up to %d\n", o.pre[k], BENCH_MAX_CTX);
            return 2;
        }
        if (o.pre[k] > n_prompt) n_prompt = o.pre[k];
        if (o.pre[k] + 2 > max_len) max_len = o.pre[k] + 2;
    }
    struct engine_config cfg = {.model_dir = o.model, .device = o.dev, .gemm = o.gemm, .max_num_seqs = max_b + (o.mixed > 0),
                                .max_num_batched_tokens = 8192, .max_model_len = max_len,
                                .tensor_parallel_size = o.tp, .load_format = o.load_format, .duo_pattern = o.pattern,
                                .duo_sparsity = o.sparsity, .gpu_memory_utilization = o.util, .kv_cache_dtype = o.kv_dtype,
                                .no_prefix_caching = o.skip};
    struct core *c;
    double t0 = util_now();
    if (core_create(&c, &cfg, err, sizeof err)) {
        fprintf(stderr, "bench_gpu: %s\n", err);
        return 1;
    }
    printf("load: %.2f s (%s, %s, gemm %s", util_now() - t0, o.model, o.dev, o.gemm ? o.gemm : "invariant");
    if (o.pattern) printf(", duo %s at sparsity %.2f", o.pattern, (double)o.sparsity);
    printf(", KV cache %s", core_kv_dtype(c));
    printf(")\n");
    if (getenv("BENCH_PROFILE")) profile_ops(c);
    int V = core_model(c)->cfg.vocab_size;
    int32_t *prompt = malloc(sizeof *prompt * (size_t)n_prompt);
    if (!prompt) {
        fprintf(stderr, "bench_gpu: out of memory\n");
        core_free(c);
        return 1;
    }
    for (int i = 0; i < n_prompt; i++)
        prompt[i] = (int32_t)(V > 4000 ? 1000 + (i * 7919LL) % (V - 2000) : 3 + (i * 7919LL) % (V - 3));
    int rc = run_decode(c, &o, prompt, V, warm);
    if (!rc) run_prefill(c, &o, prompt, V);
    free(prompt);
    core_free(c);
    return rc;
}
