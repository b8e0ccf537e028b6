// CPU random-k (Stich, Cordonnier, Jaggi, NeurIPS 2018): Floyd's algorithm with the same draws as
// reference/randomk.cc, so the same set for the same seed; membership in a bitmap prepared by
// Prepare(), and the ascending output read back from the bitmap (clearing it as it goes).
// Shared-seed mode uses context.shared_seed: indices depend only on (shared_seed, numel, k).
// options.unbiased scales the sent values by d/k exactly as the reference does (RandomKScaled).

#include <bit>

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/cpu_sparsifier.h"
#include "kernels/cpu/scan.h"
#include "kernels/random.h"

namespace sparsync::kernels::cpu {
namespace {

class RandomK final : public CpuSparsifier {
 public:
  explicit RandomK(const SparsifierOptions& o) : CpuSparsifier("randomk", o) {}
  int64_t MaxSelected(int64_t numel) const override {
    return SelectedCount(numel, options().density, options().k);
  }

 protected:
  void PrepareScratch(int64_t max_numel) override {
    bitmap_.assign(static_cast<size_t>((max_numel + 63) / 64), 0);
  }
  Status Run(const float* x, int64_t n, SparseView* out,
             const SparsifyContext& context) override {
    if (const int64_t bad = FindNonFinite(x, n); bad >= 0) return NonFiniteError(bad, x[bad]);
    const int64_t k = MaxSelected(n);
    const uint64_t seed = options().shared_seed ? context.shared_seed : context.seed;
    uint64_t* bits = bitmap_.data();
    for (int64_t j = n - k; j < n; ++j) {
      auto t = static_cast<int64_t>(RandomBelow(seed, RandomStream::kRandomKIndices,
                                                static_cast<uint64_t>(j),
                                                static_cast<uint64_t>(j + 1)));
      if (bits[t >> 6] >> (t & 63) & 1u) t = j;
      bits[t >> 6] |= uint64_t{1} << (t & 63);
    }
    int64_t out_k = 0;
    const bool unbiased = options().unbiased;
    const double scale = RandomKScale(n, k);
    const int64_t words = (n + 63) / 64;
    for (int64_t w = 0; w < words; ++w) {
      uint64_t word = bits[w];
      bits[w] = 0;
      while (word != 0) {
        const int64_t i = w * 64 + std::countr_zero(word);
        word &= word - 1;
        out->indices[out_k] = static_cast<int32_t>(i);
        out->values[out_k] = unbiased ? RandomKScaled(x[i], scale) : x[i];
        ++out_k;
      }
    }
    out->k = out_k;
    return Status::Ok();
  }

 private:
  std::vector<uint64_t> bitmap_;
};

}  // namespace

std::unique_ptr<Sparsifier> MakeRandomK(const SparsifierOptions& options) {
  return std::make_unique<RandomK>(options);
}

}  // namespace sparsync::kernels::cpu
