// NcclTransport: the GPU backend of Transport, over the NcclApi seam (nccl_api.h).
//
// Bootstrap: node 0 makes an ncclUniqueId and publishes it, hex-encoded, in the coordinator's
// rendezvous store (RendezvousStore::Set, i.e. the StoreSet RPC); every other node reads it with
// a deadline (StoreGet) and all join one non-blocking communicator.
//
// Data path: two kinds of caller memory.
//   - Host memory (AllReduceSum, AllGatherV, Broadcast, SendRecv): each call stages through
//     pinned host and device buffers that are grown on demand and reused:
//       host span -> pinned -> device (copy on the stream) -> NCCL collective -> device -> pinned
//       -> host span.
//   - Device memory (AllReduceSumOnDevice, when the node's sum is already on the GPU): the
//     collective runs in place on the caller's buffer on CUDA device `options.device`; no staging
//     buffer, no host copy. The caller's writes must be finished (its stream synchronised) before
//     the call; the transport's own stream is a different one.
// Every call is enqueued on the one dedicated stream in call order (NCCL matches operations by
// order, not by tag; the schedule makes every node call in the same order), and the call returns
// only after the stream has drained. Tags appear in error messages only.
//
// Waiting: NCCL gives no blocking wait with a timeout, so the transport polls: the communicator's
// async error slot (ncclCommGetAsyncError) and the stream (cudaStreamQuery), with a backoff from
// 1 us doubling to 1 ms between polls (a short, bounded wait loop, chosen over a blocking
// cudaStreamSynchronize, which could hang forever behind a dead peer). On an async error or once
// the deadline (`timeout` per call) passes, the communicator is aborted (ncclCommAbort), the
// transport fails every later call with that error (sticky), and the error names the operation.
// A dead peer therefore never hangs a node.
//
// Thread-safety: the Transport calls from one thread at a time; Abort() from any thread, at any
// time: it aborts the communicator (or has the thread inside a call do it within ~1 ms), so a
// blocked call returns.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>

#include "daemon/transport/nccl/nccl_api.h"
#include "daemon/transport/transport.h"

namespace sparsync::transport {

struct NcclTransportOptions {
  // Bounds the wait for the unique id, the communicator's initialisation, and every call.
  std::chrono::milliseconds timeout = std::chrono::seconds(300);
  // Where node 0 publishes the unique id. A job that builds several communicators over the same
  // store gives each its own key.
  std::string store_key = "nccl/unique_id";
  // The CUDA device the communicator lives on (cuda_device()); -1: unknown, and
  // AllReduceSumOnDevice fails with kInvalidArgument.
  int device = -1;
};

class NcclTransport : public Transport {
 public:
  // Bootstraps this node's communicator through `store` (see above). On failure the
  // communicator, if started, is aborted. REQUIRES: 0 <= rank < size, store outlives the call.
  static Result<std::unique_ptr<NcclTransport>> Create(std::unique_ptr<NcclApi> api, int rank,
                                                       int size, RendezvousStore* store,
                                                       const NcclTransportOptions& options);
  // Finalises the communicator (aborts it if that does not finish within the timeout).
  ~NcclTransport() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Status AllReduceSum(void* data, size_t count, ElementType type, uint32_t tag) override;
  Status AllGatherV(const void* send, size_t send_bytes, void* recv,
                    std::span<const size_t> recv_bytes, uint32_t tag) override;
  Status Broadcast(void* data, size_t bytes, int root, uint32_t tag) override;
  Status SendRecv(int peer, const void* send, size_t send_bytes, void* recv, size_t recv_capacity,
                  size_t* recv_bytes, uint32_t tag) override;
  void Abort(const Status& reason) override;
  int cuda_device() const override { return options_.device; }
  // REQUIRES: device_data is memory of CUDA device cuda_device() (or nullptr when count is 0).
  Status AllReduceSumOnDevice(void* device_data, size_t count, ElementType type,
                              uint32_t tag) override;

 private:
  // A device buffer and its pinned host mirror, of the same capacity; grows, never shrinks.
  struct Staging {
    void* device = nullptr;
    char* host = nullptr;
    size_t capacity = 0;
  };
  using Clock = std::chrono::steady_clock;
  class CallScope;

  NcclTransport(std::unique_ptr<NcclApi> api, int rank, int size,
                const NcclTransportOptions& options);

  // Marks a call in progress, or returns the sticky error.
  Status EnterCall();
  // Ends it; performs a communicator abort that Abort() requested meanwhile.
  void LeaveCall();
  Status Reserve(Staging* staging, size_t bytes, const std::string& what);
  void Release(Staging* staging);
  // Polls until the last non-blocking NCCL call has its work in the stream (`drain` = false) or
  // the stream has drained (`drain` = true); fails (aborting) on an async error, an Abort() or the
  // deadline.
  Status Await(const std::string& what, Clock::time_point deadline, bool drain);
  // Aborts the communicator, makes `cause` (with `what` as context) the sticky error unless there
  // already is one, and returns the sticky error.
  Status Fail(const std::string& what, const Status& cause);
  // Runs one enqueue call; a failure is fatal to the communicator.
  Status Enqueue(const std::string& what, const Status& st);
  std::string Describe(const char* op, uint32_t tag, size_t bytes) const;

  // Allgather of equal chunks of `chunk` bytes through `staging`, node r's chunk at r * chunk.
  // This node's first `own_bytes` are already at its place in staging->host; afterwards every
  // node's chunk is in staging->host.
  Status GatherChunks(const std::string& what, Clock::time_point deadline, Staging* staging,
                      size_t chunk, size_t own_bytes);
  // One grouped send to and receive from `peer` (either may be empty; both sides agree which).
  Status ExchangeWithPeer(const std::string& what, Clock::time_point deadline, int peer,
                          const void* send, size_t send_bytes, void* recv, size_t recv_bytes);

  const std::unique_ptr<NcclApi> api_;
  const int rank_;
  const int size_;
  const NcclTransportOptions options_;

  Staging data_;     // payloads
  Staging control_;  // size exchanges and SendRecv headers

  std::mutex mu_;
  Status sticky_;              // guarded by mu_
  bool in_call_ = false;       // guarded by mu_
  bool comm_aborted_ = false;  // guarded by mu_
  std::atomic<bool> abort_requested_{false};
};

}  // namespace sparsync::transport
