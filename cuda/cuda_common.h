/* cuda_common: error checks shared by the CUDA sources. Every CUDA and cuBLAS call goes through
 * these so a failure reports the statement and file:line (ggml's CUDA_CHECK_GEN). */
#ifndef DUO_CUDA_COMMON_H
#define DUO_CUDA_COMMON_H

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

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
// Programmatic dependent launch (PDL): a kernel launched with it may start while the kernel
// before it runs. pdl_trigger() lets the next kernel launch once every block of this one has
// called it (or exited); pdl_wait() blocks until the kernel before has finished and its writes
// are visible, and comes before any access to memory an earlier kernel writes or reads (weights
// and the step's metadata excepted). Three kinds of launch use it: the weight streams (their
// first two weight buffers load while the kernel before runs), the fused decode attention
// (metadata and past K/V rows load while the qkv GEMM runs) and a decode step's norms
// (DUOSERVE_NORM_PDL); every other launch (cuda_launch) waits for the kernel before to end.
// Short kernels and the weight stream trigger at their start; the tile GEMMs after their main
// loop. Every kernel waits in at least one block, so a kernel's end implies the end of all
// before it. Without PDL both are no-ops.
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;\n" ::); }

// The split reductions' fence (partials, then a count with atomicAdd; the last to count reads
// everyone's partials): a release/acquire fence at GPU scope. __threadfence() is fence.sc, a
// sequentially consistent fence that costs more and orders nothing these patterns need.
__device__ __forceinline__ void fence_acq_rel() { asm volatile("fence.acq_rel.gpu;\n" ::: "memory"); }

// RoPE of one pair (a, b) = (v[i], v[i + hd/2]) at angle pos * inv_freq (HF rotate_half); the
// rope kernel, the fused rope + KV append and the decode attention's fused RoPE share it, so
// all round alike. Every rounding is explicit (no FMA contraction), as in the CPU reference.
__device__ __forceinline__ void rope_sincos(int pos, float inv_freq, float &s, float &c) {
    sincosf((float)pos * inv_freq, &s, &c);
}
__device__ __forceinline__ void rope_rot(float a, float b, float s, float c, float &ra, float &rb) {
    ra = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    rb = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
}
__device__ __forceinline__ void rope_pair(float a, float b, int pos, float inv_freq, float &ra, float &rb) {
    float s, c;
    rope_sincos(pos, inv_freq, s, c);
    rope_rot(a, b, s, c, ra, rb);
}

// SwiGLU of one gate and up value (f32 from bf16): the silu_mul kernels and the fused SwiGLU
// GEMM epilogue share it, so both round alike.
__device__ __forceinline__ float silu_mul_f(float g, float u) { return g / (1.0f + __expf(-g)) * u; }

// argmax pairs (value, index): keep the larger value, the lower index on ties (torch.argmax's
// rule); a warp's pairs combined into every lane's.
__device__ __forceinline__ void argmax_take(float &best, int &bi, float v, int i) {
    if (v > best || (v == best && i < bi)) best = v, bi = i;
}
__device__ __forceinline__ void warp_argmax(float &best, int &bi) {
    for (int o = 16; o > 0; o >>= 1)
        argmax_take(best, bi, __shfl_xor_sync(0xffffffffu, best, o), __shfl_xor_sync(0xffffffffu, bi, o));
}

// pdl: this launch may start while the kernel before it runs (programmatic dependent launch);
// the kernel must pdl_wait() before touching that kernel's data.
// cluster other than (1, 1, 1): blocks form thread-block clusters of that shape (the grid a
// multiple of it).
template <typename... KArgs, typename... Args>
static cudaError_t cuda_launch_cluster(bool pdl, dim3 cluster, void (*kernel)(KArgs...), dim3 grid, dim3 block,
                                       size_t smem, cudaStream_t s, Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cudaLaunchAttribute at[2];
    unsigned n = 0;
    if (pdl) {
        at[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[n++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cluster.x * cluster.y * cluster.z > 1) {
        at[n].id = cudaLaunchAttributeClusterDimension;
        at[n].val.clusterDim.x = cluster.x, at[n].val.clusterDim.y = cluster.y, at[n++].val.clusterDim.z = cluster.z;
    }
    cfg.attrs = at;
    cfg.numAttrs = n;
    return cudaLaunchKernelEx(&cfg, kernel, (KArgs)args...);
}
template <typename... KArgs, typename... Args>
static cudaError_t cuda_launch_pdl(bool pdl, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                                   cudaStream_t s, Args... args) {
    return cuda_launch_cluster(pdl, dim3(1, 1, 1), kernel, grid, block, smem, s, args...);
}

// A plain launch: it starts once the kernel before it has ended.
template <typename... KArgs, typename... Args>
static cudaError_t cuda_launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                               Args... args) {
    return cuda_launch_pdl(false, kernel, grid, block, smem, s, args...);
}
#endif

#endif
