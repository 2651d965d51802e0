/* sampler: turns one row of logits into a token: greedy or seeded temperature sampling, and the
 * log-probabilities reported to users. Pure functions of their inputs; thread-safe. */
#ifndef DUO_SAMPLER_H
#define DUO_SAMPLER_H

#include <stdint.h>

#include "engine/util.h"

/* First index of the maximum (torch.argmax's tie rule). */
int sampler_argmax(const float *logits, int n);

/* out[i] = log_softmax(logits)[i], computed in double for the normaliser. */
void sampler_log_softmax(const float *logits, int n, float *out);

/* The k largest of logprobs[n], largest first (ties: lower id first). */
void sampler_top_k(const float *logprobs, int n, int k, int32_t *ids, float *vals);

/* Greedy when temperature == 0, else a draw from softmax(logits / temperature) with rng. */
int sampler_sample(const float *logits, int n, float temperature, struct util_rng *rng);

#endif

/* Per-choice sampling state and the full pipeline (vLLM order): logit bias, min_tokens masking,
 * repetition / presence / frequency penalties, temperature, top-k, top-p, min-p, seeded draw. */
struct engine_sampling;

struct sampler_seq {
    struct util_rng rng;
    int32_t *counts;   // [vocab] occurrences in the output, when penalties are used (else NULL)
    uint8_t *in_prompt; // [vocab] token seen in prompt or output, for repetition_penalty (else NULL)
};

/* Seeds the RNG (seed and choice index, so n > 1 choices differ but reproduce) and allocates
 * the penalty state the parameters need. Returns 0 or -1 (out of memory). */
int sampler_seq_init(struct sampler_seq *s, const struct engine_sampling *sp, uint64_t seed, int choice, int vocab,
                     const int32_t *prompt, int n_prompt);
void sampler_seq_free(struct sampler_seq *s);
/* Records a generated token (penalty state). */
void sampler_seq_accept(struct sampler_seq *s, int32_t id);

/* Samples from logits (modified in place; scratch[vocab] is working space). n_generated is the
 * number of tokens generated so far; eos/n_eos are the ids min_tokens masks. */
int sampler_pick(struct sampler_seq *s, const struct engine_sampling *sp, float *logits, int vocab, int n_generated,
                 const int32_t *eos, int n_eos, float *scratch);
