// CountingTransport: a Transport that counts the payload bytes this node hands to another one and
// receives from the others, for the metrics (metrics.h), and passes every call through. Counted
// is the collective's payload as this node sees it, not what its algorithm puts on the wire (a
// ring allreduce of B bytes sends and receives about 2(P-1)/P * B at each node):
//   AllReduceSum, AllReduceSumOnDevice  B sent, B received
//   AllGatherV                          this node's part sent, the other nodes' parts received
//   Broadcast                           B sent by the root, B received by every other node
//   SendRecv                            what was sent, what was received (nothing with itself)
// A failed call counts nothing. Same contract as the wrapped transport (transport.h).
#pragma once

#include <atomic>
#include <cstdint>

#include "daemon/transport/transport.h"

namespace sparsync::observe {

class CountingTransport : public transport::Transport {
 public:
  // `inner` outlives this object.
  explicit CountingTransport(transport::Transport* inner) : inner_(inner) {}

  uint64_t sent_bytes() const { return sent_.load(std::memory_order_relaxed); }
  uint64_t received_bytes() const { return received_.load(std::memory_order_relaxed); }

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  Status AllReduceSum(void* data, size_t count, transport::ElementType type,
                      uint32_t tag) override;
  Status AllGatherV(const void* send, size_t send_bytes, void* recv,
                    std::span<const size_t> recv_bytes, uint32_t tag) override;
  Status Broadcast(void* data, size_t bytes, int root, uint32_t tag) override;
  Status SendRecv(int peer, const void* send, size_t send_bytes, void* recv, size_t recv_capacity,
                  size_t* recv_bytes, uint32_t tag) override;
  void Abort(const Status& reason) override { inner_->Abort(reason); }
  int cuda_device() const override { return inner_->cuda_device(); }
  Status AllReduceSumOnDevice(void* device_data, size_t count, transport::ElementType type,
                              uint32_t tag) override;

 private:
  void Count(uint64_t sent, uint64_t received);

  transport::Transport* const inner_;
  std::atomic<uint64_t> sent_{0};
  std::atomic<uint64_t> received_{0};
};

}  // namespace sparsync::observe
