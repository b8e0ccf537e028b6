#include "shims/client/tensor_registry.h"

#include <cstring>
#include <utility>

#include "shims/client/codec.h"

namespace sparsync::client {
namespace {

Status Violation(std::string message) {
  return Status(SPARSYNC_ERR_UNAVAILABLE, std::move(message));
}

// Maps the one descriptor in *fds as `bytes` bytes into *out.
Status MapOnly(ReceivedFds* fds, uint64_t bytes, Mapping* out) {
  int fd = fds->Take();
  IoError e = MapRegion(fd, bytes, out);
  CloseFd(fd);
  return e.ok ? Status::Ok() : Violation(e.message);
}

}  // namespace

bool TensorRegistry::Reserve(RegionUse use, uint32_t* id) {
  for (uint32_t i = 0; i < SPARSYNC_MAX_TENSORS_PER_WORKER; ++i) {
    uint32_t candidate = next_id_;
    next_id_ = (next_id_ + 1) % SPARSYNC_MAX_TENSORS_PER_WORKER;
    if (tensors_.count(candidate) == 0 && pending_.count(candidate) == 0) {
      retired_.erase(candidate);
      pending_[candidate].use = use;
      *id = candidate;
      return true;
    }
  }
  return false;
}

bool TensorRegistry::Arrived(uint32_t id) const {
  auto it = pending_.find(id);
  return it != pending_.end() && it->second.arrived;
}

PendingRegistration TensorRegistry::TakePending(uint32_t id) {
  auto it = pending_.find(id);
  if (it == pending_.end()) return {};
  PendingRegistration p = std::move(it->second);
  pending_.erase(it);
  return p;
}

Tensor& TensorRegistry::Add(uint32_t id, Tensor tensor) { return tensors_[id] = std::move(tensor); }

Tensor* TensorRegistry::Find(uint32_t id) {
  auto it = tensors_.find(id);
  return it == tensors_.end() ? nullptr : &it->second;
}

void TensorRegistry::Remove(uint32_t id) {
  auto it = tensors_.find(id);
  if (it == tensors_.end()) return;
  if (it->second.in_flight()) retired_.insert(id);
  tensors_.erase(it);
}

Status TensorRegistry::OnRegisterReply(const sparsync_register_reply& m, ReceivedFds* fds) {
  auto it = pending_.find(m.tensor_id);
  if (it == pending_.end() || it->second.arrived) {
    return Violation("REGISTER_REPLY for tensor id " + std::to_string(m.tensor_id) +
                     " that has no pending registration");
  }
  PendingRegistration& p = it->second;
  p.arrived = true;
  p.status = m.status;
  p.message = BoundedString(m.message, sizeof(m.message));
  if (m.status != SPARSYNC_OK) {
    if (fds->size() != 0) return Violation("failed REGISTER_REPLY carries a descriptor");
    return Status::Ok();
  }
  if (fds->size() != 1) return Violation("REGISTER_REPLY without exactly one descriptor");
  switch (p.use) {
    case RegionUse::kDiscard:
      CloseFd(fds->Take());
      memcpy(p.done_event, m.cuda_done_event, sizeof(p.done_event));
      return Status::Ok();
    case RegionUse::kHandOver:
      p.fd = OwnedFd(fds->Take());
      p.fd_bytes = m.region_bytes;
      return Status::Ok();
    case RegionUse::kMap:
      break;
  }
  return MapOnly(fds, m.region_bytes, &p.region);
}

Status TensorRegistry::OnDone(const sparsync_done& m, ReceivedFds* fds, JobError* job_error) {
  std::string message = BoundedString(m.message, sizeof(m.message));
  if (m.status != SPARSYNC_OK && !job_error->failed()) {
    job_error->status = ToStatus(m.status);
    job_error->message = message.empty() ? std::string("sparsyncd reported ") +
                                               StatusName(m.status)
                                         : message;
  }
  auto it = tensors_.find(m.tensor_id);
  const bool retired = retired_.count(m.tensor_id) != 0;
  if (it == tensors_.end() || retired) {
    if (m.status != SPARSYNC_OK) return Status::Ok();  // the job's error, kept above
    if (retired) return Status::Ok();  // a late DONE of an unregistered tensor
    return Violation("DONE for unknown tensor id " + std::to_string(m.tensor_id));
  }
  Tensor& t = it->second;
  if (m.round <= t.done || m.round > t.posted) {
    if (m.status != SPARSYNC_OK && fds->size() == 0) {
      return Status::Ok();  // a job-wide error delivered to a tensor with nothing in flight
    }
    return Violation("DONE for tensor '" + t.name + "' round " + std::to_string(m.round) +
                     ", but rounds " + std::to_string(t.done + 1) + ".." +
                     std::to_string(t.posted) + " are in flight");
  }
  t.result.Reset();
  t.result_dim0 = 0;
  t.status = m.status;
  t.message = message.empty() && m.status != SPARSYNC_OK
                  ? std::string("sparsyncd reported ") + StatusName(m.status)
                  : message;
  if (m.status == SPARSYNC_OK && t.op == SPARSYNC_OP_ALLGATHER) {
    if (fds->size() != 1) return Violation("allgather DONE without exactly one descriptor");
    if (Status s = MapOnly(fds, m.result_bytes, &t.result); !s.ok()) return s;
    t.result_dim0 = m.result_dim0;
  } else if (fds->size() != 0) {
    return Violation("DONE for tensor '" + t.name + "' carries an unexpected descriptor");
  }
  t.done = m.round;
  return Status::Ok();
}

}  // namespace sparsync::client
