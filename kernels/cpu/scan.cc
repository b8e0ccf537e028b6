#include "kernels/cpu/scan.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

namespace sparsync::kernels::cpu {
namespace {
constexpr int64_t kBlock = 16;
}  // namespace

int64_t FindNonFinite(const float* x, int64_t n) {
  if (MaxAbsBits(x, n) < kInfBits) return -1;
  for (int64_t i = 0; i < n; ++i) {
    if (AbsBits(x[i]) >= kInfBits) return i;
  }
  return -1;
}

SPARSYNC_KERNELS_VECTOR_CLONES
uint32_t MaxAbsBits(const float* x, int64_t n) {
  // Signed compares: AbsBits <= 0x7FFFFFFF fits int32, and SSE2 has no unsigned max.
  int32_t lane[kBlock] = {};
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    for (int64_t j = 0; j < kBlock; ++j) {
      const auto a = static_cast<int32_t>(AbsBits(x[i + j]));
      lane[j] = a > lane[j] ? a : lane[j];
    }
  }
  int32_t m = 0;
  for (int64_t j = 0; j < kBlock; ++j) m = lane[j] > m ? lane[j] : m;
  for (; i < n; ++i) m = std::max(m, static_cast<int32_t>(AbsBits(x[i])));
  return static_cast<uint32_t>(m);
}

int64_t CollectAtLeast(const float* x, int64_t n, uint32_t t, int32_t* idx, float* val,
                       uint32_t* max_bits) {
  int64_t count = 0;
  uint32_t m = 0;
  auto take = [&](int64_t at) {  // REQUIRES: AbsBits(x[at]) >= t
    const uint32_t a = AbsBits(x[at]);
    idx[count] = static_cast<int32_t>(at);
    val[count] = x[at];
    ++count;
    m = a > m ? a : m;
  };
  int64_t i = 0;
  for (; i + kMaskBlock <= n; i += kMaskBlock) {
    // Walk the set bits of the block's hit mask, lowest first (ascending index).
    for (uint64_t hits = AtLeastMask64(x + i, t); hits != 0; hits &= hits - 1) {
      take(i + std::countr_zero(hits));
    }
  }
  for (; i < n; ++i) {
    if (AbsBits(x[i]) >= t) take(i);
  }
  *max_bits = m;
  return count;
}

SPARSYNC_KERNELS_VECTOR_CLONES
int64_t CountAtLeast(const float* x, int64_t n, uint32_t t) {
  const auto ts = static_cast<int32_t>(t);
  int32_t lane[kBlock] = {};
  int64_t count = 0;
  int64_t i = 0;
  // Lane counters are flushed every 2^20 blocks, long before they could overflow.
  while (i + kBlock <= n) {
    const int64_t end = std::min<int64_t>(n - (n - i) % kBlock, i + kBlock * (int64_t{1} << 20));
    for (; i < end; i += kBlock) {
      for (int64_t j = 0; j < kBlock; ++j) {
        lane[j] += static_cast<int32_t>(AbsBits(x[i + j])) >= ts;
      }
    }
    for (int64_t j = 0; j < kBlock; ++j) {
      count += lane[j];
      lane[j] = 0;
    }
  }
  for (; i < n; ++i) count += AbsBits(x[i]) >= t;
  return count;
}

namespace {
constexpr int kLanes = 8;

template <typename F>
double LaneSum(const float* x, int64_t n, F f) {
  double lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) lane[j] += f(x[i + j]);
  }
  double s = 0;
  for (int j = 0; j < kLanes; ++j) s += lane[j];
  for (; i < n; ++i) s += f(x[i]);
  return s;
}
}  // namespace

SPARSYNC_KERNELS_VECTOR_CLONES
double SumAsDouble(const float* x, int64_t n) {
  return LaneSum(x, n, [](float v) { return static_cast<double>(v); });
}
SPARSYNC_KERNELS_VECTOR_CLONES
double SumSquaredDeviations(const float* x, int64_t n, double mean) {
  return LaneSum(x, n, [mean](float v) {
    const double e = static_cast<double>(v) - mean;
    return e * e;
  });
}
SPARSYNC_KERNELS_VECTOR_CLONES
double SumAbsAsDouble(const float* x, int64_t n) {
  return LaneSum(x, n, [](float v) { return static_cast<double>(std::fabs(v)); });
}
SPARSYNC_KERNELS_VECTOR_CLONES
double SumSquaresAsDouble(const float* x, int64_t n) {
  return LaneSum(x, n, [](float v) { return static_cast<double>(v) * static_cast<double>(v); });
}

uint32_t FloatBitsAtMost(double tau) {
  float f = static_cast<float>(tau);
  if (static_cast<double>(f) > tau) f = std::nextafter(f, 0.0f);
  if (std::isinf(f)) f = std::numeric_limits<float>::max();
  return AbsBits(f);
}

}  // namespace sparsync::kernels::cpu
