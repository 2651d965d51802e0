#!/usr/bin/env python3
"""Writes cuda/wgmma.cuh: the wgmma.mma_async wrappers (bf16 x bf16 -> f32, m64nNk16) for the
N values the kernels use, A from registers (RS) or shared memory (SS), B from shared memory
(K-major, or MN-major for RS at the head dims of attention's P V).
The asm operand lists are N/2 accumulators long, so they are generated, not typed.
usage: python3 scripts/gen_wgmma.py > cuda/wgmma.cuh"""
import sys

NS = [8, 16, 32, 64, 128, 192, 256]
NS_MN = [64, 128]  # P V in the prefill attention: n = the head dim


def fn(n, rs, mn=False):
    nd = n // 2
    dl = ", ".join(f"%{i}" for i in range(nd))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(nd))
    if rs:
        a = f"{{%{nd}, %{nd + 1}, %{nd + 2}, %{nd + 3}}}"
        b, p = nd + 4, nd + 5
        ins = '"r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(bd), "r"(scale_d)'
        tail = "p, 1, 1, 1" if mn else "p, 1, 1, 0"
        sig = f"const uint32_t (&a)[4], uint64_t bd, int scale_d"
    else:
        a = f"%{nd}"
        b, p = nd + 1, nd + 2
        ins = '"l"(ad), "l"(bd), "r"(scale_d)'
        tail = "p, 1, 1, 0, 0"
        sig = f"uint64_t ad, uint64_t bd, int scale_d"
    name = "wgmma_rs_mn" if mn else "wgmma_rs" if rs else "wgmma_ss"
    return (f"template <> __device__ __forceinline__ void {name}<{n}>(float (&d)[{nd}], {sig}) {{\n"
            f"    asm volatile(\"{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{p}, 0;\\n\"\n"
            f"                 \"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16 {{{dl}}}, {a}, %{b}, {tail};\\n}}\\n\"\n"
            f"                 : {outs}\n"
            f"                 : {ins});\n}}\n")


out = sys.stdout
out.write("""// wgmma.cuh: wgmma.mma_async wrappers, bf16 x bf16 -> f32, m64nNk16 (written by
// scripts/gen_wgmma.py: the operand lists are N/2 accumulators long). A warpgroup (4 warps)
// issues each; d holds the thread's N/2 accumulators in the mma C-fragment order per n8 block
// (rows 16w + g and + 8 of warp w, columns 8j + 2q, + 1); A from registers (RS: a warp's 16
// rows in the m16n8k16 A-fragment order) or a shared-memory descriptor (SS); B (N x 16,
// K-major; wgmma_rs_mn: MN-major, the n index contiguous) from a shared-memory descriptor.
// scale_d = 0: d = A.B, else d += A.B.
#pragma once
#include <stdint.h>

template <int N> __device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t bd, int scale_d);
template <int N> __device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], uint64_t ad, uint64_t bd, int scale_d);
template <int N> __device__ __forceinline__ void wgmma_rs_mn(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t bd, int scale_d);

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\\n" ::"n"(N) : "memory");
}
// keeps the compiler from moving accesses of an accumulator across a wgmma still in flight
template <int N> __device__ __forceinline__ void wgmma_hold(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}

""")
for n in NS:
    out.write(fn(n, True))
for n in NS:
    out.write(fn(n, False))
for n in NS_MN:
    out.write(fn(n, True, mn=True))
