// CreateNcclTransport: the NCCL backend's entry point for the composition root
// (SPARSYNC_TRANSPORT=nccl). Built everywhere: NCCL and the CUDA runtime are loaded when it is
// called, so a machine without them gets a clear error then, not a build without the backend.
#pragma once

#include <chrono>
#include <memory>

#include "daemon/common/status.h"
#include "daemon/transport/nccl/cuda_nccl_api.h"
#include "daemon/transport/transport.h"

namespace sparsync::transport {

// Joins the job's NCCL communicator as node `rank` of `size` on CUDA device `device` (the
// transport's cuda_device(): AllReduceSumOnDevice takes that device's memory), bootstrapping
// through `store` (node 0 publishes the ncclUniqueId). `timeout` bounds the bootstrap and every
// later call. `libraries`: the CUDA runtime and NCCL to load (SPARSYNC_CUDART, SPARSYNC_LIBNCCL).
// Fails with kUnavailable when one of them does not load (the message names it) or the machine
// has no usable CUDA device.
Result<std::unique_ptr<Transport>> CreateNcclTransport(int rank, int size, RendezvousStore* store,
                                                       std::chrono::milliseconds timeout,
                                                       int device, const NcclLibraries& libraries);

}  // namespace sparsync::transport
