// CostTracker: the planner's cost model kept current while the job trains (docs/algorithms.md §5.3,
// issue 4 item 1). It starts from the start-up calibration (pipeline/calibration.h), which times
// the compressor and the exchange on an idle node, and takes the costs the executor measures on
// node 0 for every gradient group it reduces (pipeline/executor.h's GroupCost). Those include what
// the calibration cannot see: the workers and the other daemons competing for the CPU, the copies
// in and out of shared memory, the write-back, and, inside the exchange, the wait for the
// slowest peer. The waits before stage A takes a group are not in them (executor.h).
//
// A size's first `warmup_per_size` samples are left out: the first groups of a size are when the
// executor's staging buffers for it grow (each of its slots has its own) and the residuals of
// its tensors are first written, and page faults then double their time. Measured on the dilated
// AlexNet run of bench/RESULTS.md (issue 15): a 37.7 M-element group's selection took 2.4-2.7 s
// in its first two steps and 1.0-1.1 s after; fitted through, they priced every later group at
// 2.7x its time.
//
// How a line is refreshed from the recent samples (the last `window` groups):
//   - samples are grouped by size and each size is represented by its median (a plan repeats the
//     same group sizes every step, and a median ignores the odd descheduled group), weighted by
//     how many samples it has;
//   - two sizes at least a factor of two apart: the α-β line is fitted through the medians (for
//     the selection, x log2 x where the calibration chose it, or where four sizes or more
//     spanning a factor of eight show it: LinearCost::PrefersXLogX),
//     and kept if its slope at least doubles the largest size's time (else every size seen is
//     latency-bound, the slope is noise, and the line must not be extrapolated: next rule);
//     a fit whose start-up comes out negative keeps the calibrated start-up (when there is
//     one) and fits the slope alone, since a line through the origin prices small groups at
//     nothing;
//   - otherwise (one group per step, groups of one size, latency-bound sizes only): the
//     calibrated line is scaled by the median ratio of measured to calibrated time, which keeps
//     its shape;
//   - fewer than `min_samples` samples: the calibrated line.
//
// The model's own error (RelativeError): how far the window's samples lie from the refreshed
// lines, as the median of |measured / predicted - 1| over the groups' t_s + t_c. The merge
// scheduler moves every group's start-up by it to price a plan's gain where it is least, before
// it replaces a plan or takes one of fewer groups (negotiation/merge_scheduler.h,
// docs/planning.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>

#include "daemon/planning/cost_model.h"

namespace sparsync::planning {

class CostTracker {
 public:
  explicit CostTracker(size_t window = 256, size_t min_samples = 4, size_t warmup_per_size = 2)
      : window_(window), min_samples_(min_samples), warmup_per_size_(warmup_per_size) {}

  // The calibrated model. Samples already taken are kept.
  void SetBase(const CostModel& base) { base_ = base; }
  const CostModel& base() const { return base_; }

  // One group of `elements` took `sparsify_s` in stage A and `exchange_s` in stage B (kept once
  // its size is past its warm-up).
  void Add(uint64_t elements, double sparsify_s, double exchange_s);
  size_t samples() const { return samples_.size(); }

  // The model to plan with now.
  CostModel Current() const;
  // The spread of the samples around Current() (see above); 0 with fewer than min_samples.
  double RelativeError() const;

 private:
  struct Sample {
    double elements;
    double sparsify_s;
    double exchange_s;
  };
  // `may_curve`: a selection, whose shape (line or x log2 x) the samples may choose.
  LinearCost Refresh(const LinearCost& base, double Sample::*seconds, bool may_curve) const;

  const size_t window_;
  const size_t min_samples_;
  const size_t warmup_per_size_;
  CostModel base_;
  std::deque<Sample> samples_;
  std::map<uint64_t, size_t> seen_;  // groups of each size so far, warm-up included
};

}  // namespace sparsync::planning
