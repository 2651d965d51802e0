/* Byte-level pieces the schema compiler (engine/json_schema.c) puts together: one character of a
 * JSON string, and JSON numbers within decimal bounds. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/grammar_impl.h"

#define NUM_DIGITS 20 /* integer and fraction digits of a number, unless its bounds need more */

static int32_t next(struct gb *b, int32_t node) { return gb_node(b, node >= 0 ? b->nodes[node].rule : -1); }

static int32_t byte(struct gb *b, int32_t from, char c) {
    int32_t n = next(b, from);
    gb_bytes(b, from, (uint8_t)c, (uint8_t)c, n);
    return n;
}

static void hex(struct gb *b, int32_t from, int32_t to) {
    gb_bytes(b, from, '0', '9', to);
    gb_bytes(b, from, 'A', 'F', to);
    gb_bytes(b, from, 'a', 'f', to);
}

/* UTF-8 by lead byte (no overlongs, no surrogates, nothing past U+10FFFF), then the escapes. */
void gb_string_char(struct gb *b, int32_t from, int32_t to) {
    gb_bytes(b, from, 0x20, 0x21, to);
    gb_bytes(b, from, 0x23, 0x5b, to);
    gb_bytes(b, from, 0x5d, 0x7f, to);
    int32_t c1 = next(b, from), c2 = next(b, from), c3 = next(b, from);
    gb_bytes(b, c1, 0x80, 0xbf, to);
    gb_bytes(b, c2, 0x80, 0xbf, c1);
    gb_bytes(b, c3, 0x80, 0xbf, c2);
    gb_bytes(b, from, 0xc2, 0xdf, c1);
    int32_t e0 = next(b, from), ed = next(b, from), f0 = next(b, from), f4 = next(b, from);
    gb_bytes(b, from, 0xe0, 0xe0, e0);
    gb_bytes(b, e0, 0xa0, 0xbf, c1);
    gb_bytes(b, from, 0xe1, 0xec, c2);
    gb_bytes(b, from, 0xed, 0xed, ed); /* no UTF-16 surrogates in UTF-8 */
    gb_bytes(b, ed, 0x80, 0x9f, c1);
    gb_bytes(b, from, 0xee, 0xef, c2);
    gb_bytes(b, from, 0xf0, 0xf0, f0);
    gb_bytes(b, f0, 0x90, 0xbf, c2);
    gb_bytes(b, from, 0xf1, 0xf3, c3);
    gb_bytes(b, from, 0xf4, 0xf4, f4);
    gb_bytes(b, f4, 0x80, 0x8f, c2);
    /* escapes */
    int32_t esc = byte(b, from, '\\');
    static const char simple[] = "\"\\/bfnrt";
    for (const char *p = simple; *p; p++) gb_bytes(b, esc, (uint8_t)*p, (uint8_t)*p, to);
    int32_t u = byte(b, esc, 'u'), h1 = next(b, from), h2 = next(b, from), h3 = next(b, from);
    hex(b, h1, to);
    hex(b, h2, h1);
    hex(b, h3, h2);
    gb_bytes(b, u, '0', '9', h3); /* U+0000-CFFF, U+E000-FFFF */
    gb_bytes(b, u, 'A', 'C', h3);
    gb_bytes(b, u, 'a', 'c', h3);
    gb_bytes(b, u, 'E', 'F', h3);
    gb_bytes(b, u, 'e', 'f', h3);
    int32_t ud = next(b, from), hi = next(b, from);
    gb_bytes(b, u, 'D', 'D', ud);
    gb_bytes(b, u, 'd', 'd', ud);
    gb_bytes(b, ud, '0', '7', h2);   /* U+D000-D7FF */
    gb_bytes(b, ud, '8', '9', hi);   /* a high surrogate, then its low one */
    gb_bytes(b, ud, 'A', 'B', hi);
    gb_bytes(b, ud, 'a', 'b', hi);
    int32_t hi1 = next(b, from);
    hex(b, hi, hi1);
    int32_t hi2 = next(b, from);
    hex(b, hi1, hi2);
    int32_t lu = byte(b, byte(b, hi2, '\\'), 'u');
    int32_t ld = next(b, from);
    gb_bytes(b, lu, 'D', 'D', ld);
    gb_bytes(b, lu, 'd', 'd', ld);
    gb_bytes(b, ld, 'C', 'F', h2);
    gb_bytes(b, ld, 'c', 'f', h2);
}

/* ---- numbers ---------------------------------------------------------------------------- */


/* d = digits[0..nd) with the decimal point after position p (p may be <= 0 or > nd). */
static int dec_set(struct gr_dec *d, bool neg, const char *digits, int nd, int p) {
    memset(d, 0, sizeof *d);
    d->neg = neg;
    if (p > GR_DEC_MAX - 2 || nd - p > GR_DEC_MAX - 2 || -p > GR_DEC_MAX - 2 - nd) return -1;
    for (int k = 0; k < p; k++) d->i[d->ni++] = k < nd ? digits[k] : '0';
    for (int k = p; k < nd; k++) d->f[d->nf++] = k < 0 ? '0' : digits[k];
    int lead = 0;
    while (lead < d->ni && d->i[lead] == '0') lead++;
    memmove(d->i, d->i + lead, (size_t)(d->ni - lead));
    d->ni -= lead;
    if (!d->ni) d->i[d->ni++] = '0';
    while (d->nf && d->f[d->nf - 1] == '0') d->nf--;
    if (d->ni == 1 && d->i[0] == '0' && !d->nf) d->neg = false; /* -0 is 0 */
    return 0;
}

/* The shortest decimal that reads back as v; integral values exactly. */
int gr_dec_from_double(struct gr_dec *d, double v) {
    char buf[64], digits[32];
    if (!isfinite(v)) return -1;
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, v);
        if (strtod(buf, NULL) == v || prec == 17) break;
    }
    const char *p = buf;
    bool neg = *p == '-';
    if (neg) p++;
    int nd = 0;
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9') digits[nd++] = *p;
    int e = *p == 'e' ? atoi(p + 1) : 0;
    return dec_set(d, neg, digits, nd, e + 1);
}

enum { CMP_LT, CMP_EQ, CMP_GT };
static int cmpc(char x, char y) { return x < y ? CMP_LT : x > y ? CMP_GT : CMP_EQ; }

/* The automaton of unsigned decimals m with a <= m <= b (b NULL: no upper bound), comparing digit
 * by digit: integer-part states know how the digits so far compare with a's and b's (and a longer
 * integer part is larger), fraction states whether m still equals a or b so far. */
struct mag {
    struct gb *g;
    const struct gr_dec *a, *b;
    bool integer;
    int K, FK;      // integer and fraction digits at most
    int32_t tail;   // accepted numbers continue here
    int32_t *inode; // [(K + 1) * 9] integer states by (k, clo, chi); [0..9) are the "0" states
    int32_t *fnode; // [(FK + 1) * 4] fraction states by (k, lo_eq, hi_eq)
};

static int32_t frac_state(struct mag *m, int k, bool lo_eq, bool hi_eq) {
    int32_t *slot = &m->fnode[k * 4 + lo_eq * 2 + hi_eq];
    if (*slot >= 0 || m->g->status) return *slot;
    int32_t n = *slot = next(m->g, m->tail);
    if (k >= 1 && (!lo_eq || k >= m->a->nf)) gb_eps(m->g, n, m->tail);
    if (k >= m->FK) return n;
    int32_t prev = -1;
    int lo_d = 0;
    for (int d = 0; d <= 10; d++) { /* d = 10 flushes the last range */
        int32_t t = -1;
        if (d < 10) {
            char c = (char)('0' + d), fa = k < m->a->nf ? m->a->f[k] : '0';
            char fb = m->b && k < m->b->nf ? m->b->f[k] : '0';
            bool dead = (lo_eq && c < fa) || (hi_eq && c > fb);
            if (!dead) t = frac_state(m, k + 1, lo_eq && c == fa, hi_eq && c == fb);
        }
        if (t != prev || d == 10) {
            if (prev >= 0) gb_bytes(m->g, n, (uint8_t)('0' + lo_d), (uint8_t)('0' + d - 1), prev);
            prev = t;
            lo_d = d;
        }
    }
    return n;
}

/* Where the integer part may end after k digits. */
static void int_end(struct mag *m, int32_t n, int k, int clo, int chi) {
    int la = m->a->ni, lb = m->b ? m->b->ni : 0;
    int lower = k < la ? CMP_LT : k > la ? CMP_GT : clo;
    int upper = !m->b ? CMP_LT : k < lb ? CMP_LT : k > lb ? CMP_GT : chi;
    if (lower == CMP_LT || upper == CMP_GT) return;
    bool lo_eq = lower == CMP_EQ, hi_eq = upper == CMP_EQ;
    if (!lo_eq || m->a->nf == 0) gb_eps(m->g, n, m->tail);
    if (!m->integer) gb_bytes(m->g, n, '.', '.', frac_state(m, 0, lo_eq, hi_eq));
}

static int32_t int_state(struct mag *m, int k, int clo, int chi) {
    int32_t *slot = &m->inode[k * 9 + clo * 3 + chi];
    if (*slot >= 0 || m->g->status) return *slot;
    int32_t n = *slot = next(m->g, m->tail);
    if (k < m->K) {
        int32_t prev = -1;
        int lo_d = 0;
        for (int d = 0; d <= 10; d++) {
            int32_t t = -1;
            if (d < 10) {
                char c = (char)('0' + d);
                int nclo = k < m->a->ni ? (clo == CMP_EQ ? cmpc(c, m->a->i[k]) : clo) : CMP_GT;
                int nchi = !m->b ? CMP_LT : k < m->b->ni ? (chi == CMP_EQ ? cmpc(c, m->b->i[k]) : chi) : -1;
                if (nchi >= 0) t = int_state(m, k + 1, nclo, nchi);
            }
            if (t != prev || d == 10) {
                if (prev >= 0) gb_bytes(m->g, n, (uint8_t)('0' + lo_d), (uint8_t)('0' + d - 1), prev);
                prev = t;
                lo_d = d;
            }
        }
    }
    int_end(m, n, k, clo, chi);
    return n;
}

/* Edges from `from` to `tail` for the magnitudes [a, b]. */
static void magnitude(struct gb *g, int32_t from, int32_t tail, const struct gr_dec *a, const struct gr_dec *b,
                      bool integer) {
    struct mag m = {g, a, b, integer, 0, 0, tail, NULL, NULL};
    m.K = b ? b->ni : (a->ni > NUM_DIGITS ? a->ni : NUM_DIGITS);
    m.FK = NUM_DIGITS;
    if (a->nf > m.FK) m.FK = a->nf;
    if (b && b->nf > m.FK) m.FK = b->nf;
    m.inode = malloc((size_t)(m.K + 2) * 9 * sizeof *m.inode);
    m.fnode = malloc((size_t)(m.FK + 1) * 4 * sizeof *m.fnode);
    if (!m.inode || !m.fnode) {
        gb_fail(g, GRAMMAR_ERR_NOMEM, "out of memory compiling the schema");
    } else {
        memset(m.inode, 0xff, (size_t)(m.K + 2) * 9 * sizeof *m.inode);
        memset(m.fnode, 0xff, (size_t)(m.FK + 1) * 4 * sizeof *m.fnode);
        /* "0": an integer part of its own (index 0 holds the "0" states, k = 0 is never a state) */
        int clo0 = cmpc('0', a->i[0]), chi0 = b ? cmpc('0', b->i[0]) : CMP_LT;
        int32_t z = m.inode[clo0 * 3 + chi0] = next(g, from);
        gb_bytes(g, from, '0', '0', z);
        int_end(&m, z, 1, clo0, chi0);
        for (int d = 1; d <= 9; d++) {
            char c = (char)('0' + d);
            int32_t t = int_state(&m, 1, cmpc(c, a->i[0]), b ? cmpc(c, b->i[0]) : CMP_LT);
            gb_bytes(g, from, (uint8_t)c, (uint8_t)c, t);
        }
    }
    free(m.inode);
    free(m.fnode);
}

/* A JSON number (integer: no fraction or exponent) in [lo, hi] (either may be NULL) from `from`
 * to `to`. Bounded numbers have no exponent. */
void gb_number(struct gb *b, int32_t from, int32_t to, const struct gr_dec *lo, const struct gr_dec *hi, bool integer) {
    static const struct gr_dec zero = {.ni = 1, .i = "0"};
    int32_t tail = next(b, from);
    gb_eps(b, tail, to);
    if (!integer && !lo && !hi) { /* [eE][+-]?[0-9]{1,2} */
        int32_t e = next(b, from), s = next(b, from), x1 = next(b, from), x2 = next(b, from);
        gb_bytes(b, tail, 'e', 'e', e);
        gb_bytes(b, tail, 'E', 'E', e);
        gb_bytes(b, e, '+', '+', s);
        gb_bytes(b, e, '-', '-', s);
        gb_bytes(b, e, '0', '9', x1);
        gb_bytes(b, s, '0', '9', x1);
        gb_bytes(b, x1, '0', '9', x2);
        gb_eps(b, x1, to);
        gb_eps(b, x2, to);
    }
    if (!hi || !hi->neg) magnitude(b, from, tail, lo && !lo->neg ? lo : &zero, hi, integer);
    if (!lo || lo->neg) { /* '-' and the magnitudes [|min(hi, 0)|, |lo|] */
        struct gr_dec na = zero, nb;
        if (hi && hi->neg) na = *hi, na.neg = false;
        if (lo) nb = *lo, nb.neg = false;
        magnitude(b, byte(b, from, '-'), tail, &na, lo ? &nb : NULL, integer);
    }
}

