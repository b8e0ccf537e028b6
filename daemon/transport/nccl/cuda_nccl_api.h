// The real NcclApi: NCCL and the CUDA runtime. Compiled only when CMake finds both; this header
// has no CUDA types so that code using it builds with a plain C++ compiler.
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
