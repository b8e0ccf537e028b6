// ReducePath: how one schedule entry (a merge group, or one allgather or broadcast) is executed,
// given where its data lives. There is one implementation per path; the executor (executor.h)
// offers each group to its paths in order and the first that takes it executes it, through the
// same two stages for every path:
//
//   Prepare   stage A, the preparing thread: local work only, no transport call (stage the
//             node's sum to the host or keep it on the device, sum the local workers, add the
//             residual, select and pack).
//   Exchange  stage B, the exchanging thread: every transport call of the group, in schedule
//             order (the same on every node), leaving the result where the path keeps it.
//   Deliver   stage B, after a successful Exchange, for each member whose round is still
//             current: the result into the workers' memory, and DONE (delivery.h).
//
// A path is chosen once, when the group is formed and where its members' data lives is known
// (GroupMember::sum): a new path is a new class in the executor's list, not a new flag.
//
// Per-slot state: the executor keeps up to depth + 2 groups in flight, each in a slot of its own;
// a path keeps what it needs between its stages (buffers reused from group to group) in the
// Scratch it makes for each slot, so preparing one group never overwrites what another is
// sending. Paths themselves hold no per-group state and are called from both stages at once (on
// different slots): what they share between groups (reducers, residuals) is thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "daemon/pipeline/sparse_reducer.h"
#include "daemon/pipeline/step_marks.h"
#include "daemon/pipeline/tensor_table.h"

namespace sparsync::pipeline {

// One schedule entry being executed.
struct Group {
  uint64_t seq = 0;
  CollectiveOp op = CollectiveOp::kAllReduce;
  std::vector<GroupMember> members;
  std::vector<GroupSlice> slices;  // member i's elements in the group, side by side
  size_t elements = 0;             // of the group: the slices' counts summed
  double divisor = 1.0;            // the world's size for an average, else 1
  // The gradient group's sparse reducer, when it is compressed (null: dense), decided when the
  // group is formed from its compressor, dtype and size (SPARSYNC_MIN_COMPRESS_BYTES).
  SparseReducer* reducer = nullptr;
  // A compressing job's gradient group reduced dense (its merge plan chose dense, or it is
  // smaller than SPARSYNC_MIN_COMPRESS_BYTES): the node's per-tensor state, whose residuals the
  // dense path adds into its local sum and clears (FlushResidual, host_sum.h). Null otherwise.
  TensorState* residuals = nullptr;
  // The same on every node: they seed the random compressors.
  uint64_t step = 0;      // the round of the group's tensors
  uint32_t group_id = 0;  // the first tensor's slot
  // The ends of the path's sub-steps, for the timeline (step_marks.h).
  StepMarks marks;
};

class ReducePath {
 public:
  // What a path keeps for one slot between its stages; see the file comment.
  class Scratch {
   public:
    virtual ~Scratch() = default;
  };

  // `name` for logs: "host dense", "device top-k", ...
  explicit ReducePath(const char* name) : name_(name) {}
  virtual ~ReducePath() = default;
  const char* name() const { return name_; }

  // Whether this path executes `group` with its data where it is now. Cheap; no side effects.
  virtual bool Takes(const Group& group) const = 0;
  // Whether a reduction like `meta` whose parts are all on GPUs should keep its node sum there,
  // for this path to take it (device/device_intake.h asks every path at local readiness).
  virtual bool KeepsOnDevice(const TensorMeta& meta) const { return false; }
  // A new slot's scratch (by default one that holds nothing).
  virtual std::unique_ptr<Scratch> NewScratch() const { return std::make_unique<Scratch>(); }
  // Stage A. `*declined` (with OK): the path cannot take the group after all (it could not get
  // its resources); nothing of the group has changed, and the executor offers it to the next
  // path. A non-OK status is this node's failure of the group.
  virtual Status Prepare(Group& group, Scratch& scratch, bool* declined) = 0;
  // Stage B, after Prepare on the same slot. `*tag` is the transport tag counter.
  virtual Status Exchange(Group& group, Scratch& scratch, uint32_t* tag) = 0;
  // Stage B, after a successful Exchange, for a member of `group` whose round is still current.
  virtual void Deliver(const GroupMember& member, Group& group, Scratch& scratch) = 0;

 private:
  const char* const name_;
};

}  // namespace sparsync::pipeline
