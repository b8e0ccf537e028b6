// Calibration: the planner's cost model measured on the running job at start-up (docs/algorithms.md §5.1,
// issue 4 item 1), not taken from the paper's constants.
//   t_s(x): stage A of a sparse group of x elements on this node — residual, non-finite check,
//           selection with the configured compressor and packing (SparseReducer::Prepare).
//   t_c(x): stage B across the real nodes — the real exchange path of the configured compressor
//           (allgatherv of every node's payload, gTop-k's rounds, random-k's value allreduce),
//           decoding and averaging (SparseReducer::Exchange); for compressor=none, a dense
//           allreduce of x floats and t_s = 0.
// Synthetic data (normal values from a fixed seed) go through a scratch reducer, so no job state is
// touched. Each size runs a few warm-up repetitions, then the median of `reps` is taken; every
// timed exchange starts right after a barrier, so it measures the collective, not the skew between
// nodes. Each line is a least-squares fit (planning::LinearCost::Fit) on node 0, whose numbers are
// broadcast: every node returns the same CostModel, bit for bit.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "daemon/common/config.h"
#include "daemon/common/status.h"
#include "daemon/pipeline/tensor_table.h"
#include "daemon/planning/cost_model.h"
#include "daemon/transport/transport.h"

namespace sparsync::pipeline {

struct CalibrationOptions {
  // Group sizes in elements; empty: 2^12, 2^14, ..., 2^22. Sorted, deduplicated, capped below.
  std::vector<uint64_t> sizes;
  uint64_t max_elements = uint64_t{1} << 22;        // sparse compressors
  uint64_t max_dense_elements = uint64_t{1} << 20;  // compressor=none: the dense allreduce is slow
  // A compressing job also times the dense allreduce (CostModel::dense_exchange), for plans
  // that may send a group dense (SPARSYNC_COMPRESS=auto). Same sizes, after the sparse ones.
  bool dense_too = false;
  int warmup = 2;                                   // untimed repetitions per size
  int reps = 5;                                     // timed repetitions per size (median)
  // Stop adding sizes once this much time was spent (node 0 decides, after at least two sizes);
  // a compressing job's dense line has a budget of its own after the sparse ones. A dense line
  // that does not grow with size is dropped (CostModel::knows_dense() false).
  double budget_s = 3.0;
  // Monotonic seconds; empty: std::chrono::steady_clock. Tests inject a fake clock.
  std::function<double()> clock;
  uint64_t seed = 0x5eed;
  // Transport tags: first_tag, first_tag + 1, ... (clear of the executor's, which start at 0).
  uint32_t first_tag = uint32_t{1} << 30;
};

// Collective: every node calls it with the same config and options, after the transport is up and
// before the executor starts, and makes the same transport calls in the same order. Errors: an
// invalid compressor configuration (every node), transport errors as returned.
// REQUIRES: world.num_nodes == transport->size(), world.node_rank == transport->rank().
Result<planning::CostModel> CalibrateCostModel(const Config& config, World world,
                                               transport::Transport* transport,
                                               const CalibrationOptions& options);

}  // namespace sparsync::pipeline
