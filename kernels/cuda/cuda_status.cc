#include "kernels/cuda/cuda_status.h"

#include <string>

namespace sparsync::kernels::cuda {

Status CudaStatus(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return Status::Ok();
  const std::string message =
      std::string(what) + ": " + cudaGetErrorName(error) + " (" + cudaGetErrorString(error) + ")";
  switch (error) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
    case cudaErrorDevicesUnavailable:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorSystemNotReady:
    case cudaErrorCompatNotSupportedOnDevice:
      return FailedPreconditionError(message + "; no usable CUDA device");
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
    case cudaErrorInvalidPtx:
      return FailedPreconditionError(message +
                                     "; the kernels were not built for this GPU: reconfigure with "
                                     "-DSPARSYNC_CUDA_ARCHITECTURES=<its compute capability>-real");
    case cudaErrorMemoryAllocation:
      return OutOfRangeError(message + "; device memory exhausted");
    case cudaErrorInvalidValue:
      return InvalidArgumentError(message);
    default:
      return InternalError(message);
  }
}

Status LaunchStatus(const char* what) { return CudaStatus(cudaGetLastError(), what); }

}  // namespace sparsync::kernels::cuda
