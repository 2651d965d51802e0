/* tokenizer_vocab: the vocabulary of a loaded tokenizer: the string -> id map (built at load,
 * read by the BPE model) and the lookups of tokenizer.h (id <-> piece, special tokens, BOS/EOS).
 * The loader, the encoder and the decoder all use it; it calls none of them. */
#include <stdlib.h>
#include <string.h>

#include "engine/text/tokenizer_impl.h"

/* ---- hashing ---- */

static uint32_t tokenizer_hash(const char *s, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
        h ^= h >> 31;
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    if (n) memcpy(&w, s, n);
    h = (h ^ w) * 0x94D049BB133111EBull;
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 32;
    return (uint32_t)h;
}

/* ---- vocabulary: string -> id ---- */

int tokenizer_vocab_build(struct tokenizer *tok) {
    struct tok_str_map *m = &tok->vocab;
    m->cap = tokenizer_pow2_at_least((size_t)tok->n_model * 2);
    m->slot = malloc(m->cap * sizeof *m->slot);
    m->hash = malloc(m->cap * sizeof *m->hash);
    if (!m->slot || !m->hash) return TOKENIZER_ERR_NOMEM;
    memset(m->slot, 0xff, m->cap * sizeof *m->slot);
    size_t mask = m->cap - 1;
    for (int32_t id = 0; id < tok->n_model; id++) {
        if (tok->piece_len[id] == UINT32_MAX) continue;
        const char *s = tok->arena + tok->piece_off[id];
        size_t n = tok->piece_len[id];
        uint32_t h = tokenizer_hash(s, n);
        size_t i = h & mask;
        for (; m->slot[i] >= 0; i = (i + 1) & mask) {
            int32_t o = m->slot[i];
            if (m->hash[i] == h && tok->piece_len[o] == n && !memcmp(tok->arena + tok->piece_off[o], s, n)) break;
        }
        m->slot[i] = id; // a repeated string keeps the last id, as a JSON map would
        m->hash[i] = h;
    }
    return 0;
}

int32_t tokenizer_vocab_get(const struct tokenizer *tok, const char *s, size_t n) {
    const struct tok_str_map *m = &tok->vocab;
    uint32_t h = tokenizer_hash(s, n);
    size_t mask = m->cap - 1;
    for (size_t i = h & mask; m->slot[i] >= 0; i = (i + 1) & mask) {
        int32_t o = m->slot[i];
        if (m->hash[i] == h && tok->piece_len[o] == n && !memcmp(tok->arena + tok->piece_off[o], s, n)) return o;
    }
    return -1;
}

/* ---- lookups ---- */

size_t tokenizer_vocab_size(const struct tokenizer *tok) {
    return (size_t)tok->n_vocab;
}

const char *tokenizer_id_to_piece(const struct tokenizer *tok, int32_t id, size_t *len) {
    if (id < 0 || id >= tok->n_vocab) return NULL;
    int32_t a = tok->added_of_id[id];
    if (a >= 0) {
        if (len) *len = tok->added[a].len;
        return tok->added[a].content;
    }
    if (id >= tok->n_model || tok->piece_len[id] == UINT32_MAX) return NULL;
    if (len) *len = tok->piece_len[id];
    return tok->arena + tok->piece_off[id];
}

int tokenizer_piece_to_id(const struct tokenizer *tok, const char *piece, size_t len, int32_t *id) {
    for (size_t i = 0; i < tok->n_added; i++)
        if (tok->added[i].len == len && !memcmp(tok->added[i].content, piece, len)) {
            *id = tok->added[i].id;
            return 0;
        }
    int32_t v = tokenizer_vocab_get(tok, piece, len);
    if (v < 0) return TOKENIZER_ERR_NOT_FOUND;
    *id = v;
    return 0;
}

int32_t tokenizer_bos_id(const struct tokenizer *tok) {
    return tok->bos_id;
}

int32_t tokenizer_eos_id(const struct tokenizer *tok) {
    return tok->n_eos ? tok->eos[0] : -1;
}

size_t tokenizer_eos_ids(const struct tokenizer *tok, const int32_t **ids) {
    *ids = tok->eos;
    return tok->n_eos;
}

bool tokenizer_is_eos(const struct tokenizer *tok, int32_t id) {
    for (size_t i = 0; i < tok->n_eos; i++)
        if (tok->eos[i] == id) return true;
    return false;
}

bool tokenizer_is_special(const struct tokenizer *tok, int32_t id) {
    if (id < 0 || id >= tok->n_vocab) return false;
    int32_t a = tok->added_of_id[id];
    return a >= 0 && tok->added[a].special;
}
