// WorkerHandler: the daemon's side of the intake protocol (proto/intake/wire.h), behind the
// control socket (server.h). It authenticates workers (HELLO: job token, local rank), registers
// their tensors (REGISTER: a memfd region each, and for CUDA tensors the device buffer), turns
// READY into rounds of the tensor table and reports the locally ready ones to the coordinator
// (after the node's sum of CUDA tensors is formed, device/device_intake.h), and turns a worker
// that leaves mid-collective into a job failure.
//
// It observes the node's JobFailure (OnFailure): every collective a worker waits for is answered
// with the error, and every later HELLO, REGISTER and READY is refused with it. The results of
// collectives go back through pipeline/delivery.h.
//
// Thread-safety: the IntakeHandler calls come from the intake thread only; OnFailure and the
// staging callbacks may come from any thread and touch only the table (thread-safe).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "daemon/common/job_failure.h"
#include "daemon/device/device_intake.h"
#include "daemon/intake/server.h"
#include "daemon/pipeline/tensor_table.h"

namespace sparsync::intake {

class WorkerHandler : public IntakeHandler {
 public:
  using ReportFn = std::function<void(negotiation::ReadyTensor)>;

  // Everything outlives the handler. `device` may be null: CUDA tensors are refused. Every
  // registered region counts against `budget` (null: a budget of the machine's memory).
  WorkerHandler(pipeline::World world, std::string job_token, JobFailure* failure,
                pipeline::TensorTable* table, device::DeviceIntake* device, ReportFn report,
                std::shared_ptr<RegionBudget> budget = nullptr);

  // IntakeHandler
  void OnHello(const std::shared_ptr<WorkerSession>& session, const sparsync_hello& hello,
               sparsync_hello_reply* reply) override;
  void OnRegister(const std::shared_ptr<WorkerSession>& session, const sparsync_register_msg& msg,
                  sparsync_register_reply* reply, std::shared_ptr<SharedRegion>* region) override;
  Status OnReady(const std::shared_ptr<WorkerSession>& session, const sparsync_ready& msg) override;
  Status OnUnregister(const std::shared_ptr<WorkerSession>& session,
                      const sparsync_unregister_msg& msg) override;
  void OnDisconnect(const std::shared_ptr<WorkerSession>& session, const Status& reason) override;
  void OnTimeline(const std::shared_ptr<WorkerSession>& session, const sparsync_timeline_msg& msg,
                  sparsync_timeline_reply* reply) override;
  // The worker takes part in nothing until every worker has joined: the rounds that waited for
  // it go without it, the coordinator hears of it (`joined`), and JOIN_REPLY waits for
  // OnJoinDone.
  Status OnJoin(const std::shared_ptr<WorkerSession>& session) override;
  // Every worker has joined, `last_rank` last (the schedule's join entry; stage B's thread):
  // the joined workers get their JOIN_REPLY and take part again.
  void OnJoinDone(int last_rank);
  // Where news of this node's ranks goes: the node's agent (NodeAgent::ReportRank). A rank
  // joins (OnJoin), is gone when its worker leaves with nothing in flight (OnDisconnect), and is
  // back when a worker of that rank says HELLO after that. REQUIRES: before the intake server
  // starts.
  using RankFn = std::function<void(negotiation::RankEvent event, int rank)>;
  void SetRankReport(RankFn report) { rank_news_ = std::move(report); }

  // The JobFailure observer: answers every pending collective with `error`.
  void OnFailure(const Status& error, JobFailure::Source source);

  // What a worker's TIMELINE does: start recording into a path, or stop (""), on the intake
  // thread. Without one, TIMELINE is refused. REQUIRES: before the intake server starts.
  using TimelineFn = std::function<Status(const std::string& path)>;
  void SetTimelineControl(TimelineFn control) { timeline_ = std::move(control); }
  // Workers that said HELLO and have not left (any thread).
  int connected_workers() const { return connected_.load(std::memory_order_relaxed); }
  // Whether a failure `error` is how a job ends rather than a failure: another node's daemon
  // stopping (IsShutdownReason) while no worker of this node is connected, as when the launcher
  // stops the daemons once the workers are gone.
  bool IsJobEnd(const Status& error) const {
    return IsShutdownReason(error) && connected_workers() == 0;
  }

 private:
  // The node's sum of a round with CUDA parts is formed; report it unless it failed meanwhile.
  void OnNodeSum(const std::string& name, uint64_t generation, negotiation::ReadyTensor report,
                 const Status& st, device::NodeSumOnDevice where);
  // Reports a locally ready round, forming its node sum on the GPUs first where it has CUDA
  // parts.
  void ReportRound(pipeline::ReadyRound ready);
  // Sends JOIN_REPLY to every joined worker and forgets them.
  void AnswerJoined(const Status& status, int last_rank);

  const pipeline::World world_;
  const std::string job_token_;
  JobFailure* const failure_;
  pipeline::TensorTable* const table_;
  device::DeviceIntake* const device_;
  const ReportFn report_;
  const std::shared_ptr<RegionBudget> budget_;
  std::vector<std::weak_ptr<WorkerSession>> workers_;  // by local rank; intake thread only
  std::vector<bool> gone_;  // by local rank: reported gone and not back since; intake thread only
  std::atomic<int> connected_{0};
  TimelineFn timeline_;
  RankFn rank_news_;
  std::mutex join_mu_;
  std::vector<std::shared_ptr<WorkerSession>> joining_;  // awaiting JOIN_REPLY; join_mu_
};

}  // namespace sparsync::intake
