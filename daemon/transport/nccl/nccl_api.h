// NcclApi: the seam between the NCCL transport's logic and NCCL + the CUDA runtime.
//
// One object per node: it owns one communicator, one dedicated CUDA stream and the device and
// pinned host memory the transport stages through. NcclTransport (nccl_transport.h) drives it;
// CUDA-free code can therefore test the multi-node logic (ordering, size exchange, deadlines,
// aborts) against a fake that runs the nodes as threads on host memory
// (tests/unit/daemon/transport/nccl_fake_api.h). The real implementation (cuda_nccl_api.cc) calls
// NCCL and the CUDA runtime through the daemon's run-time bindings (daemon/device/), whose
// NcclStatus and CudaStatus turn their errors into Status values.
//
// Semantics mirror a *non-blocking* NCCL communicator (ncclConfig_t::blocking = 0):
//   - InitComm, FinalizeComm, the collectives and GroupEnd may return before their work is in
//     the stream. CommState() reports kInProgress until it is; until then the caller must make no
//     other call except CommState, Pause and AbortComm.
//   - Everything else is enqueued on the one stream and runs in call order; StreamIdle() says
//     whether the stream has drained. Nothing here blocks on a peer, so every wait stays in the
//     caller's hands and can have a deadline.
//
// Thread-safety: none; the caller serialises every call (NcclTransport does).
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

#include "daemon/common/status.h"
#include "daemon/transport/transport.h"

namespace sparsync::transport {

enum class NcclCommState {
  kReady,       // initialised, and every call so far has its work in the stream
  kInProgress,  // initialisation or the last non-blocking call has not finished enqueuing
};

class NcclApi {
 public:
  virtual ~NcclApi() = default;

  // --- The communicator. ---
  // A fresh ncclUniqueId, as opaque bytes (node 0 makes one and publishes it).
  virtual Result<std::string> NewUniqueId() = 0;
  // Starts joining communicator `unique_id` as `rank` of `size`; completion through CommState.
  virtual Status InitComm(const std::string& unique_id, int rank, int size) = 0;
  // ncclCommGetAsyncError: an error Status once the communicator has failed (a peer vanished, a
  // network error, a CUDA error in NCCL's kernels); the error is sticky.
  virtual Result<NcclCommState> CommState() = 0;
  // Orderly teardown: FinalizeComm, then CommState until kReady, then DestroyComm.
  virtual Status FinalizeComm() = 0;
  virtual void DestroyComm() = 0;
  // ncclCommAbort: stops the communicator's kernels and frees it; the stream drains. After it only
  // the memory functions may be called. Safe in any state, also before InitComm.
  virtual void AbortComm() = 0;

  // --- Work on the stream. Pointers are device memory from AllocDevice unless named host. ---
  // recv[i] = sum over ranks of send[i]; send == recv is in place.
  virtual Status AllReduceSum(const void* send, void* recv, size_t count, ElementType type) = 0;
  // recv = every rank's `bytes_per_rank` bytes of send, in rank order. In place when
  // send == recv + rank * bytes_per_rank.
  virtual Status AllGather(const void* send, void* recv, size_t bytes_per_rank) = 0;
  // recv = root's send on every rank; send == recv is in place (send is read on the root only).
  virtual Status Broadcast(const void* send, void* recv, size_t bytes, int root) = 0;
  // Point-to-point, between GroupStart and GroupEnd so that a pair can send and receive at once.
  // The k-th Send from a to b matches the k-th Recv on b from a, with the same byte count.
  virtual Status GroupStart() = 0;
  virtual Status GroupEnd() = 0;
  virtual Status Send(const void* data, size_t bytes, int peer) = 0;
  virtual Status Recv(void* data, size_t bytes, int peer) = 0;
  // Asynchronous copies between pinned host memory (AllocPinnedHost) and device memory.
  virtual Status CopyHostToDevice(void* device_dst, const void* host_src, size_t bytes) = 0;
  virtual Status CopyDeviceToHost(void* host_dst, const void* device_src, size_t bytes) = 0;
  // cudaStreamQuery: true once everything enqueued so far has finished.
  virtual Result<bool> StreamIdle() = 0;

  // Waits up to `at_most` before the caller polls again (the real API sleeps; the fake wakes
  // early when its nodes make progress).
  virtual void Pause(std::chrono::microseconds at_most) = 0;

  // --- Memory. Free functions accept what Alloc returned, and nullptr. ---
  virtual Result<void*> AllocDevice(size_t bytes) = 0;
  virtual void FreeDevice(void* ptr) = 0;
  virtual Result<void*> AllocPinnedHost(size_t bytes) = 0;
  virtual void FreePinnedHost(void* ptr) = 0;
};

}  // namespace sparsync::transport
