// CreateNcclTransport for builds with CUDA and NCCL: the real API under NcclTransport.
#include "daemon/transport/nccl/create_nccl_transport.h"

#include "daemon/transport/nccl/cuda_nccl_api.h"
#include "daemon/transport/nccl/nccl_transport.h"

namespace sparsync::transport {

bool NcclTransportBuilt() { return true; }

int NcclUsableDevices() { return CudaDeviceCount(); }

Result<std::unique_ptr<Transport>> CreateNcclTransport(int rank, int size, RendezvousStore* store,
                                                       std::chrono::milliseconds timeout,
                                                       int device) {
  auto api = CreateCudaNcclApi(device);
  if (!api.ok()) {
    return api.status().WithContext("NCCL transport (SPARSYNC_TRANSPORT=nccl) on node " +
                                    std::to_string(rank));
  }
  NcclTransportOptions options;
  options.timeout = timeout;
  options.device = device;
  auto transport = NcclTransport::Create(std::move(api).value(), rank, size, store, options);
  if (!transport.ok()) return transport.status();
  return std::unique_ptr<Transport>(std::move(transport).value());
}

}  // namespace sparsync::transport
