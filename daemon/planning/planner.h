// Merge planners (docs/algorithms.md §3-4): split the gradient tensors of one step, in the order
// backward produces them, into contiguous merge groups, and predict the iteration time of the
// result.
//
//   omgs       the greedy rule of OMGS-SGD (Shi et al., "Communication-Efficient Distributed Deep
//              Learning with Merged Gradient Sparsification on GPUs", IEEE INFOCOM 2020): walk
//              from the first gradient to the last and merge the next layer into the current group
//              when the extra wait t_w is below the start-up time it saves, t_save. Unlike the
//              authors' released code, the first two layers are decided like every other pair.
//   optimal    the exact optimum over contiguous partitions: dynamic programming over prefixes,
//              keeping for each prefix the Pareto set of (compute free, network free) times.
//   layerwise  every tensor alone (LAGS-SGD).
//   single     one group after backward (TopK-SGD).
//   fixed      consecutive tensors up to a size (planning/fusion.h's FixedBuckets rule).
//   mgwfbp     the dense merge rule of MG-WFBP (Shi, Chu, Li, INFOCOM 2019), for compressor=none.
//
// The timeline. Layer i's gradient is ready at ready[i] = Σ_{j<=i} backward_s[j]. A group is
// sparsified once all its layers are ready, and exchanged once sparsified; sparsification is one
// serial resource and the network another, and groups use both in plan order. The executor
// prepares at most one group ahead of the exchange, so stage A starts group g once stage B has
// taken group g-1:
//   s_end[g]   = max(ready[last layer of g], c_start[g-1]) + t_s(x_g)   (x_g: elements of g)
//   c_start[g] = max(s_end[g], c_end[g-1])
//   c_end[g]   = c_start[g] + t_c(x_g)
// The predicted iteration time is c_end of the last group, counted from the start of backward
// (forward is the same under every plan). With `sparsify_blocks_backward` (a GPU whose kernels
// sparsify on the stream that runs backward, the paper's setting) sparsifying a group also delays
// every later layer's backward by t_s; on the CPU daemon it runs beside the framework's backward.
//
// Compress only where it pays (SPARSYNC_COMPRESS=auto). With `choose_dense`, every planner's
// groups are then sent dense or sparse, whichever the model predicts makes the iteration end
// sooner: a dense group costs the dense lines (t_s = dense_prepare, t_c = dense_exchange) on the
// same two resources. The choice is exact for the planner's grouping (a Pareto search over the
// groups, like `optimal`'s), so the grouping rules themselves are unchanged: `omgs` stays the
// paper's rule, decided on the sparse costs. `optimal` is the optimum over groupings and
// choices together (its grouping re-chosen is the same optimum).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "daemon/common/status.h"
#include "daemon/planning/cost_model.h"

namespace sparsync::planning {

enum class PlannerKind { kOmgs, kOptimal, kLayerwise, kSingle, kFixed, kMgWfbp };
const char* PlannerName(PlannerKind kind);
// "omgs", "optimal", "layerwise", "single", "mgwfbp"; fixed takes a size and is parsed by Config.
std::optional<PlannerKind> ParsePlannerName(const std::string& name);

struct PlanInput {
  // In the order backward produces them. Layers with different `merge_class` never share a
  // group (they differ in dtype, compressor or density).
  std::vector<LayerProfile> layers;
  std::vector<uint64_t> merge_class;  // empty: all equal
  CostModel cost;
  bool sparsify_blocks_backward = false;
  // Send a group dense where the model predicts that faster (needs cost.knows_dense()).
  bool choose_dense = false;
  uint64_t bytes_per_element = 4;  // for kFixed
};

struct Timeline {
  std::vector<double> sparsify_end;  // per group
  std::vector<double> exchange_start;
  std::vector<double> exchange_end;
  double iteration_s = 0;
};

struct Plan {
  PlannerKind planner = PlannerKind::kSingle;
  // Group boundaries: group g holds layers [starts[g], starts[g+1]) (the last up to the end).
  std::vector<size_t> starts;
  // Per group: sent dense (the model predicted it faster). Empty: every group sparse.
  std::vector<bool> dense;
  double predicted_s = 0;

  size_t num_groups() const { return starts.size(); }
  bool IsDense(size_t group) const { return group < dense.size() && dense[group]; }
  std::vector<size_t> GroupSizes(size_t num_layers) const;
  // "12 groups: [0..3] [4 dense] ..." for the log.
  std::string Describe(size_t num_layers) const;
};

// The timeline of `starts` (see above), group g sent dense where dense[g] (empty: all sparse).
// REQUIRES: starts is strictly increasing from 0.
Timeline Simulate(const PlanInput& input, const std::vector<size_t>& starts,
                  const std::vector<bool>& dense = {});
// The fastest dense or sparse choice for each group of `starts` under input.cost (all false
// unless input.choose_dense and the cost model knows the dense lines). Exact; when compressing
// every group is predicted to end as early, every group stays compressed.
std::vector<bool> ChooseDense(const PlanInput& input, const std::vector<size_t>& starts);

// Runs `kind`. `fixed_bytes` is the bucket of kFixed. Errors: an input without layers.
Result<Plan> MakePlan(PlannerKind kind, const PlanInput& input, uint64_t fixed_bytes = 0);

// The individual planners, for tests.
Plan PlanOmgs(const PlanInput& input);
Plan PlanOptimal(const PlanInput& input);
Plan PlanLayerwise(const PlanInput& input);
Plan PlanSingle(const PlanInput& input);
Plan PlanFixed(const PlanInput& input, uint64_t bucket_bytes);
Plan PlanMgWfbp(const PlanInput& input);

}  // namespace sparsync::planning
