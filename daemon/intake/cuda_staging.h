// The daemon's end of the CUDA IPC intake (proto/intake/wire.h, memory CUDA).
//
// A worker's CUDA tensor stays in the worker's device buffer; the daemon opens that buffer and
// the worker's "ready" event once, at REGISTER, and stages the bytes through the tensor's memfd
// region so that the rest of the pipeline is the host pipeline:
//   READY: the daemon's stream for the device waits on the ready event, copies device -> staging
//          and is synchronised (CudaTensor::CopyToHost);
//   DONE:  staging -> device on the same stream, then the "done" event is recorded on it; the
//          worker's stream waits on that event (CudaTensor::CopyToDevice).
// TODO(issue 5): reduce on the device (NCCL within the node, GPU sparsifiers) instead of staging
// through host memory; this needs the executor to take device buffers.
//
// The one file of the daemon where CUDA runtime errors become Status values.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "daemon/common/status.h"
#include "proto/intake/cuda_runtime.h"
#include "proto/intake/wire.h"

namespace sparsync::intake {

// One stream per device, shared by every tensor on it.
struct DeviceStream;

// A worker's CUDA tensor as the daemon sees it. Destruction waits for the copies queued for it
// and closes the worker's buffer and events; holders keep it alive while a copy may be queued.
// Thread-safety: CopyToHost and CopyToDevice may run on different threads, never at once for
// one tensor (the intake protocol has one round in flight per tensor).
class CudaTensor {
 public:
  ~CudaTensor();
  CudaTensor(const CudaTensor&) = delete;
  CudaTensor& operator=(const CudaTensor&) = delete;

  // Waits (on the device stream) for the worker's ready event, then copies the tensor into
  // `staging` (bytes() bytes). Blocks until the bytes are there.
  [[nodiscard]] Status CopyToHost(void* staging);
  // Copies bytes() bytes of `staging` into the worker's buffer and records the done event after
  // the copy. Does not wait for the copy; `staging` must stay unchanged until the worker posts
  // the next round (which it does only after waiting on the done event).
  [[nodiscard]] Status CopyToDevice(const void* staging);

  int device() const;
  size_t bytes() const { return bytes_; }

 private:
  friend class CudaStaging;
  CudaTensor(std::shared_ptr<DeviceStream> stream, std::string name, size_t bytes)
      : stream_(std::move(stream)), name_(std::move(name)), bytes_(bytes) {}
  Status Check(CudaError error, const std::string& what) const;

  std::shared_ptr<DeviceStream> stream_;
  const std::string name_;
  const size_t bytes_;
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

  // For a validated REGISTER with memory CUDA of a tensor of `bytes` bytes: opens the worker's
  // buffer and ready event, creates the done event and writes its handle to `done_event`.
  // Errors name the tensor and the CUDA call; a missing runtime says so.
  Result<std::shared_ptr<CudaTensor>> Attach(const sparsync_register_msg& msg, size_t bytes,
                                             uint8_t (&done_event)[SPARSYNC_CUDA_IPC_HANDLE_BYTES]);

 private:
  Result<std::shared_ptr<DeviceStream>> StreamFor(int device, const std::string& name);

  const std::string cudart_;
  std::mutex mu_;
  std::shared_ptr<const CudaRuntime> runtime_;
  std::map<int, std::weak_ptr<DeviceStream>> streams_;
};

}  // namespace sparsync::intake
