#pragma once
// Shared plumbing of the reference sparsifiers: argument checks, conversion to float32 and the
// non-finite check, so each algorithm file holds only its selection rule.

#include <string>
#include <string_view>
#include <vector>

#include "kernels/sparsifier.h"

namespace sparsync::kernels::reference {

class ReferenceSparsifier : public Sparsifier {
 public:
  ReferenceSparsifier(std::string name, const SparsifierOptions& options)
      : name_(std::move(name)), options_(options) {}

  std::string_view name() const override { return name_; }
  Status Prepare(int64_t /*max_numel*/, DType /*dtype*/) override { return Status::Ok(); }
  Status Sparsify(const DenseView& grad, SparseView* out,
                  const SparsifyContext& context) final;

 protected:
  // Called with the finite float32 input; writes the selection into *out (ascending indices).
  virtual Status Select(const std::vector<float>& x, SparseView* out,
                        const SparsifyContext& context) = 0;

  // Writes x[i] for each (ascending) i of `indices`.
  static void WriteSelection(const std::vector<int32_t>& indices, const std::vector<float>& x,
                             SparseView* out);

  const SparsifierOptions& options() const { return options_; }

 private:
  std::string name_;
  SparsifierOptions options_;
};

}  // namespace sparsync::kernels::reference
