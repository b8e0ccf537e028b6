// MergeScheduler: the coordinator's side of planning (docs/planning.md; docs/algorithms.md §5.2,
// §5.4). It sees every gradient tensor when it becomes ready on all nodes, cuts the stream into
// training steps, measures each layer's backward time from the nodes' ready timestamps, and once it
// has watched `warmup_steps` steps with the same tensors it asks a planner (planning/planner.h) for
// merge groups. The plan takes effect at the next step: from then on a group is released the moment
// its last tensor is ready on every node (wait-free backpropagation: the exchange of early layers
// overlaps the backward of later ones). Until then, and whenever the plan stops fitting the job,
// the tensors go back to the coordinator's batching with fixed buckets (the safe plan).
//
// Steps. A step ends when every tensor of the previous step has been seen again; a tensor seen
// twice before that ends the step early and marks it irregular (the set of gradients changed).
// The plan is dropped, its partially ready groups released as they are, and measuring starts over
// when: a tensor outside the plan becomes ready, a step is irregular, or a group stays partially
// ready for longer than `group_wait` (a parameter without a gradient this step must not hang the
// job). Re-plans happen when the measured backward time drifts by more than `replan_drift`, or
// every `replan_steps` steps; each takes the next planner in `planners`.
//
// Costs. The cost model starts as the start-up calibration (SetCostModel) and follows the costs
// node 0's executor measures for each group (RecordGroupCost, planning/cost_tracker.h); a
// compressing job's dense groups keep the dense lines current the same way. A plan is
// reconsidered when the measured costs move its own predicted time by more than `replan_drift`.
//
// Plans that hold still. A trigger (drift, costs, replan_steps) only makes a candidate. It
// replaces the plan in force, with a new version announced and logged, when it is another
// planner of the list, or when its grouping or dense choices differ and it gains more than 1 % of
// the plan in force's prediction over that plan even where its gain is least: both priced under
// today's measurements, under each measured step's own backward times as well as their mean,
// with every group's start-up moved by the cost samples' spread around their lines in the
// direction adverse to the candidate (dearer where it has more groups, cheaper where it has
// fewer). Otherwise the plan stays, silently, and the drift triggers take today's measurements
// as their new reference.
//
// Fewer groups where more are not worth it. `optimal` picks the fastest grouping under the
// model, but every group also costs what the model leaves out (a coordinator round, wake-ups of
// the daemons' threads, CPU taken from a backward pass that shares the cores). So in a dense job
// (compressor none), where another planner's plan (`mgwfbp`'s, `single`'s, ...) has fewer
// groups and the optimum gains under 1 % of its prediction over it where its gain is least
// (start-ups dearer by the cost samples' spread, each step's backward times), `optimal` takes
// the one with the fewest groups, and the plan line says so. A compressing job keeps the
// optimum: there the grouping decides what is sent (one top-k over a merged group is not the
// top-k of its parts, and small groups go dense), and fewer groups can cost accuracy (the demo
// CNN as one group: 84.5 % after three epochs against 88.5 %, README).
//
// Timestamps. Each node stamps a tensor with its own monotonic clock; only differences between
// two tensors of one node are used, so the nodes' clocks need not agree. The first gradient of a
// step has no predecessor: its backward time is taken as zero, so predictions count from the
// first gradient ready (forward and the last layer's backward are the same under every plan).
//
// Not thread-safe: CoordinatorState owns it.
#pragma once

#include <deque>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "daemon/negotiation/types.h"
#include "daemon/planning/cost_model.h"
#include "daemon/planning/cost_tracker.h"
#include "daemon/planning/planner.h"

namespace sparsync::negotiation {

struct MergeOptions {
  std::vector<std::string> planners{"omgs"};  // see Config's MergePolicy
  uint64_t bucket_bytes = 64ull << 20;        // the fixed planner's bucket
  int warmup_steps = 5;
  double replan_drift = 0.2;
  int replan_steps = 0;
  bool dense_by_default = false;     // the daemon's compressor is none: omgs means mgwfbp
  bool choose_dense = false;         // SPARSYNC_COMPRESS=auto: groups may go dense (planner.h)
  bool sparsify_blocks_backward = false;
  Clock::duration min_group_wait = std::chrono::milliseconds(500);
};

// A gradient tensor that became ready on every node.
struct ReadyGradient {
  uint32_t slot = 0;
  std::string name;
  uint64_t elements = 0;
  uint64_t merge_class = 0;      // tensors of different classes never share a group
  bool dense = false;            // reduced without compression
  std::vector<int64_t> node_ready_ns;  // per node; 0: unknown
};

// What the coordinator appends to the schedule: a plan announcement or a group of slots.
struct MergeOutput {
  std::shared_ptr<const PlanInfo> plan;
  std::vector<uint32_t> group;
  uint32_t plan_version = 0;
  uint32_t group_index = 0;
};

class MergeScheduler {
 public:
  MergeScheduler(MergeOptions options, int num_nodes);

  // The calibrated model (before any group is measured).
  void SetCostModel(const planning::CostModel& cost);
  // One reduced gradient group's measured cost (pipeline/executor.h's GroupCost). Groups of the
  // other kind than the job plans for (dense groups of a sparse job) are ignored.
  void RecordGroupCost(uint64_t elements, bool sparse, double sparsify_s, double exchange_s);
  // The model the next plan will use.
  planning::CostModel cost_model() const;

  // Records `g`. Returns true when the current plan takes it (its group comes out of Take());
  // false: the caller schedules it (warm-up, or no plan fits).
  bool Ready(const ReadyGradient& g, Clock::time_point now);
  // Releases partially ready groups that waited too long (and drops the plan).
  void Tick(Clock::time_point now);
  std::optional<Clock::time_point> NextDeadline() const;
  // Plans and groups to append to the schedule, in order.
  std::vector<MergeOutput> Take();
  // Lines for the log (plans, drops).
  std::vector<std::string> TakeLog();
  // Forgets everything (the job failed).
  void Reset();

  uint64_t step() const { return step_; }
  const std::optional<PlanInfo>& plan() const { return plan_; }
  // Candidates that did not replace the plan in force (see Plans that hold still).
  uint64_t plans_held() const { return plans_held_; }

 private:
  struct StepSample {
    std::vector<uint32_t> order;                    // slots in global readiness order
    std::vector<std::vector<int64_t>> node_ready;   // per position, per node
    double span_s = 0;                              // coordinator time, first to last ready
  };
  struct Layer {
    std::string name;
    uint64_t elements = 0;
    uint64_t merge_class = 0;
    bool dense = false;
  };
  struct GroupState {
    std::vector<uint32_t> slots;
    size_t ready = 0;
    std::vector<bool> is_ready;
    Clock::time_point first_ready;
  };

  void CloseStep(bool regular);
  void MaybePlan();
  bool CostsDrifted(std::string* why) const;
  void MakePlan(const std::string& why);
  // Fewer groups where more are not worth it (dense jobs): replaces `plan` (the optimum under
  // `in`) by the plan of `others` with the fewest groups among those the optimum does not beat
  // by 1 % of its prediction even where its gain is least (under every AdverseInputs case).
  // Returns the note for the log ("" when `plan` stays).
  std::string PreferFewerGroups(
      const planning::PlanInput& in,
      const std::vector<std::pair<planning::PlannerKind, planning::Plan>>& others,
      planning::Plan* plan) const;
  // The cases under which two plans are compared where the gain of one is least: for each of
  // `directions` (+1: every group's start-up cost raised by the model's own error, the cost
  // tracker's spread; -1: lowered by it), `in` under its mean backward times and under each
  // measured step's own. Both plans compared are priced under the same case, so a step whose
  // backward ran long moves both.
  std::vector<planning::PlanInput> AdverseInputs(planning::PlanInput in,
                                                 std::initializer_list<double> directions) const;
  // `plan`'s iteration time under each of `cases`.
  static std::vector<double> PriceUnder(const std::vector<planning::PlanInput>& cases,
                                        const planning::Plan& plan);
  // The least, over `cases`, of `slower`'s time less `faster_s` (the other plan's, by case).
  static double LeastGain(const std::vector<planning::PlanInput>& cases,
                          const std::vector<double>& faster_s, const planning::Plan& slower);
  // Whether `next`, made by `name`, should replace the plan in force under `in`'s measurements
  // (see Plans that hold still).
  bool Improves(const planning::PlanInput& in, const planning::Plan& next,
                const std::string& name) const;
  double MeasuredSpan() const;  // the mean backward span of samples_
  // Today's measurements become the reference the drift triggers compare with.
  void SetReference(const planning::PlanInput& in, double predicted_s);
  void DropPlan(const std::string& why);
  // Per position of `order`: the time from the previous gradient's readiness to this one's,
  // averaged over the nodes and over samples_ (or over `only`, one of them).
  std::vector<double> BackwardTimes(const std::vector<uint32_t>& order,
                                    const StepSample* only = nullptr) const;

  const MergeOptions options_;
  const int num_nodes_;
  planning::CostTracker costs_;
  planning::CostTracker dense_costs_;  // a compressing job's dense groups (sparsify: stage A)

  uint64_t step_ = 0;
  // The step being watched.
  std::set<uint32_t> in_step_;
  StepSample current_;
  Clock::time_point step_first_ready_;
  // The previous complete step's tensors (empty before the first step ends).
  std::set<uint32_t> expected_;
  std::unordered_map<uint32_t, Layer> layers_;
  // Samples of the recent regular steps with the same tensors (the planner's measurements).
  std::deque<StepSample> samples_;
  bool skip_next_sample_ = true;  // the job's first step includes start-up

  std::optional<PlanInfo> plan_;
  uint32_t plans_made_ = 0;
  double plan_span_s_ = 0;         // the backward span the plan was made for
  planning::PlanInput plan_input_;  // what the plan was made from
  std::vector<size_t> plan_starts_;
  std::vector<bool> plan_dense_;
  double reference_s_ = 0;  // the plan's prediction under plan_input_
  uint64_t plans_held_ = 0;
  Clock::duration group_wait_{};   // how long a partially ready group may wait
  uint64_t steps_under_plan_ = 0;
  std::unordered_map<uint32_t, size_t> group_of_;  // slot -> group index
  std::vector<GroupState> groups_;
  std::vector<MergeOutput> out_;
  std::vector<std::string> log_;
};

}  // namespace sparsync::negotiation
