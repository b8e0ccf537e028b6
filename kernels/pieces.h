#pragma once
// A tensor stored in pieces: a merge group whose tensors each live in a buffer of their own (the
// workers' shared regions, the per-tensor residuals), indexed as if the pieces lay end to end.
// Selecting and decoding over the pieces themselves saves gathering the group into one buffer.

#include <cstddef>
#include <cstdint>
#include <span>

namespace sparsync::kernels {

// The pieces' element count, laid end to end.
template <typename T>
int64_t TotalElements(std::span<const std::span<T>> pieces) {
  int64_t n = 0;
  for (const std::span<T>& p : pieces) n += static_cast<int64_t>(p.size());
  return n;
}

// Element i of the whole. Made for ascending indices (each costs O(1) amortised); a smaller index
// than the last one restarts the walk at the first piece. REQUIRES: 0 <= i < TotalElements.
template <typename T>
class PieceWalker {
 public:
  explicit PieceWalker(std::span<const std::span<T>> pieces) : pieces_(pieces) {}

  T& operator[](int64_t i) {
    if (i < start_) {
      piece_ = 0;
      start_ = 0;
    }
    while (i - start_ >= static_cast<int64_t>(pieces_[piece_].size())) {
      start_ += static_cast<int64_t>(pieces_[piece_].size());
      ++piece_;
    }
    return pieces_[piece_][static_cast<size_t>(i - start_)];
  }

 private:
  std::span<const std::span<T>> pieces_;
  size_t piece_ = 0;
  int64_t start_ = 0;  // the whole's index of pieces_[piece_][0]
};

}  // namespace sparsync::kernels
