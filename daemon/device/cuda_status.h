// CudaStatus: the daemon's one conversion of CUDA runtime errors into Status values (docs/style.md
// §2). Every call into the CUDA runtime that can fail goes through it, so every CUDA error a
// user sees says what was being done, on which device, and the runtime's own words for it.
#pragma once

#include <string>

#include "daemon/common/status.h"
#include "daemon/device/cuda_runtime.h"

namespace sparsync::device {

// OK for kCudaSuccess; otherwise "what: cudaErrorX (text)" with a code that says whether trying
// again elsewhere could help: kUnavailable for a missing or unusable device or driver and for
// an exhausted GPU memory, kInternal for the rest.
Status CudaStatus(const CudaRuntime& rt, CudaError error, const std::string& what);

// CudaStatus with "what on CUDA device N".
Status CudaStatus(const CudaRuntime& rt, CudaError error, const std::string& what, int device);

}  // namespace sparsync::device
