#include "kernels/reference/reference_sparsifier.h"

#include <cmath>

namespace sparsync::kernels::reference {

Status ReferenceSparsifier::Sparsify(const DenseView& grad, SparseView* out,
                                     const SparsifyContext& context) {
  SPARSYNC_KERNELS_RETURN_IF_ERROR(ValidateSparsifyArgs(grad, out, MaxSelected(grad.numel)));
  out->k = 0;
  std::vector<float> x(static_cast<size_t>(grad.numel));
  ConvertToFloat32(grad.data, grad.dtype, grad.numel, x.data());
  for (size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(x[i])) return NonFiniteError(static_cast<int64_t>(i), x[i]);
  }
  return Select(x, out, context);
}

void ReferenceSparsifier::WriteSelection(const std::vector<int32_t>& indices,
                                         const std::vector<float>& x, SparseView* out) {
  for (size_t j = 0; j < indices.size(); ++j) {
    out->indices[j] = indices[j];
    out->values[j] = x[static_cast<size_t>(indices[j])];
  }
  out->k = static_cast<int64_t>(indices.size());
}

}  // namespace sparsync::kernels::reference
