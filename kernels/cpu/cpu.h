#pragma once
// Fast CPU sparsifiers: same contract and same output as kernels/reference/ (exactly, for the
// selection rules; see each .cc for where floating-point sums may differ in the last bit).
// Single-threaded and deterministic. float32 input is read in place; float16, bfloat16 and
// float64 are converted into a buffer allocated by Prepare().

#include <memory>

#include "kernels/sparsifier.h"

namespace sparsync::kernels::cpu {

std::unique_ptr<Sparsifier> MakeTopK(const SparsifierOptions& options);
std::unique_ptr<Sparsifier> MakeRandomK(const SparsifierOptions& options);
std::unique_ptr<Sparsifier> MakeThreshold(const SparsifierOptions& options);
std::unique_ptr<Sparsifier> MakeGaussianK(const SparsifierOptions& options);
std::unique_ptr<Sparsifier> MakeWangni(const SparsifierOptions& options);
std::unique_ptr<Sparsifier> MakeDgc(const SparsifierOptions& options);

}  // namespace sparsync::kernels::cpu
