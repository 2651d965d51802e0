/* token_mask: which tokens of a vocabulary keep a grammar state (engine/grammar.h) valid.
 *
 * A token_mask_vocab holds a tokenizer's token byte strings (tokenizer_token_bytes) in a trie,
 * built once per tokenizer. A token_mask pairs it with one grammar and caches:
 * - per automaton node, the tokens accepted from that node whatever lies below it on the stack
 *   (a walk of the trie against the node's rule, pruning dead branches), and the few trie nodes
 *   where the rule ends with token bytes left, which are walked against the real stack per fill;
 * - per whole state (stacks of at most 128 frames in all), the finished mask,
 * so that a mask for a state seen before is a copy, and one for a new state costs the walks of
 * the tokens that leave the node's rule (tens of microseconds), not a walk of the vocabulary.
 *
 * Special tokens are never allowed, except the EOS ids (tokenizer_eos_ids) when the state is
 * accepting; tokens with no bytes are never allowed.
 *
 * Threads: a vocab is immutable and may be shared; a token_mask (its caches) belongs to one
 * thread at a time. */
#ifndef DUO_TOKEN_MASK_H
#define DUO_TOKEN_MASK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/grammar.h"

struct tokenizer;
struct token_mask_vocab;

/* Builds the trie of tok's tokens for masks of n_vocab bits (the model's vocabulary, which may be
 * larger than the tokenizer's; 0: the tokenizer's). Returns 0 or GRAMMAR_ERR_NOMEM /
 * GRAMMAR_ERR_LIMIT with a message in err. */
int token_mask_vocab_build(struct token_mask_vocab **out, const struct tokenizer *tok, int n_vocab, char *err,
                           size_t errlen);
void token_mask_vocab_free(struct token_mask_vocab *v);
int token_mask_vocab_size(const struct token_mask_vocab *v);
/* 32-bit words of a mask: bit (id % 32) of word id / 32 is token id. */
size_t token_mask_words(const struct token_mask_vocab *v);
/* The bytes token id adds to the text (as the first token of the text when first), or NULL with
 * *len 0 for ids that are never allowed (special, empty, out of range). */
const uint8_t *token_mask_token_bytes(const struct token_mask_vocab *v, int32_t id, bool first, size_t *len);

struct token_mask_options {
    size_t node_cache_bytes;  // per-node entries [64 MiB]; over it the cache starts again
    size_t state_cache_bytes; // whole-state masks [8 MiB]
};

struct token_mask;

/* g and v are borrowed and must outlive m; opt may be NULL. */
int token_mask_init(struct token_mask **out, const struct grammar *g, const struct token_mask_vocab *v,
                    const struct token_mask_options *opt);
void token_mask_free(struct token_mask *m);

/* bits[token_mask_words(v)] = the tokens that keep s valid. at_start: the token begins the text
 * (tokenizer_stream_at_start), where SentencePiece tokens lose their leading space. Returns 0,
 * or GRAMMAR_ERR_LIMIT / GRAMMAR_ERR_NOMEM (bits undefined). An all-zero mask means the state is
 * stuck (only reachable past max_stack). */
int token_mask_fill(struct token_mask *m, const struct grammar_state *s, bool at_start, uint32_t *bits);

/* Advances s by token id: 0, GRAMMAR_REJECT (s unchanged) for a token the mask would not allow,
 * or an error. An EOS id is accepted (s unchanged) when s is accepting. */
int token_mask_accept(struct token_mask *m, struct grammar_state *s, int32_t id, bool at_start);

struct token_mask_stats {
    uint64_t fills;        // token_mask_fill calls
    uint64_t state_hits;   // answered from the whole-state cache
    uint64_t node_walks;   // per-node entries computed (walks of the trie)
    uint64_t direct_walks; // stacks too deep for the node cache, walked whole
};
void token_mask_get_stats(const struct token_mask *m, struct token_mask_stats *st);
/* Bytes m holds now (its caches grow up to token_mask_options' bounds). */
size_t token_mask_memory(const struct token_mask *m);

#endif
