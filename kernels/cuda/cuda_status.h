#pragma once
// The one place where CUDA runtime errors become kernels/ Status values (docs/style.md §2: each foreign
// error space is converted in exactly one file).

#include <cuda_runtime_api.h>

#include "kernels/status.h"

namespace sparsync::kernels::cuda {

// OK for cudaSuccess; otherwise a Status whose message names `what` and the CUDA error:
//   no device / no driver / driver too old / device unavailable -> FAILED_PRECONDITION,
//   kernels not built for this GPU                              -> FAILED_PRECONDITION,
//   out of device memory                                        -> OUT_OF_RANGE,
//   invalid argument                                            -> INVALID_ARGUMENT,
//   anything else (a kernel fault makes the context unusable)   -> INTERNAL.
Status CudaStatus(cudaError_t error, const char* what);

// Status of the kernel launches just made on this thread (cudaGetLastError), named `what`.
Status LaunchStatus(const char* what);

}  // namespace sparsync::kernels::cuda
