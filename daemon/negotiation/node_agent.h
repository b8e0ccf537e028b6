// NodeAgent: a node's side of the negotiation. Sends the node's ready tensors to the coordinator
// (batched: while one report is in flight the next ones queue up), owns the map between the
// coordinator's slots and this node's tensor names (later rounds send integers, not metadata),
// and hands the schedule to the executor in order, each group tensor named. A lost coordinator
// fails the job, never hangs it.
//
// Slots: the coordinator assigns a tensor's slot in its answer to the report that first names the
// tensor, and may schedule that slot before the answer is back here. An entry naming a slot this
// agent does not know yet therefore waits for the reports in flight, whose answers bring it (each
// report has a deadline); a slot still unknown after them is a fatal entry.
//
// Failures: the agent observes the node's JobFailure (OnFailure): a failure found on this node is
// reported to the coordinator, which fails every node. When the coordinator cannot be reached
// (a report or the failure report fails, polls fail for `give_up_after`) the agent fails the job
// itself and hands the executor a fatal schedule entry, so that a collective blocked on a peer
// ends at once.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "daemon/common/job_failure.h"
#include "daemon/negotiation/coordinator_link.h"
#include "daemon/observe/observer.h"

namespace sparsync::negotiation {

class NodeAgent {
 public:
  static constexpr std::chrono::milliseconds kDefaultHoldLimit{100};

  // `direct`: the link is in-process (node 0): report and poll without helper threads.
  // `give_up_after`: how long the coordinator may be unreachable before the job fails here.
  // `observer` (may be null; outlives the agent) hears of each plan as it reaches the executor.
  // `hold_limit`: how long a plan group's reports may be held (above).
  NodeAgent(CoordinatorLink* link, int node_rank, bool direct, JobFailure* failure,
            std::chrono::milliseconds give_up_after, observe::Observer* observer = nullptr,
            std::chrono::milliseconds hold_limit = kDefaultHoldLimit);
  ~NodeAgent();

  void Start();
  // Stops the loops without waiting for them: a poll or report that fails from now on is the
  // stop's doing, not news. Stop() joins them.
  void BeginStop();
  void Stop();

  // A tensor is ready on this node. Never blocks on the network.
  void Report(ReadyTensor tensor);
  // News of global rank `rank` of this node (it called hvd.join(), its worker left or came
  // back); reported after the tensors before it.
  void ReportRank(RankEvent event, int rank) {
    ReadyTensor notice;
    notice.event_rank = rank;
    notice.event = event;
    Report(std::move(notice));
  }
  // The next schedule entries, in order, with every group tensor's name filled in; waits up to
  // `wait` (may return none). Called by the executor's stage A only.
  std::vector<ScheduleEntry> Next(std::chrono::milliseconds wait);
  // The JobFailure observer: a failure of this node's (kLocal), or its shutdown, goes to the
  // coordinator.
  void OnFailure(const Status& error, JobFailure::Source source);
  void Leave();

 private:
  // A plan group's reports held on this node (see "Reports that follow the plan").
  struct HeldGroup {
    std::vector<bool> seen;  // members ready in this round, by position in the group
    size_t seen_count = 0;
    bool expired = false;    // held for hold_limit_ this round: the rest go one by one
    std::vector<ReadyTensor> held;
    Clock::time_point since;
  };

  // Takes `tensor` into its plan group, or answers false (report it now). A group that is
  // complete moves its held reports to `batch`; `*wake`: the first group held (the reporter
  // arms its deadline). mu_ held.
  bool Hold(ReadyTensor* tensor, std::vector<ReadyTensor>* batch, bool* wake);
  // Moves the held reports of every group (`all`), or of those held since before `cutoff`, to
  // `batch`, group by group. mu_ held.
  void TakeHeld(bool all, Clock::time_point cutoff, std::vector<ReadyTensor>* batch);
  void ReleaseGroup(HeldGroup* group, std::vector<ReadyTensor>* batch);
  // Releases what `group` holds and starts its next round (nothing seen). mu_ held.
  void EndRound(HeldGroup* group, std::vector<ReadyTensor>* batch);
  // Replaces the plan reports are held by; what the previous one held is sent.
  void HoldBy(const PlanInfo& plan);
  void SendReports(std::vector<ReadyTensor> batch);  // takes send_mu_
  void SendReportsLocked(std::vector<ReadyTensor> batch);
  std::vector<ScheduleEntry> Receive(std::chrono::milliseconds wait);
  // Takes plan announcements out of `entries` and checks that groups match their plan.
  std::vector<ScheduleEntry> FollowPlans(std::vector<ScheduleEntry> entries);
  // Fills in the names of every group tensor (see "Slots" above).
  void NameTensors(std::vector<ScheduleEntry>* entries);
  void PollLoop();
  // The coordinator cannot be told: fails the job here and queues a fatal entry.
  void FailUnreported(const Status& error);
  void PushFatal(const Status& error);

  CoordinatorLink* const link_;
  const int node_rank_;
  const bool direct_;
  JobFailure* const failure_;
  const std::chrono::milliseconds give_up_after_;
  observe::Observer* const observer_;
  const std::chrono::milliseconds hold_limit_;

  std::mutex mu_;
  // One condition variable per kind of waiter, so that a change wakes only the thread it is for
  // (one shared variable woke stage A for every report sent and the reporter for every entry
  // received). BeginStop notifies all three.
  std::condition_variable outbox_cv_;  // the reporter: outbox_ or stopping_
  std::condition_variable inbox_cv_;   // stage A in Receive, the poller's back-off: inbox_ or stopping_
  std::condition_variable slots_cv_;   // stage A in NameTensors: the slot maps, reports_in_flight_
  std::deque<ReadyTensor> outbox_;
  std::deque<ScheduleEntry> inbox_;
  uint64_t received_seq_ = 0;  // highest seq handed to inbox_ (remote) or to Next (direct)
  bool stopping_ = false;
  // The slot maps and the reports whose answers may still add to them; guarded by mu_.
  std::unordered_map<std::string, uint32_t> slot_by_signature_;
  std::unordered_map<uint32_t, std::string> name_by_slot_;
  int reports_in_flight_ = 0;  // tensors sent or queued whose report has not been answered
  // Reports held by plan group; guarded by mu_.
  std::unordered_map<uint32_t, std::pair<uint32_t, uint32_t>> hold_position_;  // slot: group, pos
  std::vector<HeldGroup> held_;
  int groups_held_ = 0;  // groups with held reports
  // Serialises reports, so that they reach the coordinator in the order they were taken: direct
  // mode sends on the caller's thread. Taken before mu_.
  std::mutex send_mu_;
  std::optional<PlanInfo> plan_;  // the latest plan; only the executor's thread calls Next
  std::thread reporter_;
  std::thread poller_;
};

}  // namespace sparsync::negotiation
