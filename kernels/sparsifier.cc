#include "kernels/sparsifier.h"

#include <cmath>
#include <cstdio>
#include <limits>

namespace sparsync::kernels {

int64_t SelectedCount(int64_t numel, double density, int64_t fixed_k) {
  if (numel <= 0) return 0;
  if (fixed_k > 0) return fixed_k < numel ? fixed_k : numel;
  const double k = std::floor(density * static_cast<double>(numel));
  if (!(k >= 1.0)) return 1;
  if (k >= static_cast<double>(numel)) return numel;
  return static_cast<int64_t>(k);
}

Status Sparsifier::SparsifyPieces(std::span<const std::span<const float>>, SparseView*,
                                  const SparsifyContext&) {
  return FailedPreconditionError(std::string(name()) +
                                 " selects over one buffer only, not over pieces");
}

Status ValidateSparsifyArgs(const DenseView& grad, const SparseView* out, int64_t max_selected) {
  if (out == nullptr) return InvalidArgumentError("Sparsify: output view is null");
  if (grad.numel < 0) {
    return InvalidArgumentError("Sparsify: negative numel " + std::to_string(grad.numel));
  }
  if (grad.numel > std::numeric_limits<int32_t>::max()) {
    return OutOfRangeError("Sparsify: numel " + std::to_string(grad.numel) +
                           " does not fit the int32 indices of the sparse format");
  }
  if (grad.numel > 0 && grad.data == nullptr) {
    return InvalidArgumentError("Sparsify: input data is null but numel is " +
                                std::to_string(grad.numel));
  }
  if (out->capacity < max_selected) {
    return OutOfRangeError("Sparsify: output capacity " + std::to_string(out->capacity) +
                           " is below MaxSelected(" + std::to_string(grad.numel) +
                           ") = " + std::to_string(max_selected));
  }
  if (max_selected > 0 && (out->indices == nullptr || out->values == nullptr)) {
    return InvalidArgumentError("Sparsify: output indices or values buffer is null");
  }
  return Status::Ok();
}

Status NonFiniteError(int64_t index, float value) {
  const char* what = std::isnan(value) ? "NaN" : (value > 0 ? "+Inf" : "-Inf");
  return InvalidArgumentError("input element " + std::to_string(index) + " is " + what +
                              " (after conversion to float32); refusing to sparsify a "
                              "non-finite gradient");
}

}  // namespace sparsync::kernels
