// FakeNcclWorld: NCCL's semantics on host memory, with the nodes of one communicator as threads of
// one process, so NcclTransport's multi-node logic is tested without a GPU (docs/style.md §6).
//
// What it models, strictly enough to catch a transport that gets NCCL wrong:
//   - One stream per node, executed in call order. A copy runs when it reaches the head of its
//     stream; the n-th collective of every node runs once it is at the head of *every* node's
//     stream (NCCL matches collectives by order, not by tag); grouped sends/receives run once the
//     matching group is at the head of the peer's stream. A node that never calls therefore
//     stalls the others for good, like a dead peer.
//   - Collectives that differ between nodes (kind, size, type, root) and sends/receives of
//     different sizes become an async error on every node involved (real NCCL would hang or
//     corrupt memory).
//   - Non-blocking calls: with SetEnqueuePolls(n), every collective and GroupEnd stays
//     "in progress" for n CommState() polls before its work enters the stream; any other call
//     meanwhile is a usage error (an async error).
//   - Memory kinds: collectives must use device memory (from AllocDevice, or the caller's from
//     AllocCallerDevice), copies must go between that and pinned memory from AllocPinnedHost;
//     anything else fails the call.
//   - AbortComm drops the node's pending work; the others are not told (they time out).
// Results are summed in rank order, so they are bit-identical on every node.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "daemon/transport/nccl/nccl_api.h"

namespace sparsync::transport {

class FakeNcclWorld : public std::enable_shared_from_this<FakeNcclWorld> {
 public:
  static std::shared_ptr<FakeNcclWorld> Create(int size);

  // One API per node; the node's rank is the one it passes to InitComm.
  std::unique_ptr<NcclApi> NewApi();

  // --- Test controls. ---
  // CommState() of `rank` fails with `message` from now on (like ncclRemoteError).
  void InjectAsyncError(int rank, const std::string& message);
  void SetEnqueuePolls(int polls);
  // Memory on `rank`'s device that the caller owns, not the API (the executor's buffer of a
  // gradient sum): `rank`'s collectives and copies accept it as device memory. Zero-filled; lives
  // as long as the world; not counted in device_allocations().
  void* AllocCallerDevice(int rank, size_t bytes);

  // --- Observations. ---
  int unique_ids_issued() const;
  // The unique id each rank initialised with ("" for a rank that did not).
  std::vector<std::string> init_ids() const;
  // The NCCL operations `rank` completed, in order ("allreduce float32 x10", "allgather 8",
  // "broadcast 100 from 2", "group send 16 to 1, recv 16 from 1").
  std::vector<std::string> executed(int rank) const;
  int abort_calls(int rank) const;
  bool finalized(int rank) const;
  bool destroyed(int rank) const;
  // Device allocations `rank` has made so far (to check that staging buffers are reused).
  int device_allocations(int rank) const;
  // Host<->device copies `rank` has enqueued so far, both directions.
  int copies(int rank) const;
  // Collectives `rank` has issued so far (accepted by the API, whether or not they ran).
  uint64_t collectives_issued(int rank) const;

  class Api;

 private:
  struct PointToPoint {
    bool send = false;
    int peer = 0;
    char* data = nullptr;
    size_t bytes = 0;
    bool done = false;
  };
  struct Op {
    enum class Kind { kCopy, kAllReduce, kAllGather, kBroadcast, kGroup } kind = Kind::kCopy;
    const char* src = nullptr;  // copies; collectives' send buffer
    char* dst = nullptr;        // copies; collectives' receive buffer
    size_t bytes = 0;           // copies, allgather (per rank), broadcast
    size_t count = 0;           // allreduce
    ElementType type = ElementType::kFloat32;
    int root = 0;
    uint64_t sequence = 0;  // collectives: the n-th of this node
    std::vector<PointToPoint> group;
    std::string Describe() const;
    bool SameCollective(const Op& other) const;
  };
  struct Node {
    bool joined = false;
    std::string unique_id;
    std::deque<Op> stream;
    std::optional<Op> enqueuing;  // a non-blocking call not yet in the stream
    int enqueue_polls_left = 0;
    bool in_group = false;
    std::vector<PointToPoint> group;
    uint64_t collectives = 0;
    std::string async_error;
    int abort_calls = 0;
    bool aborted = false;
    bool finalized = false;
    bool destroyed = false;
    int device_allocations = 0;
    int copies = 0;
    std::vector<std::vector<char>> caller_device;  // AllocCallerDevice
    std::vector<std::string> executed;
  };

  explicit FakeNcclWorld(int size);
  // Runs every stream as far as it can go. REQUIRES: mu_ held.
  void Advance();
  bool TryCollective(uint64_t sequence);
  // Matches the sends/receives of the group at the head of `rank`'s stream with its peers'
  // (setting *matched when any moved); true when the whole group is done and popped.
  bool TryGroup(int rank, bool* matched);
  void FailEverywhere(const std::string& message);

  const int size_;
  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::vector<Node> nodes_;
  int unique_ids_issued_ = 0;
  int enqueue_polls_ = 0;
};

}  // namespace sparsync::transport
