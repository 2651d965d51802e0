/* fp8: float <-> OCP FP8 E4M3FN (torch.float8_e4m3fn, CUDA __NV_E4M3), the fp8 KV cache's element.
 * Format: 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits; no infinities; 0x7F and 0xFF are
 * NaN; largest finite 448 (0x7E), smallest normal 2^-6 (0x08), smallest subnormal 2^-9 (0x01).
 * Encoding rounds to nearest, ties to even, and saturates: a finite value beyond +-448 and +-Inf
 * become +-448; NaN stays NaN (0x7F, or 0xFF when its sign bit is set). That is vLLM's fp8
 * conversion (clamp to +-448, then cast) and CUDA's __nv_cvt_float_to_fp8(x, __NV_SATFINITE,
 * __NV_E4M3), which the GPU kernels use. A plain torch cast, x.to(torch.float8_e4m3fn) (c10's
 * fp8e4m3fn_from_fp32_value), differs only there: it does not saturate, so |x| in (464, 480) (which
 * rounds past 448), |x| >= 480 and +-Inf become NaN; a KV cache must not turn an outlier into NaN.
 * Pure functions, any thread. */
#ifndef DUO_FP8_H
#define DUO_FP8_H

#include <stdint.h>

#define FP8_E4M3_MAX 448.0f

uint8_t fp8_e4m3_from_f32(float f);
float fp8_e4m3_to_f32(uint8_t b);

#endif
