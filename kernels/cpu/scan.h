#pragma once
// Streaming passes over float32 arrays shared by the CPU kernels. Written as fixed-width blocks
// with independent lanes so the compiler vectorises them; every result is deterministic (fixed
// summation order for a given n, no threads).
//
// Magnitudes are compared as bit patterns: for a float x, AbsBits(x) = bits(x) & 0x7FFFFFFF
// orders finite magnitudes exactly like |x| (+0 and -0 both map to 0; subnormals order
// correctly), Inf is 0x7F800000 and every NaN is above it.

#include <cstdint>
#include <cstring>

namespace sparsync::kernels::cpu {

inline constexpr uint32_t kInfBits = 0x7F800000u;

// The streaming passes are compiled twice on x86-64 with GCC (baseline SSE2 and AVX2) and the
// better one is picked at load time; both give bit-identical results (same per-lane order, no FMA).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define SPARSYNC_KERNELS_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define SPARSYNC_KERNELS_VECTOR_CLONES
#endif

inline uint32_t AbsBits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u & 0x7FFFFFFFu;
}

// Index of the first NaN or Inf in x[0, n), or -1 if all are finite.
int64_t FindNonFinite(const float* x, int64_t n);

// Largest AbsBits over x[0, n) (0 for n = 0). All finite iff the result < kInfBits.
uint32_t MaxAbsBits(const float* x, int64_t n);

// Writes (i, x[i]) for every i with AbsBits(x[i]) >= t, in ascending i, and returns the count.
// *max_bits receives the largest AbsBits among the hits (so, as t <= kInfBits is required, it is
// >= kInfBits iff x holds a NaN or Inf). REQUIRES: t <= kInfBits; idx, val have room for n.
int64_t CollectAtLeast(const float* x, int64_t n, uint32_t t, int32_t* idx, float* val,
                       uint32_t* max_bits);

// Number of i with AbsBits(x[i]) >= t. REQUIRES: t <= kInfBits.
int64_t CountAtLeast(const float* x, int64_t n, uint32_t t);

// Sums in double with 8 interleaved partial sums (a fixed order for a given n).
double SumAsDouble(const float* x, int64_t n);
double SumSquaredDeviations(const float* x, int64_t n, double mean);
double SumAbsAsDouble(const float* x, int64_t n);
double SumSquaresAsDouble(const float* x, int64_t n);

// Largest float f >= 0 with double(f) <= tau, as bits, so that for finite x:
//   double(|x|) > tau  <=>  AbsBits(x) > result.   REQUIRES: tau >= 0 (not NaN).
uint32_t FloatBitsAtMost(double tau);

}  // namespace sparsync::kernels::cpu
