/* warmup: requests of the engine's own, run by engine_create before the engine reports ready,
 * so that the first client does not pay for what happens once. On a GPU, kernels load on their
 * first launch, buffers grow to size and each decode batch size captures its CUDA graph on
 * first sight, all of which would otherwise slow the first requests.
 * Leaves no trace: every request finishes (its KV freed, which is checked), seeds are fixed
 * (the generator of unseeded requests is untouched) and the counters are zeroed. The core's
 * thread only. */
#ifndef DUO_WARMUP_H
#define DUO_WARMUP_H

#include <stddef.h>

struct core;

/* Decode batches larger than this run without a CUDA graph. */
#define WARMUP_MAX_BATCH 512

/* max_batch 0: one tiny forward pass (the CPU, which has nothing to warm but its caches).
 * Else n = min(max_batch, WARMUP_MAX_BATCH) requests with 2-token prompts (the first one
 * longer, for the prefill kernels), request i generating i + 2 tokens, so that after their
 * prefill the decode steps run at batch n, n - 1, ..., 1; half of them greedy, half sampled.
 * Returns the number of forward passes, or -1 with a message. */
int warmup_run(struct core *c, int max_batch, char *err, size_t errlen);

#endif
