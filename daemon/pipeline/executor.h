// Executor: runs the schedule in the order every node agreed on (DESIGN.md §1.3-1.8): local reduce
// of the workers' buffers, the collective across nodes, the write-back into every local worker's
// buffer, and DONE.
//
// Two stages on two threads, so that sparsifying one merge group overlaps the transfer of the
// previous one (ALGORITHMS.md §1, issue 4 item 4):
//   stage A (the preparing thread) takes schedule entries, resolves their members, sums the local
//     workers' buffers into the entry's staging buffer and, for a sparse group, adds the residual,
//     checks for non-finite values, selects and packs (SparseReducer::Prepare). No transport call.
//   stage B (the exchanging thread) makes every transport call, in schedule order: the dense
//     allreduce or SparseReducer::Exchange (gTop-k's rounds and random-k's value allreduce
//     included), allgather and broadcast; then writes back and sends DONE.
// Entries go from A to B through a bounded hand-off. Each entry in flight owns a staging slot
// (members, local sum, prepared sparse group), so A never overwrites what B is sending; there are
// `depth + 1` slots, which bounds both how far A runs ahead and the memory.
//
// Failures (as with one thread): a fatal schedule entry aborts the transport and fails every
// tensor at once. An error of an entry, in either stage, fails every pending tensor (sticky, via
// TensorTable::FailAll) and is reported with `fail`; a stage-A error is handed to B in its place
// in the schedule, so the entries before it complete first. After a failure nothing more is
// exchanged. Stop() finishes the entry B is on and drops the rest (the daemon fails them with
// TensorTable::Shutdown first).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "daemon/pipeline/device_sparse.h"
#include "daemon/pipeline/sparse_reducer.h"
#include "daemon/pipeline/tensor_table.h"
#include "daemon/transport/transport.h"

namespace sparsync::pipeline {

// What one gradient group cost this node, for the planner's live cost model (planning/
// cost_tracker.h). Both times leave out idle waiting, so they are what the planner's timeline
// calls t_s and t_c:
//   sparsify_s  stage A's work on the group, counted from when its last tensor was ready here or
//               stage A became free, whichever was later, so the wait for the other nodes and
//               the coordinator is part of it; then the local sum, residual, selection, packing.
//   exchange_s  stage B's work: every transport call, the write-back and the DONE messages.
struct GroupCost {
  uint32_t plan_version = 0;  // 0: not under a merge plan
  uint64_t elements = 0;
  bool sparse = false;
  double sparsify_s = 0;
  double exchange_s = 0;
};

struct ExecutorOptions {
  // Prepared entries that may wait for stage B (>= 1). Each costs a staging buffer of its group.
  int depth = 1;
  // Test hooks, called on the stage's thread: A has prepared entry `seq` (before handing it
  // over); B is about to make the transport calls of entry `seq`.
  std::function<void(uint64_t seq)> on_prepared;
  std::function<void(uint64_t seq)> on_exchange;
  // Called on stage B's thread after the DONE messages of every reduced gradient group.
  std::function<void(const GroupCost&)> on_group_cost;
  // Groups whose node sum was left on the GPU (device_sparse.h): top-k there, and the dense ones
  // reduced in device memory when the transport takes it; null: none.
  std::shared_ptr<DeviceSparse> device_sparse;
};

class Executor {
 public:
  using NextFn = std::function<std::vector<negotiation::ScheduleEntry>(std::chrono::milliseconds)>;
  using FailFn = std::function<void(const Status&)>;

  // `sparse` (may be null: everything dense) reduces gradient groups of at least its
  // min_compress_bytes() whose tensors ask for a compressor. `transport` is used by stage B only
  // (and Abort() by A, for fatal entries).
  Executor(World world, TensorTable* table, transport::Transport* transport, NextFn next,
           FailFn fail, std::chrono::milliseconds resolve_wait,
           std::unique_ptr<SparseReducers> sparse = nullptr, ExecutorOptions options = {});
  ~Executor();

  // Starts both stages' threads. Stop() joins them; the destructor calls it.
  void Start();
  void Stop();

  // One step without the threads, for tests (not with Start()): takes the next entries (waiting
  // up to `wait`) and executes each through both stages on the calling thread.
  void RunOnce(std::chrono::milliseconds wait);
  void Execute(const negotiation::ScheduleEntry& entry);

 private:
  struct Slot;  // one entry in flight, defined in executor.cc

  // Stage A.
  void PrepareLoop();
  void Prepare(const negotiation::ScheduleEntry& entry, Slot* slot);
  Status PrepareReduce(Slot* slot);
  // Stage B.
  void ExchangeLoop();
  void Complete(Slot* slot);
  Status ExchangeReduce(Slot* slot);
  Status Gather(GroupMember& member, std::vector<std::shared_ptr<intake::SharedRegion>>* results);
  Status Broadcast(GroupMember& member);
  // Failures.
  void OnFatal(const Status& fatal);
  void OnError(const Status& error);
  bool failed() const;
  // The hand-off.
  Slot* AcquireSlot();           // a free slot, or null once stopping
  void HandOff(Slot* slot);      // to stage B, in schedule order
  Slot* TakePrepared();          // the next entry for stage B, or null once stopping
  void ReleaseSlot(Slot* slot);  // back to stage A

  const World world_;
  TensorTable* const table_;
  transport::Transport* const transport_;
  const NextFn next_;
  const FailFn fail_;
  const std::chrono::milliseconds resolve_wait_;
  std::unique_ptr<SparseReducers> sparse_;  // stage A picks a reducer; stage B exchanges with it
  const ExecutorOptions options_;
  uint32_t tag_ = 0;             // stage B only
  bool prepare_failed_ = false;  // stage A only: an error entry was handed off
  int64_t prepare_free_ns_ = 0;  // stage A only: when it finished its previous entry

  std::vector<std::unique_ptr<Slot>> slots_;  // depth + 1, plus one for Execute()
  mutable std::mutex mu_;
  std::condition_variable changed_;  // a slot was freed or handed off, or stopping
  std::vector<Slot*> free_;          // guarded by mu_
  std::deque<Slot*> ready_;          // guarded by mu_; prepared, in schedule order
  Status failed_;                    // guarded by mu_; first failure, after FailAll
  std::atomic<bool> stopping_{false};
  std::thread prepare_thread_;
  std::thread exchange_thread_;
};

}  // namespace sparsync::pipeline
