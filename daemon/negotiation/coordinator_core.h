// CoordinatorCore: CoordinatorState made thread-safe and blocking — joins, the rendezvous
// key-value store, long polls — plus the timer thread that flushes batches and checks stalls.
// Used by node 0 in-process (it is a CoordinatorLink) and by the gRPC service for other nodes.
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "daemon/negotiation/coordinator_link.h"
#include "daemon/observe/observer.h"

namespace sparsync::negotiation {

inline constexpr uint32_t kProtocolVersion = 1;

class CoordinatorCore : public CoordinatorLink {
 public:
  CoordinatorCore(CoordinatorOptions options, int local_size, std::string job_token);
  ~CoordinatorCore() override;

  void Start();  // starts the timer thread
  void Stop();   // wakes every waiter; idempotent

  // Constant-time comparison with the job's token.
  bool TokenMatches(const std::string& token) const;

  Status Join(const JoinInfo& info, std::chrono::milliseconds timeout) override;
  Status StoreSet(const std::string& key, const std::string& value) override;
  Result<std::vector<std::string>> StoreGet(const std::vector<std::string>& keys,
                                            std::chrono::milliseconds timeout) override;
  using CoordinatorLink::Report;
  Result<std::vector<uint32_t>> Report(int node, const std::vector<TensorMeta>& new_tensors,
                                       const std::vector<ReportedReady>& ready,
                                       const RankNews& ranks) override;
  Result<std::vector<ScheduleEntry>> Poll(int node, uint64_t after_seq,
                                          std::chrono::milliseconds wait) override;
  Status Fail(int node, const Status& error) override;
  Status Leave(int node) override;
  void Cancel() override { Stop(); }

  // The planner's cost model, measured at start-up; plans made before it is set use defaults.
  void SetCostModel(const planning::CostModel& cost);
  // What a gradient group cost node 0 (the daemon that hosts the coordinator): keeps the cost
  // model current while the job trains (MergeScheduler::RecordGroupCost).
  void RecordGroupCost(uint64_t elements, bool sparse, double sparsify_s, double exchange_s);

  // One pass of the timer: flush due batches, log stalls. Public for tests.
  void RunOnce();

  // Who hears of the planner's notes and of stalls besides the log (the timeline, the metrics);
  // outlives the core. REQUIRES: before Start.
  void SetObserver(observe::Observer* observer) { observer_ = observer; }

 private:
  // Logs the planner's notes (each plan once, on node 0) and tells the observer.
  void Note(const std::vector<std::string>& notes);
  // Who a change to the state is news for: the polls if the schedule grew past `seq_before`, the
  // timer if it now has something to do sooner than it waits for. Decided under mu_ (REQUIRES),
  // told after it is released (Wake), so that a woken thread does not block at once on the mutex
  // its waker still holds: on a busy core that costs two more context switches per report.
  struct Waiters {
    bool polls = false;
    bool timer = false;
  };
  Waiters WaitersFor(uint64_t seq_before) const;
  void Wake(Waiters waiters);

  const CoordinatorOptions options_;
  const int local_size_;
  const std::string job_token_;

  // Wakes only the waiters a change is for: every node's poll waits for the schedule to grow, and
  // a report that did not complete a tensor wakes none of them (each report used to wake every
  // poll and the timer, P + 1 threads per tensor per node).
  mutable std::mutex mu_;
  std::condition_variable changed_;        // a node joined, a key was set, or stopping
  std::condition_variable schedule_grew_;  // the polls: the schedule grew, or stopping
  std::condition_variable timer_cv_;       // the timer: its deadline moved earlier, or stopping
  std::optional<Clock::time_point> timer_deadline_;  // what the timer waits for; none: 1 s
  CoordinatorState state_;
  std::vector<bool> joined_;
  int joined_count_ = 0;
  Status join_error_;
  std::map<std::string, std::string> store_;
  bool stopping_ = false;
  std::thread timer_;
  observe::Observer* observer_ = nullptr;
};

}  // namespace sparsync::negotiation
