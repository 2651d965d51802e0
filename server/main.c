/* duoserve: command-line entry point. Subcommands:
 *   serve       the OpenAI-compatible daemon
 *   generate    runs one request to completion and prints the result
 *   tokenize, detokenize, chat-template   the text tools (cli_text.c)
 *   help [COMMAND], --version / -V
 * Exit status: 0 ok, 1 runtime error (bad model directory, ...), 2 usage error. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_core.h"
#include "engine/text/tokenizer.h"
#include "server/cli_text.h"
#include "server/opt.h"
#include "server/serve.h"
#include "server/version.h"

/* The build, for --version only: the Makefile passes the hash to main.o alone, so that a new
 * commit rebuilds one object. */
#ifndef DUO_GIT_HASH
#define DUO_GIT_HASH "unknown"
#endif
#ifdef DUO_CUDA
#define DUO_BUILD_CUDA "CUDA: yes, kernels for sm_90a (H100, H200)"
#else
#define DUO_BUILD_CUDA "CUDA: no, CPU only"
#endif

struct gen_cli {
    struct engine_config ec;
    struct engine_sampling sp;
    int32_t *prompt_ids;
    int n_prompt;
    const char *prompt_text;
    char *stops[16];
    bool json;
};

#define G(field) offsetof(struct gen_cli, field)
static const struct opt gen_opts[] = {
    {"model", "-m", OPT_STR, G(ec.model_dir), 0, 0, "DIR", "Hugging Face model directory (default: the built-in demo model)"},
    {"prompt", NULL, OPT_STR, G(prompt_text), 0, 0, "TEXT", "prompt text (BOS added as the tokenizer config says)"},
    {"prompt-ids", NULL, OPT_OTHER, 0, 0, 0, "1,2,3", "prompt token ids, used verbatim (no BOS added)"},
    {"max-tokens", "-n", OPT_INT, G(sp.max_tokens), 1, 1 << 24, "N", "tokens to generate (default 16)"},
    {"temperature", NULL, OPT_FLOAT, G(sp.temperature), 0, 2, "T", "0 = greedy (default 0)"},
    {"top-p", NULL, OPT_FLOAT, G(sp.top_p), 1e-9, 1, "P", "nucleus sampling (default 1)"},
    {"top-k", NULL, OPT_INT, G(sp.top_k), -1, 1 << 30, "K", "sample among the K most likely tokens (default 0: all)"},
    {"min-p", NULL, OPT_FLOAT, G(sp.min_p), 0, 1, "P", "drop tokens less likely than P times the most likely (default 0)"},
    {"presence-penalty", NULL, OPT_FLOAT, G(sp.presence_penalty), -2, 2, "X", "(default 0)"},
    {"frequency-penalty", NULL, OPT_FLOAT, G(sp.frequency_penalty), -2, 2, "X", "(default 0)"},
    {"repetition-penalty", NULL, OPT_FLOAT, G(sp.repetition_penalty), 1e-6, 100, "X", "(default 1: off)"},
    {"min-tokens", NULL, OPT_INT, G(sp.min_tokens), 0, 1 << 24, "N", "no EOS or stop before this many tokens (default 0)"},
    {"stop", NULL, OPT_OTHER, 0, 0, 0, "STR", "stop string (repeatable, at most 16)"},
    {"seed", NULL, OPT_OTHER, 0, 0, 0, "S", "sampling seed, 0 to 2^64-1 (default 0)"},
    {"top-logprobs", NULL, OPT_INT, G(sp.logprobs), 0, 20, "K", "report the K most likely tokens per position"},
    {"ignore-eos", NULL, OPT_FLAG, G(sp.ignore_eos), 0, 0, NULL, "do not stop at the end-of-sequence token"},
    {"json", NULL, OPT_FLAG, G(json), 0, 0, NULL, "print one JSON object"},
};
#undef G
#define N_GEN_OPTS (sizeof gen_opts / sizeof gen_opts[0])

static void usage(FILE *f) {
    fprintf(f,
            "duoserve " DUO_VERSION ": an OpenAI-compatible LLM server with DuoAttention\n"
            "\n"
            "usage: duoserve <command> [options]\n"
            "\n"
            "commands:\n"
            "  serve                  start the HTTP server (OpenAI API); its options: duoserve help serve\n"
            "  generate               run one prompt to completion and print the result\n"
            "  tokenize -m DIR        text on stdin -> token ids (no special tokens added)\n"
            "  detokenize -m DIR      token ids on stdin -> text (special tokens kept)\n"
            "  chat-template -m DIR   {\"messages\":[...],\"add_generation_prompt\":bool} on stdin -> prompt\n"
            "  help [COMMAND]         this text, or a command's options\n"
            "  --version, -V          version and build\n"
            "\n"
            "generate options (duoserve generate -m DIR (--prompt TEXT | --prompt-ids 1,2,3) [options]):\n");
    opt_usage(f, gen_opts, N_GEN_OPTS);
    fprintf(f, "\nengine options (serve and generate):\n");
    opt_usage(f, opt_engine, opt_engine_n);
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

static int usage_error(const char *fmt, const char *arg) {
    fprintf(stderr, "duoserve: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(see duoserve --help)\n");
    return 2;
}

/* Returns 0, 1 after --help (printed), or 2 with a usage error. */
static int parse_generate(int argc, char **argv, struct gen_cli *o) {
    o->sp = (struct engine_sampling){.n = 1, .max_tokens = 16, .top_p = 1.0f, .repetition_penalty = 1.0f,
                                     .skip_special_tokens = true, .logprobs = -1};
    o->ec = (struct engine_config){.device = "auto", .max_num_seqs = 8, .duo_sparsity = 0.5f};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 1;
        }
        void *base = o;
        /* --name=value as serve takes it (a boolean's value only that way; a flag's is refused by opt_set) */
        char name[64];
        const char *v = opt_split(a, name, sizeof name);
        const struct opt *op = name[0] ? opt_find(gen_opts, N_GEN_OPTS, name) : NULL;
        if (!op) op = opt_find_alias(gen_opts, N_GEN_OPTS, a);
        if (!op && (op = name[0] ? opt_find(opt_engine, opt_engine_n, name) : NULL)) base = &o->ec;
        if (!op && (op = opt_find_alias(opt_engine, opt_engine_n, a))) base = &o->ec;
        if (!op) return usage_error("generate: unknown option \"%s\"", a);
        if (!v && op->type != OPT_FLAG && op->type != OPT_BOOL && op->type != OPT_BOOL_NOT) {
            if (i + 1 >= argc) return usage_error("%s needs a value", a);
            v = argv[++i];
        }
        char err[512];
        if (!strcmp(op->name, "prompt-ids")) {
            free(o->prompt_ids);
            o->prompt_ids = NULL;
            if (parse_ids(v, &o->prompt_ids, &o->n_prompt)) return usage_error("--prompt-ids: \"%s\" is not a list of token ids", v);
        } else if (!strcmp(op->name, "seed")) {
            char *end;
            errno = 0;
            unsigned long long s = strtoull(v, &end, 10);
            if (errno || end == v || *end || v[0] == '-') return usage_error("--seed: \"%s\" is not an integer in [0, 18446744073709551615]", v);
            o->sp.seed = s;
        } else if (!strcmp(op->name, "stop")) {
            if (o->sp.n_stop >= 16) return usage_error("%s", "at most 16 --stop strings");
            o->stops[o->sp.n_stop++] = (char *)v;
        } else if (opt_set(base, op, v, err, sizeof err)) {
            return usage_error("%s", err);
        }
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
    if (rc) {
        rc = rc == 1 ? 0 : rc; /* --help */
        goto out;
    }
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

/* `duoserve help [COMMAND]`: the command's options (serve: the same text as serve --help). */
static int cmd_help(int argc, char **argv) {
    if (argc == 0 || !strcmp(argv[0], "generate") || !strcmp(argv[0], "tokenize") || !strcmp(argv[0], "detokenize") ||
        !strcmp(argv[0], "chat-template")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[0], "serve")) {
        serve_usage(stdout);
        return 0;
    }
    fprintf(stderr, "duoserve: help: unknown command \"%s\" (see duoserve --help)\n", argv[0]);
    return 2;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) return cmd_help(argc - 2, argv + 2);
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "-V") || !strcmp(cmd, "version")) {
        printf("duoserve %s (git %s; %s)\n", DUO_VERSION, DUO_GIT_HASH, DUO_BUILD_CUDA);
        return 0;
    }
    if (!strcmp(cmd, "generate")) return cmd_generate(argc - 2, argv + 2);
    if (!strcmp(cmd, "serve")) return serve_main(argc - 2, argv + 2);
    if (!strcmp(cmd, "tokenize")) return cli_tokenize(argc - 2, argv + 2);
    if (!strcmp(cmd, "detokenize")) return cli_detokenize(argc - 2, argv + 2);
    if (!strcmp(cmd, "chat-template")) return cli_chat_template(argc - 2, argv + 2);
    fprintf(stderr, "duoserve: unknown command \"%s\" (see duoserve --help)\n", cmd);
    return 2;
}
