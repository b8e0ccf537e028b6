// CudaNcclApi: NcclApi over NCCL (a non-blocking communicator) and the CUDA runtime (one
// non-blocking stream, cudaMalloc'd device buffers, cudaMallocHost'd pinned buffers), both called
// through the tables that daemon/device/ loads at run time. Their results become Status values
// only through the daemon's one conversion of each, NcclStatus and CudaStatus.
//
// Every entry point first makes the bound device current on the calling thread, because the
// transport may be called from any thread and cudaMalloc and NCCL's enqueues use the current
// device.
#include "daemon/transport/nccl/cuda_nccl_api.h"

#include <cstring>
#include <thread>

#include "daemon/device/cuda_status.h"
#include "daemon/device/nccl_library.h"

namespace sparsync::transport {
namespace {

using device::CudaError;
using device::CudaRuntime;
using device::CudaStream;
using device::NcclLibrary;

constexpr int kBytes = device::NcclDataType(DType::kUInt8);  // what moves uninterpreted

Result<int> NcclType(ElementType type) {
  switch (type) {
    case ElementType::kFloat32:
      return device::NcclDataType(DType::kFloat32);
    case ElementType::kFloat64:
      return device::NcclDataType(DType::kFloat64);
    case ElementType::kInt32:
      return device::NcclDataType(DType::kInt32);
    case ElementType::kInt64:
      return device::NcclDataType(DType::kInt64);
  }
  return InvalidArgument("NCCL: unknown element type");
}

// "VAR=value: " when the user named the library, so that the message points at the setting.
std::string Setting(const char* var, const std::string& value) {
  return value.empty() ? std::string() : std::string(var) + "=" + value + ": ";
}

class CudaNcclApi : public NcclApi {
 public:
  CudaNcclApi(std::shared_ptr<const CudaRuntime> rt, std::shared_ptr<const NcclLibrary> nccl,
              int device, CudaStream stream)
      : rt_(std::move(rt)), nccl_(std::move(nccl)), device_(device), stream_(stream) {}

  ~CudaNcclApi() override {
    // The transport finalises or aborts the communicator first; this is the backstop.
    if (comm_ != nullptr) AbortComm();
    (void)rt_->SetDevice(device_);
    (void)rt_->StreamDestroy(stream_);
  }

  Result<std::string> NewUniqueId() override {
    device::NcclUniqueId id{};
    SPARSYNC_RETURN_IF_ERROR(Nccl(nccl_->GetUniqueId(&id), "ncclGetUniqueId"));
    return std::string(id.internal, sizeof(id.internal));
  }

  Status InitComm(const std::string& unique_id, int rank, int size) override {
    device::NcclUniqueId id{};
    if (unique_id.size() != sizeof(id.internal)) {
      return InvalidArgument("an NCCL unique id has " + std::to_string(sizeof(id.internal)) +
                             " bytes, not " + std::to_string(unique_id.size()));
    }
    if (comm_ != nullptr) return Internal("NCCL communicator initialised twice");
    SPARSYNC_RETURN_IF_ERROR(UseDevice());
    std::memcpy(id.internal, unique_id.data(), sizeof(id.internal));
    device::NcclConfig config = nccl_->DefaultConfig();
    config.blocking = 0;  // never block in NCCL: every wait is ours, with a deadline
    config.comm_name = "sparsync";
    return Nccl(nccl_->CommInitRankConfig(&comm_, size, id, rank, &config),
                "ncclCommInitRankConfig");
  }

  Result<NcclCommState> CommState() override {
    if (comm_ == nullptr) {
      return Internal("NCCL communicator used before it was made or after abort");
    }
    int async = device::kNcclSuccess;
    SPARSYNC_RETURN_IF_ERROR(
        Nccl(nccl_->CommGetAsyncError(comm_, &async), "ncclCommGetAsyncError"));
    if (async == device::kNcclInProgress) return NcclCommState::kInProgress;
    SPARSYNC_RETURN_IF_ERROR(Nccl(async, "NCCL communicator failed"));
    return NcclCommState::kReady;
  }

  Status FinalizeComm() override {
    if (comm_ == nullptr) return Internal("NCCL communicator finalised before it was made");
    SPARSYNC_RETURN_IF_ERROR(UseDevice());
    return Nccl(nccl_->CommFinalize(comm_), "ncclCommFinalize");
  }

  void DestroyComm() override {
    if (comm_ == nullptr) return;
    (void)rt_->SetDevice(device_);
    (void)nccl_->CommDestroy(comm_);  // after a finished finalise it only frees local memory
    comm_ = nullptr;
  }

  void AbortComm() override {
    if (comm_ == nullptr) return;
    (void)rt_->SetDevice(device_);
    // Stops NCCL's kernels and frees the communicator; its result says nothing actionable (the
    // communicator is gone either way).
    (void)nccl_->CommAbort(comm_);
    comm_ = nullptr;
  }

  Status AllReduceSum(const void* send, void* recv, size_t count, ElementType type) override {
    SPARSYNC_RETURN_IF_ERROR(UseComm());
    auto nccl_type = NcclType(type);
    if (!nccl_type.ok()) return nccl_type.status();
    return Nccl(nccl_->AllReduce(send, recv, count, *nccl_type, device::kNcclSum, comm_, stream_),
                "ncclAllReduce");
  }

  Status AllGather(const void* send, void* recv, size_t bytes_per_rank) override {
    SPARSYNC_RETURN_IF_ERROR(UseComm());
    return Nccl(nccl_->AllGather(send, recv, bytes_per_rank, kBytes, comm_, stream_),
                "ncclAllGather");
  }

  Status Broadcast(const void* send, void* recv, size_t bytes, int root) override {
    SPARSYNC_RETURN_IF_ERROR(UseComm());
    return Nccl(nccl_->Broadcast(send, recv, bytes, kBytes, root, comm_, stream_), "ncclBroadcast");
  }

  Status GroupStart() override {
    SPARSYNC_RETURN_IF_ERROR(UseComm());
    return Nccl(nccl_->GroupStart(), "ncclGroupStart");
  }

  Status GroupEnd() override {
    // Also after a failed Send/Recv: the group depth is per thread and must be balanced.
    (void)rt_->SetDevice(device_);
    return Nccl(nccl_->GroupEnd(), "ncclGroupEnd");
  }

  Status Send(const void* data, size_t bytes, int peer) override {
    SPARSYNC_RETURN_IF_ERROR(UseComm());
    return Nccl(nccl_->Send(data, bytes, kBytes, peer, comm_, stream_), "ncclSend");
  }

  Status Recv(void* data, size_t bytes, int peer) override {
    SPARSYNC_RETURN_IF_ERROR(UseComm());
    return Nccl(nccl_->Recv(data, bytes, kBytes, peer, comm_, stream_), "ncclRecv");
  }

  Status CopyHostToDevice(void* device_dst, const void* host_src, size_t bytes) override {
    SPARSYNC_RETURN_IF_ERROR(UseDevice());
    return Cuda(
        rt_->MemcpyAsync(device_dst, host_src, bytes, device::kCudaMemcpyHostToDevice, stream_),
        "cudaMemcpyAsync (host to device)");
  }

  Status CopyDeviceToHost(void* host_dst, const void* device_src, size_t bytes) override {
    SPARSYNC_RETURN_IF_ERROR(UseDevice());
    return Cuda(
        rt_->MemcpyAsync(host_dst, device_src, bytes, device::kCudaMemcpyDeviceToHost, stream_),
        "cudaMemcpyAsync (device to host)");
  }

  Result<bool> StreamIdle() override {
    const CudaError err = rt_->StreamQuery(stream_);
    if (err == device::kCudaSuccess) return true;
    if (err == device::kCudaErrorNotReady) return false;
    return Cuda(err, "cudaStreamQuery");
  }

  void Pause(std::chrono::microseconds at_most) override { std::this_thread::sleep_for(at_most); }

  Result<void*> AllocDevice(size_t bytes) override {
    SPARSYNC_RETURN_IF_ERROR(UseDevice());
    void* ptr = nullptr;
    SPARSYNC_RETURN_IF_ERROR(Cuda(rt_->Malloc(&ptr, bytes), "cudaMalloc"));
    return ptr;
  }

  void FreeDevice(void* ptr) override {
    if (ptr == nullptr) return;
    (void)rt_->SetDevice(device_);
    (void)rt_->Free(ptr);
  }

  Result<void*> AllocPinnedHost(size_t bytes) override {
    SPARSYNC_RETURN_IF_ERROR(UseDevice());
    void* ptr = nullptr;
    SPARSYNC_RETURN_IF_ERROR(Cuda(rt_->MallocHost(&ptr, bytes), "cudaMallocHost"));
    return ptr;
  }

  void FreePinnedHost(void* ptr) override {
    if (ptr != nullptr) (void)rt_->FreeHost(ptr);
  }

 private:
  Status Cuda(CudaError err, const char* what) const {
    return device::CudaStatus(*rt_, err, what, device_);
  }
  Status Nccl(int result, const char* what) const {
    return device::NcclStatus(*nccl_, result, what, comm_);
  }
  Status UseDevice() { return Cuda(rt_->SetDevice(device_), "cudaSetDevice"); }
  Status UseComm() {
    if (comm_ == nullptr) {
      return Internal("NCCL communicator used before it was made or after abort");
    }
    return UseDevice();
  }

  const std::shared_ptr<const CudaRuntime> rt_;
  const std::shared_ptr<const NcclLibrary> nccl_;
  const int device_;
  const CudaStream stream_;
  device::NcclComm comm_ = nullptr;
};

// The runtime's devices, or why there are none.
Result<int> Devices(const CudaRuntime& rt) {
  int count = 0;
  const CudaError err = rt.GetDeviceCount(&count);
  if (err != device::kCudaSuccess) {
    (void)rt.GetLastError();  // clear it, so that later, unrelated checks do not see it
    return device::CudaStatus(rt, err, "no CUDA device (cudaGetDeviceCount of " + rt.library + ")");
  }
  if (count <= 0) return Unavailable("no CUDA device (" + rt.library + " sees none)");
  return count;
}

}  // namespace

Result<std::unique_ptr<NcclApi>> CreateCudaNcclApi(int cuda_device,
                                                   const NcclLibraries& libraries) {
  std::string error;
  auto rt = device::LoadCudaRuntime(libraries.cudart, &error);
  if (rt == nullptr) return Unavailable(Setting("SPARSYNC_CUDART", libraries.cudart) + error);
  auto count = Devices(*rt);
  if (!count.ok()) return count.status();
  auto nccl = device::LoadNccl(libraries.libnccl, &error);
  if (nccl == nullptr) {
    return Unavailable(libraries.libnccl.empty()
                           ? error +
                                 "; install NCCL 2.14 or later, or point SPARSYNC_LIBNCCL at "
                                 "its libnccl.so.2"
                           : Setting("SPARSYNC_LIBNCCL", libraries.libnccl) + error);
  }
  if (cuda_device < 0 || cuda_device >= *count) {
    return InvalidArgument("CUDA device " + std::to_string(cuda_device) +
                           " does not exist (this process sees " + std::to_string(*count) +
                           "; check CUDA_VISIBLE_DEVICES)");
  }
  SPARSYNC_RETURN_IF_ERROR(
      device::CudaStatus(*rt, rt->SetDevice(cuda_device), "cudaSetDevice", cuda_device));
  CudaStream stream = nullptr;
  SPARSYNC_RETURN_IF_ERROR(
      device::CudaStatus(*rt, rt->StreamCreateWithFlags(&stream, device::kCudaStreamNonBlocking),
                         "creating the NCCL transport's CUDA stream", cuda_device));
  return std::unique_ptr<NcclApi>(
      new CudaNcclApi(std::move(rt), std::move(nccl), cuda_device, stream));
}

int CudaDeviceCount(const NcclLibraries& libraries) {
  std::string error;
  auto rt = device::LoadCudaRuntime(libraries.cudart, &error);
  if (rt == nullptr) return 0;
  auto count = Devices(*rt);
  return count.ok() ? *count : 0;
}

}  // namespace sparsync::transport
