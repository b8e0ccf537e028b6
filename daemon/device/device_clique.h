// DeviceClique and LocalNccl: sum one node's CUDA tensors across the node's GPUs with NCCL,
// inside the daemon,
// so that only the node's sum is copied to the host and crosses the network (DESIGN, "local
// reduce"). The workers of a node that train on different GPUs register the same tensor from
// each GPU (CUDA IPC intake, cuda_tensor.h); the daemon holds one NCCL communicator per device
// in one clique (ncclCommInitAll) and, for each round:
//
//   ReduceToHost       every device's stream waits for its worker's ready event; ncclReduce
//                      sums every part into local rank 0's buffer, in place; that sum is copied
//                      to rank 0's host staging.
//   BroadcastFromHost  the node's result goes from rank 0's staging to its buffer, ncclBroadcast
//                      copies it to every other part, and each part's done event is recorded.
//
// Local rank 0's buffer therefore holds the node's sum between the two; its worker does not read
// it before DONE. NCCL is loaded at run time (SPARSYNC_LIBNCCL, else libnccl.so.2), like the CUDA
// runtime, so a CPU-only build and a machine without NCCL are unaffected: without it, or with
// two workers on one GPU, the node's sum is taken on the host as before.
//
// Thread-safety: LocalNccl is thread-safe. A clique's calls are serialised by its mutex, so every
// communicator sees the same collectives in the same order (NCCL deadlocks otherwise); all its
// work goes to the per-device streams of the CUDA intake, one per device, in that order too.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "daemon/common/status.h"
#include "daemon/common/tensor_meta.h"
#include "daemon/device/cuda_tensor.h"
#include "daemon/device/nccl_library.h"

namespace sparsync::device {

// One communicator per device of the node's workers, rank r on local rank r's device.
class DeviceClique {
 public:
  ~DeviceClique();
  DeviceClique(const DeviceClique&) = delete;
  DeviceClique& operator=(const DeviceClique&) = delete;

  // `parts`: one tensor per local rank, on the clique's devices in order, alike in size.
  // Sums every part into parts[0]'s buffer, after each worker's ready event; queued on the
  // devices' streams, does not block.
  [[nodiscard]] Status ReduceOnDevice(std::span<CudaTensor* const> parts, DType dtype);
  // ReduceOnDevice, then copies the sum to parts[0]'s staging. Blocks until it is there.
  [[nodiscard]] Status ReduceToHost(std::span<CudaTensor* const> parts, DType dtype);
  // parts[0]'s buffer to every other part, then every part's done event. Does not block: the
  // workers' streams wait on the done events.
  [[nodiscard]] Status BroadcastFromDevice(std::span<CudaTensor* const> parts, DType dtype);
  // parts[0]'s staging to its buffer, then BroadcastFromDevice.
  [[nodiscard]] Status BroadcastFromHost(std::span<CudaTensor* const> parts, DType dtype);

  const std::vector<int>& devices() const { return devices_; }

 private:
  friend class LocalNccl;
  DeviceClique(std::shared_ptr<const NcclLibrary> nccl, std::vector<int> devices)
      : nccl_(std::move(nccl)), devices_(std::move(devices)) {}
  Status Check(int result, const std::string& what, const std::string& tensor) const;
  // REQUIRES: mu_ held. The collective `call` (ncclReduce or ncclBroadcast) on every device,
  // in one NCCL group.
  template <typename Call>
  Status Group(const char* name, const std::string& tensor, Call call);
  // `step` on each part's stream, with that part's device current.
  template <typename Step>
  Status ForEachDevice(std::span<CudaTensor* const> parts, Step step);

  const std::shared_ptr<const NcclLibrary> nccl_;
  const std::vector<int> devices_;
  std::vector<void*> comms_;  // ncclComm_t, by rank
  std::mutex mu_;
};

class LocalNccl {
 public:
  // `library`: SPARSYNC_LIBNCCL (empty: libnccl.so.2). `enabled`: SPARSYNC_LOCAL_REDUCE=auto.
  LocalNccl(std::string library, bool enabled);

  // When SPARSYNC_LIBNCCL names a file: loads it now, so that a wrong setting stops the daemon
  // at start rather than quietly summing on the host. OK otherwise.
  Status LoadExplicit();

  // The clique for `parts` (one per local rank) when the node's sum can be taken on the GPUs:
  // enabled, more than one part, each on a device of its own, and NCCL at hand (the caller
  // checks the op and SummedOnDevice). Null otherwise. The first time NCCL cannot be loaded or a
  // clique cannot be made, the log says why, and those devices are summed on the host from then
  // on.
  std::shared_ptr<DeviceClique> CliqueFor(std::span<CudaTensor* const> parts);

 private:
  // REQUIRES: mu_ held.
  bool Load();

  const std::string library_;
  const bool enabled_;
  std::mutex mu_;
  std::shared_ptr<const NcclLibrary> nccl_;
  bool load_failed_ = false;
  bool warned_shared_device_ = false;
  std::map<std::vector<int>, std::shared_ptr<DeviceClique>> cliques_;  // null: failed to make
};

}  // namespace sparsync::device
