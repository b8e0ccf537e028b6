// Observer: what the daemon tells its observers (the timeline, timeline.h, and the Prometheus
// metrics, metrics.h) about the work it does. The executor and the node agent call it at a few
// fixed points (docs/operations.md, "timeline"); an observer only records, it never changes what
// the daemon does.
//
// Contract for implementations: every call is cheap and never blocks on I/O (an observer that
// writes a file hands the work to a thread of its own); the views and everything they point to
// are valid only during the call. Calls may come from several threads at once (the executor's
// stage B, the agent's caller, the coordinator's timer): an implementation is thread-safe.
// Times are steady-clock nanoseconds (std::chrono::steady_clock, CLOCK_MONOTONIC on Linux, the
// clock of ReadyTensor::ready_ns).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/common/tensor_meta.h"

namespace sparsync::observe {

// One tensor of a group.
struct TensorView {
  const std::string* name = nullptr;
  int64_t ready_ns = 0;  // every local worker had posted this round
};

// A sub-step of a group's stage ("local reduce", "sparsify", "pack", "transfer", "unpack",
// "write-back"; pipeline/step_marks.h): it ended at `end_ns` and began where the previous one,
// or its stage, did.
struct StepView {
  const char* name = "";
  int64_t end_ns = 0;
};

// One schedule entry (a merge group, an allgather or a broadcast) as the executor ran it. Every
// time is 0 where the stage did not run (a failure before it).
struct GroupView {
  uint64_t seq = 0;
  CollectiveOp op = CollectiveOp::kAllReduce;
  const char* path = "";    // the reduce path's name (pipeline/reduce_path.h), "" if none
  bool sparse = false;      // compressed by a sparse reducer
  uint64_t step = 0;        // the round of the group's tensors
  uint32_t plan_version = 0;
  uint64_t elements = 0;
  uint64_t dense_bytes = 0;  // the group's accumulator: what a dense exchange would send
  std::span<const TensorView> tensors;
  int64_t received_ns = 0;       // the node's agent received the entry from the coordinator
  int64_t prepare_begin_ns = 0;  // stage A: local sum, residual, selection, packing
  int64_t prepare_end_ns = 0;
  int64_t exchange_begin_ns = 0;  // stage B: every transport call, and the unpacking
  int64_t exchange_end_ns = 0;
  int64_t deliver_end_ns = 0;  // the write-back into the workers' memory and the DONE messages
  std::span<const StepView> steps;  // the sub-steps the reduce path marked, in order
  bool ok = true;              // false: the group failed on this node
};

// A merge plan this node follows from now on (negotiation/types.h's PlanInfo).
struct PlanView {
  uint32_t version = 0;
  uint64_t effective_step = 0;
  std::string_view planner;
  size_t groups = 0;
  double predicted_s = 0;    // the planner's iteration time
  std::string_view summary;  // its cost model and the other planners' predictions
};

// Something that happened once, at a point in time.
enum class Incident {
  kCalibration,  // the start-up measurement of the cost model
  kPlannerNote,  // node 0's planner: a plan made or dropped (with the cost model it used)
  kStall,        // node 0's coordinator: a tensor is missing on some nodes
  kFailure,      // the job failed on this node
};
const char* IncidentName(Incident incident);

class Observer {
 public:
  virtual ~Observer() = default;
  // Stage B, before the group's transport calls (a failed Prepare never gets here).
  virtual void OnExchange(const GroupView& group) {}
  // Stage B, once the group is done: delivered, or failed on this node.
  virtual void OnGroup(const GroupView& group) = 0;
  // The node agent, when the executor is handed a new plan.
  virtual void OnPlan(const PlanView& plan) {}
  virtual void OnIncident(Incident incident, std::string_view detail) {}
};

// Calls each of its observers in order. The observers outlive it.
class ObserverList : public Observer {
 public:
  void Add(Observer* observer) { observers_.push_back(observer); }
  void OnExchange(const GroupView& group) override {
    for (Observer* o : observers_) o->OnExchange(group);
  }
  void OnGroup(const GroupView& group) override {
    for (Observer* o : observers_) o->OnGroup(group);
  }
  void OnPlan(const PlanView& plan) override {
    for (Observer* o : observers_) o->OnPlan(plan);
  }
  void OnIncident(Incident incident, std::string_view detail) override {
    for (Observer* o : observers_) o->OnIncident(incident, detail);
  }

 private:
  std::vector<Observer*> observers_;  // fixed before the daemon's threads start
};

inline const char* IncidentName(Incident incident) {
  switch (incident) {
    case Incident::kCalibration: return "calibration";
    case Incident::kPlannerNote: return "planner";
    case Incident::kStall: return "stall";
    case Incident::kFailure: return "job failed";
  }
  return "?";
}

}  // namespace sparsync::observe
