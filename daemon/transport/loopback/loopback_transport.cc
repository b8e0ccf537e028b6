#include "daemon/transport/loopback/loopback_transport.h"

#include <cstring>

namespace sparsync::transport {
namespace {

template <typename T>
void SumParts(const std::vector<std::vector<char>>& parts, void* out, size_t count) {
  T* dst = static_cast<T*>(out);
  for (size_t i = 0; i < count; ++i) {
    T acc = reinterpret_cast<const T*>(parts[0].data())[i];
    for (size_t r = 1; r < parts.size(); ++r) acc += reinterpret_cast<const T*>(parts[r].data())[i];
    dst[i] = acc;
  }
}

}  // namespace

LoopbackHub::LoopbackHub(int size, std::chrono::milliseconds timeout)
    : size_(size), timeout_(timeout) {}

void LoopbackHub::Abort(const Status& reason) {
  {
    std::lock_guard lock(mu_);
    if (aborted_.ok()) aborted_ = reason.ok() ? Aborted("loopback aborted") : reason;
  }
  cv_.notify_all();
}

Status LoopbackHub::Exchange(int rank, uint32_t tag, std::vector<char> contribution,
                             const std::function<void(const std::vector<std::vector<char>>&)>& combine) {
  std::unique_lock lock(mu_);
  if (!aborted_.ok()) return aborted_;
  Op& op = ops_[tag];
  if (op.parts.empty()) op.parts.resize(size_);
  op.parts[rank] = std::move(contribution);
  ++op.arrived;
  cv_.notify_all();
  if (!cv_.wait_for(lock, timeout_, [&] { return !aborted_.ok() || op.arrived == size_; })) {
    return DeadlineExceeded("loopback collective " + std::to_string(tag) + " timed out");
  }
  if (!aborted_.ok()) return aborted_;
  combine(op.parts);  // reads only; every rank has arrived, nobody writes parts now
  if (++op.departed == size_) {
    ops_.erase(tag);
  }
  return Status::Ok();
}

Status LoopbackHub::Post(int from, int to, uint32_t tag, Message message) {
  {
    std::lock_guard lock(mu_);
    if (!aborted_.ok()) return aborted_;
    mailboxes_[{from, to, tag}].push_back(std::move(message));
  }
  cv_.notify_all();
  return Status::Ok();
}

Status LoopbackHub::Take(int from, int to, uint32_t tag, Message* message) {
  std::unique_lock lock(mu_);
  const auto key = std::make_tuple(from, to, tag);
  auto ready = [&] {
    if (!aborted_.ok()) return true;
    auto it = mailboxes_.find(key);
    return it != mailboxes_.end() && !it->second.empty();
  };
  if (!cv_.wait_for(lock, timeout_, ready)) {
    return DeadlineExceeded("loopback sendrecv " + std::to_string(tag) + " from node " +
                            std::to_string(from) + " to node " + std::to_string(to) +
                            " timed out");
  }
  if (!aborted_.ok()) return aborted_;
  auto it = mailboxes_.find(key);
  *message = std::move(it->second.front());
  it->second.pop_front();
  if (it->second.empty()) mailboxes_.erase(it);
  return Status::Ok();
}

Status LoopbackTransport::AllReduceSum(void* data, size_t count, ElementType type, uint32_t tag) {
  size_t bytes = count * ElementSize(type);
  std::vector<char> mine(static_cast<char*>(data), static_cast<char*>(data) + bytes);
  return hub_->Exchange(rank_, tag, std::move(mine), [&](const auto& parts) {
    switch (type) {
      case ElementType::kFloat32: SumParts<float>(parts, data, count); break;
      case ElementType::kFloat64: SumParts<double>(parts, data, count); break;
      case ElementType::kInt32: SumParts<int32_t>(parts, data, count); break;
      case ElementType::kInt64: SumParts<int64_t>(parts, data, count); break;
    }
  });
}

Status LoopbackTransport::AllGatherV(const void* send, size_t send_bytes, void* recv,
                                     std::span<const size_t> recv_bytes, uint32_t tag) {
  if (recv_bytes.size() != static_cast<size_t>(size()) || recv_bytes[rank_] != send_bytes) {
    return Internal("allgatherv: receive sizes do not match the node count or the send size");
  }
  std::vector<char> mine(static_cast<const char*>(send), static_cast<const char*>(send) + send_bytes);
  return hub_->Exchange(rank_, tag, std::move(mine), [&](const auto& parts) {
    char* out = static_cast<char*>(recv);
    for (size_t r = 0; r < parts.size(); ++r) {
      size_t n = std::min(parts[r].size(), recv_bytes[r]);
      if (n) std::memcpy(out, parts[r].data(), n);
      out += recv_bytes[r];
    }
  });
}

Status LoopbackTransport::Broadcast(void* data, size_t bytes, int root, uint32_t tag) {
  std::vector<char> mine;
  if (rank_ == root) mine.assign(static_cast<char*>(data), static_cast<char*>(data) + bytes);
  return hub_->Exchange(rank_, tag, std::move(mine), [&](const auto& parts) {
    if (rank_ != root && bytes) std::memcpy(data, parts[root].data(), std::min(bytes, parts[root].size()));
  });
}

Status LoopbackTransport::SendRecv(int peer, const void* send, size_t send_bytes, void* recv,
                                   size_t recv_capacity, size_t* recv_bytes, uint32_t tag) {
  *recv_bytes = 0;
  if (peer < 0 || peer >= size()) {
    return InvalidArgument("sendrecv: peer " + std::to_string(peer) + " is not a node of " +
                           std::to_string(size()));
  }
  LoopbackHub::Message mine;
  mine.capacity = recv_capacity;
  mine.bytes.assign(static_cast<const char*>(send), static_cast<const char*>(send) + send_bytes);
  SPARSYNC_RETURN_IF_ERROR(hub_->Post(rank_, peer, tag, std::move(mine)));
  LoopbackHub::Message theirs;
  SPARSYNC_RETURN_IF_ERROR(hub_->Take(peer, rank_, tag, &theirs));
  if (theirs.bytes.size() > recv_capacity || send_bytes > theirs.capacity) {
    return Mismatch("sendrecv " + std::to_string(tag) + " between nodes " +
                    std::to_string(rank_) + " and " + std::to_string(peer) + ": node " +
                    std::to_string(rank_) + " sends " + std::to_string(send_bytes) +
                    " bytes into a capacity of " + std::to_string(theirs.capacity) +
                    ", node " + std::to_string(peer) + " sends " +
                    std::to_string(theirs.bytes.size()) + " bytes into a capacity of " +
                    std::to_string(recv_capacity));
  }
  if (!theirs.bytes.empty()) std::memcpy(recv, theirs.bytes.data(), theirs.bytes.size());
  *recv_bytes = theirs.bytes.size();
  return Status::Ok();
}

}  // namespace sparsync::transport
