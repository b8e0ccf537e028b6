#include "daemon/device/device_buffers.h"

#include <vector>

#include "daemon/device/cuda_status.h"

namespace sparsync::device {

template <typename T>
Status Grow(const CudaRuntime& rt, int device, T** buffer, size_t count, const char* what) {
  if (*buffer != nullptr) (void)rt.Free(*buffer);
  *buffer = nullptr;
  void* p = nullptr;
  SPARSYNC_RETURN_IF_ERROR(CudaStatus(rt, rt.Malloc(&p, count * sizeof(T)),
                                      std::string("cudaMalloc of ") + what, device));
  *buffer = static_cast<T*>(p);
  return Status::Ok();
}
template Status Grow<float>(const CudaRuntime&, int, float**, size_t, const char*);
template Status Grow<int32_t>(const CudaRuntime&, int, int32_t**, size_t, const char*);
template Status Grow<uint16_t>(const CudaRuntime&, int, uint16_t**, size_t, const char*);

DeviceScratch::~DeviceScratch() { Clear(); }

void DeviceScratch::Clear() {
  if (rt) {
    (void)rt->SetDevice(device);
    if (workspace != nullptr) lib->WorkspaceDestroy(workspace);
    for (void* p :
         {static_cast<void*>(group), static_cast<void*>(residual), static_cast<void*>(indices),
          static_cast<void*>(values), static_cast<void*>(halves)}) {
      if (p != nullptr) (void)rt->Free(p);
    }
  }
  lib = nullptr;
  rt = nullptr;
  device = -1;
  workspace = nullptr;
  workspace_numel = workspace_k = 0;
  group = residual = values = nullptr;
  indices = nullptr;
  halves = nullptr;
  group_capacity = residual_capacity = pairs_capacity = halves_capacity = 0;
}

Status DeviceScratch::Bind(const std::shared_ptr<const SparsifyLibrary>& l,
                           const std::shared_ptr<const CudaRuntime>& r, int d, size_t n) {
  if (device != d || lib != l) {
    Clear();
    lib = l;
    rt = r;
    device = d;
  }
  if (group_capacity < n) {
    group_capacity = 0;
    SPARSYNC_RETURN_IF_ERROR(Grow(*rt, device, &group, n, "the group buffer"));
    group_capacity = n;
  }
  return Status::Ok();
}

Result<std::unique_ptr<CudaResidual>> CudaResidual::Allocate(std::shared_ptr<const CudaRuntime> rt,
                                                             int device, size_t count,
                                                             const std::string& name) {
  std::unique_ptr<CudaResidual> r(new CudaResidual(std::move(rt), device, count, name));
  SPARSYNC_RETURN_IF_ERROR(Grow(*r->rt_, device, &r->data_, count, "a residual"));
  return r;
}

CudaResidual::~CudaResidual() {
  if (data_ != nullptr && rt_->SetDevice(device_) == kCudaSuccess) (void)rt_->Free(data_);
}

Status CudaResidual::AddToHost(std::span<float> host) const {
  std::vector<float> v(count_);
  const CudaRuntime& rt = *rt_;
  SPARSYNC_RETURN_IF_ERROR(CudaStatus(rt, rt.SetDevice(device_), "cudaSetDevice", device_));
  SPARSYNC_RETURN_IF_ERROR(CudaStatus(rt,
                                      rt.MemcpyAsync(v.data(), data_, count_ * sizeof(float),
                                                     kCudaMemcpyDeviceToHost, nullptr),
                                      "copying the residual of '" + name_ + "' to the host",
                                      device_));
  SPARSYNC_RETURN_IF_ERROR(
      CudaStatus(rt, rt.StreamSynchronize(nullptr), "cudaStreamSynchronize", device_));
  for (size_t i = 0; i < count_ && i < host.size(); ++i) host[i] += v[i];
  return Status::Ok();
}

}  // namespace sparsync::device
