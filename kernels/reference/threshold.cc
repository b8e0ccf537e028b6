// Reference threshold sparsification.
//
// Fixed threshold (options.threshold > 0): send every |x| > tau (Strom, "Scalable distributed DNN
// training using commodity GPU cloud computing", Interspeech 2015).
// Quantile mode (options.threshold <= 0): Aji & Heafield, "Sparse Communication for Distributed
// Gradient Descent", EMNLP 2017, §3 — drop the (1 - density) smallest by a threshold estimated
// from a sample. Here: if d <= min_sample_size the sample is the whole tensor; otherwise
// s = max(min_sample_size, ceil(sample_fraction * d)) positions drawn with replacement, position j
// = uniform{0..d-1} from counter j of the kThresholdSample stream under context.seed.
// tau = the m-th largest sampled |x|, m = clamp(ceil(density * s), 1, s); send every |x| >= tau.
// The count varies per node (exchange by allgatherv), so MaxSelected(d) = d.

#include <algorithm>
#include <cmath>
#include <functional>

#include "kernels/random.h"
#include "kernels/reference/reference.h"
#include "kernels/reference/reference_sparsifier.h"

namespace sparsync::kernels::reference {
namespace {

class Threshold final : public ReferenceSparsifier {
 public:
  explicit Threshold(const SparsifierOptions& o)
      : ReferenceSparsifier("reference:threshold", o) {}
  int64_t MaxSelected(int64_t numel) const override { return numel; }

 protected:
  Status Select(const std::vector<float>& x, SparseView* out,
                const SparsifyContext& context) override {
    const int64_t d = static_cast<int64_t>(x.size());
    std::vector<int32_t> indices;
    if (options().threshold > 0) {
      for (int64_t i = 0; i < d; ++i) {
        if (static_cast<double>(std::fabs(x[static_cast<size_t>(i)])) > options().threshold) {
          indices.push_back(static_cast<int32_t>(i));
        }
      }
    } else if (d > 0) {
      std::vector<float> sample;
      if (d <= options().min_sample_size) {
        for (float v : x) sample.push_back(std::fabs(v));
      } else {
        const auto s = std::max<int64_t>(
            options().min_sample_size,
            static_cast<int64_t>(std::ceil(options().sample_fraction * static_cast<double>(d))));
        for (int64_t j = 0; j < s; ++j) {
          const uint64_t pos = RandomBelow(context.seed, RandomStream::kThresholdSample,
                                           static_cast<uint64_t>(j), static_cast<uint64_t>(d));
          sample.push_back(std::fabs(x[pos]));
        }
      }
      const auto s = static_cast<int64_t>(sample.size());
      const int64_t m = std::clamp<int64_t>(
          static_cast<int64_t>(std::ceil(options().density * static_cast<double>(s))), 1, s);
      std::sort(sample.begin(), sample.end(), std::greater<float>());
      const float tau = sample[static_cast<size_t>(m - 1)];
      for (int64_t i = 0; i < d; ++i) {
        if (std::fabs(x[static_cast<size_t>(i)]) >= tau) indices.push_back(static_cast<int32_t>(i));
      }
    }
    WriteSelection(indices, x, out);
    return Status::Ok();
  }
};

}  // namespace

std::unique_ptr<Sparsifier> MakeThreshold(const SparsifierOptions& options) {
  return std::make_unique<Threshold>(options);
}

}  // namespace sparsync::kernels::reference
