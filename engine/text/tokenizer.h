/* tokenizer: a Hugging Face `tokenizer.json` tokenizer (BPE models: byte-level as in GPT-2,
 * Llama-3 and Qwen2/3; SentencePiece-style with byte fallback as in Llama-2 and Mistral) and an
 * incremental detokenizer for streaming output.
 *
 * Encoding follows the `tokenizers` library pipeline: added/special tokens are split out of the
 * raw text first, then normalizer, pre-tokenizer, BPE model, and (when asked) the post-processor.
 * Decoding runs the decoder chain and produces valid UTF-8 (invalid bytes become U+FFFD exactly
 * as HF does). Decoding does not apply transformers' `clean_up_tokenization_spaces`.
 *
 * Threads: a loaded tokenizer is immutable, so encode/decode/lookups may run on any number of
 * threads at once. A struct tokenizer_stream belongs to one sequence and one thread at a time. */
#ifndef DUO_TOKENIZER_H
#define DUO_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum tokenizer_status {
    TOKENIZER_OK = 0,
    TOKENIZER_ERR_NOMEM = -1,
    TOKENIZER_ERR_IO = -2,           // a file is missing or unreadable
    TOKENIZER_ERR_JSON = -3,         // a file is not valid JSON
    TOKENIZER_ERR_FORMAT = -4,       // valid JSON with missing or inconsistent fields
    TOKENIZER_ERR_UNSUPPORTED = -5,  // a model/normalizer/pre-tokenizer/decoder type not implemented
    TOKENIZER_ERR_REGEX = -6,        // a pattern PCRE2 rejects, or a match failure
    TOKENIZER_ERR_INVALID_UTF8 = -7, // text given to encode is not valid UTF-8
    TOKENIZER_ERR_NOT_FOUND = -8,    // lookup of a token string that is not in the vocabulary
};

const char *tokenizer_strerror(int status);

struct tokenizer; // opaque, immutable once loaded

/* Loads dir/tokenizer.json (required), dir/tokenizer_config.json, dir/config.json and
 * dir/generation_config.json (optional: bos/eos ids and add_bos_token/add_eos_token). On error
 * returns a negative status and writes a one-line message naming the file and the problem into
 * err[errlen] (err may be NULL). */
int tokenizer_load(struct tokenizer **out, const char *dir, char *err, size_t errlen);
void tokenizer_free(struct tokenizer *tok);

/* Encodes text[0..len) (UTF-8) into a malloc'd array of *n_ids ids (caller frees; NULL when
 * *n_ids is 0). add_special=false equals HF `encode(text, add_special_tokens=False)`; true adds
 * what the post-processor adds (e.g. BOS), or what tokenizer_config.json's add_bos_token /
 * add_eos_token say when present, which is what transformers' `tokenizer(text)` gives. */
int tokenizer_encode(const struct tokenizer *tok, const char *text, size_t len, bool add_special,
                     int32_t **ids, size_t *n_ids);

/* Decodes ids into a malloc'd NUL-terminated UTF-8 string (caller frees) of *len bytes (len may
 * be NULL). Equals HF `decode(ids, skip_special_tokens)`; ids outside the vocabulary are
 * dropped, as HF does. The text holds a NUL byte where a token stands for byte 0 (<0x00>, or
 * "Ā" in byte-level vocabularies): use *len, not strlen, where that matters. */
int tokenizer_decode(const struct tokenizer *tok, const int32_t *ids, size_t n, bool skip_special,
                     char **text, size_t *len);

/* Number of ids: 1 + the largest id of the model vocabulary and the added tokens. The model's
 * embedding table may be larger; ids in between decode to nothing. */
size_t tokenizer_vocab_size(const struct tokenizer *tok);
/* The token string of id as HF's id_to_token gives it ("ĠHello", "▁the", "<s>"); NUL-terminated,
 * owned by tok. NULL when id is not a token. *len may be NULL. */
const char *tokenizer_id_to_piece(const struct tokenizer *tok, int32_t id, size_t *len);
/* The bytes id adds to a text: the decoder chain on that token alone, as a later token of a
 * sequence (SentencePiece's '▁' a space, <0xNN> its byte, a byte-level token its bytes; a
 * special token its content), or with first, as the token that begins the text (the first-token
 * rules of Metaspace and Strip: the leading space dropped). This is the token as logprobs show
 * it; not always UTF-8 on its own (a byte token, or a byte-level token holding part of a
 * character). Writes min(len, cap) bytes into buf (no NUL) and returns len; 0 for an id that is
 * not a token. */
size_t tokenizer_token_bytes(const struct tokenizer *tok, int32_t id, bool first, char *buf, size_t cap);
/* The id of a token string (added tokens first, then the model vocabulary). */
int tokenizer_piece_to_id(const struct tokenizer *tok, const char *piece, size_t len, int32_t *id);
/* BOS id, or -1 when the model has none. */
int32_t tokenizer_bos_id(const struct tokenizer *tok);
/* Primary EOS id (tokenizer_config.json's eos_token, else config.json's), or -1. */
int32_t tokenizer_eos_id(const struct tokenizer *tok);
/* Every id that ends generation: the primary EOS first, then the other eos_token_id entries of
 * config.json and generation_config.json. The array is owned by tok. Returns the count. */
size_t tokenizer_eos_ids(const struct tokenizer *tok, const int32_t **ids);
bool tokenizer_is_eos(const struct tokenizer *tok, int32_t id);
/* True for added tokens marked "special" (those skip_special drops when decoding). */
bool tokenizer_is_special(const struct tokenizer *tok, int32_t id);

/* Incremental detokenizer: fed one id at a time, returns the text that became final, each
 * character as soon as its last byte is in; no piece ends inside a UTF-8 character. Only what
 * may still change is held back: the bytes of an unfinished character (and trailing characters
 * a Strip decoder may drop). The concatenation of every piece (including flush) equals
 * tokenizer_decode() of all ids pushed (prime included), with one exception: HF's ByteFallback
 * turns a whole run of <0xNN> tokens into one U+FFFD per byte when any part of it is invalid,
 * which a stream cannot know early; here each character of a run that is complete and valid
 * stays, and each byte that cannot belong to one is a U+FFFD (runs wholly valid or wholly
 * invalid come out exactly as decode).
 * O(1) work per token besides the text itself. Fields are private. */
struct tokenizer_stream {
    const struct tokenizer *tok;
    bool skip_special;
    size_t n_tokens;            // non-skipped tokens seen (first-token rules of Strip/Metaspace)
    unsigned char pend[4];      // held bytes of an unfinished character (ByteFallback or ByteLevel)
    size_t n_pend;
    bool pend_primed;           // those bytes came from prime: the character is not output
    size_t lead_seen;           // Strip: leading chars examined so far
    bool lead_done;             // Strip: a non-stripped char went out
    size_t held;                // Strip: trailing strip chars held back
    char *out;                  // the piece returned by the last call
    size_t out_len, out_cap;
    size_t carry;               // bytes at the start of out that are earlier ids' text
    char *tmp[3];               // scratch for one token's text, bytes and decoded bytes
    size_t tmp_cap[3];
};

/* Starts a stream over tok (borrowed; must outlive the stream). Cannot fail. */
void tokenizer_stream_init(struct tokenizer_stream *s, const struct tokenizer *tok, bool skip_special);
/* Feeds ids whose text the caller does not want (the prompt), so that the next pushes continue
 * that sequence: no leading-space strip on the first generated token, and bytes that complete
 * or break a character the prompt left unfinished give no text (that character is the prompt's). */
int tokenizer_stream_prime(struct tokenizer_stream *s, const int32_t *ids, size_t n);
/* Feeds one id; *piece (NUL-terminated, owned by s, valid until the next call) gets the new text
 * of *len bytes (len may be NULL), possibly empty; like decode, it may hold NUL bytes. */
int tokenizer_stream_push(struct tokenizer_stream *s, int32_t id, const char **piece, size_t *len);
/* True until an id with text (not a skipped special token) went in, prompt included: the next
 * id begins the text (see tokenizer_token_bytes). */
bool tokenizer_stream_at_start(const struct tokenizer_stream *s);
/* How many bytes at the start of the last push's piece are the text of earlier ids: the U+FFFDs
 * of held bytes that this id showed cannot make a character. The id's own text follows them (a
 * character it finishes counts as its own). */
size_t tokenizer_stream_carried(const struct tokenizer_stream *s);
/* Ends the sequence: returns what was held back (U+FFFD for unfinished characters, exactly as
 * tokenizer_decode) and resets s to a fresh stream over the same tokenizer. */
int tokenizer_stream_flush(struct tokenizer_stream *s, const char **piece, size_t *len);
/* Frees s's buffers (s itself is the caller's). NULL is a no-op. */
void tokenizer_stream_free(struct tokenizer_stream *s);

#endif
