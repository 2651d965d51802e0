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

#include "engine/backend.h"
#include "engine/demo_model.h"
#include "engine/generate.h"
#include "engine/model.h"

#define DUO_VERSION "0.1.0"

static void usage(FILE *f) {
    fprintf(f,
            "duoserve " DUO_VERSION ": an OpenAI-compatible LLM server with DuoAttention\n"
            "\n"
            "usage: duoserve <command> [options]\n"
            "\n"
            "commands:\n"
            "  serve      start the HTTP server (OpenAI API)\n"
            "  generate   run one prompt to completion and print the result\n"
            "\n"
            "generate options:\n"
            "  -m, --model DIR         Hugging Face model directory (default: built-in demo model)\n"
            "  --prompt-ids 1,2,3      prompt token ids, used verbatim (no BOS added)\n"
            "  -n, --max-tokens N      tokens to generate (default 16)\n"
            "  --temperature T         0 = greedy (default 0)\n"
            "  --seed S                sampling seed (default 0)\n"
            "  --top-logprobs K        report the K most likely tokens per position (0..20)\n"
            "  --ignore-eos            do not stop at the end-of-sequence token\n"
            "  --prefill-chunk N       prompt tokens per forward step (default: all)\n"
            "  --device cpu|cuda       backend (default cpu)\n"
            "  --json                  print one JSON object\n");
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
    const char *model_dir;
    int32_t *prompt_ids;
    int n_prompt;
    const char *prompt_text;
    struct gen_params p;
    const char *device;
    int json;
};

static int usage_error(const char *fmt, const char *arg) {
    fprintf(stderr, "duoserve: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(see duoserve --help)\n");
    return 2;
}

static int parse_generate(int argc, char **argv, struct gen_cli *o) {
    o->p = (struct gen_params){.max_tokens = 16, .temperature = 0.0f, .seed = 0, .top_logprobs = 0};
    o->device = "cpu";
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        long x;
#define NEED_VALUE() if (!v) return usage_error("%s needs a value", a); i++
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            NEED_VALUE();
            o->model_dir = v;
        } else if (!strcmp(a, "--prompt-ids")) {
            NEED_VALUE();
            free(o->prompt_ids);
            if (parse_ids(v, &o->prompt_ids, &o->n_prompt)) return usage_error("--prompt-ids: \"%s\" is not a list of token ids", v);
        } else if (!strcmp(a, "--prompt")) {
            NEED_VALUE();
            o->prompt_text = v;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--max-tokens")) {
            NEED_VALUE();
            if (parse_int(v, 1, 1 << 24, &x)) return usage_error("-n: \"%s\" is not a positive integer", v);
            o->p.max_tokens = (int)x;
        } else if (!strcmp(a, "--temperature")) {
            NEED_VALUE();
            char *end;
            double t = strtod(v, &end);
            if (end == v || *end || !isfinite(t) || t < 0 || t > 2) return usage_error("--temperature: \"%s\" is not in [0, 2]", v);
            o->p.temperature = (float)t;
        } else if (!strcmp(a, "--seed")) {
            NEED_VALUE();
            char *end;
            errno = 0;
            unsigned long long s = strtoull(v, &end, 10);
            if (errno || end == v || *end || v[0] == '-') return usage_error("--seed: \"%s\" is not a non-negative integer", v);
            o->p.seed = s;
        } else if (!strcmp(a, "--top-logprobs")) {
            NEED_VALUE();
            if (parse_int(v, 0, 20, &x)) return usage_error("--top-logprobs: \"%s\" is not in 0..20", v);
            o->p.top_logprobs = (int)x;
        } else if (!strcmp(a, "--prefill-chunk")) {
            NEED_VALUE();
            if (parse_int(v, 1, 1 << 20, &x)) return usage_error("--prefill-chunk: \"%s\" is not a positive integer", v);
            o->p.prefill_chunk = (int)x;
        } else if (!strcmp(a, "--device")) {
            NEED_VALUE();
            if (strcmp(v, "cpu") && strcmp(v, "cuda")) return usage_error("--device: \"%s\" is not cpu or cuda", v);
            o->device = v;
        } else if (!strcmp(a, "--ignore-eos")) {
            o->p.ignore_eos = true;
        } else if (!strcmp(a, "--json")) {
            o->json = 1;
        } else {
            return usage_error("generate: unknown option \"%s\"", a);
        }
#undef NEED_VALUE
    }
    return 0;
}

static void print_result(const struct gen_cli *o, const struct gen_result *r) {
    int K = o->p.top_logprobs;
    if (!o->json) {
        for (int i = 0; i < r->n; i++) printf("%s%d", i ? " " : "", r->ids[i]);
        printf("\n");
        return;
    }
    cJSON *root = cJSON_CreateObject();
    cJSON *pi = cJSON_AddArrayToObject(root, "prompt_ids");
    for (int i = 0; i < o->n_prompt; i++) cJSON_AddItemToArray(pi, cJSON_CreateNumber(o->prompt_ids[i]));
    cJSON *ids = cJSON_AddArrayToObject(root, "ids");
    for (int i = 0; i < r->n; i++) cJSON_AddItemToArray(ids, cJSON_CreateNumber(r->ids[i]));
    cJSON_AddNullToObject(root, "text"); /* needs the tokenizer */
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

/* Resolves -m (or the demo model) and loads it on the chosen backend. */
static int open_model(const char *dir_arg, const char *device, int max_tokens, struct backend **b, struct model **m) {
    char err[1024], demo[4096];
    const char *dir = dir_arg;
    if (!dir) {
        if (demo_model_ensure(demo, sizeof demo, err, sizeof err) != 0) {
            fprintf(stderr, "duoserve: demo model: %s\n", err);
            return 1;
        }
        dir = demo;
        fprintf(stderr, "duoserve: no -m given: using the built-in demo model (random weights, its text is noise) in %s\n", dir);
    }
    *b = !strcmp(device, "cuda") ? backend_cuda_create(0, err, sizeof err) : backend_cpu_create();
    if (!*b) {
        fprintf(stderr, "duoserve: %s\n", !strcmp(device, "cuda") ? err : "out of memory");
        return 1;
    }
    if (model_load(m, dir, *b, max_tokens, err, sizeof err) != 0) {
        fprintf(stderr, "duoserve: %s\n", err);
        backend_destroy(*b);
        *b = NULL;
        return 1;
    }
    return 0;
}

static int cmd_generate(int argc, char **argv) {
    struct gen_cli o = {0};
    int rc = parse_generate(argc, argv, &o);
    if (rc) goto out;
    if (o.prompt_text) {
        rc = usage_error("%s", "--prompt needs the tokenizer, which this build does not have yet: use --prompt-ids");
        goto out;
    }
    if (!o.prompt_ids) {
        rc = usage_error("%s", "generate needs --prompt-ids");
        goto out;
    }
    struct backend *b = NULL;
    struct model *m = NULL;
    int chunk = o.p.prefill_chunk ? o.p.prefill_chunk : 2048;
    rc = open_model(o.model_dir, o.device, chunk, &b, &m);
    if (rc) goto out;
    struct gen_result r;
    char err[512];
    if (generate_run(m, o.prompt_ids, o.n_prompt, &o.p, &r, err, sizeof err) != 0) {
        fprintf(stderr, "duoserve: %s\n", err);
        rc = 1;
    } else {
        print_result(&o, &r);
        gen_result_free(&r);
    }
    model_free(m);
    backend_destroy(b);
out:
    free(o.prompt_ids);
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
    fprintf(stderr, "duoserve: unknown command \"%s\" (see duoserve --help)\n", argv[1]);
    return 2;
}
