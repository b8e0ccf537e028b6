// FakeNcclWorld and its per-node NcclApi: see nccl_fake_api.h for what is modelled and why.
#include "tests/unit/daemon/transport/nccl_fake_api.h"

#include <cstdint>
#include <cstring>

namespace sparsync::transport {
namespace {

constexpr size_t kUniqueIdBytes = 128;  // sizeof(ncclUniqueId)

const char* TypeName(ElementType type) {
  switch (type) {
    case ElementType::kFloat32:
      return "float32";
    case ElementType::kFloat64:
      return "float64";
    case ElementType::kInt32:
      return "int32";
    case ElementType::kInt64:
      return "int64";
  }
  return "?";
}

template <typename T>
void SumInRankOrder(const std::vector<const char*>& parts, size_t count, char* out) {
  for (size_t i = 0; i < count; ++i) {
    T acc;
    std::memcpy(&acc, parts[0] + i * sizeof(T), sizeof(T));
    for (size_t r = 1; r < parts.size(); ++r) {
      T x;
      std::memcpy(&x, parts[r] + i * sizeof(T), sizeof(T));
      acc += x;
    }
    std::memcpy(out + i * sizeof(T), &acc, sizeof(T));
  }
}

// Memory handed out by one fake node, by kind; zero-filled so nothing reads indeterminate bytes.
class Regions {
 public:
  void* Add(size_t bytes) {
    auto data = std::make_unique<char[]>(bytes == 0 ? 1 : bytes);
    char* ptr = data.get();
    regions_[reinterpret_cast<uintptr_t>(ptr)] = {bytes, std::move(data)};
    return ptr;
  }
  void Remove(void* ptr) { regions_.erase(reinterpret_cast<uintptr_t>(ptr)); }
  bool Contains(const void* ptr, size_t bytes) const {
    const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
    auto it = regions_.upper_bound(p);
    if (it == regions_.begin()) return false;
    --it;
    return p + bytes <= it->first + it->second.bytes;
  }

 private:
  struct Region {
    size_t bytes = 0;
    std::unique_ptr<char[]> data;
  };
  std::map<uintptr_t, Region> regions_;
};

}  // namespace

std::string FakeNcclWorld::Op::Describe() const {
  switch (kind) {
    case Kind::kCopy:
      return "copy " + std::to_string(bytes);
    case Kind::kAllReduce:
      return std::string("allreduce ") + TypeName(type) + " x" + std::to_string(count);
    case Kind::kAllGather:
      return "allgather " + std::to_string(bytes);
    case Kind::kBroadcast:
      return "broadcast " + std::to_string(bytes) + " from " + std::to_string(root);
    case Kind::kGroup: {
      std::string out = "group";
      for (size_t i = 0; i < group.size(); ++i) {
        out += (i == 0 ? " " : ", ");
        out += std::string(group[i].send ? "send " : "recv ") + std::to_string(group[i].bytes) +
               (group[i].send ? " to " : " from ") + std::to_string(group[i].peer);
      }
      return out;
    }
  }
  return "?";
}

bool FakeNcclWorld::Op::SameCollective(const Op& other) const {
  return kind == other.kind && bytes == other.bytes && count == other.count && type == other.type &&
         root == other.root;
}

class FakeNcclWorld::Api : public NcclApi {
 public:
  explicit Api(std::shared_ptr<FakeNcclWorld> world) : world_(std::move(world)) {}

  ~Api() override {
    // A node that goes away abandons its work: its peers stall, as with a dead process.
    std::lock_guard lock(world_->mu_);
    if (rank_ >= 0) {
      Node& n = node();
      n.stream.clear();
      n.enqueuing.reset();
      n.aborted = true;
      world_->changed_.notify_all();
    }
  }

  Result<std::string> NewUniqueId() override {
    std::lock_guard lock(world_->mu_);
    const int serial = ++world_->unique_ids_issued_;
    std::string id(kUniqueIdBytes, '\0');
    // Every byte value appears, zero included: the id must survive the store as binary.
    for (size_t i = 0; i < id.size(); ++i) id[i] = static_cast<char>(serial * 131 + i * 37);
    return id;
  }

  Status InitComm(const std::string& unique_id, int rank, int size) override {
    std::lock_guard lock(world_->mu_);
    if (rank_ >= 0) return InvalidArgument("fake NCCL: communicator initialised twice");
    if (size != world_->size_ || rank < 0 || rank >= size) {
      return InvalidArgument("fake NCCL: rank " + std::to_string(rank) + " of " +
                             std::to_string(size) + " in a world of " +
                             std::to_string(world_->size_));
    }
    if (unique_id.size() != kUniqueIdBytes) {
      return InvalidArgument("fake NCCL: a unique id has 128 bytes, not " +
                             std::to_string(unique_id.size()));
    }
    Node& n = world_->nodes_[rank];
    if (n.joined)
      return InvalidArgument("fake NCCL: rank " + std::to_string(rank) + " joined twice");
    rank_ = rank;
    n.joined = true;
    n.unique_id = unique_id;
    for (int q = 0; q < world_->size_; ++q) {
      const Node& other = world_->nodes_[q];
      if (other.joined && other.unique_id != unique_id) {
        n.async_error = "fake NCCL: rank " + std::to_string(rank) +
                        " joined with a different unique id than rank " + std::to_string(q);
      }
    }
    world_->changed_.notify_all();
    return Status::Ok();
  }

  Result<NcclCommState> CommState() override {
    std::lock_guard lock(world_->mu_);
    if (rank_ < 0) return Internal("fake NCCL: CommState before InitComm");
    Node& n = node();
    if (n.aborted) return Internal("fake NCCL: communicator used after abort");
    if (!n.async_error.empty()) return Unavailable(n.async_error);
    if (n.enqueuing) {
      if (n.enqueue_polls_left > 0) {
        --n.enqueue_polls_left;
        return NcclCommState::kInProgress;
      }
      n.stream.push_back(std::move(*n.enqueuing));
      n.enqueuing.reset();
      world_->Advance();
    }
    for (const Node& other : world_->nodes_) {
      if (!other.joined) return NcclCommState::kInProgress;
    }
    return NcclCommState::kReady;
  }

  Status FinalizeComm() override {
    std::lock_guard lock(world_->mu_);
    SPARSYNC_RETURN_IF_ERROR(Usable("FinalizeComm"));
    if (!node().stream.empty()) return UsageError("FinalizeComm with work still in the stream");
    node().finalized = true;
    return Status::Ok();
  }

  void DestroyComm() override {
    std::lock_guard lock(world_->mu_);
    if (rank_ >= 0) node().destroyed = true;
  }

  void AbortComm() override {
    std::lock_guard lock(world_->mu_);
    if (rank_ < 0) return;
    Node& n = node();
    ++n.abort_calls;
    n.aborted = true;
    n.stream.clear();
    n.enqueuing.reset();
    world_->changed_.notify_all();
  }

  Status AllReduceSum(const void* send, void* recv, size_t count, ElementType type) override {
    const size_t bytes = count * ElementSize(type);
    if (!OnDevice(send, bytes) || !OnDevice(recv, bytes)) {
      return InvalidArgument("fake NCCL: allreduce on memory that is not device memory");
    }
    Op op;
    op.kind = Op::Kind::kAllReduce;
    op.src = static_cast<const char*>(send);
    op.dst = static_cast<char*>(recv);
    op.count = count;
    op.type = type;
    return Submit(std::move(op), "allreduce");
  }

  Status AllGather(const void* send, void* recv, size_t bytes_per_rank) override {
    if (!OnDevice(send, bytes_per_rank) || !OnDevice(recv, bytes_per_rank * world_->size_)) {
      return InvalidArgument("fake NCCL: allgather on memory that is not device memory");
    }
    Op op;
    op.kind = Op::Kind::kAllGather;
    op.src = static_cast<const char*>(send);
    op.dst = static_cast<char*>(recv);
    op.bytes = bytes_per_rank;
    return Submit(std::move(op), "allgather");
  }

  Status Broadcast(const void* send, void* recv, size_t bytes, int root) override {
    if (!OnDevice(send, bytes) || !OnDevice(recv, bytes)) {
      return InvalidArgument("fake NCCL: broadcast on memory that is not device memory");
    }
    Op op;
    op.kind = Op::Kind::kBroadcast;
    op.src = static_cast<const char*>(send);
    op.dst = static_cast<char*>(recv);
    op.bytes = bytes;
    op.root = root;
    return Submit(std::move(op), "broadcast");
  }

  Status GroupStart() override {
    std::lock_guard lock(world_->mu_);
    SPARSYNC_RETURN_IF_ERROR(Usable("GroupStart"));
    if (node().in_group) return UsageError("nested GroupStart");
    node().in_group = true;
    node().group.clear();
    return Status::Ok();
  }

  Status GroupEnd() override {
    Op op;
    {
      std::lock_guard lock(world_->mu_);
      if (rank_ < 0 || !node().in_group) return UsageError("GroupEnd without GroupStart");
      node().in_group = false;
      if (node().group.empty()) return Status::Ok();
      op.kind = Op::Kind::kGroup;
      op.group = std::move(node().group);
      node().group.clear();
    }
    return Submit(std::move(op), "GroupEnd");
  }

  Status Send(const void* data, size_t bytes, int peer) override {
    return PointToPoint(true, const_cast<void*>(data), bytes, peer);
  }

  Status Recv(void* data, size_t bytes, int peer) override {
    return PointToPoint(false, data, bytes, peer);
  }

  Status CopyHostToDevice(void* device_dst, const void* host_src, size_t bytes) override {
    if (!OnDevice(device_dst, bytes) || !pinned_.Contains(host_src, bytes)) {
      return InvalidArgument("fake CUDA: host-to-device copy not from pinned to device memory");
    }
    return SubmitCopy(static_cast<char*>(device_dst), static_cast<const char*>(host_src), bytes);
  }

  Status CopyDeviceToHost(void* host_dst, const void* device_src, size_t bytes) override {
    if (!pinned_.Contains(host_dst, bytes) || !OnDevice(device_src, bytes)) {
      return InvalidArgument("fake CUDA: device-to-host copy not from device to pinned memory");
    }
    return SubmitCopy(static_cast<char*>(host_dst), static_cast<const char*>(device_src), bytes);
  }

  Result<bool> StreamIdle() override {
    std::lock_guard lock(world_->mu_);
    SPARSYNC_RETURN_IF_ERROR(Usable("StreamIdle"));
    return node().stream.empty();
  }

  void Pause(std::chrono::microseconds at_most) override {
    std::unique_lock lock(world_->mu_);
    world_->changed_.wait_for(lock, at_most);
  }

  Result<void*> AllocDevice(size_t bytes) override {
    std::lock_guard lock(world_->mu_);
    if (rank_ >= 0) ++node().device_allocations;
    return device_.Add(bytes);
  }

  void FreeDevice(void* ptr) override { Free(&device_, ptr); }

  Result<void*> AllocPinnedHost(size_t bytes) override { return pinned_.Add(bytes); }

  void FreePinnedHost(void* ptr) override { Free(&pinned_, ptr); }

 private:
  Node& node() { return world_->nodes_[rank_]; }

  // This node's device memory: the API's own (AllocDevice) or the caller's (AllocCallerDevice).
  bool OnDevice(const void* ptr, size_t bytes) {
    if (device_.Contains(ptr, bytes)) return true;
    std::lock_guard lock(world_->mu_);
    if (rank_ < 0) return false;
    const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
    for (const std::vector<char>& region : node().caller_device) {
      const uintptr_t begin = reinterpret_cast<uintptr_t>(region.data());
      if (p >= begin && p + bytes <= begin + region.size()) return true;
    }
    return false;
  }

  // REQUIRES: world_->mu_ held.
  Status UsageError(const std::string& what) {
    const std::string message = "fake NCCL: usage error: " + what;
    if (rank_ >= 0 && node().async_error.empty()) node().async_error = message;
    return InvalidArgument(message);
  }

  // REQUIRES: world_->mu_ held.
  Status Usable(const char* call) {
    if (rank_ < 0) return UsageError(std::string(call) + " before InitComm");
    Node& n = node();
    if (n.aborted) return UsageError(std::string(call) + " after abort");
    if (n.enqueuing) {
      return UsageError(std::string(call) + " while a non-blocking NCCL call was in progress");
    }
    for (const Node& other : world_->nodes_) {
      if (!other.joined) return UsageError(std::string(call) + " before initialisation finished");
    }
    return Status::Ok();
  }

  Status Submit(Op op, const char* call) {
    std::lock_guard lock(world_->mu_);
    SPARSYNC_RETURN_IF_ERROR(Usable(call));
    Node& n = node();
    if (n.in_group && op.kind != Op::Kind::kGroup) return UsageError("collective inside a group");
    if (op.kind != Op::Kind::kGroup) op.sequence = n.collectives++;
    if (world_->enqueue_polls_ > 0) {
      n.enqueuing = std::move(op);
      n.enqueue_polls_left = world_->enqueue_polls_;
      return Status::Ok();
    }
    n.stream.push_back(std::move(op));
    world_->Advance();
    return Status::Ok();
  }

  Status SubmitCopy(char* dst, const char* src, size_t bytes) {
    std::lock_guard lock(world_->mu_);
    SPARSYNC_RETURN_IF_ERROR(Usable("a copy"));
    ++node().copies;
    Op op;
    op.kind = Op::Kind::kCopy;
    op.dst = dst;
    op.src = src;
    op.bytes = bytes;
    node().stream.push_back(std::move(op));
    world_->Advance();
    return Status::Ok();
  }

  Status PointToPoint(bool send, void* data, size_t bytes, int peer) {
    if (!OnDevice(data, bytes)) {
      return InvalidArgument("fake NCCL: send/recv on memory that is not device memory");
    }
    std::lock_guard lock(world_->mu_);
    SPARSYNC_RETURN_IF_ERROR(Usable(send ? "Send" : "Recv"));
    if (!node().in_group) return UsageError("Send/Recv outside a group");
    if (peer < 0 || peer >= world_->size_) return UsageError("peer out of range");
    node().group.push_back({send, peer, static_cast<char*>(data), bytes, false});
    return Status::Ok();
  }

  void Free(Regions* regions, void* ptr) {
    if (ptr == nullptr) return;
    std::lock_guard lock(world_->mu_);
    if (rank_ >= 0 && !node().stream.empty()) {
      (void)UsageError("memory freed while the stream still uses it");
      node().stream.clear();
    }
    regions->Remove(ptr);
  }

  std::shared_ptr<FakeNcclWorld> world_;
  int rank_ = -1;
  Regions device_;
  Regions pinned_;
};

std::shared_ptr<FakeNcclWorld> FakeNcclWorld::Create(int size) {
  return std::shared_ptr<FakeNcclWorld>(new FakeNcclWorld(size));
}

FakeNcclWorld::FakeNcclWorld(int size) : size_(size), nodes_(size) {}

std::unique_ptr<NcclApi> FakeNcclWorld::NewApi() {
  return std::make_unique<Api>(shared_from_this());
}

void FakeNcclWorld::InjectAsyncError(int rank, const std::string& message) {
  std::lock_guard lock(mu_);
  nodes_[rank].async_error = message;
  changed_.notify_all();
}

void FakeNcclWorld::SetEnqueuePolls(int polls) {
  std::lock_guard lock(mu_);
  enqueue_polls_ = polls;
}

void* FakeNcclWorld::AllocCallerDevice(int rank, size_t bytes) {
  std::lock_guard lock(mu_);
  std::vector<char>& region = nodes_[rank].caller_device.emplace_back(bytes == 0 ? 1 : bytes);
  return region.data();
}

int FakeNcclWorld::unique_ids_issued() const {
  std::lock_guard lock(mu_);
  return unique_ids_issued_;
}

std::vector<std::string> FakeNcclWorld::init_ids() const {
  std::lock_guard lock(mu_);
  std::vector<std::string> out;
  for (const Node& n : nodes_) out.push_back(n.unique_id);
  return out;
}

std::vector<std::string> FakeNcclWorld::executed(int rank) const {
  std::lock_guard lock(mu_);
  return nodes_[rank].executed;
}

int FakeNcclWorld::abort_calls(int rank) const {
  std::lock_guard lock(mu_);
  return nodes_[rank].abort_calls;
}

bool FakeNcclWorld::finalized(int rank) const {
  std::lock_guard lock(mu_);
  return nodes_[rank].finalized;
}

bool FakeNcclWorld::destroyed(int rank) const {
  std::lock_guard lock(mu_);
  return nodes_[rank].destroyed;
}

int FakeNcclWorld::device_allocations(int rank) const {
  std::lock_guard lock(mu_);
  return nodes_[rank].device_allocations;
}

int FakeNcclWorld::copies(int rank) const {
  std::lock_guard lock(mu_);
  return nodes_[rank].copies;
}

uint64_t FakeNcclWorld::collectives_issued(int rank) const {
  std::lock_guard lock(mu_);
  return nodes_[rank].collectives;
}

void FakeNcclWorld::FailEverywhere(const std::string& message) {
  for (Node& n : nodes_) {
    if (n.async_error.empty()) n.async_error = message;
  }
  changed_.notify_all();
}

void FakeNcclWorld::Advance() {
  bool any = false;
  bool progress = true;
  while (progress) {
    progress = false;
    for (int r = 0; r < size_; ++r) {
      Node& n = nodes_[r];
      while (!n.aborted && !n.stream.empty()) {
        Op& head = n.stream.front();
        if (head.kind == Op::Kind::kCopy) {
          if (head.bytes > 0) std::memmove(head.dst, head.src, head.bytes);
          n.stream.pop_front();
          progress = true;
        } else if (head.kind == Op::Kind::kGroup) {
          bool matched = false;
          const bool done = TryGroup(r, &matched);
          progress = progress || matched || done;
          if (!done) break;
        } else {
          if (!TryCollective(head.sequence)) break;
          progress = true;
        }
      }
    }
    any = any || progress;
  }
  if (any) changed_.notify_all();
}

bool FakeNcclWorld::TryCollective(uint64_t sequence) {
  for (const Node& n : nodes_) {
    if (n.aborted || n.stream.empty()) return false;
    const Op& head = n.stream.front();
    if (head.kind == Op::Kind::kCopy || head.kind == Op::Kind::kGroup) return false;
    if (head.sequence != sequence) return false;
  }
  const Op& first = nodes_[0].stream.front();
  for (int r = 1; r < size_; ++r) {
    const Op& other = nodes_[r].stream.front();
    if (!first.SameCollective(other)) {
      FailEverywhere("fake NCCL: collective #" + std::to_string(sequence) + " is '" +
                     first.Describe() + "' on rank 0 but '" + other.Describe() + "' on rank " +
                     std::to_string(r));
      return false;
    }
  }
  std::vector<char> result;
  switch (first.kind) {
    case Op::Kind::kAllReduce: {
      std::vector<const char*> parts;
      for (const Node& n : nodes_) parts.push_back(n.stream.front().src);
      result.resize(first.count * ElementSize(first.type));
      switch (first.type) {
        case ElementType::kFloat32:
          SumInRankOrder<float>(parts, first.count, result.data());
          break;
        case ElementType::kFloat64:
          SumInRankOrder<double>(parts, first.count, result.data());
          break;
        case ElementType::kInt32:
          SumInRankOrder<int32_t>(parts, first.count, result.data());
          break;
        case ElementType::kInt64:
          SumInRankOrder<int64_t>(parts, first.count, result.data());
          break;
      }
      break;
    }
    case Op::Kind::kAllGather:
      result.resize(first.bytes * size_);
      for (int r = 0; r < size_; ++r) {
        if (first.bytes > 0) {
          std::memcpy(result.data() + r * first.bytes, nodes_[r].stream.front().src, first.bytes);
        }
      }
      break;
    case Op::Kind::kBroadcast: {
      const char* src = nodes_[first.root].stream.front().src;
      result.assign(src, src + first.bytes);
      break;
    }
    default:
      return false;
  }
  const std::string description = first.Describe();
  for (Node& n : nodes_) {
    if (!result.empty()) std::memcpy(n.stream.front().dst, result.data(), result.size());
    n.executed.push_back(description);
    n.stream.pop_front();
  }
  return true;
}

bool FakeNcclWorld::TryGroup(int rank, bool* matched) {
  Op& op = nodes_[rank].stream.front();
  for (PointToPoint& mine : op.group) {
    if (mine.done) continue;
    Node& peer = nodes_[mine.peer];
    if (peer.aborted || peer.stream.empty() || peer.stream.front().kind != Op::Kind::kGroup) {
      continue;
    }
    for (PointToPoint& theirs : peer.stream.front().group) {
      if (theirs.done || theirs.peer != rank || theirs.send == mine.send) continue;
      if (theirs.bytes != mine.bytes) {
        const PointToPoint& sender = mine.send ? mine : theirs;
        const PointToPoint& receiver = mine.send ? theirs : mine;
        FailEverywhere("fake NCCL: a send of " + std::to_string(sender.bytes) +
                       " bytes met a recv of " + std::to_string(receiver.bytes) + " bytes");
        return false;
      }
      const PointToPoint& sender = mine.send ? mine : theirs;
      PointToPoint& receiver = mine.send ? theirs : mine;
      if (sender.bytes > 0) std::memmove(receiver.data, sender.data, sender.bytes);
      mine.done = true;
      theirs.done = true;
      *matched = true;
      break;  // the first unmatched partner only: messages between a pair stay in order
    }
  }
  for (const PointToPoint& p2p : op.group) {
    if (!p2p.done) return false;
  }
  nodes_[rank].executed.push_back(op.Describe());
  nodes_[rank].stream.pop_front();
  return true;
}

}  // namespace sparsync::transport
