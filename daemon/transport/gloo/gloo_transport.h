// GlooTransport: the CPU backend, Gloo's TCP transport with its ring allreduce, allgatherv and
// broadcast, and unbound-buffer send/recv for pairwise exchanges. Gloo's exceptions are caught
// here and nowhere else.
//
// Errors name the node (issue 16, D4): Gloo's text names a pair by its peer's address
// ("Read error [10.0.0.3]:41234: Connection reset by peer"), which is mapped back to the node's
// rank. Since a peer also closes its side when the job failed elsewhere, a broken connection is
// reported only after a short wait for Abort with the job's reason, which then wins.
// Abort closes every pair: the peers' collectives with this node fail at once, and when they
// abort in turn, a collective of this node blocked on them ends too, not at the timeout (D9).
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "daemon/transport/transport.h"

namespace gloo {
class Context;
}

namespace sparsync::transport {

class GlooTransport : public Transport {
 public:
  // Connects a full mesh of `size` nodes through `store`. `listen` is this node's address for
  // its peers; `timeout` bounds the rendezvous and every collective. `unnamed_wait`: how long a
  // broken connection whose error names no node (peers sharing a host) waits for the job's
  // reason before it is reported as its own; the daemon makes it outlast the coordinator's
  // liveness window, whose verdict is what names a lost node then.
  static Result<std::unique_ptr<GlooTransport>> Create(
      int rank, int size, const std::string& listen, RendezvousStore* store,
      std::chrono::milliseconds timeout,
      std::chrono::milliseconds unnamed_wait = std::chrono::seconds(5));
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
  GlooTransport(int rank, int size, std::shared_ptr<gloo::Context> context,
                std::vector<std::string> peer_hosts, std::vector<std::string> own_pairs,
                std::vector<std::string> peer_pairs, std::vector<int> connections,
                std::chrono::milliseconds unnamed_wait);
  Status Guard(const char* what);
  // A collective threw: the job's reason if Abort brings one within the grace period, else
  // Gloo's error naming the node whose connection broke; the transport is aborted either way.
  // `in_flight` holds the operation's unbound buffers, kept until the transport goes: when a
  // connection breaks, Gloo's device thread signals the buffers of every pending operation on
  // that pair, and Gloo 0.0~git20220518 does not stop it from signalling a buffer the failed
  // collective has already destroyed (a use after free ThreadSanitizer caught). The destructor
  // closes the pairs, which waits for that thread, before it frees them.
  Status Failed(const std::string& what, const std::exception& e,
                std::shared_ptr<void> in_flight);
  // The peer whose node an error's "[host]:port" names, or -1 (neither a peer's pair nor a host
  // that only one peer listens on).
  int NamedPeer(const std::string& gloo_error) const;
  std::string Describe(const std::string& what, const std::string& gloo_error) const;

  int rank_;
  int size_;
  std::shared_ptr<gloo::Context> context_;
  std::vector<std::string> peer_hosts_;  // by rank: where that node listens (SPARSYNC_LISTEN)
  std::vector<std::string> own_pairs_;   // by rank: where this node's pair toward it listens
  std::vector<std::string> peer_pairs_;  // by rank: where that node's pair toward this one listens
  // Duplicates of this node's Gloo sockets, taken at Create: Abort shuts them down, which fails
  // what waits on them here and on the peers (Gloo's own descriptors are out of reach).
  const std::vector<int> connections_;
  const std::chrono::milliseconds unnamed_wait_;
  std::mutex mu_;
  std::condition_variable aborted_cv_;
  Status aborted_;  // guarded by mu_
  std::vector<std::shared_ptr<void>> failed_in_flight_;  // guarded by mu_; see Failed
};

}  // namespace sparsync::transport
