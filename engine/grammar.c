/* The automaton: builder (gb_*), trimming and checks, packing, run time (gr_*) and the state API.
 * The JSON Schema compiler that drives the builder is engine/json_schema.c. */
#include "engine/grammar_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *grammar_strerror(int status) {
    switch (status) {
    case GRAMMAR_OK: return "ok";
    case GRAMMAR_ERR_NOMEM: return "out of memory";
    case GRAMMAR_ERR_JSON: return "schema is not valid JSON";
    case GRAMMAR_ERR_UNSUPPORTED: return "unsupported schema";
    case GRAMMAR_ERR_INVALID: return "invalid schema";
    case GRAMMAR_ERR_LIMIT: return "grammar limit exceeded";
    case GRAMMAR_REJECT: return "text rejected by the grammar";
    default: return "unknown grammar status";
    }
}

/* ---- builder ---------------------------------------------------------------------------- */

/* gb_lit's trie edges: (from, byte) -> node, open addressing. */
struct gb_lit_map {
    uint64_t *key; // from << 8 | byte, +1 (0 = empty)
    int32_t *val;
    size_t cap, n;
};

static struct gb_lit_map *lit_map(struct gb *b);

void gb_init(struct gb *b, const struct grammar_options *opt, char *err, size_t errlen) {
    memset(b, 0, sizeof *b);
    b->max_nodes = opt->max_nodes;
    b->err = err;
    b->errlen = errlen;
    if (err && errlen) err[0] = 0;
}

void gb_free(struct gb *b) {
    if (!b) return;
    struct gb_lit_map *m = lit_map(b);
    if (m) {
        free(m->key);
        free(m->val);
        free(m);
    }
    free(b->e);
    free(b->nodes);
    free(b->rule_start);
    memset(b, 0, sizeof *b);
}

int gb_fail(struct gb *b, int status, const char *fmt, ...) {
    if (b->status) return b->status;
    b->status = status;
    if (b->err && b->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(b->err, b->errlen, fmt, ap);
        va_end(ap);
    }
    return status;
}

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) return -1;
    *p = q;
    *cap = c;
    return 0;
}

/* The size budget: nodes plus a quarter of the edges. */
static bool over_budget(struct gb *b) {
    if (b->n_nodes + b->n_e / 4 <= b->max_nodes) return false;
    gb_fail(b, GRAMMAR_ERR_LIMIT, "the schema needs a grammar larger than %zu nodes (large maxLength, maxItems, "
            "enum or deep $ref expansion)", b->max_nodes);
    return true;
}

int32_t gb_node(struct gb *b, int32_t rule) {
    if (b->status || rule < 0 || over_budget(b)) return -1;
    if (grow((void **)&b->nodes, &b->cap_nodes, b->n_nodes + 1, sizeof *b->nodes)) {
        gb_fail(b, GRAMMAR_ERR_NOMEM, "out of memory compiling the schema");
        return -1;
    }
    b->nodes[b->n_nodes] = (struct gb_ninfo){rule, 0};
    return (int32_t)b->n_nodes++;
}

int32_t gb_rule(struct gb *b) {
    if (b->status) return -1;
    if (grow((void **)&b->rule_start, &b->cap_rules, b->n_rules + 1, sizeof *b->rule_start)) {
        gb_fail(b, GRAMMAR_ERR_NOMEM, "out of memory compiling the schema");
        return -1;
    }
    int32_t r = (int32_t)b->n_rules++;
    b->rule_start[r] = gb_node(b, r);
    return b->status ? -1 : r;
}

int32_t gb_start(const struct gb *b, int32_t rule) { return rule >= 0 ? b->rule_start[rule] : -1; }

void gb_final(struct gb *b, int32_t node) {
    if (!b->status && node >= 0) b->nodes[node].final = 1;
}

static void add_edge(struct gb *b, int32_t from, int32_t to, int32_t rule, uint8_t lo, uint8_t hi) {
    if (b->status || from < 0 || to < 0 || over_budget(b)) return;
    if (grow((void **)&b->e, &b->cap_e, b->n_e + 1, sizeof *b->e)) {
        gb_fail(b, GRAMMAR_ERR_NOMEM, "out of memory compiling the schema");
        return;
    }
    b->e[b->n_e++] = (struct gb_edge){from, to, rule, lo, hi};
}

void gb_bytes(struct gb *b, int32_t from, uint8_t lo, uint8_t hi, int32_t to) { add_edge(b, from, to, -2, lo, hi); }
void gb_eps(struct gb *b, int32_t from, int32_t to) { add_edge(b, from, to, -1, 0, 0); }
void gb_call(struct gb *b, int32_t from, int32_t rule, int32_t to) {
    if (rule >= 0) add_edge(b, from, to, rule, 0, 0);
}

static struct gb_lit_map *lit_map(struct gb *b) { return (struct gb_lit_map *)b->lit; }

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static int32_t *lit_slot(struct gb *b, int32_t from, uint8_t byte, bool *found) {
    struct gb_lit_map *m = lit_map(b);
    if (!m) {
        m = calloc(1, sizeof *m);
        if (!m) return NULL;
        b->lit = m;
    }
    if ((m->n + 1) * 2 > m->cap) { /* rehash at half full */
        size_t nc = m->cap ? m->cap * 2 : 256;
        uint64_t *k = calloc(nc, sizeof *k);
        int32_t *v = malloc(nc * sizeof *v);
        if (!k || !v) {
            free(k);
            free(v);
            return NULL;
        }
        for (size_t i = 0; i < m->cap; i++) {
            if (!m->key[i]) continue;
            size_t j = mix64(m->key[i]) & (nc - 1);
            while (k[j]) j = (j + 1) & (nc - 1);
            k[j] = m->key[i];
            v[j] = m->val[i];
        }
        free(m->key);
        free(m->val);
        m->key = k;
        m->val = v;
        m->cap = nc;
    }
    uint64_t key = ((uint64_t)(uint32_t)from << 8 | byte) + 1;
    size_t j = mix64(key) & (m->cap - 1);
    while (m->key[j] && m->key[j] != key) j = (j + 1) & (m->cap - 1);
    *found = m->key[j] != 0;
    if (!*found) {
        m->key[j] = key;
        m->n++;
    }
    return &m->val[j];
}

int32_t gb_lit(struct gb *b, int32_t from, const char *s, size_t n) {
    int32_t cur = from;
    for (size_t i = 0; i < n && cur >= 0; i++) {
        uint8_t c = (uint8_t)s[i];
        bool found;
        int32_t *slot = lit_slot(b, cur, c, &found);
        if (!slot) {
            gb_fail(b, GRAMMAR_ERR_NOMEM, "out of memory compiling the schema");
            return -1;
        }
        if (!found) { /* gb_node does not touch the map: slot stays valid */
            *slot = gb_node(b, b->nodes[cur].rule);
            gb_bytes(b, cur, c, c, *slot);
        }
        cur = *slot;
    }
    return b->status ? -1 : cur;
}

/* ---- finishing: trim, checks, packing --------------------------------------------------- */

/* Edge indices grouped by a key (counting sort): idx[off[k] .. off[k + 1]). */
static int group_edges(const struct gb *b, size_t n_keys, int which, uint32_t **off_out, uint32_t **idx_out) {
    uint32_t *off = calloc(n_keys + 1, sizeof *off), *idx = malloc((b->n_e + 1) * sizeof *idx);
    if (!off || !idx) {
        free(off);
        free(idx);
        return -1;
    }
    /* which: 0 by target node, 1 by called rule (call edges only), 2 by source node */
#define GROUP_KEY(ed) (which == 0 ? (ed)->to : which == 1 ? (ed)->rule : (ed)->from)
    for (size_t i = 0; i < b->n_e; i++) {
        const struct gb_edge *ed = &b->e[i];
        if (which == 1 && ed->rule < 0) continue;
        off[GROUP_KEY(ed) + 1]++;
    }
    for (size_t k = 0; k < n_keys; k++) off[k + 1] += off[k];
    uint32_t *pos = malloc((n_keys + 1) * sizeof *pos);
    if (!pos) {
        free(off);
        free(idx);
        return -1;
    }
    memcpy(pos, off, (n_keys + 1) * sizeof *pos);
    for (size_t i = 0; i < b->n_e; i++) {
        const struct gb_edge *ed = &b->e[i];
        if (which == 1 && ed->rule < 0) continue;
        idx[pos[GROUP_KEY(ed)]++] = (uint32_t)i;
    }
#undef GROUP_KEY
    free(pos);
    *off_out = off;
    *idx_out = idx;
    return 0;
}

/* Marks nodes that can reach their rule's end: live[n]. With only_eps, through eps edges and calls
 * of rules marked in ok[] (nullable rules) only; else through every edge. ok[r] is set for rules
 * whose start gets marked. keep[e] (may be NULL) limits the edges used. */
static void mark_live(const struct gb *b, const uint32_t *roff, const uint32_t *ridx, const uint32_t *coff,
                      const uint32_t *cidx, const uint8_t *keep, bool only_eps, uint8_t *live, uint8_t *ok,
                      int32_t *stack) {
    size_t sp = 0;
    for (size_t n = 0; n < b->n_nodes; n++)
        if (b->nodes[n].final) live[n] = 1, stack[sp++] = (int32_t)n;
    while (sp) {
        int32_t n = stack[--sp];
        for (uint32_t k = roff[n]; k < roff[n + 1]; k++) {
            const struct gb_edge *ed = &b->e[ridx[k]];
            if (keep && !keep[ridx[k]]) continue;
            if (only_eps && ed->rule == -2) continue;
            if (ed->rule >= 0 && !ok[ed->rule]) continue;
            if (!live[ed->from]) live[ed->from] = 1, stack[sp++] = ed->from;
        }
        int32_t r = b->nodes[n].rule;
        if (b->rule_start[r] != n || ok[r]) continue;
        ok[r] = 1;
        for (uint32_t k = coff[r]; k < coff[r + 1]; k++) {
            const struct gb_edge *ed = &b->e[cidx[k]];
            if (keep && !keep[cidx[k]]) continue;
            if (live[ed->to] && !live[ed->from]) live[ed->from] = 1, stack[sp++] = ed->from;
        }
    }
}

/* True when some node's closure (eps edges, calls, returns from nullable calls) loops: a rule
 * that reaches itself without consuming a byte. Iterative DFS over the kept edges by source. */
static bool closure_has_cycle(const struct gb *b, const uint32_t *foff, const uint32_t *fidx, const uint8_t *keep,
                              const uint8_t *nullable, uint8_t *color, int32_t *stack, uint32_t *iter) {
    for (size_t s = 0; s < b->n_nodes; s++) {
        if (color[s]) continue;
        size_t sp = 0;
        stack[sp] = (int32_t)s, iter[sp++] = 0, color[s] = 1;
        while (sp) {
            int32_t n = stack[sp - 1];
            uint32_t k = foff[n] + iter[sp - 1] / 2, half = iter[sp - 1] % 2;
            if (k >= foff[n + 1]) {
                color[n] = 2;
                sp--;
                continue;
            }
            iter[sp - 1]++;
            const struct gb_edge *ed = &b->e[fidx[k]];
            if (!keep[fidx[k]] || ed->rule == -2) continue;
            int32_t t;
            if (ed->rule == -1) {
                if (half) continue;
                t = ed->to;
            } else {
                if (half && !nullable[ed->rule]) continue;
                t = half ? ed->to : b->rule_start[ed->rule];
            }
            if (color[t] == 1) return true;
            if (color[t] == 0) stack[sp] = t, iter[sp++] = 0, color[t] = 1;
        }
    }
    return false;
}

static int cmp_bedge(const void *a, const void *b) {
    const struct gr_byte_edge *x = a, *y = b;
    return (int)x->lo - (int)y->lo;
}

/* Packs the kept edges into the automaton's arrays. */
static int pack(struct gb *b, const uint32_t *foff, const uint32_t *fidx, const uint8_t *keep, struct grammar *g) {
    size_t N = b->n_nodes, nbe = 0, nxe = 0;
    for (size_t i = 0; i < b->n_e; i++)
        if (keep[i]) *(b->e[i].rule == -2 ? &nbe : &nxe) += 1;
    g->n_nodes = (int32_t)N;
    g->n_rules = (int32_t)b->n_rules;
    g->nodes = calloc(N, sizeof *g->nodes);
    g->bedges = malloc((nbe + 1) * sizeof *g->bedges);
    g->xedges = malloc((nxe + 1) * sizeof *g->xedges);
    g->rule_start = malloc((b->n_rules + 1) * sizeof *g->rule_start);
    if (!g->nodes || !g->bedges || !g->xedges || !g->rule_start) return GRAMMAR_ERR_NOMEM;
    memcpy(g->rule_start, b->rule_start, b->n_rules * sizeof *g->rule_start);
    uint32_t be = 0, xe = 0;
    for (size_t n = 0; n < N; n++) {
        struct gr_node *nd = &g->nodes[n];
        nd->final = b->nodes[n].final;
        nd->b0 = be;
        nd->x0 = xe;
        for (uint32_t k = foff[n]; k < foff[n + 1]; k++) {
            const struct gb_edge *ed = &b->e[fidx[k]];
            if (!keep[fidx[k]]) continue;
            if (ed->rule == -2) g->bedges[be++] = (struct gr_byte_edge){ed->lo, ed->hi, ed->to};
            else g->xedges[xe++] = (struct gr_x_edge){ed->to, ed->rule};
        }
        if (be - nd->b0 > UINT16_MAX || xe - nd->x0 > UINT16_MAX)
            return gb_fail(b, GRAMMAR_ERR_LIMIT, "the schema has more than %d alternatives at one point", UINT16_MAX);
        nd->nb = (uint16_t)(be - nd->b0);
        nd->nx = (uint16_t)(xe - nd->x0);
        qsort(g->bedges + nd->b0, nd->nb, sizeof *g->bedges, cmp_bedge);
    }
    g->bytes = sizeof *g + N * sizeof *g->nodes + nbe * sizeof *g->bedges + nxe * sizeof *g->xedges +
               b->n_rules * sizeof *g->rule_start;
    return 0;
}

int gb_finish(struct gb *b, int32_t root, const struct grammar_options *opt, struct grammar **out) {
    *out = NULL;
    if (b->status) return b->status;
    size_t N = b->n_nodes, R = b->n_rules, E = b->n_e;
    uint32_t *roff = NULL, *ridx = NULL, *coff = NULL, *cidx = NULL, *foff = NULL, *fidx = NULL, *iter = NULL;
    uint8_t *live = calloc(N, 1), *prod = calloc(R, 1), *keep = calloc(E + 1, 1), *nz = calloc(N, 1),
            *nullable = calloc(R, 1), *color = calloc(N, 1);
    int32_t *stack = malloc((N + 1) * sizeof *stack);
    iter = malloc((N + 1) * sizeof *iter);
    struct grammar *g = calloc(1, sizeof *g);
    int rc = GRAMMAR_ERR_NOMEM;
    if (!live || !prod || !keep || !nz || !nullable || !color || !stack || !iter || !g ||
        group_edges(b, N, 0, &roff, &ridx) || group_edges(b, R, 1, &coff, &cidx) || group_edges(b, N, 2, &foff, &fidx)) {
        gb_fail(b, rc, "out of memory compiling the schema");
        goto done;
    }
    /* 1. trim: keep edges between nodes that can still reach their rule's end */
    mark_live(b, roff, ridx, coff, cidx, NULL, false, live, prod, stack);
    if (!prod[root]) {
        rc = gb_fail(b, GRAMMAR_ERR_INVALID, "the schema accepts no JSON value (unsatisfiable constraints)");
        goto done;
    }
    for (size_t i = 0; i < E; i++) {
        const struct gb_edge *ed = &b->e[i];
        keep[i] = live[ed->from] && live[ed->to] && (ed->rule < 0 || prod[ed->rule]);
    }
    /* 2. no rule may reach itself without consuming a byte (the closure must terminate) */
    mark_live(b, roff, ridx, coff, cidx, keep, true, nz, nullable, stack);
    if (closure_has_cycle(b, foff, fidx, keep, nullable, color, stack, iter)) {
        rc = gb_fail(b, GRAMMAR_ERR_INVALID, "the schema refers to itself ($ref, anyOf) without an object or "
                     "array in between, so it never ends");
        goto done;
    }
    /* 3. pack */
    rc = pack(b, foff, fidx, keep, g);
    if (rc) {
        gb_fail(b, rc, "out of memory compiling the schema");
        goto done;
    }
    g->root = root;
    g->max_stack = opt->max_stack;
    g->max_alternatives = opt->max_alternatives;
    *out = g;
    g = NULL;
done:
    grammar_free(g);
    free(live), free(prod), free(keep), free(nz), free(nullable), free(color), free(stack), free(iter);
    free(roff), free(ridx), free(coff), free(cidx), free(foff), free(fidx);
    return *out ? 0 : b->status ? b->status : rc;
}

void grammar_free(struct grammar *g) {
    if (!g) return;
    free(g->nodes);
    free(g->bedges);
    free(g->xedges);
    free(g->rule_start);
    free(g);
}

size_t grammar_num_nodes(const struct grammar *g) { return (size_t)g->n_nodes; }
size_t grammar_memory(const struct grammar *g) { return g->bytes; }

/* ---- run time --------------------------------------------------------------------------- */

void gr_run_init(struct gr_run *r, const struct grammar *g) { *r = (struct gr_run){.g = g}; }

void gr_run_free(struct gr_run *r) {
    if (!r) return;
    free(r->f);
    free(r->c);
    r->f = NULL;
    r->c = NULL;
    r->nf = r->capf = r->nc = r->capc = 0;
}

int gr_run_reserve(struct gr_run *r, uint32_t frames, uint32_t configs) {
    if (r->nf + frames > r->capf) {
        uint32_t c = r->capf ? r->capf : 256;
        while (c < r->nf + frames) c *= 2;
        struct gr_frame *f = realloc(r->f, (size_t)c * sizeof *f);
        if (!f) return r->status = GRAMMAR_ERR_NOMEM;
        r->f = f;
        r->capf = c;
    }
    if (r->nc + configs > r->capc) {
        uint32_t c = r->capc ? r->capc : 64;
        while (c < r->nc + configs) c *= 2;
        int32_t *p = realloc(r->c, (size_t)c * sizeof *p);
        if (!p) return r->status = GRAMMAR_ERR_NOMEM;
        r->c = p;
        r->capc = c;
    }
    return 0;
}

static int32_t push_frame(struct gr_run *r, int32_t node, int32_t parent) {
    if (r->nf == r->capf && gr_run_reserve(r, 1, 0)) return -1;
    int32_t depth = parent >= 0 ? r->f[parent].depth + 1 : 0;
    if (depth > r->max_depth) r->max_depth = depth;
    r->f[r->nf] = (struct gr_frame){node, parent, depth};
    return (int32_t)r->nf++;
}

/* Whether the stacks below frames p and q hold the same nodes. */
static bool same_stack(const struct gr_frame *f, int32_t p, int32_t q) {
    while (p != q) {
        if (p < 0 || q < 0 || f[p].node != f[q].node || f[p].depth != f[q].depth) return false;
        p = f[p].parent;
        q = f[q].parent;
    }
    return true;
}

/* Adds the configuration (node, parent) to the level at lvl unless it is there; frame is an
 * existing frame holding exactly it, or -1. */
static int add_config(struct gr_run *r, uint32_t lvl, int32_t node, int32_t parent, int32_t frame) {
    for (uint32_t i = lvl; i < r->nc; i++) {
        const struct gr_frame *x = &r->f[r->c[i]];
        if (x->node == node && same_stack(r->f, x->parent, parent)) return 0;
    }
    if (r->nc - lvl >= (uint32_t)r->g->max_alternatives) return r->status = GRAMMAR_ERR_LIMIT;
    if (frame < 0 && (frame = push_frame(r, node, parent)) < 0) return r->status;
    if (r->nc == r->capc && gr_run_reserve(r, 0, 1)) return r->status;
    r->c[r->nc++] = frame;
    return 0;
}

int gr_expand(struct gr_run *r, uint32_t lvl, int32_t node, int32_t parent, unsigned *flags) {
    const struct grammar *g = r->g;
    const struct gr_node *nd = &g->nodes[node];
    if (nd->nb && add_config(r, lvl, node, parent, -1)) return r->status;
    for (uint32_t k = nd->x0; k < nd->x0 + nd->nx; k++) {
        const struct gr_x_edge *x = &g->xedges[k];
        if (x->rule < 0) {
            if (gr_expand(r, lvl, x->to, parent, flags)) return r->status;
            continue;
        }
        /* a call deeper than max_stack is a dead branch: output nests at most that deep */
        if (parent >= 0 && r->f[parent].depth + 1 >= g->max_stack) continue;
        int32_t ret = push_frame(r, x->to, parent);
        if (ret < 0 || gr_expand(r, lvl, g->rule_start[x->rule], ret, flags)) return r->status;
    }
    if (nd->final) {
        if (parent == GR_ROOT) *flags |= GR_ACCEPT;
        else if (parent == GR_BASE) *flags |= GR_BASE_END;
        else if (gr_expand(r, lvl, r->f[parent].node, r->f[parent].parent, flags)) return r->status;
    }
    return 0;
}

unsigned gr_step(struct gr_run *r, uint32_t b, uint32_t e, uint8_t byte) {
    const struct grammar *g = r->g;
    uint32_t lvl = r->nc;
    unsigned flags = 0;
    for (uint32_t i = b; i < e && !r->status; i++) {
        int32_t ci = r->c[i], node = r->f[ci].node, parent = r->f[ci].parent;
        const struct gr_node *nd = &g->nodes[node];
        for (uint32_t k = nd->b0; k < nd->b0 + nd->nb; k++) {
            const struct gr_byte_edge *be = &g->bedges[k];
            if (byte < be->lo) break; /* sorted by lo */
            if (byte > be->hi) continue;
            const struct gr_node *tn = &g->nodes[be->to];
            if (!tn->nx && !tn->final) /* a plain node: no closure; a self loop reuses the frame */
                add_config(r, lvl, be->to, parent, be->to == node ? ci : -1);
            else
                gr_expand(r, lvl, be->to, parent, &flags);
            if (r->status) break;
        }
    }
    return flags;
}

/* ---- states ----------------------------------------------------------------------------- */

struct grammar_state {
    struct gr_run r;  // configurations: c[0..nc)
    unsigned flags;   // GR_ACCEPT
    uint32_t gc_live; // frames alive after the last compaction
};

const struct gr_run *gr_state_run(const struct grammar_state *s, unsigned *flags) {
    *flags = s->flags;
    return &s->r;
}

int grammar_state_init(struct grammar_state **out, const struct grammar *g) {
    *out = NULL;
    struct grammar_state *s = calloc(1, sizeof *s);
    if (!s) return GRAMMAR_ERR_NOMEM;
    gr_run_init(&s->r, g);
    if (gr_expand(&s->r, 0, g->rule_start[g->root], GR_ROOT, &s->flags)) {
        int rc = s->r.status;
        grammar_state_free(s);
        return rc;
    }
    *out = s;
    return 0;
}

int grammar_state_clone(struct grammar_state **out, const struct grammar_state *s) {
    *out = NULL;
    struct grammar_state *t = calloc(1, sizeof *t);
    if (!t) return GRAMMAR_ERR_NOMEM;
    gr_run_init(&t->r, s->r.g);
    if (gr_run_reserve(&t->r, s->r.nf, s->r.nc)) {
        grammar_state_free(t);
        return GRAMMAR_ERR_NOMEM;
    }
    if (s->r.nf) memcpy(t->r.f, s->r.f, s->r.nf * sizeof *t->r.f);
    if (s->r.nc) memcpy(t->r.c, s->r.c, s->r.nc * sizeof *t->r.c);
    t->r.nf = s->r.nf;
    t->r.nc = s->r.nc;
    t->flags = s->flags;
    t->gc_live = s->gc_live;
    *out = t;
    return 0;
}

void grammar_state_free(struct grammar_state *s) {
    if (!s) return;
    gr_run_free(&s->r);
    free(s);
}

/* Drops frames no live stack uses; frames keep their order, so parents stay below children. */
static void compact(struct grammar_state *s) {
    struct gr_run *r = &s->r;
    int32_t *map = malloc((size_t)r->nf * sizeof *map);
    if (!map) return; /* compaction is an optimisation */
    for (uint32_t i = 0; i < r->nf; i++) map[i] = -1;
    for (uint32_t i = 0; i < r->nc; i++)
        for (int32_t p = r->c[i]; p >= 0 && map[p] == -1; p = r->f[p].parent) map[p] = 0;
    uint32_t n = 0;
    for (uint32_t i = 0; i < r->nf; i++) {
        if (map[i] < 0) continue;
        struct gr_frame fr = r->f[i];
        if (fr.parent >= 0) fr.parent = map[fr.parent];
        map[i] = (int32_t)n;
        r->f[n++] = fr;
    }
    for (uint32_t i = 0; i < r->nc; i++) r->c[i] = map[r->c[i]];
    r->nf = n;
    s->gc_live = n;
    free(map);
}

static int advance(struct grammar_state *s, const uint8_t *p, size_t n, bool commit) {
    struct gr_run *r = &s->r;
    uint32_t nf0 = r->nf, nc0 = r->nc, b = 0, e = r->nc;
    unsigned flags = s->flags;
    for (size_t i = 0; i < n; i++) {
        if (b == e) { /* nothing may follow */
            r->status = GRAMMAR_REJECT;
            break;
        }
        flags = gr_step(r, b, e, p[i]);
        if (r->status) break;
        b = e;
        e = r->nc;
        if (b == e && !(flags & GR_ACCEPT)) {
            r->status = GRAMMAR_REJECT;
            break;
        }
    }
    int rc = r->status;
    r->status = 0;
    if (rc || !commit || !n) {
        r->nf = nf0;
        r->nc = nc0;
        return rc;
    }
    if (e > b) memmove(r->c, r->c + b, (size_t)(e - b) * sizeof *r->c);
    r->nc = e - b;
    s->flags = flags;
    if (r->nf > 2 * s->gc_live + 4096) compact(s);
    return 0;
}

int grammar_state_advance(struct grammar_state *s, const void *bytes, size_t n) {
    return advance(s, bytes, n, true);
}

bool grammar_state_try(struct grammar_state *s, const void *bytes, size_t n) {
    return advance(s, bytes, n, false) == 0;
}

bool grammar_state_accepting(const struct grammar_state *s) { return s->flags & GR_ACCEPT; }
bool grammar_state_can_continue(const struct grammar_state *s) { return s->r.nc > 0; }
const struct grammar *grammar_state_grammar(const struct grammar_state *s) { return s->r.g; }
