/* grammar internals shared by grammar.c (automaton, builder, run time), json_schema.c (the
 * schema compiler) and token_mask.c (masks). Not for other modules. */
#ifndef DUO_GRAMMAR_IMPL_H
#define DUO_GRAMMAR_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/grammar.h"

/* ---- the compiled automaton ------------------------------------------------------------- */

struct gr_byte_edge {
    uint8_t lo, hi; // bytes [lo, hi]
    int32_t to;
};

struct gr_x_edge {
    int32_t to;   // eps: the next node; call: the return node
    int32_t rule; // called rule, or -1 for an eps edge
};

struct gr_node {
    uint32_t b0, x0;  // first byte edge, first eps/call edge
    uint16_t nb, nx;  // counts (a node has at most 65535 of each)
    uint8_t final;    // the node's rule may end here
};

struct grammar {
    int32_t n_nodes, n_rules;
    struct gr_node *nodes;       // [n_nodes]
    struct gr_byte_edge *bedges; // byte edges of every node, by node, sorted by lo
    struct gr_x_edge *xedges;    // eps and call edges of every node, by node
    int32_t *rule_start;         // [n_rules] start node of each rule
    int32_t root;                // the rule of the whole text
    int max_stack, max_alternatives;
    size_t bytes;                // memory held
};

/* ---- the builder ------------------------------------------------------------------------ */

struct gb_edge {
    int32_t from, to, rule; // rule: called rule, -1 eps, -2 byte edge [lo, hi]
    uint8_t lo, hi;
};

/* Builds rules node by node. Errors are sticky: after one, calls do nothing (node ids come back
 * -1) and gb_finish reports it, so construction code need not check every call. */
struct gb {
    struct gb_edge *e;
    size_t n_e, cap_e;
    struct gb_ninfo {
        int32_t rule; // the rule the node belongs to
        uint8_t final;
    } *nodes;
    size_t n_nodes, cap_nodes;
    int32_t *rule_start;
    size_t n_rules, cap_rules;
    size_t max_nodes; // nodes + edges / 4
    void *lit;        // gb_lit's (node, byte) -> node map
    int status;
    char *err;
    size_t errlen;
};

void gb_init(struct gb *b, const struct grammar_options *opt, char *err, size_t errlen);
void gb_free(struct gb *b);
/* Records an error (the first one wins); returns status. */
int gb_fail(struct gb *b, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* A new rule with its start node; returns the rule id (its start node: gb_start). */
int32_t gb_rule(struct gb *b);
int32_t gb_start(const struct gb *b, int32_t rule);
/* A new node of the rule `rule`. */
int32_t gb_node(struct gb *b, int32_t rule);
void gb_final(struct gb *b, int32_t node);
void gb_bytes(struct gb *b, int32_t from, uint8_t lo, uint8_t hi, int32_t to);
void gb_eps(struct gb *b, int32_t from, int32_t to);
void gb_call(struct gb *b, int32_t from, int32_t rule, int32_t to);
/* Nodes for the bytes s[0..n) after `from`, shared with literals already added from `from`
 * through gb_lit (a trie), so enums stay deterministic; returns the end node. */
int32_t gb_lit(struct gb *b, int32_t from, const char *s, size_t n);
/* Trims nodes that cannot reach their rule's end, checks for rules that call themselves without
 * consuming a byte, and packs the automaton of root rule `root`. Frees nothing of b. */
int gb_finish(struct gb *b, int32_t root, const struct grammar_options *opt, struct grammar **out);

/* ---- lexical pieces (grammar_lex.c) ----------------------------------------------------- */

#define GR_DEC_MAX 400 /* digits of a bound: 1e308 and 5e-324 written out fit */
/* A decimal written out: integer digits without leading zeros ("0" for none), fraction digits
 * without trailing zeros. */
struct gr_dec {
    bool neg;
    int ni, nf;
    char i[GR_DEC_MAX], f[GR_DEC_MAX];
};

/* The shortest decimal that reads back as v (finite); -1 when it needs too many digits. */
int gr_dec_from_double(struct gr_dec *d, double v);
/* Edges from -> to consuming one character of a JSON string: a UTF-8 scalar other than '"', '\\'
 * and controls, or an escape (\uXXXX surrogates only as a high-low pair, one character). */
void gb_string_char(struct gb *b, int32_t from, int32_t to);
/* A JSON number (integer: no fraction or exponent) in [lo, hi] (either may be NULL) from `from`
 * to `to`, at most 20 integer and fraction digits unless a bound needs more; only numbers without
 * bounds have an exponent ([eE][+-]?[0-9]{1,2}). */
void gb_number(struct gb *b, int32_t from, int32_t to, const struct gr_dec *lo, const struct gr_dec *hi, bool integer);

/* ---- run time: stacks as frames, states as sets of top frames ---------------------------- */

/* A frame: a node and the frame below it. Frames are immutable once made, so stacks share their
 * lower parts; a parent always has a smaller index than its children. */
struct gr_frame {
    int32_t node;
    int32_t parent; // frame index, or GR_ROOT / GR_BASE
    int32_t depth;  // frames below this one
};

#define GR_ROOT (-1) // below the root rule: its end is the end of the text
#define GR_BASE (-2) // below a mask-cache walk's first frame: its end depends on the context

/* Flags a step reports. */
#define GR_ACCEPT 1u   // the root rule ended: the text may end here
#define GR_BASE_END 2u // a GR_BASE frame's rule ended (mask-cache walks only)

/* Frames and configurations (top frames of live stacks, each at a node with byte edges). Levels
 * of configurations are ranges [begin, end) of c; every allocation is a push, so a walk undoes
 * work by truncating nf and nc. */
struct gr_run {
    const struct grammar *g;
    struct gr_frame *f;
    uint32_t nf, capf;
    int32_t *c;
    uint32_t nc, capc;
    int32_t max_depth; // deepest frame pushed since the caller last reset it
    int status;        // sticky GRAMMAR_ERR_NOMEM / GRAMMAR_ERR_LIMIT
};

void gr_run_init(struct gr_run *r, const struct grammar *g);
void gr_run_free(struct gr_run *r);
/* Makes room for n more frames and configurations; 0 or GRAMMAR_ERR_NOMEM. */
int gr_run_reserve(struct gr_run *r, uint32_t frames, uint32_t configs);
/* Appends to the level starting at lvl the configurations the closure of (node, parent) reaches;
 * ORs GR_ACCEPT / GR_BASE_END into *flags. 0, or the run's error status. */
int gr_expand(struct gr_run *r, uint32_t lvl, int32_t node, int32_t parent, unsigned *flags);
/* The configurations byte leads to from those in c[b..e), appended as a new level at r->nc;
 * returns the flags; r->status says whether an error cut it short. */
unsigned gr_step(struct gr_run *r, uint32_t b, uint32_t e, uint8_t byte);

/* The state's run: its configurations are c[0..nc), its flags in *flags. */
const struct gr_run *gr_state_run(const struct grammar_state *s, unsigned *flags);

#endif
