// Reference random-k: k coordinates chosen uniformly without replacement.
//
// Random-k of Stich, Cordonnier, Jaggi, "Sparsified SGD with Memory", NeurIPS 2018. Values are
// sent unscaled (the form for error feedback), or with options.unbiased scaled by d/k, which makes
// the estimate unbiased: each coordinate is kept with probability k/d, so E[Q(x)_i] = x_i. The
// set is drawn by Floyd's algorithm (Bentley & Floyd, "A sample of brilliance", CACM 1987): for
// j = d-k .. d-1, t = uniform{0..j}; add t, or j if t is taken. Draw j uses counter j of the
// kRandomKIndices stream, so the set is a pure function of (seed, d, k). In shared-seed mode the
// seed is context.shared_seed: every node picks the same indices whatever its data, and a dense
// allreduce of the k values suffices.

#include <set>

#include "kernels/random.h"
#include "kernels/reference/reference.h"
#include "kernels/reference/reference_sparsifier.h"

namespace sparsync::kernels::reference {
namespace {

class RandomK final : public ReferenceSparsifier {
 public:
  explicit RandomK(const SparsifierOptions& o) : ReferenceSparsifier("reference:randomk", o) {}
  int64_t MaxSelected(int64_t numel) const override {
    return SelectedCount(numel, options().density, options().k);
  }

 protected:
  Status Select(const std::vector<float>& x, SparseView* out,
                const SparsifyContext& context) override {
    const int64_t d = static_cast<int64_t>(x.size());
    const int64_t k = SelectedCount(d, options().density, options().k);
    const uint64_t seed = options().shared_seed ? context.shared_seed : context.seed;
    std::set<int64_t> chosen;
    for (int64_t j = d - k; j < d; ++j) {
      const auto t = static_cast<int64_t>(RandomBelow(seed, RandomStream::kRandomKIndices,
                                                      static_cast<uint64_t>(j),
                                                      static_cast<uint64_t>(j + 1)));
      chosen.insert(chosen.count(t) ? j : t);
    }
    std::vector<int32_t> indices(chosen.begin(), chosen.end());
    WriteSelection(indices, x, out);
    if (options().unbiased) {
      const double scale = RandomKScale(d, k);
      for (int64_t j = 0; j < out->k; ++j) out->values[j] = RandomKScaled(out->values[j], scale);
    }
    return Status::Ok();
  }
};

}  // namespace

std::unique_ptr<Sparsifier> MakeRandomK(const SparsifierOptions& options) {
  return std::make_unique<RandomK>(options);
}

}  // namespace sparsync::kernels::reference
