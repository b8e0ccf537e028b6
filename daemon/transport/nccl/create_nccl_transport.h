// CreateNcclTransport: the NCCL backend's entry point for the composition root
// (SPARSYNC_TRANSPORT=nccl). Compiles everywhere; in a build without CUDA and NCCL the
// definition (create_nccl_transport_stub.cc) fails with a clear error, so callers need no #if.
#pragma once

#include <chrono>
#include <memory>

#include "daemon/common/status.h"
#include "daemon/transport/transport.h"

namespace sparsync::transport {

// Whether this build contains the NCCL backend (CMake found CUDA and NCCL).
bool NcclTransportBuilt();
// The CUDA devices this process can use for it: 0 without a GPU, a driver, or the backend.
int NcclUsableDevices();

// Joins the job's NCCL communicator as node `rank` of `size` on CUDA device `device` (the
// transport's cuda_device(): AllReduceSumOnDevice takes that device's memory), bootstrapping
// through `store` (node 0 publishes the ncclUniqueId). `timeout` bounds the bootstrap and every
// later call. Fails with kUnavailable in a build without NCCL or on a machine without a usable GPU.
Result<std::unique_ptr<Transport>> CreateNcclTransport(int rank, int size, RendezvousStore* store,
                                                       std::chrono::milliseconds timeout,
                                                       int device);

}  // namespace sparsync::transport
