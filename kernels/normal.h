#pragma once
// Standard normal quantile, used by Gaussian-k to turn a density into a threshold.

namespace sparsync::kernels {

// Phi^{-1}(p): the z with P(Z <= z) = p for Z ~ N(0, 1). Relative error below 1e-13 on
// (0, 1) (Acklam's rational approximation followed by one Halley step on erfc).
// Returns -inf for p <= 0 and +inf for p >= 1.
double NormalQuantile(double p);

}  // namespace sparsync::kernels
