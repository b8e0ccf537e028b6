#include "daemon/pipeline/tensor_table.h"

#include <spdlog/spdlog.h>

#include <cstring>
#include <utility>

#include "daemon/intake/codec.h"

namespace sparsync::pipeline {

using negotiation::TensorMeta;

namespace {

TensorMeta MetaOf(const sparsync_register_msg& r) {
  TensorMeta m;
  m.name.assign(r.name, r.name_len);
  m.op = r.op;
  m.dtype = r.dtype;
  m.reduce_op = r.reduce_op;
  m.root_rank = r.op == SPARSYNC_OP_BROADCAST ? r.root_rank : 0;
  m.shape.assign(r.shape, r.shape + r.ndim);
  m.compressor = r.compressor;
  m.density = r.density;
  return m;
}

}  // namespace

Status SendDone(const WorkerPart& part, const Status& status, int result_fd,
                uint64_t result_bytes, int64_t result_dim0, bool to_device) {
  Status result = status;
  if (status.ok() && part.cuda && to_device) result = part.cuda->CopyToDevice();
  if (!result.ok() && status.ok()) spdlog::error("{}", result.message());
  sparsync_done done{};
  intake::FillHeader(&done.header, SPARSYNC_MSG_DONE, sizeof(done));
  done.tensor_id = part.tensor_id;
  done.round = part.round;
  done.status = intake::WireStatus(result);
  done.result_bytes = result_bytes;
  done.result_dim0 = result_dim0;
  if (!result.ok()) intake::CopyMessage(done.message, result.message());
  return part.session->Send(&done, sizeof(done), result_fd);
}

void DeliverResult(const GroupMember& member) {
  Status st;
  if (member.clique) {
    std::vector<intake::CudaTensor*> cuda;
    for (const WorkerPart& part : member.parts) cuda.push_back(part.cuda.get());
    st = member.result_on_device ? member.clique->BroadcastFromDevice(cuda, member.meta.dtype)
                                 : member.clique->BroadcastFromHost(cuda, member.meta.dtype);
  } else if (member.result_on_device) {
    // One part: the result is in its buffer already.
    intake::CudaTensor& t = *member.parts[0].cuda;
    st = t.Check(t.rt().SetDevice(t.device()), "cudaSetDevice");
    if (st.ok()) st = t.EnqueueRecordDone();
  } else {
    for (const WorkerPart& part : member.parts) (void)SendDone(part, Status::Ok());
    return;
  }
  if (!st.ok()) spdlog::error("{}", st.message());
  for (const WorkerPart& part : member.parts) {
    (void)SendDone(part, st, -1, 0, 0, /*to_device=*/false);
  }
}

Status StageToHost(GroupMember& member) {
  if (!member.on_device) return Status::Ok();
  member.on_device = false;
  return member.parts[0].cuda->CopyToHost();
}

TensorTable::TensorTable(World world, std::string job_token, ReportFn report, FailFn fail,
                         CudaOptions cuda)
    : world_(world),
      job_token_(std::move(job_token)),
      report_(std::move(report)),
      fail_(std::move(fail)),
      cuda_(std::move(cuda.cudart)),
      keep_on_device_(std::move(cuda.keep_on_device)),
      workers_(world.local_size),
      local_nccl_(std::move(cuda.libnccl), cuda.local_nccl) {}

Status TensorTable::LoadExplicitLibraries() { return local_nccl_.LoadExplicit(); }

void TensorTable::OnHello(const std::shared_ptr<intake::WorkerSession>& session,
                          const sparsync_hello& hello, sparsync_hello_reply* reply) {
  auto refuse = [&](int32_t code, const std::string& why) {
    reply->status = code;
    intake::CopyMessage(reply->message, why);
  };
  std::string token(hello.job_token, hello.token_len);
  std::lock_guard lock(mu_);
  if (!fatal_.ok()) {
    // The daemons stay failed: a new run needs new daemons (sparsyncrun starts them per job).
    return refuse(intake::WireStatus(fatal_), "the job has failed: " + fatal_.message() +
                                                  " (restart the daemons to run again)");
  }
  bool token_ok = token.size() == job_token_.size();
  unsigned char diff = 0;
  for (size_t i = 0; token_ok && i < token.size(); ++i) diff |= token[i] ^ job_token_[i];
  if (!token_ok || diff) {
    return refuse(SPARSYNC_ERR_PERMISSION,
                  "wrong SPARSYNC_JOB_TOKEN: the worker's token differs from the daemon's");
  }
  if (hello.local_rank >= static_cast<uint32_t>(world_.local_size)) {
    return refuse(SPARSYNC_ERR_INVALID,
                  "SPARSYNC_LOCAL_RANK=" + std::to_string(hello.local_rank) + " but this daemon serves " +
                      std::to_string(world_.local_size) + " worker(s) (SPARSYNC_LOCAL_SIZE)");
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
  reply->status = SPARSYNC_OK;
  reply->node_rank = world_.node_rank;
  reply->num_nodes = world_.num_nodes;
  reply->local_rank = hello.local_rank;
  reply->local_size = world_.local_size;
  reply->rank = world_.node_rank * world_.local_size + hello.local_rank;
  reply->size = world_.size();
  spdlog::info("{} connected (global rank {})", session->Describe(world_.node_rank), reply->rank);
}

Status TensorTable::CheckCompatible(const Tensor& t, const TensorMeta& meta, int local_rank) const {
  if (t.meta.SignatureKey() == meta.SignatureKey()) return Status::Ok();
  int other = -1;
  for (int r = 0; r < world_.local_size; ++r) {
    if (t.parts[r]) {
      other = r;
      break;
    }
  }
  return Mismatch("tensor '" + meta.name + "' has " + meta.Describe() + " on local rank " +
                  std::to_string(local_rank) + " of node " + std::to_string(world_.node_rank) +
                  " but " + t.meta.Describe() + " on local rank " + std::to_string(other));
}

void TensorTable::OnRegister(const std::shared_ptr<intake::WorkerSession>& session,
                             const sparsync_register_msg& msg, sparsync_register_reply* reply,
                             std::shared_ptr<intake::SharedRegion>* region) {
  auto refuse = [&](const Status& st) {
    reply->status = intake::WireStatus(st);
    intake::CopyMessage(reply->message, st.message());
  };
  TensorMeta meta = MetaOf(msg);
  if (meta.op == SPARSYNC_OP_BROADCAST && meta.root_rank >= world_.size()) {
    return refuse(InvalidArgument("broadcast of '" + meta.name + "' from root rank " +
                                  std::to_string(meta.root_rank) + " but the job has " +
                                  std::to_string(world_.size()) + " workers"));
  }
  size_t bytes = static_cast<size_t>(meta.NumElements()) * intake::WireDTypeSize(meta.dtype);
  auto created = intake::SharedRegion::Create(meta.name, bytes);
  if (!created.ok()) return refuse(created.status());
  // A CUDA tensor's buffer and events are opened before the lock (and, if the registration is
  // refused, closed after it: declared before the lock, destroyed after it).
  std::shared_ptr<intake::CudaTensor> cuda;
  if (msg.memory == SPARSYNC_MEMORY_CUDA) {
    auto attached = cuda_.Attach(msg, *created, bytes, reply->cuda_done_event);
    if (!attached.ok()) return refuse(attached.status());
    cuda = *attached;
  }
  Status mismatch;
  // Runs after the lock below is released (declared first, destroyed last).
  struct FailAfterUnlock {
    TensorTable* table;
    Status* error;
    ~FailAfterUnlock() {
      if (!error->ok()) {
        table->FailAll(*error);
        table->fail_(*error);
      }
    }
  } fail_after_unlock{this, &mismatch};
  std::lock_guard lock(mu_);
  if (!fatal_.ok()) return refuse(fatal_);
  if (session->tensors.count(msg.tensor_id)) {
    return refuse(InvalidArgument("tensor id " + std::to_string(msg.tensor_id) +
                                  " is already registered by this worker"));
  }
  auto it = tensors_.find(meta.name);
  if (it != tensors_.end()) {
    Status st = CheckCompatible(it->second, meta, session->local_rank);
    if (!st.ok()) {
      // Workers of one node disagree: the job cannot go on, so every worker of every node hears
      // it now rather than at the timeout.
      refuse(st);
      mismatch = st;
      return;
    }
    if (it->second.parts[session->local_rank]) {
      return refuse(InvalidArgument("tensor '" + meta.name + "' is already registered by this worker"));
    }
  }
  if (it == tensors_.end()) {
    it = tensors_.emplace(meta.name, Tensor{}).first;
    it->second.meta = meta;
    it->second.parts.resize(world_.local_size);
    it->second.posted.assign(world_.local_size, false);
  }
  auto part = std::make_unique<WorkerPart>();
  part->session = session;
  part->tensor_id = msg.tensor_id;
  part->region = *created;
  part->dim0 = meta.shape.empty() ? 1 : meta.shape[0];
  part->cuda = cuda;
  it->second.parts[session->local_rank] = std::move(part);
  session->tensors[msg.tensor_id] = meta.name;
  *region = *created;
  reply->status = SPARSYNC_OK;
  reply->region_bytes = bytes;
}

void TensorTable::Stage(Staging staging) {
  const TensorMeta& meta = staging.notice.meta;
  std::vector<intake::CudaTensor*> cuda;
  for (const WorkerPart& part : staging.parts) cuda.push_back(part.cuda.get());
  std::shared_ptr<intake::DeviceClique> clique;
  if ((meta.op == SPARSYNC_OP_ALLREDUCE || meta.op == SPARSYNC_OP_GRADIENT) &&
      intake::SummedOnDevice(meta.dtype)) {
    clique = local_nccl_.CliqueFor(cuda);
  }
  // A sum the executor may reduce on the device stays there: summed into local rank 0's buffer
  // (with several GPUs) or left in the worker's (with one).
  bool keep = (meta.op == SPARSYNC_OP_GRADIENT || meta.op == SPARSYNC_OP_ALLREDUCE) &&
              meta.dtype == SPARSYNC_FLOAT32 && (clique || cuda.size() == 1) && keep_on_device_ &&
              keep_on_device_(meta);
  for (intake::CudaTensor* c : cuda) keep = keep && c != nullptr;
  Status st;
  if (keep) {
    if (clique) st = clique->ReduceOnDevice(cuda, meta.dtype);
  } else if (clique) {
    st = clique->ReduceToHost(cuda, meta.dtype);
  } else {
    // Every copy is queued before the first wait, so that copies on different devices overlap.
    for (intake::CudaTensor* c : cuda) {
      if (c && st.ok()) st = c->EnqueueCopyToHost();
    }
    for (intake::CudaTensor* c : cuda) {
      if (c) {
        Status synced = c->Synchronize();
        if (st.ok()) st = synced;
      }
    }
  }
  // The table and the executor hold the parts from here on; a worker that left meanwhile has its
  // buffer closed as soon as they let go.
  cuda.clear();
  staging.parts.clear();
  {
    std::lock_guard lock(mu_);
    auto it = tensors_.find(staging.name);
    if (it == tensors_.end() || it->second.generation != staging.generation ||
        !it->second.in_flight) {
      return;  // failed meanwhile: every worker has its DONE already
    }
    it->second.clique = clique;
    it->second.on_device = keep;
  }
  if (!st.ok()) {
    // This node cannot contribute the tensor: every node hears why now, not at the timeout.
    Status error = Aborted("node " + std::to_string(world_.node_rank) + ": " + st.message());
    FailAll(error);
    fail_(error);
    return;
  }
  report_(std::move(staging.notice));
}

Status TensorTable::OnReady(const std::shared_ptr<intake::WorkerSession>& session,
                            const sparsync_ready& msg) {
  std::optional<ReadyNotice> notice;
  std::optional<Staging> staging;
  std::optional<std::pair<WorkerPart, Status>> refuse;
  {
    std::lock_guard lock(mu_);
    auto id = session->tensors.find(msg.tensor_id);
    if (id == session->tensors.end()) {
      return InvalidArgument("READY for unregistered tensor id " + std::to_string(msg.tensor_id));
    }
    Tensor& t = tensors_.at(id->second);
    WorkerPart& part = *t.parts[session->local_rank];
    if (msg.round != part.round + 1) {
      return InvalidArgument("READY of '" + t.meta.name + "' for round " + std::to_string(msg.round) +
                             ", expected " + std::to_string(part.round + 1));
    }
    if (t.posted[session->local_rank]) {
      return InvalidArgument("READY of '" + t.meta.name + "' before its previous round was done");
    }
    part.round = msg.round;
    if (!fatal_.ok()) {
      refuse.emplace(part, fatal_);
    } else {
      t.posted[session->local_rank] = true;
      if (++t.posted_count == world_.local_size) {
        t.in_flight = true;
        ReadyNotice n;
        n.meta = t.meta;
        n.slot = t.slot;
        n.ready_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                         std::chrono::steady_clock::now().time_since_epoch())
                         .count();
        t.ready_ns = n.ready_ns;
        if (t.meta.op == SPARSYNC_OP_ALLGATHER) {
          for (const auto& p : t.parts) n.worker_dim0.push_back(p->dim0);
        }
        bool on_device = false;
        for (const auto& p : t.parts) on_device = on_device || p->cuda;
        if (on_device) {
          staging.emplace();
          staging->name = t.meta.name;
          staging->generation = t.generation;
          for (const auto& p : t.parts) staging->parts.push_back(*p);
          staging->notice = std::move(n);
        } else {
          notice = std::move(n);
        }
      }
    }
  }
  if (refuse) (void)SendDone(refuse->first, refuse->second);
  if (notice) report_(std::move(*notice));
  if (staging) staging_.Post([this, s = std::move(*staging)]() mutable { Stage(std::move(s)); });
  return Status::Ok();
}

Status TensorTable::OnUnregister(const std::shared_ptr<intake::WorkerSession>& session,
                                 const sparsync_unregister_msg& msg) {
  std::unique_ptr<WorkerPart> released;  // closes a CUDA buffer after the lock is released
  std::lock_guard lock(mu_);
  auto id = session->tensors.find(msg.tensor_id);
  if (id == session->tensors.end()) {
    return InvalidArgument("UNREGISTER of unknown tensor id " + std::to_string(msg.tensor_id));
  }
  auto it = tensors_.find(id->second);
  Tensor& t = it->second;
  if (t.posted[session->local_rank]) {
    return InvalidArgument("UNREGISTER of '" + t.meta.name + "' while it is in flight");
  }
  released = std::move(t.parts[session->local_rank]);
  session->tensors.erase(id);
  EraseIfUnused(it);
  return Status::Ok();
}

void TensorTable::EraseIfUnused(std::map<std::string, Tensor>::iterator it) {
  for (const auto& p : it->second.parts) {
    if (p) return;
  }
  // No worker holds it any more: a later registration may give the name another shape.
  if (it->second.slot) name_by_slot_.erase(it->second.slot);
  released_.push_back(it->first);
  tensors_.erase(it);
}

std::vector<std::string> TensorTable::TakeReleased() {
  std::lock_guard lock(mu_);
  return std::exchange(released_, {});
}

void TensorTable::OnDisconnect(const std::shared_ptr<intake::WorkerSession>& session,
                               const Status& reason) {
  bool had_posted = false;
  bool had_tensors = !session->tensors.empty();
  std::vector<std::unique_ptr<WorkerPart>> released;  // closed after the lock is released
  {
    std::lock_guard lock(mu_);
    for (const auto& [id, name] : session->tensors) {
      auto it = tensors_.find(name);
      if (it == tensors_.end()) continue;
      had_posted = had_posted || it->second.posted[session->local_rank];
      // Parts in flight stay alive in the executor's GroupMembers.
      released.push_back(std::move(it->second.parts[session->local_rank]));
      EraseIfUnused(it);
    }
    session->tensors.clear();
    if (workers_[session->local_rank].lock() == session) workers_[session->local_rank].reset();
  }
  if (reason.ok() && !had_posted) {
    spdlog::info("{} said goodbye", session->Describe(world_.node_rank));
    return;
  }
  if (!reason.ok() && !had_tensors && !had_posted) return;  // never took part in the job
  const std::string who = session->Describe(world_.node_rank);
  Status error = reason.ok() ? Aborted(who + " left with collectives in flight")
                 : reason.message().find(who) != std::string::npos
                     ? Aborted(reason.message())
                     : Aborted(who + ": " + reason.message());
  FailAll(error);
  fail_(error);
}

void TensorTable::BindSlot(const std::string& name, uint32_t slot) {
  {
    std::lock_guard lock(mu_);
    auto it = tensors_.find(name);
    if (it == tensors_.end()) return;
    it->second.slot = slot;
    name_by_slot_[slot] = name;
  }
  slot_bound_.notify_all();
}

Result<std::vector<GroupMember>> TensorTable::Resolve(const negotiation::ScheduleEntry& entry,
                                                      std::chrono::milliseconds wait) {
  std::unique_lock lock(mu_);
  std::vector<GroupMember> members;
  for (const auto& scheduled : entry.group) {
    bool bound = slot_bound_.wait_for(lock, wait, [&] {
      return !fatal_.ok() || name_by_slot_.count(scheduled.slot) > 0;
    });
    if (!fatal_.ok()) return fatal_;
    if (!bound) {
      return Internal("the schedule names slot " + std::to_string(scheduled.slot) +
                      " which this node never reported");
    }
    Tensor& t = tensors_.at(name_by_slot_.at(scheduled.slot));
    if (!t.in_flight) {
      return Internal("tensor '" + t.meta.name + "' was scheduled but is not ready on this node");
    }
    GroupMember m;
    m.meta = t.meta;
    m.scheduled = scheduled;
    m.generation = t.generation;
    m.ready_ns = t.ready_ns;
    m.clique = t.clique;
    m.on_device = t.on_device;
    for (int r = 0; r < world_.local_size; ++r) {
      if (!t.parts[r]) {
        return Aborted("local rank " + std::to_string(r) + " of node " +
                       std::to_string(world_.node_rank) + " left while '" + t.meta.name +
                       "' was in flight");
      }
      m.parts.push_back(*t.parts[r]);
    }
    members.push_back(std::move(m));
  }
  return members;
}

std::vector<const GroupMember*> TensorTable::Finish(const std::vector<GroupMember>& members) {
  std::vector<const GroupMember*> current;
  std::lock_guard lock(mu_);
  for (const GroupMember& m : members) {
    auto it = tensors_.find(m.meta.name);
    if (it == tensors_.end() || it->second.generation != m.generation || !it->second.in_flight) {
      continue;
    }
    Tensor& t = it->second;
    t.in_flight = false;
    t.posted.assign(world_.local_size, false);
    t.posted_count = 0;
    ++t.generation;
    current.push_back(&m);
  }
  return current;
}

void TensorTable::FailLocked(const Status& error,
                             std::vector<std::pair<WorkerPart, Status>>* to_send) {
  if (fatal_.ok()) fatal_ = error;
  for (auto& [name, t] : tensors_) {
    for (int r = 0; r < world_.local_size; ++r) {
      if (t.posted[r] && t.parts[r]) to_send->emplace_back(*t.parts[r], fatal_);
    }
    t.posted.assign(world_.local_size, false);
    t.posted_count = 0;
    t.in_flight = false;
    ++t.generation;
  }
}

void TensorTable::FailAll(const Status& error) { Fail(error, /*shutting_down=*/false); }

void TensorTable::Shutdown(const Status& reason) { Fail(reason, /*shutting_down=*/true); }

void TensorTable::Fail(const Status& error, bool shutting_down) {
  std::vector<std::pair<WorkerPart, Status>> to_send;
  {
    std::lock_guard lock(mu_);
    bool first = fatal_.ok();
    FailLocked(error, &to_send);
    if (first && !to_send.empty()) {
      spdlog::error("failing {} pending collective(s): {}", to_send.size(), fatal_.message());
    } else if (first && !shutting_down) {
      spdlog::warn("job failed: {}", fatal_.message());
    }
  }
  slot_bound_.notify_all();
  for (const auto& [part, st] : to_send) (void)SendDone(part, st);
}

Status TensorTable::fatal() const {
  std::lock_guard lock(mu_);
  return fatal_;
}

}  // namespace sparsync::pipeline
