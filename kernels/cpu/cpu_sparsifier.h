#pragma once
// Shared plumbing of the CPU sparsifiers: Prepare() bookkeeping, argument checks and the
// conversion of non-float32 input into a prepared buffer. Each algorithm implements
// PrepareScratch() and Run(); Run() is responsible for refusing non-finite input (most fuse the
// check into their first pass).

#include <string>
#include <string_view>
#include <vector>

#include "kernels/sparsifier.h"

namespace sparsync::kernels::cpu {

class CpuSparsifier : public Sparsifier {
 public:
  CpuSparsifier(std::string name, const SparsifierOptions& options)
      : name_(std::move(name)), options_(options) {}

  std::string_view name() const override { return name_; }
  Status Prepare(int64_t max_numel, DType dtype) final;
  Status Sparsify(const DenseView& grad, SparseView* out, const SparsifyContext& context) final;
  Status SparsifyPieces(std::span<const std::span<const float>> pieces, SparseView* out,
                        const SparsifyContext& context) final;

 protected:
  // Allocates whatever Run() needs for tensors of up to max_numel elements.
  virtual void PrepareScratch(int64_t max_numel) = 0;
  // x holds n finite-or-not float32 values; out has room for MaxSelected(n); out->k is 0.
  virtual Status Run(const float* x, int64_t n, SparseView* out,
                     const SparsifyContext& context) = 0;
  // Run() over pieces laid end to end, for an algorithm whose SparsifiesPieces() is true.
  virtual Status RunPieces(std::span<const std::span<const float>> pieces, SparseView* out,
                           const SparsifyContext& context);

  const SparsifierOptions& options() const { return options_; }

 private:
  std::string name_;
  SparsifierOptions options_;
  int64_t prepared_numel_ = -1;
  std::vector<float> converted_;  // for non-float32 input

  Status CheckPrepared(int64_t numel) const;
};

}  // namespace sparsync::kernels::cpu
