#pragma once
// Exact top-k by magnitude over float32, the engine of cpu/topk.cc and cpu/dgc.cc.
//
// Order (identical to reference/topk.cc): larger |x| first, equal |x| broken by smaller index.
// Every element gets a unique 64-bit key (AbsBits(x) << 32 | (2^32 - 1 - index)), so "the top k"
// is simply the k largest keys.
//
// Fast path: estimate a magnitude threshold t from a stratified sample of 8192 elements, chosen
// so that the count of |x| >= t is >= k with high probability yet a small multiple of k; one
// vectorised pass keeps the keys of elements >= t (and checks finiteness); nth_element picks the
// k-th largest key among the candidates and one pass over the (index-ordered) candidates emits
// the k winners already sorted. Exact whatever the sample says:
// if the sample misjudged (fewer than k candidates, or more than the candidate buffer holds, e.g.
// many ties) the selector falls back to an exact radix select on the magnitude bits (three
// histogram passes of 11/10/10 bits) and one collecting pass, which needs no buffer beyond k.
// The input may be one buffer or several laid end to end (kernels/pieces.h): the same output.
// Single-threaded; all scratch is allocated by Reserve().

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/status.h"

namespace sparsync::kernels::cpu {

// The fast path's filtering pass; see the definition for its contract. Keys carry the index
// base + i for x[i].
int64_t CollectTopKCandidates(const float* x, int64_t n, uint32_t t, uint64_t* keys,
                              int64_t capacity, uint32_t* max_bits, int64_t base = 0);

class TopKSelector {
 public:
  // Allocates scratch for up to max_numel elements and k <= max_k.
  void Reserve(int64_t max_numel, int64_t max_k);

  // Writes the top-k of x[0, n) as ascending indices with their values.
  // Returns INVALID_ARGUMENT naming the first NaN/Inf (and writes nothing) if x is not finite.
  // REQUIRES: Reserve covered n and k; 0 <= k; out arrays hold min(k, n) entries.
  Status Select(const float* x, int64_t n, int64_t k, int32_t* out_indices, float* out_values);
  // Select() of the pieces laid end to end (indices into the whole), without joining them.
  Status SelectPieces(std::span<const std::span<const float>> pieces, int64_t k,
                      int32_t* out_indices, float* out_values);

  // Test hook: always take the radix-select path.
  void set_force_fallback(bool on) { force_fallback_ = on; }
  // Number of Select calls that needed the fallback (for tests and benchmarks).
  int64_t fallback_count() const { return fallback_count_; }

 private:
  int64_t CandidateCapacity(int64_t n, int64_t k) const;
  void SelectByRadix(std::span<const std::span<const float>> pieces, int64_t k,
                     int32_t* out_indices, float* out_values);

  std::vector<uint32_t> sample_;
  std::vector<uint64_t> candidates_;  // keys >= the estimated threshold, in index order
  std::vector<uint64_t> work_;        // copy of candidates_ for nth_element
  std::vector<uint32_t> histogram_;
  bool force_fallback_ = false;
  int64_t fallback_count_ = 0;
};

}  // namespace sparsync::kernels::cpu
