// CreateNcclTransport (and CreateCudaNcclApi) for builds without CUDA or NCCL: says so, and how
// to get it.
#include "daemon/transport/nccl/create_nccl_transport.h"

#include <string>

#include "daemon/transport/nccl/cuda_nccl_api.h"

namespace sparsync::transport {

namespace {

constexpr char kBuiltWithoutNccl[] =
    "this sparsyncd was built without NCCL (CMake found no CUDA toolkit with NCCL, or "
    "SPARSYNC_NCCL=OFF)";

}  // namespace

bool NcclTransportBuilt() { return false; }

int NcclUsableDevices() { return 0; }

Result<std::unique_ptr<Transport>> CreateNcclTransport(int rank, int size, RendezvousStore* store,
                                                       std::chrono::milliseconds timeout,
                                                       int device) {
  return Unavailable(std::string("SPARSYNC_TRANSPORT=nccl: ") + kBuiltWithoutNccl +
                     "; use SPARSYNC_TRANSPORT=gloo or rebuild on a machine with CUDA and NCCL");
}

Result<std::unique_ptr<NcclApi>> CreateCudaNcclApi(int device) {
  return Unavailable(std::string("CUDA device ") + std::to_string(device) + ": " +
                     kBuiltWithoutNccl);
}

int CudaDeviceCount() { return 0; }

}  // namespace sparsync::transport
