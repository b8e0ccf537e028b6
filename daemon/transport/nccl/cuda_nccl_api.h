// The real NcclApi: NCCL and the CUDA runtime, both loaded at run time through the daemon's one
// binding of each (daemon/device/nccl_library.h, daemon/device/cuda_runtime.h). It builds
// everywhere, with no CUDA or NCCL at build time; on a machine without them creating it fails
// with a message that names the library that did not load, or says that there is no CUDA device.
#pragma once

#include <memory>
#include <string>

#include "daemon/common/status.h"
#include "daemon/transport/nccl/nccl_api.h"

namespace sparsync::transport {

// The libraries to load, as SPARSYNC_CUDART and SPARSYNC_LIBNCCL give them ("": the default
// search of LoadCudaRuntime, and libnccl.so.2). The daemon passes the ones its device intake and
// local reduce load, so that the process has one CUDA runtime and one NCCL.
struct NcclLibraries {
  std::string cudart;
  std::string libnccl;
};

// Binds CUDA device `device` (its own non-blocking stream; the communicator is made later by
// InitComm). Fails with kUnavailable when a library does not load or there is no CUDA device,
// and with kInvalidArgument when `device` is not one of this process's devices.
Result<std::unique_ptr<NcclApi>> CreateCudaNcclApi(int device, const NcclLibraries& libraries);

// The number of CUDA devices this process can use: 0 when the CUDA runtime does not load or
// there is no device or driver.
int CudaDeviceCount(const NcclLibraries& libraries);

}  // namespace sparsync::transport
