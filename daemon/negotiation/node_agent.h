// NodeAgent: a node's side of the negotiation. Sends the node's ready tensors to the coordinator
// (batched: while one report is in flight the next ones queue up), remembers the slots the
// coordinator assigned (so later rounds send integers, not metadata), and hands the schedule to
// the executor in order. A lost coordinator becomes a fatal schedule entry, never a hang.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "daemon/negotiation/coordinator_link.h"

namespace sparsync::negotiation {

struct ReadyTensorReport {
  TensorMeta meta;
  uint32_t slot = 0;  // known slot, or 0
  std::vector<int64_t> worker_dim0;
  int64_t ready_ns = 0;  // this node's steady clock when the tensor became ready here
};

class NodeAgent {
 public:
  using BindSlotFn = std::function<void(const std::string& name, uint32_t slot)>;

  // `direct`: the link is in-process (node 0): report and poll without helper threads.
  // `give_up_after`: how long the coordinator may be unreachable before the job fails here.
  NodeAgent(CoordinatorLink* link, int node_rank, bool direct, BindSlotFn bind_slot,
            std::chrono::milliseconds give_up_after);
  ~NodeAgent();

  void Start();
  void Stop();

  // A tensor is ready on this node. Never blocks on the network.
  void Report(ReadyTensorReport report);
  // The next schedule entries, in order; waits up to `wait` (may return none).
  std::vector<ScheduleEntry> Next(std::chrono::milliseconds wait);
  // Tells the coordinator the job failed here (and fails it locally if that is impossible).
  void Fail(const Status& error);
  void Leave();

 private:
  void SendReports(std::vector<ReadyTensorReport> batch);
  std::vector<ScheduleEntry> Receive(std::chrono::milliseconds wait);
  // Takes plan announcements out of `entries` and checks that groups match their plan.
  std::vector<ScheduleEntry> FollowPlans(std::vector<ScheduleEntry> entries);
  void PollLoop();
  void InjectFatal(const Status& error);

  CoordinatorLink* const link_;
  const int node_rank_;
  const bool direct_;
  const BindSlotFn bind_slot_;
  const std::chrono::milliseconds give_up_after_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<ReadyTensorReport> outbox_;
  std::deque<ScheduleEntry> inbox_;
  uint64_t received_seq_ = 0;  // highest seq handed to inbox_ (remote) or to Next (direct)
  bool stopping_ = false;
  bool fatal_injected_ = false;
  std::mutex send_mu_;  // serialises reports (direct mode sends on the caller's thread)
  std::unordered_map<std::string, uint32_t> slots_;  // signature -> slot; guarded by send_mu_
  std::optional<PlanInfo> plan_;  // the latest plan; only the executor's thread calls Next
  std::thread reporter_;
  std::thread poller_;
};

}  // namespace sparsync::negotiation
