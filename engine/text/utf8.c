#include "engine/text/utf8.h"

#include <string.h>
#include <utf8proc.h>

/* Valid byte ranges (Unicode Table 3-7): the second byte's range depends on the lead byte, the
 * others are always 80..BF. */
size_t utf8_scan(const unsigned char *s, size_t n, bool *complete, bool *cut) {
    *complete = false;
    *cut = false;
    unsigned char c = s[0];
    if (c < 0x80) {
        *complete = true;
        return 1;
    }
    size_t need;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) need = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0) lo = 0xA0;
        else if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0) lo = 0x90;
        else if (c == 0xF4) hi = 0x8F;
    } else {
        return 0; // 80..C1, F5..FF never start a character
    }
    size_t i = 1;
    for (; i < need; i++) {
        if (i >= n) {
            *cut = true;
            return i;
        }
        unsigned char b = s[i];
        if (b < lo || b > hi) return i;
        lo = 0x80;
        hi = 0xBF;
    }
    *complete = true;
    return need;
}

bool utf8_valid(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        // ASCII fast path, 8 bytes at a time
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, p + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= n) break;
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        bool complete, cut;
        size_t k = utf8_scan(p + i, n - i, &complete, &cut);
        if (!complete) return false;
        i += k;
    }
    return true;
}

size_t utf8_decode(const char *s, size_t n, uint32_t *cp) {
    const unsigned char *p = (const unsigned char *)s;
    size_t len = utf8_len(p[0]);
    if (len > n) len = 1;
    switch (len) {
    case 1: *cp = p[0]; break;
    case 2: *cp = ((uint32_t)(p[0] & 0x1F) << 6) | (p[1] & 0x3F); break;
    case 3: *cp = ((uint32_t)(p[0] & 0x0F) << 12) | ((uint32_t)(p[1] & 0x3F) << 6) | (p[2] & 0x3F); break;
    default:
        *cp = ((uint32_t)(p[0] & 0x07) << 18) | ((uint32_t)(p[1] & 0x3F) << 12) |
              ((uint32_t)(p[2] & 0x3F) << 6) | (p[3] & 0x3F);
        break;
    }
    return len;
}

size_t utf8_encode(uint32_t cp, char out[4]) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

bool utf8_is_space(uint32_t cp) {
    switch (cp) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20: case 0x85: case 0xA0:
    case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
        return true;
    default:
        return cp >= 0x2000 && cp <= 0x200A;
    }
}

bool utf8_is_word(uint32_t cp) {
    if (cp < 0x80) return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_';
    if (cp == 0x200C || cp == 0x200D) return true;
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC:
        return true;
    default:
        return false;
    }
}

size_t utf8_lossy(const char *in, size_t n, char *out) {
    struct utf8_lossy_stream st = {{0}, 0};
    size_t o = utf8_lossy_feed(&st, in, n, out);
    return o + utf8_lossy_finish(&st, out + o);
}

size_t utf8_lossy_feed(struct utf8_lossy_stream *st, const char *in, size_t n, char *out) {
    unsigned char tmp[8];
    size_t o = 0;
    const unsigned char *p = (const unsigned char *)in;
    // First finish the held character, using at most 3 new bytes.
    while (st->n_pend > 0 && n > 0) {
        size_t take = n < 3 ? n : 3;
        memcpy(tmp, st->pend, st->n_pend);
        memcpy(tmp + st->n_pend, p, take);
        size_t avail = st->n_pend + take;
        bool complete, cut;
        size_t k = utf8_scan(tmp, avail, &complete, &cut);
        if (cut) { // still incomplete: every new byte extended it
            memcpy(st->pend, tmp, avail);
            st->n_pend = avail;
            return o;
        }
        if (complete) {
            memcpy(out + o, tmp, k);
            o += k;
        } else {
            memcpy(out + o, UTF8_REPLACEMENT, 3);
            o += 3;
            if (k == 0) k = 1;
        }
        // k bytes of tmp are consumed; the ones that came from `in` are gone from the input
        size_t used_new = k > st->n_pend ? k - st->n_pend : 0;
        if (k < st->n_pend) { // part of the held bytes remain: shift them and retry
            memmove(st->pend, st->pend + k, st->n_pend - k);
            st->n_pend -= k;
            continue;
        }
        st->n_pend = 0;
        p += used_new;
        n -= used_new;
    }
    if (st->n_pend > 0) return o; // n == 0
    size_t i = 0;
    while (i < n) {
        if (p[i] < 0x80) {
            out[o++] = (char)p[i++];
            continue;
        }
        bool complete, cut;
        size_t k = utf8_scan(p + i, n - i, &complete, &cut);
        if (cut) {
            memcpy(st->pend, p + i, k);
            st->n_pend = k;
            return o;
        }
        if (complete) {
            memcpy(out + o, p + i, k);
            o += k;
            i += k;
        } else {
            memcpy(out + o, UTF8_REPLACEMENT, 3);
            o += 3;
            i += k ? k : 1;
        }
    }
    return o;
}

size_t utf8_lossy_finish(struct utf8_lossy_stream *st, char *out) {
    // Held bytes are always one valid but cut prefix: one replacement character.
    size_t had = st->n_pend;
    st->n_pend = 0;
    if (!had) return 0;
    memcpy(out, UTF8_REPLACEMENT, 3);
    return 3;
}
