// CPU exact top-k by magnitude (Aji & Heafield, EMNLP 2017; Stich et al., NeurIPS 2018).
// Same output as reference/topk.cc, including the tie-break; the selection engine and its
// sampled-threshold fast path are described in topk_select.h.

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/cpu_sparsifier.h"
#include "kernels/cpu/topk_select.h"
#include "kernels/pieces.h"

namespace sparsync::kernels::cpu {
namespace {

class TopK final : public CpuSparsifier {
 public:
  explicit TopK(const SparsifierOptions& o) : CpuSparsifier("topk", o) {}
  int64_t MaxSelected(int64_t numel) const override {
    return SelectedCount(numel, options().density, options().k);
  }
  bool SparsifiesPieces() const override { return true; }

 protected:
  void PrepareScratch(int64_t max_numel) override {
    selector_.Reserve(max_numel, MaxSelected(max_numel));
  }
  Status Run(const float* x, int64_t n, SparseView* out, const SparsifyContext&) override {
    const int64_t k = MaxSelected(n);
    SPARSYNC_KERNELS_RETURN_IF_ERROR(selector_.Select(x, n, k, out->indices, out->values));
    out->k = k;
    return Status::Ok();
  }
  Status RunPieces(std::span<const std::span<const float>> pieces, SparseView* out,
                   const SparsifyContext&) override {
    const int64_t k = MaxSelected(TotalElements(pieces));
    SPARSYNC_KERNELS_RETURN_IF_ERROR(selector_.SelectPieces(pieces, k, out->indices, out->values));
    out->k = k;
    return Status::Ok();
  }

 private:
  TopKSelector selector_;
};

}  // namespace

std::unique_ptr<Sparsifier> MakeTopK(const SparsifierOptions& options) {
  return std::make_unique<TopK>(options);
}

}  // namespace sparsync::kernels::cpu
