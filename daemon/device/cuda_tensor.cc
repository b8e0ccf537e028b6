#include "daemon/device/cuda_tensor.h"

#include <spdlog/spdlog.h>

#include <cstring>

#include "daemon/device/cuda_status.h"

namespace sparsync::device {

struct DeviceStream {
  std::shared_ptr<const CudaRuntime> rt;
  int device = 0;
  CudaStream stream = nullptr;

  ~DeviceStream() {
    if (stream != nullptr && rt->SetDevice(device) == kCudaSuccess) (void)rt->StreamDestroy(stream);
  }
};

namespace {

CudaIpcHandle HandleOf(const uint8_t (&bytes)[SPARSYNC_CUDA_IPC_HANDLE_BYTES]) {
  static_assert(sizeof(CudaIpcHandle) == SPARSYNC_CUDA_IPC_HANDLE_BYTES);
  CudaIpcHandle h;
  std::memcpy(&h, bytes, sizeof(h));
  return h;
}

}  // namespace

CudaTensor::~CudaTensor() {
  const CudaRuntime& rt = *stream_->rt;
  // Copies queued for this tensor read or write the worker's buffer: let them finish first.
  auto warn = [&](CudaError e, const char* what) {
    if (e != kCudaSuccess) spdlog::warn("{}", rt.Describe(e, what + (" of '" + name_ + "'")));
  };
  warn(rt.SetDevice(stream_->device), "cudaSetDevice");
  warn(rt.StreamSynchronize(stream_->stream), "cudaStreamSynchronize");
  if (pinned_) warn(rt.HostUnregister(staging_->data()), "cudaHostUnregister of the staging");
  if (done_ != nullptr) warn(rt.EventDestroy(done_), "cudaEventDestroy (done event)");
  if (ready_ != nullptr) warn(rt.EventDestroy(ready_), "cudaEventDestroy (ready event)");
  if (allocation_ != nullptr) warn(rt.IpcCloseMemHandle(allocation_), "cudaIpcCloseMemHandle");
}

int CudaTensor::device() const { return stream_->device; }

CudaStream CudaTensor::stream() const { return stream_->stream; }

const CudaRuntime& CudaTensor::rt() const { return *stream_->rt; }

std::shared_ptr<const CudaRuntime> CudaTensor::runtime() const { return stream_->rt; }

Status CudaTensor::Check(CudaError error, const std::string& what) const {
  return CudaStatus(
      *stream_->rt, error,
      what + " for tensor '" + name_ + "' on CUDA device " + std::to_string(stream_->device));
}

Status CudaTensor::EnqueueWaitReady() {
  return Check(rt().StreamWaitEvent(stream_->stream, ready_, 0),
               "waiting for the worker's ready event");
}

Status CudaTensor::EnqueueDeviceToHost() {
  if (bytes_ == 0) return Status::Ok();
  return Check(rt().MemcpyAsync(staging_->data(), data_, bytes_, kCudaMemcpyDeviceToHost,
                                stream_->stream),
               "copying the tensor from the device");
}

Status CudaTensor::EnqueueHostToDevice() {
  if (bytes_ == 0) return Status::Ok();
  return Check(rt().MemcpyAsync(data_, staging_->data(), bytes_, kCudaMemcpyHostToDevice,
                                stream_->stream),
               "copying the result to the device");
}

Status CudaTensor::EnqueueRecordDone() {
  return Check(rt().EventRecord(done_, stream_->stream), "recording the done event");
}

Status CudaTensor::EnqueueCopyToHost() {
  SPARSYNC_RETURN_IF_ERROR(Check(rt().SetDevice(stream_->device), "cudaSetDevice"));
  SPARSYNC_RETURN_IF_ERROR(EnqueueWaitReady());
  return EnqueueDeviceToHost();
}

Status CudaTensor::Synchronize() {
  SPARSYNC_RETURN_IF_ERROR(Check(rt().SetDevice(stream_->device), "cudaSetDevice"));
  return Check(rt().StreamSynchronize(stream_->stream), "copying the tensor from the device");
}

Status CudaTensor::CopyToHost() {
  SPARSYNC_RETURN_IF_ERROR(EnqueueCopyToHost());
  return Synchronize();
}

Status CudaTensor::CopyToDevice() {
  SPARSYNC_RETURN_IF_ERROR(Check(rt().SetDevice(stream_->device), "cudaSetDevice"));
  SPARSYNC_RETURN_IF_ERROR(EnqueueHostToDevice());
  return EnqueueRecordDone();
}

Result<std::shared_ptr<DeviceStream>> CudaStaging::StreamFor(int device, const std::string& name) {
  // REQUIRES: mu_ held.
  if (auto live = streams_[device].lock()) return live;
  auto ds = std::make_shared<DeviceStream>();
  ds->rt = runtime_;
  ds->device = device;
  const std::string where = " for tensor '" + name + "' on CUDA device " + std::to_string(device);
  SPARSYNC_RETURN_IF_ERROR(
      CudaStatus(*runtime_, runtime_->SetDevice(device), "cudaSetDevice" + where));
  CudaStream stream = nullptr;
  SPARSYNC_RETURN_IF_ERROR(
      CudaStatus(*runtime_, runtime_->StreamCreateWithFlags(&stream, kCudaStreamNonBlocking),
               "cudaStreamCreateWithFlags" + where));
  ds->stream = stream;
  streams_[device] = ds;
  return ds;
}

Result<std::shared_ptr<CudaTensor>> CudaStaging::Attach(
    const sparsync_register_msg& msg, std::shared_ptr<SharedRegion> staging, size_t bytes,
    uint8_t (&done_event)[SPARSYNC_CUDA_IPC_HANDLE_BYTES]) {
  const std::string name(msg.name, msg.name_len);
  std::shared_ptr<DeviceStream> stream;
  {
    std::lock_guard lock(mu_);
    if (!runtime_) {
      std::string error;
      runtime_ = LoadCudaRuntime(cudart_, &error);
      if (!runtime_) {
        return Unavailable("tensor '" + name + "' is on CUDA device " +
                           std::to_string(msg.cuda_device) +
                           " but the daemon cannot take CUDA tensors: " + error);
      }
      spdlog::info("CUDA IPC intake: using the CUDA runtime {}", runtime_->library);
    }
    SPARSYNC_ASSIGN_OR_RETURN(stream, StreamFor(msg.cuda_device, name));
  }
  const CudaRuntime& rt = *stream->rt;
  // From here on the destructor releases whatever was opened if a later step fails.
  std::shared_ptr<CudaTensor> t(new CudaTensor(stream, name, std::move(staging), bytes));
  SPARSYNC_RETURN_IF_ERROR(t->Check(rt.SetDevice(msg.cuda_device), "cudaSetDevice"));
  SPARSYNC_RETURN_IF_ERROR(t->Check(rt.IpcOpenMemHandle(&t->allocation_, HandleOf(msg.cuda_memory),
                                                        kCudaIpcMemLazyEnablePeerAccess),
                                    "cudaIpcOpenMemHandle of the worker's buffer"));
  if (rt.MemGetAddressRange != nullptr) {
    // A tensor that does not fit the exported allocation would make the copies fault.
    unsigned long long base = 0;
    size_t size = 0;
    if (rt.MemGetAddressRange(&base, &size, reinterpret_cast<uintptr_t>(t->allocation_)) == 0 &&
        msg.cuda_offset + bytes > size) {
      return InvalidArgument("tensor '" + name + "' (" + std::to_string(bytes) +
                             " bytes at offset " + std::to_string(msg.cuda_offset) +
                             ") does not fit the exported CUDA allocation of " +
                             std::to_string(size) + " bytes");
    }
  }
  t->data_ = static_cast<char*>(t->allocation_) + msg.cuda_offset;
  SPARSYNC_RETURN_IF_ERROR(
      t->Check(rt.IpcOpenEventHandle(&t->ready_, HandleOf(msg.cuda_ready_event)),
               "cudaIpcOpenEventHandle of the worker's ready event"));
  SPARSYNC_RETURN_IF_ERROR(
      t->Check(rt.EventCreateWithFlags(&t->done_, kCudaEventInterprocess | kCudaEventDisableTiming),
               "creating the done event"));
  CudaIpcHandle handle;
  SPARSYNC_RETURN_IF_ERROR(
      t->Check(rt.IpcGetEventHandle(&handle, t->done_), "cudaIpcGetEventHandle of the done event"));
  std::memcpy(done_event, &handle, sizeof(handle));
  if (bytes != 0) {
    // Page-locked staging makes the copies asynchronous and about twice as fast. Without it
    // (the memlock limit, say) they still work, from pageable memory.
    CudaError pin = rt.HostRegister(t->staging_->data(), bytes, kCudaHostRegisterPortable);
    t->pinned_ = pin == kCudaSuccess;
    std::lock_guard lock(mu_);
    if (!t->pinned_ && !warned_unpinned_) {
      warned_unpinned_ = true;
      spdlog::warn("{}; CUDA tensors are staged through pageable memory, which is slower",
                   rt.Describe(pin, "cannot page-lock the staging of tensor '" + name + "'"));
    }
  }
  return t;
}

}  // namespace sparsync::device
