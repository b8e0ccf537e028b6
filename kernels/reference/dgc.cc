// Reference Deep Gradient Compression step.
//
// Lin, Han, Mao, Wang, Dally, "Deep Gradient Compression: Reducing the Communication Bandwidth for
// Distributed Training", ICLR 2018:
//   local gradient clipping (§3.2, optional): g *= clip / ||g||_2 when ||g||_2 > clip;
//   momentum correction (eq. 6): u = m u + g; v = v + u;
//   send the top-k of |v| (same order and tie-break as top-k); the paper estimates the threshold
//   from a 1 % sample and refines it, which selects the top-k; we select it exactly;
//   momentum factor masking (eq. 7): u_i = v_i = 0 where sent;
//   warm-up: density 0.25, 0.0625, 0.0156, 0.004 for epochs 0..3, then the target.
// State is caller-owned (DgcState); element arithmetic is float32 in exactly this order, with the
// clip factor computed in double and applied as float(double(g) * factor).

#include <cmath>

#include "kernels/dgc_state.h"
#include "kernels/reference/reference.h"
#include "kernels/reference/reference_sparsifier.h"

namespace sparsync::kernels::reference {
namespace {

class Dgc final : public ReferenceSparsifier {
 public:
  explicit Dgc(const SparsifierOptions& o) : ReferenceSparsifier("reference:dgc", o) {}
  int64_t MaxSelected(int64_t numel) const override {
    const double first = DgcDensityForEpoch(options().density, 0, options().warmup);
    return SelectedCount(numel, std::max(first, options().density), options().k);
  }

 protected:
  Status Select(const std::vector<float>& g_in, SparseView* out,
                const SparsifyContext& context) override {
    DgcState* state = context.dgc_state;
    const int64_t d = static_cast<int64_t>(g_in.size());
    if (state == nullptr) return FailedPreconditionError("dgc: SparsifyContext::dgc_state is null");
    if (state->numel() != d || static_cast<int64_t>(state->momentum.size()) != d) {
      return FailedPreconditionError("dgc: state holds " + std::to_string(state->numel()) +
                                     " elements but the gradient has " + std::to_string(d) +
                                     "; call DgcState::Reset(numel) for this tensor");
    }
    std::vector<float> g = g_in;
    if (options().clip_norm > 0) {
      double sq = 0;
      for (float v : g) sq += static_cast<double>(v) * v;
      const double norm = std::sqrt(sq);
      if (norm > options().clip_norm) {
        const double factor = options().clip_norm / norm;
        for (float& v : g) v = static_cast<float>(static_cast<double>(v) * factor);
      }
    }
    const float m = static_cast<float>(options().momentum);
    for (size_t i = 0; i < g.size(); ++i) {
      state->momentum[i] = m * state->momentum[i] + g[i];
      state->accumulation[i] = state->accumulation[i] + state->momentum[i];
    }
    const int64_t k = SelectedCount(
        d, DgcDensityForEpoch(options().density, context.epoch, options().warmup), options().k);
    const std::vector<int32_t> indices = TopKIndices(state->accumulation, k);
    WriteSelection(indices, state->accumulation, out);
    for (int32_t i : indices) {
      state->momentum[static_cast<size_t>(i)] = 0.0f;
      state->accumulation[static_cast<size_t>(i)] = 0.0f;
    }
    return Status::Ok();
  }
};

}  // namespace

std::unique_ptr<Sparsifier> MakeDgc(const SparsifierOptions& options) {
  return std::make_unique<Dgc>(options);
}

}  // namespace sparsync::kernels::reference
