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

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace sparsync::kernels::cpu {

inline constexpr uint32_t kInfBits = 0x7F800000u;

// The streaming passes are compiled twice on x86-64 with GCC (baseline SSE2 and AVX2) and the
// better one is picked at load time; both give bit-identical results (same per-lane order, no FMA).
// Not under ThreadSanitizer: the load-time resolvers run before its runtime is up and crash.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define SPARSYNC_KERNELS_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define SPARSYNC_KERNELS_VECTOR_CLONES
#endif

inline uint32_t AbsBits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u & 0x7FFFFFFFu;
}

// Elements per AtLeastMask64 block.
inline constexpr int64_t kMaskBlock = 64;

// Bit j of the result is set iff AbsBits(x[j]) >= t, for j in [0, 64). REQUIRES: t <= kInfBits.
//
// The filtering passes (CollectAtLeast, CollectTopKCandidates) call this once per 64 elements and
// then walk only the set bits, so the hot loop is 16 vector compares and one "any hit?" branch per
// 256 bytes; the rare hits cost one iteration each. (GCC does not vectorise the equivalent
// "lane array, then OR" loop: it scalarises it, which halved the bandwidth of those passes.)
// With SSE2 the 32 lanes are compared as signed int32 (AbsBits <= 0x7FFFFFFF fits; t - 1 >= -1
// likewise), then narrowed to bytes with saturating packs (-1 stays -1, 0 stays 0) for movemask.
inline uint64_t AtLeastMask64(const float* x, uint32_t t) {
#if defined(__SSE2__)
  const __m128i abs_mask = _mm_set1_epi32(0x7FFFFFFF);
  const __m128i below = _mm_set1_epi32(static_cast<int32_t>(t) - 1);  // a >= t <=> a > t - 1
  auto hits4 = [&](int64_t at) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + at));
    return _mm_cmpgt_epi32(_mm_and_si128(v, abs_mask), below);
  };
  auto hits16 = [&](int64_t at) -> uint64_t {
    const __m128i lo = _mm_packs_epi32(hits4(at), hits4(at + 4));
    const __m128i hi = _mm_packs_epi32(hits4(at + 8), hits4(at + 12));
    return static_cast<uint32_t>(_mm_movemask_epi8(_mm_packs_epi16(lo, hi)));
  };
  return hits16(0) | hits16(16) << 16 | hits16(32) << 32 | hits16(48) << 48;
#else
  uint64_t mask = 0;
  for (int j = 0; j < kMaskBlock; ++j) mask |= uint64_t{AbsBits(x[j]) >= t} << j;
  return mask;
#endif
}

// Index of the first NaN or Inf in x[0, n), or -1 if all are finite.
int64_t FindNonFinite(const float* x, int64_t n);

// Largest AbsBits over x[0, n) (0 for n = 0). All finite iff the result < kInfBits.
uint32_t MaxAbsBits(const float* x, int64_t n);

// Writes (i, x[i]) for every i with AbsBits(x[i]) >= t, in ascending i, and returns the count.
// *max_bits receives the largest AbsBits among the hits (so, as t <= kInfBits is required, it is
// >= kInfBits iff x holds a NaN or Inf). REQUIRES: t <= kInfBits; idx, val have room for n.
// Built on AtLeastMask64 rather than target clones: explicit SSE2 already keeps it memory-bound.
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
