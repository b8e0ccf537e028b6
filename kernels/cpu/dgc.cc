// CPU Deep Gradient Compression step (Lin, Han, Mao, Wang, Dally, ICLR 2018): the same element
// arithmetic as reference/dgc.cc (float32, same order: u = m u + g, v = v + u), then the exact
// top-k of |v| with TopKSelector, then momentum factor masking. With clipping, the norm is summed
// in interleaved lanes, so the clip factor may differ from the reference's in the last bit.
// Nothing in the state changes when the gradient is rejected as non-finite.

#include <cmath>

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/cpu_sparsifier.h"
#include "kernels/cpu/scan.h"
#include "kernels/cpu/topk_select.h"
#include "kernels/dgc_state.h"

namespace sparsync::kernels::cpu {
namespace {

class Dgc final : public CpuSparsifier {
 public:
  explicit Dgc(const SparsifierOptions& o) : CpuSparsifier("dgc", o) {}
  int64_t MaxSelected(int64_t numel) const override {
    const double first = DgcDensityForEpoch(options().density, 0, options().warmup);
    return SelectedCount(numel, std::max(first, options().density), options().k);
  }

 protected:
  void PrepareScratch(int64_t max_numel) override {
    selector_.Reserve(max_numel, MaxSelected(max_numel));
  }

  Status Run(const float* g, int64_t n, SparseView* out,
             const SparsifyContext& context) override {
    DgcState* state = context.dgc_state;
    if (state == nullptr) return FailedPreconditionError("dgc: SparsifyContext::dgc_state is null");
    if (state->numel() != n || static_cast<int64_t>(state->momentum.size()) != n) {
      return FailedPreconditionError("dgc: state holds " + std::to_string(state->numel()) +
                                     " elements but the gradient has " + std::to_string(n) +
                                     "; call DgcState::Reset(numel) for this tensor");
    }
    const double sq = SumSquaresAsDouble(g, n);  // also the finiteness check
    if (!std::isfinite(sq)) {
      const int64_t bad = FindNonFinite(g, n);
      return NonFiniteError(bad, g[bad]);
    }
    float* u = state->momentum.data();
    float* v = state->accumulation.data();
    const float m = static_cast<float>(options().momentum);
    const double norm = std::sqrt(sq);
    if (options().clip_norm > 0 && norm > options().clip_norm) {
      const double factor = options().clip_norm / norm;
      for (int64_t i = 0; i < n; ++i) {
        u[i] = m * u[i] + static_cast<float>(static_cast<double>(g[i]) * factor);
        v[i] = v[i] + u[i];
      }
    } else {
      for (int64_t i = 0; i < n; ++i) {
        u[i] = m * u[i] + g[i];
        v[i] = v[i] + u[i];
      }
    }
    const int64_t k = SelectedCount(
        n, DgcDensityForEpoch(options().density, context.epoch, options().warmup), options().k);
    SPARSYNC_KERNELS_RETURN_IF_ERROR(selector_.Select(v, n, k, out->indices, out->values));
    out->k = k < n ? k : n;
    for (int64_t j = 0; j < out->k; ++j) {
      u[out->indices[j]] = 0.0f;
      v[out->indices[j]] = 0.0f;
    }
    return Status::Ok();
  }

 private:
  TopKSelector selector_;
};

}  // namespace

std::unique_ptr<Sparsifier> MakeDgc(const SparsifierOptions& options) {
  return std::make_unique<Dgc>(options);
}

}  // namespace sparsync::kernels::cpu
