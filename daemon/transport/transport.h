// Transport: moves bytes between the nodes of a job (one participant per node). Knows nothing of
// tensors, sparsity or protobuf (docs/style.md §4).
//
// Contract: every node calls the same collectives in the same order with the same tags (the
// schedule guarantees it); each call blocks until its result is in place or fails with a Status
// (never throws, never hangs past the transport's timeout). Collectives are called from one thread
// at a time; Abort() may be called from any thread while one is in progress.
// Results are bit-identical on every node.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>
#include <chrono>

#include "daemon/common/status.h"

namespace sparsync::transport {

enum class ElementType { kFloat32, kFloat64, kInt32, kInt64 };
size_t ElementSize(ElementType type);

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In place: data[i] = sum over nodes of data[i].
  virtual Status AllReduceSum(void* data, size_t count, ElementType type, uint32_t tag) = 0;
  // recv = concatenation of every node's send, in node order; recv_bytes[n] is node n's size.
  // REQUIRES: recv_bytes.size() == size(), recv_bytes[rank()] == send_bytes.
  virtual Status AllGatherV(const void* send, size_t send_bytes, void* recv,
                            std::span<const size_t> recv_bytes, uint32_t tag) = 0;
  // In place: every node's data becomes node `root`'s.
  virtual Status Broadcast(void* data, size_t bytes, int root, uint32_t tag) = 0;
  // Pairwise exchange, not a collective: this node and `peer` each call SendRecv with the other
  // as `peer` and the same `tag` (pairs of one schedule in the same order). Each side sends its
  // `send_bytes` (sizes may differ, 0 included) and receives the peer's bytes into `recv`,
  // setting *recv_bytes. The byte counts and capacities are exchanged first, so if either side's
  // bytes exceed the other's `recv_capacity` BOTH sides fail with kMismatch and no payload moves
  // (the pair stays usable). `peer == rank()` copies send to recv.
  virtual Status SendRecv(int peer, const void* send, size_t send_bytes, void* recv,
                          size_t recv_capacity, size_t* recv_bytes, uint32_t tag) = 0;
  // Fails every later call with `reason`; idempotent.
  virtual void Abort(const Status& reason) = 0;

  // --- Device memory (the NCCL backend). ---
  // The CUDA device whose memory AllReduceSumOnDevice takes, or -1: this backend takes host
  // memory only (the default).
  virtual int cuda_device() const { return -1; }
  // AllReduceSum on memory of CUDA device cuda_device(), with no staging through the host. The
  // caller has finished every write to `device_data` (its stream synchronised) before the call;
  // the sum is in place when the call returns. Same ordering, deadlines and aborts as the other
  // collectives. Fails with kInvalidArgument on a backend whose cuda_device() is -1.
  virtual Status AllReduceSumOnDevice(void* device_data, size_t count, ElementType type,
                                      uint32_t tag);
};

// The rendezvous key-value store a backend bootstraps through (served by the coordinator).
class RendezvousStore {
 public:
  virtual ~RendezvousStore() = default;
  virtual Status Set(const std::string& key, const std::string& value) = 0;
  virtual Result<std::vector<std::string>> Get(const std::vector<std::string>& keys,
                                               std::chrono::milliseconds timeout) = 0;
};

}  // namespace sparsync::transport
