// The real NcclApi: NCCL and the CUDA runtime. cuda_nccl_api.cc is compiled only when CMake finds
// both; without them create_nccl_transport_stub.cc defines these functions (CreateCudaNcclApi
// fails with kUnavailable, CudaDeviceCount is 0). This header has no CUDA types, so code using it
// (the factory; tests that need device memory) builds everywhere with a plain C++ compiler.
#pragma once

#include <memory>

#include "daemon/common/status.h"
#include "daemon/transport/nccl/nccl_api.h"

namespace sparsync::transport {

// Binds CUDA device `device` (its own non-blocking stream; the communicator is made later by
// InitComm). Fails with kUnavailable when there is no usable CUDA device or driver.
Result<std::unique_ptr<NcclApi>> CreateCudaNcclApi(int device);

// The number of CUDA devices this process can use; 0 when there is none or no driver.
int CudaDeviceCount();

}  // namespace sparsync::transport
