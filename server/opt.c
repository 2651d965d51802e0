/* opt: flag tables, their parse rule, error wording and help lines. */
#include "server/opt.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"

#define MIB 1048576.0
#define TIB 1099511627776.0

#define E(field) offsetof(struct engine_config, field)
const struct opt opt_engine[] = {
    {"device", NULL, OPT_CHOICE, E(device), 0, 0, "auto|cpu|cuda",
     "backend (default auto: the GPU when it is an NVIDIA H100/H200 (sm_90), else the CPU)"},
    {"gemm", NULL, OPT_CHOICE, E(gemm), 0, 0, "invariant|cublas",
     "CUDA GEMMs: batch-invariant kernels (default) or cuBLAS (faster prefill and big batches; outputs may then "
     "depend on batching)"},
    {"max-model-len", NULL, OPT_INT, E(max_model_len), 1, 1 << 24, "N", "prompt + output limit (default: the model's)"},
    {"max-num-seqs", NULL, OPT_INT, E(max_num_seqs), 1, 65536, "N", "sequences running at once (default: 64 on the CPU; on a GPU as many as the KV cache holds at 1024 tokens each, 64 to 512; generate 8)"},
    {"max-num-batched-tokens", "--prefill-chunk", OPT_INT, E(max_num_batched_tokens), 1, 1 << 24, "N",
     "tokens per engine step, the prefill chunk (default 2048; also --prefill-chunk)"},
    {"step-cost-budget", NULL, OPT_INT, E(step_cost_budget), 1, 1 << 24, "N",
     "while requests decode, a step costs at most what N prompt tokens from position 0 cost; attention over a "
     "long prefix counts extra (on a GPU by the prefill kernel's waves of blocks), so a long prompt's chunks "
     "shrink as it grows and decodes beside it keep their pace (default: 1.75 x --max-num-batched-tokens on a "
     "GPU, 1 x on the CPU)"},
    {"block-size", NULL, OPT_INT, E(block_size), 1, 1024, "N", "KV block size in tokens (default 16)"},
    {"kv-cache-memory", NULL, OPT_BYTES, E(kv_cache_memory), MIB, TIB, "BYTES",
     "memory for both KV pools, e.g. 512MiB or 4G (default: 256MiB on the CPU; on a GPU what "
     "--gpu-memory-utilization leaves)"},
    {"kv-cache-dtype", NULL, OPT_CHOICE, E(kv_cache_dtype), 0, 0, "auto|bf16|bfloat16|fp8|fp8_e4m3",
     "KV cache elements: auto (the activations': f32 on the CPU, bf16 on a GPU), bf16, or fp8 (e4m3, 1 byte, "
     "scale 1; fp8_e4m3 is the same) (default auto)"},
    {"gpu-memory-utilization", NULL, OPT_FLOAT, E(gpu_memory_utilization), 0.01, 1, "F",
     "CUDA: fraction of the GPU's memory to use (default 0.9)"},
    {"duo-pattern", NULL, OPT_STR, E(duo_pattern), 0, 0, "FILE",
     "DuoAttention full_attention_heads.tsv (default: all heads keep the full KV cache)"},
    {"duo-sparsity", NULL, OPT_FLOAT, E(duo_sparsity), 0, 1, "F", "with --duo-pattern: fraction of heads made streaming (default 0.5)"},
    {"tensor-parallel-size", "-tp", OPT_INT, E(tensor_parallel_size), 1, 64, "N",
     "split the model over N GPUs (Megatron tensor parallelism; with --device cpu, over N threads); N must divide the "
     "model's attention heads, KV heads and intermediate size (default 1)"},
    {"load-format", NULL, OPT_CHOICE, E(load_format), 0, 0, "auto|safetensors|dummy",
     "weights: the model's safetensors (auto, safetensors), or dummy: random weights made from config.json alone, "
     "the same on every load, for benchmarking shapes without their checkpoint (default auto)"},
    {"enable-prefix-caching", NULL, OPT_BOOL_NOT, E(no_prefix_caching), 0, 0, "[=BOOL]",
     "reuse the KV cache of earlier requests' prefixes, bit-identical to recomputing them (default on)"},
    {"no-enable-prefix-caching", NULL, OPT_BOOL, E(no_prefix_caching), 0, 0, NULL, "turn prefix caching off"},
    {"sink-tokens", NULL, OPT_INT, E(sink_tokens), 1, 1 << 20, "N", "streaming heads keep this many first tokens (default 64)"},
    {"recent-tokens", NULL, OPT_INT, E(recent_tokens), 1, 1 << 20, "N", "... and this many last tokens (default 256)"},
};
#undef E
const size_t opt_engine_n = sizeof opt_engine / sizeof opt_engine[0];

const struct opt *opt_find(const struct opt *t, size_t n, const char *name) {
    char norm[64];
    size_t len = strlen(name);
    if (len >= sizeof norm) return NULL;
    for (size_t i = 0; i <= len; i++) norm[i] = name[i] == '_' ? '-' : name[i];
    for (size_t i = 0; i < n; i++)
        if (!strcmp(norm, t[i].name)) return &t[i];
    return NULL;
}

const struct opt *opt_find_alias(const struct opt *t, size_t n, const char *arg) {
    for (size_t i = 0; i < n; i++)
        if (t[i].alias && !strcmp(arg, t[i].alias)) return &t[i];
    return NULL;
}

const char *opt_split(const char *arg, char *name, size_t cap) {
    name[0] = 0;
    if (strncmp(arg, "--", 2)) return NULL;
    const char *eq = strchr(arg, '=');
    size_t n = eq ? (size_t)(eq - arg - 2) : strlen(arg + 2);
    if (n < cap) {
        memcpy(name, arg + 2, n);
        name[n] = 0;
    }
    return eq ? eq + 1 : NULL;
}

int opt_parse_bytes(const char *v, double *out) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || !isfinite(x) || x < 0) return -1;
    double mult = 1;
    if (*end) {
        char u = (char)(*end | 0x20);
        mult = u == 'k' ? 1024.0 : u == 'm' ? MIB : u == 'g' ? 1073741824.0 : u == 't' ? TIB : 0;
        if (!mult) return -1;
        end++;
        if (!strcmp(end, "ib") || !strcmp(end, "iB") || !strcmp(end, "b") || !strcmp(end, "B")) end += strlen(end);
        if (*end) return -1;
    }
    *out = x * mult;
    return 0;
}

/* A byte count for messages: "8MiB" when it is a whole number of a binary unit, else bytes. */
static void fmt_bytes(char *buf, size_t n, double x) {
    static const char *const units[] = {"TiB", "GiB", "MiB", "KiB"};
    double scale = TIB;
    for (int i = 0; i < 4; i++, scale /= 1024)
        if (x >= scale && fmod(x, scale) == 0) {
            snprintf(buf, n, "%.0f%s", x / scale, units[i]);
            return;
        }
    snprintf(buf, n, "%.0f", x);
}

/* A bound for messages: integers as integers (1000000000, not 1e+09). */
static void fmt_num(char *buf, size_t n, double x) {
    if (x == floor(x) && fabs(x) < 1e15) snprintf(buf, n, "%.0f", x);
    else snprintf(buf, n, "%g", x);
}

/* Whether v is one of the '|'-separated words of list. */
static bool is_choice(const char *list, const char *v) {
    size_t len = strlen(v);
    for (const char *p = list; *p;) {
        const char *bar = strchr(p, '|');
        size_t wl = bar ? (size_t)(bar - p) : strlen(p);
        if (wl == len && !strncmp(p, v, len)) return true;
        p += wl + (bar != NULL);
    }
    return false;
}

/* "auto, cpu or cuda" from "auto|cpu|cuda". */
static void choice_list(char *buf, size_t n, const char *list) {
    size_t o = 0;
    for (const char *p = list; *p && o < n;) {
        const char *bar = strchr(p, '|');
        int wl = bar ? (int)(bar - p) : (int)strlen(p);
        const char *sep = p == list ? "" : bar ? ", " : " or ";
        o += (size_t)snprintf(buf + o, n - o, "%s%.*s", sep, wl, p);
        p += wl + (bar != NULL);
    }
}

int opt_set(void *base, const struct opt *op, const char *v, char *err, size_t errlen) {
    char *p = (char *)base + op->off;
    char *end, a[48], b[48];
    double x;
    long long i;
    switch (op->type) {
    case OPT_STR: *(const char **)p = v; return 0;
    case OPT_CHOICE:
        if (is_choice(op->arg, v)) {
            *(const char **)p = v;
            return 0;
        }
        choice_list(a, sizeof a, op->arg);
        snprintf(err, errlen, "--%s: \"%s\" is not %s", op->name, v, a);
        return -1;
    case OPT_INT:
        errno = 0;
        i = strtoll(v, &end, 10);
        if (!errno && end != v && !*end && i >= (long long)op->lo && i <= (long long)op->hi) {
            *(int *)p = (int)i;
            return 0;
        }
        snprintf(err, errlen, "--%s: \"%s\" is not an integer in [%lld, %lld]", op->name, v, (long long)op->lo,
                 (long long)op->hi);
        return -1;
    case OPT_DOUBLE:
    case OPT_FLOAT:
        errno = 0;
        x = strtod(v, &end);
        if (!errno && end != v && !*end && isfinite(x) && x >= op->lo && x <= op->hi) {
            if (op->type == OPT_DOUBLE) *(double *)p = x;
            else *(float *)p = (float)x;
            return 0;
        }
        fmt_num(a, sizeof a, op->lo);
        fmt_num(b, sizeof b, op->hi);
        /* a tiny positive bound stands for "above 0" */
        snprintf(err, errlen, "--%s: \"%s\" is not a number in %s%s, %s]", op->name, v, op->lo > 0 && op->lo < 1e-3 ? "(" : "[",
                 op->lo > 0 && op->lo < 1e-3 ? "0" : a, b);
        return -1;
    case OPT_BYTES:
        if (!opt_parse_bytes(v, &x) && x >= op->lo && x <= op->hi) {
            *(size_t *)p = (size_t)x;
            return 0;
        }
        fmt_bytes(a, sizeof a, op->lo);
        fmt_bytes(b, sizeof b, op->hi);
        snprintf(err, errlen, "--%s: \"%s\" is not a size in [%s, %s] (bytes, or with a unit: 512MiB, 4G)",
                 op->name, v, a, b);
        return -1;
    case OPT_FLAG:
        if (!v) {
            *(bool *)p = true;
            return 0;
        }
        snprintf(err, errlen, "--%s takes no value", op->name);
        return -1;
    case OPT_BOOL:
    case OPT_BOOL_NOT:
        if (!v || !strcmp(v, "true") || !strcmp(v, "1")) *(bool *)p = op->type == OPT_BOOL;
        else if (!strcmp(v, "false") || !strcmp(v, "0")) *(bool *)p = op->type != OPT_BOOL;
        else {
            snprintf(err, errlen, "--%s: \"%s\" is not true or false", op->name, v);
            return -1;
        }
        return 0;
    case OPT_OTHER: break;
    }
    snprintf(err, errlen, "--%s is parsed by its command", op->name);
    return -1;
}

void opt_usage(FILE *f, const struct opt *t, size_t n) {
    enum { LEFT = 28, WIDTH = 100 }; /* help text from column LEFT + 3, wrapped at WIDTH */
    for (size_t i = 0; i < n; i++) {
        char left[80];
        const char *alias = t[i].alias && t[i].alias[1] != '-' ? t[i].alias : NULL; /* long ones: in the help */
        snprintf(left, sizeof left, "%s%s--%s%s%s", alias ? alias : "", alias ? ", " : "", t[i].name,
                 t[i].arg && t[i].arg[0] != '[' ? " " : "", t[i].arg ? t[i].arg : "");
        fprintf(f, "  %-*s", LEFT, left);
        int col = 2 + (strlen(left) > LEFT ? (int)strlen(left) : LEFT);
        for (const char *w = t[i].help; *w;) {
            int wl = (int)strcspn(w, " ");
            if (col + 1 + wl > WIDTH && col > LEFT + 3) {
                fprintf(f, "\n%*s", LEFT + 2, "");
                col = LEFT + 2;
            }
            fprintf(f, " %.*s", wl, w);
            col += 1 + wl;
            w += wl;
            while (*w == ' ') w++;
        }
        fprintf(f, "\n");
    }
}
