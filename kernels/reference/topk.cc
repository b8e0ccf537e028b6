// Reference exact top-k by magnitude.
//
// Top-k sparsification with error feedback: Aji & Heafield, "Sparse Communication for Distributed
// Gradient Descent", EMNLP 2017; Stich, Cordonnier, Jaggi, "Sparsified SGD with Memory",
// NeurIPS 2018. The residual a - TopK(a) is kept by the daemon's pipeline, not here.
//
// Order: larger |x| first; equal |x| (including +0 / -0) broken by the smaller index. The full
// sort makes this obviously correct; cpu/topk.cc must match it exactly.

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/reference/reference.h"
#include "kernels/reference/reference_sparsifier.h"

namespace sparsync::kernels::reference {

std::vector<int32_t> TopKIndices(const std::vector<float>& x, int64_t k) {
  std::vector<int32_t> order(x.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&x](int32_t a, int32_t b) {
    const float fa = std::fabs(x[static_cast<size_t>(a)]);
    const float fb = std::fabs(x[static_cast<size_t>(b)]);
    if (fa != fb) return fa > fb;
    return a < b;
  });
  order.resize(static_cast<size_t>(std::min<int64_t>(k, static_cast<int64_t>(x.size()))));
  std::sort(order.begin(), order.end());
  return order;
}

namespace {

class TopK final : public ReferenceSparsifier {
 public:
  explicit TopK(const SparsifierOptions& o) : ReferenceSparsifier("reference:topk", o) {}
  int64_t MaxSelected(int64_t numel) const override {
    return SelectedCount(numel, options().density, options().k);
  }

 protected:
  Status Select(const std::vector<float>& x, SparseView* out, const SparsifyContext&) override {
    const int64_t k = SelectedCount(static_cast<int64_t>(x.size()), options().density,
                                    options().k);
    WriteSelection(TopKIndices(x, k), x, out);
    return Status::Ok();
  }
};

}  // namespace

std::unique_ptr<Sparsifier> MakeTopK(const SparsifierOptions& options) {
  return std::make_unique<TopK>(options);
}

}  // namespace sparsync::kernels::reference
