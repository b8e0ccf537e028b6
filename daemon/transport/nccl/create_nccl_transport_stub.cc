// CreateNcclTransport for builds without CUDA or NCCL: says so, and how to get it.
#include "daemon/transport/nccl/create_nccl_transport.h"

namespace sparsync::transport {

bool NcclTransportBuilt() { return false; }

int NcclUsableDevices() { return 0; }

Result<std::unique_ptr<Transport>> CreateNcclTransport(int rank, int size, RendezvousStore* store,
                                                       std::chrono::milliseconds timeout,
                                                       int device) {
  return Unavailable(
      "SPARSYNC_TRANSPORT=nccl: this sparsyncd was built without NCCL (CMake found no CUDA "
      "toolkit with NCCL, or SPARSYNC_NCCL=OFF); use SPARSYNC_TRANSPORT=gloo or rebuild on a "
      "machine with CUDA and NCCL");
}

}  // namespace sparsync::transport
