/* cuda_common: error checks shared by the CUDA sources. Every CUDA and cuBLAS call goes through
 * these so a failure reports the statement and file:line (ggml's CUDA_CHECK_GEN). */
#ifndef DUO_CUDA_COMMON_H
#define DUO_CUDA_COMMON_H

#include <cuda_runtime.h>
#include <stdio.h>

#define CUDA_CHECK(stmt)                                                                       \
    do {                                                                                       \
        cudaError_t e_ = (stmt);                                                               \
        if (e_ != cudaSuccess) {                                                               \
            fprintf(stderr, "duoserve: CUDA error %s (%s) in %s at %s:%d\n", cudaGetErrorName(e_), \
                    cudaGetErrorString(e_), #stmt, __FILE__, __LINE__);                        \
            return -2;                                                                         \
        }                                                                                      \
    } while (0)

static inline unsigned cuda_blocks(size_t n, unsigned threads) { return (unsigned)((n + threads - 1) / threads); }

#endif
