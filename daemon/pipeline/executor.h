// Executor: runs the schedule, one entry after another in the order every node agreed on
// (DESIGN.md §1.3-1.8): local reduce of the workers' buffers, the collective across nodes, the
// write-back into every local worker's buffer, and DONE. One thread; it owns the transport.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "daemon/pipeline/sparse_reducer.h"
#include "daemon/pipeline/tensor_table.h"
#include "daemon/transport/transport.h"

namespace sparsync::pipeline {

class Executor {
 public:
  using NextFn = std::function<std::vector<negotiation::ScheduleEntry>(std::chrono::milliseconds)>;
  using FailFn = std::function<void(const Status&)>;

  // `sparse` (may be null: everything dense) reduces gradient groups of at least its
  // min_compress_bytes() whose tensors ask for a compressor.
  Executor(World world, TensorTable* table, transport::Transport* transport, NextFn next,
           FailFn fail, std::chrono::milliseconds resolve_wait,
           std::unique_ptr<SparseReducers> sparse = nullptr);
  ~Executor();

  void Start();
  void Stop();
  // Takes the next entries (waiting up to `wait`) and executes them. Public for tests.
  void RunOnce(std::chrono::milliseconds wait);
  // Executes one entry. Public for tests.
  void Execute(const negotiation::ScheduleEntry& entry);

 private:
  Status Reduce(std::vector<GroupMember>& members);
  Status Gather(GroupMember& member, std::vector<std::shared_ptr<intake::SharedRegion>>* results);
  Status Broadcast(GroupMember& member);

  const World world_;
  TensorTable* const table_;
  transport::Transport* const transport_;
  const NextFn next_;
  const FailFn fail_;
  const std::chrono::milliseconds resolve_wait_;
  std::unique_ptr<SparseReducers> sparse_;
  uint32_t tag_ = 0;
  std::vector<char> fusion_;  // accumulator of fused groups, reused
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace sparsync::pipeline
