#pragma once
// Reference sparsifiers: simple, obviously correct implementations used as test oracles.
// They sort where a fast kernel would select and allocate freely. Same contract as
// kernels/sparsifier.h; the algorithm of each is described (with its paper) in its .cc file.

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/sparsifier.h"

namespace sparsync::kernels::reference {

std::unique_ptr<Sparsifier> MakeTopK(const SparsifierOptions& options);
std::unique_ptr<Sparsifier> MakeRandomK(const SparsifierOptions& options);
std::unique_ptr<Sparsifier> MakeThreshold(const SparsifierOptions& options);
std::unique_ptr<Sparsifier> MakeGaussianK(const SparsifierOptions& options);
std::unique_ptr<Sparsifier> MakeWangni(const SparsifierOptions& options);
std::unique_ptr<Sparsifier> MakeDgc(const SparsifierOptions& options);

// Indices of the k largest |x[i]|, larger |x| first, then smaller index; returned ascending.
std::vector<int32_t> TopKIndices(const std::vector<float>& x, int64_t k);

// Wangni et al. greedy probabilities for expected density kappa (kappa*d = sum p when feasible).
// *passes receives the number of rescaling passes made (<= max_passes).
std::vector<double> WangniGreedyProbabilities(const std::vector<float>& g, double kappa,
                                              int max_passes, int* passes = nullptr);
// Wangni et al. closed form for the variance budget E||Q(g)||^2 = (1 + eps) ||g||^2.
std::vector<double> WangniVarianceBudgetProbabilities(const std::vector<float>& g, double eps);

}  // namespace sparsync::kernels::reference
