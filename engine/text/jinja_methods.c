/* jinja_methods: Python's str semantics (strip, split, replace, format, %, ...), the methods
 * templates may call on str, list, dict and loop values (their names are in jinja_access.c,
 * which resolves attributes). Sandbox rules: no method mutates a list or dict. Case mapping is
 * ASCII-only. */
#include "engine/text/jinja_impl.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool cp_in(uint32_t cp, const struct jv *chars) {
    if (!chars) return jinja_is_space(cp);
    size_t i = 0;
    while (i < chars->s.n) {
        uint32_t x;
        i += jinja_utf8_decode(chars->s.p + i, chars->s.n - i, &x);
        if (x == cp) return true;
    }
    return false;
}

/* str.strip/lstrip/rstrip; chars NULL = whitespace. */
struct jv jinja_str_strip(struct jv s, const struct jv *chars, bool left, bool right) {
    size_t a = 0, b = s.s.n;
    uint32_t cp;
    while (left && a < b) {
        size_t len = jinja_utf8_decode(s.s.p + a, b - a, &cp);
        if (!cp_in(cp, chars)) break;
        a += len;
    }
    while (right && b > a) {
        size_t len = jinja_utf8_last(s.s.p + a, b - a, &cp);
        if (!cp_in(cp, chars)) break;
        b -= len;
    }
    return jv_str(s.s.p + a, b - a);
}

const struct jv *jinja_strip_chars(struct jinja_ctx *c, const struct jinja_callargs *a) {
    const struct jv *ch = jinja_arg(a, 0, "chars");
    if (!jinja_given(ch)) return NULL;
    jinja_need_str(c, ch, "strip chars");
    return ch;
}

const char *jinja_rmemmem(const char *h, size_t hn, const char *n, size_t nn) {
    if (nn > hn) return NULL;
    for (size_t i = hn - nn + 1; i-- > 0;)
        if (memcmp(h + i, n, nn) == 0) return h + i;
    return NULL;
}

/* str.split / str.rsplit; sep NULL = runs of whitespace. */
static struct jv split(struct jinja_ctx *c, struct jv s, const struct jv *sep, int64_t maxsplit,
                       bool right) {
    struct jinja_vec out = {0};
    const char *p = s.s.p;
    size_t n = s.s.n;
    if (sep && sep->s.n == 0) jinja_fail(c, JINJA_ERR_RENDER, "empty separator");
    if (!sep) {
        // Whitespace: no empty strings; once maxsplit is reached the rest is kept as is.
        struct jinja_vec parts = {0};
        uint32_t cp;
        if (!right) {
            size_t i = 0;
            for (;;) {
                size_t len;
                while (i < n && jinja_is_space((len = jinja_utf8_decode(p + i, n - i, &cp), cp)))
                    i += len;
                if (i >= n) break;
                if (maxsplit >= 0 && (int64_t)parts.n == maxsplit) {
                    jinja_vec_push(c, &parts, jv_str(p + i, n - i));
                    break;
                }
                size_t st = i;
                while (i < n && !jinja_is_space((len = jinja_utf8_decode(p + i, n - i, &cp), cp)))
                    i += len;
                jinja_vec_push(c, &parts, jv_str(p + st, i - st));
            }
            return jinja_vec_list(c, &parts, false);
        }
        size_t e = n;
        for (;;) {
            size_t len;
            while (e > 0 && jinja_is_space((len = jinja_utf8_last(p, e, &cp), cp))) e -= len;
            if (e == 0) break;
            if (maxsplit >= 0 && (int64_t)parts.n == maxsplit) {
                jinja_vec_push(c, &parts, jv_str(p, e));
                break;
            }
            size_t en = e;
            while (e > 0 && !jinja_is_space((len = jinja_utf8_last(p, e, &cp), cp))) e -= len;
            jinja_vec_push(c, &parts, jv_str(p + e, en - e));
        }
        for (size_t i = 0; i < parts.n / 2; i++) {
            struct jv t = parts.v[i];
            parts.v[i] = parts.v[parts.n - 1 - i];
            parts.v[parts.n - 1 - i] = t;
        }
        return jinja_vec_list(c, &parts, false);
    }
    if (!right) {
        size_t i = 0;
        for (;;) {
            const char *q = (maxsplit < 0 || (int64_t)out.n < maxsplit)
                                ? memmem(p + i, n - i, sep->s.p, sep->s.n)
                                : NULL;
            if (!q) {
                jinja_vec_push(c, &out, jv_str(p + i, n - i));
                break;
            }
            jinja_vec_push(c, &out, jv_str(p + i, (size_t)(q - (p + i))));
            i = (size_t)(q - p) + sep->s.n;
        }
        return jinja_vec_list(c, &out, false);
    }
    size_t e = n;
    for (;;) {
        const char *q = (maxsplit < 0 || (int64_t)out.n < maxsplit)
                            ? jinja_rmemmem(p, e, sep->s.p, sep->s.n)
                            : NULL;
        if (!q) {
            jinja_vec_push(c, &out, jv_str(p, e));
            break;
        }
        size_t at = (size_t)(q - p);
        jinja_vec_push(c, &out, jv_str(p + at + sep->s.n, e - at - sep->s.n));
        e = at;
    }
    for (size_t i = 0; i < out.n / 2; i++) {
        struct jv t = out.v[i];
        out.v[i] = out.v[out.n - 1 - i];
        out.v[out.n - 1 - i] = t;
    }
    return jinja_vec_list(c, &out, false);
}

struct jv jinja_str_replace(struct jinja_ctx *c, struct jv s, struct jv old, struct jv new_,
                            int64_t count) {
    struct jinja_buf b = jinja_buf_tmp(c);
    size_t i = 0;
    int64_t done = 0;
    if (old.s.n == 0) { // Python inserts new_ between code points (and at both ends)
        uint32_t cp;
        while (count < 0 || done < count) {
            jinja_buf_put(c, &b, new_.s.p, new_.s.n);
            done++;
            if (i >= s.s.n) break;
            size_t len = jinja_utf8_decode(s.s.p + i, s.s.n - i, &cp);
            jinja_buf_put(c, &b, s.s.p + i, len);
            i += len;
        }
        jinja_buf_put(c, &b, s.s.p + i, s.s.n - i);
        return jinja_buf_value(&b);
    }
    while (count < 0 || done < count) {
        const char *q = memmem(s.s.p + i, s.s.n - i, old.s.p, old.s.n);
        if (!q) break;
        size_t at = (size_t)(q - s.s.p);
        jinja_buf_put(c, &b, s.s.p + i, at - i);
        jinja_buf_put(c, &b, new_.s.p, new_.s.n);
        i = at + old.s.n;
        done++;
    }
    jinja_buf_put(c, &b, s.s.p + i, s.s.n - i);
    return jinja_buf_value(&b);
}

static bool is_lower(char ch) { return ch >= 'a' && ch <= 'z'; }
static bool is_upper(char ch) { return ch >= 'A' && ch <= 'Z'; }
static char to_upper(char ch) { return is_lower(ch) ? (char)(ch - 32) : ch; }
static char to_lower(char ch) { return is_upper(ch) ? (char)(ch + 32) : ch; }

struct jv jinja_str_recase(struct jinja_ctx *c, struct jv s, enum jinja_case m) {
    char *q = jinja_alloc(c, s.s.n + 1);
    bool prev_cased = false;
    for (size_t i = 0; i < s.s.n; i++) {
        char ch = s.s.p[i];
        bool cased = is_lower(ch) || is_upper(ch);
        switch (m) {
        case JINJA_CASE_UPPER: ch = to_upper(ch); break;
        case JINJA_CASE_LOWER: ch = to_lower(ch); break;
        case JINJA_CASE_SWAP: ch = is_lower(ch) ? to_upper(ch) : to_lower(ch); break;
        case JINJA_CASE_CAPITALIZE: ch = i == 0 ? to_upper(ch) : to_lower(ch); break;
        case JINJA_CASE_TITLE: ch = prev_cased ? to_lower(ch) : to_upper(ch); break;
        }
        prev_cased = cased;
        q[i] = ch;
    }
    q[s.s.n] = 0;
    return jv_str(q, s.s.n);
}

/* jinja's title filter: capitalise each word, words split at whitespace, - ( { [ < */
struct jv jinja_str_title_words(struct jinja_ctx *c, struct jv s) {
    char *q = jinja_alloc(c, s.s.n + 1);
    bool start = true;
    for (size_t i = 0; i < s.s.n; i++) {
        char ch = s.s.p[i];
        bool sep = strchr(" \t\n\r\f\v-({[<", ch) && ch;
        q[i] = sep ? ch : start ? to_upper(ch) : to_lower(ch);
        start = sep;
    }
    q[s.s.n] = 0;
    return jv_str(q, s.s.n);
}

static size_t cp_index(const char *p, size_t byte_off) { return jinja_utf8_count(p, byte_off); }

static bool str_has_prefix(struct jv s, struct jv pre) {
    return pre.s.n <= s.s.n && memcmp(s.s.p, pre.s.p, pre.s.n) == 0;
}
static bool str_has_suffix(struct jv s, struct jv suf) {
    return suf.s.n <= s.s.n && memcmp(s.s.p + s.s.n - suf.s.n, suf.s.p, suf.s.n) == 0;
}

/* startswith / endswith take a str or a tuple of str. */
static bool affix(struct jinja_ctx *c, struct jv s, const struct jv *arg, bool suffix) {
    if (arg && arg->t == JT_LIST) {
        for (size_t i = 0; i < arg->l->n; i++) {
            struct jv x = jinja_need_str(c, &arg->l->v[i], "affix");
            if (suffix ? str_has_suffix(s, x) : str_has_prefix(s, x)) return true;
        }
        return false;
    }
    struct jv x = jinja_need_str(c, arg, suffix ? "endswith argument" : "startswith argument");
    return suffix ? str_has_suffix(s, x) : str_has_prefix(s, x);
}

bool jinja_str_all(struct jv s, enum jinja_chars kind) {
    if (s.s.n == 0) return false;
    bool any_cased = false;
    for (size_t i = 0; i < s.s.n; i++) {
        char ch = s.s.p[i];
        bool ok;
        switch (kind) {
        case JINJA_CHARS_DIGIT: ok = ch >= '0' && ch <= '9'; break;
        case JINJA_CHARS_ALPHA: ok = is_lower(ch) || is_upper(ch); break;
        case JINJA_CHARS_ALNUM:
            ok = is_lower(ch) || is_upper(ch) || (ch >= '0' && ch <= '9');
            break;
        case JINJA_CHARS_SPACE: ok = jinja_is_space((unsigned char)ch); break;
        case JINJA_CHARS_LOWER:
            ok = !is_upper(ch);
            any_cased |= is_lower(ch);
            break;
        case JINJA_CHARS_UPPER:
            ok = !is_lower(ch);
            any_cased |= is_upper(ch);
            break;
        }
        if (!ok) return false;
    }
    return (kind != JINJA_CHARS_LOWER && kind != JINJA_CHARS_UPPER) || any_cased;
}

/* str.format: {} {0} {name} with optional !r/!s; {{ and }} escape braces. */
static struct jv str_format(struct jinja_ctx *c, struct jv fmt, const struct jinja_callargs *a) {
    struct jinja_buf b = jinja_buf_tmp(c);
    size_t auto_idx = 0;
    for (size_t i = 0; i < fmt.s.n; i++) {
        char ch = fmt.s.p[i];
        if ((ch == '{' || ch == '}') && i + 1 < fmt.s.n && fmt.s.p[i + 1] == ch) {
            jinja_buf_put(c, &b, &ch, 1);
            i++;
            continue;
        }
        if (ch == '}') jinja_fail(c, JINJA_ERR_RENDER, "single '}' encountered in format string");
        if (ch != '{') {
            jinja_buf_put(c, &b, &ch, 1);
            continue;
        }
        const char *end = memchr(fmt.s.p + i, '}', fmt.s.n - i);
        if (!end) jinja_fail(c, JINJA_ERR_RENDER, "single '{' encountered in format string");
        struct jv field = jv_str(fmt.s.p + i + 1, (size_t)(end - fmt.s.p) - i - 1);
        i = (size_t)(end - fmt.s.p);
        char conv = 0;
        const char *bang = memchr(field.s.p, '!', field.s.n);
        if (bang) {
            conv = bang + 1 < field.s.p + field.s.n ? bang[1] : 0;
            field.s.n = (size_t)(bang - field.s.p);
        }
        if (memchr(field.s.p, ':', field.s.n) || memchr(field.s.p, '.', field.s.n) ||
            memchr(field.s.p, '[', field.s.n))
            jinja_fail(c, JINJA_ERR_RENDER, "format specs are not supported in str.format");
        const struct jv *v;
        if (field.s.n == 0) {
            v = jinja_arg(a, (int)auto_idx++, NULL);
        } else if (field.s.p[0] >= '0' && field.s.p[0] <= '9') {
            v = jinja_arg(a, atoi(jinja_cstr(c, field)), NULL);
        } else {
            v = jinja_arg(a, -1, jinja_cstr(c, field));
        }
        if (!v) jinja_fail(c, JINJA_ERR_RENDER, "str.format: missing argument");
        if (conv == 'r')
            jinja_write_repr(c, &b, *v);
        else
            jinja_write_str(c, &b, *v);
    }
    return jinja_buf_value(&b);
}

/* Appends s padded with spaces to width code points. */
static void b_put_padded(struct jinja_ctx *c, struct jinja_buf *b, struct jv s, long width,
                         bool left) {
    long n = (long)jinja_utf8_count(s.s.p, s.s.n);
    if (width > (long)c->lim.max_output) jinja_fail(c, JINJA_ERR_LIMIT, "format width too large");
    if (left) jinja_buf_put(c, b, s.s.p, s.s.n);
    for (long i = n; i < width; i++) jinja_buf_put(c, b, " ", 1);
    if (!left) jinja_buf_put(c, b, s.s.p, s.s.n);
}

/* Appends snprintf's result, refusing what did not fit (a huge field width). */
static void put_formatted(struct jinja_ctx *c, struct jinja_buf *b, const char *tmp, size_t cap,
                          int n) {
    if (n < 0 || (size_t)n >= cap) jinja_fail(c, JINJA_ERR_LIMIT, "formatted field too wide");
    jinja_buf_put(c, b, tmp, (size_t)n);
}

struct jv jinja_percent_format(struct jinja_ctx *c, struct jv fmt, struct jv args) {
    struct jinja_buf b = jinja_buf_tmp(c);
    size_t next = 0;
    const struct jinja_list *tuple = args.t == JT_LIST && args.l->tuple ? args.l : NULL;
    for (size_t i = 0; i < fmt.s.n; i++) {
        char ch = fmt.s.p[i];
        if (ch != '%') {
            jinja_buf_put(c, &b, &ch, 1);
            continue;
        }
        if (++i >= fmt.s.n) jinja_fail(c, JINJA_ERR_RENDER, "incomplete format");
        struct jv v;
        if (fmt.s.p[i] == '(') {
            const char *end = memchr(fmt.s.p + i, ')', fmt.s.n - i);
            if (!end || args.t != JT_DICT)
                jinja_fail(c, JINJA_ERR_RENDER, "format requires a mapping");
            const char *key =
                jinja_cstr(c, jv_str(fmt.s.p + i + 1, (size_t)(end - fmt.s.p) - i - 1));
            v = jinja_getattr(c, args, key);
            i = (size_t)(end - fmt.s.p) + 1;
        } else if (fmt.s.p[i] == '%') {
            jinja_buf_put(c, &b, "%", 1);
            continue;
        } else if (tuple) {
            if (next >= tuple->n)
                jinja_fail(c, JINJA_ERR_RENDER, "not enough arguments for format string");
            v = tuple->v[next++];
        } else {
            if (next++ > 0)
                jinja_fail(c, JINJA_ERR_RENDER, "not enough arguments for format string");
            v = args;
        }
        char spec[32] = "%";
        size_t k = 1;
        while (i < fmt.s.n && strchr("-+ #0123456789.", fmt.s.p[i]) && fmt.s.p[i] && k < 20)
            spec[k++] = fmt.s.p[i++];
        if (i >= fmt.s.n) jinja_fail(c, JINJA_ERR_RENDER, "incomplete format");
        char conv = fmt.s.p[i];
        char tmp[512];
        switch (conv) {
        case 's':
        case 'r': {
            struct jinja_buf t = jinja_buf_tmp(c);
            if (conv == 'r')
                jinja_write_repr(c, &t, v);
            else
                jinja_write_str(c, &t, v);
            // %[-][width][.prec]s, counted in code points as Python does
            spec[k] = 0;
            bool left = strchr(spec, '-') != NULL;
            const char *dot = strchr(spec, '.');
            const char *w = spec + 1;
            while (*w == '-' || *w == '+' || *w == ' ' || *w == '#' || *w == '0') w++;
            long width = atol(w), prec = dot ? atol(dot + 1) : -1;
            struct jv str = jinja_buf_value(&t);
            if (prec >= 0) {
                size_t off = 0;
                uint32_t cp;
                for (long q = 0; q < prec && off < str.s.n; q++)
                    off += jinja_utf8_decode(str.s.p + off, str.s.n - off, &cp);
                str.s.n = off;
            }
            b_put_padded(c, &b, str, width, left);
            break;
        }
        case 'd':
        case 'i':
        case 'x':
        case 'X':
        case 'o': {
            if (!jinja_is_number(v))
                jinja_fail(c, JINJA_ERR_RENDER, "%%%c format: a number is required, not %s", conv,
                           jinja_type_name(v));
            if (v.t == JT_FLOAT && !(fabs(v.f) < 9.2e18))
                jinja_fail(c, JINJA_ERR_RENDER, "%%%c format: number out of range", conv);
            int64_t x = v.t == JT_FLOAT ? (int64_t)v.f : v.t == JT_BOOL ? v.b : v.i;
            memcpy(spec + k, "ll", 2);
            k += 2;
            spec[k++] = conv == 'i' ? 'd' : conv;
            spec[k] = 0;
            put_formatted(c, &b, tmp, sizeof tmp, snprintf(tmp, sizeof tmp, spec, (long long)x));
            break;
        }
        case 'f':
        case 'F':
        case 'e':
        case 'E':
        case 'g':
        case 'G': {
            if (!jinja_is_number(v))
                jinja_fail(c, JINJA_ERR_RENDER, "must be real number, not %s", jinja_type_name(v));
            spec[k++] = conv;
            spec[k] = 0;
            put_formatted(c, &b, tmp, sizeof tmp, snprintf(tmp, sizeof tmp, spec, jinja_as_double(v)));
            break;
        }
        default: jinja_fail(c, JINJA_ERR_RENDER, "unsupported format character '%c'", conv);
        }
    }
    if (!tuple && args.t != JT_DICT && args.t != JT_LIST && next == 0) // lists pass as mappings
        jinja_fail(c, JINJA_ERR_RENDER, "not all arguments converted during string formatting");
    if (tuple && next < tuple->n)
        jinja_fail(c, JINJA_ERR_RENDER, "not all arguments converted during string formatting");
    return jinja_buf_value(&b);
}

static bool is_line_break(uint32_t cp) {
    return cp == '\n' || cp == '\r' || cp == '\v' || cp == '\f' || (cp >= 0x1c && cp <= 0x1e) ||
           cp == 0x85 || cp == 0x2028 || cp == 0x2029;
}

/* str.jinja_str_splitlines() */
struct jv jinja_str_splitlines(struct jinja_ctx *c, struct jv s, bool keepends) {
    struct jinja_vec out = {0};
    size_t i = 0, st = 0;
    while (i < s.s.n) {
        uint32_t cp;
        size_t len = jinja_utf8_decode(s.s.p + i, s.s.n - i, &cp);
        if (!is_line_break(cp)) {
            i += len;
            continue;
        }
        size_t end = i;
        i += len;
        if (cp == '\r' && i < s.s.n && s.s.p[i] == '\n') i++;
        jinja_vec_push(c, &out, jv_str(s.s.p + st, (keepends ? i : end) - st));
        st = i;
    }
    if (st < s.s.n) jinja_vec_push(c, &out, jv_str(s.s.p + st, s.s.n - st));
    return jinja_vec_list(c, &out, false);
}

/* ---- methods ------------------------------------------------------------------------- */

struct jv jinja_str_pad(struct jinja_ctx *c, struct jv s, int64_t width, int where,
                        const char *fill) {
    int64_t n = (int64_t)jinja_utf8_count(s.s.p, s.s.n);
    if (width > (int64_t)c->lim.max_output) jinja_fail(c, JINJA_ERR_LIMIT, "width too large");
    if (width <= n) return s;
    int64_t total = width - n, left = where < 0 ? 0 : where > 0 ? total : total / 2;
    if (where == 0 && (total & width & 1)) left++; // Python's center() rounding
    struct jinja_buf b = jinja_buf_tmp(c);
    size_t fl = strlen(fill);
    for (int64_t i = 0; i < left; i++) jinja_buf_put(c, &b, fill, fl);
    jinja_buf_put(c, &b, s.s.p, s.s.n);
    for (int64_t i = left; i < total; i++) jinja_buf_put(c, &b, fill, fl);
    return jinja_buf_value(&b);
}

static struct jv str_method(struct jinja_ctx *c, struct jv s, const char *name,
                            const struct jinja_callargs *a) {
    const struct jv *a0 = jinja_arg(a, 0, NULL), *a1 = jinja_arg(a, 1, NULL);
    if (!strcmp(name, "startswith")) return jv_bool(affix(c, s, a0, false));
    if (!strcmp(name, "endswith")) return jv_bool(affix(c, s, a0, true));
    if (!strcmp(name, "strip")) return jinja_str_strip(s, jinja_strip_chars(c, a), true, true);
    if (!strcmp(name, "lstrip")) return jinja_str_strip(s, jinja_strip_chars(c, a), true, false);
    if (!strcmp(name, "rstrip")) return jinja_str_strip(s, jinja_strip_chars(c, a), false, true);
    if (!strcmp(name, "split") || !strcmp(name, "rsplit")) {
        const struct jv *sep = jinja_arg(a, 0, "sep"), *max = jinja_arg(a, 1, "maxsplit");
        if (jinja_given(sep)) jinja_need_str(c, sep, "separator");
        return split(c, s, jinja_given(sep) ? sep : NULL,
                     max ? jinja_need_int(c, max, "maxsplit") : -1, name[0] == 'r');
    }
    if (!strcmp(name, "splitlines"))
        return jinja_str_splitlines(c, s, jinja_arg_bool(a, 0, "keepends", false));
    if (!strcmp(name, "replace")) {
        const struct jv *cnt = jinja_arg(a, 2, "count");
        return jinja_str_replace(c, s, jinja_need_str(c, a0, "replace argument"),
                                 jinja_need_str(c, a1, "replace argument"),
                                 cnt ? jinja_need_int(c, cnt, "count") : -1);
    }
    if (!strcmp(name, "upper")) return jinja_str_recase(c, s, JINJA_CASE_UPPER);
    if (!strcmp(name, "lower") || !strcmp(name, "casefold"))
        return jinja_str_recase(c, s, JINJA_CASE_LOWER);
    if (!strcmp(name, "title")) return jinja_str_recase(c, s, JINJA_CASE_TITLE);
    if (!strcmp(name, "capitalize")) return jinja_str_recase(c, s, JINJA_CASE_CAPITALIZE);
    if (!strcmp(name, "swapcase")) return jinja_str_recase(c, s, JINJA_CASE_SWAP);
    if (!strcmp(name, "find") || !strcmp(name, "index") || !strcmp(name, "rfind") ||
        !strcmp(name, "rindex")) {
        struct jv sub = jinja_need_str(c, a0, "substring");
        bool r = name[0] == 'r';
        const char *q = r ? jinja_rmemmem(s.s.p, s.s.n, sub.s.p, sub.s.n)
                          : (sub.s.n ? memmem(s.s.p, s.s.n, sub.s.p, sub.s.n) : s.s.p);
        if (!q) {
            if (strstr(name, "index")) jinja_fail(c, JINJA_ERR_RENDER, "substring not found");
            return jv_int(-1);
        }
        return jv_int((int64_t)cp_index(s.s.p, (size_t)(q - s.s.p)));
    }
    if (!strcmp(name, "count")) {
        struct jv sub = jinja_need_str(c, a0, "substring");
        if (sub.s.n == 0) return jv_int((int64_t)jinja_utf8_count(s.s.p, s.s.n) + 1);
        int64_t n = 0;
        const char *p = s.s.p, *end = s.s.p + s.s.n, *q;
        while ((q = memmem(p, (size_t)(end - p), sub.s.p, sub.s.n))) {
            n++;
            p = q + sub.s.n;
        }
        return jv_int(n);
    }
    if (!strcmp(name, "join")) {
        const struct jinja_list *l = jinja_iterate(c, a0 ? *a0 : jv_undef(NULL));
        struct jinja_buf b = jinja_buf_tmp(c);
        for (size_t i = 0; i < l->n; i++) {
            if (i) jinja_buf_put(c, &b, s.s.p, s.s.n);
            struct jv x = jinja_need_str(c, &l->v[i], "sequence item");
            jinja_buf_put(c, &b, x.s.p, x.s.n);
        }
        return jinja_buf_value(&b);
    }
    if (!strcmp(name, "isdigit") || !strcmp(name, "isnumeric") || !strcmp(name, "isdecimal"))
        return jv_bool(jinja_str_all(s, JINJA_CHARS_DIGIT));
    if (!strcmp(name, "isalpha")) return jv_bool(jinja_str_all(s, JINJA_CHARS_ALPHA));
    if (!strcmp(name, "isalnum")) return jv_bool(jinja_str_all(s, JINJA_CHARS_ALNUM));
    if (!strcmp(name, "isspace")) return jv_bool(jinja_str_all(s, JINJA_CHARS_SPACE));
    if (!strcmp(name, "islower")) return jv_bool(jinja_str_all(s, JINJA_CHARS_LOWER));
    if (!strcmp(name, "isupper")) return jv_bool(jinja_str_all(s, JINJA_CHARS_UPPER));
    if (!strcmp(name, "removeprefix")) {
        struct jv x = jinja_need_str(c, a0, "prefix");
        return str_has_prefix(s, x) ? jv_str(s.s.p + x.s.n, s.s.n - x.s.n) : s;
    }
    if (!strcmp(name, "removesuffix")) {
        struct jv x = jinja_need_str(c, a0, "suffix");
        return str_has_suffix(s, x) && x.s.n ? jv_str(s.s.p, s.s.n - x.s.n) : s;
    }
    if (!strcmp(name, "format")) return str_format(c, s, a);
    if (!strcmp(name, "center") || !strcmp(name, "ljust") || !strcmp(name, "rjust")) {
        const char *fill = a1 ? jinja_cstr(c, jinja_need_str(c, a1, "fill character")) : " ";
        int where = name[0] == 'c' ? 0 : name[0] == 'l' ? -1 : 1;
        return jinja_str_pad(c, s, jinja_need_int(c, a0, "width"), where, fill);
    }
    if (!strcmp(name, "zfill")) {
        int64_t w = jinja_need_int(c, a0, "width");
        bool sign = s.s.n && (s.s.p[0] == '-' || s.s.p[0] == '+');
        struct jv body = sign ? jv_str(s.s.p + 1, s.s.n - 1) : s;
        struct jv padded = jinja_str_pad(c, body, sign ? w - 1 : w, 1, "0");
        if (!sign) return padded;
        struct jinja_buf b = jinja_buf_tmp(c);
        jinja_buf_put(c, &b, s.s.p, 1);
        jinja_buf_put(c, &b, padded.s.p, padded.s.n);
        return jinja_buf_value(&b);
    }
    if (!strcmp(name, "partition") || !strcmp(name, "rpartition")) {
        struct jv sep = jinja_need_str(c, a0, "separator");
        if (!sep.s.n) jinja_fail(c, JINJA_ERR_RENDER, "empty separator");
        bool r = name[0] == 'r';
        const char *q = r ? jinja_rmemmem(s.s.p, s.s.n, sep.s.p, sep.s.n)
                          : memmem(s.s.p, s.s.n, sep.s.p, sep.s.n);
        struct jv t = jv_list_new(c, 3, true);
        if (!q) {
            t.l->v[0] = r ? jv_str("", 0) : s;
            t.l->v[1] = jv_str("", 0);
            t.l->v[2] = r ? s : jv_str("", 0);
            return t;
        }
        size_t at = (size_t)(q - s.s.p);
        t.l->v[0] = jv_str(s.s.p, at);
        t.l->v[1] = sep;
        t.l->v[2] = jv_str(s.s.p + at + sep.s.n, s.s.n - at - sep.s.n);
        return t;
    }
    jinja_fail(c, JINJA_ERR_RENDER, "str has no method '%s'", name);
}

struct jv jinja_call_method(struct jinja_ctx *c, struct jv self, const char *name,
                            const struct jinja_callargs *a) {
    const struct jv *a0 = jinja_arg(a, 0, NULL);
    switch (self.t) {
    case JT_STR: return str_method(c, self, name, a);
    case JT_LIST:
        if (!strcmp(name, "index") || !strcmp(name, "count")) {
            if (!a0) jinja_fail(c, JINJA_ERR_RENDER, "list.%s takes one argument", name);
            int64_t n = 0;
            for (size_t i = 0; i < self.l->n; i++)
                if (jinja_equal(self.l->v[i], *a0)) {
                    if (name[0] == 'i') return jv_int((int64_t)i);
                    n++;
                }
            if (name[0] == 'i') jinja_fail(c, JINJA_ERR_RENDER, "value is not in list");
            return jv_int(n);
        }
        break;
    case JT_DICT:
        if (!strcmp(name, "items") || !strcmp(name, "keys") || !strcmp(name, "values")) {
            struct jv l = jv_list_new(c, self.d->n, false);
            for (size_t i = 0; i < self.d->n; i++)
                l.l->v[i] = name[0] == 'i'   ? jinja_pair(c, self.d->k[i], self.d->v[i])
                            : name[0] == 'k' ? self.d->k[i]
                                             : self.d->v[i];
            return l;
        }
        if (!strcmp(name, "get")) {
            if (!a0) jinja_fail(c, JINJA_ERR_RENDER, "dict.get takes a key");
            for (size_t i = 0; i < self.d->n; i++)
                if (jinja_equal(self.d->k[i], *a0)) return self.d->v[i];
            const struct jv *def = jinja_arg(a, 1, "default");
            return def ? *def : jv_none();
        }
        if (!strcmp(name, "copy")) return self;
        break;
    case JT_LOOP:
        if (!strcmp(name, "cycle")) {
            if (a->n == 0) jinja_fail(c, JINJA_ERR_RENDER, "no items for cycling given");
            return a->pos[(size_t)self.loop->index0 % a->n];
        }
        break;
    default: break;
    }
    jinja_fail(c, JINJA_ERR_RENDER, "access to attribute '%s' of '%s' object is unsafe", name,
               jinja_type_name(self));
}
