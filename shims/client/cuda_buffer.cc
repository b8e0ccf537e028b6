#include "shims/client/cuda_buffer.h"

#include <string.h>

namespace sparsync::client {

template <typename F>
bool CudaBuffer::OnDevice(const char* what, std::string* error, F&& call) {
  int previous = 0;
  device::CudaError e = rt_->GetDevice(&previous);
  if (e == device::kCudaSuccess) e = rt_->SetDevice(device_);
  if (e == device::kCudaSuccess) {
    e = call();
    device::CudaError restored = rt_->SetDevice(previous);
    if (e == device::kCudaSuccess) e = restored;
  }
  if (e == device::kCudaSuccess) return true;
  *error = rt_->Describe(e, std::string(what) + " on CUDA device " + std::to_string(device_));
  return false;
}

std::unique_ptr<CudaBuffer> CudaBuffer::Export(std::shared_ptr<const device::CudaRuntime> rt,
                                               int device, void* data, uint64_t bytes,
                                               sparsync_register_msg* msg, std::string* error) {
  if (rt->MemGetAddressRange == nullptr) {
    *error = rt->library + " hands out no cuMemGetAddressRange (CUDA 12.0 or newer is needed)";
    return nullptr;
  }
  std::unique_ptr<CudaBuffer> b(new CudaBuffer(std::move(rt), device));
  const device::CudaRuntime& r = *b->rt_;
  unsigned long long base = 0;
  size_t size = 0;
  device::CudaIpcHandle memory{};
  device::CudaIpcHandle ready{};
  bool ok = b->OnDevice("locating the buffer's allocation", error, [&] {
    int e = r.MemGetAddressRange(&base, &size, reinterpret_cast<uintptr_t>(data));
    return e == 0 ? device::kCudaSuccess : 1;  // cudaErrorInvalidValue: not device memory
  });
  if (!ok) {
    *error += ": the pointer is not CUDA device memory";
    return nullptr;
  }
  const uint64_t offset = reinterpret_cast<uintptr_t>(data) - base;
  if (offset + bytes > size) {
    *error = "the buffer (" + std::to_string(bytes) + " bytes at offset " + std::to_string(offset) +
             ") runs past the end of its CUDA allocation of " + std::to_string(size) + " bytes";
    return nullptr;
  }
  ok = b->OnDevice("cudaIpcGetMemHandle", error, [&] {
    return r.IpcGetMemHandle(&memory, reinterpret_cast<void*>(base));
  }) && b->OnDevice("creating the ready event", error, [&] {
    return r.EventCreateWithFlags(&b->ready_,
                                  device::kCudaEventInterprocess | device::kCudaEventDisableTiming);
  }) && b->OnDevice("cudaIpcGetEventHandle", error, [&] {
    return r.IpcGetEventHandle(&ready, b->ready_);
  });
  if (!ok) return nullptr;
  msg->memory = SPARSYNC_MEMORY_CUDA;
  msg->cuda_device = device;
  msg->cuda_offset = offset;
  memcpy(msg->cuda_memory, &memory, sizeof(memory));
  memcpy(msg->cuda_ready_event, &ready, sizeof(ready));
  return b;
}

CudaBuffer::~CudaBuffer() {
  std::string ignored;
  if (done_ != nullptr)
    OnDevice("cudaEventDestroy", &ignored, [&] { return rt_->EventDestroy(done_); });
  if (ready_ != nullptr) {
    OnDevice("cudaEventDestroy", &ignored, [&] { return rt_->EventDestroy(ready_); });
  }
}

bool CudaBuffer::OpenDone(const uint8_t (&handle)[SPARSYNC_CUDA_IPC_HANDLE_BYTES],
                          std::string* error) {
  device::CudaIpcHandle h;
  memcpy(&h, handle, sizeof(h));
  return OnDevice("opening the daemon's done event", error,
                  [&] { return rt_->IpcOpenEventHandle(&done_, h); });
}

bool CudaBuffer::RecordReady(device::CudaStream stream, std::string* error) {
  return OnDevice("recording the ready event", error,
                  [&] { return rt_->EventRecord(ready_, stream); });
}

bool CudaBuffer::StreamWaitDone(device::CudaStream stream, std::string* error) {
  return OnDevice("waiting for the done event", error,
                  [&] { return rt_->StreamWaitEvent(stream, done_, 0); });
}

}  // namespace sparsync::client
