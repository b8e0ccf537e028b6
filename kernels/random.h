#pragma once
// Counter-based random numbers shared by every implementation of a seeded compressor, so the
// reference and the fast kernels draw exactly the same numbers for the same (seed, counter).
// The generator is SplitMix64's finaliser applied to seed-mixed counters (Steele, Lea, Flood,
// "Fast splittable pseudorandom number generators", OOPSLA 2014). Draw j of stream s is a pure
// function of (seed, s, j): results do not depend on thread count or call order.

#include <cstdint>

namespace sparsync::kernels {

// Independent streams: each consumer of randomness uses its own.
enum class RandomStream : uint64_t {
  kRandomKIndices = 1,
  kThresholdSample = 2,
  kWangniBernoulli = 3,
  kTopKSample = 4,  // only for the CPU top-k threshold estimate; never changes the result
};

inline uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The j-th 64-bit draw of stream `stream` under `seed`.
inline uint64_t RandomBits(uint64_t seed, RandomStream stream, uint64_t j) {
  const uint64_t key = Mix64(seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(stream));
  return Mix64(key + 0x9E3779B97F4A7C15ull * (j + 1));
}

// Uniform integer in [0, bound) by Lemire's multiply-shift (bias < bound / 2^64, negligible).
// REQUIRES: bound > 0.
inline uint64_t RandomBelow(uint64_t seed, RandomStream stream, uint64_t j, uint64_t bound) {
  const unsigned __int128 m =
      static_cast<unsigned __int128>(RandomBits(seed, stream, j)) * bound;
  return static_cast<uint64_t>(m >> 64);
}

// Uniform double in [0, 1) with 53 random bits.
inline double RandomUnit(uint64_t seed, RandomStream stream, uint64_t j) {
  return static_cast<double>(RandomBits(seed, stream, j) >> 11) * 0x1.0p-53;
}

}  // namespace sparsync::kernels
