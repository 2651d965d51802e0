/* jinja_lex: the tokenizer, following jinja2's lexer.py (3.1): tags, comments, raw blocks,
 * and the whitespace rules (-/+ markers, trim_blocks, lstrip_blocks) that decide which
 * template text reaches the output; and what both halves of the parser (jinja_parse.c,
 * jinja_parse_expr.c) read the tokens with: the cursor, errors, arena allocation. */
#include "engine/text/jinja_impl.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SYNTAX(p, line, ...) jinja_parse_fail(p, JINJA_ERR_SYNTAX, line, __VA_ARGS__)

void jinja_parse_fail(struct jinja_parser *p, int status, int line, const char *fmt, ...) {
    if (p->err && p->errlen) {
        int off = snprintf(p->err, p->errlen, "line %d: ", line);
        if (off < 0 || (size_t)off >= p->errlen) off = 0;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(p->err + off, p->errlen - (size_t)off, fmt, ap);
        va_end(ap);
    }
    longjmp(p->jmp, status);
}

void *jinja_parse_alloc(struct jinja_parser *p, size_t n) {
    void *q = jinja_arena_alloc(&p->t->arena, n);
    if (!q) jinja_parse_fail(p, JINJA_ERR_NOMEM, p->line, "out of memory");
    memset(q, 0, n);
    return q;
}

static void *tmp_alloc(struct jinja_parser *p, size_t n) {
    void *q = jinja_arena_alloc(&p->tmp, n);
    if (!q) jinja_parse_fail(p, JINJA_ERR_NOMEM, p->line, "out of memory");
    return q;
}

char *jinja_parse_strdup(struct jinja_parser *p, const char *s, size_t n) {
    char *q = jinja_parse_alloc(p, n + 1);
    memcpy(q, s, n);
    return q;
}

/* ---- the token cursor the parsers read with ------------------------------------------ */

#define PARSE_MAX_DEPTH 200

const struct jinja_tok *jinja_peek(const struct jinja_parser *p) { return &p->toks[p->cur]; }
const struct jinja_tok *jinja_peek_at(const struct jinja_parser *p, size_t k) {
    size_t i = p->cur + k;
    return &p->toks[i < p->ntok ? i : p->ntok - 1];
}
const struct jinja_tok *jinja_advance(struct jinja_parser *p) {
    const struct jinja_tok *t = &p->toks[p->cur];
    if (t->t != JTK_EOF) p->cur++;
    return t;
}

bool jinja_tok_is_op(const struct jinja_tok *t, const char *op) {
    return t->t == JTK_OP && t->n == strlen(op) && memcmp(t->p, op, t->n) == 0;
}
bool jinja_tok_is_name(const struct jinja_tok *t, const char *name) {
    return t->t == JTK_NAME && t->n == strlen(name) && memcmp(t->p, name, t->n) == 0;
}
bool jinja_is_op(const struct jinja_parser *p, const char *op) {
    return jinja_tok_is_op(jinja_peek(p), op);
}
bool jinja_is_name(const struct jinja_parser *p, const char *name) {
    return jinja_tok_is_name(jinja_peek(p), name);
}
bool jinja_skip_op(struct jinja_parser *p, const char *op) {
    if (!jinja_is_op(p, op)) return false;
    jinja_advance(p);
    return true;
}
bool jinja_skip_name(struct jinja_parser *p, const char *name) {
    if (!jinja_is_name(p, name)) return false;
    jinja_advance(p);
    return true;
}

static const char *describe(const struct jinja_tok *t, char *buf, size_t n) {
    switch (t->t) {
    case JTK_DATA: return "template data";
    case JTK_VAR_BEGIN: return "begin of print statement";
    case JTK_VAR_END: return "end of print statement";
    case JTK_BLOCK_BEGIN: return "begin of statement block";
    case JTK_BLOCK_END: return "end of statement block";
    case JTK_STRING: return "string";
    case JTK_INT: return "integer";
    case JTK_FLOAT: return "float";
    case JTK_EOF: return "end of template";
    default: snprintf(buf, n, "'%.*s'", (int)(t->n > 40 ? 40 : t->n), t->p); return buf;
    }
}

_Noreturn void jinja_unexpected(struct jinja_parser *p, const char *wanted) {
    char b[64];
    const struct jinja_tok *t = jinja_peek(p);
    SYNTAX(p, t->line, "expected %s, got %s", wanted, describe(t, b, sizeof b));
}

void jinja_expect_op(struct jinja_parser *p, const char *op) {
    if (jinja_skip_op(p, op)) return;
    char w[16];
    snprintf(w, sizeof w, "'%s'", op);
    jinja_unexpected(p, w);
}

const char *jinja_expect_name(struct jinja_parser *p) {
    const struct jinja_tok *t = jinja_peek(p);
    if (t->t != JTK_NAME) jinja_unexpected(p, "a name");
    jinja_advance(p);
    return jinja_parse_strdup(p, t->p, t->n);
}

void jinja_expect_block_end(struct jinja_parser *p) {
    if (jinja_peek(p)->t == JTK_BLOCK_END) {
        jinja_advance(p);
        return;
    }
    jinja_unexpected(p, "end of statement block");
}

void jinja_parse_enter(struct jinja_parser *p) {
    if (++p->depth > PARSE_MAX_DEPTH)
        SYNTAX(p, jinja_peek(p)->line, "template nested too deeply (more than %d levels)",
               PARSE_MAX_DEPTH);
}

void jinja_parse_push(struct jinja_parser *p, struct jinja_parse_vec *v, void *x) {
    if (v->n == v->cap) {
        int cap = v->cap ? v->cap * 2 : 4;
        void **nv = jinja_parse_alloc(p, (size_t)cap * sizeof *nv);
        if (v->n) memcpy(nv, v->v, (size_t)v->n * sizeof *nv);
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = x;
}


/* ---- lexer --------------------------------------------------------------------------- */

static void emit(struct jinja_parser *p, enum jinja_tok_type t, int line, const char *s, size_t n) {
    if (p->ntok == p->captok) {
        size_t cap = p->captok ? p->captok * 2 : 256;
        struct jinja_tok *v = tmp_alloc(p, cap * sizeof *v);
        if (p->ntok) memcpy(v, p->toks, p->ntok * sizeof *v);
        p->toks = v;
        p->captok = cap;
    }
    p->toks[p->ntok++] = (struct jinja_tok){.t = t, .line = line, .p = s, .n = n};
}

static int count_nl(const char *s, size_t n) {
    int k = 0;
    for (size_t i = 0; i < n; i++) k += s[i] == '\n';
    return k;
}

/* Python str.isspace at src[i]; *len gets the code point's byte length. */
static bool space_at(const char *s, size_t n, size_t i, size_t *len) {
    uint32_t cp;
    *len = jinja_utf8_decode(s + i, n - i, &cp);
    return jinja_is_space(cp);
}

static size_t skip_space(const char *s, size_t n, size_t i) {
    size_t len;
    while (i < n && space_at(s, n, i, &len)) i += len;
    return i;
}

/* Length of s[0..n) after Python's rstrip(). */
static size_t rstrip_len(const char *s, size_t n) {
    uint32_t cp;
    while (n > 0) {
        size_t len = jinja_utf8_last(s, n, &cp);
        if (!jinja_is_space(cp)) break;
        n -= len;
    }
    return n;
}

static bool all_space(const char *s, size_t n) {
    size_t i = 0, len;
    while (i < n) {
        if (!space_at(s, n, i, &len)) return false;
        i += len;
    }
    return true;
}

/* The whitespace rules jinja applies to the text before a tag (lexer.py, OptionalLStrip):
 * '-' strips all whitespace; otherwise, with lstrip_blocks, a block or comment tag that
 * only whitespace separates from the start of its line takes that whitespace away. */
static size_t strip_before_tag(struct jinja_parser *p, const char *text, size_t n, char sign,
                               bool is_var, bool line_starting) {
    if (sign == '-') return rstrip_len(text, n);
    if (sign == '+' || !p->t->opt.lstrip_blocks || is_var) return n;
    size_t l = n;
    while (l > 0 && text[l - 1] != '\n') l--;
    if ((l > 0 || line_starting) && l < n && all_space(text + l, n - l)) return l;
    return n;
}

static bool starts(const struct jinja_parser *p, size_t i, const char *s) {
    size_t k = strlen(s);
    return i + k <= p->len && memcmp(p->src + i, s, k) == 0;
}

/* After a block/comment end marker: '-' eats all whitespace, trim_blocks one newline.
 * Returns the new position; *ends_nl tells whether the consumed text ended with '\n'. */
static size_t after_end(struct jinja_parser *p, size_t i, char sign, bool *ends_nl) {
    *ends_nl = false;
    if (sign == '-') {
        size_t j = skip_space(p->src, p->len, i);
        *ends_nl = j > i && p->src[j - 1] == '\n';
        return j;
    }
    if (sign == 0 && p->t->opt.trim_blocks && i < p->len && p->src[i] == '\n') {
        *ends_nl = true;
        return i + 1;
    }
    return i;
}

/* Decodes a Python string literal body (unicode-escape semantics). */
static void lex_string(struct jinja_parser *p, size_t *ip) {
    size_t i = *ip;
    char q = p->src[i++];
    size_t start = i;
    while (i < p->len && p->src[i] != q) {
        if (p->src[i] == '\\') i++;
        i++;
    }
    if (i >= p->len) SYNTAX(p, p->line, "unterminated string literal");
    size_t end = i;
    char *out = jinja_parse_alloc(p, end - start + 1), *o = out;
    for (size_t k = start; k < end; k++) {
        char ch = p->src[k];
        if (ch != '\\') {
            *o++ = ch;
            continue;
        }
        char e = p->src[++k];
        uint32_t cp = 0;
        int ndig = 0, base = 16;
        switch (e) {
        case '\n': continue; // line continuation
        case '\\': *o++ = '\\'; continue;
        case '\'': *o++ = '\''; continue;
        case '"': *o++ = '"'; continue;
        case 'a': *o++ = '\a'; continue;
        case 'b': *o++ = '\b'; continue;
        case 'f': *o++ = '\f'; continue;
        case 'n': *o++ = '\n'; continue;
        case 'r': *o++ = '\r'; continue;
        case 't': *o++ = '\t'; continue;
        case 'v': *o++ = '\v'; continue;
        case 'x': ndig = 2; break;
        case 'u': ndig = 4; break;
        case 'U': ndig = 8; break;
        default:
            if (e >= '0' && e <= '7') {
                base = 8;
                ndig = 3;
                k--; // the digit is part of the number
                break;
            }
            *o++ = '\\'; // unknown escapes stay as written
            *o++ = e;
            continue;
        }
        int got = 0;
        while (got < ndig && k + 1 < end) {
            char d = p->src[k + 1];
            int v = -1;
            if (d >= '0' && d <= '9')
                v = d - '0';
            else if (base == 16 && d >= 'a' && d <= 'f')
                v = d - 'a' + 10;
            else if (base == 16 && d >= 'A' && d <= 'F')
                v = d - 'A' + 10;
            if (v < 0 || v >= base) break;
            cp = cp * (uint32_t)base + (uint32_t)v;
            k++;
            got++;
        }
        if (base == 16 && got < ndig) SYNTAX(p, p->line, "truncated \\%c escape in string", e);
        if (cp > 0x10ffff) SYNTAX(p, p->line, "illegal Unicode character in string");
        char buf[4];
        size_t nb = jinja_utf8_encode(cp, buf);
        memcpy(o, buf, nb); // never longer than the escape it replaces
        o += nb;
    }
    p->line += count_nl(p->src + start, end - start);
    emit(p, JTK_STRING, p->line, out, (size_t)(o - out));
    *ip = end + 1;
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_name_start(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

/* digits with single underscores between them: \d+(_\d+)* */
static size_t scan_digits(const struct jinja_parser *p, size_t i) {
    while (i < p->len && is_digit(p->src[i])) {
        i++;
        if (i + 1 < p->len && p->src[i] == '_' && is_digit(p->src[i + 1])) i++;
    }
    return i;
}

static void lex_number(struct jinja_parser *p, size_t *ip) {
    size_t i = *ip, start = i;
    char buf[128];
    size_t nb = 0;
    const char *s = p->src;
    if (s[i] == '0' && i + 1 < p->len && s[i + 1] && strchr("xXoObB", s[i + 1])) {
        int base = (s[i + 1] | 0x20) == 'x' ? 16 : (s[i + 1] | 0x20) == 'o' ? 8 : 2;
        i += 2;
        while (i < p->len && (isxdigit((unsigned char)s[i]) || s[i] == '_') && nb < 100)
            if (s[i++] != '_') buf[nb++] = s[i - 1];
        buf[nb] = 0;
        errno = 0;
        char *end;
        unsigned long long v = strtoull(buf, &end, base);
        if (nb == 0 || *end || errno || v > INT64_MAX)
            SYNTAX(p, p->line, "invalid integer literal");
        emit(p, JTK_INT, p->line, s + start, i - start);
        p->toks[p->ntok - 1].i = (int64_t)v;
        *ip = i;
        return;
    }
    i = scan_digits(p, i);
    bool is_float = false;
    bool after_dot = start > 0 && s[start - 1] == '.'; // jinja: (?<!\.) before a float
    if (!after_dot && i + 1 < p->len && s[i] == '.' && is_digit(s[i + 1])) {
        i = scan_digits(p, i + 1);
        is_float = true;
    }
    if (!after_dot && i < p->len && (s[i] | 0x20) == 'e') {
        size_t j = i + 1;
        if (j < p->len && (s[j] == '+' || s[j] == '-')) j++;
        if (j < p->len && is_digit(s[j])) {
            i = scan_digits(p, j);
            is_float = true;
        }
    }
    for (size_t k = start; k < i && nb < sizeof buf - 1; k++)
        if (s[k] != '_') buf[nb++] = s[k];
    buf[nb] = 0;
    if (i - start >= sizeof buf - 1) SYNTAX(p, p->line, "number literal too long");
    emit(p, is_float ? JTK_FLOAT : JTK_INT, p->line, s + start, i - start);
    errno = 0;
    if (is_float) {
        p->toks[p->ntok - 1].f = strtod(buf, NULL);
    } else {
        long long v = strtoll(buf, NULL, 10);
        if (errno) SYNTAX(p, p->line, "integer literal too large");
        p->toks[p->ntok - 1].i = v;
    }
    *ip = i;
}

static const char *const ops2[] = {"//", "**", "==", "!=", ">=", "<=", NULL};
static const char ops1[] = "+-/*%~[](){}><=.:|,;";

/* Tokens inside {{ }} or {% %} up to the end marker. Returns the position after it. */
static size_t lex_tag(struct jinja_parser *p, size_t i, bool is_var, bool *ends_nl) {
    char stack[64];
    int sp = 0;
    const char *s = p->src;
    for (;;) {
        if (i >= p->len)
            SYNTAX(p, p->line, "unexpected end of template, expected '%s'", is_var ? "}}" : "%}");
        if (sp == 0) {
            if (is_var) {
                if (starts(p, i, "-}}")) {
                    emit(p, JTK_VAR_END, p->line, s + i, 3);
                    size_t j = skip_space(s, p->len, i + 3);
                    *ends_nl = j > i + 3 && s[j - 1] == '\n';
                    p->line += count_nl(s + i, j - i);
                    return j;
                }
                if (starts(p, i, "}}")) {
                    emit(p, JTK_VAR_END, p->line, s + i, 2);
                    *ends_nl = false;
                    return i + 2;
                }
            } else {
                char sign = 0;
                size_t k = i;
                if (s[i] == '-' || s[i] == '+') sign = s[k++];
                if (starts(p, k, "%}")) {
                    emit(p, JTK_BLOCK_END, p->line, s + i, k + 2 - i);
                    size_t j = after_end(p, k + 2, sign, ends_nl);
                    p->line += count_nl(s + i, j - i);
                    return j;
                }
            }
        }
        char ch = s[i];
        size_t len;
        if (space_at(s, p->len, i, &len)) {
            p->line += ch == '\n';
            i += len;
        } else if (is_digit(ch)) {
            lex_number(p, &i);
        } else if (is_name_start(ch)) {
            size_t st = i;
            while (i < p->len && (is_name_start(s[i]) || is_digit(s[i]))) i++;
            emit(p, JTK_NAME, p->line, s + st, i - st);
        } else if (ch == '\'' || ch == '"') {
            lex_string(p, &i);
        } else {
            int k = 0;
            while (ops2[k] && !starts(p, i, ops2[k])) k++;
            size_t n = ops2[k] ? 2 : 1;
            if (!ops2[k] && !strchr(ops1, ch)) SYNTAX(p, p->line, "unexpected char '%c'", ch);
            if (n == 1 && (ch == '(' || ch == '[' || ch == '{')) {
                if (sp == (int)sizeof stack) SYNTAX(p, p->line, "brackets nested too deeply");
                stack[sp++] = ch == '(' ? ')' : ch == '[' ? ']' : '}';
            } else if (n == 1 && (ch == ')' || ch == ']' || ch == '}')) {
                if (sp == 0) SYNTAX(p, p->line, "unexpected '%c'", ch);
                if (stack[sp - 1] != ch)
                    SYNTAX(p, p->line, "unexpected '%c', expected '%c'", ch, stack[sp - 1]);
                sp--;
            }
            emit(p, JTK_OP, p->line, s + i, n);
            i += n;
        }
    }
}

void jinja_lex(struct jinja_parser *p, const char *src, size_t len) {
    // Newlines normalised to \n as jinja does; one trailing newline dropped unless kept.
    char *s = tmp_alloc(p, len + 1);
    size_t n = 0;
    for (size_t k = 0; k < len; k++) {
        if (src[k] == '\r') {
            s[n++] = '\n';
            if (k + 1 < len && src[k + 1] == '\n') k++;
        } else {
            s[n++] = src[k];
        }
    }
    if (!p->t->opt.keep_trailing_newline && n > 0 && s[n - 1] == '\n') n--;
    s[n] = 0;
    p->src = s;
    p->len = n;

    size_t i = 0;
    bool line_starting = true;
    while (i < p->len) {
        // The next tag start: {% {{ {#
        size_t j = i;
        for (;;) {
            const char *q = memchr(s + j, '{', p->len - j);
            if (!q) {
                j = p->len;
                break;
            }
            j = (size_t)(q - s);
            if (j + 1 < p->len && (s[j + 1] == '%' || s[j + 1] == '{' || s[j + 1] == '#')) break;
            j++;
        }
        if (j >= p->len) {
            emit(p, JTK_DATA, p->line, s + i, p->len - i);
            break;
        }
        char kind = s[j + 1];
        char sign = j + 2 < p->len && (s[j + 2] == '-' || s[j + 2] == '+') ? s[j + 2] : 0;
        size_t k = j + 2 + (sign ? 1 : 0);

        // {% raw %}: recognised before other blocks, like jinja's root_raw_re.
        bool is_raw = false;
        size_t raw_end = 0;
        if (kind == '%') {
            size_t r = skip_space(s, p->len, k);
            if (starts(p, r, "raw")) {
                r = skip_space(s, p->len, r + 3);
                if (starts(p, r, "-%}")) {
                    is_raw = true;
                    raw_end = skip_space(s, p->len, r + 3);
                } else if (starts(p, r, "%}")) {
                    is_raw = true;
                    raw_end = r + 2;
                }
            }
        }

        size_t keep = strip_before_tag(p, s + i, j - i, sign, kind == '{', line_starting);
        if (keep) emit(p, JTK_DATA, p->line, s + i, keep);
        p->line += count_nl(s + i, j - i);

        if (is_raw) {
            p->line += count_nl(s + j, raw_end - j);
            bool ls = raw_end > j && s[raw_end - 1] == '\n';
            // body up to {%[-+]?\s*endraw\s*(+%}|-%}\s*|%}\n?)
            size_t b = raw_end, e = raw_end;
            size_t after = 0;
            char esign = 0, endsign = 0;
            for (;; e++) {
                const char *q = e < p->len ? memchr(s + e, '{', p->len - e) : NULL;
                if (!q) SYNTAX(p, p->line, "missing end of raw directive");
                e = (size_t)(q - s);
                if (!starts(p, e, "{%")) continue;
                size_t r = e + 2;
                esign = 0;
                if (r < p->len && (s[r] == '-' || s[r] == '+')) esign = s[r++];
                r = skip_space(s, p->len, r);
                if (!starts(p, r, "endraw")) continue;
                r = skip_space(s, p->len, r + 6);
                endsign = 0;
                if (r < p->len && (s[r] == '-' || s[r] == '+')) endsign = s[r++];
                if (!starts(p, r, "%}")) continue;
                bool nl;
                after = after_end(p, r + 2, endsign, &nl);
                line_starting = nl;
                break;
            }
            size_t bk = strip_before_tag(p, s + b, e - b, esign, false, ls);
            if (bk) emit(p, JTK_DATA, p->line, s + b, bk);
            p->line += count_nl(s + b, after - b);
            i = after;
            continue;
        }

        if (kind == '#') {
            size_t e = k;
            char esign = 0;
            for (;; e++) {
                if (e + 1 >= p->len) SYNTAX(p, p->line, "missing end of comment tag");
                if (starts(p, e, "+#}") || starts(p, e, "-#}")) {
                    esign = s[e];
                    e++;
                    break;
                }
                if (starts(p, e, "#}")) break;
            }
            size_t after = after_end(p, e + 2, esign, &line_starting);
            p->line += count_nl(s + j, after - j);
            i = after;
            continue;
        }

        emit(p, kind == '{' ? JTK_VAR_BEGIN : JTK_BLOCK_BEGIN, p->line, s + j, k - j);
        i = lex_tag(p, k, kind == '{', &line_starting);
    }
    emit(p, JTK_EOF, p->line, "", 0);
}
