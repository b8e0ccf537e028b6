// Holds the mirror types of cuda_runtime.h against the real cuda_runtime_api.h. Compiled only
// where the CUDA toolkit's headers are found; it produces no code.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <type_traits>

#include "daemon/device/cuda_runtime.h"

namespace sparsync::device {
namespace {

static_assert(sizeof(cudaError_t) == sizeof(CudaError) && kCudaSuccess == cudaSuccess);
static_assert(kCudaErrorMemoryAllocation == cudaErrorMemoryAllocation &&
              kCudaErrorInsufficientDriver == cudaErrorInsufficientDriver &&
              kCudaErrorNoDevice == cudaErrorNoDevice &&
              kCudaErrorInvalidDevice == cudaErrorInvalidDevice &&
              kCudaErrorNotReady == cudaErrorNotReady);
static_assert(std::is_same_v<cudaStream_t, CUstream_st*> &&
              sizeof(cudaStream_t) == sizeof(CudaStream));
static_assert(sizeof(cudaEvent_t) == sizeof(CudaEvent));
static_assert(sizeof(cudaIpcMemHandle_t) == sizeof(CudaIpcHandle) &&
              alignof(cudaIpcMemHandle_t) == alignof(CudaIpcHandle));
static_assert(sizeof(cudaIpcEventHandle_t) == sizeof(CudaIpcHandle) &&
              alignof(cudaIpcEventHandle_t) == alignof(CudaIpcHandle));
static_assert(kCudaEventDisableTiming == cudaEventDisableTiming);
static_assert(kCudaEventInterprocess == cudaEventInterprocess);
static_assert(kCudaIpcMemLazyEnablePeerAccess == cudaIpcMemLazyEnablePeerAccess);
static_assert(kCudaStreamNonBlocking == cudaStreamNonBlocking);
static_assert(kCudaMemcpyHostToDevice == cudaMemcpyHostToDevice);
static_assert(kCudaMemcpyDeviceToHost == cudaMemcpyDeviceToHost);
static_assert(kCudaMemcpyDeviceToDevice == cudaMemcpyDeviceToDevice);
static_assert(kCudaEnableDefault == cudaEnableDefault);
static_assert(kCudaHostRegisterPortable == cudaHostRegisterPortable);
static_assert(sizeof(cudaMemcpyKind) == sizeof(int) && sizeof(CUresult) == sizeof(int));
static_assert(sizeof(CUdeviceptr) == sizeof(unsigned long long));
static_assert(sizeof(cudaDriverEntryPointQueryResult) == sizeof(int));

}  // namespace
}  // namespace sparsync::device
