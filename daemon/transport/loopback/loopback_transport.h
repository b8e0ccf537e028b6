// LoopbackTransport: ranks as threads of one process, for tests (docs/style.md §6). Results are
// combined in rank order, so they are bit-identical on every rank like the real backends'.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "daemon/transport/transport.h"

namespace sparsync::transport {

// Shared by the ranks of one in-process cluster.
class LoopbackHub {
 public:
  explicit LoopbackHub(int size, std::chrono::milliseconds timeout = std::chrono::seconds(30));
  int size() const { return size_; }

  // Deposits this rank's bytes for operation `tag`, waits for every rank's, calls
  // `combine(all contributions in rank order)`, then waits until every rank has combined.
  Status Exchange(int rank, uint32_t tag, std::vector<char> contribution,
                  const std::function<void(const std::vector<std::vector<char>>&)>& combine);
  // One point-to-point message: the sender's bytes and its own receive capacity (so both sides
  // of a SendRecv can check both directions).
  struct Message {
    size_t capacity = 0;
    std::vector<char> bytes;
  };
  // Queues `message` from `from` to `to` under `tag`; never blocks.
  Status Post(int from, int to, uint32_t tag, Message message);
  // Waits (up to the timeout) for the oldest message from `from` to `to` under `tag`.
  Status Take(int from, int to, uint32_t tag, Message* message);
  void Abort(const Status& reason);

 private:
  struct Op {
    std::vector<std::vector<char>> parts;
    int arrived = 0;
    int departed = 0;
  };
  const int size_;
  const std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint32_t, Op> ops_;
  std::map<std::tuple<int, int, uint32_t>, std::deque<Message>> mailboxes_;  // (from, to, tag)
  Status aborted_;
};

class LoopbackTransport : public Transport {
 public:
  LoopbackTransport(std::shared_ptr<LoopbackHub> hub, int rank) : hub_(std::move(hub)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return hub_->size(); }
  Status AllReduceSum(void* data, size_t count, ElementType type, uint32_t tag) override;
  Status AllGatherV(const void* send, size_t send_bytes, void* recv,
                    std::span<const size_t> recv_bytes, uint32_t tag) override;
  Status Broadcast(void* data, size_t bytes, int root, uint32_t tag) override;
  Status SendRecv(int peer, const void* send, size_t send_bytes, void* recv, size_t recv_capacity,
                  size_t* recv_bytes, uint32_t tag) override;
  void Abort(const Status& reason) override { hub_->Abort(reason); }

 private:
  std::shared_ptr<LoopbackHub> hub_;
  int rank_;
};

}  // namespace sparsync::transport
