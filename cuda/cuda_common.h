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

#ifdef __CUDACC__
#include <stdlib.h>

// Programmatic dependent launch (PDL), opt-in with DUOSERVE_PDL=1: kernels queued with
// cuda_launch may then start while the kernel before them drains. Each kernel calls
// pdl_trigger() (its successor may launch once every block of this one has started) and
// pdl_wait() before it touches memory an earlier kernel writes or reads (weights excepted: a
// GEMM streams its first weight tiles before waiting). Without PDL both are no-ops. Off by
// default: on the H200 it made decode steps slower (batch 1: 11.0 ms with, 9.7 ms without).
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;\n" ::); }

// argmax pairs (value, index): keep the larger value, the lower index on ties (torch.argmax's
// rule); a warp's pairs combined into every lane's.
__device__ __forceinline__ void argmax_take(float &best, int &bi, float v, int i) {
    if (v > best || (v == best && i < bi)) best = v, bi = i;
}
__device__ __forceinline__ void warp_argmax(float &best, int &bi) {
    for (int o = 16; o > 0; o >>= 1)
        argmax_take(best, bi, __shfl_xor_sync(0xffffffffu, best, o), __shfl_xor_sync(0xffffffffu, bi, o));
}

static inline bool cuda_pdl_on(void) {
    static int on = -1;
    if (on < 0) {
        const char *v = getenv("DUOSERVE_PDL");
        on = v && v[0] == '1';
    }
    return on != 0;
}

template <typename... KArgs, typename... Args>
static cudaError_t cuda_launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                               Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = cuda_pdl_on() ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kernel, (KArgs)args...);
}
#endif

#endif
