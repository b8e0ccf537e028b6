#include "kernels/cpu/topk_select.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>

#include "kernels/cpu/scan.h"
#include "kernels/pieces.h"
#include "kernels/random.h"
#include "kernels/sparsifier.h"

namespace sparsync::kernels::cpu {
namespace {

constexpr int64_t kSampleSize = 8192;
constexpr uint64_t kSampleSeed = 0x5EEDu;  // fixed: the sample only affects speed, not output

inline uint64_t Key(uint32_t abs_bits, int64_t index) {
  return static_cast<uint64_t>(abs_bits) << 32 | (0xFFFFFFFFu - static_cast<uint32_t>(index));
}
inline int32_t KeyIndex(uint64_t key) {
  return static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(key));
}

using Pieces = std::span<const std::span<const float>>;

// The whole's index of the first non-finite element, or -1.
int64_t FirstNonFinite(Pieces pieces) {
  int64_t base = 0;
  for (const std::span<const float>& p : pieces) {
    const int64_t bad = FindNonFinite(p.data(), static_cast<int64_t>(p.size()));
    if (bad >= 0) return base + bad;
    base += static_cast<int64_t>(p.size());
  }
  return -1;
}

Status NonFiniteIn(Pieces pieces, int64_t bad) {
  return NonFiniteError(bad, PieceWalker<const float>(pieces)[bad]);
}

}  // namespace

// Keys of all elements with AbsBits >= t, in index order, stored while they fit in `capacity`;
// returns the total count (which may exceed capacity). *max_bits receives the largest AbsBits
// among the hits (>= kInfBits iff the input holds a NaN or Inf). REQUIRES: t <= kInfBits.
//
// This pass reads the whole input, so it must run at streaming bandwidth: the per-element work is
// only the vector compare inside AtLeastMask64; keys are built (and the max updated) for the few
// hits alone, walking the set bits of each 64-element mask.
int64_t CollectTopKCandidates(const float* x, int64_t n, uint32_t t, uint64_t* keys,
                              int64_t capacity, uint32_t* max_bits, int64_t base) {
  int64_t count = 0;
  uint32_t m = 0;
  auto take = [&](int64_t at) {  // REQUIRES: AbsBits(x[at]) >= t
    const uint32_t a = AbsBits(x[at]);
    if (count < capacity) keys[count] = Key(a, base + at);
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

int64_t TopKSelector::CandidateCapacity(int64_t n, int64_t k) const {
  return std::min(n, 3 * k + 4096);
}

void TopKSelector::Reserve(int64_t max_numel, int64_t max_k) {
  sample_.resize(static_cast<size_t>(std::min(max_numel, kSampleSize)));
  const auto cap = static_cast<size_t>(CandidateCapacity(max_numel, max_k));
  if (candidates_.size() < cap) {
    candidates_.resize(cap);
    work_.resize(cap);
  }
  histogram_.resize(2048);
}

Status TopKSelector::Select(const float* x, int64_t n, int64_t k, int32_t* out_indices,
                            float* out_values) {
  const std::span<const float> whole(x, static_cast<size_t>(n));
  return SelectPieces({&whole, 1}, k, out_indices, out_values);
}

Status TopKSelector::SelectPieces(Pieces pieces, int64_t k, int32_t* out_indices,
                                  float* out_values) {
  const int64_t n = TotalElements(pieces);
  k = std::min(k, n);
  if (n == 0) return Status::Ok();
  if (k == n) {  // everything, but still refuse non-finite input
    if (const int64_t bad = FirstNonFinite(pieces); bad >= 0) return NonFiniteIn(pieces, bad);
    int64_t i = 0;
    for (const std::span<const float>& p : pieces) {
      for (const float v : p) {
        out_indices[i] = static_cast<int32_t>(i);
        out_values[i] = v;
        ++i;
      }
    }
    return Status::Ok();
  }
  const int64_t capacity =
      std::min(CandidateCapacity(n, k), static_cast<int64_t>(candidates_.size()));

  // Threshold estimate. t = 0 keeps everything, which is right when everything fits.
  uint32_t t = 0;
  if (n > capacity && !force_fallback_) {
    const int64_t s = std::min({kSampleSize, n, static_cast<int64_t>(sample_.size())});
    PieceWalker<const float> x(pieces);
    for (int64_t j = 0; j < s; ++j) {  // one uniform draw inside each of s equal strata
      const int64_t lo = j * n / s, hi = (j + 1) * n / s;
      const auto pos = lo + static_cast<int64_t>(RandomBelow(
                                kSampleSeed, RandomStream::kTopKSample, static_cast<uint64_t>(j),
                                static_cast<uint64_t>(hi - lo)));
      sample_[static_cast<size_t>(j)] = AbsBits(x[pos]);
    }
    // Expected sample hits above the true k-th magnitude: s q. Go 3 sigma + 2 deeper so the
    // candidate count is >= k with high probability.
    const double sq = static_cast<double>(s) * static_cast<double>(k) / static_cast<double>(n);
    const auto rank = static_cast<int64_t>(std::ceil(sq + 3.0 * std::sqrt(sq) + 2.0));
    if (rank < s) {
      std::nth_element(sample_.begin(), sample_.begin() + (rank - 1), sample_.begin() + s,
                       std::greater<uint32_t>());
      t = std::min(sample_[static_cast<size_t>(rank - 1)], kInfBits);
    }
  }

  uint32_t max_bits = 0;
  int64_t count = 0;
  int64_t base = 0;
  for (const std::span<const float>& p : pieces) {
    const auto m = static_cast<int64_t>(p.size());
    uint32_t piece_max = 0;
    if (!force_fallback_) {
      const int64_t stored = std::min(count, capacity);
      count += CollectTopKCandidates(p.data(), m, t, candidates_.data() + stored,
                                     capacity - stored, &piece_max, base);
    } else {
      piece_max = MaxAbsBits(p.data(), m);
    }
    max_bits = std::max(max_bits, piece_max);
    base += m;
  }
  if (max_bits >= kInfBits) return NonFiniteIn(pieces, FirstNonFinite(pieces));
  if (force_fallback_ || count < k || count > capacity) {
    ++fallback_count_;
    SelectByRadix(pieces, k, out_indices, out_values);
    return Status::Ok();
  }
  // The k-th largest key, found on a copy so that the candidates stay in index order; then one
  // pass over the candidates emits the selection already sorted by index.
  std::copy(candidates_.begin(), candidates_.begin() + count, work_.begin());
  std::nth_element(work_.begin(), work_.begin() + (k - 1), work_.begin() + count,
                   std::greater<uint64_t>());
  const uint64_t kth = work_[static_cast<size_t>(k - 1)];
  PieceWalker<const float> x(pieces);
  int64_t out = 0;
  for (int64_t j = 0; j < count; ++j) {
    if (candidates_[static_cast<size_t>(j)] >= kth) {
      const int32_t i = KeyIndex(candidates_[static_cast<size_t>(j)]);
      out_indices[out] = i;
      out_values[out] = x[i];
      ++out;
    }
  }
  return Status::Ok();
}

// Exact selection without a candidate buffer: find T, the k-th largest AbsBits, 11/10/10 bits at
// a time, counting how many lie strictly above it; then collect, in index order, every element
// above T and the first (k - above) elements equal to T (the smaller indices win ties).
void TopKSelector::SelectByRadix(Pieces pieces, int64_t k, int32_t* out_indices,
                                 float* out_values) {
  struct Digit {
    int shift;
    int bits;
  };
  static constexpr Digit kDigits[] = {{20, 11}, {10, 10}, {0, 10}};
  uint32_t prefix = 0;       // the digits of T found so far
  uint32_t prefix_mask = 0;  // which bits of AbsBits the prefix covers
  int64_t above = 0;         // elements known to be strictly above T
  for (const Digit& digit : kDigits) {
    const uint32_t bins = 1u << digit.bits;
    std::fill(histogram_.begin(), histogram_.begin() + bins, 0u);
    for (const std::span<const float>& p : pieces) {
      for (const float v : p) {
        const uint32_t a = AbsBits(v);
        if ((a & prefix_mask) == prefix) ++histogram_[(a >> digit.shift) & (bins - 1)];
      }
    }
    uint32_t b = bins;
    int64_t cumulative = above;
    while (b > 0) {
      --b;
      if (cumulative + histogram_[b] >= k) break;
      cumulative += histogram_[b];
    }
    above = cumulative;
    prefix |= b << digit.shift;
    prefix_mask |= (bins - 1) << digit.shift;
  }
  const uint32_t threshold = prefix;
  int64_t ties_left = k - above;
  int64_t out = 0;
  int64_t i = 0;
  for (const std::span<const float>& p : pieces) {
    for (const float v : p) {
      const uint32_t a = AbsBits(v);
      if (a > threshold || (a == threshold && ties_left-- > 0)) {
        out_indices[out] = static_cast<int32_t>(i);
        out_values[out] = v;
        ++out;
      }
      ++i;
    }
  }
}

}  // namespace sparsync::kernels::cpu
