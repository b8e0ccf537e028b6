// CPU threshold sparsification: fixed tau (Strom, Interspeech 2015) or the sampled quantile of
// Aji & Heafield, EMNLP 2017. Same rule and same sample as reference/threshold.cc; the sample's
// m-th largest is found by nth_element on magnitude bits, then one vectorised collecting pass
// (which also checks finiteness).

#include <algorithm>
#include <cmath>
#include <functional>

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/cpu_sparsifier.h"
#include "kernels/cpu/scan.h"
#include "kernels/random.h"

namespace sparsync::kernels::cpu {
namespace {

class Threshold final : public CpuSparsifier {
 public:
  explicit Threshold(const SparsifierOptions& o) : CpuSparsifier("threshold", o) {}
  int64_t MaxSelected(int64_t numel) const override { return numel; }

 protected:
  int64_t SampleSize(int64_t n) const {
    if (n <= options().min_sample_size) return n;
    return std::max<int64_t>(
        options().min_sample_size,
        static_cast<int64_t>(std::ceil(options().sample_fraction * static_cast<double>(n))));
  }
  void PrepareScratch(int64_t max_numel) override {
    if (options().threshold <= 0) {
      sample_.resize(static_cast<size_t>(
          std::max(SampleSize(max_numel), std::min(max_numel, options().min_sample_size))));
    }
  }
  Status Run(const float* x, int64_t n, SparseView* out,
             const SparsifyContext& context) override {
    if (n == 0) return Status::Ok();
    uint32_t t;  // select AbsBits >= t
    if (options().threshold > 0) {
      t = FloatBitsAtMost(options().threshold) + 1;
    } else {
      const int64_t s = SampleSize(n);
      if (s == n) {
        for (int64_t i = 0; i < n; ++i) sample_[i] = AbsBits(x[i]);
      } else {
        for (int64_t j = 0; j < s; ++j) {
          const uint64_t pos = RandomBelow(context.seed, RandomStream::kThresholdSample,
                                           static_cast<uint64_t>(j), static_cast<uint64_t>(n));
          sample_[j] = AbsBits(x[pos]);
        }
      }
      const int64_t m = std::clamp<int64_t>(
          static_cast<int64_t>(std::ceil(options().density * static_cast<double>(s))), 1, s);
      std::nth_element(sample_.begin(), sample_.begin() + (m - 1), sample_.begin() + s,
                       std::greater<uint32_t>());
      t = std::min(sample_[m - 1], kInfBits);  // a sampled NaN must not hide the others
    }
    uint32_t max_bits = 0;
    const int64_t k = CollectAtLeast(x, n, t, out->indices, out->values, &max_bits);
    if (max_bits >= kInfBits) {
      const int64_t bad = FindNonFinite(x, n);
      return NonFiniteError(bad, x[bad]);
    }
    out->k = k;
    return Status::Ok();
  }

 private:
  std::vector<uint32_t> sample_;
};

}  // namespace

std::unique_ptr<Sparsifier> MakeThreshold(const SparsifierOptions& options) {
  return std::make_unique<Threshold>(options);
}

}  // namespace sparsync::kernels::cpu
