#include "daemon/pipeline/tensor_table.h"

#include <utility>

namespace sparsync::pipeline {

namespace {

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

TensorTable::TensorTable(World world, const JobFailure* failure)
    : world_(world), failure_(failure), joined_(world.local_size, false) {}

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

Status TensorTable::Register(const std::shared_ptr<intake::WorkerSession>& session,
                             uint32_t tensor_id, const TensorMeta& meta,
                             std::shared_ptr<intake::SharedRegion> region,
                             std::shared_ptr<device::CudaTensor> cuda) {
  std::lock_guard lock(mu_);
  if (session->tensors.count(tensor_id)) {
    return InvalidArgument("tensor id " + std::to_string(tensor_id) +
                           " is already registered by this worker");
  }
  auto it = tensors_.find(meta.name);
  if (it != tensors_.end()) {
    SPARSYNC_RETURN_IF_ERROR(CheckCompatible(it->second, meta, session->local_rank));
    if (it->second.parts[session->local_rank]) {
      return InvalidArgument("tensor '" + meta.name + "' is already registered by this worker");
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
  part->tensor_id = tensor_id;
  part->region = std::move(region);
  part->dim0 = meta.shape.empty() ? 1 : meta.shape[0];
  part->cuda = std::move(cuda);
  it->second.parts[session->local_rank] = std::move(part);
  session->tensors[tensor_id] = meta.name;
  return Status::Ok();
}

Result<TensorTable::Posted> TensorTable::Post(const std::shared_ptr<intake::WorkerSession>& session,
                                              uint32_t tensor_id, uint64_t round) {
  Posted posted;
  std::lock_guard lock(mu_);
  auto id = session->tensors.find(tensor_id);
  if (id == session->tensors.end()) {
    return InvalidArgument("READY for unregistered tensor id " + std::to_string(tensor_id));
  }
  if (joined_[session->local_rank]) {
    return InvalidArgument("READY from a worker inside join(): it may post again once every "
                           "worker has joined");
  }
  Tensor& t = tensors_.at(id->second);
  WorkerPart& part = *t.parts[session->local_rank];
  if (round != part.round + 1) {
    return InvalidArgument("READY of '" + t.meta.name + "' for round " + std::to_string(round) +
                           ", expected " + std::to_string(part.round + 1));
  }
  if (t.posted[session->local_rank]) {
    return InvalidArgument("READY of '" + t.meta.name + "' before its previous round was done");
  }
  part.round = round;
  if (failure_->failed()) {
    posted.refused = part;
    return posted;
  }
  t.posted[session->local_rank] = true;
  ++t.posted_count;
  if (!LocallyComplete(t)) return posted;
  posted.ready = MakeReady(t);
  return posted;
}

bool TensorTable::LocallyComplete(const Tensor& t) const {
  if (t.in_flight || t.posted_count == 0) return false;
  for (int r = 0; r < world_.local_size; ++r) {
    if (t.meta.HasMember(GlobalRank(r)) && !t.posted[r] && !joined_[r]) return false;
  }
  return true;
}

ReadyRound TensorTable::MakeReady(Tensor& t) {
  t.in_flight = true;
  t.ready_ns = NowNs();
  t.sum = NodeSum::kRegions;
  t.clique = nullptr;
  ReadyRound ready;
  ready.report.meta = t.meta;
  ready.report.ready_ns = t.ready_ns;
  ready.generation = t.generation;
  // The parts that take part posted; a joined worker's adds nothing (an allgather: no rows).
  if (t.meta.op == CollectiveOp::kAllGather) {
    for (int r = 0; r < world_.local_size; ++r) {
      if (!t.meta.HasMember(GlobalRank(r))) continue;
      ready.report.worker_dim0.push_back(t.posted[r] ? t.parts[r]->dim0 : 0);
    }
  }
  bool on_device = false;
  for (int r = 0; r < world_.local_size; ++r) on_device = on_device || (t.posted[r] && t.parts[r]->cuda);
  if (on_device) {
    for (int r = 0; r < world_.local_size; ++r) {
      if (t.posted[r]) ready.cuda_parts.push_back(*t.parts[r]);
    }
  }
  return ready;
}

std::vector<ReadyRound> TensorTable::Join(int local_rank) {
  std::vector<ReadyRound> now_ready;
  std::lock_guard lock(mu_);
  joined_[local_rank] = true;
  for (auto& [name, t] : tensors_) {
    if (LocallyComplete(t)) now_ready.push_back(MakeReady(t));
  }
  return now_ready;
}

void TensorTable::EndJoin() {
  std::lock_guard lock(mu_);
  joined_.assign(world_.local_size, false);
}

bool TensorTable::SetNodeSum(const std::string& name, uint64_t generation, NodeSum sum,
                             std::shared_ptr<device::DeviceClique> clique) {
  std::lock_guard lock(mu_);
  auto it = tensors_.find(name);
  if (it == tensors_.end() || it->second.generation != generation || !it->second.in_flight) {
    return false;
  }
  it->second.sum = sum;
  it->second.clique = std::move(clique);
  return true;
}

Status TensorTable::Unregister(const std::shared_ptr<intake::WorkerSession>& session,
                               uint32_t tensor_id) {
  std::unique_ptr<WorkerPart> released;  // closes a CUDA buffer after the lock is released
  std::lock_guard lock(mu_);
  auto id = session->tensors.find(tensor_id);
  if (id == session->tensors.end()) {
    return InvalidArgument("UNREGISTER of unknown tensor id " + std::to_string(tensor_id));
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

TensorTable::Departure TensorTable::Leave(const std::shared_ptr<intake::WorkerSession>& session) {
  Departure departure;
  std::vector<std::unique_ptr<WorkerPart>> released;  // closed after the lock is released
  std::lock_guard lock(mu_);
  departure.had_tensors = !session->tensors.empty();
  for (const auto& [id, name] : session->tensors) {
    auto it = tensors_.find(name);
    if (it == tensors_.end()) continue;
    departure.had_posted = departure.had_posted || it->second.posted[session->local_rank];
    // Parts in flight stay alive in the executor's GroupMembers.
    released.push_back(std::move(it->second.parts[session->local_rank]));
    EraseIfUnused(it);
  }
  session->tensors.clear();
  return departure;
}

void TensorTable::EraseIfUnused(std::map<std::string, Tensor>::iterator it) {
  for (const auto& p : it->second.parts) {
    if (p) return;
  }
  // No worker holds it any more: a later registration may give the name another shape.
  released_.push_back(it->first);
  tensors_.erase(it);
}

std::vector<std::string> TensorTable::TakeReleased() {
  std::lock_guard lock(mu_);
  return std::exchange(released_, {});
}

Result<std::vector<GroupMember>> TensorTable::Resolve(const negotiation::ScheduleEntry& entry) {
  std::lock_guard lock(mu_);
  std::vector<GroupMember> members;
  for (const auto& scheduled : entry.group) {
    auto it = tensors_.find(scheduled.name);
    const bool ready_here = it != tensors_.end() && it->second.in_flight;
    const TensorMeta* meta = it != tensors_.end() ? &it->second.meta : scheduled.meta.get();
    if (!ready_here && meta && NoneTakesPart(*meta)) {
      // No worker of this node takes part (none is in the tensor's process set, or every one
      // that is has joined): the node adds nothing of its own.
      GroupMember m;
      m.meta = *meta;
      m.scheduled = scheduled;
      members.push_back(std::move(m));
      continue;
    }
    if (!ready_here) {
      return Internal("tensor '" + scheduled.name +
                      "' was scheduled but is not ready on this node");
    }
    Tensor& t = it->second;
    GroupMember m;
    m.meta = t.meta;
    m.scheduled = scheduled;
    m.generation = t.generation;
    m.ready_ns = t.ready_ns;
    m.sum = t.sum;
    m.clique = t.clique;
    for (int r = 0; r < world_.local_size; ++r) {
      if (!t.meta.HasMember(GlobalRank(r)) || (!t.posted[r] && joined_[r])) continue;
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

bool TensorTable::NoneTakesPart(const TensorMeta& meta) const {
  for (int r = 0; r < world_.local_size; ++r) {
    if (meta.HasMember(GlobalRank(r)) && !joined_[r]) return false;
  }
  return true;
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

std::vector<WorkerPart> TensorTable::FailPending() {
  std::vector<WorkerPart> waiting;
  std::lock_guard lock(mu_);
  for (auto& [name, t] : tensors_) {
    for (int r = 0; r < world_.local_size; ++r) {
      if (t.posted[r] && t.parts[r]) waiting.push_back(*t.parts[r]);
    }
    t.posted.assign(world_.local_size, false);
    t.posted_count = 0;
    t.in_flight = false;
    ++t.generation;
  }
  return waiting;
}

}  // namespace sparsync::pipeline
