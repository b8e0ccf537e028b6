#include "daemon/planning/cost_tracker.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>
#include <vector>

namespace sparsync::planning {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

void CostTracker::Add(uint64_t elements, double sparsify_s, double exchange_s) {
  if (elements == 0 || window_ == 0) return;
  // A job whose group sizes never repeat would grow the count without end; forgetting them all
  // costs each size one more warm-up.
  if (seen_.size() >= 4 * window_) seen_.clear();
  if (seen_[elements]++ < warmup_per_size_) return;
  samples_.push_back({static_cast<double>(elements), std::max(0.0, sparsify_s),
                      std::max(0.0, exchange_s)});
  while (samples_.size() > window_) samples_.pop_front();
}

CostModel CostTracker::Current() const {
  CostModel m;
  m.sparsify = Refresh(base_.sparsify, &Sample::sparsify_s, /*may_curve=*/true);
  m.exchange = Refresh(base_.exchange, &Sample::exchange_s, /*may_curve=*/false);
  return m;
}

double CostTracker::RelativeError() const {
  if (samples_.size() < std::max<size_t>(1, min_samples_)) return 0.0;
  const CostModel model = Current();
  std::vector<double> deviations;
  for (const Sample& s : samples_) {
    const double predicted = model.sparsify.At(s.elements) + model.exchange.At(s.elements);
    if (predicted <= 0) continue;
    deviations.push_back(std::abs((s.sparsify_s + s.exchange_s) / predicted - 1));
  }
  return deviations.empty() ? 0.0 : Median(std::move(deviations));
}

LinearCost CostTracker::Refresh(const LinearCost& base, double Sample::*seconds,
                                bool may_curve) const {
  if (samples_.size() < std::max<size_t>(1, min_samples_)) return base;
  std::map<double, std::vector<double>> by_size;
  for (const Sample& s : samples_) by_size[s.elements].push_back(s.*seconds);
  // Each size's median stands for all of its samples, so a size seen once (a warm-up bucket)
  // weighs less than the groups of the plan in force.
  std::vector<std::pair<double, double>> medians;
  for (auto& [elements, times] : by_size) {
    const size_t count = times.size();
    const double median = Median(std::move(times));
    medians.insert(medians.end(), count, {elements, median});
  }

  const double smallest = medians.front().first, largest = medians.back().first;
  if (largest >= 2 * smallest) {
    // The shape: the calibration's, unless the training's groups span enough sizes to tell
    // (their times hold what an idle calibration does not: on the dilated AlexNet, groups of
    // 4-38 M elements kept a line where the calibration, 4 K-4 M, had chosen the curve).
    bool x_log_x = base.x_log_x;
    if (may_curve && largest >= 8 * smallest) {
      x_log_x = LinearCost::PrefersXLogX(medians);
    }
    bool through_origin = false;
    const LinearCost fit = LinearCost::Fit(medians, &through_origin, x_log_x);
    // A fixed cost that comes out negative is noise (the larger sizes happened to cost more
    // than a line through the smaller ones says), and the line Fit then draws through the
    // origin prices a small group at nearly nothing: the planner splits the model into many
    // groups, each of which pays the real start-up. Measured on the dilated ResNet-20 at a
    // modelled 25 Gb/s (bench/RESULTS.md, issue 15): "0 ms + 475 ns/element" against a
    // calibrated 13.1 ms start-up, a 9-group plan, 1.40x the iteration of compressor none.
    // The samples cannot tell the start-up from the per-element cost then; the calibration
    // timed sizes three decades apart, so its start-up is held and the slope alone is fitted.
    if (through_origin && base.fixed_s > 0) {
      return LinearCost::FitSlope(medians, base.fixed_s, x_log_x);
    }
    // The slope is seen only where it at least doubles the largest size's time. Below that
    // every size is latency-bound (as the small tensors that a compressing job sends dense
    // are) and the slope is noise: extrapolated to a group a hundred times larger, a flat line
    // would call a dense allreduce of the whole model as cheap as that of a bias.
    if (fit.per_element_s * fit.Feature(largest) >= fit.fixed_s || base == LinearCost{}) {
      return fit;
    }
  }

  std::vector<double> ratios;
  for (const Sample& s : samples_) {
    double predicted = base.At(s.elements);
    if (predicted > 0) ratios.push_back(s.*seconds / predicted);
  }
  if (ratios.empty()) return LinearCost::Fit(medians);  // nothing calibrated to scale
  double scale = Median(std::move(ratios));
  return {base.fixed_s * scale, base.per_element_s * scale, base.x_log_x};
}

}  // namespace sparsync::planning
