// The planner's cost model (docs/algorithms.md §2): what one merge group costs to sparsify and to
// exchange, and how long each layer's backward takes. Measured on the running job, not constants:
// the sparsification and exchange costs are fitted at start-up (pipeline/calibration.h) and the
// backward times come from the shims' gradient-ready timestamps (planning/backward_profile.h).
//
// Units: seconds and elements. Layers are listed in the order backward produces them (the first
// entry is the first gradient to become ready, i.e. the output layer), which is the reverse of
// the paper's forward numbering.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace sparsync::planning {

// fixed_s + per_element_s * f(x), f(x) = x (an α-β line in elements) or, with x_log_x,
// x · log2 x: the shape of a sort-based top-k, as OMGS-SGD's authors fitted their GPU's
// selection (docs/algorithms.md §2). Exchanges are always lines; a selection takes the shape
// that its calibration's points fit better (FitBetterShape).
struct LinearCost {
  double fixed_s = 0;
  double per_element_s = 0;
  bool x_log_x = false;

  double At(double elements) const { return fixed_s + per_element_s * Feature(elements); }
  double Feature(double elements) const {
    return x_log_x && elements > 1 ? elements * std::log2(elements) : elements;
  }
  // Least-squares fit of (elements, seconds) samples in the shape `x_log_x` gives; both
  // coefficients clamped at >= 0. One distinct size gives a line through the origin's slope; no
  // samples give zero. `clamped_fixed` (optional) is set when the fixed cost came out negative
  // and the line was refitted through the origin.
  static LinearCost Fit(const std::vector<std::pair<double, double>>& samples,
                        bool* clamped_fixed = nullptr, bool x_log_x = false);
  // The least-squares slope of the samples with the fixed cost held at `fixed_s` (clamped >= 0).
  static LinearCost FitSlope(const std::vector<std::pair<double, double>>& samples,
                             double fixed_s, bool x_log_x = false);
  // Whether x · log2 x fits the samples clearly better than a line: four sizes at least, and
  // the sum of squared relative residuals under half the line's (a line extrapolates a
  // linear-time selection better, so it keeps ties).
  static bool PrefersXLogX(const std::vector<std::pair<double, double>>& samples);
  // Fit() in the shape PrefersXLogX picks.
  static LinearCost FitBetterShape(const std::vector<std::pair<double, double>>& samples) {
    return Fit(samples, nullptr, PrefersXLogX(samples));
  }
  std::string ToString() const;
  bool operator==(const LinearCost&) const = default;
};

struct CostModel {
  // t_s: select and pack a group of x elements on this node (zero for dense reduction).
  LinearCost sparsify;
  // t_c: exchange a group of x elements across all nodes (sparse allgather, or the dense
  // allreduce when the job does not compress).
  LinearCost exchange;
  // A compressing job's groups sent dense instead (SPARSYNC_COMPRESS=auto): stage A's local sum
  // and the dense allreduce. Both zero: not known, and the planner never sends a group dense.
  LinearCost dense_prepare;
  LinearCost dense_exchange;

  double SparsifyTime(uint64_t elements) const {
    return elements == 0 ? 0.0 : sparsify.At(static_cast<double>(elements));
  }
  double ExchangeTime(uint64_t elements) const {
    return elements == 0 ? 0.0 : exchange.At(static_cast<double>(elements));
  }
  double DensePrepareTime(uint64_t elements) const {
    return elements == 0 ? 0.0 : dense_prepare.At(static_cast<double>(elements));
  }
  double DenseExchangeTime(uint64_t elements) const {
    return elements == 0 ? 0.0 : dense_exchange.At(static_cast<double>(elements));
  }
  bool knows_dense() const { return dense_exchange != LinearCost{}; }
  std::string ToString() const;
  bool operator==(const CostModel&) const = default;
};

// Costs to plan with before anything is measured (SPARSYNC_CALIBRATE=0): the 1 Gb/s Ethernet fits
// of the OMGS paper for the sparse allgather (docs/algorithms.md §2, nearest P of 2, 4, 8, 16), a
// ring allreduce at 1 Gb/s for dense jobs (and for a sparse job's dense groups), and this project's
// CPU top-k speed for the selection.
CostModel EstimatedCostModel(int num_nodes, double density, bool dense);

// One layer (one gradient tensor) as the planner sees it.
struct LayerProfile {
  uint64_t elements = 0;
  double backward_s = 0;  // t_b: time from the previous gradient being ready to this one
};

}  // namespace sparsync::planning
