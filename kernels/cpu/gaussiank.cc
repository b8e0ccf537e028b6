// CPU Gaussian-k (Shi, Chu, Cheung, See, arXiv 1911.08772, 2019): tau = mu + |z_{rho/2}| sigma
// with up to three x0.5 / x1.5 corrections, as reference/gaussiank.cc. Mean and deviation are
// summed in double with 8 interleaved partial sums, so tau may differ from the reference's in the
// last bits of a double; the selections agree unless an element lies within ~1e-15 relative of
// tau. Each candidate tau is tried with one collecting pass straight into the output (capacity
// numel), so an accepted first guess costs three passes in all.

#include <cmath>

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/cpu_sparsifier.h"
#include "kernels/cpu/scan.h"
#include "kernels/normal.h"

namespace sparsync::kernels::cpu {
namespace {

class GaussianK final : public CpuSparsifier {
 public:
  explicit GaussianK(const SparsifierOptions& o) : CpuSparsifier("gaussiank", o) {}
  int64_t MaxSelected(int64_t numel) const override { return numel; }

 protected:
  void PrepareScratch(int64_t) override {}
  Status Run(const float* x, int64_t n, SparseView* out, const SparsifyContext&) override {
    if (n == 0) return Status::Ok();
    const double sum = SumAsDouble(x, n);
    if (!std::isfinite(sum)) {  // a float sum in double overflows only through Inf/NaN input
      const int64_t bad = FindNonFinite(x, n);
      return NonFiniteError(bad, x[bad]);
    }
    const int64_t k = SelectedCount(n, options().density, options().k);
    const double mean = sum / static_cast<double>(n);
    const double sigma =
        n > 1 ? std::sqrt(SumSquaredDeviations(x, n, mean) / static_cast<double>(n - 1)) : 0.0;
    const double rho = static_cast<double>(k) / static_cast<double>(n);
    double tau = mean + std::fabs(NormalQuantile(1.0 - rho / 2.0)) * sigma;
    int64_t count = 0;
    for (int attempt = 0; attempt <= 3; ++attempt) {
      // |x| > tau; a negative tau keeps everything.
      const uint32_t t = tau < 0 ? 0u : FloatBitsAtMost(tau) + 1;
      uint32_t max_bits;
      count = CollectAtLeast(x, n, t, out->indices, out->values, &max_bits);
      if (attempt == 3) break;
      if (3 * count < 2 * k) {
        tau *= 0.5;
      } else if (3 * count > 4 * k) {
        tau *= 1.5;
      } else {
        break;
      }
    }
    out->k = count;
    return Status::Ok();
  }
};

}  // namespace

std::unique_ptr<Sparsifier> MakeGaussianK(const SparsifierOptions& options) {
  return std::make_unique<GaussianK>(options);
}

}  // namespace sparsync::kernels::cpu
