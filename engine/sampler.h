/* sampler: turns one row of logits into a token: greedy or seeded temperature sampling, and the
 * log-probabilities reported to users. Pure functions of their inputs; thread-safe. */
#ifndef DUO_SAMPLER_H
#define DUO_SAMPLER_H

#include <stdint.h>

#include "engine/backend.h"
#include "engine/util.h"

/* First index of the maximum (torch.argmax's tie rule). */
int sampler_argmax(const float *logits, int n);

/* out[i] = log_softmax(logits)[i], computed in double for the normaliser. */
void sampler_log_softmax(const float *logits, int n, float *out);

/* The k largest of logprobs[n], largest first (ties: lower id first). */
void sampler_top_k(const float *logprobs, int n, int k, int32_t *ids, float *vals);


/* Per-choice sampling state and the full pipeline in vLLM's order (struct sample_row in
 * engine/backend.h): logit bias, min_tokens masking, repetition / presence / frequency
 * penalties, temperature, top-k, softmax, min-p, top-p, seeded draw. sampler_run is the
 * definition the backends' sample op follows (the CPU backend calls it). */
struct engine_sampling;

struct sampler_seq {
    struct util_rng rng;
    struct sample_seen *seen; // [n_seen] ids of the prompt (repetition penalty) and the output, one entry each
    int n_seen, seen_cap;
    int32_t *slot;            // [vocab] 1 + index in seen, 0 = not seen; NULL when no penalty is used
    const uint32_t *allow;    // structured output: the token mask of the next draw (engine/token_mask.h),
                              // borrowed, set by the caller before each draw; NULL: unconstrained
};

/* Seeds the RNG (seed and choice index, so n > 1 choices differ but reproduce) and allocates
 * the penalty state the parameters need. Returns 0 or -1 (out of memory). */
int sampler_seq_init(struct sampler_seq *s, const struct engine_sampling *sp, uint64_t seed, int choice, int vocab,
                     const int32_t *prompt, int n_prompt);
void sampler_seq_free(struct sampler_seq *s);
/* Records a generated token (penalty state). */
void sampler_seq_accept(struct sampler_seq *s, int32_t id);

/* The parameters of s's next draw (row 0; p borrows sp's, s's and mask's arrays, and s->allow).
 * n_generated is the number of tokens generated so far; mask/n_mask are the ids min_tokens masks
 * (EOS and stop ids). Takes u from s->rng unless the draw is greedy, as the pipeline always has. */
void sampler_row(struct sample_row *p, struct sampler_seq *s, const struct engine_sampling *sp, int n_generated,
                 const int32_t *mask, int n_mask);

/* Working space of sampler_run, in rows of vocab floats. */
#define SAMPLER_SCRATCH_ROWS 3

/* The draw p on one row of logits (modified in place); scratch[SAMPLER_SCRATCH_ROWS * vocab] is
 * working space. Returns the id. With p->allow, ids outside it get -inf before anything else (as
 * vLLM applies the grammar bitmask before its sampler); when it allows none, the argmax of the
 * row comes back, so callers check a mask is not empty first. */
int sampler_run(const struct sample_row *p, float *logits, int vocab, float *scratch);

/* sampler_row, then sampler_run on logits (modified in place; scratch[SAMPLER_SCRATCH_ROWS * vocab]). */
int sampler_pick(struct sampler_seq *s, const struct engine_sampling *sp, float *logits, int vocab, int n_generated,
                 const int32_t *mask, int n_mask, float *scratch);

#endif
