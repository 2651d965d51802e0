/* tokenizer_encode: the encode driver. Added tokens are split out of the raw text
 * (leftmost-longest, as HF's Aho-Corasick, with the single_word/lstrip/rstrip rules of
 * AddedVocabulary::find_matches), each remaining piece is normalized, split again on
 * "normalized" added tokens, pre-tokenized and run through BPE; the post-processor's ids go
 * around the result when add_special is set. */
#include <stdlib.h>
#include <string.h>

#include "engine/text/tokenizer_impl.h"
#include "engine/text/utf8.h"

/* Longest pattern starting at s[0..n): its added index (or -1) and length. */
static int32_t trie_longest(const struct tok_trie *t, const char *s, size_t n, size_t *len) {
    int32_t best = -1, cur = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char b = (unsigned char)s[i];
        int32_t ch = t->node[cur].child;
        while (ch >= 0 && t->node[ch].byte != b) ch = t->node[ch].sibling;
        if (ch < 0) break;
        cur = ch;
        if (t->node[cur].added >= 0) {
            best = t->node[cur].added;
            *len = i + 1;
        }
    }
    return best;
}

int tokenizer_enc_init(struct tok_enc *e, const struct tokenizer *tok) {
    memset(e, 0, sizeof *e);
    e->tok = tok;
    e->ps = calloc(tok->n_pretok + 1, sizeof *e->ps);
    e->md = pcre2_match_data_create(1, NULL);
    return e->ps && e->md ? 0 : TOKENIZER_ERR_NOMEM;
}

void tokenizer_enc_free(struct tok_enc *e) {
    free(e->out.p);
    free(e->sym);
    free(e->heap);
    for (size_t i = 0; e->ps && i < e->tok->n_pretok; i++) {
        free(e->ps[i].a.p);
        free(e->ps[i].b.p);
        free(e->ps[i].span);
    }
    free(e->ps);
    free(e->norm_a.p);
    free(e->norm_b.p);
    pcre2_match_data_free(e->md);
}

static size_t space_run_before(const char *s, size_t end) {
    size_t a = end;
    while (a > 0) {
        size_t b = a - 1;
        while (b > 0 && ((unsigned char)s[b] & 0xC0) == 0x80) b--;
        uint32_t cp;
        utf8_decode(s + b, a - b, &cp);
        if (!utf8_is_space(cp)) break;
        a = b;
    }
    return a;
}

static size_t space_run_after(const char *s, size_t n, size_t start) {
    size_t z = start;
    while (z < n) {
        uint32_t cp;
        size_t cl = utf8_decode(s + z, n - z, &cp);
        if (!utf8_is_space(cp)) break;
        z += cl;
    }
    return z;
}

static bool word_before(const char *s, size_t end) {
    if (end == 0) return false;
    size_t b = end - 1;
    while (b > 0 && ((unsigned char)s[b] & 0xC0) == 0x80) b--;
    uint32_t cp;
    utf8_decode(s + b, end - b, &cp);
    return utf8_is_word(cp);
}

static bool word_after(const char *s, size_t n, size_t start) {
    if (start >= n) return false;
    uint32_t cp;
    utf8_decode(s + start, n - start, &cp);
    return utf8_is_word(cp);
}

/* Next added-token match in s[from..n), after AddedVocabulary::find_matches: leftmost-longest,
 * single_word matches next to word characters are skipped, lstrip/rstrip take the spaces
 * around. Returns the added index or -1; [*a, *z) is the span it replaces. */
static int32_t next_added(const struct tokenizer *tok, const struct tok_trie *t, const char *s, size_t n,
                          size_t from, size_t floor, size_t *a, size_t *z) {
    if (t->n == 0) return -1;
    for (size_t pos = from; pos < n; pos++) {
        if (!t->first[(unsigned char)s[pos]]) continue;
        size_t len = 0;
        int32_t k = trie_longest(t, s + pos, n - pos, &len);
        if (k < 0) continue;
        const struct tok_added *ad = &tok->added[k];
        size_t start = pos, stop = pos + len;
        if (ad->single_word && (word_before(s, start) || word_after(s, n, stop))) {
            pos = stop - 1; // the search resumes after the rejected match, as Aho-Corasick's does
            continue;
        }
        if (ad->lstrip) {
            start = space_run_before(s, start);
            if (start < floor) start = floor;
        }
        if (ad->rstrip) stop = space_run_after(s, n, stop);
        *a = start;
        *z = stop;
        return k;
    }
    return -1;
}

static int encode_normalized_piece(struct tok_enc *e, const char *s, size_t n, bool at_start) {
    const struct tokenizer *tok = e->tok;
    size_t done = 0, a, z;
    int32_t k;
    while ((k = next_added(tok, &tok->trie_norm, s, n, done, done, &a, &z)) >= 0) {
        int rc = tokenizer_pretok_run(e, 0, s + done, a - done, at_start && done == 0);
        if (!rc) rc = tokenizer_ids_push(&e->out, tok->added[k].id);
        if (rc) return rc;
        done = z;
    }
    return tokenizer_pretok_run(e, 0, s + done, n - done, at_start && done == 0);
}

static int encode_text(struct tok_enc *e, const char *s, size_t n, bool at_start) {
    if (n == 0) return 0;
    const char *ns;
    size_t nn;
    int rc = tokenizer_normalize(e, s, n, &ns, &nn);
    return rc ? rc : encode_normalized_piece(e, ns, nn, at_start);
}

int tokenizer_encode(const struct tokenizer *tok, const char *text, size_t len, bool add_special, int32_t **ids,
                     size_t *n_ids) {
    *ids = NULL;
    *n_ids = 0;
    if (len && !text) return TOKENIZER_ERR_INVALID_UTF8;
    if (!utf8_valid(text, len)) return TOKENIZER_ERR_INVALID_UTF8;
    struct tok_enc e;
    int rc = tokenizer_enc_init(&e, tok);
    for (size_t i = 0; !rc && add_special && i < tok->n_post_prefix; i++) rc = tokenizer_ids_push(&e.out, tok->post_prefix[i]);
    size_t done = 0, a, z;
    int32_t k;
    while (!rc && (k = next_added(tok, &tok->trie_raw, text, len, done, done, &a, &z)) >= 0) {
        rc = encode_text(&e, text + done, a - done, done == 0);
        if (!rc) rc = tokenizer_ids_push(&e.out, tok->added[k].id);
        done = z;
    }
    if (!rc) rc = encode_text(&e, text + done, len - done, done == 0);
    for (size_t i = 0; !rc && add_special && i < tok->n_post_suffix; i++) rc = tokenizer_ids_push(&e.out, tok->post_suffix[i]);
    if (!rc && e.out.n) {
        *ids = e.out.p;
        *n_ids = e.out.n;
        e.out.p = NULL;
    }
    tokenizer_enc_free(&e);
    return rc;
}

int tokenizer_pretokenize(const struct tokenizer *tok, const char *text, size_t len,
                          int (*cb)(void *ctx, const char *s, size_t n), void *ctx) {
    if (!utf8_valid(text, len)) return TOKENIZER_ERR_INVALID_UTF8;
    struct tok_enc e;
    int rc = tokenizer_enc_init(&e, tok);
    e.piece_cb = cb;
    e.piece_ctx = ctx;
    const char *ns;
    size_t nn;
    if (!rc) rc = tokenizer_normalize(&e, text, len, &ns, &nn);
    if (!rc) rc = tokenizer_pretok_run(&e, 0, ns, nn, true);
    tokenizer_enc_free(&e);
    return rc;
}
