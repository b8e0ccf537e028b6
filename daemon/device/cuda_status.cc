#include "daemon/device/cuda_status.h"

namespace sparsync::device {

Status CudaStatus(const CudaRuntime& rt, CudaError error, const std::string& what) {
  if (error == kCudaSuccess) return Status::Ok();
  const std::string message = rt.Describe(error, what);
  switch (error) {
    case kCudaErrorNoDevice:
      return Unavailable(message + "; this machine has no usable CUDA device");
    case kCudaErrorInsufficientDriver:
      return Unavailable(message + "; the NVIDIA driver is missing or older than " + rt.library);
    case kCudaErrorInvalidDevice:
      return Unavailable(message + "; check CUDA_VISIBLE_DEVICES");
    case kCudaErrorMemoryAllocation:
      return Unavailable(message + "; the GPU is out of memory");
    default:
      return Internal(message);
  }
}

Status CudaStatus(const CudaRuntime& rt, CudaError error, const std::string& what, int device) {
  if (error == kCudaSuccess) return Status::Ok();
  return CudaStatus(rt, error, what + " on CUDA device " + std::to_string(device));
}

}  // namespace sparsync::device
