/* The shared table of compiled grammars (engine/grammar_cache.h): a list in least recently used
 * order, looked up by a hash of the grammar's key text. Tens of entries: a list is enough. */
#include "engine/grammar_cache.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/text/tokenizer.h"

struct grammar_cache_entry {
    char *key;
    size_t key_len;
    uint64_t hash;
    struct grammar *g;
    struct token_mask *mask; // engine thread, made on first use
    size_t bytes;            // grammar + mask as last measured
    int refs;
    struct grammar_cache_entry *prev, *next; // most recently used first
};

struct grammar_cache {
    pthread_mutex_t mu;       // the list, refs, bytes, stats
    pthread_mutex_t build_mu; // the vocabulary trie, built once
    const struct tokenizer *tok;
    int n_vocab;
    struct token_mask_vocab *vocab; // set once under both mutexes, then immutable
    struct grammar_cache_entry *head;
    int n;
    size_t bytes;
    unsigned long long hits, misses, evictions;
};

int grammar_cache_create(struct grammar_cache **out, const struct tokenizer *tok, int n_vocab) {
    *out = NULL;
    struct grammar_cache *gc = calloc(1, sizeof *gc);
    if (!gc) return GRAMMAR_ERR_NOMEM;
    pthread_mutex_init(&gc->mu, NULL);
    pthread_mutex_init(&gc->build_mu, NULL);
    gc->tok = tok;
    gc->n_vocab = n_vocab;
    *out = gc;
    return 0;
}

static void entry_free(struct grammar_cache_entry *e) {
    token_mask_free(e->mask);
    grammar_free(e->g);
    free(e->key);
    free(e);
}

void grammar_cache_free(struct grammar_cache *gc) {
    if (!gc) return;
    for (struct grammar_cache_entry *e = gc->head, *nx; e; e = nx) {
        nx = e->next;
        entry_free(e);
    }
    token_mask_vocab_free(gc->vocab);
    pthread_mutex_destroy(&gc->mu);
    pthread_mutex_destroy(&gc->build_mu);
    free(gc);
}

/* ---- keys: every field of the spec, each as its length and bytes ---- */

static void key_add(char *buf, size_t *n, const char *s) {
    size_t len = s ? strlen(s) : 0;
    char head[32];
    size_t w = (size_t)snprintf(head, sizeof head, "%zu%c", len, s ? ':' : '~');
    if (buf) {
        memcpy(buf + *n, head, w);
        if (len) memcpy(buf + *n + w, s, len);
    }
    *n += w + len;
}

static size_t key_build(const struct engine_grammar *sp, char *buf) {
    size_t n = 0;
    char head[48];
    snprintf(head, sizeof head, "%d/%d/%d/%d", (int)sp->kind, sp->wrapped, sp->wrap.min_items, sp->wrap.max_items);
    key_add(buf, &n, head);
    key_add(buf, &n, sp->kind == ENGINE_GRAMMAR_JSON_SCHEMA ? sp->schema : NULL);
    const struct grammar_wrap *w = &sp->wrap;
    const char *parts[] = {w->begin, w->end, w->item_begin, w->item_end, w->sep};
    for (size_t i = 0; i < sizeof parts / sizeof *parts; i++) key_add(buf, &n, sp->wrapped ? parts[i] : NULL);
    return n;
}

static uint64_t hash_bytes(const char *p, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)p[i]) * 1099511628211ull;
    return h;
}

/* ---- the list (under mu) ---- */

static void unlink_entry(struct grammar_cache *gc, struct grammar_cache_entry *e) {
    if (e->prev) e->prev->next = e->next;
    else gc->head = e->next;
    if (e->next) e->next->prev = e->prev;
    e->prev = e->next = NULL;
}

static void push_front(struct grammar_cache *gc, struct grammar_cache_entry *e) {
    e->prev = NULL;
    e->next = gc->head;
    if (gc->head) gc->head->prev = e;
    gc->head = e;
}

static struct grammar_cache_entry *find(struct grammar_cache *gc, const char *key, size_t n, uint64_t h) {
    for (struct grammar_cache_entry *e = gc->head; e; e = e->next)
        if (e->hash == h && e->key_len == n && !memcmp(e->key, key, n)) return e;
    return NULL;
}

/* Drops entries nobody holds, least recently used first, while over a bound; returns the first
 * of a list of them, to be freed outside the lock. */
static struct grammar_cache_entry *evict(struct grammar_cache *gc) {
    struct grammar_cache_entry *dead = NULL, *tail = gc->head;
    while (tail && tail->next) tail = tail->next;
    for (struct grammar_cache_entry *e = tail, *pv; e && (gc->n > GRAMMAR_CACHE_MAX_ENTRIES ||
                                                         gc->bytes > GRAMMAR_CACHE_MAX_BYTES); e = pv) {
        pv = e->prev;
        if (e->refs) continue;
        unlink_entry(gc, e);
        gc->n--;
        gc->bytes -= e->bytes;
        gc->evictions++;
        e->next = dead;
        dead = e;
    }
    return dead;
}

static void free_list(struct grammar_cache_entry *e) {
    for (struct grammar_cache_entry *nx; e; e = nx) {
        nx = e->next;
        entry_free(e);
    }
}

/* ---- acquire / release ---- */

static int ensure_vocab(struct grammar_cache *gc, char *err, size_t errlen) {
    pthread_mutex_lock(&gc->mu);
    bool have = gc->vocab != NULL;
    pthread_mutex_unlock(&gc->mu);
    if (have) return 0;
    int rc = 0;
    pthread_mutex_lock(&gc->build_mu);
    pthread_mutex_lock(&gc->mu);
    have = gc->vocab != NULL;
    pthread_mutex_unlock(&gc->mu);
    if (!have) {
        struct token_mask_vocab *v = NULL;
        char msg[200] = "";
        rc = token_mask_vocab_build(&v, gc->tok, gc->n_vocab, msg, sizeof msg);
        if (rc && err && errlen) snprintf(err, errlen, "the vocabulary cannot be used for structured output: %s", msg);
        pthread_mutex_lock(&gc->mu);
        gc->vocab = v;
        pthread_mutex_unlock(&gc->mu);
    }
    pthread_mutex_unlock(&gc->build_mu);
    return rc;
}

/* Compiles spec; a grammar whose very start is over the run-time limits (an anyOf of more
 * alternatives than may be alive at once) is refused here, with the compile errors. */
static int compile(const struct engine_grammar *sp, struct grammar **g, char *err, size_t errlen) {
    const char *schema = sp->kind == ENGINE_GRAMMAR_JSON_SCHEMA ? sp->schema : NULL;
    if (sp->kind == ENGINE_GRAMMAR_JSON_SCHEMA && !schema) {
        if (err && errlen) snprintf(err, errlen, "no schema");
        return GRAMMAR_ERR_INVALID;
    }
    int rc = grammar_compile_wrapped(g, schema, schema ? strlen(schema) : 0, sp->wrapped ? &sp->wrap : NULL, NULL, err,
                                     errlen);
    struct grammar_state *s = NULL;
    if (!rc && (rc = grammar_state_init(&s, *g)) != 0) {
        if (rc == GRAMMAR_ERR_LIMIT && err && errlen)
            snprintf(err, errlen, "the schema starts with more alternatives than may be alive at once (anyOf, enum "
                                  "and type lists together; at most 1024)");
        grammar_free(*g);
        *g = NULL;
    }
    grammar_state_free(s);
    return rc;
}

int grammar_cache_acquire(struct grammar_cache *gc, const struct engine_grammar *sp, struct grammar_cache_entry **out,
                          char *err, size_t errlen) {
    *out = NULL;
    if (sp->kind != ENGINE_GRAMMAR_JSON_OBJECT && sp->kind != ENGINE_GRAMMAR_JSON_SCHEMA) {
        if (err && errlen) snprintf(err, errlen, "unknown grammar kind %d", (int)sp->kind);
        return GRAMMAR_ERR_INVALID;
    }
    int rc = ensure_vocab(gc, err, errlen);
    if (rc) return rc;
    size_t n = key_build(sp, NULL);
    char *key = malloc(n + 1);
    if (!key) return GRAMMAR_ERR_NOMEM;
    key_build(sp, key);
    uint64_t h = hash_bytes(key, n);

    pthread_mutex_lock(&gc->mu);
    struct grammar_cache_entry *e = find(gc, key, n, h);
    if (e) {
        e->refs++;
        gc->hits++;
        unlink_entry(gc, e);
        push_front(gc, e);
        pthread_mutex_unlock(&gc->mu);
        free(key);
        *out = e;
        return 0;
    }
    gc->misses++;
    pthread_mutex_unlock(&gc->mu);

    /* a miss: compile outside the lock (another thread may compile the same text meanwhile; the
     * first to insert wins) */
    struct grammar *g = NULL;
    rc = compile(sp, &g, err, errlen);
    struct grammar_cache_entry *made = rc ? NULL : calloc(1, sizeof *made);
    if (!made) {
        grammar_free(g);
        free(key);
        if (!rc && err && errlen) snprintf(err, errlen, "out of memory");
        return rc ? rc : GRAMMAR_ERR_NOMEM;
    }
    made->key = key;
    made->key_len = n;
    made->hash = h;
    made->g = g;
    made->bytes = grammar_memory(g) + n + sizeof *made;
    made->refs = 1;
    pthread_mutex_lock(&gc->mu);
    e = find(gc, key, n, h);
    struct grammar_cache_entry *dead = NULL;
    if (e) {
        e->refs++;
        unlink_entry(gc, e);
        push_front(gc, e);
    } else {
        push_front(gc, made);
        gc->n++;
        gc->bytes += made->bytes;
        dead = evict(gc);
        e = made;
        made = NULL;
    }
    pthread_mutex_unlock(&gc->mu);
    if (made) entry_free(made);
    free_list(dead);
    *out = e;
    return 0;
}

void grammar_cache_release(struct grammar_cache *gc, struct grammar_cache_entry *e) {
    if (!e) return;
    pthread_mutex_lock(&gc->mu);
    e->refs--;
    struct grammar_cache_entry *dead = e->refs == 0 ? evict(gc) : NULL;
    pthread_mutex_unlock(&gc->mu);
    free_list(dead);
}

const struct grammar *grammar_cache_grammar(const struct grammar_cache_entry *e) { return e->g; }

struct token_mask *grammar_cache_mask(struct grammar_cache *gc, struct grammar_cache_entry *e) {
    if (!e->mask) {
        /* bounds per grammar; GRAMMAR_CACHE_MAX_BYTES bounds them all */
        struct token_mask_options opt = {.node_cache_bytes = (size_t)64 << 20, .state_cache_bytes = (size_t)8 << 20};
        if (token_mask_init(&e->mask, e->g, gc->vocab, &opt) != 0) return NULL;
    }
    grammar_cache_measure(gc, e);
    return e->mask;
}

void grammar_cache_measure(struct grammar_cache *gc, struct grammar_cache_entry *e) {
    size_t now = grammar_memory(e->g) + e->key_len + sizeof *e + (e->mask ? token_mask_memory(e->mask) : 0);
    pthread_mutex_lock(&gc->mu);
    gc->bytes = gc->bytes - e->bytes + now;
    e->bytes = now;
    pthread_mutex_unlock(&gc->mu);
}

size_t grammar_cache_mask_words(const struct grammar_cache *gc) { return token_mask_words(gc->vocab); }

void grammar_cache_stats(struct grammar_cache *gc, struct grammar_cache_stats *st) {
    pthread_mutex_lock(&gc->mu);
    *st = (struct grammar_cache_stats){.entries = gc->n, .bytes = gc->bytes, .hits = gc->hits, .misses = gc->misses,
                                       .evictions = gc->evictions};
    pthread_mutex_unlock(&gc->mu);
}
