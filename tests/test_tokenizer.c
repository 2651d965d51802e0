/* Tests of engine/text/tokenizer: HF tokenizer.json BPE tokenizers and the incremental detokenizer.
 *
 * Where the expected values come from (never from this code's own output):
 *  - ../shared/tokenizer-vectors and ../shared/chat-templates: ids produced by HF tokenizers;
 *  - small synthetic tokenizer.json files built here, with expectations taken from the unit
 *    tests and doc comments of HF `tokenizers` (split.rs, byte_level.rs, metaspace.rs,
 *    added_vocabulary.rs, normalizer.rs) or worked out by hand from the BPE definition;
 *  - pre-tokenizer splits of the real Llama-3/Qwen3 regexes as computed by Python's `regex`
 *    module (an independent engine), shown in byte-level form;
 *  - U+FFFD replacement as Python's bytes.decode('utf-8', 'replace') does it (the same
 *    "maximal subpart" practice as Rust's String::from_utf8_lossy).
 * Fixture tests skip, with a message, when ../shared (or $DUO_SHARED) is absent. */
#include <cjson/cJSON.h>
#include <stdbool.h>

#include "engine/text/tokenizer.h"
#include "engine/text/tokenizer_impl.h"
#include "engine/text/utf8.h"
#include "tests/test_common.h"

/* ---- helpers ---- */

static struct tokenizer *load_dir(const char *dir) {
    char err[512];
    struct tokenizer *t = NULL;
    int rc = tokenizer_load(&t, dir, err, sizeof err);
    if (rc) fail_msg("tokenizer_load(%s): %s (%s)", dir, err, tokenizer_strerror(rc));
    return t;
}

/* Loads ../shared/<rel>, or skips the test with a visible reason. */
static struct tokenizer *load_fixture(const char *rel) {
    char path[2048], file[512];
    snprintf(file, sizeof file, "%s/tokenizer.json", rel);
    TEST_REQUIRE_SHARED(path, file);
    snprintf(path, sizeof path, "%s/%s", test_shared_dir(), rel);
    return load_dir(path);
}

static char *read_text(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
    b[n] = 0;
    fclose(f);
    if (len) *len = (size_t)n;
    return b;
}

/* Skips the test unless ../shared/<rel> exists (checked before anything is allocated). */
static void require_fixture(const char *rel) {
    char path[2048];
    TEST_REQUIRE_SHARED(path, rel);
}

/* Reads ../shared/<rel>, or skips. */
static char *read_fixture(const char *rel, size_t *len) {
    char path[1024];
    TEST_REQUIRE_SHARED(path, rel);
    char *s = read_text(path, len);
    assert_non_null(s);
    return s;
}

static void encode(const struct tokenizer *t, const char *s, bool add_special, int32_t **ids, size_t *n) {
    int rc = tokenizer_encode(t, s, strlen(s), add_special, ids, n);
    if (rc) fail_msg("encode(\"%s\"): %s", s, tokenizer_strerror(rc));
}

static char *decode(const struct tokenizer *t, const int32_t *ids, size_t n, bool skip) {
    char *s = NULL;
    int rc = tokenizer_decode(t, ids, n, skip, &s, NULL);
    if (rc) fail_msg("decode: %s", tokenizer_strerror(rc));
    return s;
}

static bool ids_equal(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    return na == nb && (na == 0 || !memcmp(a, b, na * sizeof *a));
}

static void print_ids(const char *label, const int32_t *ids, size_t n) {
    print_message("  %s:", label);
    for (size_t i = 0; i < n; i++) print_message(" %d", ids[i]);
    print_message("\n");
}

static void expect_encode(const struct tokenizer *t, const char *s, bool add_special, const int32_t *exp, size_t n_exp) {
    int32_t *ids;
    size_t n;
    encode(t, s, add_special, &ids, &n);
    if (!ids_equal(ids, n, exp, n_exp)) {
        print_message("encode mismatch for \"%s\"\n", s);
        print_ids("got", ids, n);
        print_ids("expected", exp, n_exp);
        free(ids);
        fail();
    }
    free(ids);
}
#define EXPECT_ENCODE(t, s, add, ...)                                                  \
    do {                                                                               \
        const int32_t exp_[] = {__VA_ARGS__};                                          \
        expect_encode(t, s, add, exp_, sizeof exp_ / sizeof exp_[0]);                  \
    } while (0)

static void expect_decode(const struct tokenizer *t, const int32_t *ids, size_t n, bool skip, const char *exp) {
    char *s = decode(t, ids, n, skip);
    if (strcmp(s, exp)) {
        print_message("decode mismatch: got \"%s\", expected \"%s\"\n", s, exp);
        free(s);
        fail();
    }
    free(s);
}
#define EXPECT_DECODE(t, skip, exp, ...)                                               \
    do {                                                                               \
        const int32_t ids_[] = {__VA_ARGS__};                                          \
        expect_decode(t, ids_, sizeof ids_ / sizeof ids_[0], skip, exp);               \
    } while (0)

static int32_t piece_id(const struct tokenizer *t, const char *piece) {
    int32_t id = -1;
    if (tokenizer_piece_to_id(t, piece, strlen(piece), &id)) fail_msg("no token \"%s\"", piece);
    return id;
}

/* Collects pre-tokenizer pieces. */
struct pieces {
    char *s[64];
    size_t n;
};
static int collect_piece(void *ctx, const char *s, size_t n) {
    struct pieces *p = ctx;
    if (p->n < 64) p->s[p->n++] = strndup(s, n);
    return 0;
}
static void expect_pieces(const struct tokenizer *t, const char *text, const char *const *exp, size_t n_exp) {
    struct pieces p = {{0}, 0};
    assert_int_equal(tokenizer_pretokenize(t, text, strlen(text), collect_piece, &p), 0);
    bool ok = p.n == n_exp;
    for (size_t i = 0; ok && i < n_exp; i++) ok = !strcmp(p.s[i], exp[i]);
    if (!ok) {
        print_message("pre-tokenization of \"%s\":\n  got:", text);
        for (size_t i = 0; i < p.n; i++) print_message(" [%s]", p.s[i]);
        print_message("\n  expected:");
        for (size_t i = 0; i < n_exp; i++) print_message(" [%s]", exp[i]);
        print_message("\n");
    }
    for (size_t i = 0; i < p.n; i++) free(p.s[i]);
    assert_true(ok);
}
#define EXPECT_PIECES(t, text, ...)                                                    \
    do {                                                                               \
        const char *const exp_[] = {__VA_ARGS__};                                      \
        expect_pieces(t, text, exp_, sizeof exp_ / sizeof exp_[0]);                    \
    } while (0)

/* A piece of text that may hold NUL bytes (a <0x00> token decodes to one). */
struct piece {
    char *s;
    size_t n;
};

/* Streams ids through a tokenizer_stream; checks every piece is valid UTF-8 and returns the
 * concatenation (malloc'd, *len bytes). If pieces is not NULL, piece i (i < n) is copied there. */
static char *stream_all_len(const struct tokenizer *t, const int32_t *ids, size_t n, bool skip, struct piece *pieces,
                            size_t *all_len) {
    struct tokenizer_stream st;
    tokenizer_stream_init(&st, t, skip);
    size_t cap = 256, len = 0;
    char *all = malloc(cap);
    assert_non_null(all);
    all[0] = 0;
    for (size_t i = 0; i <= n; i++) {
        const char *p;
        size_t pl;
        int rc = i < n ? tokenizer_stream_push(&st, ids[i], &p, &pl) : tokenizer_stream_flush(&st, &p, &pl);
        assert_int_equal(rc, 0);
        assert_int_equal(p[pl], 0);
        if (!utf8_valid(p, pl)) fail_msg("piece %zu is not valid UTF-8", i);
        if (pieces && i < n) {
            pieces[i].s = malloc(pl + 1);
            memcpy(pieces[i].s, p, pl + 1);
            pieces[i].n = pl;
        }
        while (len + pl + 1 > cap) all = realloc(all, cap *= 2);
        memcpy(all + len, p, pl + 1);
        len += pl;
    }
    tokenizer_stream_free(&st);
    tokenizer_stream_free(NULL);
    if (all_len) *all_len = len;
    return all;
}

/* The same for text without NUL bytes; pieces as plain strings. */
static char *stream_all(const struct tokenizer *t, const int32_t *ids, size_t n, bool skip, char **pieces) {
    struct piece *ps = pieces ? calloc(n + 1, sizeof *ps) : NULL;
    size_t len;
    char *all = stream_all_len(t, ids, n, skip, ps, &len);
    assert_int_equal(strlen(all), len);
    for (size_t i = 0; pieces && i < n; i++) pieces[i] = ps[i].s;
    free(ps);
    return all;
}

/* ---- synthetic tokenizer.json files ---- */

static cJSON *synth_new(void) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "version", "1.0");
    cJSON_AddArrayToObject(root, "added_tokens");
    cJSON_AddNullToObject(root, "normalizer");
    cJSON_AddNullToObject(root, "pre_tokenizer");
    cJSON_AddNullToObject(root, "post_processor");
    cJSON_AddNullToObject(root, "decoder");
    cJSON *m = cJSON_AddObjectToObject(root, "model");
    cJSON_AddStringToObject(m, "type", "BPE");
    cJSON_AddNullToObject(m, "unk_token");
    cJSON_AddObjectToObject(m, "vocab");
    cJSON_AddArrayToObject(m, "merges");
    return root;
}

static void synth_set(cJSON *obj, const char *key, const char *json) {
    cJSON *v = cJSON_Parse(json);
    assert_non_null(v);
    cJSON_DeleteItemFromObjectCaseSensitive(obj, key);
    cJSON_AddItemToObject(obj, key, v);
}

static void synth_vocab(cJSON *root, const char *tok, int id) {
    cJSON_AddNumberToObject(cJSON_GetObjectItem(cJSON_GetObjectItem(root, "model"), "vocab"), tok, id);
}

static void synth_merge(cJSON *root, const char *merge) {
    cJSON_AddItemToArray(cJSON_GetObjectItem(cJSON_GetObjectItem(root, "model"), "merges"), cJSON_CreateString(merge));
}

static void synth_added(cJSON *root, int id, const char *content, bool special, bool normalized, bool lstrip,
                        bool rstrip, bool single_word) {
    cJSON *a = cJSON_CreateObject();
    cJSON_AddNumberToObject(a, "id", id);
    cJSON_AddStringToObject(a, "content", content);
    cJSON_AddBoolToObject(a, "single_word", single_word);
    cJSON_AddBoolToObject(a, "lstrip", lstrip);
    cJSON_AddBoolToObject(a, "rstrip", rstrip);
    cJSON_AddBoolToObject(a, "normalized", normalized);
    cJSON_AddBoolToObject(a, "special", special);
    cJSON_AddItemToArray(cJSON_GetObjectItem(root, "added_tokens"), a);
}

/* Printable ASCII, one token per character: id = c - 32. */
static void synth_ascii_vocab(cJSON *root) {
    for (int c = 32; c < 127; c++) {
        char s[2] = {(char)c, 0};
        synth_vocab(root, s, c - 32);
    }
}

/* Writes root (deleted) as tokenizer.json, and config if not NULL, into a new temp dir, and
 * loads it. *dir must be removed and freed by the caller. */
static struct tokenizer *synth_load(cJSON *root, const char *config, char **dir) {
    *dir = test_mkdtemp();
    char path[1024];
    char *json = cJSON_Print(root);
    cJSON_Delete(root);
    snprintf(path, sizeof path, "%s/tokenizer.json", *dir);
    test_write_text(path, json);
    free(json);
    if (config) {
        snprintf(path, sizeof path, "%s/tokenizer_config.json", *dir);
        test_write_text(path, config);
    }
    return load_dir(*dir);
}

static void synth_done(struct tokenizer *t, char *dir) {
    tokenizer_free(t);
    test_rm_rf(dir);
    free(dir);
}

/* ======================= fixture tests: HF vectors ======================= */

/* Every input of ../shared/tokenizer-vectors/<vec>.inp encodes (no special tokens) to the ids
 * on the matching line of <vec>.out, and decodes back to itself. */
static void run_vectors(const char *tok_rel, const char *vec) {
    char rel[256];
    snprintf(rel, sizeof rel, "tokenizer-vectors/%s.out", vec);
    require_fixture(rel);
    snprintf(rel, sizeof rel, "tokenizer-vectors/%s.inp", vec);
    require_fixture(rel);
    struct tokenizer *t = load_fixture(tok_rel);
    char *inp = read_fixture(rel, NULL);
    snprintf(rel, sizeof rel, "tokenizer-vectors/%s.out", vec);
    char *out = read_fixture(rel, NULL);

    static const char sep[] = "\n__ggml_vocab_test__\n";
    int n_in = 0, n_ok = 0, n_rt = 0;
    char *p = inp, *q = out;
    for (;;) {
        char *e = strstr(p, sep), *nl = strchr(q, '\n');
        if (e) *e = 0;
        if (nl) *nl = 0;
        int32_t exp[4096];
        size_t n_exp = 0;
        for (char *c = q, *end; *c; c = end) {
            long v = strtol(c, &end, 10);
            if (end == c) break;
            assert_true(n_exp < 4096);
            exp[n_exp++] = (int32_t)v;
        }
        int32_t *ids;
        size_t n;
        encode(t, p, false, &ids, &n);
        n_in++;
        if (ids_equal(ids, n, exp, n_exp)) n_ok++;
        else {
            print_message("%s: input %d \"%s\" encodes differently from HF\n", vec, n_in, p);
            print_ids("got", ids, n);
            print_ids("HF", exp, n_exp);
        }
        char *d = decode(t, ids, n, false);
        if (!strcmp(d, p)) n_rt++;
        else print_message("%s: input %d \"%s\" decodes to \"%s\"\n", vec, n_in, p, d);
        free(d);
        free(ids);
        if (!e) break;
        p = e + sizeof sep - 1;
        q = nl ? nl + 1 : q + strlen(q);
    }
    print_message("%s vectors with %s: %d/%d encode exactly as HF, %d/%d round-trip\n", vec, tok_rel, n_ok, n_in,
                  n_rt, n_in);
    assert_true(n_in > 40);
    assert_int_equal(n_ok, n_in);
    assert_int_equal(n_rt, n_in);
    free(inp);
    free(out);
    tokenizer_free(t);
}

static void test_llama2_vectors_encode_as_hf_and_round_trip(void **state) {
    run_vectors("tokenizers/llama2", "llama2");
}

static void test_llama3_vectors_encode_as_hf_and_round_trip(void **state) {
    run_vectors("tokenizers/llama3", "llama3");
}

static void test_qwen3_vectors_encode_as_hf_and_round_trip(void **state) {
    run_vectors("tokenizers/qwen3", "qwen2");
}

/* Rendered chat prompts (special tokens in the middle of text) encode to HF's ids; the
 * byte-level ones also decode back to the text. */
static void test_chat_renders_encode_to_hf_ids(void **state) {
    require_fixture("tokenizers/llama2/tokenizer.json");
    require_fixture("tokenizers/llama3/tokenizer.json");
    require_fixture("tokenizers/qwen3/tokenizer.json");
    size_t len;
    char *js = read_fixture("chat-templates/expected_renders.json", &len);
    cJSON *root = cJSON_ParseWithLength(js, len);
    assert_non_null(root);
    const char *names[] = {"llama2", "llama3", "qwen3"};
    int checked = 0;
    for (int k = 0; k < 3; k++) {
        const cJSON *cases = cJSON_GetObjectItem(root, names[k]);
        if (!cases) continue;
        char rel[64];
        snprintf(rel, sizeof rel, "tokenizers/%s", names[k]);
        struct tokenizer *t = load_fixture(rel);
        for (const cJSON *c = cases->child; c; c = c->next) {
            const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
            const cJSON *jids = cJSON_GetObjectItem(c, "ids");
            size_t n_exp = (size_t)cJSON_GetArraySize(jids);
            int32_t *exp = malloc((n_exp + 1) * sizeof *exp);
            size_t i = 0;
            for (const cJSON *x = jids->child; x; x = x->next) exp[i++] = (int32_t)x->valuedouble;
            print_message("%s %s\n", names[k], c->string);
            expect_encode(t, text, false, exp, n_exp);
            // SentencePiece's per-segment Prepend means "<s>[INST]" decodes as "<s> [INST]"
            if (k > 0) expect_decode(t, exp, n_exp, false, text);
            free(exp);
            checked++;
        }
        tokenizer_free(t);
    }
    print_message("%d chat renders encode as HF\n", checked);
    assert_true(checked >= 10);
    cJSON_Delete(root);
    free(js);
}

/* ======================= fixture tests: pieces ======================= */

/* Pre-tokenizer splits of the real regexes; expected pieces from Python's `regex` module. */
static void test_llama3_pretokenizer_splits(void **state) {
    struct tokenizer *t = load_fixture("tokenizers/llama3");
    EXPECT_PIECES(t, "Hello world", "Hello", "Ġworld");
    EXPECT_PIECES(t, "   Hello\n\n  world!!", "ĠĠ", "ĠHello", "ĊĊ", "Ġ", "Ġworld", "!!");
    EXPECT_PIECES(t, "I'm 12345 DON'T", "I", "'m", "Ġ", "123", "45", "ĠDON", "'T");
    EXPECT_PIECES(t, "x = f(3)\r\n\tok", "x", "Ġ=", "Ġf", "(", "3", ")čĊ", "ĉok");
    EXPECT_PIECES(t, "你好，世界 🦙", "ä½łå¥½", "ï¼Įä¸ĸçķĮ", "ĠðŁ¦Ļ");
    tokenizer_free(t);
}

static void test_qwen3_pretokenizer_splits_digits_one_by_one(void **state) {
    struct tokenizer *t = load_fixture("tokenizers/qwen3");
    EXPECT_PIECES(t, "I'm 12345 DON'T", "I", "'m", "Ġ", "1", "2", "3", "4", "5", "ĠDON", "'T");
    EXPECT_PIECES(t, "   Hello\n\n  world!!", "ĠĠ", "ĠHello", "ĊĊ", "Ġ", "Ġworld", "!!");
    // NFC first: "e" + U+0301 becomes "é" (U+00E9 = bytes C3 A9 = "Ã©")
    EXPECT_PIECES(t, "caf\x65\xCC\x81", "cafÃ©");
    tokenizer_free(t);
}

static void test_special_ids_and_add_special_tokens(void **state) {
    struct tokenizer *t = load_fixture("tokenizers/llama2");
    assert_int_equal(tokenizer_vocab_size(t), 32000);
    assert_int_equal(tokenizer_bos_id(t), 1);
    assert_int_equal(tokenizer_eos_id(t), 2);
    assert_true(tokenizer_is_special(t, 1) && tokenizer_is_special(t, 2) && !tokenizer_is_special(t, 15043));
    // add_bos_token: true, add_eos_token: false
    EXPECT_ENCODE(t, "Hello", true, 1, 15043);
    EXPECT_ENCODE(t, "Hello", false, 15043);
    EXPECT_ENCODE(t, "", true, 1);
    size_t pl;
    assert_string_equal(tokenizer_id_to_piece(t, 15043, &pl), "▁Hello");
    assert_int_equal(pl, strlen("▁Hello"));
    assert_string_equal(tokenizer_id_to_piece(t, 13, NULL), "<0x0A>");
    assert_null(tokenizer_id_to_piece(t, 32000, NULL));
    assert_null(tokenizer_id_to_piece(t, -1, NULL));
    int32_t id;
    assert_int_equal(tokenizer_piece_to_id(t, "no such token", 13, &id), TOKENIZER_ERR_NOT_FOUND);
    tokenizer_free(t);

    // llama3's tokenizer.json post-processor is ByteLevel only and its config has no
    // add_bos_token: HF's encode(text) adds nothing (its chat template writes the BOS).
    t = load_fixture("tokenizers/llama3");
    assert_int_equal(tokenizer_vocab_size(t), 128256);
    assert_int_equal(tokenizer_bos_id(t), 128000);
    assert_int_equal(tokenizer_eos_id(t), 128001);
    assert_true(tokenizer_is_special(t, 128009) && !tokenizer_is_special(t, 9906));
    EXPECT_ENCODE(t, "Hello", true, 9906);
    assert_int_equal(piece_id(t, "ĠHello"), 22691);
    assert_int_equal(piece_id(t, "<|eot_id|>"), 128009);
    assert_string_equal(tokenizer_id_to_piece(t, 128009, NULL), "<|eot_id|>");
    tokenizer_free(t);

    // qwen3: no BOS, eos_token <|im_end|>, add_bos_token false
    t = load_fixture("tokenizers/qwen3");
    assert_int_equal(tokenizer_vocab_size(t), 151669);
    assert_int_equal(tokenizer_bos_id(t), -1);
    assert_int_equal(tokenizer_eos_id(t), 151645);
    const int32_t *eos;
    assert_int_equal(tokenizer_eos_ids(t, &eos), 1);
    assert_true(tokenizer_is_eos(t, 151645) && !tokenizer_is_eos(t, 151643));
    EXPECT_ENCODE(t, "Hello", true, 9707);
    // <think> is an added token but not a special one
    assert_false(tokenizer_is_special(t, 151667));
    assert_true(tokenizer_is_special(t, 151645));
    tokenizer_free(t);
}

/* Added tokens split the raw text before anything else: each side is encoded on its own. */
static void test_added_tokens_in_the_middle_of_text(void **state) {
    struct tokenizer *t = load_fixture("tokenizers/llama3");
    int32_t *a, *b, *ab;
    size_t na, nb, nab;
    encode(t, "Say hi", false, &a, &na);
    encode(t, " there", false, &b, &nb);
    encode(t, "Say hi<|eot_id|> there", false, &ab, &nab);
    assert_int_equal(nab, na + 1 + nb);
    assert_memory_equal(ab, a, na * sizeof *a);
    assert_int_equal(ab[na], 128009);
    assert_memory_equal(ab + na + 1, b, nb * sizeof *b);
    free(a);
    free(b);
    free(ab);
    // a partial or unknown special-looking string is plain text
    encode(t, "<|eot_id|", false, &a, &na);
    for (size_t i = 0; i < na; i++) assert_true(a[i] < 128000);
    free(a);
    tokenizer_free(t);

    // SentencePiece: the Prepend normalizer runs on each piece, so the text after <s> gets a ▁
    t = load_fixture("tokenizers/llama2");
    encode(t, "Hello", false, &a, &na);
    encode(t, "Hello<s>Hello", false, &ab, &nab);
    assert_int_equal(nab, 2 * na + 1);
    assert_memory_equal(ab, a, na * sizeof *a);
    assert_int_equal(ab[na], 1);
    assert_memory_equal(ab + na + 1, a, na * sizeof *a);
    free(a);
    free(ab);
    tokenizer_free(t);

    // qwen3: non-special added tokens are matched too, and kept by skip_special decoding
    t = load_fixture("tokenizers/qwen3");
    encode(t, "<think>\nok\n</think><|im_end|>", false, &a, &na);
    assert_true(na >= 4);
    assert_int_equal(a[0], 151667);
    assert_int_equal(a[na - 2], 151668);
    assert_int_equal(a[na - 1], 151645);
    char *s = decode(t, a, na, true);
    assert_string_equal(s, "<think>\nok\n</think>");
    free(s);
    s = decode(t, a, na, false);
    assert_string_equal(s, "<think>\nok\n</think><|im_end|>");
    free(s);
    free(a);
    tokenizer_free(t);
}

/* Byte fallback: characters missing from the vocabulary become <0xNN> tokens (ids 3 + byte),
 * and a run of byte tokens decodes as UTF-8, or as one U+FFFD per byte when the run is not
 * valid UTF-8 (HF ByteFallback decoder). */
static void test_llama2_byte_fallback(void **state) {
    struct tokenizer *t = load_fixture("tokenizers/llama2");
    EXPECT_ENCODE(t, "\t", false, 29871, 3 + 0x09);
    EXPECT_ENCODE(t, "🦙", false, 29871, 3 + 0xF0, 3 + 0x9F, 3 + 0xA6, 3 + 0x99);
    EXPECT_DECODE(t, false, "🦙", 3 + 0xF0, 3 + 0x9F, 3 + 0xA6, 3 + 0x99);
    // 263 = "▁a"; an unfinished emoji: two bytes, two U+FFFD
    EXPECT_DECODE(t, false, "a\xEF\xBF\xBD\xEF\xBF\xBD", 263, 3 + 0xF0, 3 + 0x9F);
    // C3 28 is invalid as a whole: both bytes are replaced, even the valid '(' (not "\uFFFD(")
    EXPECT_DECODE(t, false, "\xEF\xBF\xBD\xEF\xBF\xBD", 3 + 0xC3, 3 + 0x28);
    // a non-byte token ends the run
    EXPECT_DECODE(t, false, "\xEF\xBF\xBD a", 3 + 0xC3, 263);
    // special tokens are removed before the decoders run: with skip, the run C3 A9 is whole
    EXPECT_DECODE(t, true, "é", 3 + 0xC3, 2, 3 + 0xA9);
    EXPECT_DECODE(t, false, "\xEF\xBF\xBD</s>\xEF\xBF\xBD", 3 + 0xC3, 2, 3 + 0xA9);
    // ids outside the vocabulary are dropped
    EXPECT_DECODE(t, false, "Hello", 15043, 40000, -3);
    tokenizer_free(t);
}

/* ByteLevel decoding: bytes of all tokens, then from_utf8_lossy (one U+FFFD per maximal
 * invalid subpart). Example bytes of the Unicode standard (chapter 3, U+FFFD substitution). */
static void test_llama3_bytelevel_decode_replaces_maximal_subparts(void **state) {
    struct tokenizer *t = load_fixture("tokenizers/llama3");
    const unsigned char bytes[] = {0x61, 0xF1, 0x80, 0x80, 0xE1, 0x80, 0xC2, 0x62, 0x80, 0x63, 0x80, 0xBF, 0x64};
    int32_t ids[sizeof bytes];
    for (size_t i = 0; i < sizeof bytes; i++) {
        // the one-character token of each byte (GPT-2 alphabet: printable bytes stand for
        // themselves, 0x80..0xA0 are U+0100 + n in order)
        uint32_t cp = bytes[i] < 0x80 ? bytes[i] : bytes[i] <= 0xA0 ? 0x100 + 33 + (bytes[i] - 0x7F) : bytes[i];
        char s[5] = {0};
        utf8_encode(cp, s);
        ids[i] = piece_id(t, s);
    }
    expect_decode(t, ids, sizeof bytes, false, "a\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD" "b\xEF\xBF\xBD" "c\xEF\xBF\xBD\xEF\xBF\xBD" "d");
    tokenizer_free(t);
}

/* ======================= fixture tests: streaming ======================= */

static void test_stream_emoji_split_across_byte_tokens(void **state) {
    struct tokenizer *t = load_fixture("tokenizers/llama2");
    // " this is 🦙.cpp" (HF ids, from the llama2 vectors)
    const int32_t ids[] = {29871, 445, 338, 29871, 243, 162, 169, 156, 29889, 8223};
    const size_t n = sizeof ids / sizeof ids[0];
    char *pieces[10];
    char *all = stream_all(t, ids, n, false, pieces);
    char *full = decode(t, ids, n, false);
    assert_string_equal(full, " this is 🦙.cpp");
    assert_string_equal(all, full);
    // the leading "▁" of the whole sequence is stripped, later ones are spaces
    assert_string_equal(pieces[0], "");
    assert_string_equal(pieces[1], " this");
    // the emoji comes out with its last byte, not later
    for (int i = 4; i < 7; i++) assert_string_equal(pieces[i], "");
    assert_string_equal(pieces[7], "🦙");
    assert_string_equal(pieces[8], ".");
    for (size_t i = 0; i < n; i++) free(pieces[i]);
    free(all);
    free(full);
    tokenizer_free(t);

    // byte-level: "🦙" spans three tokens; no piece may end inside it
    t = load_fixture("tokenizers/llama3");
    const int32_t ids3[] = {420, 374, 11410, 99, 247, 13, 11055};
    char *p3[7];
    all = stream_all(t, ids3, 7, false, p3);
    assert_string_equal(all, " this is 🦙.cpp");
    assert_string_equal(p3[2], " ");
    assert_string_equal(p3[3], "");
    assert_string_equal(p3[4], "🦙");
    for (int i = 0; i < 7; i++) free(p3[i]);
    free(all);
    // an unfinished character at the end is flushed as U+FFFD, as decode does
    const int32_t cut[] = {11410, 99};
    all = stream_all(t, cut, 2, false, NULL);
    full = decode(t, cut, 2, false);
    assert_string_equal(full, " \xEF\xBF\xBD");
    assert_string_equal(all, full);
    free(all);
    free(full);
    tokenizer_free(t);
}

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static bool is_byte_token(const struct tokenizer *t, int32_t id) {
    size_t n;
    const char *p = tokenizer_id_to_piece(t, id, &n);
    return p && n == 6 && !memcmp(p, "<0x", 3) && p[5] == '>';
}

/* A random id that is a token, neither special nor a <0xNN> byte. */
static int32_t plain_token(const struct tokenizer *t, uint64_t *seed) {
    int32_t vocab = (int32_t)tokenizer_vocab_size(t), id = 0;
    for (int tries = 0; tries < 1000; tries++) {
        id = (int32_t)(rng_next(seed) % (uint64_t)vocab);
        if (tokenizer_id_to_piece(t, id, NULL) && !tokenizer_is_special(t, id) && !is_byte_token(t, id)) break;
    }
    return id;
}

/* A run of byte tokens that is wholly valid (whole characters) or wholly invalid (bytes that
 * never start a character, cut characters), followed by a plain token that ends the run: the
 * runs on which ByteFallback's stream and decode agree. Writes at most room ids. */
static size_t byte_run(const struct tokenizer *t, uint64_t *seed, int32_t *out, size_t room) {
    static const uint32_t first[4] = {0x20, 0x80, 0x800, 0x10000}, span[4] = {0x5F, 0x780, 0xD000, 0x10000};
    char buf[32];
    size_t nb = 0;
    bool valid = rng_next(seed) % 2;
    for (int e = 0, n_el = 1 + (int)(rng_next(seed) % 3); e < n_el; e++) {
        uint64_t r = rng_next(seed);
        int w = (int)(r % 4);
        uint32_t cp = first[w] + (uint32_t)((r >> 8) % span[w]); // 3-byte span stops before surrogates
        size_t len = utf8_encode(cp, buf + nb);
        if (valid) nb += len;
        else if (len == 1 || (r >> 40) % 3 == 0) buf[nb++] = (char)(0xC0 + (r >> 32) % 2 * 0x35 + (r >> 34) % 2); // C0 C1 F5 F6
        else nb += 1 + (r >> 32) % (len - 1); // a cut character
    }
    size_t n = 0;
    if (nb < room) // else no run: a cut valid one would be neither
        for (size_t i = 0; i < nb; i++) out[n++] = 3 + (unsigned char)buf[i];
    out[n++] = plain_token(t, seed);
    return n;
}

/* Random id sequences (with byte tokens, partial characters, special and invalid ids):
 * the stream's pieces are valid UTF-8 and add up to decode() (with byte-fallback vocabularies,
 * on byte runs that are wholly valid or wholly invalid: see tokenizer.h); priming with a prefix
 * gives the same later pieces as streaming the prefix, but for a character the prefix leaves
 * unfinished, which is the prompt's. */
static void stream_vs_decode(const char *rel) {
    struct tokenizer *t = load_fixture(rel);
    int32_t vocab = (int32_t)tokenizer_vocab_size(t);
    bool byte_fallback = is_byte_token(t, 3);
    uint64_t seed = 0x9E3779B97F4A7C15ull;
    int sequences = 0, cut_primes = 0;
    for (int round = 0; round < 300; round++) {
        int32_t ids[96];
        size_t n = 1 + rng_next(&seed) % 95;
        for (size_t i = 0; i < n; i++) {
            uint64_t r = rng_next(&seed), k = r % 10;
            if (k < 3 && byte_fallback) i += byte_run(t, &seed, ids + i, n - i) - 1;
            else if (k < 3) ids[i] = (int32_t)(3 + (r >> 8) % 256);     // bytes (of byte-level tokens)
            else if (k < 4) ids[i] = vocab - 1 - (int32_t)((r >> 8) % 300); // added/special tokens
            else if (k < 5) ids[i] = (int32_t)((r >> 8) % 600);         // short pieces, spaces
            else if (k == 5 && (r >> 8) % 8 == 0) ids[i] = vocab + 7;   // not a token
            else ids[i] = (int32_t)((r >> 8) % (uint64_t)vocab);
            if (byte_fallback && k >= 3 && is_byte_token(t, ids[i])) ids[i] = plain_token(t, &seed);
        }
        for (int skip = 0; skip < 2; skip++) {
            struct piece pieces[96];
            size_t all_len, full_len;
            char *all = stream_all_len(t, ids, n, skip, pieces, &all_len);
            char *full = NULL;
            assert_int_equal(tokenizer_decode(t, ids, n, skip, &full, &full_len), 0);
            if (all_len != full_len || memcmp(all, full, all_len)) {
                print_ids("ids", ids, n);
                fail_msg("%s: stream \"%s\" != decode \"%s\"", rel, all, full);
            }
            // prime with the first k ids, then the later pieces must be the same
            size_t k = n / 2;
            struct tokenizer_stream st;
            tokenizer_stream_init(&st, t, skip);
            assert_int_equal(tokenizer_stream_prime(&st, ids, k), 0);
            bool cut = st.n_pend > 0; // the prompt ends inside a character
            cut_primes += cut;
            size_t lag = 0; // cut: bytes of the unprimed pieces not (yet) in the primed ones
            for (size_t i = k; i < n; i++) {
                const char *p;
                size_t pl;
                assert_int_equal(tokenizer_stream_push(&st, ids[i], &p, &pl), 0);
                if (!cut) {
                    assert_int_equal(pl, pieces[i].n);
                    assert_memory_equal(p, pieces[i].s, pl);
                    continue;
                }
                // the prompt's character (or the U+FFFDs of its bytes) is missing, nothing else
                lag += pieces[i].n;
                assert_true(pl <= lag);
                assert_memory_equal(p, pieces[i].s + pieces[i].n - pl, pl);
                lag -= pl;
                assert_true(lag <= 9);
            }
            tokenizer_stream_free(&st);
            for (size_t i = 0; i < n; i++) free(pieces[i].s);
            free(all);
            free(full);
            sequences++;
        }
    }
    print_message("%s: %d random sequences stream exactly as decode (%d primes cut a character)\n", rel, sequences,
                  cut_primes);
    tokenizer_free(t);
}

static void test_stream_equals_decode_random_llama2(void **state) {
    stream_vs_decode("tokenizers/llama2");
}

static void test_stream_equals_decode_random_llama3(void **state) {
    stream_vs_decode("tokenizers/llama3");
}

static void test_stream_equals_decode_random_qwen3(void **state) {
    stream_vs_decode("tokenizers/qwen3");
}

/* After a primed prompt, the first generated token keeps its leading space (it is not the
 * first token of the sequence); without priming the Strip decoder removes it. */
static void test_stream_prime_keeps_space_of_first_generated_token(void **state) {
    struct tokenizer *t = load_fixture("tokenizers/llama2");
    int32_t *prompt, *gen;
    size_t np, ng;
    encode(t, "The capital of France is", true, &prompt, &np);
    encode(t, "Paris", false, &gen, &ng); // "▁Paris"
    struct tokenizer_stream st;
    tokenizer_stream_init(&st, t, true);
    assert_int_equal(tokenizer_stream_prime(&st, prompt, np), 0);
    const char *p;
    assert_int_equal(tokenizer_stream_push(&st, gen[0], &p, NULL), 0);
    assert_string_equal(p, " Paris");
    assert_int_equal(tokenizer_stream_flush(&st, &p, NULL), 0);
    assert_string_equal(p, "");
    // flush reset it: a new sequence strips again
    assert_int_equal(tokenizer_stream_push(&st, gen[0], &p, NULL), 0);
    assert_string_equal(p, "Paris");
    tokenizer_stream_free(&st);
    free(prompt);
    free(gen);
    tokenizer_free(t);
}

/* Primes st with prompt, pushes gen and flushes; returns the concatenated pieces (malloc'd). */
static char *primed_text(const struct tokenizer *t, const int32_t *prompt, size_t np, const int32_t *gen, size_t ng) {
    struct tokenizer_stream st;
    tokenizer_stream_init(&st, t, true);
    assert_int_equal(tokenizer_stream_prime(&st, prompt, np), 0);
    char *all = calloc(1, 1);
    size_t len = 0;
    for (size_t i = 0; i <= ng; i++) {
        const char *p;
        size_t pl;
        assert_int_equal(i < ng ? tokenizer_stream_push(&st, gen[i], &p, &pl) : tokenizer_stream_flush(&st, &p, &pl), 0);
        all = realloc(all, len + pl + 1);
        memcpy(all + len, p, pl + 1);
        len += pl;
    }
    tokenizer_stream_free(&st);
    return all;
}

/* The prompt's text never comes out of a primed stream: not a byte run it ends with (Llama-2
 * spells CJK in <0xNN> tokens), not a character it leaves unfinished, whether the generated
 * bytes finish or break it; the generated bytes after it decode as usual. */
static void test_stream_prime_keeps_prompt_text_out(void **state) {
    struct tokenizer *t = load_fixture("tokenizers/llama2");
    int32_t *prompt;
    size_t np;
    encode(t, "Lily saw a 🦙", true, &prompt, &np);
    assert_true(np > 6 && prompt[np - 1] == 3 + 0x99); // 🦙 = F0 9F A6 99, in byte tokens
    const int32_t gen[] = {29889, 2296};                // ". She"
    char *out = primed_text(t, prompt, np, gen, 2);
    assert_string_equal(out, ". She");
    free(out);
    // a prompt that stops inside 日 (E6 97 A5): the byte that finishes it gives no text
    const int32_t cut[] = {1, 365, 3 + 0xE6, 3 + 0x97};
    const int32_t fin[] = {3 + 0xA5, 278, 3 + 0xE6, 3 + 0x9C, 3 + 0xAC}; // A5 "▁the" 本
    out = primed_text(t, cut, 4, fin, 5);
    assert_string_equal(out, " the本");
    free(out);
    // ... nor the bytes of a character a generated byte breaks (their U+FFFDs are the prompt's)
    const int32_t brk[] = {3 + 'A', 3 + 0xE6, 3 + 0x97};
    out = primed_text(t, cut, 3, brk, 3); // E6 | A, and the generated E6 97 cut by the end
    assert_string_equal(out, "A\xEF\xBF\xBD\xEF\xBF\xBD");
    free(out);
    // ... nor when the sequence ends there
    out = primed_text(t, cut, 4, NULL, 0);
    assert_string_equal(out, "");
    free(out);
    free(prompt);
    tokenizer_free(t);

    // byte-level: " 🦙" spans three tokens; a prompt of the first two
    t = load_fixture("tokenizers/llama3");
    const int32_t p3[] = {420, 374, 11410, 99}, g3[] = {247, 13, 11055};
    out = primed_text(t, p3, 4, g3, 3);
    assert_string_equal(out, ".cpp");
    free(out);
    out = primed_text(t, p3, 2, p3 + 2, 2); // the same bytes generated: " " then U+FFFD at the end
    assert_string_equal(out, " \xEF\xBF\xBD");
    free(out);
    tokenizer_free(t);
}

/* A push that shows held bytes will not make a character says how much of its piece are their
 * U+FFFDs (the text of earlier ids); a character it finishes is its own. */
static void test_stream_carried_counts_earlier_bytes(void **state) {
    struct tokenizer *t = load_fixture("tokenizers/llama2");
    struct tokenizer_stream st;
    tokenizer_stream_init(&st, t, true);
    const char *p;
    size_t pl;
    const int32_t ids[] = {278, 3 + 0xE6, 3 + 0x97, 278, 3 + 0xE6, 3 + 0x97, 3 + 0xA5, 3 + 0xC3, 3 + 'x'};
    const char *want[] = {"the", "", "", "\xEF\xBF\xBD\xEF\xBF\xBD the", "", "", "日", "", "\xEF\xBF\xBDx"};
    const size_t carried[] = {0, 0, 0, 6, 0, 0, 0, 0, 3};
    for (int i = 0; i < 9; i++) {
        assert_int_equal(tokenizer_stream_push(&st, ids[i], &p, &pl), 0);
        assert_string_equal(p, want[i]);
        assert_int_equal(tokenizer_stream_carried(&st), carried[i]);
    }
    tokenizer_stream_free(&st);
    tokenizer_free(t);

    t = load_fixture("tokenizers/llama3"); // 11410 = " " and the first bytes of 🦙
    tokenizer_stream_init(&st, t, true);
    assert_int_equal(tokenizer_stream_push(&st, 11410, &p, &pl), 0);
    assert_string_equal(p, " ");
    assert_int_equal(tokenizer_stream_push(&st, 420, &p, &pl), 0);
    assert_string_equal(p, "\xEF\xBF\xBD this");
    assert_int_equal(tokenizer_stream_carried(&st), 3);
    assert_int_equal(tokenizer_stream_push(&st, 11410, &p, &pl), 0);
    assert_int_equal(tokenizer_stream_push(&st, 99, &p, &pl), 0);
    assert_int_equal(tokenizer_stream_push(&st, 247, &p, &pl), 0);
    assert_string_equal(p, "🦙");
    assert_int_equal(tokenizer_stream_carried(&st), 0);
    tokenizer_stream_free(&st);
    tokenizer_free(t);
}

/* tokenizer_token_bytes: what a token adds to the text, as logprobs show it. */
static void test_token_bytes_keep_leading_space_and_raw_bytes(void **state) {
    struct tokenizer *t = load_fixture("tokenizers/llama2");
    char buf[64];
    int32_t id;
    assert_int_equal(tokenizer_piece_to_id(t, "\xE2\x96\x81Paris", 8, &id), 0);
    assert_int_equal(tokenizer_token_bytes(t, id, false, buf, sizeof buf), 6);
    assert_memory_equal(buf, " Paris", 6);
    assert_int_equal(tokenizer_token_bytes(t, 3 + 0xE6, false, buf, sizeof buf), 1);
    assert_int_equal((unsigned char)buf[0], 0xE6);
    assert_int_equal(tokenizer_token_bytes(t, 3 + '\n', false, buf, sizeof buf), 1);
    assert_int_equal(buf[0], '\n');
    assert_int_equal(tokenizer_token_bytes(t, 2, false, buf, sizeof buf), 4);
    assert_memory_equal(buf, "</s>", 4);
    assert_int_equal(tokenizer_token_bytes(t, (int32_t)tokenizer_vocab_size(t) + 5, false, buf, sizeof buf), 0);
    // the length is the whole token's even when buf is shorter
    assert_int_equal(tokenizer_token_bytes(t, id, false, buf, 3), 6);
    assert_memory_equal(buf, " Pa", 3);
    // beginning the text (after a BOS-only prompt), the Strip decoder drops its space
    assert_int_equal(tokenizer_token_bytes(t, id, true, buf, sizeof buf), 5);
    assert_memory_equal(buf, "Paris", 5);
    struct tokenizer_stream st;
    tokenizer_stream_init(&st, t, true);
    assert_true(tokenizer_stream_at_start(&st));
    assert_int_equal(tokenizer_stream_prime(&st, (const int32_t[]){1}, 1), 0);
    assert_true(tokenizer_stream_at_start(&st)); // a skipped BOS is no text
    const char *p;
    assert_int_equal(tokenizer_stream_push(&st, id, &p, NULL), 0);
    assert_string_equal(p, "Paris");
    assert_false(tokenizer_stream_at_start(&st));
    tokenizer_stream_free(&st);
    tokenizer_free(t);

    t = load_fixture("tokenizers/llama3");
    assert_int_equal(tokenizer_token_bytes(t, 420, false, buf, sizeof buf), 5);
    assert_memory_equal(buf, " this", 5);
    // 11410 99 247 spell " 🦙" (F0 9F A6 99): the first holds the space and a part of it
    size_t n1 = tokenizer_token_bytes(t, 11410, false, buf, sizeof buf);
    size_t n2 = tokenizer_token_bytes(t, 99, false, buf + n1, sizeof buf - n1);
    size_t n3 = tokenizer_token_bytes(t, 247, false, buf + n1 + n2, sizeof buf - n1 - n2);
    assert_int_equal(n1 + n2 + n3, 5);
    assert_memory_equal(buf, " \xF0\x9F\xA6\x99", 5);
    assert_true(n1 >= 2 && !utf8_valid(buf, n1));
    tokenizer_free(t);
}

/* ======================= fixture tests: stories260k, mistral ======================= */

/* The model's own greedy tokens (HF transformers) begin with ▁Once ▁upon ▁a ▁time; BPE of the
 * same words gives those whole-word tokens. */
static void test_stories260k_encodes_once_upon_a_time(void **state) {
    struct tokenizer *t = load_fixture("models/stories260k");
    EXPECT_ENCODE(t, "Once upon a time", true, 1, 403, 407, 261, 378);
    assert_int_equal(tokenizer_vocab_size(t), 512);
    assert_int_equal(tokenizer_bos_id(t), 1);
    assert_int_equal(tokenizer_eos_id(t), 2);
    tokenizer_free(t);
}

/* The greedy ids decode (and stream) to a prefix of llama2.c's expected text. */
static void test_stories260k_greedy_ids_decode_to_llama2c_text(void **state) {
    require_fixture("models/stories260k/expected_greedy_ids.json");
    require_fixture("models/stories260k/expected_greedy.txt");
    struct tokenizer *t = load_fixture("models/stories260k");
    size_t len;
    char *js = read_fixture("models/stories260k/expected_greedy_ids.json", &len);
    char *txt = read_fixture("models/stories260k/expected_greedy.txt", NULL);
    cJSON *root = cJSON_ParseWithLength(js, len);
    const cJSON *g = cJSON_GetObjectItem(root, "greedy_ids");
    size_t n = (size_t)cJSON_GetArraySize(g), i = 0;
    int32_t *ids = malloc(n * sizeof *ids);
    for (const cJSON *x = g->child; x; x = x->next) ids[i++] = (int32_t)x->valuedouble;
    char *d = decode(t, ids, n, true);
    assert_true(strlen(d) > 300); // 199 tokens
    if (strncmp(txt, d, strlen(d))) fail_msg("decoded text is not a prefix of expected_greedy.txt:\n%s", d);
    char *s = stream_all(t, ids, n, true, NULL);
    assert_string_equal(s, d);
    free(s);
    free(d);
    free(ids);
    cJSON_Delete(root);
    free(js);
    free(txt);
    tokenizer_free(t);
}

static void test_mistral_loads_and_round_trips(void **state) {
    struct tokenizer *t = load_fixture("tokenizers/mistral-v0.1");
    const char *text = "Hello world! Ünïcödé, 你好 🦙\n\tdone.";
    int32_t *ids;
    size_t n;
    encode(t, text, true, &ids, &n);
    assert_int_equal(ids[0], 1);
    char *s = decode(t, ids, n, true);
    assert_string_equal(s, text);
    free(s);
    free(ids);
    tokenizer_free(t);
}

/* ======================= unit tests without fixtures ======================= */

/* Expected strings from Python's bytes.decode('utf-8', 'replace'). */
static void test_utf8_lossy_replaces_maximal_subparts(void **state) {
    static const struct {
        const char *in;
        const char *out;
    } cases[] = {
        {"a\xf1\x80\x80\xe1\x80\xc2" "b\x80" "c\x80\xbf" "d", "a\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD" "b\xEF\xBF\xBD" "c\xEF\xBF\xBD\xEF\xBF\xBD" "d"},
        {"\xed\xa0\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},  // surrogate
        {"\xc0\xaf", "\xEF\xBF\xBD\xEF\xBF\xBD"},                  // overlong
        {"\xf4\x90\x80\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"}, // > U+10FFFF
        {"ab\xe2\x82", "ab\xEF\xBF\xBD"},                          // cut at the end
        {"\xe2(\xa1", "\xEF\xBF\xBD(\xEF\xBF\xBD"},
        {"\xf0\x9f\x98", "\xEF\xBF\xBD"},
        {"ok \xf0\x9f\xa6\x99", "ok \xf0\x9f\xa6\x99"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n = strlen(cases[i].in);
        char out[64];
        size_t k = utf8_lossy(cases[i].in, n, out);
        out[k] = 0;
        assert_string_equal(out, cases[i].out);
        assert_int_equal(utf8_valid(cases[i].in, n), !strcmp(cases[i].in, cases[i].out));
    }
}

/* Fed in random pieces, the streaming decoder gives the one-shot result. */
static void test_utf8_lossy_stream_equals_one_shot(void **state) {
    uint64_t seed = 12345;
    static const unsigned char alphabet[] = {'a', 0x80, 0x9F, 0xA0, 0xBF, 0xC2, 0xC3, 0xE0, 0xE1,
                                             0xED, 0xEF, 0xF0, 0xF1, 0xF4, 0xF5, 0xFF, 0x8F, 0x90};
    for (int round = 0; round < 2000; round++) {
        char in[40], one[200], two[400];
        size_t n = rng_next(&seed) % 40;
        for (size_t i = 0; i < n; i++) in[i] = (char)alphabet[rng_next(&seed) % sizeof alphabet];
        size_t k1 = utf8_lossy(in, n, one);
        struct utf8_lossy_stream st = {{0}, 0};
        size_t k2 = 0;
        for (size_t i = 0; i < n;) {
            size_t step = 1 + rng_next(&seed) % 4;
            if (step > n - i) step = n - i;
            k2 += utf8_lossy_feed(&st, in + i, step, two + k2);
            i += step;
        }
        k2 += utf8_lossy_finish(&st, two + k2);
        assert_int_equal(k1, k2);
        assert_memory_equal(one, two, k1);
        assert_true(utf8_valid(one, k1));
    }
}

/* A byte-fallback vocabulary with no merges, like the daemon's built-in demo model. */
static struct tokenizer *byte_model_with(const char *post, const char *config, char **dir) {
    cJSON *root = synth_new();
    cJSON *m = cJSON_GetObjectItem(root, "model");
    synth_set(m, "unk_token", "\"<unk>\"");
    synth_set(m, "byte_fallback", "true");
    synth_set(m, "fuse_unk", "true");
    const char *sp[3] = {"<unk>", "<s>", "</s>"};
    for (int i = 0; i < 3; i++) {
        synth_vocab(root, sp[i], i);
        synth_added(root, i, sp[i], true, false, false, false, false);
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        synth_vocab(root, name, 3 + b);
    }
    synth_set(root, "decoder", "{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"}]}");
    synth_set(root, "post_processor", post);
    return synth_load(root, config, dir);
}

#define BOS_TEMPLATE                                                                                          \
    "{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},"            \
    "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[1],"      \
    "\"tokens\":[\"<s>\"]}}}"

static struct tokenizer *byte_model(char **dir) {
    return byte_model_with(BOS_TEMPLATE, "{\"bos_token\":\"<s>\",\"eos_token\":{\"content\":\"</s>\"}}", dir);
}

/* What add_special adds: the post-processor (also inside a Sequence, as current Llama-3 files
 * have it), unless tokenizer_config.json says add_bos_token / add_eos_token. */
static void test_post_processor_and_add_bos_eos_flags(void **state) {
    char *dir;
    struct tokenizer *t = byte_model_with("{\"type\":\"Sequence\",\"processors\":[{\"type\":\"ByteLevel\","
                                          "\"add_prefix_space\":true,\"trim_offsets\":false,\"use_regex\":true}," BOS_TEMPLATE "]}",
                                          NULL, &dir);
    EXPECT_ENCODE(t, "a", true, 1, 3 + 'a');
    EXPECT_ENCODE(t, "a", false, 3 + 'a');
    synth_done(t, dir);
    t = byte_model_with(BOS_TEMPLATE, "{\"bos_token\":\"<s>\",\"eos_token\":\"</s>\",\"add_bos_token\":true,"
                                      "\"add_eos_token\":true}", &dir);
    EXPECT_ENCODE(t, "a", true, 1, 3 + 'a', 2);
    synth_done(t, dir);
    t = byte_model_with(BOS_TEMPLATE, "{\"bos_token\":\"<s>\",\"add_bos_token\":false}", &dir);
    EXPECT_ENCODE(t, "a", true, 3 + 'a');
    assert_int_equal(tokenizer_eos_id(t), -1);
    synth_done(t, dir);
    // no tokenizer_config.json: bos/eos ids from config.json and generation_config.json
    t = byte_model_with("null", NULL, &dir);
    tokenizer_free(t);
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    test_write_text(path, "{\"bos_token_id\": 1, \"eos_token_id\": [2, 0]}");
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    test_write_text(path, "{\"eos_token_id\": 2}");
    t = load_dir(dir);
    assert_int_equal(tokenizer_bos_id(t), 1);
    const int32_t *eos;
    assert_int_equal(tokenizer_eos_ids(t, &eos), 2);
    assert_int_equal(eos[0], 2);
    assert_int_equal(eos[1], 0);
    EXPECT_ENCODE(t, "a", true, 3 + 'a');
    synth_done(t, dir);
}

static void test_byte_fallback_model_encodes_bytes_and_decodes_runs(void **state) {
    char *dir;
    struct tokenizer *t = byte_model(&dir);
    assert_int_equal(tokenizer_bos_id(t), 1);
    assert_int_equal(tokenizer_eos_id(t), 2);
    EXPECT_ENCODE(t, "hé", true, 1, 3 + 'h', 3 + 0xC3, 3 + 0xA9);
    EXPECT_ENCODE(t, "a</s>b", false, 3 + 'a', 2, 3 + 'b');
    EXPECT_DECODE(t, false, "<s>hé", 1, 3 + 'h', 3 + 0xC3, 3 + 0xA9);
    EXPECT_DECODE(t, true, "hé", 1, 3 + 'h', 3 + 0xC3, 3 + 0xA9);
    EXPECT_DECODE(t, false, "\xEF\xBF\xBD\xEF\xBF\xBD", 3 + 0xC3, 3 + '(');
    EXPECT_DECODE(t, false, "🦙", 3 + 0xF0, 3 + 0x9F, 3 + 0xA6, 3 + 0x99);
    // decode, as HF, turns a run with an invalid byte into U+FFFDs, all of it; the stream gives
    // each character as soon as it is whole, and the invalid byte alone becomes a U+FFFD
    const int32_t ids[] = {3 + 'x', 3 + 0xC3, 3 + 0xA9, 3 + 0xFF, 1, 3 + 'y'};
    char *pieces[6];
    char *all = stream_all(t, ids, 6, false, pieces);
    char *full = decode(t, ids, 6, false);
    assert_string_equal(full, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD<s>y");
    assert_string_equal(all, "x\xC3\xA9\xEF\xBF\xBD<s>y");
    const char *const want[] = {"x", "", "\xC3\xA9", "\xEF\xBF\xBD", "<s>", "y"};
    for (int i = 0; i < 6; i++) assert_string_equal(pieces[i], want[i]);
    for (int i = 0; i < 6; i++) free(pieces[i]);
    free(all);
    free(full);
    // a cut character: its bytes are U+FFFDs once a byte breaks it or the run ends, as decode
    const int32_t cut[] = {3 + 0xE6, 3 + 0x97, 3 + 'a', 3 + 0xE6, 3 + 0x97, 1};
    all = stream_all(t, cut, 6, false, NULL);
    assert_string_equal(all, "\xEF\xBF\xBD\xEF\xBF\xBD" "a" "\xEF\xBF\xBD\xEF\xBF\xBD" "<s>");
    free(all);
    synth_done(t, dir);
}

/* BPE by hand: merges apply lowest rank first, not left to right; ignore_merges takes a
 * whole-word vocabulary hit; unknown characters become (fused) unk. Without a decoder HF joins
 * tokens with spaces. */
static struct tokenizer *abc_model(bool ignore_merges, bool fuse_unk, char **dir) {
    cJSON *root = synth_new();
    cJSON *m = cJSON_GetObjectItem(root, "model");
    synth_set(m, "unk_token", "\"<unk>\"");
    synth_set(m, "ignore_merges", ignore_merges ? "true" : "false");
    synth_set(m, "fuse_unk", fuse_unk ? "true" : "false");
    const char *v[] = {"<unk>", "a", "b", "c", "ab", "bc", "abc"};
    for (int i = 0; i < 7; i++) synth_vocab(root, v[i], i);
    synth_merge(root, "b c");
    cJSON_AddItemToArray(cJSON_GetObjectItem(m, "merges"), cJSON_Parse("[\"a\", \"b\"]")); // array form
    return synth_load(root, NULL, dir);
}

static void test_bpe_merge_order_ignore_merges_and_unk(void **state) {
    char *dir;
    struct tokenizer *t = abc_model(false, true, &dir);
    EXPECT_ENCODE(t, "abc", false, 1, 5);     // "b c" (rank 0) before "a b" (rank 1)
    EXPECT_ENCODE(t, "abcab", false, 1, 5, 4);
    EXPECT_ENCODE(t, "ab", false, 4);
    EXPECT_ENCODE(t, "xxa", false, 0, 1);     // fused unk
    EXPECT_ENCODE(t, "axyb", false, 1, 0, 2);
    EXPECT_DECODE(t, false, "a bc ab", 1, 5, 4);
    char *s = stream_all(t, (const int32_t[]){1, 5, 4}, 3, false, NULL);
    assert_string_equal(s, "a bc ab");
    free(s);
    synth_done(t, dir);

    t = abc_model(false, false, &dir);
    EXPECT_ENCODE(t, "xxa", false, 0, 0, 1);
    synth_done(t, dir);

    t = abc_model(true, true, &dir);
    EXPECT_ENCODE(t, "abc", false, 6);        // "abc" is in the vocabulary
    EXPECT_ENCODE(t, "abcab", false, 1, 5, 4);
    synth_done(t, dir);
}

static struct tokenizer *pretok_model(const char *pretok_json, char **dir) {
    cJSON *root = synth_new();
    synth_vocab(root, "a", 0);
    synth_set(root, "pre_tokenizer", pretok_json);
    return synth_load(root, NULL, dir);
}

/* HF split.rs `basic`: regex \w+|[^\w\s]+, inverted, each behavior. */
static void test_split_behaviors_match_hf(void **state) {
    static const char *fmt = "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\w+|[^\\\\w\\\\s]+\"},"
                             "\"behavior\":\"%s\",\"invert\":true}";
    char js[256];
    char *dir;
    struct tokenizer *t;
    const char *text = "How are you doing?";
    snprintf(js, sizeof js, fmt, "Removed");
    t = pretok_model(js, &dir);
    EXPECT_PIECES(t, text, "How", "are", "you", "doing", "?");
    synth_done(t, dir);
    snprintf(js, sizeof js, fmt, "Isolated");
    t = pretok_model(js, &dir);
    EXPECT_PIECES(t, text, "How", " ", "are", " ", "you", " ", "doing", "?");
    synth_done(t, dir);
    snprintf(js, sizeof js, fmt, "MergedWithPrevious");
    t = pretok_model(js, &dir);
    EXPECT_PIECES(t, text, "How ", "are ", "you ", "doing", "?");
    synth_done(t, dir);
    snprintf(js, sizeof js, fmt, "MergedWithNext");
    t = pretok_model(js, &dir);
    EXPECT_PIECES(t, text, "How", " are", " you", " doing", "?");
    synth_done(t, dir);
    snprintf(js, sizeof js, fmt, "Contiguous");
    t = pretok_model(js, &dir);
    EXPECT_PIECES(t, text, "How", " ", "are", " ", "you", " ", "doing?");
    synth_done(t, dir);

    // HF SplitDelimiterBehavior docs: splitting "the-final--countdown" on the string "-"
    static const char *fmt2 = "{\"type\":\"Split\",\"pattern\":{\"String\":\"-\"},\"behavior\":\"%s\",\"invert\":false}";
    text = "the-final--countdown";
    snprintf(js, sizeof js, fmt2, "Removed");
    t = pretok_model(js, &dir);
    EXPECT_PIECES(t, text, "the", "final", "countdown");
    synth_done(t, dir);
    snprintf(js, sizeof js, fmt2, "Isolated");
    t = pretok_model(js, &dir);
    EXPECT_PIECES(t, text, "the", "-", "final", "-", "-", "countdown");
    synth_done(t, dir);
    snprintf(js, sizeof js, fmt2, "MergedWithPrevious");
    t = pretok_model(js, &dir);
    EXPECT_PIECES(t, text, "the-", "final-", "-", "countdown");
    synth_done(t, dir);
    snprintf(js, sizeof js, fmt2, "MergedWithNext");
    t = pretok_model(js, &dir);
    EXPECT_PIECES(t, text, "the", "-final", "-", "-countdown");
    synth_done(t, dir);
    snprintf(js, sizeof js, fmt2, "Contiguous");
    t = pretok_model(js, &dir);
    EXPECT_PIECES(t, text, "the", "-", "final", "--", "countdown");
    synth_done(t, dir);

    // HF split.rs `invert`: inverted Removed on "Hello" equals Removed on " "
    t = pretok_model("{\"type\":\"Split\",\"pattern\":{\"String\":\"Hello\"},\"behavior\":\"Removed\",\"invert\":true}", &dir);
    EXPECT_PIECES(t, "Hello Hello Hello", "Hello", "Hello", "Hello");
    synth_done(t, dir);
}

/* HF byte_level.rs tests: the GPT-2 regex (use_regex) and add_prefix_space. */
static void test_bytelevel_gpt2_regex_matches_hf(void **state) {
    char *dir;
    struct tokenizer *t = pretok_model("{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true}", &dir);
    EXPECT_PIECES(t, "Hello my friend, how is your day going?", "Hello", "Ġmy", "Ġfriend", ",", "Ġhow", "Ġis", "Ġyour",
                  "Ġday", "Ġgoing", "?");
    EXPECT_PIECES(t, "Hello there\nHello there", "Hello", "Ġthere", "Ċ", "Hello", "Ġthere");
    EXPECT_PIECES(t, "Hello there       dear", "Hello", "Ġthere", "ĠĠĠĠĠĠ", "Ġdear");
    EXPECT_PIECES(t, "i⭢j", "i", "âŃ¢", "j");
    // case-sensitive contractions (Python regex on the GPT-2 pattern)
    EXPECT_PIECES(t, "I'm 12345 DON'T", "I", "'m", "Ġ12345", "ĠDON", "'", "T");
    synth_done(t, dir);
    t = pretok_model("{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"use_regex\":true}", &dir);
    EXPECT_PIECES(t, "Hello my friend, how", "ĠHello", "Ġmy", "Ġfriend", ",", "Ġhow");
    EXPECT_PIECES(t, " Hello my friend, how", "ĠHello", "Ġmy", "Ġfriend", ",", "Ġhow");
    synth_done(t, dir);
    t = pretok_model("{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"use_regex\":false}", &dir);
    EXPECT_PIECES(t, "Hello my friend, how is your day going?", "ĠHelloĠmyĠfriend,ĠhowĠisĠyourĠdayĠgoing?");
    synth_done(t, dir);
}

/* HF metaspace.rs tests: pre-tokenizer splits and the decoder. */
static void test_metaspace_matches_hf(void **state) {
    cJSON *root = synth_new();
    const char *v[] = {"▁Hey", "▁friend!", "▁", "H", "e", "y"};
    for (int i = 0; i < 6; i++) synth_vocab(root, v[i], i);
    synth_set(root, "pre_tokenizer", "{\"type\":\"Metaspace\",\"replacement\":\"▁\",\"prepend_scheme\":\"always\",\"split\":true}");
    synth_set(root, "decoder", "{\"type\":\"Metaspace\",\"replacement\":\"▁\",\"prepend_scheme\":\"always\",\"split\":true}");
    char *dir;
    struct tokenizer *t = synth_load(root, NULL, &dir);
    EXPECT_PIECES(t, "Hey friend!", "▁Hey", "▁friend!");
    EXPECT_PIECES(t, "Hey   friend!", "▁Hey", "▁", "▁", "▁friend!");
    EXPECT_DECODE(t, false, "Hey friend!", 0, 1);
    EXPECT_DECODE(t, false, "Hey  friend!", 0, 2, 1);
    char *s = stream_all(t, (const int32_t[]){0, 2, 1}, 3, false, NULL);
    assert_string_equal(s, "Hey  friend!");
    free(s);
    // as logprobs show them: the first token of the text loses its space, later ones keep it
    char buf[16];
    assert_int_equal(tokenizer_token_bytes(t, 0, true, buf, sizeof buf), 3);
    assert_memory_equal(buf, "Hey", 3);
    assert_int_equal(tokenizer_token_bytes(t, 0, false, buf, sizeof buf), 4);
    assert_memory_equal(buf, " Hey", 4);
    synth_done(t, dir);
}

/* Fuse then Strip(' ', start 2, stop 2) on the whole text (HF strip.rs semantics: up to
 * `start` leading and `stop` trailing content chars go). The stream holds trailing spaces back
 * until it knows they are not the last ones. */
static void test_strip_decoder_start_and_stop(void **state) {
    cJSON *root = synth_new();
    synth_vocab(root, " ", 0);
    synth_vocab(root, "a", 1);
    synth_vocab(root, "b c", 2);
    synth_set(root, "decoder", "{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Fuse\"},"
                               "{\"type\":\"Strip\",\"content\":\" \",\"start\":2,\"stop\":2}]}");
    char *dir;
    struct tokenizer *t = synth_load(root, NULL, &dir);
    EXPECT_DECODE(t, false, " a ", 0, 0, 0, 1, 0, 0, 0);
    EXPECT_DECODE(t, false, "a", 0, 1, 0);
    EXPECT_DECODE(t, false, "a  b c", 1, 0, 0, 2);
    uint64_t seed = 99;
    for (int round = 0; round < 500; round++) {
        int32_t ids[12];
        size_t n = 4 + rng_next(&seed) % 8;
        for (size_t i = 0; i < n; i++) ids[i] = (int32_t)(rng_next(&seed) % 4 == 0 ? 1 + rng_next(&seed) % 2 : 0);
        char *all = stream_all(t, ids, n, false, NULL), *full = decode(t, ids, n, false);
        assert_string_equal(all, full);
        free(all);
        free(full);
    }
    synth_done(t, dir);
}

/* HF added_vocabulary.rs `options_use_cases` and `test_lstrip_unicode_space`: lstrip/rstrip
 * take the spaces around, single_word skips matches inside words, "normalized" tokens match
 * the normalized (here lowercased) text. Vocabulary: printable ASCII, id = c - 32. */
static int32_t *chars_ids(const char *s, int32_t *out) {
    for (; *s; s++) *out++ = (int32_t)(unsigned char)*s - 32;
    return out;
}

static void test_added_token_flags_match_hf(void **state) {
    cJSON *root = synth_new();
    synth_ascii_vocab(root);
    synth_set(root, "normalizer", "{\"type\":\"Lowercase\"}");
    synth_added(root, 100, "my", false, true, true, true, false);
    synth_added(root, 101, "name", false, true, false, false, false);
    synth_added(root, 102, "ony", false, true, false, false, true);
    synth_added(root, 103, "[CLS]", true, false, false, false, false);
    synth_added(root, 104, "[SEP]", true, false, false, false, false);
    char *dir;
    struct tokenizer *t = synth_load(root, NULL, &dir);
    int32_t exp[64], *e = exp;
    *e++ = 103;
    *e++ = 100; // " my " (both spaces)
    *e++ = 101;
    e = chars_ids(" is anthony ", e); // "ony" is not a single word here
    *e++ = 104;
    expect_encode(t, "[CLS] My name is Anthony [SEP]", false, exp, (size_t)(e - exp));
    synth_done(t, dir);

    root = synth_new();
    synth_ascii_vocab(root);
    synth_set(root, "normalizer", "{\"type\":\"Lowercase\"}");
    synth_added(root, 100, "<mask>", false, true, true, true, true);
    t = synth_load(root, NULL, &dir);
    e = exp;
    e = chars_ids("hi", e);
    *e++ = 100; // " <mask> "
    e = chars_ids("there", e);
    *e++ = 100; // "\t<mask>\t"
    *e++ = 100; // "<mask>\u2000"
    expect_encode(t, "Hi <mask> there\t<mask>\t<mask>\u2000", false, exp, (size_t)(e - exp));
    synth_done(t, dir);

    root = synth_new();
    synth_ascii_vocab(root);
    synth_set(root, "normalizer", "{\"type\":\"Lowercase\"}");
    synth_added(root, 100, "<mask>", false, true, false, false, true);
    t = synth_load(root, NULL, &dir);
    e = exp;
    *e++ = 100;
    e = chars_ids(" my name ", e);
    *e++ = 100;
    e = chars_ids(" a<mask> <mask>ony ", e);
    *e++ = 100;
    expect_encode(t, "<mask> My name <mask> A<mask> <mask>ony <mask>", false, exp, (size_t)(e - exp));
    synth_done(t, dir);
}

static void test_load_errors_name_the_file_and_problem(void **state) {
    char err[512], path[1024];
    struct tokenizer *t = (struct tokenizer *)0x1;
    char *dir = test_mkdtemp();

    int rc = tokenizer_load(&t, dir, err, sizeof err);
    assert_int_equal(rc, TOKENIZER_ERR_IO);
    assert_null(t);
    assert_non_null(strstr(err, "tokenizer.json"));
    print_message("missing: %s\n", err);

    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    test_write_text(path, "{\"model\": {\"type\": \"BPE\", ");
    assert_int_equal(tokenizer_load(&t, dir, err, sizeof err), TOKENIZER_ERR_JSON);
    assert_non_null(strstr(err, "tokenizer.json"));
    print_message("bad JSON: %s\n", err);

    test_write_text(path, "{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}");
    assert_int_equal(tokenizer_load(&t, dir, err, sizeof err), TOKENIZER_ERR_UNSUPPORTED);
    assert_non_null(strstr(err, "Unigram"));
    print_message("unsupported: %s\n", err);

    test_write_text(path, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []},"
                          " \"pre_tokenizer\": {\"type\": \"Whitespace\"}}");
    assert_int_equal(tokenizer_load(&t, dir, err, sizeof err), TOKENIZER_ERR_UNSUPPORTED);
    assert_non_null(strstr(err, "Whitespace"));

    test_write_text(path, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a b\"]}}");
    assert_int_equal(tokenizer_load(&t, dir, err, sizeof err), TOKENIZER_ERR_FORMAT);
    print_message("bad merge: %s\n", err);

    test_write_text(path, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []},"
                          " \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"},"
                          " \"behavior\": \"Isolated\", \"invert\": false}}");
    assert_int_equal(tokenizer_load(&t, dir, err, sizeof err), TOKENIZER_ERR_REGEX);

    // a Strip on each token (before Fuse) does not fit the streaming detokenizer
    test_write_text(path, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []},"
                          " \"decoder\": {\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}}");
    assert_int_equal(tokenizer_load(&t, dir, err, sizeof err), TOKENIZER_ERR_UNSUPPORTED);
    print_message("per-token Strip: %s\n", err);

    // a valid tokenizer.json with a broken optional file
    test_write_text(path, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}");
    snprintf(path, sizeof path, "%s/config.json", dir);
    test_write_text(path, "{oops");
    assert_int_equal(tokenizer_load(&t, dir, err, sizeof err), TOKENIZER_ERR_JSON);
    assert_non_null(strstr(err, "config.json"));
    unlink(path);
    assert_int_equal(tokenizer_load(&t, dir, err, sizeof err), 0);
    // without a decoder tokens are joined with spaces; invalid UTF-8 input is refused
    int32_t *ids;
    size_t n;
    assert_int_equal(tokenizer_encode(t, "aa", 2, false, &ids, &n), 0);
    assert_int_equal(n, 2);
    free(ids);
    assert_int_equal(tokenizer_encode(t, "a\xff", 2, false, &ids, &n), TOKENIZER_ERR_INVALID_UTF8);
    assert_null(ids);
    assert_int_equal(n, 0);
    assert_int_equal(tokenizer_encode(t, "", 0, true, &ids, &n), 0);
    assert_int_equal(n, 0);
    tokenizer_free(t);

    tokenizer_free(NULL);
    for (int s = 0; s >= -8; s--) assert_non_null(tokenizer_strerror(s));
    test_rm_rf(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_utf8_lossy_replaces_maximal_subparts),
        cmocka_unit_test(test_utf8_lossy_stream_equals_one_shot),
        cmocka_unit_test(test_byte_fallback_model_encodes_bytes_and_decodes_runs),
        cmocka_unit_test(test_post_processor_and_add_bos_eos_flags),
        cmocka_unit_test(test_bpe_merge_order_ignore_merges_and_unk),
        cmocka_unit_test(test_split_behaviors_match_hf),
        cmocka_unit_test(test_bytelevel_gpt2_regex_matches_hf),
        cmocka_unit_test(test_metaspace_matches_hf),
        cmocka_unit_test(test_strip_decoder_start_and_stop),
        cmocka_unit_test(test_added_token_flags_match_hf),
        cmocka_unit_test(test_load_errors_name_the_file_and_problem),
        cmocka_unit_test(test_llama2_vectors_encode_as_hf_and_round_trip),
        cmocka_unit_test(test_llama3_vectors_encode_as_hf_and_round_trip),
        cmocka_unit_test(test_qwen3_vectors_encode_as_hf_and_round_trip),
        cmocka_unit_test(test_chat_renders_encode_to_hf_ids),
        cmocka_unit_test(test_llama3_pretokenizer_splits),
        cmocka_unit_test(test_qwen3_pretokenizer_splits_digits_one_by_one),
        cmocka_unit_test(test_special_ids_and_add_special_tokens),
        cmocka_unit_test(test_added_tokens_in_the_middle_of_text),
        cmocka_unit_test(test_llama2_byte_fallback),
        cmocka_unit_test(test_llama3_bytelevel_decode_replaces_maximal_subparts),
        cmocka_unit_test(test_stream_emoji_split_across_byte_tokens),
        cmocka_unit_test(test_stream_equals_decode_random_llama2),
        cmocka_unit_test(test_stream_equals_decode_random_llama3),
        cmocka_unit_test(test_stream_equals_decode_random_qwen3),
        cmocka_unit_test(test_stream_prime_keeps_space_of_first_generated_token),
        cmocka_unit_test(test_stream_prime_keeps_prompt_text_out),
        cmocka_unit_test(test_stream_carried_counts_earlier_bytes),
        cmocka_unit_test(test_token_bytes_keep_leading_space_and_raw_bytes),
        cmocka_unit_test(test_stories260k_encodes_once_upon_a_time),
        cmocka_unit_test(test_stories260k_greedy_ids_decode_to_llama2c_text),
        cmocka_unit_test(test_mistral_loads_and_round_trips),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
