/* tokenizer_impl: the tokenizer's private structures, shared by tokenizer*.c only.
 * tokenizer.c: loading;
 * tokenizer_vocab.c: the vocabulary map and the lookups of tokenizer.h;
 * tokenizer_encode.c: the encode driver (added tokens, normalize, pre-tokenize, post-processor);
 * tokenizer_bpe.c: buffers, the merge hash map and the BPE merge loop;
 * tokenizer_pretok.c: normalizers and pre-tokenizers (PCRE2, utf8proc);
 * tokenizer_decode.c: the decoder chain and the incremental detokenizer. */
#ifndef DUO_TOKENIZER_IMPL_H
#define DUO_TOKENIZER_IMPL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/text/tokenizer.h"

/* ---- growable buffers ---- */
struct tok_buf {
    char *p;
    size_t len, cap;
};
struct tok_ids {
    int32_t *p;
    size_t n, cap;
};
int tokenizer_buf_reserve(struct tok_buf *b, size_t extra);
int tokenizer_buf_append(struct tok_buf *b, const void *s, size_t n);
int tokenizer_ids_push(struct tok_ids *v, int32_t id);

/* ---- maps ---- */
/* Open addressing string -> id over strings the owner keeps (looked up through key()). */
struct tok_str_map {
    int32_t *slot;  // [cap] id, -1 empty
    uint32_t *hash; // [cap] hash of the slot's key
    size_t cap;     // power of two
};
/* Capacity of an open-addressing table: the first power of two >= n (at least 16). */
static inline size_t tokenizer_pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c *= 2;
    return c;
}

/* (left id, right id) -> (rank, merged id) */
struct tok_merge {
    uint64_t key; // left << 32 | right; UINT64_MAX = empty
    uint32_t rank;
    int32_t id;
};
struct tok_merge_map {
    struct tok_merge *slot;
    size_t cap; // power of two
};
/* Set of adjacent code point pairs (a << 32 | b) found inside vocabulary tokens. */
struct tok_pair_set {
    uint64_t *slot; // UINT64_MAX = empty
    size_t cap;     // 0 when not built
};

/* ---- pipeline components ---- */
enum tok_norm_kind {
    TOK_NORM_NFC,
    TOK_NORM_NFD,
    TOK_NORM_NFKC,
    TOK_NORM_NFKD,
    TOK_NORM_PREPEND,  // a = prepended text
    TOK_NORM_REPLACE,  // a = literal pattern or re, b = content
    TOK_NORM_LOWERCASE,
    TOK_NORM_STRIP,    // left/right
};
struct tok_normalizer {
    enum tok_norm_kind kind;
    char *a, *b;
    size_t a_len, b_len;
    pcre2_code *re;
    bool left, right;
};

enum tok_split_behavior {
    TOK_SPLIT_REMOVED,
    TOK_SPLIT_ISOLATED,
    TOK_SPLIT_MERGED_WITH_PREVIOUS,
    TOK_SPLIT_MERGED_WITH_NEXT,
    TOK_SPLIT_CONTIGUOUS,
};
enum tok_pretok_kind {
    TOK_PRETOK_SPLIT,      // re or literal, behavior, invert
    TOK_PRETOK_BYTE_LEVEL, // add_prefix_space, re (GPT-2 pattern) when use_regex
    TOK_PRETOK_METASPACE,  // literal = replacement, prepend scheme, split
    TOK_PRETOK_DIGITS,     // individual
};
enum tok_prepend_scheme { TOK_PREPEND_ALWAYS, TOK_PREPEND_FIRST, TOK_PREPEND_NEVER };
struct tok_pretok {
    enum tok_pretok_kind kind;
    pcre2_code *re;
    char *literal;
    size_t literal_len;
    enum tok_split_behavior behavior;
    bool invert;
    bool add_prefix_space;
    enum tok_prepend_scheme prepend;
    bool split;
    bool individual;
};

enum tok_dec_kind {
    TOK_DEC_REPLACE,       // pattern -> content, per token
    TOK_DEC_BYTE_FALLBACK, // <0xNN> runs -> bytes
    TOK_DEC_FUSE,
    TOK_DEC_STRIP,         // content char, start, stop
    TOK_DEC_BYTE_LEVEL,
    TOK_DEC_METASPACE,     // replacement char -> ' ', first-token strip when prepend != never
};
struct tok_decoder {
    enum tok_dec_kind kind;
    char *pattern, *content;
    size_t pattern_len, content_len;
    uint32_t ch; // Strip content / Metaspace replacement
    size_t start, stop;
    bool prepend;
};

struct tok_added {
    int32_t id;
    char *content;
    size_t len;
    bool special, single_word, lstrip, rstrip, normalized;
};

/* Byte trie over added-token contents, for leftmost-longest matching. */
struct tok_trie_node {
    int32_t child;   // first child node, -1 none
    int32_t sibling; // next sibling, -1 none
    int32_t added;   // index into tok->added of a pattern ending here, -1 none
    unsigned char byte;
};
struct tok_trie {
    struct tok_trie_node *node; // node[0] is the root
    size_t n, cap;
    bool first[256]; // bytes that start some pattern
};

/* ---- the tokenizer ---- */
struct tokenizer {
    // model vocabulary: id -> string (offset/length into arena; len UINT32_MAX for holes)
    char *arena;
    size_t arena_len;
    uint32_t *piece_off, *piece_len; // [n_model]
    int32_t n_model;
    struct tok_str_map vocab;
    struct tok_merge_map merges;
    struct tok_pair_set pairs; // built when words can be long (no pre-tokenizer)
    bool byte_fallback, fuse_unk, ignore_merges;
    int32_t unk_id;       // -1 none
    int32_t byte_id[256]; // id of "<0xNN>", -1 when absent
    int32_t cp_id[0x800]; // id of the one-character token for code points < 0x800, -1
    char *subword_prefix, *word_suffix; // NULL or non-empty
    size_t subword_prefix_len, word_suffix_len;

    // added tokens
    struct tok_added *added;
    size_t n_added;
    int32_t *added_of_id; // [n_vocab] index into added, -1
    struct tok_trie trie_raw, trie_norm;
    int32_t n_vocab;

    // pipeline
    struct tok_normalizer *norm;
    size_t n_norm;
    struct tok_pretok *pretok;
    size_t n_pretok;
    struct tok_decoder *dec;
    size_t n_dec;
    bool has_decoder;     // false: tokens joined with ' '
    int stream_strip;     // index into dec of the Strip applied to the whole text, -1 none
    bool stream_byte_fallback, stream_byte_level;

    // post-processor: ids put around the sequence when add_special
    int32_t *post_prefix, *post_suffix;
    size_t n_post_prefix, n_post_suffix;

    // specials
    int32_t bos_id;
    int32_t *eos; // primary first
    size_t n_eos;

    // byte-level alphabet (GPT-2 bytes_to_unicode)
    char bl_enc[256][2];  // UTF-8 of the char standing for each byte
    unsigned char bl_len[256];
    int16_t bl_dec[0x144]; // code point -> byte, -1
};

/* ---- per-call scratch (one encode call, one thread) ---- */
struct tok_sym {
    int32_t id;
    int32_t prev, next; // symbol indices, -1 at the ends
    uint32_t len;       // bytes of the word it covers; 0 once merged away
};
struct tok_heap_item {
    uint32_t rank, pos;
    int32_t left, right, id;
};
struct tok_pretok_scratch {
    struct tok_buf a, b;   // rewritten text of the current input
    size_t *span;          // (start, end) pairs
    size_t n_span, cap_span;
};
struct tok_enc {
    const struct tokenizer *tok;
    struct tok_ids out;
    struct tok_sym *sym;
    size_t cap_sym;
    struct tok_heap_item *heap;
    size_t n_heap, cap_heap;
    struct tok_pretok_scratch *ps; // [n_pretok]
    struct tok_buf norm_a, norm_b;
    pcre2_match_data *md;
    // when set, pre-tokenized pieces go here instead of to the model (tests, debugging)
    int (*piece_cb)(void *ctx, const char *s, size_t n);
    void *piece_ctx;
};

/* tokenizer_encode.c: per-call scratch (enc_free also after a failed init). */
int tokenizer_enc_init(struct tok_enc *e, const struct tokenizer *tok);
void tokenizer_enc_free(struct tok_enc *e);
/* Normalizes text[0..len) (no added-token split) and reports each pre-token. */
int tokenizer_pretokenize(const struct tokenizer *tok, const char *text, size_t len,
                          int (*cb)(void *ctx, const char *s, size_t n), void *ctx);

/* tokenizer_vocab.c: the string -> id map of the model vocabulary; -1 when s is not in it. */
int tokenizer_vocab_build(struct tokenizer *tok);
int32_t tokenizer_vocab_get(const struct tokenizer *tok, const char *s, size_t n);

/* tokenizer_bpe.c */
int tokenizer_merge_put(struct tok_merge_map *m, int32_t a, int32_t b, uint32_t rank, int32_t id);
int tokenizer_merge_init(struct tok_merge_map *m, size_t n);
const struct tok_merge *tokenizer_merge_get(const struct tok_merge_map *m, int32_t a, int32_t b);
int tokenizer_pairs_build(struct tokenizer *tok);
/* Runs the BPE model on one pre-token; appends its ids to e->out. */
int tokenizer_bpe_word(struct tok_enc *e, const char *w, size_t n);

/* tokenizer_pretok.c */
/* Applies every normalizer to in[0..n); the result is in *res (points into e's buffers, or in). */
int tokenizer_normalize(struct tok_enc *e, const char *in, size_t n, const char **res, size_t *res_len);
/* Runs pre-tokenizers from step on s[0..n), then the model on each piece. at_start: s begins at
 * offset 0 of the original text (Metaspace's "first" scheme). */
int tokenizer_pretok_run(struct tok_enc *e, size_t step, const char *s, size_t n, bool at_start);
/* Compiles a tokenizers regex for PCRE2 (UTF, UCP); NULL with a message on failure. */
pcre2_code *tokenizer_regex_compile(const char *pattern, char *msg, size_t msglen);
void tokenizer_bytelevel_init(struct tokenizer *tok);

/* tokenizer_decode.c: checks the decoder chain fits the stream's pipeline and records its shape
 * (stream_strip, stream_byte_fallback, stream_byte_level). */
int tokenizer_decoder_plan(struct tokenizer *tok, char *msg, size_t msglen);

#endif
