// DeviceIntake: what the daemon does with its workers' CUDA tensors before the network sees
// them. At REGISTER it attaches the worker's device buffer (cuda_tensor.h); when a round becomes
// locally ready it forms the node's sum on the staging thread, off the intake thread:
//
//   several GPUs, a type NCCL sums like the host   ncclReduce into local rank 0's buffer
//                                                  (device_clique.h), then either left there or
//                                                  copied to rank 0's host staging;
//   otherwise                                      each part copied to its host staging (or,
//                                                  one part only, left in its buffer).
//
// The sum stays on the device when a device reduce path wants tensors like it (the
// `keep_on_device` predicate the composition root builds from the paths): the executor then
// reduces it there, and only what that path sends crosses PCIe.
//
// Thread-safety: Attach runs on the intake thread, FormNodeSum's work and its callback on the
// staging thread; both may run at once.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "daemon/common/status.h"
#include "daemon/common/tensor_meta.h"
#include "daemon/device/cuda_tensor.h"
#include "daemon/device/device_clique.h"
#include "daemon/device/staging_thread.h"

namespace sparsync::device {

struct DeviceIntakeOptions {
  std::string cudart;      // SPARSYNC_CUDART; empty: the default search
  bool local_nccl = true;  // SPARSYNC_LOCAL_REDUCE=auto
  std::string libnccl;     // SPARSYNC_LIBNCCL; empty: libnccl.so.2
  // Whether a float32 reduction whose parts are all on GPUs keeps its node sum there (for a
  // device reduce path); called on the staging thread. Null: never.
  std::function<bool(const TensorMeta&)> keep_on_device;
};

// Where FormNodeSum left the node's sum.
struct NodeSumOnDevice {
  bool on_device = false;                // in parts[0]'s device buffer, else in host staging
  std::shared_ptr<DeviceClique> clique;  // non-null: summed across the node's GPUs with it
};

class DeviceIntake {
 public:
  explicit DeviceIntake(DeviceIntakeOptions options);

  // Loads now what the options name explicitly (SPARSYNC_LIBNCCL), so that a wrong setting
  // stops the daemon at start.
  Status LoadExplicitLibraries();

  // CudaStaging::Attach (cuda_tensor.h).
  Result<std::shared_ptr<CudaTensor>> Attach(const sparsync_register_msg& msg,
                                             std::shared_ptr<intake::SharedRegion> staging,
                                             size_t bytes,
                                             uint8_t (&done_event)[SPARSYNC_CUDA_IPC_HANDLE_BYTES]);

  using SummedFn = std::function<void(const Status&, NodeSumOnDevice)>;
  // Forms the node's sum of a locally ready round of `meta` whose parts (one per local rank,
  // null for a host part) are given, on the staging thread, then calls `done` there. A CUDA
  // error comes to `done` as its status.
  void FormNodeSum(const TensorMeta& meta, std::vector<std::shared_ptr<CudaTensor>> parts,
                   SummedFn done);

 private:
  NodeSumOnDevice Sum(const TensorMeta& meta, std::span<CudaTensor* const> parts, Status* st);

  CudaStaging staging_;
  LocalNccl local_nccl_;
  const std::function<bool(const TensorMeta&)> keep_on_device_;
  StagingThread thread_;  // last: its jobs use everything above
};

}  // namespace sparsync::device
