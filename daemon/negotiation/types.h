// Negotiation vocabulary shared by the coordinator and the nodes; free of gRPC types.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "daemon/common/status.h"

namespace sparsync::negotiation {

using Clock = std::chrono::steady_clock;

// What identifies a tensor across nodes (see TensorMeta in coordinator.proto).
struct TensorMeta {
  std::string name;
  uint32_t op = 0;         // sparsync_op
  uint32_t dtype = 0;      // sparsync_dtype
  uint32_t reduce_op = 0;  // sparsync_reduce_op
  int32_t root_rank = 0;
  std::vector<int64_t> shape;
  uint32_t compressor = 0;  // sparsync_compressor (GRADIENT only; 0: the daemon's)
  float density = 0;        // 0: the daemon's

  // Equal keys <=> same tensor on every node. ALLGATHER ignores the first dimension.
  std::string SignatureKey() const;
  // "shape [512,784], dtype float32, op allreduce" for error messages.
  std::string Describe() const;
  int64_t NumElements() const;
  bool operator==(const TensorMeta&) const = default;
};

// A tensor a node reports ready, by slot.
struct ReadyRef {
  uint32_t slot = 0;
  std::vector<int64_t> worker_dim0;  // ALLGATHER: each local worker's first dimension
};

struct GroupTensor {
  uint32_t slot = 0;
  std::vector<int64_t> worker_dim0;  // ALLGATHER: every worker's first dimension, rank order
};

// A merge plan as every node receives it (planning/planner.h): from step `effective_step` on,
// the gradient tensors are exchanged in these groups.
struct PlanInfo {
  uint32_t version = 0;  // 1, 2, ...
  uint64_t effective_step = 0;
  std::string planner;   // "omgs", "optimal", ...
  std::vector<std::vector<uint32_t>> groups;  // slots, in the order backward produces them
  double predicted_s = 0;  // the planner's iteration time, from the first gradient ready
  std::string summary;     // cost model and the other planners' predictions, for the log
  bool operator==(const PlanInfo&) const = default;
};

// One step of the schedule that every node executes in the same order.
struct ScheduleEntry {
  uint64_t seq = 0;
  std::vector<GroupTensor> group;  // a merge group; empty for a plan or a fatal entry
  Status fatal;                    // non-OK: the job failed; fail everything pending
  // A new plan, announced before its first group (shared: entries are copied to every poller).
  std::shared_ptr<const PlanInfo> plan;
  uint32_t plan_version = 0;       // the plan this group belongs to (0: none)
  uint32_t group_index = 0;        // its index in that plan
};

std::string DTypeName(uint32_t dtype);
std::string OpName(uint32_t op);
size_t DTypeSize(uint32_t dtype);

}  // namespace sparsync::negotiation
