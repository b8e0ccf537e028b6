#include "kernels/cpu/cpu_sparsifier.h"

#include <algorithm>
#include <limits>

#include "kernels/pieces.h"

namespace sparsync::kernels::cpu {

Status CpuSparsifier::Prepare(int64_t max_numel, DType dtype) {
  if (max_numel < 0 || max_numel > std::numeric_limits<int32_t>::max()) {
    return OutOfRangeError(name_ + ": Prepare(" + std::to_string(max_numel) +
                           ") is outside [0, INT32_MAX], the range of sparse indices");
  }
  prepared_numel_ = std::max(prepared_numel_, max_numel);
  if (dtype != DType::kFloat32 && converted_.size() < static_cast<size_t>(max_numel)) {
    converted_.resize(static_cast<size_t>(max_numel));
  }
  PrepareScratch(prepared_numel_);
  return Status::Ok();
}

Status CpuSparsifier::CheckPrepared(int64_t numel) const {
  if (numel <= prepared_numel_) return Status::Ok();
  return FailedPreconditionError(name_ + ": Sparsify on " + std::to_string(numel) +
                                 " elements but Prepare() covered " +
                                 std::to_string(std::max<int64_t>(prepared_numel_, 0)));
}

Status CpuSparsifier::Sparsify(const DenseView& grad, SparseView* out,
                               const SparsifyContext& context) {
  SPARSYNC_KERNELS_RETURN_IF_ERROR(ValidateSparsifyArgs(grad, out, MaxSelected(grad.numel)));
  out->k = 0;
  SPARSYNC_KERNELS_RETURN_IF_ERROR(CheckPrepared(grad.numel));
  const float* x = static_cast<const float*>(grad.data);
  if (grad.dtype != DType::kFloat32) {
    if (converted_.size() < static_cast<size_t>(grad.numel)) {
      return FailedPreconditionError(name_ + ": Sparsify on " +
                                     std::string(DTypeName(grad.dtype)) +
                                     " input but Prepare() was not called for that dtype");
    }
    ConvertToFloat32(grad.data, grad.dtype, grad.numel, converted_.data());
    x = converted_.data();
  }
  return Run(x, grad.numel, out, context);
}

Status CpuSparsifier::SparsifyPieces(std::span<const std::span<const float>> pieces,
                                     SparseView* out, const SparsifyContext& context) {
  if (!SparsifiesPieces()) return Sparsifier::SparsifyPieces(pieces, out, context);
  const float* data = nullptr;  // the first piece's, for the checks of a whole
  for (const std::span<const float>& p : pieces) {
    if (!p.empty() && p.data() == nullptr) {
      return InvalidArgumentError("Sparsify: a piece of " + std::to_string(p.size()) +
                                  " elements has no data");
    }
    if (data == nullptr) data = p.data();
  }
  const int64_t n = TotalElements(pieces);
  SPARSYNC_KERNELS_RETURN_IF_ERROR(
      ValidateSparsifyArgs({data, n, DType::kFloat32}, out, MaxSelected(n)));
  out->k = 0;
  SPARSYNC_KERNELS_RETURN_IF_ERROR(CheckPrepared(n));
  return RunPieces(pieces, out, context);
}

Status CpuSparsifier::RunPieces(std::span<const std::span<const float>> pieces, SparseView* out,
                                const SparsifyContext& context) {
  return Sparsifier::SparsifyPieces(pieces, out, context);
}

}  // namespace sparsync::kernels::cpu
