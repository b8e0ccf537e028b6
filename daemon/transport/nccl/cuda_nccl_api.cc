// CudaNcclApi: NcclApi over NCCL (a non-blocking communicator) and the CUDA runtime (one
// non-blocking stream, cudaMalloc'd device buffers, cudaMallocHost'd pinned buffers).
//
// The one file that converts ncclResult_t and cudaError_t to Status (docs/style.md §2). Every entry
// point first makes the bound device current on the calling thread, because the transport may be
// called from any thread and cudaMalloc and NCCL's enqueues use the current device.
#include "daemon/transport/nccl/cuda_nccl_api.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstring>
#include <thread>

namespace sparsync::transport {
namespace {

Status CudaStatus(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  std::string message =
      std::string(what) + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver ||
      err == cudaErrorInvalidDevice) {
    return Unavailable(message);
  }
  if (err == cudaErrorMemoryAllocation) return Unavailable(message + "; the GPU is out of memory");
  return Internal(message);
}

// ncclInProgress counts as success: on a non-blocking communicator it means "accepted, still
// being enqueued", which the caller follows through CommState().
Status NcclStatus(ncclResult_t result, const char* what, ncclComm_t comm) {
  if (result == ncclSuccess || result == ncclInProgress) return Status::Ok();
  std::string message = std::string(what) + ": " + ncclGetErrorString(result);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && last[0] != '\0') message += " (" + std::string(last) + ")";
  switch (result) {
    case ncclRemoteError:
      return Unavailable(message + "; a peer node failed or left");
    case ncclSystemError:
      return Unavailable(message +
                         "; a network or system call failed (check NCCL_SOCKET_IFNAME "
                         "and that the nodes can reach each other)");
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return InvalidArgument(message);
    default:
      return Internal(message);
  }
}

Result<ncclDataType_t> NcclType(ElementType type) {
  switch (type) {
    case ElementType::kFloat32:
      return ncclFloat32;
    case ElementType::kFloat64:
      return ncclFloat64;
    case ElementType::kInt32:
      return ncclInt32;
    case ElementType::kInt64:
      return ncclInt64;
  }
  return InvalidArgument("NCCL: unknown element type");
}

class CudaNcclApi : public NcclApi {
 public:
  CudaNcclApi(int device, cudaStream_t stream) : device_(device), stream_(stream) {}

  ~CudaNcclApi() override {
    // The transport finalises or aborts the communicator first; this is the backstop.
    if (comm_ != nullptr) AbortComm();
    (void)cudaSetDevice(device_);
    (void)cudaStreamDestroy(stream_);
  }

  Result<std::string> NewUniqueId() override {
    ncclUniqueId id;
    SPARSYNC_RETURN_IF_ERROR(NcclStatus(ncclGetUniqueId(&id), "ncclGetUniqueId", nullptr));
    return std::string(id.internal, sizeof(id.internal));
  }

  Status InitComm(const std::string& unique_id, int rank, int size) override {
    if (unique_id.size() != sizeof(ncclUniqueId)) {
      return InvalidArgument("an NCCL unique id has " + std::to_string(sizeof(ncclUniqueId)) +
                             " bytes, not " + std::to_string(unique_id.size()));
    }
    if (comm_ != nullptr) return Internal("NCCL communicator initialised twice");
    SPARSYNC_RETURN_IF_ERROR(UseDevice());
    ncclUniqueId id;
    std::memcpy(id.internal, unique_id.data(), sizeof(id.internal));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // never block in NCCL: every wait is ours, with a deadline
    config.commName = "sparsync";
    return NcclStatus(ncclCommInitRankConfig(&comm_, size, id, rank, &config),
                      "ncclCommInitRankConfig", comm_);
  }

  Result<NcclCommState> CommState() override {
    if (comm_ == nullptr)
      return Internal("NCCL communicator used before it was made or after abort");
    ncclResult_t async = ncclSuccess;
    SPARSYNC_RETURN_IF_ERROR(
        NcclStatus(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError", comm_));
    if (async == ncclInProgress) return NcclCommState::kInProgress;
    SPARSYNC_RETURN_IF_ERROR(NcclStatus(async, "NCCL communicator failed", comm_));
    return NcclCommState::kReady;
  }

  Status FinalizeComm() override {
    if (comm_ == nullptr) return Internal("NCCL communicator finalised before it was made");
    SPARSYNC_RETURN_IF_ERROR(UseDevice());
    return NcclStatus(ncclCommFinalize(comm_), "ncclCommFinalize", comm_);
  }

  void DestroyComm() override {
    if (comm_ == nullptr) return;
    (void)cudaSetDevice(device_);
    (void)ncclCommDestroy(comm_);  // after a finished finalise it only frees local memory
    comm_ = nullptr;
  }

  void AbortComm() override {
    if (comm_ == nullptr) return;
    (void)cudaSetDevice(device_);
    // Stops NCCL's kernels and frees the communicator; its result says nothing actionable (the
    // communicator is gone either way).
    (void)ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  Status AllReduceSum(const void* send, void* recv, size_t count, ElementType type) override {
    SPARSYNC_RETURN_IF_ERROR(UseComm());
    auto nccl_type = NcclType(type);
    if (!nccl_type.ok()) return nccl_type.status();
    return NcclStatus(ncclAllReduce(send, recv, count, *nccl_type, ncclSum, comm_, stream_),
                      "ncclAllReduce", comm_);
  }

  Status AllGather(const void* send, void* recv, size_t bytes_per_rank) override {
    SPARSYNC_RETURN_IF_ERROR(UseComm());
    return NcclStatus(ncclAllGather(send, recv, bytes_per_rank, ncclUint8, comm_, stream_),
                      "ncclAllGather", comm_);
  }

  Status Broadcast(const void* send, void* recv, size_t bytes, int root) override {
    SPARSYNC_RETURN_IF_ERROR(UseComm());
    return NcclStatus(ncclBroadcast(send, recv, bytes, ncclUint8, root, comm_, stream_),
                      "ncclBroadcast", comm_);
  }

  Status GroupStart() override {
    SPARSYNC_RETURN_IF_ERROR(UseComm());
    return NcclStatus(ncclGroupStart(), "ncclGroupStart", comm_);
  }

  Status GroupEnd() override {
    // Also after a failed Send/Recv: the group depth is per thread and must be balanced.
    (void)cudaSetDevice(device_);
    return NcclStatus(ncclGroupEnd(), "ncclGroupEnd", comm_);
  }

  Status Send(const void* data, size_t bytes, int peer) override {
    SPARSYNC_RETURN_IF_ERROR(UseComm());
    return NcclStatus(ncclSend(data, bytes, ncclUint8, peer, comm_, stream_), "ncclSend", comm_);
  }

  Status Recv(void* data, size_t bytes, int peer) override {
    SPARSYNC_RETURN_IF_ERROR(UseComm());
    return NcclStatus(ncclRecv(data, bytes, ncclUint8, peer, comm_, stream_), "ncclRecv", comm_);
  }

  Status CopyHostToDevice(void* device_dst, const void* host_src, size_t bytes) override {
    SPARSYNC_RETURN_IF_ERROR(UseDevice());
    return CudaStatus(cudaMemcpyAsync(device_dst, host_src, bytes, cudaMemcpyHostToDevice, stream_),
                      "cudaMemcpyAsync (host to device)");
  }

  Status CopyDeviceToHost(void* host_dst, const void* device_src, size_t bytes) override {
    SPARSYNC_RETURN_IF_ERROR(UseDevice());
    return CudaStatus(cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDeviceToHost, stream_),
                      "cudaMemcpyAsync (device to host)");
  }

  Result<bool> StreamIdle() override {
    const cudaError_t err = cudaStreamQuery(stream_);
    if (err == cudaSuccess) return true;
    if (err == cudaErrorNotReady) return false;
    return CudaStatus(err, "cudaStreamQuery");
  }

  void Pause(std::chrono::microseconds at_most) override { std::this_thread::sleep_for(at_most); }

  Result<void*> AllocDevice(size_t bytes) override {
    SPARSYNC_RETURN_IF_ERROR(UseDevice());
    void* ptr = nullptr;
    SPARSYNC_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&ptr, bytes), "cudaMalloc"));
    return ptr;
  }

  void FreeDevice(void* ptr) override {
    if (ptr == nullptr) return;
    (void)cudaSetDevice(device_);
    (void)cudaFree(ptr);
  }

  Result<void*> AllocPinnedHost(size_t bytes) override {
    SPARSYNC_RETURN_IF_ERROR(UseDevice());
    void* ptr = nullptr;
    SPARSYNC_RETURN_IF_ERROR(CudaStatus(cudaMallocHost(&ptr, bytes), "cudaMallocHost"));
    return ptr;
  }

  void FreePinnedHost(void* ptr) override {
    if (ptr != nullptr) (void)cudaFreeHost(ptr);
  }

 private:
  Status UseDevice() { return CudaStatus(cudaSetDevice(device_), "cudaSetDevice"); }
  Status UseComm() {
    if (comm_ == nullptr)
      return Internal("NCCL communicator used before it was made or after abort");
    return UseDevice();
  }

  const int device_;
  cudaStream_t stream_;
  ncclComm_t comm_ = nullptr;
};

}  // namespace

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the error so later calls do not see it
    return 0;
  }
  return count;
}

Result<std::unique_ptr<NcclApi>> CreateCudaNcclApi(int device) {
  int count = 0;
  SPARSYNC_RETURN_IF_ERROR(CudaStatus(cudaGetDeviceCount(&count), "looking for CUDA devices"));
  if (device < 0 || device >= count) {
    return InvalidArgument("CUDA device " + std::to_string(device) +
                           " does not exist (this "
                           "process sees " +
                           std::to_string(count) +
                           "; check SPARSYNC_DEVICE "
                           "and CUDA_VISIBLE_DEVICES)");
  }
  SPARSYNC_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), "cudaSetDevice"));
  cudaStream_t stream = nullptr;
  SPARSYNC_RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                                      "creating the NCCL transport's CUDA stream"));
  return std::unique_ptr<NcclApi>(new CudaNcclApi(device, stream));
}

}  // namespace sparsync::transport
