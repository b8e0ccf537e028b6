#include "daemon/intake/worker_handler.h"

#include <spdlog/spdlog.h>

#include "daemon/common/job_token.h"
#include "daemon/intake/codec.h"
#include "daemon/intake/done.h"

namespace sparsync::intake {

WorkerHandler::WorkerHandler(pipeline::World world, std::string job_token, JobFailure* failure,
                             pipeline::TensorTable* table, device::DeviceIntake* device,
                             ReportFn report, std::shared_ptr<RegionBudget> budget)
    : world_(world),
      job_token_(std::move(job_token)),
      failure_(failure),
      table_(table),
      device_(device),
      report_(std::move(report)),
      budget_(budget ? std::move(budget) : std::make_shared<RegionBudget>(0)),
      workers_(world.local_size),
      gone_(world.local_size, false) {}

void WorkerHandler::OnHello(const std::shared_ptr<WorkerSession>& session,
                            const sparsync_hello& hello, sparsync_hello_reply* reply) {
  auto refuse = [&](int32_t code, const std::string& why) {
    reply->status = code;
    CopyMessage(reply->message, why);
  };
  if (Status failed = failure_->status(); !failed.ok()) {
    // The daemons stay failed: a new run needs new daemons (sparsyncrun starts them per job).
    return refuse(WireStatus(failed), "the job has failed: " + failed.message() +
                                          " (restart the daemons to run again)");
  }
  // Compared in constant time: how much of the token matched must not show in the timing.
  if (!TokensEqual(std::string_view(hello.job_token, hello.token_len), job_token_)) {
    return refuse(SPARSYNC_ERR_PERMISSION,
                  "wrong SPARSYNC_JOB_TOKEN: the worker's token differs from the daemon's");
  }
  if (hello.local_rank >= static_cast<uint32_t>(world_.local_size)) {
    return refuse(SPARSYNC_ERR_INVALID, "SPARSYNC_LOCAL_RANK=" + std::to_string(hello.local_rank) +
                                            " but this daemon serves " +
                                            std::to_string(world_.local_size) +
                                            " worker(s) (SPARSYNC_LOCAL_SIZE)");
  }
  if (auto other = workers_[hello.local_rank].lock()) {
    return refuse(SPARSYNC_ERR_INVALID, "local rank " + std::to_string(hello.local_rank) +
                                            " is already connected (pid " +
                                            std::to_string(other->pid) + ")");
  }
  session->greeted = true;
  session->local_rank = hello.local_rank;
  session->pid = hello.pid;
  workers_[hello.local_rank] = session;
  connected_.fetch_add(1, std::memory_order_relaxed);
  reply->status = SPARSYNC_OK;
  reply->node_rank = world_.node_rank;
  reply->num_nodes = world_.num_nodes;
  reply->local_rank = hello.local_rank;
  reply->local_size = world_.local_size;
  reply->rank = world_.GlobalRank(static_cast<int>(hello.local_rank));
  reply->size = world_.size();
  spdlog::debug("{} connected (global rank {})", session->Describe(world_.node_rank), reply->rank);
  if (gone_[hello.local_rank]) {  // hvd.init() after hvd.shutdown()
    gone_[hello.local_rank] = false;
    if (rank_news_) rank_news_(negotiation::RankEvent::kBack, reply->rank);
  }
}

void WorkerHandler::OnRegister(const std::shared_ptr<WorkerSession>& session,
                               const sparsync_register_msg& msg, sparsync_register_reply* reply,
                               std::shared_ptr<SharedRegion>* region) {
  auto refuse = [&](const Status& st) {
    reply->status = WireStatus(st);
    CopyMessage(reply->message, st.message());
  };
  auto meta = MetaOf(msg);
  if (!meta.ok()) return refuse(meta.status());
  if (meta->op == CollectiveOp::kBroadcast && meta->root_rank >= world_.size()) {
    return refuse(InvalidArgument("broadcast of '" + meta->name + "' from root rank " +
                                  std::to_string(meta->root_rank) + " but the job has " +
                                  std::to_string(world_.size()) + " workers"));
  }
  if (!meta->members.empty()) {
    const int rank = world_.GlobalRank(static_cast<int>(session->local_rank));
    if (meta->members.back() >= world_.size()) {
      return refuse(InvalidArgument("tensor '" + meta->name + "' names rank " +
                                    std::to_string(meta->members.back()) +
                                    " in its process set but the job has " +
                                    std::to_string(world_.size()) + " workers"));
    }
    if (!meta->HasMember(rank)) {
      return refuse(InvalidArgument("rank " + std::to_string(rank) + " registered '" +
                                    meta->name + "' but is not in its process set " +
                                    RanksText(meta->members)));
    }
    if (meta->op == CollectiveOp::kBroadcast && !meta->HasMember(meta->root_rank)) {
      return refuse(InvalidArgument("broadcast of '" + meta->name + "' from root rank " +
                                    std::to_string(meta->root_rank) +
                                    ", which is not in its process set"));
    }
  }
  auto created = SharedRegion::Create(meta->name, meta->Bytes(), budget_);
  if (!created.ok()) return refuse(created.status());
  // A CUDA tensor's buffer and events are opened first; if the registration is refused they
  // are closed again when `cuda` goes.
  std::shared_ptr<device::CudaTensor> cuda;
  if (msg.memory == SPARSYNC_MEMORY_CUDA) {
    if (device_ == nullptr) {
      return refuse(Unavailable("tensor '" + meta->name + "' is on a CUDA device but this "
                                "daemon takes host tensors only"));
    }
    auto attached = device_->Attach(msg, *created, meta->Bytes(), reply->cuda_done_event);
    if (!attached.ok()) return refuse(attached.status());
    cuda = *attached;
  }
  if (Status failed = failure_->status(); !failed.ok()) return refuse(failed);
  Status st = table_->Register(session, msg.tensor_id, *meta, *created, cuda);
  if (!st.ok()) {
    refuse(st);
    // Workers of one node disagree: the job cannot go on, so every worker of every node hears
    // it now rather than at the timeout.
    if (st.code() == StatusCode::kMismatch) failure_->Fail(st, JobFailure::Source::kLocal);
    return;
  }
  *region = *created;
  reply->status = SPARSYNC_OK;
  reply->region_bytes = meta->Bytes();
}

Status WorkerHandler::OnReady(const std::shared_ptr<WorkerSession>& session,
                              const sparsync_ready& msg) {
  SPARSYNC_ASSIGN_OR_RETURN(pipeline::TensorTable::Posted posted,
                            table_->Post(session, msg.tensor_id, msg.round));
  if (posted.refused) {
    const pipeline::WorkerPart& part = *posted.refused;
    (void)SendDone(*part.session, part.tensor_id, part.round, failure_->status());
  }
  if (posted.ready) ReportRound(std::move(*posted.ready));
  return Status::Ok();
}

void WorkerHandler::ReportRound(pipeline::ReadyRound ready) {
  if (ready.cuda_parts.empty()) {
    report_(std::move(ready.report));
    return;
  }
  std::vector<std::shared_ptr<device::CudaTensor>> cuda;
  for (const pipeline::WorkerPart& part : ready.cuda_parts) cuda.push_back(part.cuda);
  const TensorMeta meta = ready.report.meta;
  device_->FormNodeSum(
      meta, std::move(cuda),
      [this, name = meta.name, generation = ready.generation,
       report = std::move(ready.report)](const Status& st, device::NodeSumOnDevice where) mutable {
        OnNodeSum(name, generation, std::move(report), st, std::move(where));
      });
}

Status WorkerHandler::OnJoin(const std::shared_ptr<WorkerSession>& session) {
  {
    std::lock_guard lock(join_mu_);
    for (const auto& s : joining_) {
      if (s == session) return InvalidArgument("JOIN before the previous one was answered");
    }
    joining_.push_back(session);
  }
  if (Status failed = failure_->status(); !failed.ok()) {
    AnswerJoined(failed, -1);
    return Status::Ok();
  }
  const int rank = world_.GlobalRank(static_cast<int>(session->local_rank));
  spdlog::debug("{} joined (rank {})", session->Describe(world_.node_rank), rank);
  for (pipeline::ReadyRound& ready : table_->Join(static_cast<int>(session->local_rank))) {
    ReportRound(std::move(ready));
  }
  if (rank_news_) rank_news_(negotiation::RankEvent::kJoined, rank);
  return Status::Ok();
}

void WorkerHandler::OnJoinDone(int last_rank) {
  table_->EndJoin();
  spdlog::debug("every worker joined, rank {} last", last_rank);
  AnswerJoined(Status::Ok(), last_rank);
}

void WorkerHandler::AnswerJoined(const Status& status, int last_rank) {
  std::vector<std::shared_ptr<WorkerSession>> answer;
  {
    std::lock_guard lock(join_mu_);
    answer.swap(joining_);
  }
  for (const auto& session : answer) {
    sparsync_join_reply reply{};
    FillHeader(&reply.header, SPARSYNC_MSG_JOIN_REPLY, sizeof(reply));
    reply.status = WireStatus(status);
    reply.last_rank = last_rank;
    CopyMessage(reply.message, status.message());
    (void)session->Send(&reply, sizeof(reply));
  }
}

void WorkerHandler::OnNodeSum(const std::string& name, uint64_t generation,
                              negotiation::ReadyTensor report, const Status& st,
                              device::NodeSumOnDevice where) {
  const pipeline::NodeSum sum = where.on_device ? pipeline::NodeSum::kDeviceZero
                                : where.clique  ? pipeline::NodeSum::kRegionZero
                                                : pipeline::NodeSum::kRegions;
  if (!table_->SetNodeSum(name, generation, sum, std::move(where.clique))) {
    return;  // failed meanwhile: every worker has its DONE already
  }
  if (!st.ok()) {
    // This node cannot contribute the tensor: every node hears why now, not at the timeout.
    failure_->Fail(Aborted("node " + std::to_string(world_.node_rank) + ": " + st.message()),
                   JobFailure::Source::kLocal);
    return;
  }
  report_(std::move(report));
}

Status WorkerHandler::OnUnregister(const std::shared_ptr<WorkerSession>& session,
                                   const sparsync_unregister_msg& msg) {
  return table_->Unregister(session, msg.tensor_id);
}

void WorkerHandler::OnDisconnect(const std::shared_ptr<WorkerSession>& session,
                                 const Status& reason) {
  const pipeline::TensorTable::Departure left = table_->Leave(session);
  const bool greeted = workers_[session->local_rank].lock() == session;
  if (greeted) workers_[session->local_rank].reset();
  connected_.fetch_sub(1, std::memory_order_relaxed);
  // A worker that leaves with nothing in flight ends its part in the job: a collective that
  // other ranks post later cannot complete, and the coordinator says so at once.
  auto gone = [&] {
    if (!greeted) return;
    gone_[session->local_rank] = true;
    const int rank = world_.GlobalRank(static_cast<int>(session->local_rank));
    if (rank_news_) rank_news_(negotiation::RankEvent::kGone, rank);
  };
  if (reason.ok() && !left.had_posted) {
    spdlog::debug("{} said goodbye", session->Describe(world_.node_rank));
    return gone();
  }
  if (!reason.ok() && !left.had_tensors && !left.had_posted) return gone();  // never took part
  const std::string who = session->Describe(world_.node_rank);
  Status error = reason.ok() ? Aborted(who + " left with collectives in flight")
                 : reason.message().find(who) != std::string::npos
                     ? Aborted(reason.message())
                     : Aborted(who + ": " + reason.message());
  failure_->Fail(error, JobFailure::Source::kLocal);
}

void WorkerHandler::OnTimeline(const std::shared_ptr<WorkerSession>& session,
                               const sparsync_timeline_msg& msg, sparsync_timeline_reply* reply) {
  Status st = timeline_ ? timeline_(TimelinePath(msg))
                        : Unavailable("this daemon records no timeline");
  if (!st.ok()) {
    spdlog::warn("timeline requested by {}: {}", session->Describe(world_.node_rank), st.message());
  }
  reply->status = WireStatus(st);
  CopyMessage(reply->message, st.message());
}

void WorkerHandler::OnFailure(const Status& error, JobFailure::Source source) {
  const std::vector<pipeline::WorkerPart> waiting = table_->FailPending();
  if (!waiting.empty()) {
    spdlog::error("failing {} pending collective(s): {}", waiting.size(), error.message());
  } else if (source == JobFailure::Source::kShutdown) {
    // This daemon's own stop: logged where it begins.
  } else if (IsJobEnd(error)) {
    spdlog::info("{}: the job is over here (no worker of this node is connected)",
                 error.message());
  } else {
    spdlog::warn("job failed: {}", error.message());
  }
  for (const pipeline::WorkerPart& part : waiting) {
    (void)SendDone(*part.session, part.tensor_id, part.round, error);
  }
  AnswerJoined(error, -1);
}

}  // namespace sparsync::intake
