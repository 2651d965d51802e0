/* generate: runs one request to completion on a model (prefill in chunks, then decode one
 * token per step). The CLI's `generate` uses it until the engine's scheduler runs requests;
 * tests use it as the simplest correct driver of the forward pass. Engine thread only. */
#ifndef DUO_GENERATE_H
#define DUO_GENERATE_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/model.h"

struct gen_params {
    int max_tokens;    // tokens to generate
    float temperature; // 0 = greedy
    uint64_t seed;
    int top_logprobs;  // K most likely tokens reported per generated position (0..20)
    int prefill_chunk; // prompt tokens per forward step (>= 1)
    bool ignore_eos;   // keep going past an EOS id of the config
};

struct gen_result {
    int32_t *ids;       // [n] generated ids
    int n;
    int32_t *top_ids;   // [n][top_logprobs]
    float *top_lps;     // [n][top_logprobs]
    bool stopped_eos;   // finished on an EOS id (included in ids)
};

int generate_run(struct model *m, const int32_t *prompt, int n_prompt, const struct gen_params *p,
                 struct gen_result *out, char *err, size_t errlen);
void gen_result_free(struct gen_result *r);

#endif
