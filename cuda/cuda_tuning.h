/* cuda_tuning: the CUDA backend's tuning switches, read from the environment once, when a CUDA
 * backend is made (backend_cuda_probe checks them, backend_cuda_create keeps them in its
 * context). Each is a speed or profiling choice: a token's bits are the same under every value.
 * docs/TUNING.md says what each does and when to use it. Plain C, no CUDA: it builds (and its
 * unit test runs) without nvcc. */
#ifndef DUO_CUDA_TUNING_H
#define DUO_CUDA_TUNING_H

#include <stdbool.h>
#include <stddef.h>

struct cuda_tuning {
    bool no_graphs;              // DUOSERVE_NO_CUDA_GRAPHS=1: decode steps run op by op, no CUDA graphs
    bool op_timing;              // DUOSERVE_OP_TIMING=1: each op's GPU time, logged when the backend goes
    bool norm_pdl;               // DUOSERVE_NORM_PDL (1): decode-step norms start while the GEMM before runs
    bool attn_wg;                // DUOSERVE_ATTN_WG (1): prefill attention through the wgmma kernel (0: the flash kernel)
    unsigned stream_k_min_units; // DUOSERVE_STREAM_K_MIN_UNITS (8192): weight streams of this many
                                 // (strip, K chunk) units or more, on a grid short of a wave, go stream-K
};

/* Fills t with the defaults, then with each switch that is set. The rule, the same for every
 * switch: the value is a decimal number of digits only, within the switch's range (0 or 1 for
 * an on/off switch). Anything else (empty, a sign, a space, other characters, out of range) is
 * an error: returns -1 with a message in err naming the variable, its value and what it takes
 * (t then holds the defaults). Returns 0 otherwise. */
#ifdef __cplusplus
extern "C" {
#endif
int cuda_tuning_parse(struct cuda_tuning *t, char *err, size_t errlen);
#ifdef __cplusplus
}
#endif

#endif
