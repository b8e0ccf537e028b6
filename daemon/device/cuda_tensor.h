// CudaTensor and CudaStaging: the daemon's end of the CUDA IPC intake (proto/intake/wire.h,
// memory CUDA).
//
// A worker's CUDA tensor stays in the worker's device buffer; the daemon opens that buffer and
// the worker's "ready" event once, at REGISTER, together with the tensor's memfd region, which it
// page-locks (cudaHostRegister) and uses as the tensor's host staging:
//   ready: the daemon's stream for the device waits on the ready event and copies device ->
//          staging (CudaTensor::CopyToHost), on the staging thread (device_intake.h), not on the
//          intake thread; with several GPUs in the node the tensors are first summed on the
//          devices (device_clique.h) and only the sum is copied;
//   done:  staging -> device on the same stream, then the "done" event is recorded on it; the
//          worker's stream waits on that event (CudaTensor::CopyToDevice).
// Groups that the daemon reduces on the device (device_topk_path.h, device_dense_path.h) skip
// the copy to the host: the node's sum stays in local rank 0's buffer.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "daemon/common/status.h"
#include "daemon/device/cuda_runtime.h"
#include "daemon/intake/shared_region.h"
#include "proto/intake/wire.h"

namespace sparsync::device {

using intake::SharedRegion;

// One stream per device, shared by every tensor on it.
struct DeviceStream;

// A worker's CUDA tensor as the daemon sees it, with its host staging (the tensor's memfd
// region). Destruction waits for the copies queued for it, unpins the staging and closes the
// worker's buffer and events; holders keep it alive while a copy may be queued.
// Thread-safety: CopyToHost and CopyToDevice may run on different threads, never at once for
// one tensor (the intake protocol has one round in flight per tensor).
class CudaTensor {
 public:
  ~CudaTensor();
  CudaTensor(const CudaTensor&) = delete;
  CudaTensor& operator=(const CudaTensor&) = delete;

  // Waits (on the device stream) for the worker's ready event, then copies the tensor into the
  // staging. Blocks until the bytes are there.
  [[nodiscard]] Status CopyToHost();
  // CopyToHost in two halves, so that the copies of tensors on different devices overlap:
  // queues the wait and the copy; Synchronize waits for them.
  [[nodiscard]] Status EnqueueCopyToHost();
  [[nodiscard]] Status Synchronize();
  // Copies the staging into the worker's buffer and records the done event after the copy.
  // Does not wait for the copy; the staging must stay unchanged until the worker posts the next
  // round (which it does only after waiting on the done event).
  [[nodiscard]] Status CopyToDevice();

  int device() const;
  size_t bytes() const { return bytes_; }
  const std::string& name() const { return name_; }
  bool pinned() const { return pinned_; }

  // For work on the worker's buffer itself (the device reduce paths):
  // the buffer, the device's stream (work queued there is ordered with this tensor's copies)
  // and the runtime. Callers make device() current first.
  void* data() const { return data_; }
  CudaStream stream() const;
  const CudaRuntime& rt() const;
  std::shared_ptr<const CudaRuntime> runtime() const;
  Status Check(CudaError error, const std::string& what) const;
  // The stream waits for the worker's ready event / records the done event after everything
  // queued so far. REQUIRES: the current device is device().
  Status EnqueueWaitReady();
  Status EnqueueRecordDone();

 private:
  friend class CudaStaging;
  friend class DeviceClique;
  CudaTensor(std::shared_ptr<DeviceStream> stream, std::string name,
             std::shared_ptr<SharedRegion> staging, size_t bytes)
      : stream_(std::move(stream)),
        name_(std::move(name)),
        staging_(std::move(staging)),
        bytes_(bytes) {}
  // The halves of the copies above, each queued on the stream, for DeviceClique's collectives
  // to go between. REQUIRES: the current device is device().
  Status EnqueueDeviceToHost();  // buffer -> staging
  Status EnqueueHostToDevice();  // staging -> buffer

  std::shared_ptr<DeviceStream> stream_;
  const std::string name_;
  const std::shared_ptr<SharedRegion> staging_;
  const size_t bytes_;
  bool pinned_ = false;         // staging_ is page-locked (cudaHostRegister)
  void* allocation_ = nullptr;  // the worker's allocation, opened with cudaIpcOpenMemHandle
  char* data_ = nullptr;        // allocation_ + the tensor's offset
  CudaEvent ready_ = nullptr;   // the worker's, opened with cudaIpcOpenEventHandle
  CudaEvent done_ = nullptr;    // ours, exported to the worker
};

// Loads the CUDA runtime on first use and owns the per-device streams. Thread-safe.
class CudaStaging {
 public:
  // `cudart`: SPARSYNC_CUDART (empty: the default search of LoadCudaRuntime).
  explicit CudaStaging(std::string cudart) : cudart_(std::move(cudart)) {}

  // For a validated REGISTER with memory CUDA of a tensor of `bytes` bytes staged in `staging`:
  // opens the worker's buffer and ready event, pins the staging (if that fails the staging stays
  // pageable, with a warning), creates the done event and writes its handle to `done_event`.
  // Errors name the tensor and the CUDA call; a missing runtime says so.
  Result<std::shared_ptr<CudaTensor>> Attach(const sparsync_register_msg& msg,
                                             std::shared_ptr<SharedRegion> staging, size_t bytes,
                                             uint8_t (&done_event)[SPARSYNC_CUDA_IPC_HANDLE_BYTES]);

 private:
  Result<std::shared_ptr<DeviceStream>> StreamFor(int device, const std::string& name);

  const std::string cudart_;
  std::mutex mu_;
  std::shared_ptr<const CudaRuntime> runtime_;
  std::map<int, std::weak_ptr<DeviceStream>> streams_;
  bool warned_unpinned_ = false;
};

}  // namespace sparsync::device
