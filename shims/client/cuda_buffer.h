// CudaBuffer: the worker's end of a CUDA tensor in the CUDA IPC intake (proto/intake/wire.h).
// Exports the device buffer (cudaIpcGetMemHandle of its allocation plus the offset), creates the
// interprocess "ready" event the worker records before READY, and opens the daemon's "done"
// event that the worker's stream waits on after DONE.
//
// Every call restores the calling thread's current CUDA device (a framework relies on it).
// Thread-safety: none; the client serialises calls under its lock.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "daemon/device/cuda_runtime.h"
#include "proto/intake/wire.h"

namespace sparsync::client {

class CudaBuffer {
 public:
  // Exports `bytes` bytes at `data` on `device` into the CUDA fields of `msg` (memory, device,
  // offset, handles). On failure returns null and sets *error.
  static std::unique_ptr<CudaBuffer> Export(std::shared_ptr<const device::CudaRuntime> rt,
                                            int device, void* data, uint64_t bytes,
                                            sparsync_register_msg* msg, std::string* error);
  ~CudaBuffer();
  CudaBuffer(const CudaBuffer&) = delete;
  CudaBuffer& operator=(const CudaBuffer&) = delete;

  // Opens the daemon's done event from REGISTER_REPLY. False (and *error) on failure.
  bool OpenDone(const uint8_t (&handle)[SPARSYNC_CUDA_IPC_HANDLE_BYTES], std::string* error);
  // Records the ready event on `stream` (after the work that wrote the buffer).
  bool RecordReady(device::CudaStream stream, std::string* error);
  // Makes `stream` wait for the done event (before anything reads the buffer).
  bool StreamWaitDone(device::CudaStream stream, std::string* error);

 private:
  CudaBuffer(std::shared_ptr<const device::CudaRuntime> rt, int device)
      : rt_(std::move(rt)), device_(device) {}
  // Runs `call` with device_ current; false with *error naming `what` on a CUDA error.
  template <typename F>
  bool OnDevice(const char* what, std::string* error, F&& call);

  std::shared_ptr<const device::CudaRuntime> rt_;
  const int device_;
  device::CudaEvent ready_ = nullptr;
  device::CudaEvent done_ = nullptr;
};

}  // namespace sparsync::client
