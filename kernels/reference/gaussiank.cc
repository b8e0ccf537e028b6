// Reference Gaussian-k.
//
// Shi, Chu, Cheung, See, "Understanding Top-k Sparsification in Distributed Deep Learning",
// arXiv 1911.08772 (2019), Gaussian-k SGD: model the gradient as N(mu, sigma^2) and send
// |x| > tau with tau = mu + |z_{rho/2}| sigma, i.e. z = Phi^{-1}(1 - rho/2). Then up to three
// corrections: tau *= 0.5 if count < 2k/3, tau *= 1.5 if count > 4k/3, else stop; the selection
// uses the final tau (the authors' loop kept the indices of the last threshold it tested).
// mu and sigma are the mean and the sample standard deviation (n - 1 denominator, as torch.std),
// accumulated in double. The count varies, so MaxSelected(d) = d.

#include <cmath>

#include "kernels/normal.h"
#include "kernels/reference/reference.h"
#include "kernels/reference/reference_sparsifier.h"

namespace sparsync::kernels::reference {
namespace {

class GaussianK final : public ReferenceSparsifier {
 public:
  explicit GaussianK(const SparsifierOptions& o)
      : ReferenceSparsifier("reference:gaussiank", o) {}
  int64_t MaxSelected(int64_t numel) const override { return numel; }

 protected:
  Status Select(const std::vector<float>& x, SparseView* out, const SparsifyContext&) override {
    const int64_t d = static_cast<int64_t>(x.size());
    if (d == 0) return Status::Ok();
    const int64_t k = SelectedCount(d, options().density, options().k);
    double sum = 0;
    for (float v : x) sum += v;
    const double mean = sum / static_cast<double>(d);
    double ss = 0;
    for (float v : x) ss += (v - mean) * (v - mean);
    const double sigma = d > 1 ? std::sqrt(ss / static_cast<double>(d - 1)) : 0.0;
    const double rho = static_cast<double>(k) / static_cast<double>(d);
    double tau = mean + std::fabs(NormalQuantile(1.0 - rho / 2.0)) * sigma;
    auto count_above = [&](double t) {
      int64_t c = 0;
      for (float v : x) c += static_cast<double>(std::fabs(v)) > t;
      return c;
    };
    for (int correction = 0; correction < 3; ++correction) {
      const int64_t c = count_above(tau);
      if (3 * c < 2 * k) {
        tau *= 0.5;
      } else if (3 * c > 4 * k) {
        tau *= 1.5;
      } else {
        break;
      }
    }
    std::vector<int32_t> indices;
    for (int64_t i = 0; i < d; ++i) {
      if (static_cast<double>(std::fabs(x[static_cast<size_t>(i)])) > tau) {
        indices.push_back(static_cast<int32_t>(i));
      }
    }
    WriteSelection(indices, x, out);
    return Status::Ok();
  }
};

}  // namespace

std::unique_ptr<Sparsifier> MakeGaussianK(const SparsifierOptions& options) {
  return std::make_unique<GaussianK>(options);
}

}  // namespace sparsync::kernels::reference
