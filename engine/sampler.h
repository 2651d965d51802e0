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
