/* duoserve: command-line entry point. Subcommands:
 *   serve       the OpenAI-compatible daemon
 *   generate    runs one request to completion and prints the result
 * Exit status: 0 ok, 1 runtime error (bad model directory, ...), 2 usage error. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_core.h"
#include "engine/tokenizer.h"
#include "server/cli_text.h"
#include "server/serve.h"
#include "server/version.h"

static void usage(FILE *f) {
    fprintf(f,
            "duoserve " DUO_VERSION ": an OpenAI-compatible LLM server with DuoAttention\n"
            "\n"
            "usage: duoserve <command> [options]\n"
            "\n"
            "commands:\n"
            "  serve      start the HTTP server (OpenAI API)\n"
            "  generate   run one prompt to completion and print the result\n"
            "  tokenize -m DIR        text on stdin -> token ids (no special tokens added)\n"
            "  detokenize -m DIR      token ids on stdin -> text (special tokens kept)\n"
            "  chat-template -m DIR   {\"messages\":[...],\"add_generation_prompt\":bool} on stdin -> prompt\n"
            "\n"
            "generate options:\n"
            "  -m, --model DIR         Hugging Face model directory (default: built-in demo model)\n"
            "  --prompt TEXT           prompt text (BOS added as the tokenizer config says)\n"
            "  --prompt-ids 1,2,3      prompt token ids, used verbatim (no BOS added)\n"
            "  -n, --max-tokens N      tokens to generate (default 16)\n"
            "  --temperature T         0 = greedy (default 0)\n"
            "  --top-p P, --top-k K, --min-p P, --presence-penalty X, --frequency-penalty X,\n"
            "  --repetition-penalty X, --min-tokens N, --stop STR (repeatable)\n"
            "  --seed S                sampling seed (default 0)\n"
            "  --top-logprobs K        report the K most likely tokens per position (0..20)\n"
            "  --ignore-eos            do not stop at the end-of-sequence token\n"
            "  --json                  print one JSON object\n"
            "\n"
            "engine options (generate and serve):\n"
            "  --device auto|cpu|cuda  backend (default auto: the GPU when there is one)\n"
            "  --gemm invariant|cublas CUDA GEMMs: batch-invariant kernels (default) or cuBLAS\n"
            "  --max-num-batched-tokens N   token budget of one step (prefill chunk size)\n"
            "  --max-num-seqs N        concurrent sequences\n"
            "  --max-model-len N       prompt + output limit (default: the model's)\n"
            "  --block-size N          KV block size in tokens (default 16)\n"
            "  --kv-cache-memory MIB   CPU: memory for both KV pools (default 256)\n"
            "  --duo-pattern TSV       DuoAttention full_attention_heads.tsv\n"
            "  --duo-sparsity S        fraction of heads made streaming (0..1)\n"
            "  --sink-tokens N, --recent-tokens N   streaming heads keep these (64, 256)\n");
}

/* Parses a whole decimal integer in [lo, hi]. */
static int parse_int(const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

static int parse_ids(const char *s, int32_t **ids, int *n) {
    int cap = 16, cnt = 0;
    int32_t *v = malloc(sizeof *v * cap);
    const char *p = s;
    while (v && *p) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (errno || end == p || x < 0 || x > INT32_MAX || (*end && *end != ',')) {
            free(v);
            return -1;
        }
        if (cnt == cap) {
            int32_t *g = realloc(v, sizeof *v * (cap *= 2));
            if (!g) break;
            v = g;
        }
        v[cnt++] = (int32_t)x;
        p = *end ? end + 1 : end;
    }
    if (!v || cnt == 0) {
        free(v);
        return -1;
    }
    *ids = v;
    *n = cnt;
    return 0;
}

struct gen_cli {
    struct engine_config ec;
    struct engine_sampling sp;
    int32_t *prompt_ids;
    int n_prompt;
    const char *prompt_text;
    char *stops[16];
    int json;
};

static int usage_error(const char *fmt, const char *arg) {
    fprintf(stderr, "duoserve: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(see duoserve --help)\n");
    return 2;
}

static int parse_float(const char *s, double lo, double hi, float *out) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end || !isfinite(v) || v < lo || v > hi) return -1;
    *out = (float)v;
    return 0;
}

static int parse_generate(int argc, char **argv, struct gen_cli *o) {
    o->sp = (struct engine_sampling){.n = 1, .max_tokens = 16, .top_p = 1.0f, .repetition_penalty = 1.0f,
                                     .skip_special_tokens = true, .logprobs = -1};
    o->ec = (struct engine_config){.device = "auto", .max_num_seqs = 8};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        long x;
#define NEED_VALUE() if (!v) return usage_error("%s needs a value", a); i++
#define INT_OPT(name, lo, hi, dst) else if (!strcmp(a, name)) { NEED_VALUE(); \
            if (parse_int(v, lo, hi, &x)) return usage_error(name ": \"%s\" is out of range", v); else dst = (int)x; }
#define FLOAT_OPT(name, lo, hi, dst) else if (!strcmp(a, name)) { NEED_VALUE(); \
            if (parse_float(v, lo, hi, &dst)) return usage_error(name ": \"%s\" is out of range", v); }
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            NEED_VALUE();
            o->ec.model_dir = v;
        } else if (!strcmp(a, "--prompt-ids")) {
            NEED_VALUE();
            free(o->prompt_ids);
            o->prompt_ids = NULL;
            if (parse_ids(v, &o->prompt_ids, &o->n_prompt)) return usage_error("--prompt-ids: \"%s\" is not a list of token ids", v);
        } else if (!strcmp(a, "--prompt")) {
            NEED_VALUE();
            o->prompt_text = v;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--max-tokens")) {
            NEED_VALUE();
            if (parse_int(v, 1, 1 << 24, &x)) return usage_error("-n: \"%s\" is not a positive integer", v);
            o->sp.max_tokens = (int)x;
        }
        FLOAT_OPT("--temperature", 0, 2, o->sp.temperature)
        FLOAT_OPT("--top-p", 1e-9, 1, o->sp.top_p)
        FLOAT_OPT("--min-p", 0, 1, o->sp.min_p)
        FLOAT_OPT("--presence-penalty", -2, 2, o->sp.presence_penalty)
        FLOAT_OPT("--frequency-penalty", -2, 2, o->sp.frequency_penalty)
        FLOAT_OPT("--repetition-penalty", 1e-6, 100, o->sp.repetition_penalty)
        FLOAT_OPT("--duo-sparsity", 0, 1, o->ec.duo_sparsity)
        INT_OPT("--top-k", -1, 1 << 30, o->sp.top_k)
        INT_OPT("--min-tokens", 0, 1 << 24, o->sp.min_tokens)
        INT_OPT("--top-logprobs", 0, 20, o->sp.logprobs)
        INT_OPT("--sink-tokens", 1, 1 << 20, o->ec.sink_tokens)
        INT_OPT("--recent-tokens", 1, 1 << 24, o->ec.recent_tokens)
        INT_OPT("--max-num-batched-tokens", 1, 1 << 24, o->ec.max_num_batched_tokens)
        INT_OPT("--prefill-chunk", 1, 1 << 24, o->ec.max_num_batched_tokens)
        INT_OPT("--max-num-seqs", 1, 1 << 16, o->ec.max_num_seqs)
        INT_OPT("--block-size", 1, 4096, o->ec.block_size)
        INT_OPT("--max-model-len", 1, 1 << 30, o->ec.max_model_len)
        else if (!strcmp(a, "--kv-cache-memory")) {
            NEED_VALUE();
            if (parse_int(v, 1, 1L << 30, &x)) return usage_error("--kv-cache-memory: \"%s\" is not a size in MiB", v);
            o->ec.kv_cache_memory = (size_t)x << 20;
        } else if (!strcmp(a, "--seed")) {
            NEED_VALUE();
            char *end;
            errno = 0;
            unsigned long long s = strtoull(v, &end, 10);
            if (errno || end == v || *end || v[0] == '-') return usage_error("--seed: \"%s\" is not a non-negative integer", v);
            o->sp.seed = s;
        } else if (!strcmp(a, "--stop")) {
            NEED_VALUE();
            if (o->sp.n_stop >= 16) return usage_error("%s", "at most 16 --stop strings");
            o->stops[o->sp.n_stop++] = (char *)v;
        } else if (!strcmp(a, "--duo-pattern")) {
            NEED_VALUE();
            o->ec.duo_pattern = v;
        } else if (!strcmp(a, "--device")) {
            NEED_VALUE();
            if (strcmp(v, "cpu") && strcmp(v, "cuda") && strcmp(v, "auto")) return usage_error("--device: \"%s\" is not auto, cpu or cuda", v);
            o->ec.device = v;
        } else if (!strcmp(a, "--gemm")) {
            NEED_VALUE();
            if (strcmp(v, "invariant") && strcmp(v, "cublas")) return usage_error("--gemm: \"%s\" is not invariant or cublas", v);
            o->ec.gemm = v;
        } else if (!strcmp(a, "--ignore-eos")) {
            o->sp.ignore_eos = true;
        } else if (!strcmp(a, "--json")) {
            o->json = 1;
        } else {
            return usage_error("generate: unknown option \"%s\"", a);
        }
#undef NEED_VALUE
#undef INT_OPT
#undef FLOAT_OPT
    }
    o->sp.stop = o->stops;
    o->sp.has_seed = true; /* --seed defaults to 0: generate is reproducible */
    return 0;
}

struct gen_out {
    int32_t *ids;
    int n, cap, K;
    int32_t *top_ids;
    float *top_lps;
    char *text;
    size_t text_len;
    int finished, error;
    char message[256];
};

static void gen_emit(void *ud, const struct engine_event *ev) {
    struct gen_out *g = ud;
    if (ev->type == ENGINE_EVENT_ERROR) {
        g->error = 1;
        snprintf(g->message, sizeof g->message, "%s", ev->message);
        return;
    }
    if (ev->text) {
        size_t l = strlen(ev->text);
        char *nt = g->text ? realloc(g->text, g->text_len + l + 1) : NULL;
        if (nt) {
            memcpy(nt + g->text_len, ev->text, l + 1);
            g->text = nt;
            g->text_len += l;
        }
        free(ev->text);
    }
    if (ev->type == ENGINE_EVENT_FINISH) {
        g->finished = 1;
        return;
    }
    if (g->n < g->cap) {
        g->ids[g->n] = ev->token;
        for (int k = 0; k < g->K; k++) {
            g->top_ids[g->n * g->K + k] = ev->top_ids[k];
            g->top_lps[g->n * g->K + k] = ev->top_lps[k];
        }
        g->n++;
    }
}

static void print_result(const struct gen_cli *o, const struct gen_out *r) {
    int K = r->K;
    if (!o->json) {
        if (r->text) {
            printf("%s\n", r->text);
        } else {
            for (int i = 0; i < r->n; i++) printf("%s%d", i ? " " : "", r->ids[i]);
            printf("\n");
        }
        return;
    }
    cJSON *root = cJSON_CreateObject();
    cJSON *pi = cJSON_AddArrayToObject(root, "prompt_ids");
    for (int i = 0; i < o->n_prompt; i++) cJSON_AddItemToArray(pi, cJSON_CreateNumber(o->prompt_ids[i]));
    cJSON *ids = cJSON_AddArrayToObject(root, "ids");
    for (int i = 0; i < r->n; i++) cJSON_AddItemToArray(ids, cJSON_CreateNumber(r->ids[i]));
    if (r->text) cJSON_AddStringToObject(root, "text", r->text);
    else cJSON_AddNullToObject(root, "text"); /* the model has no tokenizer */
    cJSON *tl = cJSON_AddArrayToObject(root, "top_logprobs");
    for (int i = 0; K && i < r->n; i++) {
        cJSON *pos = cJSON_CreateArray();
        for (int k = 0; k < K; k++) {
            cJSON *pair = cJSON_CreateArray();
            cJSON_AddItemToArray(pair, cJSON_CreateNumber(r->top_ids[i * K + k]));
            cJSON_AddItemToArray(pair, cJSON_CreateNumber(r->top_lps[i * K + k]));
            cJSON_AddItemToArray(pos, pair);
        }
        cJSON_AddItemToArray(tl, pos);
    }
    char *s = cJSON_PrintUnformatted(root);
    printf("%s\n", s);
    free(s);
    cJSON_Delete(root);
}

static int cmd_generate(int argc, char **argv) {
    struct gen_cli o = {0};
    struct gen_out g = {0};
    struct core *c = NULL;
    char err[1024];
    int rc = parse_generate(argc, argv, &o);
    if (rc) goto out;
    if (!o.prompt_text && !o.prompt_ids) {
        rc = usage_error("%s", "generate needs --prompt TEXT or --prompt-ids 1,2,3");
        goto out;
    }
    if (core_create(&c, &o.ec, err, sizeof err) != 0) {
        fprintf(stderr, "duoserve: %s\n", err);
        rc = 1;
        goto out;
    }
    if (o.prompt_text) {
        const struct tokenizer *tok = core_tokenizer(c);
        size_t n = 0;
        if (!tok) {
            fprintf(stderr, "duoserve: --prompt needs a tokenizer.json in the model directory; use --prompt-ids\n");
            rc = 1;
            goto out;
        }
        free(o.prompt_ids);
        o.prompt_ids = NULL;
        int trc = tokenizer_encode(tok, o.prompt_text, strlen(o.prompt_text), true, &o.prompt_ids, &n);
        if (trc != 0) {
            fprintf(stderr, "duoserve: --prompt: %s\n", tokenizer_strerror(trc));
            rc = 1;
            goto out;
        }
        o.n_prompt = (int)n;
    }
    g.cap = o.sp.max_tokens;
    g.K = o.sp.logprobs > 0 ? o.sp.logprobs : 0;
    g.ids = malloc(sizeof(int32_t) * g.cap);
    g.top_ids = malloc(sizeof(int32_t) * ((size_t)g.cap * g.K + 1));
    g.top_lps = malloc(sizeof(float) * ((size_t)g.cap * g.K + 1));
    if (core_tokenizer(c)) g.text = calloc(1, 1);
    struct engine_request req = {o.prompt_ids, o.n_prompt, o.sp};
    if (core_add(c, &req, gen_emit, &g, NULL, err, sizeof err) != ENGINE_OK) {
        fprintf(stderr, "duoserve: %s\n", err);
        rc = 1;
        goto out;
    }
    while (core_has_work(c))
        if (core_step(c) < 0) break;
    if (g.error || !g.finished) {
        fprintf(stderr, "duoserve: generation failed: %s\n", g.error ? g.message : "no result");
        rc = 1;
        goto out;
    }
    print_result(&o, &g);
out:
    core_free(c);
    free(o.prompt_ids);
    free(g.ids);
    free(g.top_ids);
    free(g.top_lps);
    free(g.text);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("duoserve %s\n", DUO_VERSION);
        return 0;
    }
    if (!strcmp(argv[1], "generate")) return cmd_generate(argc - 2, argv + 2);
    if (!strcmp(argv[1], "serve")) return serve_main(argc - 2, argv + 2);
    if (!strcmp(argv[1], "tokenize")) return cli_tokenize(argc - 2, argv + 2);
    if (!strcmp(argv[1], "detokenize")) return cli_detokenize(argc - 2, argv + 2);
    if (!strcmp(argv[1], "chat-template")) return cli_chat_template(argc - 2, argv + 2);
    fprintf(stderr, "duoserve: unknown command \"%s\" (see duoserve --help)\n", argv[1]);
    return 2;
}
