// CudaRuntime: the CUDA runtime functions sparsync needs, resolved at run time with dlopen/dlsym:
// the project's one binding of the CUDA runtime. The daemon's device path (daemon/device/), its
// NCCL transport (daemon/transport/nccl/) and the client library (shims/client/cuda_buffer.h,
// which compiles this file on its own: it has no other dependency than libdl) use it; none links
// libcudart, so a CPU-only build and a CPU-only machine are unaffected, and a process that
// already loaded the runtime (PyTorch) shares it. CUDA errors become Status values in one place
// of the daemon, cuda_status.h.
//
// The types below mirror cuda_runtime_api.h so that this header builds without the CUDA toolkit;
// cuda_runtime_check.cc holds them against the real header wherever the toolkit is installed.
// Tests load a fake runtime with the same symbols (tests/support/fake_cudart/).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace sparsync::device {

using CudaError = int;     // cudaError_t
using CudaStream = void*;  // cudaStream_t; nullptr is the legacy default stream
using CudaEvent = void*;   // cudaEvent_t
struct CudaIpcHandle {     // cudaIpcMemHandle_t and cudaIpcEventHandle_t
  char reserved[64];
};

inline constexpr CudaError kCudaSuccess = 0;
inline constexpr CudaError kCudaErrorMemoryAllocation = 2;    // cudaErrorMemoryAllocation
inline constexpr CudaError kCudaErrorInsufficientDriver = 35;  // cudaErrorInsufficientDriver
inline constexpr CudaError kCudaErrorNoDevice = 100;           // cudaErrorNoDevice
inline constexpr CudaError kCudaErrorInvalidDevice = 101;      // cudaErrorInvalidDevice
inline constexpr CudaError kCudaErrorNotReady = 600;           // cudaErrorNotReady
inline constexpr unsigned kCudaEventDisableTiming = 0x02;          // cudaEventDisableTiming
inline constexpr unsigned kCudaEventInterprocess = 0x04;           // cudaEventInterprocess
inline constexpr unsigned kCudaIpcMemLazyEnablePeerAccess = 0x01;  // cudaIpcMemLazyEnablePeerAccess
inline constexpr unsigned kCudaStreamNonBlocking = 0x01;           // cudaStreamNonBlocking
inline constexpr int kCudaMemcpyHostToDevice = 1;                  // cudaMemcpyHostToDevice
inline constexpr int kCudaMemcpyDeviceToHost = 2;                  // cudaMemcpyDeviceToHost
inline constexpr int kCudaMemcpyDeviceToDevice = 3;                // cudaMemcpyDeviceToDevice
inline constexpr unsigned long long kCudaEnableDefault = 0;        // cudaEnableDefault
inline constexpr unsigned kCudaHostRegisterPortable = 0x01;        // cudaHostRegisterPortable

struct CudaRuntime {
  std::string library;  // the file the functions came from, for messages

  CudaError (*GetDeviceCount)(int* count);
  CudaError (*SetDevice)(int device);
  CudaError (*GetDevice)(int* device);
  // Returns the calling thread's last error and resets it, so that a failed probe (no device)
  // is not reported again by a later, unrelated check.
  CudaError (*GetLastError)();
  CudaError (*IpcGetMemHandle)(CudaIpcHandle* handle, void* allocation_base);
  CudaError (*IpcOpenMemHandle)(void** allocation_base, CudaIpcHandle handle, unsigned flags);
  CudaError (*IpcCloseMemHandle)(void* allocation_base);
  CudaError (*EventCreateWithFlags)(CudaEvent* event, unsigned flags);
  CudaError (*EventDestroy)(CudaEvent event);
  CudaError (*IpcGetEventHandle)(CudaIpcHandle* handle, CudaEvent event);
  CudaError (*IpcOpenEventHandle)(CudaEvent* event, CudaIpcHandle handle);
  CudaError (*EventRecord)(CudaEvent event, CudaStream stream);
  CudaError (*EventSynchronize)(CudaEvent event);
  CudaError (*StreamCreateWithFlags)(CudaStream* stream, unsigned flags);
  CudaError (*StreamDestroy)(CudaStream stream);
  CudaError (*StreamWaitEvent)(CudaStream stream, CudaEvent event, unsigned flags);
  CudaError (*StreamSynchronize)(CudaStream stream);
  // kCudaSuccess once the stream has drained, kCudaErrorNotReady while work is pending.
  CudaError (*StreamQuery)(CudaStream stream);
  CudaError (*MemcpyAsync)(void* dst, const void* src, size_t bytes, int kind, CudaStream stream);
  // The daemon's own device buffers (the device reduce paths).
  CudaError (*Malloc)(void** ptr, size_t bytes);
  CudaError (*Free)(void* ptr);
  CudaError (*MemsetAsync)(void* ptr, int value, size_t bytes, CudaStream stream);
  // Page-locks host memory so that copies to and from it run at full speed, asynchronously.
  CudaError (*HostRegister)(void* ptr, size_t bytes, unsigned flags);
  CudaError (*HostUnregister)(void* ptr);
  // Page-locked host memory of the runtime's own (the NCCL transport's staging).
  CudaError (*MallocHost)(void** ptr, size_t bytes);
  CudaError (*FreeHost)(void* ptr);
  const char* (*GetErrorName)(CudaError error);
  const char* (*GetErrorString)(CudaError error);
  // The driver's cuMemGetAddressRange (CUresult, 0 on success): the base and size of the
  // allocation holding `ptr`. Null when the runtime cannot hand out driver entry points; only
  // the exporting side (the client) needs it.
  int (*MemGetAddressRange)(unsigned long long* base, size_t* size, unsigned long long ptr);

  // "what: cudaErrorInvalidValue (invalid argument)".
  std::string Describe(CudaError error, const std::string& what) const;
};

// Loads the CUDA runtime. `explicit_path` non-empty (SPARSYNC_CUDART): that file only, so a
// wrong setting is an error rather than a silent fallback. Otherwise the first of
// libcudart.so.13, libcudart.so.12, libcudart.so, preferring one the process has loaded already.
// On failure returns null and sets *error to a message naming what was tried. Thread-safe; the
// library stays loaded for the life of the process (the CUDA runtime does not support unloading).
std::shared_ptr<const CudaRuntime> LoadCudaRuntime(const std::string& explicit_path,
                                                   std::string* error);

}  // namespace sparsync::device
