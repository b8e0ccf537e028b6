// Executor: runs the schedule in the order every node agreed on (docs/architecture.md, "the path
// of one gradient"): each entry's members are resolved against the tensor table, formed into a
// Group, and executed by the first of the node's reduce paths (reduce_path.h) that takes it.
//
// Two stages on two threads, so that preparing one merge group overlaps the transfer of the
// previous one (docs/algorithms.md §3: backward and selection share the GPU while the network
// works):
//   stage A (the preparing thread) takes schedule entries, forms their groups, chooses the path
//     and runs its Prepare: no transport call.
//   stage B (the exchanging thread) runs each group's Exchange, in schedule order, then ends the
//     members' rounds in the table and runs Deliver for those still current.
// Entries go from A to B through a bounded hand-off. Each entry in flight owns a slot (its group
// and every path's scratch for it), so A never overwrites what B is sending; there are
// `depth + 1` slots, which bounds both how far A runs ahead and the memory.
//
// Failures: the node's one sticky failure is its JobFailure. A fatal schedule entry (the
// coordinator's news) fails it and aborts the transport at once, since stage B may be blocked in
// a collective that will never finish. An error of an entry, in either stage, fails it too (the
// worker handler then answers every pending tensor, the agent tells the coordinator); a stage-A
// error is handed to B in its place in the schedule, so the entries before it complete first.
// After a failure nothing more is exchanged. Stop() finishes the entry B is on and drops the rest
// (the daemon has failed them first).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "daemon/common/job_failure.h"
#include "daemon/observe/observer.h"
#include "daemon/pipeline/reduce_path.h"
#include "daemon/pipeline/sparse_reducer.h"
#include "daemon/pipeline/tensor_table.h"
#include "daemon/transport/transport.h"

namespace sparsync::pipeline {

// What one gradient group cost this node, for the planner's live cost model (planning/
// cost_tracker.h). Both times leave out idle waiting, so they are what the planner's timeline
// calls t_s and t_c:
//   sparsify_s  stage A's work on the group: the local sum, residual, selection and packing,
//               from when stage A takes the entry up to the end of its preparation. The waits
//               before that are not in it (for the other nodes and the coordinator, and for a
//               free slot while stage B is behind): the planner's timeline has stage A as a
//               resource the groups queue for, and a wait counted as if it occupied stage A
//               was charged once per group. On the dilated AlexNet run of issue 15 a 0.5-3.4 s
//               wait at the end of a step made the first plan's line start at 212 ms.
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
  // Every rank has joined (hvd.join()), `last_rank` last: called in schedule order, from stage B,
  // once every entry before it has been delivered.
  std::function<void(int last_rank)> on_join_done;
  // The timeline and the metrics (observe/observer.h), told about every entry on stage B: before
  // its transport calls and when it is done. Null: none. Outlives the executor.
  observe::Observer* observer = nullptr;
};

class Executor {
 public:
  using NextFn = std::function<std::vector<negotiation::ScheduleEntry>(std::chrono::milliseconds)>;

  // `sparse` (may be null: everything dense) provides the reducers of compressed gradient groups
  // of at least its min_compress_bytes(). `paths` are offered each group in order (a reduction
  // that no path takes is an internal error). `transport` is aborted on a fatal entry; the
  // paths make the transport calls. Everything but `paths` outlives the executor.
  Executor(World world, TensorTable* table, transport::Transport* transport, NextFn next,
           JobFailure* failure, SparseReducers* sparse,
           std::vector<std::unique_ptr<ReducePath>> paths, ExecutorOptions options = {});
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
  Status FormGroup(const negotiation::ScheduleEntry& entry, Slot* slot);
  Status ChoosePath(Slot* slot);
  // Stage B.
  void ExchangeLoop();
  void Complete(Slot* slot);
  // Tells the observer about the slot's entry: before its exchange, or once it is done.
  void Notify(const Slot& slot, bool done);
  // Failures.
  void OnFatal(const Status& fatal);
  void OnError(const Status& error);
  // The hand-off.
  Slot* AcquireSlot();           // a free slot, or null once stopping
  void HandOff(Slot* slot);      // to stage B, in schedule order
  Slot* TakePrepared();          // the next entry for stage B, or null once stopping
  void ReleaseSlot(Slot* slot);  // back to stage A

  const World world_;
  TensorTable* const table_;
  transport::Transport* const transport_;
  const NextFn next_;
  JobFailure* const failure_;
  SparseReducers* const sparse_;
  const std::vector<std::unique_ptr<ReducePath>> paths_;
  const ExecutorOptions options_;
  uint32_t tag_ = 0;             // stage B only
  bool prepare_failed_ = false;  // stage A only: an error entry was handed off
  std::vector<observe::TensorView> observed_;  // stage B only: Notify's members
  std::vector<observe::StepView> observed_steps_;  // stage B only: Notify's sub-steps

  std::vector<std::unique_ptr<Slot>> slots_;  // depth + 1, plus one for Execute()
  std::mutex mu_;
  std::condition_variable changed_;  // a slot was freed or handed off, or stopping
  std::vector<Slot*> free_;          // guarded by mu_
  std::deque<Slot*> ready_;          // guarded by mu_; prepared, in schedule order
  std::atomic<bool> stopping_{false};
  std::thread prepare_thread_;
  std::thread exchange_thread_;
};

}  // namespace sparsync::pipeline
