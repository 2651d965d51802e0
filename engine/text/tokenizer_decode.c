/* tokenizer_decode: HF decoders, twice.
 * tokenizer_decode() runs the decoder chain as `tokenizers` does (the decode_chain of each decoder):
 * a list of token strings rewritten by each decoder in turn, then joined.
 * The stream runs the same decoders as a pipeline over one token at a time:
 *   per-token text rewrites (Replace, Metaspace)
 *   -> ByteFallback (a run of <0xNN> tokens through a per-character UTF-8 decoder) or ByteLevel
 *      (bytes through a streaming lossy UTF-8 decoder); both hold only an unfinished character
 *   -> Strip over the whole text (drops leading chars, holds back trailing ones).
 * Decoder chains that do not fit this shape are rejected at load (tokenizer_decoder_plan). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/text/tokenizer_impl.h"
#include "engine/text/utf8.h"

static const char *dec_name(enum tok_dec_kind k) {
    switch (k) {
    case TOK_DEC_REPLACE: return "Replace";
    case TOK_DEC_BYTE_FALLBACK: return "ByteFallback";
    case TOK_DEC_FUSE: return "Fuse";
    case TOK_DEC_STRIP: return "Strip";
    case TOK_DEC_BYTE_LEVEL: return "ByteLevel";
    case TOK_DEC_METASPACE: return "Metaspace";
    }
    return "?";
}

/* Checks the chain has the stream's shape: [Replace|Metaspace]* [ByteFallback|ByteLevel]?
 * [Fuse]* [Strip [Fuse]*]?, with Strip only after the text is joined (Fuse or ByteLevel). */
int tokenizer_decoder_plan(struct tokenizer *tok, char *msg, size_t msglen) {
    int stage = 0; // 0 per-token, 1 after ByteFallback, 2 joined, 3 stripped
    for (size_t i = 0; i < tok->n_dec; i++) {
        const struct tok_decoder *d = &tok->dec[i];
        const char *bad = NULL;
        switch (d->kind) {
        case TOK_DEC_REPLACE:
        case TOK_DEC_METASPACE:
            if (stage > 0) bad = "after ByteFallback/ByteLevel/Fuse";
            break;
        case TOK_DEC_BYTE_FALLBACK:
            if (stage > 0) bad = "after ByteFallback/ByteLevel/Fuse";
            stage = 1;
            tok->stream_byte_fallback = true;
            break;
        case TOK_DEC_BYTE_LEVEL:
            if (stage > 0) bad = "after ByteFallback/ByteLevel/Fuse";
            stage = 2;
            tok->stream_byte_level = true;
            break;
        case TOK_DEC_FUSE:
            if (stage < 2) stage = 2;
            break;
        case TOK_DEC_STRIP:
            if (stage != 2) bad = stage == 3 ? "twice" : "before the tokens are fused (per-token Strip)";
            stage = 3;
            tok->stream_strip = (int)i;
            break;
        }
        if (bad) {
            snprintf(msg, msglen, "%s %s is not supported", dec_name(d->kind), bad);
            return TOKENIZER_ERR_UNSUPPORTED;
        }
    }
    return 0;
}

static bool byte_token(const char *s, size_t n, unsigned char *byte) {
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return false;
    unsigned v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        unsigned d = c >= '0' && c <= '9' ? (unsigned)(c - '0')
                     : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
                     : c >= 'A' && c <= 'F' ? (unsigned)(c - 'A' + 10)
                                            : 16u;
        if (d > 15) return false;
        v = v * 16 + d;
    }
    *byte = (unsigned char)v;
    return true;
}

/* ByteLevel: the bytes a token stands for, or its own UTF-8 if some char is outside the
 * byte alphabet (as HF's decoder does). Appends to b. */
static int bytelevel_bytes(const struct tokenizer *tok, struct tok_buf *b, const char *s, size_t n) {
    size_t start = b->len;
    if (tokenizer_buf_reserve(b, n)) return TOKENIZER_ERR_NOMEM;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t cl = utf8_decode(s + i, n - i, &cp);
        if (cp >= 0x144 || tok->bl_dec[cp] < 0) {
            b->len = start;
            return tokenizer_buf_append(b, s, n);
        }
        b->p[b->len++] = (char)tok->bl_dec[cp];
        i += cl;
    }
    b->p[b->len] = 0;
    return 0;
}

/* ---- batch decode: list of strings through each decoder ---- */

struct tlist {
    struct tok_buf b;
    size_t *off, *len;
    size_t n, cap;
};

static int tl_close(struct tlist *l, size_t start) { // the bytes from start on become one token
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        size_t *o = realloc(l->off, cap * sizeof *o);
        if (!o) return TOKENIZER_ERR_NOMEM;
        l->off = o;
        size_t *n = realloc(l->len, cap * sizeof *n);
        if (!n) return TOKENIZER_ERR_NOMEM;
        l->len = n;
        l->cap = cap;
    }
    l->off[l->n] = start;
    l->len[l->n] = l->b.len - start;
    l->n++;
    return 0;
}

static int tl_add(struct tlist *l, const char *s, size_t n) {
    size_t start = l->b.len;
    if (tokenizer_buf_append(&l->b, s, n)) return TOKENIZER_ERR_NOMEM;
    return tl_close(l, start);
}

static void tl_free(struct tlist *l) {
    free(l->b.p);
    free(l->off);
    free(l->len);
}

/* Applies decoder d to src, writing dst (empty on entry). */
static int apply_decoder(const struct tokenizer *tok, const struct tok_decoder *d, const struct tlist *src,
                         struct tlist *dst) {
    int rc = 0;
    switch (d->kind) {
    case TOK_DEC_REPLACE:
        for (size_t i = 0; i < src->n && !rc; i++) {
            const char *s = src->b.p + src->off[i];
            size_t n = src->len[i], start = dst->b.len, pos = 0;
            while (!rc && pos < n && d->pattern_len) {
                const char *f = memmem(s + pos, n - pos, d->pattern, d->pattern_len);
                if (!f) break;
                rc = tokenizer_buf_append(&dst->b, s + pos, (size_t)(f - s) - pos);
                if (!rc) rc = tokenizer_buf_append(&dst->b, d->content, d->content_len);
                pos = (size_t)(f - s) + d->pattern_len;
            }
            if (!rc) rc = tokenizer_buf_append(&dst->b, s + pos, n - pos);
            if (!rc) rc = tl_close(dst, start);
        }
        return rc;

    case TOK_DEC_METASPACE:
        // the replacement char becomes ' ', except in the first token when a prefix was added
        for (size_t i = 0; i < src->n && !rc; i++) {
            const char *s = src->b.p + src->off[i];
            size_t n = src->len[i], start = dst->b.len;
            for (size_t k = 0; k < n && !rc;) {
                uint32_t cp;
                size_t cl = utf8_decode(s + k, n - k, &cp);
                if (cp == d->ch) {
                    if (!(i == 0 && d->prepend)) rc = tokenizer_buf_append(&dst->b, " ", 1);
                } else {
                    rc = tokenizer_buf_append(&dst->b, s + k, cl);
                }
                k += cl;
            }
            if (!rc) rc = tl_close(dst, start);
        }
        return rc;

    case TOK_DEC_BYTE_FALLBACK: {
        // a run of byte tokens becomes its UTF-8 text, or one U+FFFD per byte if invalid
        struct tok_buf run = {0};
        for (size_t i = 0; i <= src->n && !rc; i++) {
            const char *s = i < src->n ? src->b.p + src->off[i] : NULL;
            size_t n = i < src->n ? src->len[i] : 0;
            unsigned char byte;
            if (s && byte_token(s, n, &byte)) {
                rc = tokenizer_buf_append(&run, &byte, 1);
                continue;
            }
            if (run.len) {
                if (utf8_valid(run.p, run.len)) rc = tl_add(dst, run.p, run.len);
                else
                    for (size_t k = 0; k < run.len && !rc; k++) rc = tl_add(dst, UTF8_REPLACEMENT, 3);
                run.len = 0;
            }
            if (s && !rc) rc = tl_add(dst, s, n);
        }
        free(run.p);
        return rc;
    }

    case TOK_DEC_FUSE: {
        size_t start = dst->b.len;
        for (size_t i = 0; i < src->n && !rc; i++) rc = tokenizer_buf_append(&dst->b, src->b.p + src->off[i], src->len[i]);
        return rc ? rc : tl_close(dst, start);
    }

    case TOK_DEC_STRIP:
        for (size_t i = 0; i < src->n && !rc; i++) {
            const char *s = src->b.p + src->off[i];
            size_t n = src->len[i], a = 0, z = n;
            for (size_t k = 0; k < d->start && a < n; k++) {
                uint32_t cp;
                size_t cl = utf8_decode(s + a, n - a, &cp);
                if (cp != d->ch) break;
                a += cl;
            }
            for (size_t k = 0; k < d->stop && z > a; k++) {
                size_t b = z - 1;
                while (b > a && ((unsigned char)s[b] & 0xC0) == 0x80) b--;
                uint32_t cp;
                utf8_decode(s + b, z - b, &cp);
                if (cp != d->ch) break;
                z = b;
            }
            rc = tl_add(dst, s + a, z - a);
        }
        return rc;

    case TOK_DEC_BYTE_LEVEL: {
        struct tok_buf bytes = {0};
        for (size_t i = 0; i < src->n && !rc; i++) rc = bytelevel_bytes(tok, &bytes, src->b.p + src->off[i], src->len[i]);
        if (!rc) rc = tokenizer_buf_reserve(&dst->b, 3 * bytes.len);
        if (!rc) {
            size_t start = dst->b.len;
            dst->b.len += utf8_lossy(bytes.p ? bytes.p : "", bytes.len, dst->b.p + start);
            dst->b.p[dst->b.len] = 0;
            rc = tl_close(dst, start);
        }
        free(bytes.p);
        return rc;
    }
    }
    return 0;
}

int tokenizer_decode(const struct tokenizer *tok, const int32_t *ids, size_t n, bool skip_special, char **text,
                     size_t *len) {
    *text = NULL;
    if (len) *len = 0;
    struct tlist a = {0}, b = {0};
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        size_t pl;
        const char *p = tokenizer_id_to_piece(tok, ids[i], &pl);
        if (!p || (skip_special && tokenizer_is_special(tok, ids[i]))) continue;
        rc = tl_add(&a, p, pl);
    }
    for (size_t k = 0; k < tok->n_dec && !rc; k++) {
        b.b.len = 0;
        b.n = 0;
        rc = apply_decoder(tok, &tok->dec[k], &a, &b);
        struct tlist t = a;
        a = b;
        b = t;
    }
    // join: "" after a decoder chain, " " without a decoder
    struct tok_buf out = {0};
    if (!rc) rc = tokenizer_buf_reserve(&out, a.b.len + a.n);
    for (size_t i = 0; i < a.n && !rc; i++) {
        if (!tok->has_decoder && i > 0) rc = tokenizer_buf_append(&out, " ", 1);
        if (!rc) rc = tokenizer_buf_append(&out, a.b.p + a.off[i], a.len[i]);
    }
    tl_free(&a);
    tl_free(&b);
    if (rc) {
        free(out.p);
        return rc;
    }
    *text = out.p;
    if (len) *len = out.len;
    return 0;
}

/* ---- stream ---- */

static int sbuf_reserve(char **p, size_t *cap, size_t need) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    char *q = realloc(*p, c);
    if (!q) return TOKENIZER_ERR_NOMEM;
    *p = q;
    *cap = c;
    return 0;
}

static int out_append(struct tokenizer_stream *s, const char *t, size_t n) {
    if (sbuf_reserve(&s->out, &s->out_cap, s->out_len + n + 1)) return TOKENIZER_ERR_NOMEM;
    memcpy(s->out + s->out_len, t, n);
    s->out_len += n;
    s->out[s->out_len] = 0;
    return 0;
}

/* Final text in order; goes through the whole-text Strip when there is one. */
static int emit(struct tokenizer_stream *s, const char *t, size_t n) {
    const struct tokenizer *tok = s->tok;
    if (tok->stream_strip < 0) return out_append(s, t, n);
    const struct tok_decoder *d = &tok->dec[tok->stream_strip];
    char ch[4];
    size_t chl = utf8_encode(d->ch, ch);
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        size_t cl = utf8_decode(t + i, n - i, &cp);
        if (!s->lead_done) {
            if (s->lead_seen < d->start && cp == d->ch) {
                s->lead_seen++;
                i += cl;
                continue;
            }
            s->lead_done = true;
        }
        if (d->stop > 0 && cp == d->ch) { // may be trailing: hold up to `stop` of them
            if (s->held == d->stop && out_append(s, ch, chl)) return TOKENIZER_ERR_NOMEM;
            else if (s->held < d->stop) s->held++;
            i += cl;
            continue;
        }
        for (; s->held > 0; s->held--)
            if (out_append(s, ch, chl)) return TOKENIZER_ERR_NOMEM;
        // copy the run up to the next char that needs attention
        size_t j = i + cl;
        while (j < n && d->stop == 0) j++;
        if (out_append(s, t + i, j - i)) return TOKENIZER_ERR_NOMEM;
        i = j;
    }
    return 0;
}

/* The held bytes of an unfinished character will not be finished: one U+FFFD each (ByteFallback's
 * rule for invalid bytes), unless they are the prompt's. */
static int bf_drop_pend(struct tokenizer_stream *s) {
    int rc = 0;
    for (size_t k = 0; k < s->n_pend && !s->pend_primed && !rc; k++) rc = emit(s, UTF8_REPLACEMENT, 3);
    s->carry = s->out_len; // those U+FFFDs are the text of the ids that held the bytes
    s->n_pend = 0;
    s->pend_primed = false;
    return rc;
}

/* ByteFallback: one byte of a <0xNN> run. A character goes out as soon as its last byte is in;
 * a byte that cannot belong to a character is a U+FFFD, as are the held bytes it cuts off. */
static int bf_byte(struct tokenizer_stream *s, unsigned char b) {
    bool complete, cut;
    if (s->n_pend) {
        unsigned char t[4];
        memcpy(t, s->pend, s->n_pend);
        t[s->n_pend] = b;
        size_t k = utf8_scan(t, s->n_pend + 1, &complete, &cut);
        if (cut) {
            s->pend[s->n_pend++] = b;
            return 0;
        }
        if (complete) { // pend is a valid prefix, so b finished it: k == n_pend + 1
            bool primed = s->pend_primed;
            s->n_pend = 0;
            s->pend_primed = false;
            return primed ? 0 : emit(s, (const char *)t, k);
        }
        int rc = bf_drop_pend(s);
        if (rc) return rc;
    }
    utf8_scan(&b, 1, &complete, &cut);
    if (complete) return emit(s, (const char *)&b, 1);
    if (cut) {
        s->pend[0] = b;
        s->n_pend = 1;
        return 0;
    }
    return emit(s, UTF8_REPLACEMENT, 3);
}

/* ByteLevel: the token's bytes through the lossy decoder into dec (3 * (nb + 3) bytes). A held
 * character is resolved first, a byte at a time: finished, it is this token's text (or nobody's
 * when the prompt began it); broken, its U+FFFD is earlier tokens' text (carried), or nobody's.
 * Returns the bytes in dec. */
static size_t bl_decode(struct tokenizer_stream *s, const char *bytes, size_t nb, char *dec) {
    struct utf8_lossy_stream ls = {{0}, s->n_pend};
    memcpy(ls.pend, s->pend, sizeof ls.pend);
    size_t i = 0, k = 0;
    while (ls.n_pend && i < nb) {
        unsigned char t[4];
        bool complete, cut;
        memcpy(t, ls.pend, ls.n_pend);
        t[ls.n_pend] = (unsigned char)bytes[i];
        utf8_scan(t, ls.n_pend + 1, &complete, &cut);
        k = utf8_lossy_feed(&ls, bytes + i++, 1, dec); // 0 while cut; else the char or U+FFFD first
        if (cut) continue;
        if (s->pend_primed) {
            size_t first = complete ? utf8_len(t[0]) : 3;
            memmove(dec, dec + first, k - first);
            k -= first;
            s->pend_primed = false;
        } else if (!complete) {
            s->carry = s->out_len + 3;
        }
        break;
    }
    k += utf8_lossy_feed(&ls, bytes + i, nb - i, dec + k);
    memcpy(s->pend, ls.pend, sizeof s->pend);
    s->n_pend = ls.n_pend;
    return k;
}

/* Per-token rewrites (Replace, Metaspace) of piece into s->tmp; returns the result. */
static int token_text(struct tokenizer_stream *s, const char *piece, size_t n, const char **res, size_t *res_len) {
    const struct tokenizer *tok = s->tok;
    const char *cur = piece;
    size_t cur_n = n;
    int w = 0;
    for (size_t k = 0; k < tok->n_dec; k++) {
        const struct tok_decoder *d = &tok->dec[k];
        if (d->kind != TOK_DEC_REPLACE && d->kind != TOK_DEC_METASPACE) continue;
        // worst case growth: every byte becomes the content / a space
        size_t grow = d->kind == TOK_DEC_REPLACE ? cur_n * (d->content_len + 1) + 1 : cur_n + 1;
        if (sbuf_reserve(&s->tmp[w], &s->tmp_cap[w], grow)) return TOKENIZER_ERR_NOMEM;
        char *o = s->tmp[w];
        size_t on = 0;
        if (d->kind == TOK_DEC_REPLACE) {
            size_t pos = 0;
            while (pos < cur_n && d->pattern_len) {
                const char *f = memmem(cur + pos, cur_n - pos, d->pattern, d->pattern_len);
                if (!f) break;
                size_t at = (size_t)(f - cur);
                memcpy(o + on, cur + pos, at - pos);
                on += at - pos;
                memcpy(o + on, d->content, d->content_len);
                on += d->content_len;
                pos = at + d->pattern_len;
            }
            memcpy(o + on, cur + pos, cur_n - pos);
            on += cur_n - pos;
        } else {
            for (size_t i = 0; i < cur_n;) {
                uint32_t cp;
                size_t cl = utf8_decode(cur + i, cur_n - i, &cp);
                if (cp == d->ch) {
                    if (!(s->n_tokens == 0 && d->prepend)) o[on++] = ' ';
                } else {
                    memcpy(o + on, cur + i, cl);
                    on += cl;
                }
                i += cl;
            }
        }
        cur = o;
        cur_n = on;
        w = !w;
    }
    *res = cur;
    *res_len = cur_n;
    return 0;
}

void tokenizer_stream_init(struct tokenizer_stream *s, const struct tokenizer *tok, bool skip_special) {
    memset(s, 0, sizeof *s);
    s->tok = tok;
    s->skip_special = skip_special;
}

void tokenizer_stream_free(struct tokenizer_stream *s) {
    if (!s) return;
    free(s->out);
    for (int i = 0; i < 3; i++) free(s->tmp[i]);
    memset(s, 0, sizeof *s);
}

/* A byte-level token's bytes into out (room for tn bytes): its own UTF-8 when some char is
 * outside the byte alphabet, as HF does. Returns the count. */
static size_t bl_token_bytes(const struct tokenizer *tok, const char *t, size_t tn, char *out) {
    size_t nb = 0;
    for (size_t i = 0; i < tn;) {
        uint32_t cp;
        size_t cl = utf8_decode(t + i, tn - i, &cp);
        if (cp >= 0x144 || tok->bl_dec[cp] < 0) {
            memcpy(out, t, tn);
            return tn;
        }
        out[nb++] = (char)tok->bl_dec[cp];
        i += cl;
    }
    return nb;
}

static int stream_feed(struct tokenizer_stream *s, int32_t id) {
    const struct tokenizer *tok = s->tok;
    size_t pl;
    const char *p = tokenizer_id_to_piece(tok, id, &pl);
    if (!p || (s->skip_special && tokenizer_is_special(tok, id))) return 0; // as decode: dropped
    const char *t;
    size_t tn;
    int rc = token_text(s, p, pl, &t, &tn);
    if (rc) return rc;
    unsigned char byte;
    if (!tok->has_decoder) {
        rc = s->n_tokens ? emit(s, " ", 1) : 0;
        if (!rc) rc = emit(s, t, tn);
    } else if (tok->stream_byte_fallback && byte_token(t, tn, &byte)) {
        rc = bf_byte(s, byte);
    } else if (tok->stream_byte_fallback) {
        rc = bf_drop_pend(s); // the run ended
        if (!rc) rc = emit(s, t, tn);
    } else if (tok->stream_byte_level) {
        // the token's bytes, then their lossy decode after the held ones, both in tmp[2]
        if (sbuf_reserve(&s->tmp[2], &s->tmp_cap[2], tn + 3 * (tn + 3) + 1)) return TOKENIZER_ERR_NOMEM;
        char *bytes = s->tmp[2], *dec = bytes + tn;
        size_t nb = bl_token_bytes(tok, t, tn, bytes);
        rc = emit(s, dec, bl_decode(s, bytes, nb, dec));
    } else {
        rc = emit(s, t, tn);
    }
    s->n_tokens++;
    return rc;
}

static void begin_piece(struct tokenizer_stream *s) {
    s->out_len = 0;
    s->carry = 0;
    if (s->out) s->out[0] = 0;
}

static void end_piece(struct tokenizer_stream *s, const char **piece, size_t *len) {
    *piece = s->out ? s->out : "";
    if (len) *len = s->out_len;
}

int tokenizer_stream_prime(struct tokenizer_stream *s, const int32_t *ids, size_t n) {
    for (size_t i = 0; i < n; i++) {
        begin_piece(s);
        int rc = stream_feed(s, ids[i]);
        if (rc) return rc;
    }
    begin_piece(s);
    s->pend_primed = s->n_pend > 0;
    s->held = 0; // trailing chars a Strip held back are the prompt's
    return 0;
}

int tokenizer_stream_push(struct tokenizer_stream *s, int32_t id, const char **piece, size_t *len) {
    begin_piece(s);
    int rc = stream_feed(s, id);
    end_piece(s, piece, len);
    return rc;
}

size_t tokenizer_stream_carried(const struct tokenizer_stream *s) {
    return s->carry < s->out_len ? s->carry : s->out_len;
}

int tokenizer_stream_flush(struct tokenizer_stream *s, const char **piece, size_t *len) {
    begin_piece(s);
    int rc = 0;
    if (s->tok->stream_byte_fallback) {
        rc = bf_drop_pend(s);
    } else if (s->n_pend && !s->pend_primed) {
        rc = emit(s, UTF8_REPLACEMENT, 3); // a cut character is one U+FFFD, as utf8_lossy
    }
    // held trailing Strip chars are the ones the full decode strips: drop them
    end_piece(s, piece, len);
    s->n_tokens = 0;
    s->n_pend = 0;
    s->pend_primed = false;
    s->lead_seen = 0;
    s->lead_done = false;
    s->held = 0;
    return rc;
}

/* ---- one token as logprobs show it ---- */

bool tokenizer_stream_at_start(const struct tokenizer_stream *s) {
    return s->n_tokens == 0;
}

size_t tokenizer_token_bytes(const struct tokenizer *tok, int32_t id, bool first, char *buf, size_t cap) {
    size_t pl;
    const char *p = tokenizer_id_to_piece(tok, id, &pl);
    if (!p) return 0;
    struct tokenizer_stream s;
    tokenizer_stream_init(&s, tok, false);
    s.n_tokens = first ? 0 : 1; // Metaspace: whether the token keeps its space
    const char *t = "";
    size_t tn = 0, n = 0;
    unsigned char byte;
    if (token_text(&s, p, pl, &t, &tn) != 0) {
        tn = 0;
    } else if (!tok->has_decoder) {
        if (cap && !first) buf[0] = ' ';
        n = !first;
    } else if (tok->stream_byte_fallback && byte_token(t, tn, &byte)) {
        t = (const char *)&byte;
        tn = 1;
    } else if (tok->stream_byte_level && sbuf_reserve(&s.tmp[2], &s.tmp_cap[2], tn + 1) == 0) {
        tn = bl_token_bytes(tok, t, tn, s.tmp[2]);
        t = s.tmp[2];
    }
    if (first && tok->stream_strip >= 0) { // the Strip's leading chars, as far as this token has them
        const struct tok_decoder *d = &tok->dec[tok->stream_strip];
        char ch[4];
        size_t chl = utf8_encode(d->ch, ch);
        for (size_t k = 0; k < d->start && tn >= chl && !memcmp(t, ch, chl); k++) t += chl, tn -= chl;
    }
    if (n < cap) memcpy(buf + n, t, tn < cap - n ? tn : cap - n);
    n += tn;
    tokenizer_stream_free(&s);
    return n;
}
