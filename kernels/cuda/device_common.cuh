#pragma once
// Device helpers shared by the kernels/cuda/*.cu files: magnitude keys, the counter-based random
// numbers of kernels/random.h, warp and block scans, deterministic block sums, and the
// last-block-done handshake of the histogram kernels. Everything here is inline (or a template),
// so each .cu file compiles its own copy and no device linking is needed.

#include <cstdint>

#include "kernels/cuda/device_state.h"
#include "kernels/random.h"

namespace sparsync::kernels::cuda::internal {

inline constexpr uint32_t kInfKey = 0x7F800000u;  // keys >= this are Inf or NaN

// |x| as an unsigned key that orders finite magnitudes like |x| (+0 and -0 are both 0).
__device__ __forceinline__ uint32_t MagnitudeKey(float x) {
  return __float_as_uint(x) & 0x7FFFFFFFu;
}

__device__ __forceinline__ int64_t TileCount(int64_t n) { return (n + kTileSize - 1) / kTileSize; }

// Element j of this thread in the tile starting at `base`.
__device__ __forceinline__ int64_t TileIndex(int64_t base, int j) {
  return base + int64_t{j} * kBlockThreads + threadIdx.x;
}

__device__ __forceinline__ int DigitShift(int level) {
  return level == 0 ? 20 : (level == 1 ? 9 : 0);
}
__device__ __forceinline__ uint32_t DigitMask(int level) { return level == 2 ? 0x1FFu : 0x7FFu; }

// ---- kernels/random.h, bit for bit (the reference and CPU kernels draw the same numbers). ----

__device__ __forceinline__ uint64_t Mix64OnDevice(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__device__ __forceinline__ uint64_t RandomBitsOnDevice(uint64_t seed, RandomStream stream,
                                                       uint64_t j) {
  const uint64_t key = Mix64OnDevice(seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(stream));
  return Mix64OnDevice(key + 0x9E3779B97F4A7C15ull * (j + 1));
}

// Lemire's multiply-shift: the high 64 bits of bits * bound, as RandomBelow's 128-bit product.
__device__ __forceinline__ uint64_t RandomBelowOnDevice(uint64_t seed, RandomStream stream,
                                                        uint64_t j, uint64_t bound) {
  return __umul64hi(RandomBitsOnDevice(seed, stream, j), bound);
}

__device__ __forceinline__ double RandomUnitOnDevice(uint64_t seed, RandomStream stream,
                                                     uint64_t j) {
  return static_cast<double>(RandomBitsOnDevice(seed, stream, j) >> 11) * 0x1.0p-53;
}

// ---- Scans and sums. ----

__device__ __forceinline__ uint32_t LaneMaskBelow() { return (1u << (threadIdx.x & 31)) - 1u; }

__device__ __forceinline__ uint32_t WarpInclusiveSum(uint32_t v) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const uint32_t t = __shfl_up_sync(0xFFFFFFFFu, v, offset);
    if (lane >= offset) v += t;
  }
  return v;
}

// Exclusive prefix sums of a pair of counts over the threads of a block of kThreads threads
// (a multiple of 32, at most 1024). `scratch` is shared memory of kThreads / 32 + 1 entries.
// Every thread of the block must call it; *total receives the block's sums.
template <int kThreads>
__device__ __forceinline__ uint2 BlockExclusiveSum2(uint2 v, uint2* total, uint2* scratch) {
  constexpr int kWarpCount = kThreads / 32;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const uint2 inclusive = make_uint2(WarpInclusiveSum(v.x), WarpInclusiveSum(v.y));
  if (lane == 31) scratch[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    const uint2 w = lane < kWarpCount ? scratch[lane] : make_uint2(0, 0);
    const uint2 wi = make_uint2(WarpInclusiveSum(w.x), WarpInclusiveSum(w.y));
    if (lane < kWarpCount) scratch[lane] = make_uint2(wi.x - w.x, wi.y - w.y);
    if (lane == kWarpCount - 1) scratch[kWarpCount] = wi;
  }
  __syncthreads();
  const uint2 base = scratch[warp];
  *total = scratch[kWarpCount];
  __syncthreads();  // the caller may reuse scratch at once
  return make_uint2(base.x + inclusive.x - v.x, base.y + inclusive.y - v.y);
}

// Sum over the block in a fixed order (deterministic); the result is valid in thread 0.
// `scratch`: shared memory of kThreads / 32 doubles.
template <int kThreads>
__device__ __forceinline__ double BlockSum(double v, double* scratch) {
  constexpr int kWarpCount = kThreads / 32;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xFFFFFFFFu, v, offset);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kWarpCount ? scratch[lane] : 0.0;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xFFFFFFFFu, v, offset);
  }
  __syncthreads();
  return v;
}

// Called by every thread of every block after its global atomics: true (block-uniform) in the
// one block that arrives last, which then sees every other block's atomics.
__device__ __forceinline__ bool LastBlockDone(uint32_t* ticket) {
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(ticket, 1u) == gridDim.x - 1;
  __syncthreads();
  if (last) __threadfence();
  return last;
}

__device__ __forceinline__ bool InputWasBad(const SelectState* s) {
  return __ldcg(&s->first_bad) != kNoIndex;
}

// InputWasBad as one block-uniform answer (other blocks of the same kernel may be setting the flag
// meanwhile). Every thread must call it, once, before any other __syncthreads of the kernel.
__device__ __forceinline__ bool BlockSeesBadInput(const SelectState* s) {
  __shared__ int bad;
  if (threadIdx.x == 0) bad = InputWasBad(s) ? 1 : 0;
  __syncthreads();
  return bad != 0;
}

__device__ __forceinline__ void ReportBad(SelectState* s, int64_t i) {
  atomicMin(&s->first_bad, static_cast<unsigned long long>(i));
}

}  // namespace sparsync::kernels::cuda::internal
