/* utf8: small UTF-8 helpers for the tokenizer: validation, code point decode/encode, a few
 * Unicode character predicates, and lossy decoding that matches Rust's
 * String::from_utf8_lossy (one U+FFFD per maximal invalid subpart, as the Unicode standard's
 * "substitution of maximal subparts" practice says), in one shot or fed in pieces.
 * Pure functions on caller memory; any thread. */
#ifndef DUO_UTF8_H
#define DUO_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define UTF8_REPLACEMENT "\xEF\xBF\xBD" // U+FFFD, 3 bytes

/* True when s[0..n) is well-formed UTF-8 (no surrogates, no overlongs, <= U+10FFFF). */
bool utf8_valid(const char *s, size_t n);

/* Length of the character starting with lead byte c, assuming valid UTF-8 (1 for a stray byte). */
static inline size_t utf8_len(unsigned char c) {
    return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
}

/* Code points in s[0..n) (UTF-8): the bytes that are not continuation bytes. */
static inline size_t utf8_count(const char *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += ((unsigned char)s[i] & 0xC0) != 0x80;
    return k;
}

/* Decodes the character at s (valid UTF-8, n > 0 bytes available) into *cp; returns its length. */
size_t utf8_decode(const char *s, size_t n, uint32_t *cp);

/* Encodes cp (<= U+10FFFF) into out; returns the number of bytes (1..4). */
size_t utf8_encode(uint32_t cp, char out[4]);

/* Rust char::is_whitespace (Unicode White_Space). */
bool utf8_is_space(uint32_t cp);
/* Rust regex \w: letters, marks, decimal/other numbers, connector punctuation, ZWJ/ZWNJ. */
bool utf8_is_word(uint32_t cp);

/* Examines the sequence at s[0..n), n > 0. Returns the length of its maximal valid prefix
 * (0 when s[0] cannot start a character). *complete says that prefix is a whole character;
 * *cut says it is an incomplete prefix that stopped only because the input ended. */
size_t utf8_scan(const unsigned char *s, size_t n, bool *complete, bool *cut);

/* Lossy decode of in[0..n) into out, which must hold 3 * n bytes. Returns bytes written. */
size_t utf8_lossy(const char *in, size_t n, char *out);

/* The same, fed in pieces: a trailing incomplete character is held back until more bytes come
 * or finish() replaces it. Concatenated output equals utf8_lossy() of all input. */
struct utf8_lossy_stream {
    unsigned char pend[4]; // held bytes of an incomplete character
    size_t n_pend;         // 0..3
};
/* out must hold 3 * (n + 3) bytes. Returns bytes written. */
size_t utf8_lossy_feed(struct utf8_lossy_stream *st, const char *in, size_t n, char *out);
/* out must hold 3 bytes. Returns bytes written (0 or 3) and resets the stream. */
size_t utf8_lossy_finish(struct utf8_lossy_stream *st, char *out);

#endif
