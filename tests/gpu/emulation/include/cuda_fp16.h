#pragma once
// CUDA emulation (tests/gpu/emulation/): float16 through kernels/dtype.h, which rounds like
// __float2half_rn (to nearest even) for every non-NaN value.
#include "cuda_emulation.h"
#include "kernels/dtype.h"

struct __half {
  unsigned short bits;
};
inline __half __float2half_rn(float f) { return {sparsync::kernels::FloatToHalf(f)}; }
inline float __half2float(__half h) { return sparsync::kernels::HalfToFloat(h.bits); }
inline unsigned short __half_as_ushort(__half h) { return h.bits; }
inline __half __ushort_as_half(unsigned short u) { return {u}; }
