/* Token masks: the vocabulary trie, walks of it against the automaton, and the two caches
 * (engine/token_mask.h). */
#include "engine/token_mask.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/grammar_impl.h"
#include "engine/text/tokenizer.h"

/* ---- the vocabulary trie ---------------------------------------------------------------- */

/* Trie nodes in preorder (node 0 the root, the empty prefix), so a subtree is the range
 * [i, skip): a walk that finds node i dead jumps to skip. The tokens are sorted by their bytes,
 * which is the same order: those ending at node i are sorted[tok .. tok + n_here). */
struct tm_node {
    uint32_t skip;
    uint32_t tok;
    uint16_t depth;
    uint8_t byte;
    uint8_t n_here;
};

struct token_mask_vocab {
    int n_vocab;
    size_t words;
    struct tm_node *node;
    uint32_t n_nodes;
    int max_len;      // longest token, bytes
    int32_t *sorted;  // ids in the trie, by bytes
    uint32_t *off;    // [n_vocab + 1] bytes of id: bytes[off[id] .. off[id + 1]); none: never allowed
    uint8_t *bytes;
    uint32_t *first_off; // the same as the text's first token, for ids in first_ids
    uint8_t *first_bytes;
    int32_t *first_ids;  // ids whose bytes differ as the first token (SentencePiece's space)
    uint32_t n_first;
    uint32_t *eligible;  // [words] the ids in the trie
    int32_t *eos;
    uint32_t n_eos;
};

struct tok_ref {
    const uint8_t *p;
    uint32_t n;
    int32_t id;
};

static int cmp_tok(const void *a, const void *b) {
    const struct tok_ref *x = a, *y = b;
    uint32_t n = x->n < y->n ? x->n : y->n;
    int c = memcmp(x->p, y->p, n);
    if (c) return c;
    if (x->n != y->n) return x->n < y->n ? -1 : 1;
    return x->id < y->id ? -1 : 1;
}

void token_mask_vocab_free(struct token_mask_vocab *v) {
    if (!v) return;
    free(v->node);
    free(v->sorted);
    free(v->off);
    free(v->bytes);
    free(v->first_off);
    free(v->first_bytes);
    free(v->first_ids);
    free(v->eligible);
    free(v->eos);
    free(v);
}

/* Every id's bytes (none for special and empty tokens), and the first-token variants. */
static int collect_bytes(struct token_mask_vocab *v, const struct tokenizer *tok, size_t n_tok) {
    char buf[1024], fbuf[1024];
    size_t cap = 1 << 20, fcap = 1 << 12, n = 0, fn = 0;
    v->off = calloc((size_t)v->n_vocab + 1, sizeof *v->off);
    v->bytes = malloc(cap);
    v->first_off = calloc((size_t)v->n_vocab + 1, sizeof *v->first_off);
    v->first_ids = malloc(sizeof *v->first_ids * ((size_t)v->n_vocab + 1));
    v->first_bytes = malloc(fcap);
    if (!v->off || !v->bytes || !v->first_off || !v->first_ids || !v->first_bytes) return GRAMMAR_ERR_NOMEM;
    for (int32_t id = 0; id < v->n_vocab; id++) {
        v->off[id] = (uint32_t)n;
        v->first_off[v->n_first] = (uint32_t)fn;
        if ((size_t)id >= n_tok || tokenizer_is_special(tok, id) || tokenizer_is_eos(tok, id)) continue;
        size_t len = tokenizer_token_bytes(tok, id, false, buf, sizeof buf);
        size_t flen = tokenizer_token_bytes(tok, id, true, fbuf, sizeof fbuf);
        if (len > sizeof buf || flen > sizeof fbuf) return GRAMMAR_ERR_LIMIT;
        if (n + len > cap || fn + flen > fcap) {
            while (n + len > cap) cap *= 2;
            while (fn + flen > fcap) fcap *= 2;
            uint8_t *b = realloc(v->bytes, cap), *fb = realloc(v->first_bytes, fcap);
            if (b) v->bytes = b;
            if (fb) v->first_bytes = fb;
            if (!b || !fb) return GRAMMAR_ERR_NOMEM;
        }
        memcpy(v->bytes + n, buf, len);
        n += len;
        if (len > (size_t)v->max_len) v->max_len = (int)len;
        if (flen != len || memcmp(buf, fbuf, len)) {
            memcpy(v->first_bytes + fn, fbuf, flen);
            fn += flen;
            v->first_ids[v->n_first++] = id;
            v->first_off[v->n_first] = (uint32_t)fn;
        }
    }
    v->off[v->n_vocab] = (uint32_t)n;
    return 0;
}

/* The trie of the sorted tokens, in preorder. */
static int build_trie(struct token_mask_vocab *v, struct tok_ref *t, uint32_t nt) {
    size_t cap = (size_t)v->off[v->n_vocab] + 1;
    v->node = malloc(cap * sizeof *v->node);
    uint32_t *path = malloc(((size_t)v->max_len + 2) * sizeof *path);
    if (!v->node || !path) {
        free(path);
        return GRAMMAR_ERR_NOMEM;
    }
    uint32_t n = 1, depth = 0; /* open nodes: path[0..depth] */
    v->node[0] = (struct tm_node){0, 0, 0, 0, 0};
    path[0] = 0;
    for (uint32_t i = 0; i < nt; i++) {
        uint32_t lcp = 0;
        if (i) {
            uint32_t m = t[i - 1].n < t[i].n ? t[i - 1].n : t[i].n;
            while (lcp < m && t[i - 1].p[lcp] == t[i].p[lcp]) lcp++;
        }
        if (i && lcp == t[i].n && lcp == t[i - 1].n) { /* the same bytes as the previous token */
            if (v->node[path[depth]].n_here == UINT8_MAX) {
                free(path);
                return GRAMMAR_ERR_LIMIT;
            }
            v->node[path[depth]].n_here++;
            continue;
        }
        for (; depth > lcp; depth--) v->node[path[depth]].skip = n;
        for (uint32_t d = lcp + 1; d <= t[i].n; d++) {
            v->node[n] = (struct tm_node){0, i, (uint16_t)d, t[i].p[d - 1], d == t[i].n};
            path[++depth] = n++;
        }
    }
    for (; depth > 0; depth--) v->node[path[depth]].skip = n;
    v->node[0].skip = n;
    v->n_nodes = n;
    free(path);
    return 0;
}

int token_mask_vocab_build(struct token_mask_vocab **out, const struct tokenizer *tok, int n_vocab, char *err,
                           size_t errlen) {
    *out = NULL;
    size_t n_tok = tokenizer_vocab_size(tok);
    struct token_mask_vocab *v = calloc(1, sizeof *v);
    struct tok_ref *t = NULL;
    int rc = GRAMMAR_ERR_NOMEM;
    if (!v) goto fail;
    v->n_vocab = n_vocab > 0 ? n_vocab : (int)n_tok;
    v->words = ((size_t)v->n_vocab + 31) / 32;
    v->eligible = calloc(v->words, sizeof *v->eligible);
    const int32_t *eos;
    size_t n_eos = tokenizer_eos_ids(tok, &eos);
    v->eos = malloc((n_eos + 1) * sizeof *v->eos);
    if (!v->eligible || !v->eos) goto fail;
    for (size_t i = 0; i < n_eos; i++)
        if (eos[i] >= 0 && eos[i] < v->n_vocab) v->eos[v->n_eos++] = eos[i];
    if ((rc = collect_bytes(v, tok, n_tok))) goto fail;
    t = malloc(sizeof *t * ((size_t)v->n_vocab + 1));
    v->sorted = malloc(sizeof *v->sorted * ((size_t)v->n_vocab + 1));
    rc = GRAMMAR_ERR_NOMEM;
    if (!t || !v->sorted) goto fail;
    uint32_t nt = 0;
    for (int32_t id = 0; id < v->n_vocab; id++)
        if (v->off[id + 1] > v->off[id]) t[nt++] = (struct tok_ref){v->bytes + v->off[id], v->off[id + 1] - v->off[id], id};
    qsort(t, nt, sizeof *t, cmp_tok);
    for (uint32_t i = 0; i < nt; i++) {
        v->sorted[i] = t[i].id;
        v->eligible[t[i].id / 32] |= 1u << (t[i].id % 32);
    }
    if ((rc = build_trie(v, t, nt))) goto fail;
    free(t);
    *out = v;
    return 0;
fail:
    if (err && errlen)
        snprintf(err, errlen, "%s", rc == GRAMMAR_ERR_LIMIT ? "a token is too long or repeated too often for the "
                                                              "mask trie" : "out of memory building the mask trie");
    free(t);
    token_mask_vocab_free(v);
    return rc;
}

int token_mask_vocab_size(const struct token_mask_vocab *v) { return v->n_vocab; }
size_t token_mask_words(const struct token_mask_vocab *v) { return v->words; }

const uint8_t *token_mask_token_bytes(const struct token_mask_vocab *v, int32_t id, bool first, size_t *len) {
    *len = 0;
    if (id < 0 || id >= v->n_vocab || v->off[id + 1] == v->off[id]) return NULL;
    if (first) { /* ids are in first_ids in increasing order */
        uint32_t lo = 0, hi = v->n_first;
        while (lo < hi) {
            uint32_t mid = (lo + hi) / 2;
            if (v->first_ids[mid] < id) lo = mid + 1;
            else hi = mid;
        }
        if (lo < v->n_first && v->first_ids[lo] == id) {
            *len = v->first_off[lo + 1] - v->first_off[lo];
            return *len ? v->first_bytes + v->first_off[lo] : NULL;
        }
    }
    *len = v->off[id + 1] - v->off[id];
    return v->bytes + v->off[id];
}

/* ---- masks ------------------------------------------------------------------------------ */

/* What a node allows whatever is below it on the stack. */
struct tm_entry {
    int32_t *ids;       // accepted ids, or with reject the eligible ids not accepted
    uint32_t n_ids;
    uint8_t ready, reject;
    int32_t max_depth;  // deepest frame the walk pushed above the node: valid while depth + this < max_stack
    uint32_t *unc;      // trie nodes where the node's rule ended with token bytes left
    uint32_t n_unc;
};

struct token_mask {
    const struct grammar *g;
    const struct token_mask_vocab *v;
    struct tm_entry *entry; // [g->n_nodes]
    size_t entry_bytes, entry_budget;
    /* whole-state cache: open addressing over slots, keys in one pool, masks in another */
    struct tm_slot {
        uint64_t hash;
        uint32_t key, key_len; // in keys[]
        uint32_t mask;         // index of the mask in masks[]
        uint8_t used;
    } *slot;
    uint32_t n_slots, n_states, max_states;
    int32_t *keys;
    uint32_t n_keys, cap_keys;
    uint32_t *masks; // [max_states * words]
    /* scratch */
    struct gr_run run;
    uint32_t *lvl; // [4 * (max_len + 2)]: per depth: begin, end, configurations mark, frames mark
    uint32_t *tmp; // [words]
    uint32_t *unc;
    uint32_t n_unc, cap_unc;
    int32_t key[130];
    struct token_mask_stats stats;
};

#define STATE_KEY_MAX 128

int token_mask_init(struct token_mask **out, const struct grammar *g, const struct token_mask_vocab *v,
                    const struct token_mask_options *opt) {
    *out = NULL;
    struct token_mask *m = calloc(1, sizeof *m);
    if (!m) return GRAMMAR_ERR_NOMEM;
    m->g = g;
    m->v = v;
    m->entry_budget = opt && opt->node_cache_bytes ? opt->node_cache_bytes : (size_t)64 << 20;
    size_t sb = opt && opt->state_cache_bytes ? opt->state_cache_bytes : (size_t)8 << 20;
    m->max_states = (uint32_t)(sb / (v->words * 4) > 1 ? sb / (v->words * 4) : 1);
    if (m->max_states > 65536) m->max_states = 65536;
    m->n_slots = 2;
    while (m->n_slots < 2 * m->max_states) m->n_slots *= 2;
    m->entry = calloc((size_t)g->n_nodes, sizeof *m->entry);
    m->slot = calloc(m->n_slots, sizeof *m->slot);
    m->lvl = malloc(sizeof *m->lvl * 4 * ((size_t)v->max_len + 2));
    m->tmp = malloc(sizeof *m->tmp * v->words);
    gr_run_init(&m->run, g);
    if (!m->entry || !m->slot || !m->lvl || !m->tmp) {
        token_mask_free(m);
        return GRAMMAR_ERR_NOMEM;
    }
    *out = m;
    return 0;
}

static void clear_entries(struct token_mask *m) {
    for (int32_t i = 0; i < m->g->n_nodes; i++) {
        free(m->entry[i].ids);
        free(m->entry[i].unc);
    }
    memset(m->entry, 0, sizeof *m->entry * (size_t)m->g->n_nodes);
    m->entry_bytes = 0;
}

void token_mask_free(struct token_mask *m) {
    if (!m) return;
    if (m->entry) clear_entries(m);
    free(m->entry);
    free(m->slot);
    free(m->keys);
    free(m->masks);
    gr_run_free(&m->run);
    free(m->lvl);
    free(m->tmp);
    free(m->unc);
    free(m);
}

void token_mask_get_stats(const struct token_mask *m, struct token_mask_stats *st) { *st = m->stats; }

size_t token_mask_memory(const struct token_mask *m) {
    size_t words = m->v->words;
    return sizeof *m + m->entry_bytes + sizeof *m->entry * (size_t)m->g->n_nodes + sizeof *m->slot * m->n_slots +
           sizeof *m->keys * m->cap_keys + (m->masks ? sizeof *m->masks * words * m->max_states : 0) +
           sizeof *m->unc * m->cap_unc + sizeof *m->tmp * words + (size_t)m->run.capf * sizeof *m->run.f +
           (size_t)m->run.capc * sizeof *m->run.c;
}

static inline void set_bit(uint32_t *bits, int32_t id) { bits[id / 32] |= 1u << (id % 32); }

static int push_unc(struct token_mask *m, uint32_t t) {
    if (m->n_unc == m->cap_unc) {
        uint32_t c = m->cap_unc ? m->cap_unc * 2 : 256;
        uint32_t *p = realloc(m->unc, sizeof *p * c);
        if (!p) return GRAMMAR_ERR_NOMEM;
        m->unc = p;
        m->cap_unc = c;
    }
    m->unc[m->n_unc++] = t;
    return 0;
}

/* Walks the trie below node t from the configurations c[b0..e0) of m->run (which stand for t's
 * bytes), setting the bits of tokens that end alive: with the stacks still going, the text
 * complete (root end) or, for cache walks (unc), the base frame's rule ended. Cache walks record
 * in m->unc each node where the base rule ended and longer tokens continue. Leaves m->run's
 * configurations and frames as it found them. */
static int walk(struct token_mask *m, uint32_t t, uint32_t b0, uint32_t e0, uint32_t *bits, bool unc) {
    const struct token_mask_vocab *v = m->v;
    const struct tm_node *T = v->node;
    struct gr_run *r = &m->run;
    uint32_t *L = m->lvl, d0 = T[t].depth, end = T[t].skip, nc0 = r->nc, nf0 = r->nf;
    L[0] = b0, L[1] = e0, L[2] = r->nc, L[3] = r->nf;
    for (uint32_t i = t + 1; i < end;) {
        uint32_t d = T[i].depth - d0;
        uint32_t *up = &L[4 * (d - 1)], *at = &L[4 * d];
        r->nc = up[2];
        r->nf = up[3];
        unsigned fl = gr_step(r, up[0], up[1], T[i].byte);
        if (r->status) break;
        at[0] = up[2], at[1] = r->nc, at[2] = r->nc, at[3] = r->nf;
        bool alive = at[1] > at[0];
        if ((alive || fl) && T[i].n_here)
            for (uint32_t k = T[i].tok; k < T[i].tok + T[i].n_here; k++) set_bit(bits, v->sorted[k]);
        if (unc && (fl & GR_BASE_END) && T[i].skip > i + 1 && push_unc(m, i)) r->status = GRAMMAR_ERR_NOMEM;
        i = alive ? i + 1 : T[i].skip;
    }
    int rc = r->status;
    r->status = 0;
    r->nc = nc0;
    r->nf = nf0;
    return rc;
}

/* The entry of node n: a walk of the whole trie from the stack [n] over GR_BASE. */
static int node_entry(struct token_mask *m, int32_t n) {
    struct tm_entry *e = &m->entry[n];
    if (e->ready) return 0;
    const struct token_mask_vocab *v = m->v;
    struct gr_run *r = &m->run;
    r->nf = r->nc = 0;
    r->max_depth = 0;
    if (gr_run_reserve(r, 1, 1)) return r->status;
    r->f[r->nf++] = (struct gr_frame){n, GR_BASE, 0};
    r->c[r->nc++] = 0;
    memset(m->tmp, 0, sizeof *m->tmp * v->words);
    m->n_unc = 0;
    int rc = walk(m, 0, 0, 1, m->tmp, true);
    if (rc) return rc;
    m->stats.node_walks++;
    /* the shorter list: accepted ids, or the eligible ones not accepted */
    uint32_t n_acc = 0, n_elig = 0;
    for (size_t w = 0; w < v->words; w++) {
        n_acc += (uint32_t)__builtin_popcount(m->tmp[w]);
        n_elig += (uint32_t)__builtin_popcount(v->eligible[w]);
    }
    e->reject = n_acc > n_elig / 2;
    uint32_t n_ids = e->reject ? n_elig - n_acc : n_acc;
    e->ids = malloc(sizeof *e->ids * (n_ids + 1));
    e->unc = malloc(sizeof *e->unc * (m->n_unc + 1));
    if (!e->ids || !e->unc) {
        free(e->ids);
        free(e->unc);
        *e = (struct tm_entry){0};
        return GRAMMAR_ERR_NOMEM;
    }
    for (size_t w = 0; w < v->words; w++) {
        uint32_t x = e->reject ? v->eligible[w] & ~m->tmp[w] : m->tmp[w];
        for (; x; x &= x - 1) e->ids[e->n_ids++] = (int32_t)(w * 32 + (size_t)__builtin_ctz(x));
    }
    if (m->n_unc) memcpy(e->unc, m->unc, sizeof *e->unc * m->n_unc);
    e->n_unc = m->n_unc;
    e->max_depth = r->max_depth;
    e->ready = 1;
    m->entry_bytes += sizeof *e->ids * (n_ids + 1) + sizeof *e->unc * (m->n_unc + 1);
    return 0;
}

/* The whole state as a key: its flags, then each stack's nodes top to bottom, -1 after each.
 * Returns the length, or -1 when the stacks are too deep to key. */
static int state_key(struct token_mask *m, const struct gr_run *sr, unsigned flags) {
    int n = 0;
    m->key[n++] = (int32_t)flags;
    for (uint32_t i = 0; i < sr->nc; i++) {
        for (int32_t p = sr->c[i]; p >= 0; p = sr->f[p].parent) {
            if (n >= STATE_KEY_MAX) return -1;
            m->key[n++] = sr->f[p].node;
        }
        m->key[n++] = -1;
    }
    return n;
}

static uint64_t key_hash(const int32_t *k, int n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < n; i++) h = (h ^ (uint32_t)k[i]) * 0x100000001b3ull;
    return h ^ (h >> 29);
}

/* The slot of the key: the one holding it, or the empty one where it would go. */
static struct tm_slot *find_slot(struct token_mask *m, uint64_t h, int n) {
    uint32_t i = (uint32_t)h & (m->n_slots - 1);
    for (;; i = (i + 1) & (m->n_slots - 1)) {
        struct tm_slot *s = &m->slot[i];
        if (!s->used) return s;
        if (s->hash == h && s->key_len == (uint32_t)n && !memcmp(m->keys + s->key, m->key, sizeof *m->key * (size_t)n))
            return s;
    }
}

/* Keeps bits under the key; when the cache is full it starts again. */
static void remember(struct token_mask *m, uint64_t h, int n, const uint32_t *bits) {
    size_t words = m->v->words;
    if (m->n_states == m->max_states) {
        memset(m->slot, 0, sizeof *m->slot * m->n_slots);
        m->n_states = m->n_keys = 0;
    }
    if (!m->masks && !(m->masks = malloc(sizeof *m->masks * words * m->max_states))) return;
    if (m->n_keys + (uint32_t)n > m->cap_keys) {
        uint32_t c = m->cap_keys ? m->cap_keys : 4096;
        while (c < m->n_keys + (uint32_t)n) c *= 2;
        int32_t *k = realloc(m->keys, sizeof *k * c);
        if (!k) return;
        m->keys = k;
        m->cap_keys = c;
    }
    struct tm_slot *s = find_slot(m, h, n);
    memcpy(m->keys + m->n_keys, m->key, sizeof *m->key * (size_t)n);
    *s = (struct tm_slot){h, m->n_keys, (uint32_t)n, m->n_states, 1};
    memcpy(m->masks + (size_t)m->n_states * words, bits, sizeof *bits * words);
    m->n_keys += (uint32_t)n;
    m->n_states++;
}

/* Whether bytes keep configurations c[b..e) of m->run alive (or end the text). */
static bool run_accepts(struct token_mask *m, uint32_t b, uint32_t e, const uint8_t *p, size_t n, int *rc) {
    struct gr_run *r = &m->run;
    uint32_t nc0 = r->nc, nf0 = r->nf;
    bool ok = n > 0;
    for (size_t i = 0; i < n && ok; i++) {
        if (b == e) ok = false;
        unsigned fl = ok ? gr_step(r, b, e, p[i]) : 0;
        if (r->status) ok = false;
        b = e;
        e = r->nc;
        if (b == e && !(fl & GR_ACCEPT)) ok = false;
    }
    *rc = r->status;
    r->status = 0;
    r->nc = nc0;
    r->nf = nf0;
    return ok;
}

/* The mask of the state loaded in m->run (configurations c[0..n_cfg)). */
static int compute(struct token_mask *m, uint32_t n_cfg, uint32_t *bits) {
    const struct token_mask_vocab *v = m->v;
    struct gr_run *r = &m->run;
    for (uint32_t i = 0; i < n_cfg; i++) {
        const struct gr_frame fr = r->f[r->c[i]];
        const struct tm_entry *e = &m->entry[fr.node];
        int rc;
        if (fr.depth + e->max_depth + 1 >= m->g->max_stack) { /* the node's walk ignored what is below */
            m->stats.direct_walks++;
            if ((rc = walk(m, 0, i, i + 1, bits, false))) return rc;
            continue;
        }
        if (e->reject) {
            memcpy(m->tmp, v->eligible, sizeof *m->tmp * v->words);
            for (uint32_t k = 0; k < e->n_ids; k++) m->tmp[e->ids[k] / 32] &= ~(1u << (e->ids[k] % 32));
            for (size_t w = 0; w < v->words; w++) bits[w] |= m->tmp[w];
        } else {
            for (uint32_t k = 0; k < e->n_ids; k++) set_bit(bits, e->ids[k]);
        }
        if (!e->n_unc || fr.parent < 0) continue;
        /* tokens that leave the node's rule: their rest against the stack below it */
        uint32_t lvl = r->nc, nf = r->nf;
        unsigned fl = 0;
        if (gr_expand(r, lvl, r->f[fr.parent].node, r->f[fr.parent].parent, &fl)) {
            rc = r->status;
            r->status = 0;
            return rc;
        }
        for (uint32_t k = 0; k < e->n_unc && r->nc > lvl; k++)
            if ((rc = walk(m, e->unc[k], lvl, r->nc, bits, false))) return rc;
        r->nc = lvl;
        r->nf = nf;
    }
    return 0;
}

int token_mask_fill(struct token_mask *m, const struct grammar_state *s, bool at_start, uint32_t *bits) {
    const struct token_mask_vocab *v = m->v;
    unsigned flags;
    const struct gr_run *sr = gr_state_run(s, &flags);
    m->stats.fills++;
    int n_key = at_start ? -1 : state_key(m, sr, flags);
    uint64_t h = n_key >= 0 ? key_hash(m->key, n_key) : 0;
    if (n_key >= 0) {
        struct tm_slot *sl = find_slot(m, h, n_key);
        if (sl->used) {
            m->stats.state_hits++;
            memcpy(bits, m->masks + (size_t)sl->mask * v->words, sizeof *bits * v->words);
            return 0;
        }
    }
    if (m->entry_bytes > m->entry_budget) clear_entries(m);
    for (uint32_t i = 0; i < sr->nc; i++) { /* node walks use m->run: before loading the state */
        int rc = node_entry(m, sr->f[sr->c[i]].node);
        if (rc) return rc;
    }
    struct gr_run *r = &m->run;
    r->nf = r->nc = 0;
    if (gr_run_reserve(r, sr->nf, sr->nc)) return GRAMMAR_ERR_NOMEM;
    if (sr->nf) memcpy(r->f, sr->f, sizeof *r->f * sr->nf);
    if (sr->nc) memcpy(r->c, sr->c, sizeof *r->c * sr->nc);
    r->nf = sr->nf;
    r->nc = sr->nc;
    memset(bits, 0, sizeof *bits * v->words);
    int rc = compute(m, sr->nc, bits);
    if (rc) return rc;
    if (flags & GR_ACCEPT)
        for (uint32_t i = 0; i < v->n_eos; i++) set_bit(bits, v->eos[i]);
    if (at_start) { /* the tokens whose bytes differ at the start of the text, one by one */
        for (uint32_t i = 0; i < v->n_first; i++) {
            int32_t id = v->first_ids[i];
            size_t len;
            const uint8_t *p = token_mask_token_bytes(v, id, true, &len);
            bits[id / 32] &= ~(1u << (id % 32));
            if (p && run_accepts(m, 0, sr->nc, p, len, &rc)) set_bit(bits, id);
            if (rc) return rc;
        }
    }
    if (n_key >= 0) remember(m, h, n_key, bits);
    return 0;
}

int token_mask_accept(struct token_mask *m, struct grammar_state *s, int32_t id, bool at_start) {
    for (uint32_t i = 0; i < m->v->n_eos; i++)
        if (m->v->eos[i] == id) return grammar_state_accepting(s) ? 0 : GRAMMAR_REJECT;
    size_t len;
    const uint8_t *p = token_mask_token_bytes(m->v, id, at_start, &len);
    if (!p) return GRAMMAR_REJECT;
    return grammar_state_advance(s, p, len);
}
