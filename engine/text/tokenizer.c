/* tokenizer: loading tokenizer.json (+ tokenizer_config.json, config.json,
 * generation_config.json) into the structures of tokenizer_impl.h. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/text/tokenizer_impl.h"
#include "engine/text/utf8.h"

const char *tokenizer_strerror(int status) {
    switch (status) {
    case TOKENIZER_OK: return "ok";
    case TOKENIZER_ERR_NOMEM: return "out of memory";
    case TOKENIZER_ERR_IO: return "cannot read file";
    case TOKENIZER_ERR_JSON: return "invalid JSON";
    case TOKENIZER_ERR_FORMAT: return "malformed tokenizer files";
    case TOKENIZER_ERR_UNSUPPORTED: return "unsupported tokenizer feature";
    case TOKENIZER_ERR_REGEX: return "regex error";
    case TOKENIZER_ERR_INVALID_UTF8: return "text is not valid UTF-8";
    case TOKENIZER_ERR_NOT_FOUND: return "token not in vocabulary";
    default: return "unknown tokenizer error";
    }
}

/* ---- loading helpers ---- */

struct load_ctx {
    struct tokenizer *tok;
    const char *path; // file being parsed, for messages
    char *err;
    size_t errlen;
};

static int fail(struct load_ctx *c, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(struct load_ctx *c, int status, const char *fmt, ...) {
    if (c->err && c->errlen) {
        int k = snprintf(c->err, c->errlen, "%s: ", c->path);
        if (k >= 0 && (size_t)k < c->errlen) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(c->err + k, c->errlen - (size_t)k, fmt, ap);
            va_end(ap);
        }
    }
    return status;
}

/* Reads and parses dir/name. Missing file: TOKENIZER_ERR_IO (errno ENOENT) unless optional, then
 * 0 with *out NULL. */
static int load_json(struct load_ctx *c, const char *dir, const char *name, bool optional, char *path,
                     size_t pathlen, cJSON **out) {
    *out = NULL;
    snprintf(path, pathlen, "%s/%s", dir, name);
    c->path = path;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (optional && errno == ENOENT) return 0;
        return fail(c, TOKENIZER_ERR_IO, "cannot open: %s", strerror(errno));
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return fail(c, TOKENIZER_ERR_IO, "not a regular file");
    }
    size_t size = (size_t)st.st_size, got = 0;
    char *buf = malloc(size + 1);
    if (!buf) {
        close(fd);
        return fail(c, TOKENIZER_ERR_NOMEM, "out of memory reading %zu bytes", size);
    }
    while (got < size) {
        ssize_t r = read(fd, buf + got, size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int e = errno;
            free(buf);
            close(fd);
            return fail(c, TOKENIZER_ERR_IO, "read error: %s", r < 0 ? strerror(e) : "file shrank");
        }
        got += (size_t)r;
    }
    close(fd);
    buf[size] = 0;
    const char *end = NULL;
    *out = cJSON_ParseWithLengthOpts(buf, size, &end, 0);
    size_t at = end ? (size_t)(end - buf) : 0;
    free(buf);
    if (!*out) return fail(c, TOKENIZER_ERR_JSON, "invalid JSON near byte %zu", at);
    return 0;
}

static const char *json_str(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static bool json_bool(const cJSON *o, const char *key, bool def) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : def;
}

static bool json_id(const cJSON *v, int32_t *id) {
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 2147483647.0 ||
        v->valuedouble != (double)(int64_t)v->valuedouble)
        return false;
    *id = (int32_t)v->valuedouble;
    return true;
}

/* "content" of a token given as a string or as {"content": ...}. */
static const char *json_token_content(const cJSON *v) {
    if (cJSON_IsString(v)) return v->valuestring;
    if (cJSON_IsObject(v)) return json_str(v, "content");
    return NULL;
}

static char *dup_str(const char *s, size_t *len) {
    size_t n = strlen(s);
    char *p = malloc(n + 1);
    if (p) memcpy(p, s, n + 1);
    if (len) *len = n;
    return p;
}

/* Pattern of a Split / Replace: {"String": s} or {"Regex": r}. */
static int parse_pattern(struct load_ctx *c, const cJSON *o, const char *what, char **lit, size_t *lit_len,
                         pcre2_code **re) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "pattern");
    const char *s = json_str(p, "String"), *r = json_str(p, "Regex");
    if (s) {
        if (!(*lit = dup_str(s, lit_len))) return fail(c, TOKENIZER_ERR_NOMEM, "out of memory");
        return 0;
    }
    if (r) {
        char msg[300];
        if (!(*re = tokenizer_regex_compile(r, msg, sizeof msg))) return fail(c, TOKENIZER_ERR_REGEX, "%s: %s", what, msg);
        return 0;
    }
    return fail(c, TOKENIZER_ERR_FORMAT, "%s: pattern is neither {\"String\"} nor {\"Regex\"}", what);
}

/* ---- model ---- */

static int parse_model(struct load_ctx *c, const cJSON *m) {
    struct tokenizer *tok = c->tok;
    if (!cJSON_IsObject(m)) return fail(c, TOKENIZER_ERR_FORMAT, "no \"model\" object");
    const char *type = json_str(m, "type");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(m, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(m, "merges");
    if (type ? strcmp(type, "BPE") != 0 : !merges)
        return fail(c, TOKENIZER_ERR_UNSUPPORTED, "model type \"%s\" is not supported (only BPE)", type ? type : "?");
    if (!cJSON_IsObject(vocab)) return fail(c, TOKENIZER_ERR_FORMAT, "model.vocab is not an object");
    if (merges && !cJSON_IsArray(merges)) return fail(c, TOKENIZER_ERR_FORMAT, "model.merges is not an array");

    // vocabulary strings into one arena
    size_t bytes = 0;
    int32_t max_id = -1;
    for (const cJSON *v = vocab->child; v; v = v->next) {
        int32_t id;
        if (!json_id(v, &id)) return fail(c, TOKENIZER_ERR_FORMAT, "model.vocab[\"%s\"] is not a valid id", v->string);
        if (id > max_id) max_id = id;
        bytes += strlen(v->string) + 1;
    }
    tok->n_model = max_id + 1;
    tok->arena = malloc(bytes ? bytes : 1);
    tok->piece_off = malloc(((size_t)tok->n_model + 1) * sizeof *tok->piece_off);
    tok->piece_len = malloc(((size_t)tok->n_model + 1) * sizeof *tok->piece_len);
    if (!tok->arena || !tok->piece_off || !tok->piece_len) return fail(c, TOKENIZER_ERR_NOMEM, "out of memory");
    for (int32_t i = 0; i < tok->n_model; i++) tok->piece_len[i] = UINT32_MAX;
    for (const cJSON *v = vocab->child; v; v = v->next) {
        int32_t id = (int32_t)v->valuedouble;
        size_t n = strlen(v->string);
        memcpy(tok->arena + tok->arena_len, v->string, n + 1);
        tok->piece_off[id] = (uint32_t)tok->arena_len;
        tok->piece_len[id] = (uint32_t)n;
        tok->arena_len += n + 1;
    }
    if (tokenizer_vocab_build(tok)) return fail(c, TOKENIZER_ERR_NOMEM, "out of memory");

    tok->byte_fallback = json_bool(m, "byte_fallback", false);
    tok->fuse_unk = json_bool(m, "fuse_unk", false);
    tok->ignore_merges = json_bool(m, "ignore_merges", false);
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        tok->byte_id[b] = tokenizer_vocab_get(tok, name, 6);
    }
    for (uint32_t cp = 0; cp < 0x800; cp++) {
        char enc[4];
        tok->cp_id[cp] = tokenizer_vocab_get(tok, enc, utf8_encode(cp, enc));
    }
    const char *unk = json_str(m, "unk_token");
    tok->unk_id = unk ? tokenizer_vocab_get(tok, unk, strlen(unk)) : -1;
    const char *pre = json_str(m, "continuing_subword_prefix"), *suf = json_str(m, "end_of_word_suffix");
    if (pre && *pre && !(tok->subword_prefix = dup_str(pre, &tok->subword_prefix_len)))
        return fail(c, TOKENIZER_ERR_NOMEM, "out of memory");
    if (suf && *suf && !(tok->word_suffix = dup_str(suf, &tok->word_suffix_len)))
        return fail(c, TOKENIZER_ERR_NOMEM, "out of memory");

    // merges: "a b" strings or ["a", "b"] pairs; rank = position
    int n_merges = merges ? cJSON_GetArraySize(merges) : 0;
    if (tokenizer_merge_init(&tok->merges, (size_t)n_merges)) return fail(c, TOKENIZER_ERR_NOMEM, "out of memory");
    struct tok_buf cat = {0};
    int rc = 0;
    uint32_t rank = 0;
    for (const cJSON *mg = merges ? merges->child : NULL; mg && !rc; mg = mg->next, rank++) {
        const char *a, *b;
        size_t an, bn;
        if (cJSON_IsString(mg)) {
            a = mg->valuestring;
            const char *sp = strchr(a, ' ');
            if (!sp) {
                rc = fail(c, TOKENIZER_ERR_FORMAT, "merge %u \"%s\" has no space", rank, a);
                break;
            }
            an = (size_t)(sp - a);
            b = sp + 1;
            bn = strlen(b);
        } else if (cJSON_IsArray(mg) && cJSON_GetArraySize(mg) == 2 && cJSON_IsString(mg->child) &&
                   cJSON_IsString(mg->child->next)) {
            a = mg->child->valuestring;
            b = mg->child->next->valuestring;
            an = strlen(a);
            bn = strlen(b);
        } else {
            rc = fail(c, TOKENIZER_ERR_FORMAT, "merge %u is neither \"a b\" nor [\"a\", \"b\"]", rank);
            break;
        }
        int32_t ia = tokenizer_vocab_get(tok, a, an), ib = tokenizer_vocab_get(tok, b, bn);
        // the merged token drops b's continuing-subword prefix
        size_t skip = tok->subword_prefix && bn >= tok->subword_prefix_len &&
                              !memcmp(b, tok->subword_prefix, tok->subword_prefix_len)
                          ? tok->subword_prefix_len
                          : 0;
        cat.len = 0;
        if (tokenizer_buf_append(&cat, a, an) || tokenizer_buf_append(&cat, b + skip, bn - skip)) {
            rc = fail(c, TOKENIZER_ERR_NOMEM, "out of memory");
            break;
        }
        int32_t im = tokenizer_vocab_get(tok, cat.p, cat.len);
        if (ia < 0 || ib < 0 || im < 0) {
            rc = fail(c, TOKENIZER_ERR_FORMAT, "merge %u (\"%.*s\" \"%.*s\") uses a token not in the vocabulary", rank,
                      (int)an, a, (int)bn, b);
            break;
        }
        tokenizer_merge_put(&tok->merges, ia, ib, rank, im);
    }
    free(cat.p);
    return rc;
}

/* ---- added tokens ---- */

static int trie_node(struct tok_trie *t, unsigned char byte) {
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 256;
        struct tok_trie_node *p = realloc(t->node, cap * sizeof *p);
        if (!p) return -1;
        t->node = p;
        t->cap = cap;
    }
    t->node[t->n] = (struct tok_trie_node){-1, -1, -1, byte};
    return (int)t->n++;
}

static int trie_insert(struct tok_trie *t, const char *s, size_t n, int32_t added) {
    if (n == 0) return 0;
    if (t->n == 0 && trie_node(t, 0) < 0) return TOKENIZER_ERR_NOMEM;
    int32_t cur = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char b = (unsigned char)s[i];
        int32_t ch = t->node[cur].child;
        while (ch >= 0 && t->node[ch].byte != b) ch = t->node[ch].sibling;
        if (ch < 0) {
            int k = trie_node(t, b);
            if (k < 0) return TOKENIZER_ERR_NOMEM;
            ch = k;
            t->node[ch].sibling = t->node[cur].child;
            t->node[cur].child = ch;
        }
        cur = ch;
    }
    if (t->node[cur].added < 0) t->node[cur].added = added; // the first of equal patterns wins
    t->first[(unsigned char)s[0]] = true;
    return 0;
}

static int parse_added(struct load_ctx *c, const cJSON *arr) {
    struct tokenizer *tok = c->tok;
    tok->n_vocab = tok->n_model;
    if (!arr || cJSON_IsNull(arr)) return 0;
    if (!cJSON_IsArray(arr)) return fail(c, TOKENIZER_ERR_FORMAT, "added_tokens is not an array");
    size_t n = (size_t)cJSON_GetArraySize(arr);
    tok->added = calloc(n ? n : 1, sizeof *tok->added);
    if (!tok->added) return fail(c, TOKENIZER_ERR_NOMEM, "out of memory");
    for (const cJSON *a = arr->child; a; a = a->next) {
        struct tok_added *t = &tok->added[tok->n_added];
        const char *content = json_str(a, "content");
        if (!json_id(cJSON_GetObjectItemCaseSensitive(a, "id"), &t->id) || !content)
            return fail(c, TOKENIZER_ERR_FORMAT, "added_tokens[%zu] needs an id and a content", tok->n_added);
        if (!(t->content = dup_str(content, &t->len))) return fail(c, TOKENIZER_ERR_NOMEM, "out of memory");
        t->special = json_bool(a, "special", false);
        t->single_word = json_bool(a, "single_word", false);
        t->lstrip = json_bool(a, "lstrip", false);
        t->rstrip = json_bool(a, "rstrip", false);
        t->normalized = json_bool(a, "normalized", !t->special);
        if (t->id + 1 > tok->n_vocab) tok->n_vocab = t->id + 1;
        tok->n_added++;
    }
    return 0;
}

/* Builds id -> added index and the raw-text trie (normalized ones need the normalizer first). */
static int index_added(struct load_ctx *c) {
    struct tokenizer *tok = c->tok;
    tok->added_of_id = malloc(((size_t)tok->n_vocab + 1) * sizeof *tok->added_of_id);
    if (!tok->added_of_id) return fail(c, TOKENIZER_ERR_NOMEM, "out of memory");
    for (int32_t i = 0; i < tok->n_vocab; i++) tok->added_of_id[i] = -1;
    // HF matches special tokens first, then the others, in file order
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < tok->n_added; i++) {
            const struct tok_added *t = &tok->added[i];
            if (t->special != (pass == 0)) continue;
            if (tok->added_of_id[t->id] < 0) tok->added_of_id[t->id] = (int32_t)i;
            if (!t->normalized && trie_insert(&tok->trie_raw, t->content, t->len, (int32_t)i))
                return fail(c, TOKENIZER_ERR_NOMEM, "out of memory");
        }
    return 0;
}

static int index_added_normalized(struct load_ctx *c) {
    struct tokenizer *tok = c->tok;
    struct tok_enc e;
    if (tokenizer_enc_init(&e, tok)) {
        tokenizer_enc_free(&e);
        return fail(c, TOKENIZER_ERR_NOMEM, "out of memory");
    }
    int rc = 0;
    for (int pass = 0; pass < 2 && !rc; pass++)
        for (size_t i = 0; i < tok->n_added && !rc; i++) {
            const struct tok_added *t = &tok->added[i];
            if (t->special != (pass == 0) || !t->normalized) continue;
            const char *s;
            size_t n;
            rc = tokenizer_normalize(&e, t->content, t->len, &s, &n);
            if (!rc) rc = trie_insert(&tok->trie_norm, s, n, (int32_t)i);
            if (rc) rc = fail(c, rc, "added token \"%s\": %s", t->content, tokenizer_strerror(rc));
        }
    tokenizer_enc_free(&e);
    return rc;
}

/* ---- normalizers, pre-tokenizers, decoders, post-processor ---- */

static int grow(struct load_ctx *c, void **arr, size_t *n, size_t size) {
    void *p = realloc(*arr, (*n + 1) * size);
    if (!p) return fail(c, TOKENIZER_ERR_NOMEM, "out of memory");
    *arr = p;
    memset((char *)p + *n * size, 0, size);
    (*n)++;
    return 0;
}

static int parse_normalizer(struct load_ctx *c, const cJSON *o) {
    struct tokenizer *tok = c->tok;
    if (!o || cJSON_IsNull(o)) return 0;
    const char *type = json_str(o, "type");
    if (!type) return fail(c, TOKENIZER_ERR_FORMAT, "normalizer without a type");
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(o, "normalizers");
        for (const cJSON *x = cJSON_IsArray(list) ? list->child : NULL; x; x = x->next) {
            int rc = parse_normalizer(c, x);
            if (rc) return rc;
        }
        return 0;
    }
    enum tok_norm_kind kind;
    if (!strcmp(type, "NFC")) kind = TOK_NORM_NFC;
    else if (!strcmp(type, "NFD")) kind = TOK_NORM_NFD;
    else if (!strcmp(type, "NFKC")) kind = TOK_NORM_NFKC;
    else if (!strcmp(type, "NFKD")) kind = TOK_NORM_NFKD;
    else if (!strcmp(type, "Prepend")) kind = TOK_NORM_PREPEND;
    else if (!strcmp(type, "Replace")) kind = TOK_NORM_REPLACE;
    else if (!strcmp(type, "Lowercase")) kind = TOK_NORM_LOWERCASE;
    else if (!strcmp(type, "Strip")) kind = TOK_NORM_STRIP;
    else return fail(c, TOKENIZER_ERR_UNSUPPORTED, "normalizer type \"%s\" is not supported", type);
    if (grow(c, (void **)&tok->norm, &tok->n_norm, sizeof *tok->norm)) return TOKENIZER_ERR_NOMEM;
    struct tok_normalizer *nz = &tok->norm[tok->n_norm - 1];
    nz->kind = kind;
    if (kind == TOK_NORM_PREPEND) {
        const char *p = json_str(o, "prepend");
        if (!p) return fail(c, TOKENIZER_ERR_FORMAT, "Prepend normalizer without \"prepend\"");
        if (!(nz->a = dup_str(p, &nz->a_len))) return fail(c, TOKENIZER_ERR_NOMEM, "out of memory");
    } else if (kind == TOK_NORM_REPLACE) {
        const char *content = json_str(o, "content");
        if (!content) return fail(c, TOKENIZER_ERR_FORMAT, "Replace normalizer without \"content\"");
        if (!(nz->b = dup_str(content, &nz->b_len))) return fail(c, TOKENIZER_ERR_NOMEM, "out of memory");
        return parse_pattern(c, o, "Replace normalizer", &nz->a, &nz->a_len, &nz->re);
    } else if (kind == TOK_NORM_STRIP) {
        nz->left = json_bool(o, "strip_left", true);
        nz->right = json_bool(o, "strip_right", true);
    }
    return 0;
}

static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int parse_prepend_scheme(const cJSON *o, enum tok_prepend_scheme *out) {
    const char *s = json_str(o, "prepend_scheme");
    if (s) {
        if (!strcmp(s, "always")) *out = TOK_PREPEND_ALWAYS;
        else if (!strcmp(s, "first")) *out = TOK_PREPEND_FIRST;
        else if (!strcmp(s, "never")) *out = TOK_PREPEND_NEVER;
        else return -1;
        return 0;
    }
    *out = json_bool(o, "add_prefix_space", true) ? TOK_PREPEND_ALWAYS : TOK_PREPEND_NEVER;
    return 0;
}

static int parse_pretok(struct load_ctx *c, const cJSON *o) {
    struct tokenizer *tok = c->tok;
    if (!o || cJSON_IsNull(o)) return 0;
    const char *type = json_str(o, "type");
    if (!type) return fail(c, TOKENIZER_ERR_FORMAT, "pre_tokenizer without a type");
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(o, "pretokenizers");
        for (const cJSON *x = cJSON_IsArray(list) ? list->child : NULL; x; x = x->next) {
            int rc = parse_pretok(c, x);
            if (rc) return rc;
        }
        return 0;
    }
    enum tok_pretok_kind kind;
    if (!strcmp(type, "Split")) kind = TOK_PRETOK_SPLIT;
    else if (!strcmp(type, "ByteLevel")) kind = TOK_PRETOK_BYTE_LEVEL;
    else if (!strcmp(type, "Metaspace")) kind = TOK_PRETOK_METASPACE;
    else if (!strcmp(type, "Digits")) kind = TOK_PRETOK_DIGITS;
    else return fail(c, TOKENIZER_ERR_UNSUPPORTED, "pre_tokenizer type \"%s\" is not supported", type);
    if (grow(c, (void **)&tok->pretok, &tok->n_pretok, sizeof *tok->pretok)) return TOKENIZER_ERR_NOMEM;
    struct tok_pretok *p = &tok->pretok[tok->n_pretok - 1];
    p->kind = kind;
    char msg[300];
    switch (kind) {
    case TOK_PRETOK_SPLIT: {
        const char *b = json_str(o, "behavior");
        if (!b) return fail(c, TOKENIZER_ERR_FORMAT, "Split pre_tokenizer without \"behavior\"");
        if (!strcmp(b, "Removed")) p->behavior = TOK_SPLIT_REMOVED;
        else if (!strcmp(b, "Isolated")) p->behavior = TOK_SPLIT_ISOLATED;
        else if (!strcmp(b, "MergedWithPrevious")) p->behavior = TOK_SPLIT_MERGED_WITH_PREVIOUS;
        else if (!strcmp(b, "MergedWithNext")) p->behavior = TOK_SPLIT_MERGED_WITH_NEXT;
        else if (!strcmp(b, "Contiguous")) p->behavior = TOK_SPLIT_CONTIGUOUS;
        else return fail(c, TOKENIZER_ERR_UNSUPPORTED, "Split behavior \"%s\" is not supported", b);
        p->invert = json_bool(o, "invert", false);
        return parse_pattern(c, o, "Split pre_tokenizer", &p->literal, &p->literal_len, &p->re);
    }
    case TOK_PRETOK_BYTE_LEVEL:
        p->add_prefix_space = json_bool(o, "add_prefix_space", true);
        if (json_bool(o, "use_regex", true) && !(p->re = tokenizer_regex_compile(GPT2_PATTERN, msg, sizeof msg)))
            return fail(c, TOKENIZER_ERR_REGEX, "ByteLevel pre_tokenizer: %s", msg);
        return 0;
    case TOK_PRETOK_METASPACE: {
        const char *r = json_str(o, "replacement");
        if (!r || !*r) return fail(c, TOKENIZER_ERR_FORMAT, "Metaspace pre_tokenizer without \"replacement\"");
        if (!(p->literal = dup_str(r, &p->literal_len))) return fail(c, TOKENIZER_ERR_NOMEM, "out of memory");
        if (parse_prepend_scheme(o, &p->prepend)) return fail(c, TOKENIZER_ERR_UNSUPPORTED, "unknown prepend_scheme");
        p->split = json_bool(o, "split", true);
        return 0;
    }
    case TOK_PRETOK_DIGITS:
        p->individual = json_bool(o, "individual_digits", false);
        return 0;
    }
    return 0;
}

static int parse_decoder(struct load_ctx *c, const cJSON *o) {
    struct tokenizer *tok = c->tok;
    if (!o || cJSON_IsNull(o)) return 0;
    const char *type = json_str(o, "type");
    if (!type) return fail(c, TOKENIZER_ERR_FORMAT, "decoder without a type");
    tok->has_decoder = true;
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(o, "decoders");
        for (const cJSON *x = cJSON_IsArray(list) ? list->child : NULL; x; x = x->next) {
            int rc = parse_decoder(c, x);
            if (rc) return rc;
        }
        return 0;
    }
    enum tok_dec_kind kind;
    if (!strcmp(type, "Replace")) kind = TOK_DEC_REPLACE;
    else if (!strcmp(type, "ByteFallback")) kind = TOK_DEC_BYTE_FALLBACK;
    else if (!strcmp(type, "Fuse")) kind = TOK_DEC_FUSE;
    else if (!strcmp(type, "Strip")) kind = TOK_DEC_STRIP;
    else if (!strcmp(type, "ByteLevel")) kind = TOK_DEC_BYTE_LEVEL;
    else if (!strcmp(type, "Metaspace")) kind = TOK_DEC_METASPACE;
    else return fail(c, TOKENIZER_ERR_UNSUPPORTED, "decoder type \"%s\" is not supported", type);
    if (grow(c, (void **)&tok->dec, &tok->n_dec, sizeof *tok->dec)) return TOKENIZER_ERR_NOMEM;
    struct tok_decoder *d = &tok->dec[tok->n_dec - 1];
    d->kind = kind;
    if (kind == TOK_DEC_REPLACE) {
        const char *content = json_str(o, "content");
        pcre2_code *re = NULL;
        if (!content) return fail(c, TOKENIZER_ERR_FORMAT, "Replace decoder without \"content\"");
        if (!(d->content = dup_str(content, &d->content_len))) return fail(c, TOKENIZER_ERR_NOMEM, "out of memory");
        int rc = parse_pattern(c, o, "Replace decoder", &d->pattern, &d->pattern_len, &re);
        if (re) {
            pcre2_code_free(re);
            return fail(c, TOKENIZER_ERR_UNSUPPORTED, "Replace decoder with a Regex pattern is not supported");
        }
        return rc;
    }
    if (kind == TOK_DEC_STRIP) {
        const char *content = json_str(o, "content");
        const cJSON *start = cJSON_GetObjectItemCaseSensitive(o, "start"),
                    *stop = cJSON_GetObjectItemCaseSensitive(o, "stop");
        int32_t a = 0, z = 0;
        if (!content || !*content || (start && !json_id(start, &a)) || (stop && !json_id(stop, &z)))
            return fail(c, TOKENIZER_ERR_FORMAT, "Strip decoder needs a content char and start/stop counts");
        utf8_decode(content, strlen(content), &d->ch);
        d->start = (size_t)a;
        d->stop = (size_t)z;
    }
    if (kind == TOK_DEC_METASPACE) {
        const char *r = json_str(o, "replacement");
        enum tok_prepend_scheme ps;
        if (!r || !*r) return fail(c, TOKENIZER_ERR_FORMAT, "Metaspace decoder without \"replacement\"");
        if (!(d->pattern = dup_str(r, &d->pattern_len))) return fail(c, TOKENIZER_ERR_NOMEM, "out of memory");
        utf8_decode(r, strlen(r), &d->ch);
        if (parse_prepend_scheme(o, &ps)) return fail(c, TOKENIZER_ERR_UNSUPPORTED, "unknown prepend_scheme");
        d->prepend = ps != TOK_PREPEND_NEVER;
    }
    return 0;
}

static int append_ids(struct load_ctx *c, int32_t **arr, size_t *n, const int32_t *ids, size_t k, bool front) {
    int32_t *p = realloc(*arr, (*n + k + 1) * sizeof *p);
    if (!p) return fail(c, TOKENIZER_ERR_NOMEM, "out of memory");
    if (k && front) {
        memmove(p + k, p, *n * sizeof *p);
        memcpy(p, ids, k * sizeof *p);
    } else if (k) {
        memcpy(p + *n, ids, k * sizeof *p);
    }
    *arr = p;
    *n += k;
    return 0;
}

/* Adds a processor's ids around what earlier processors of a Sequence added. */
static int parse_post(struct load_ctx *c, const cJSON *o) {
    struct tokenizer *tok = c->tok;
    if (!o || cJSON_IsNull(o)) return 0;
    const char *type = json_str(o, "type");
    if (!type) return fail(c, TOKENIZER_ERR_FORMAT, "post_processor without a type");
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(o, "processors");
        for (const cJSON *x = cJSON_IsArray(list) ? list->child : NULL; x; x = x->next) {
            int rc = parse_post(c, x);
            if (rc) return rc;
        }
        return 0;
    }
    if (!strcmp(type, "ByteLevel")) return 0; // offsets only
    if (!strcmp(type, "TemplateProcessing")) {
        const cJSON *single = cJSON_GetObjectItemCaseSensitive(o, "single");
        const cJSON *specials = cJSON_GetObjectItemCaseSensitive(o, "special_tokens");
        if (!cJSON_IsArray(single)) return fail(c, TOKENIZER_ERR_FORMAT, "TemplateProcessing without \"single\"");
        int32_t *pre = NULL, *suf = NULL;
        size_t n_pre = 0, n_suf = 0;
        bool seen_seq = false;
        int rc = 0;
        for (const cJSON *it = single->child; it && !rc; it = it->next) {
            if (cJSON_GetObjectItemCaseSensitive(it, "Sequence")) {
                seen_seq = true;
                continue;
            }
            const char *name = json_str(cJSON_GetObjectItemCaseSensitive(it, "SpecialToken"), "id");
            const cJSON *ids = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(specials, name ? name : ""), "ids");
            if (!name || !cJSON_IsArray(ids)) {
                rc = fail(c, TOKENIZER_ERR_FORMAT, "TemplateProcessing: special token \"%s\" has no ids", name ? name : "?");
                break;
            }
            for (const cJSON *x = ids->child; x && !rc; x = x->next) {
                int32_t id;
                if (!json_id(x, &id)) rc = fail(c, TOKENIZER_ERR_FORMAT, "TemplateProcessing: bad id for \"%s\"", name);
                else rc = seen_seq ? append_ids(c, &suf, &n_suf, &id, 1, false) : append_ids(c, &pre, &n_pre, &id, 1, false);
            }
        }
        if (!rc) rc = append_ids(c, &tok->post_prefix, &tok->n_post_prefix, pre, n_pre, true);
        if (!rc) rc = append_ids(c, &tok->post_suffix, &tok->n_post_suffix, suf, n_suf, false);
        free(pre);
        free(suf);
        return rc;
    }
    if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing")) {
        const cJSON *cls = cJSON_GetObjectItemCaseSensitive(o, "cls"), *sep = cJSON_GetObjectItemCaseSensitive(o, "sep");
        int32_t a, z;
        if (cJSON_GetArraySize(cls) != 2 || cJSON_GetArraySize(sep) != 2 || !json_id(cJSON_GetArrayItem(cls, 1), &a) ||
            !json_id(cJSON_GetArrayItem(sep, 1), &z))
            return fail(c, TOKENIZER_ERR_FORMAT, "%s needs cls and sep [token, id]", type);
        int rc = append_ids(c, &tok->post_prefix, &tok->n_post_prefix, &a, 1, true);
        return rc ? rc : append_ids(c, &tok->post_suffix, &tok->n_post_suffix, &z, 1, false);
    }
    return fail(c, TOKENIZER_ERR_UNSUPPORTED, "post_processor type \"%s\" is not supported", type);
}

/* ---- specials from the config files ---- */

static int add_eos(struct load_ctx *c, int32_t id) {
    struct tokenizer *tok = c->tok;
    if (id < 0) return 0;
    for (size_t i = 0; i < tok->n_eos; i++)
        if (tok->eos[i] == id) return 0;
    return append_ids(c, &tok->eos, &tok->n_eos, &id, 1, false);
}

static int add_eos_json(struct load_ctx *c, const cJSON *v) {
    int32_t id;
    if (json_id(v, &id)) return add_eos(c, id);
    for (const cJSON *x = cJSON_IsArray(v) ? v->child : NULL; x; x = x->next)
        if (json_id(x, &id) && add_eos(c, id)) return TOKENIZER_ERR_NOMEM;
    return 0;
}

static int32_t content_id(const struct tokenizer *tok, const char *s) {
    int32_t id;
    return s && !tokenizer_piece_to_id(tok, s, strlen(s), &id) ? id : -1;
}

static int load_specials(struct load_ctx *c, const char *dir, char *path, size_t pathlen) {
    struct tokenizer *tok = c->tok;
    cJSON *tc = NULL, *mc = NULL, *gc = NULL;
    int rc = load_json(c, dir, "tokenizer_config.json", true, path, pathlen, &tc);
    if (!rc && tc && !cJSON_IsObject(tc)) rc = fail(c, TOKENIZER_ERR_FORMAT, "not a JSON object");
    char path2[4096];
    if (!rc) rc = load_json(c, dir, "config.json", true, path2, sizeof path2, &mc);
    char path3[4096];
    if (!rc) rc = load_json(c, dir, "generation_config.json", true, path3, sizeof path3, &gc);
    if (rc) goto out;
    c->path = path;

    tok->bos_id = content_id(tok, json_token_content(cJSON_GetObjectItemCaseSensitive(tc, "bos_token")));
    int32_t id;
    if (tok->bos_id < 0 && json_id(cJSON_GetObjectItemCaseSensitive(mc, "bos_token_id"), &id)) tok->bos_id = id;
    rc = add_eos(c, content_id(tok, json_token_content(cJSON_GetObjectItemCaseSensitive(tc, "eos_token"))));
    if (!rc) rc = add_eos_json(c, cJSON_GetObjectItemCaseSensitive(mc, "eos_token_id"));
    if (!rc) rc = add_eos_json(c, cJSON_GetObjectItemCaseSensitive(gc, "eos_token_id"));
    if (rc) goto out;

    // transformers rebuilds the post-processor from these flags when the config has them
    const cJSON *ab = cJSON_GetObjectItemCaseSensitive(tc, "add_bos_token"),
                *ae = cJSON_GetObjectItemCaseSensitive(tc, "add_eos_token");
    if (cJSON_IsBool(ab) || cJSON_IsBool(ae)) {
        tok->n_post_prefix = tok->n_post_suffix = 0;
        if (cJSON_IsTrue(ab) && tok->bos_id >= 0) rc = append_ids(c, &tok->post_prefix, &tok->n_post_prefix, &tok->bos_id, 1, false);
        if (!rc && cJSON_IsTrue(ae) && tok->n_eos > 0) rc = append_ids(c, &tok->post_suffix, &tok->n_post_suffix, &tok->eos[0], 1, false);
    }
out:
    cJSON_Delete(tc);
    cJSON_Delete(mc);
    cJSON_Delete(gc);
    return rc;
}

/* ---- load / free ---- */

int tokenizer_load(struct tokenizer **out, const char *dir, char *err, size_t errlen) {
    *out = NULL;
    if (err && errlen) err[0] = 0;
    struct tokenizer *tok = calloc(1, sizeof *tok);
    char path[4096];
    struct load_ctx c = {tok, dir, err, errlen};
    if (!tok) return fail(&c, TOKENIZER_ERR_NOMEM, "out of memory");
    tok->unk_id = tok->bos_id = -1;
    tok->stream_strip = -1;
    tokenizer_bytelevel_init(tok);
    cJSON *root = NULL;
    int rc = load_json(&c, dir, "tokenizer.json", false, path, sizeof path, &root);
    if (!rc && !cJSON_IsObject(root)) rc = fail(&c, TOKENIZER_ERR_FORMAT, "not a JSON object");
    if (!rc) rc = parse_model(&c, cJSON_GetObjectItemCaseSensitive(root, "model"));
    if (!rc) rc = parse_added(&c, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"));
    if (!rc) rc = index_added(&c);
    if (!rc) rc = parse_normalizer(&c, cJSON_GetObjectItemCaseSensitive(root, "normalizer"));
    if (!rc) rc = parse_pretok(&c, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"));
    if (!rc) rc = parse_decoder(&c, cJSON_GetObjectItemCaseSensitive(root, "decoder"));
    if (!rc) rc = parse_post(&c, cJSON_GetObjectItemCaseSensitive(root, "post_processor"));
    if (!rc) rc = index_added_normalized(&c);
    if (!rc && tok->n_pretok == 0 && !tok->subword_prefix && !tok->word_suffix && tokenizer_pairs_build(tok))
        rc = fail(&c, TOKENIZER_ERR_NOMEM, "out of memory");
    if (!rc) {
        char msg[256];
        rc = tokenizer_decoder_plan(tok, msg, sizeof msg);
        if (rc) rc = fail(&c, rc, "decoder: %s", msg);
    }
    cJSON_Delete(root);
    if (!rc) rc = load_specials(&c, dir, path, sizeof path);
    if (rc) {
        tokenizer_free(tok);
        return rc;
    }
    *out = tok;
    return 0;
}

void tokenizer_free(struct tokenizer *tok) {
    if (!tok) return;
    free(tok->arena);
    free(tok->piece_off);
    free(tok->piece_len);
    free(tok->vocab.slot);
    free(tok->vocab.hash);
    free(tok->merges.slot);
    free(tok->pairs.slot);
    free(tok->subword_prefix);
    free(tok->word_suffix);
    for (size_t i = 0; i < tok->n_added; i++) free(tok->added[i].content);
    free(tok->added);
    free(tok->added_of_id);
    free(tok->trie_raw.node);
    free(tok->trie_norm.node);
    for (size_t i = 0; i < tok->n_norm; i++) {
        free(tok->norm[i].a);
        free(tok->norm[i].b);
        pcre2_code_free(tok->norm[i].re);
    }
    free(tok->norm);
    for (size_t i = 0; i < tok->n_pretok; i++) {
        free(tok->pretok[i].literal);
        pcre2_code_free(tok->pretok[i].re);
    }
    free(tok->pretok);
    for (size_t i = 0; i < tok->n_dec; i++) {
        free(tok->dec[i].pattern);
        free(tok->dec[i].content);
    }
    free(tok->dec);
    free(tok->post_prefix);
    free(tok->post_suffix);
    free(tok->eos);
    free(tok);
}
