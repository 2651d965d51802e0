/* tokenizer_bpe: the merge hash map and the BPE model of HF `tokenizers`
 * (models/bpe/model.rs merge_word + word.rs merge_all): a word is split into characters, each
 * looked up in the vocabulary (with byte fallback or unk when missing), then the pair with the
 * lowest merge rank (leftmost on ties) is merged repeatedly, using a binary heap over a linked
 * list of symbols: O(n log n) for a word of n characters. */
#include <stdlib.h>
#include <string.h>

#include "engine/text/tokenizer_impl.h"
#include "engine/text/utf8.h"

/* ---- buffers ---- */

int tokenizer_buf_reserve(struct tok_buf *b, size_t extra) {
    if (b->len + extra + 1 <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return TOKENIZER_ERR_NOMEM;
    b->p = p;
    b->cap = cap;
    return 0;
}

int tokenizer_buf_append(struct tok_buf *b, const void *s, size_t n) {
    if (tokenizer_buf_reserve(b, n)) return TOKENIZER_ERR_NOMEM;
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
    return 0;
}

int tokenizer_ids_push(struct tok_ids *v, int32_t id) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        int32_t *p = realloc(v->p, cap * sizeof *p);
        if (!p) return TOKENIZER_ERR_NOMEM;
        v->p = p;
        v->cap = cap;
    }
    v->p[v->n++] = id;
    return 0;
}

/* ---- merges: (left, right) -> (rank, id) ---- */

static inline size_t merge_slot(uint64_t key, size_t mask) {
    return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 32) & mask;
}

int tokenizer_merge_init(struct tok_merge_map *m, size_t n) {
    m->cap = tokenizer_pow2_at_least(n + n / 2 + 1);
    m->slot = malloc(m->cap * sizeof *m->slot);
    if (!m->slot) return TOKENIZER_ERR_NOMEM;
    for (size_t i = 0; i < m->cap; i++) m->slot[i].key = UINT64_MAX;
    return 0;
}

int tokenizer_merge_put(struct tok_merge_map *m, int32_t a, int32_t b, uint32_t rank, int32_t id) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t mask = m->cap - 1;
    size_t i = merge_slot(key, mask);
    while (m->slot[i].key != UINT64_MAX && m->slot[i].key != key) i = (i + 1) & mask;
    // A repeated pair keeps the later rank, as HF's HashMap collect does.
    m->slot[i].key = key;
    m->slot[i].rank = rank;
    m->slot[i].id = id;
    return 0;
}

const struct tok_merge *tokenizer_merge_get(const struct tok_merge_map *m, int32_t a, int32_t b) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t mask = m->cap - 1;
    for (size_t i = merge_slot(key, mask); m->slot[i].key != UINT64_MAX; i = (i + 1) & mask)
        if (m->slot[i].key == key) return &m->slot[i];
    return NULL;
}

/* ---- the merge loop ---- */

static inline bool heap_less(const struct tok_heap_item *x, const struct tok_heap_item *y) {
    return x->rank != y->rank ? x->rank < y->rank : x->pos < y->pos;
}

static int heap_push(struct tok_enc *e, struct tok_heap_item it) {
    if (e->n_heap == e->cap_heap) {
        size_t cap = e->cap_heap ? e->cap_heap * 2 : 64;
        struct tok_heap_item *p = realloc(e->heap, cap * sizeof *p);
        if (!p) return TOKENIZER_ERR_NOMEM;
        e->heap = p;
        e->cap_heap = cap;
    }
    size_t i = e->n_heap++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!heap_less(&it, &e->heap[parent])) break;
        e->heap[i] = e->heap[parent];
        i = parent;
    }
    e->heap[i] = it;
    return 0;
}

static struct tok_heap_item heap_pop(struct tok_enc *e) {
    struct tok_heap_item top = e->heap[0], last = e->heap[--e->n_heap];
    size_t n = e->n_heap, i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && heap_less(&e->heap[c + 1], &e->heap[c])) c++;
        if (!heap_less(&e->heap[c], &last)) break;
        e->heap[i] = e->heap[c];
        i = c;
    }
    if (n) e->heap[i] = last;
    return top;
}

/* Queues the merge of symbol pos with its right neighbour, if the pair has one. */
static int queue_pair(struct tok_enc *e, int32_t pos) {
    struct tok_sym *s = e->sym;
    int32_t next = s[pos].next;
    if (next < 0) return 0;
    const struct tok_merge *m = tokenizer_merge_get(&e->tok->merges, s[pos].id, s[next].id);
    if (!m) return 0;
    struct tok_heap_item it = {m->rank, (uint32_t)pos, s[pos].id, s[next].id, m->id};
    return heap_push(e, it);
}

static int32_t lookup_char(struct tok_enc *e, const char *c, size_t cl, bool first, bool last,
                           struct tok_buf *tmp) {
    const struct tokenizer *t = e->tok;
    bool pre = !first && t->subword_prefix, suf = last && t->word_suffix;
    if (!pre && !suf) {
        if (cl <= 2) {
            uint32_t cp;
            utf8_decode(c, cl, &cp);
            return t->cp_id[cp];
        }
        return tokenizer_vocab_get(t, c, cl);
    }
    tmp->len = 0;
    if ((pre && tokenizer_buf_append(tmp, t->subword_prefix, t->subword_prefix_len)) ||
        tokenizer_buf_append(tmp, c, cl) || (suf && tokenizer_buf_append(tmp, t->word_suffix, t->word_suffix_len)))
        return -2;
    return tokenizer_vocab_get(t, tmp->p, tmp->len);
}

static int bpe_core(struct tok_enc *e, const char *w, size_t n) {
    const struct tokenizer *t = e->tok;
    if (e->cap_sym < n) {
        struct tok_sym *p = realloc(e->sym, n * sizeof *p);
        if (!p) return TOKENIZER_ERR_NOMEM;
        e->sym = p;
        e->cap_sym = n;
    }
    struct tok_sym *s = e->sym;
    int32_t ns = 0;
    int32_t unk = -1; // pending unk symbol (fuse_unk joins consecutive ones)
    uint32_t unk_len = 0;
    struct tok_buf tmp = {0};
#define ADD_SYM(ID, LEN) (s[ns] = (struct tok_sym){(ID), ns - 1, ns + 1, (LEN)}, ns++)
    for (size_t i = 0; i < n;) {
        size_t cl = utf8_len((unsigned char)w[i]);
        if (cl > n - i) cl = n - i;
        int32_t id = lookup_char(e, w + i, cl, i == 0, i + cl == n, &tmp);
        if (id == -2) {
            free(tmp.p);
            return TOKENIZER_ERR_NOMEM;
        }
        if (id >= 0) {
            if (unk >= 0) {
                ADD_SYM(unk, unk_len);
                unk = -1;
            }
            ADD_SYM(id, (uint32_t)cl);
        } else {
            bool done = false;
            if (t->byte_fallback) {
                done = true;
                for (size_t k = 0; k < cl; k++) done = done && t->byte_id[(unsigned char)w[i + k]] >= 0;
                // as HF: a pending unk is not flushed before the byte tokens
                if (done)
                    for (size_t k = 0; k < cl; k++) ADD_SYM(t->byte_id[(unsigned char)w[i + k]], 1);
            }
            if (!done && t->unk_id >= 0) {
                if (unk >= 0 && t->fuse_unk) {
                    unk_len += (uint32_t)cl;
                } else {
                    if (unk >= 0) ADD_SYM(unk, unk_len);
                    unk = t->unk_id;
                    unk_len = (uint32_t)cl;
                }
            }
        }
        i += cl;
    }
    if (unk >= 0) ADD_SYM(unk, unk_len);
#undef ADD_SYM
    free(tmp.p);
    if (ns == 0) return 0;
    s[ns - 1].next = -1;

    // Merge by rank; stale heap entries (a side already merged into something else) are skipped.
    e->n_heap = 0;
    for (int32_t i = 0; i + 1 < ns; i++)
        if (queue_pair(e, i)) return TOKENIZER_ERR_NOMEM;
    while (e->n_heap > 0) {
        struct tok_heap_item it = heap_pop(e);
        int32_t pos = (int32_t)it.pos;
        if (s[pos].len == 0 || s[pos].next < 0) continue;
        int32_t next = s[pos].next;
        if (s[pos].id != it.left || s[next].id != it.right) continue;
        s[pos].id = it.id;
        s[pos].len += s[next].len;
        s[next].len = 0;
        s[pos].next = s[next].next;
        if (s[pos].next >= 0) s[s[pos].next].prev = pos;
        if (s[pos].prev >= 0 && queue_pair(e, s[pos].prev)) return TOKENIZER_ERR_NOMEM;
        if (queue_pair(e, pos)) return TOKENIZER_ERR_NOMEM;
    }
    for (int32_t i = 0; i < ns; i++)
        if (s[i].len && tokenizer_ids_push(&e->out, s[i].id)) return TOKENIZER_ERR_NOMEM;
    return 0;
}

/* ---- long words ---- */

static inline size_t pair_slot(uint64_t key, size_t mask) {
    return (size_t)((key * 0xD6E8FEB86659FD93ull) >> 32) & mask;
}

static bool pair_has(const struct tok_pair_set *p, uint64_t key) {
    size_t mask = p->cap - 1;
    for (size_t i = pair_slot(key, mask); p->slot[i] != UINT64_MAX; i = (i + 1) & mask)
        if (p->slot[i] == key) return true;
    return false;
}

int tokenizer_pairs_build(struct tokenizer *tok) {
    size_t total = 0;
    for (int32_t id = 0; id < tok->n_model; id++)
        if (tok->piece_len[id] != UINT32_MAX) total += tok->piece_len[id];
    struct tok_pair_set *p = &tok->pairs;
    p->cap = tokenizer_pow2_at_least(2 * total + 1);
    p->slot = malloc(p->cap * sizeof *p->slot);
    if (!p->slot) {
        p->cap = 0;
        return TOKENIZER_ERR_NOMEM;
    }
    memset(p->slot, 0xff, p->cap * sizeof *p->slot);
    size_t mask = p->cap - 1;
    for (int32_t id = 0; id < tok->n_model; id++) {
        if (tok->piece_len[id] == UINT32_MAX) continue;
        const char *s = tok->arena + tok->piece_off[id];
        size_t n = tok->piece_len[id];
        uint32_t prev = 0;
        for (size_t i = 0; i < n;) {
            uint32_t cp;
            size_t cl = utf8_decode(s + i, n - i, &cp);
            if (i > 0) {
                uint64_t key = (uint64_t)prev << 32 | cp;
                size_t k = pair_slot(key, mask);
                while (p->slot[k] != UINT64_MAX && p->slot[k] != key) k = (k + 1) & mask;
                p->slot[k] = key;
            }
            prev = cp;
            i += cl;
        }
    }
    return 0;
}

/* Every merge produces a vocabulary token, so no merge crosses a point between two characters
 * that never stand side by side inside a token: BPE on the pieces between such points gives
 * the same ids as BPE on the whole word, with small heaps (SentencePiece-style models, which
 * have no pre-tokenizer, see the whole text as one word). Points next to a character outside
 * the vocabulary are kept, so that byte fallback and unk fusing see the same neighbours. */
#ifndef BPE_SPLIT_MIN
#define BPE_SPLIT_MIN 256
#endif

int tokenizer_bpe_word(struct tok_enc *e, const char *w, size_t n) {
    const struct tokenizer *t = e->tok;
    if (n == 0) return 0;
    if (t->ignore_merges) {
        int32_t id = tokenizer_vocab_get(t, w, n);
        if (id >= 0) return tokenizer_ids_push(&e->out, id);
    }
    if (n < BPE_SPLIT_MIN || !t->pairs.cap) return bpe_core(e, w, n);
    size_t start = 0;
    uint32_t prev = 0;
    bool prev_known = false;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t cl = utf8_decode(w + i, n - i, &cp);
        bool known = tokenizer_vocab_get(t, w + i, cl) >= 0;
        if (i > start && prev_known && known && !pair_has(&t->pairs, (uint64_t)prev << 32 | cp)) {
            int rc = bpe_core(e, w + start, i - start);
            if (rc) return rc;
            start = i;
        }
        prev = cp;
        prev_known = known;
        i += cl;
    }
    return bpe_core(e, w + start, n - start);
}
