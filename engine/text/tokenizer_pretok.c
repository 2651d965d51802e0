/* tokenizer_pretok: normalizers and pre-tokenizers of HF `tokenizers`, applied depth-first: each
 * pre-tokenizer step splits its input and hands every piece to the next step, the last step to
 * the BPE model. That gives the same pieces in the same order as HF's breadth-first
 * PreTokenizedString, without materialising the lists. Regexes run on PCRE2 (UTF + UCP, JIT when
 * available); Unicode normalization uses utf8proc. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "engine/text/tokenizer_impl.h"
#include "engine/text/utf8.h"

/* ---- regex ---- */

pcre2_code *tokenizer_regex_compile(const char *pattern, char *msg, size_t msglen) {
    int errcode;
    PCRE2_SIZE erroff;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &errcode,
                                   &erroff, NULL);
    if (!re) {
        PCRE2_UCHAR buf[256];
        pcre2_get_error_message(errcode, buf, sizeof buf);
        snprintf(msg, msglen, "regex error at offset %zu: %s", (size_t)erroff, (const char *)buf);
        return NULL;
    }
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); // falls back to the interpreter if unavailable
    return re;
}

/* Finds the next match of re in s[0..n) at or after pos. Returns 1 with *ms, *me set, 0 when
 * there is none, or a negative status. */
static int regex_next(struct tok_enc *e, const pcre2_code *re, const char *s, size_t n, size_t pos, size_t *ms,
                      size_t *me) {
    int rc = pcre2_match(re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, e->md, NULL);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
        rc = pcre2_match(re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, e->md, NULL);
    if (rc == PCRE2_ERROR_NOMATCH) return 0;
    if (rc < 0) return TOKENIZER_ERR_REGEX;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
    *ms = ov[0];
    *me = ov[1];
    return 1;
}

/* ---- spans: (start, end, flag) triples in a step's scratch ---- */

static int span_push(struct tok_pretok_scratch *sc, size_t a, size_t b, size_t flag) {
    if (sc->n_span + 3 > sc->cap_span) {
        size_t cap = sc->cap_span ? sc->cap_span * 2 : 96;
        size_t *p = realloc(sc->span, cap * sizeof *p);
        if (!p) return TOKENIZER_ERR_NOMEM;
        sc->span = p;
        sc->cap_span = cap;
    }
    sc->span[sc->n_span++] = a;
    sc->span[sc->n_span++] = b;
    sc->span[sc->n_span++] = flag;
    return 0;
}

/* Like tokenizers' Pattern::find_matches: spans covering s, flag 1 on matches. */
static int find_matches(struct tok_enc *e, struct tok_pretok_scratch *sc, const pcre2_code *re, const char *lit,
                        size_t lit_len, const char *s, size_t n) {
    sc->n_span = 0;
    size_t prev = 0, pos = 0;
    while (pos <= n) {
        size_t ms, me;
        if (re) {
            int rc = regex_next(e, re, s, n, pos, &ms, &me);
            if (rc < 0) return rc;
            if (rc == 0) break;
        } else {
            if (!lit_len) break;
            const char *f = memmem(s + pos, n - pos, lit, lit_len);
            if (!f) break;
            ms = (size_t)(f - s);
            me = ms + lit_len;
        }
        if (ms > prev && span_push(sc, prev, ms, 0)) return TOKENIZER_ERR_NOMEM;
        if (span_push(sc, ms, me, 1)) return TOKENIZER_ERR_NOMEM;
        prev = me;
        if (me == ms) { // empty match: step over one character
            if (me >= n) break;
            pos = me + utf8_len((unsigned char)s[me]);
        } else {
            pos = me;
        }
    }
    if (prev != n && span_push(sc, prev, n, 0)) return TOKENIZER_ERR_NOMEM;
    return 0;
}

/* Rewrites the triples by tokenizers' SplitDelimiterBehavior (normalizer.rs split()); the flag of
 * each output triple says whether to drop it. */
static void apply_behavior(struct tok_pretok_scratch *sc, enum tok_split_behavior b, bool invert) {
    size_t *v = sc->span, n = sc->n_span / 3;
    if (invert)
        for (size_t i = 0; i < n; i++) v[3 * i + 2] = !v[3 * i + 2];
    size_t out = 0;
    bool prev_match = false;
    switch (b) {
    case TOK_SPLIT_ISOLATED:
        for (size_t i = 0; i < n; i++) v[3 * i + 2] = 0;
        return;
    case TOK_SPLIT_REMOVED:
        return;
    case TOK_SPLIT_CONTIGUOUS:
    case TOK_SPLIT_MERGED_WITH_PREVIOUS:
        for (size_t i = 0; i < n; i++) {
            bool m = v[3 * i + 2];
            bool join = b == TOK_SPLIT_CONTIGUOUS ? m == prev_match : (m && !prev_match);
            if (join && out > 0) {
                v[3 * (out - 1) + 1] = v[3 * i + 1];
            } else {
                v[3 * out] = v[3 * i];
                v[3 * out + 1] = v[3 * i + 1];
                v[3 * out + 2] = 0;
                out++;
            }
            prev_match = m;
        }
        sc->n_span = 3 * out;
        return;
    case TOK_SPLIT_MERGED_WITH_NEXT: {
        // right to left, then the kept spans are written back from the end
        size_t w = n; // spans are written to v[3*w ..] going down
        for (size_t k = n; k-- > 0;) {
            bool m = v[3 * k + 2];
            if (m && !prev_match && w < n) {
                v[3 * w] = v[3 * k];
            } else {
                size_t a = v[3 * k], z = v[3 * k + 1];
                w--;
                v[3 * w] = a;
                v[3 * w + 1] = z;
                v[3 * w + 2] = 0;
            }
            prev_match = m;
        }
        memmove(v, v + 3 * w, 3 * (n - w) * sizeof *v);
        sc->n_span = 3 * (n - w);
        return;
    }
    }
}

/* ---- byte-level alphabet ---- */

void tokenizer_bytelevel_init(struct tokenizer *tok) {
    // GPT-2 bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 bytes
    // take U+0100.. in byte order.
    int extra = 0;
    for (int i = 0; i < 0x144; i++) tok->bl_dec[i] = -1;
    for (int b = 0; b < 256; b++) {
        bool keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        uint32_t cp = keep ? (uint32_t)b : 256u + (uint32_t)extra++;
        tok->bl_len[b] = (unsigned char)utf8_encode(cp, tok->bl_enc[b]);
        tok->bl_dec[cp] = (int16_t)b;
    }
}

static int bytelevel_map(const struct tokenizer *tok, struct tok_buf *dst, const char *s, size_t n) {
    dst->len = 0;
    if (tokenizer_buf_reserve(dst, 2 * n)) return TOKENIZER_ERR_NOMEM;
    char *o = dst->p;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        o[0] = tok->bl_enc[c][0];
        o[1] = tok->bl_enc[c][1];
        o += tok->bl_len[c];
    }
    dst->len = (size_t)(o - dst->p);
    return 0;
}

/* ---- pre-tokenizers ---- */

static int run_spans(struct tok_enc *e, size_t step, struct tok_pretok_scratch *sc, const char *s, bool at_start) {
    for (size_t i = 0; i < sc->n_span; i += 3) {
        size_t a = sc->span[i], z = sc->span[i + 1];
        if (sc->span[i + 2] || z == a) continue;
        int rc = tokenizer_pretok_run(e, step + 1, s + a, z - a, at_start && a == 0);
        if (rc) return rc;
    }
    return 0;
}

static int digits_spans(struct tok_pretok_scratch *sc, const char *s, size_t n) {
    sc->n_span = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t cl = utf8_decode(s + i, n - i, &cp);
        utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
        bool num = c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
        if (span_push(sc, i, i + cl, num)) return TOKENIZER_ERR_NOMEM;
        i += cl;
    }
    return 0;
}

int tokenizer_pretok_run(struct tok_enc *e, size_t step, const char *s, size_t n, bool at_start) {
    const struct tokenizer *tok = e->tok;
    if (n == 0) return 0;
    if (step == tok->n_pretok) return e->piece_cb ? e->piece_cb(e->piece_ctx, s, n) : tokenizer_bpe_word(e, s, n);
    const struct tok_pretok *p = &tok->pretok[step];
    struct tok_pretok_scratch *sc = &e->ps[step];
    int rc;
    switch (p->kind) {
    case TOK_PRETOK_SPLIT:
        if ((rc = find_matches(e, sc, p->re, p->literal, p->literal_len, s, n))) return rc;
        apply_behavior(sc, p->behavior, p->invert);
        return run_spans(e, step, sc, s, at_start);

    case TOK_PRETOK_DIGITS:
        if ((rc = digits_spans(sc, s, n))) return rc;
        apply_behavior(sc, p->individual ? TOK_SPLIT_ISOLATED : TOK_SPLIT_CONTIGUOUS, false);
        return run_spans(e, step, sc, s, at_start);

    case TOK_PRETOK_BYTE_LEVEL: {
        if (p->add_prefix_space && s[0] != ' ') {
            sc->a.len = 0;
            if (tokenizer_buf_append(&sc->a, " ", 1) || tokenizer_buf_append(&sc->a, s, n)) return TOKENIZER_ERR_NOMEM;
            s = sc->a.p;
            n = sc->a.len;
        }
        if (!p->re) {
            if ((rc = bytelevel_map(tok, &sc->b, s, n))) return rc;
            return tokenizer_pretok_run(e, step + 1, sc->b.p, sc->b.len, at_start);
        }
        if ((rc = find_matches(e, sc, p->re, NULL, 0, s, n))) return rc;
        for (size_t i = 0; i < sc->n_span; i += 3) {
            size_t a = sc->span[i], z = sc->span[i + 1];
            if (z == a) continue;
            if ((rc = bytelevel_map(tok, &sc->b, s + a, z - a))) return rc;
            if ((rc = tokenizer_pretok_run(e, step + 1, sc->b.p, sc->b.len, at_start && a == 0))) return rc;
        }
        return 0;
    }

    case TOK_PRETOK_METASPACE: {
        struct tok_buf *d = &sc->a;
        d->len = 0;
        bool starts = n >= p->literal_len && !memcmp(s, p->literal, p->literal_len);
        // ' ' -> replacement happens before the prepend check, so a leading space counts
        if (!starts && s[0] == ' ') starts = true;
        bool prepend = !starts && (p->prepend == TOK_PREPEND_ALWAYS || (p->prepend == TOK_PREPEND_FIRST && at_start));
        if (prepend && tokenizer_buf_append(d, p->literal, p->literal_len)) return TOKENIZER_ERR_NOMEM;
        for (size_t i = 0; i < n; i++) {
            rc = s[i] == ' ' ? tokenizer_buf_append(d, p->literal, p->literal_len) : tokenizer_buf_append(d, s + i, 1);
            if (rc) return rc;
        }
        if (!p->split) return tokenizer_pretok_run(e, step + 1, d->p, d->len, at_start);
        if ((rc = find_matches(e, sc, NULL, p->literal, p->literal_len, d->p, d->len))) return rc;
        apply_behavior(sc, TOK_SPLIT_MERGED_WITH_NEXT, false);
        return run_spans(e, step, sc, d->p, at_start);
    }
    }
    return 0;
}

/* ---- normalizers ---- */

static bool all_ascii(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80) return false;
    return true;
}

/* Unicode normal forms of s. ASCII characters are never the second element of a canonical or
 * compatibility composition and always start a segment that normalization leaves alone, so
 * only each run of non-ASCII characters, together with the ASCII character before it (which may
 * compose with it), goes through utf8proc; the rest is copied. */
static int norm_unicode(struct tok_buf *d, const char *s, size_t n, utf8proc_option_t opt) {
    size_t i = 0;
    while (i < n) {
        size_t a = i;
        while (i < n && (unsigned char)s[i] < 0x80) i++;
        if (i == n) return tokenizer_buf_append(d, s + a, n - a);
        size_t z = i; // s[z] starts a non-ASCII run
        if (z > a) z--; // its ASCII predecessor joins it
        if (tokenizer_buf_append(d, s + a, z - a)) return TOKENIZER_ERR_NOMEM;
        while (i < n && (unsigned char)s[i] >= 0x80) i++;
        utf8proc_uint8_t *out = NULL;
        utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s + z, (utf8proc_ssize_t)(i - z), &out,
                                          opt | UTF8PROC_STABLE);
        if (r < 0) {
            free(out);
            return r == UTF8PROC_ERROR_NOMEM ? TOKENIZER_ERR_NOMEM : TOKENIZER_ERR_INVALID_UTF8;
        }
        int rc = tokenizer_buf_append(d, out, (size_t)r);
        free(out);
        if (rc) return rc;
    }
    return 0;
}

static int norm_replace(struct tok_enc *e, const struct tok_normalizer *nz, struct tok_buf *d, const char *s,
                        size_t n) {
    size_t pos = 0;
    while (pos < n) {
        size_t ms, me;
        if (nz->re) {
            int rc = regex_next(e, nz->re, s, n, pos, &ms, &me);
            if (rc < 0) return rc;
            if (rc == 0) break;
        } else {
            const char *f = nz->a_len ? memmem(s + pos, n - pos, nz->a, nz->a_len) : NULL;
            if (!f) break;
            ms = (size_t)(f - s);
            me = ms + nz->a_len;
        }
        if (tokenizer_buf_append(d, s + pos, ms - pos) || tokenizer_buf_append(d, nz->b, nz->b_len))
            return TOKENIZER_ERR_NOMEM;
        if (me == ms) { // empty match: keep one character and go on
            if (me >= n) {
                pos = n;
                break;
            }
            size_t cl = utf8_len((unsigned char)s[me]);
            if (tokenizer_buf_append(d, s + me, cl)) return TOKENIZER_ERR_NOMEM;
            me += cl;
        }
        pos = me;
    }
    return tokenizer_buf_append(d, s + pos, n - pos);
}

int tokenizer_normalize(struct tok_enc *e, const char *in, size_t n, const char **res, size_t *res_len) {
    const struct tokenizer *tok = e->tok;
    const char *cur = in;
    size_t cur_n = n;
    int which = 0;
    for (size_t k = 0; k < tok->n_norm; k++) {
        const struct tok_normalizer *nz = &tok->norm[k];
        struct tok_buf *d = which ? &e->norm_b : &e->norm_a;
        d->len = 0;
        int rc = 0;
        switch (nz->kind) {
        case TOK_NORM_NFC:
        case TOK_NORM_NFD:
        case TOK_NORM_NFKC:
        case TOK_NORM_NFKD:
            if (all_ascii(cur, cur_n)) continue; // fast path: nothing to do
            rc = norm_unicode(d, cur, cur_n,
                              nz->kind == TOK_NORM_NFC    ? UTF8PROC_COMPOSE
                              : nz->kind == TOK_NORM_NFD  ? UTF8PROC_DECOMPOSE
                              : nz->kind == TOK_NORM_NFKC ? UTF8PROC_COMPOSE | UTF8PROC_COMPAT
                                                          : UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT);
            break;
        case TOK_NORM_PREPEND:
            if (cur_n == 0) continue;
            rc = tokenizer_buf_append(d, nz->a, nz->a_len);
            if (!rc) rc = tokenizer_buf_append(d, cur, cur_n);
            break;
        case TOK_NORM_REPLACE:
            rc = norm_replace(e, nz, d, cur, cur_n);
            break;
        case TOK_NORM_LOWERCASE:
            for (size_t i = 0; i < cur_n && !rc;) {
                uint32_t cp;
                size_t cl = utf8_decode(cur + i, cur_n - i, &cp);
                char enc[4];
                size_t el = utf8_encode((uint32_t)utf8proc_tolower((utf8proc_int32_t)cp), enc);
                rc = tokenizer_buf_append(d, enc, el);
                i += cl;
            }
            break;
        case TOK_NORM_STRIP: {
            size_t a = 0, z = cur_n;
            while (nz->left && a < z) {
                uint32_t cp;
                size_t cl = utf8_decode(cur + a, z - a, &cp);
                if (!utf8_is_space(cp)) break;
                a += cl;
            }
            while (nz->right && z > a) {
                size_t b = z - 1;
                while (b > a && ((unsigned char)cur[b] & 0xC0) == 0x80) b--;
                uint32_t cp;
                utf8_decode(cur + b, z - b, &cp);
                if (!utf8_is_space(cp)) break;
                z = b;
            }
            rc = tokenizer_buf_append(d, cur + a, z - a);
            break;
        }
        }
        if (rc) return rc;
        if (!d->p && tokenizer_buf_reserve(d, 0)) return TOKENIZER_ERR_NOMEM;
        cur = d->p;
        cur_n = d->len;
        which = !which;
    }
    *res = cur;
    *res_len = cur_n;
    return 0;
}
