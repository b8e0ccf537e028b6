#include "daemon/planning/cost_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>
#include <vector>

namespace sparsync::planning {
namespace {

using Points = std::vector<std::pair<double, double>>;  // (elements, seconds)

// The samples with each size replaced by the shape's feature (x, or x · log2 x).
Points InShape(const Points& samples, bool x_log_x) {
  const LinearCost shape{0, 0, x_log_x};
  Points out;
  out.reserve(samples.size());
  for (const auto& [x, y] : samples) out.emplace_back(shape.Feature(x), y);
  return out;
}

// The sum of squared relative residuals: a selection's points span three decades of size, and
// least squares in seconds would judge a fit by its largest sizes only.
double RelativeResidual(const LinearCost& fit, const Points& samples) {
  double sum = 0;
  for (const auto& [x, y] : samples) {
    if (y <= 0) continue;
    const double r = (fit.At(x) - y) / y;
    sum += r * r;
  }
  return sum;
}

}  // namespace

LinearCost LinearCost::Fit(const std::vector<std::pair<double, double>>& samples,
                           bool* clamped_fixed, bool x_log_x) {
  if (clamped_fixed) *clamped_fixed = false;
  if (samples.empty()) return {.x_log_x = x_log_x};
  const Points points = InShape(samples, x_log_x);
  double n = static_cast<double>(points.size());
  double mean_x = 0, mean_y = 0;
  for (const auto& [x, y] : points) {
    mean_x += x / n;
    mean_y += y / n;
  }
  double sxx = 0, sxy = 0;
  for (const auto& [x, y] : points) {
    sxx += (x - mean_x) * (x - mean_x);
    sxy += (x - mean_x) * (y - mean_y);
  }
  LinearCost fit{.x_log_x = x_log_x};
  if (sxx <= 0) {
    // One distinct size: all of the time is attributed to the size.
    fit.per_element_s = mean_x > 0 ? std::max(0.0, mean_y / mean_x) : 0.0;
    fit.fixed_s = mean_x > 0 ? 0.0 : std::max(0.0, mean_y);
    return fit;
  }
  fit.per_element_s = sxy / sxx;
  fit.fixed_s = mean_y - fit.per_element_s * mean_x;
  // A negative coefficient is noise; refit the other one alone.
  if (fit.per_element_s < 0) {
    fit.per_element_s = 0;
    fit.fixed_s = std::max(0.0, mean_y);
  } else if (fit.fixed_s < 0) {
    if (clamped_fixed) *clamped_fixed = true;
    return FitSlope(samples, 0, x_log_x);
  }
  return fit;
}

LinearCost LinearCost::FitSlope(const std::vector<std::pair<double, double>>& samples,
                                double fixed_s, bool x_log_x) {
  double sxx = 0, sxy = 0;
  for (const auto& [x, y] : InShape(samples, x_log_x)) {
    sxx += x * x;
    sxy += x * (y - fixed_s);
  }
  return {fixed_s, sxx > 0 ? std::max(0.0, sxy / sxx) : 0.0, x_log_x};
}

bool LinearCost::PrefersXLogX(const std::vector<std::pair<double, double>>& samples) {
  // Each shape has two coefficients, so two sizes fit both exactly, and three leave each fit
  // one residual: on a loaded machine that one residual is noise as often as curvature (CI's
  // unit tests saw three-size CPU calibrations of gTop-k and DGC come out as curves). Four sizes
  // leave two residuals per fit to compare.
  std::vector<double> sizes;
  for (const auto& [x, y] : samples) sizes.push_back(x);
  std::sort(sizes.begin(), sizes.end());
  if (std::unique(sizes.begin(), sizes.end()) - sizes.begin() < 4) return false;
  const LinearCost line = Fit(samples);
  const LinearCost curve = Fit(samples, nullptr, /*x_log_x=*/true);
  return RelativeResidual(curve, samples) < 0.5 * RelativeResidual(line, samples);
}

std::string LinearCost::ToString() const {
  char buf[112];
  std::snprintf(buf, sizeof(buf), x_log_x ? "%.3g ms + %.3g ns/element x log2(elements)"
                                          : "%.3g ms + %.3g ns/element",
                fixed_s * 1e3, per_element_s * 1e9);
  return buf;
}

CostModel EstimatedCostModel(int num_nodes, double density, bool dense) {
  CostModel m;
  double p = std::max(2, num_nodes);
  // Ring allreduce: 2(P-1) start-ups, 2(P-1)/P of the bytes through a 1 Gb/s link.
  const LinearCost ring{2 * (p - 1) * 50e-6, 2 * (p - 1) / p * 4 / 117e6};
  if (dense) {
    m.exchange = ring;
    return m;
  }
  m.dense_exchange = ring;
  // t_c(x) = 2 (a_P + b_P * 4 * P * k), k = density * x: values and indices gathered separately.
  struct Fit {
    int nodes;
    double a, b;
  };
  static constexpr Fit kFits[] = {{2, 1.6e-3, 1e-8}, {4, 2.7e-3, 1.3e-8}, {8, 4e-3, 1.5e-8},
                                  {16, 1.1e-2, 1.7e-8}};
  Fit fit = kFits[0];
  for (const Fit& f : kFits) {
    if (std::abs(std::log2(f.nodes) - std::log2(p)) < std::abs(std::log2(fit.nodes) - std::log2(p))) {
      fit = f;
    }
  }
  m.exchange.fixed_s = 2 * fit.a;
  m.exchange.per_element_s = 2 * fit.b * 4 * p * density;
  m.sparsify.fixed_s = 20e-6;
  m.sparsify.per_element_s = 0.6e-9;
  return m;
}

std::string CostModel::ToString() const {
  std::string s = "t_s = " + sparsify.ToString() + ", t_c = " + exchange.ToString();
  if (knows_dense()) {
    s += ", dense " + dense_prepare.ToString() + " + " + dense_exchange.ToString();
  }
  return s;
}

}  // namespace sparsync::planning
