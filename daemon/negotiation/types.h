// Negotiation vocabulary shared by the coordinator and the nodes; free of gRPC types.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "daemon/common/status.h"
#include "daemon/common/tensor_meta.h"

namespace sparsync::negotiation {

using Clock = std::chrono::steady_clock;

// TensorMeta (common/tensor_meta.h) is what identifies a tensor across nodes.
using sparsync::TensorMeta;

// News of one of a node's ranks that the coordinator needs besides its tensors.
enum class RankEvent {
  kJoined,  // called hvd.join(): out of data until every rank has joined
  kGone,    // its worker left (shutdown(), exit or crash) with nothing in flight
  kBack,    // a worker of that rank connected again after it had gone
};

// What a node reports since its last report, per kind of rank news.
struct RankNews {
  std::vector<int32_t> joined;
  std::vector<int32_t> gone;
  std::vector<int32_t> back;
  bool empty() const { return joined.empty() && gone.empty() && back.empty(); }
};

// A tensor every local worker of a node has posted: what the node reports to the coordinator.
struct ReadyTensor {
  TensorMeta meta;
  std::vector<int64_t> worker_dim0;  // ALLGATHER: each local member's first dimension (0: joined)
  int64_t ready_ns = 0;              // steady clock when the last local worker posted it
  // >= 0: not a tensor but `event` of this global rank (NodeAgent orders it after the tensors
  // reported before it).
  int32_t event_rank = -1;
  RankEvent event = RankEvent::kJoined;
};

struct GroupTensor {
  uint32_t slot = 0;
  std::vector<int64_t> worker_dim0;  // ALLGATHER: every member's first dimension, rank order
  // The tensor's name on this node. The coordinator sends slots only; the node's agent, the one
  // owner of the slot -> name map, fills this in before the executor sees the entry.
  std::string name;
  // A process set's tensor (TensorMeta::members): its metadata, sent along so that a node with
  // no member, which never registered it, takes part in the exchange. Null otherwise.
  std::shared_ptr<const TensorMeta> meta;
};

// A merge plan as every node receives it (planning/planner.h): from step `effective_step` on,
// the gradient tensors are exchanged in these groups.
struct PlanInfo {
  uint32_t version = 0;  // 1, 2, ...
  uint64_t effective_step = 0;
  std::string planner;   // "omgs", "optimal", ...
  std::vector<std::vector<uint32_t>> groups;  // slots, in the order backward produces them
  // Per group: sent dense, uncompressed (SPARSYNC_COMPRESS=auto; empty: every group as the job
  // compresses). Part of the plan, so every node decides the same.
  std::vector<bool> dense;
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
  // The plan sends this group dense. Not on the wire: the node's agent fills it in from the
  // plan it follows (PlanInfo::dense), as it fills in the names.
  bool dense = false;
  int64_t received_ns = 0;         // steady clock when this node's agent received it
  // >= 0: every rank has called hvd.join(), this one last; the join ends here (no group).
  int32_t join_last_rank = -1;
};

}  // namespace sparsync::negotiation
