// CreateNcclTransport: the real API (NCCL and the CUDA runtime, loaded now) under NcclTransport.
#include "daemon/transport/nccl/create_nccl_transport.h"

#include "daemon/transport/nccl/nccl_transport.h"

namespace sparsync::transport {

Result<std::unique_ptr<Transport>> CreateNcclTransport(int rank, int size, RendezvousStore* store,
                                                       std::chrono::milliseconds timeout,
                                                       int device, const NcclLibraries& libraries) {
  auto api = CreateCudaNcclApi(device, libraries);
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
