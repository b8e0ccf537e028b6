// GlooTransport: the CPU backend, Gloo's TCP transport with its ring allreduce, allgatherv and
// broadcast, and unbound-buffer send/recv for pairwise exchanges. Gloo's exceptions are caught
// here and nowhere else.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "daemon/transport/transport.h"

namespace gloo {
class Context;
}

namespace sparsync::transport {

class GlooTransport : public Transport {
 public:
  // Connects a full mesh of `size` nodes through `store`. `listen` is this node's address for
  // its peers; `timeout` bounds the rendezvous and every collective.
  static Result<std::unique_ptr<GlooTransport>> Create(int rank, int size,
                                                       const std::string& listen,
                                                       RendezvousStore* store,
                                                       std::chrono::milliseconds timeout);
  ~GlooTransport() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Status AllReduceSum(void* data, size_t count, ElementType type, uint32_t tag) override;
  Status AllGatherV(const void* send, size_t send_bytes, void* recv,
                    std::span<const size_t> recv_bytes, uint32_t tag) override;
  Status Broadcast(void* data, size_t bytes, int root, uint32_t tag) override;
  Status SendRecv(int peer, const void* send, size_t send_bytes, void* recv, size_t recv_capacity,
                  size_t* recv_bytes, uint32_t tag) override;
  void Abort(const Status& reason) override;

 private:
  GlooTransport(int rank, int size, std::shared_ptr<gloo::Context> context);
  Status Guard(const char* what);

  int rank_;
  int size_;
  std::shared_ptr<gloo::Context> context_;
  std::mutex mu_;
  Status aborted_;  // guarded by mu_
};

}  // namespace sparsync::transport
