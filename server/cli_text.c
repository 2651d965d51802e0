/* cli_text: the text tools of the CLI, for users debugging prompts (and for tests):
 *   duoserve tokenize -m DIR        UTF-8 text on stdin -> ids (no special tokens added)
 *   duoserve detokenize -m DIR      ids on stdin -> text (special tokens kept, no newline)
 *   duoserve chat-template -m DIR   {"messages":[...],"add_generation_prompt":bool} -> text
 * Exit status: 0 ok, 1 bad model directory or input, 2 usage error or template error. */
#include "server/cli_text.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/text/chat_template.h"
#include "engine/text/tokenizer.h"

/* Reads all of stdin into a NUL-terminated buffer. */
static char *read_stdin(size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t r = fread(buf + n, 1, cap - n - 1, stdin);
        n += r;
        if (r == 0) break;
        if (n + 1 == cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) {
                free(buf);
                return NULL;
            }
            buf = nb;
        }
    }
    if (buf) buf[n] = 0;
    *len = n;
    return buf;
}

/* -m DIR [--chat-template FILE]; returns 0 or 2 with a message. */
static int parse_model_arg(int argc, char **argv, const char *cmd, const char **dir, const char **tmpl) {
    *dir = NULL;
    for (int i = 0; i < argc; i++) {
        if ((!strcmp(argv[i], "-m") || !strcmp(argv[i], "--model")) && i + 1 < argc) *dir = argv[++i];
        else if (tmpl && !strcmp(argv[i], "--chat-template") && i + 1 < argc) *tmpl = argv[++i];
        else {
            fprintf(stderr, "duoserve %s: unknown or incomplete option \"%s\"\n", cmd, argv[i]);
            return 2;
        }
    }
    if (!*dir) {
        fprintf(stderr, "duoserve %s: -m DIR is required\n", cmd);
        return 2;
    }
    return 0;
}

static struct tokenizer *load_tok(const char *dir) {
    struct tokenizer *tok = NULL;
    char err[1024];
    if (tokenizer_load(&tok, dir, err, sizeof err) != 0) fprintf(stderr, "duoserve: %s\n", err);
    return tok;
}

int cli_tokenize(int argc, char **argv) {
    const char *dir;
    int rc = parse_model_arg(argc, argv, "tokenize", &dir, NULL);
    if (rc) return rc;
    struct tokenizer *tok = load_tok(dir);
    if (!tok) return 1;
    size_t len, n = 0;
    char *text = read_stdin(&len);
    int32_t *ids = NULL;
    int trc = text ? tokenizer_encode(tok, text, len, false, &ids, &n) : TOKENIZER_ERR_NOMEM;
    if (trc != 0) {
        fprintf(stderr, "duoserve tokenize: %s\n", tokenizer_strerror(trc));
        rc = 1;
    } else {
        for (size_t i = 0; i < n; i++) printf("%s%d", i ? " " : "", ids[i]);
        printf("\n");
    }
    free(ids);
    free(text);
    tokenizer_free(tok);
    return rc;
}

int cli_detokenize(int argc, char **argv) {
    const char *dir;
    int rc = parse_model_arg(argc, argv, "detokenize", &dir, NULL);
    if (rc) return rc;
    struct tokenizer *tok = load_tok(dir);
    if (!tok) return 1;
    size_t len, n = 0, cap = 256;
    char *in = read_stdin(&len), *p = in;
    int32_t *ids = malloc(sizeof *ids * cap);
    while (in && ids && *p) { /* ids separated by spaces, commas or newlines */
        while (*p == ' ' || *p == ',' || *p == '\n' || *p == '\t' || *p == '\r' || *p == '[' || *p == ']') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX) {
            fprintf(stderr, "duoserve detokenize: \"%.20s\" is not a token id\n", p);
            rc = 1;
            break;
        }
        if (n == cap) {
            int32_t *g = realloc(ids, sizeof *ids * (cap *= 2));
            if (!g) break;
            ids = g;
        }
        ids[n++] = (int32_t)v;
        p = end;
    }
    if (!rc) {
        char *text = NULL;
        size_t tlen = 0;
        int trc = tokenizer_decode(tok, ids, n, false, &text, &tlen);
        if (trc != 0) {
            fprintf(stderr, "duoserve detokenize: %s\n", tokenizer_strerror(trc));
            rc = 1;
        } else {
            fwrite(text, 1, tlen, stdout);
        }
        free(text);
    }
    free(ids);
    free(in);
    tokenizer_free(tok);
    return rc;
}

int cli_chat_template(int argc, char **argv) {
    const char *dir, *file = NULL;
    int rc = parse_model_arg(argc, argv, "chat-template", &dir, &file);
    if (rc) return rc;
    struct chat_template *ct = NULL;
    char err[1024] = "";
    int trc = chat_template_load(dir, file, &ct, err, sizeof err);
    if (trc != 0) {
        fprintf(stderr, "duoserve chat-template: %s\n", err[0] ? err : chat_template_strerror(trc));
        return 2;
    }
    size_t len;
    char *in = read_stdin(&len);
    cJSON *req = in ? cJSON_ParseWithLength(in, len) : NULL;
    free(in);
    const cJSON *msgs = req ? cJSON_GetObjectItemCaseSensitive(req, "messages") : NULL;
    if (!cJSON_IsArray(msgs)) {
        fprintf(stderr, "duoserve chat-template: stdin must be {\"messages\": [...], \"add_generation_prompt\": bool}\n");
        cJSON_Delete(req);
        chat_template_free(ct);
        return 1;
    }
    bool gen = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(req, "add_generation_prompt"));
    char *out = NULL;
    /* the other keys (tools, documents, enable_thinking, ...) are template variables */
    trc = chat_template_render(ct, msgs, gen, chat_template_bos_token(ct), chat_template_eos_token(ct), req, &out, err,
                               sizeof err);
    if (trc != 0) {
        fprintf(stderr, "duoserve chat-template: %s\n", err[0] ? err : chat_template_strerror(trc));
        rc = 2;
    } else {
        fputs(out, stdout);
    }
    free(out);
    cJSON_Delete(req);
    chat_template_free(ct);
    return rc;
}
