// The device dense path: a dense reduction whose node sum is on the GPU the transport reduces in
// (Transport::cuda_device(), the NCCL backend). Stage A puts the tensors' sums side by side in the
// slot's group buffer (a lone tensor stays in its own buffer); stage B allreduces that memory in
// place, divides it on the device (sparsync_sp_divide, bit-identical to the host's division) and
// copies each tensor's slice into local rank 0's buffer. Nothing of the group crosses PCIe.
// Results go back with DeliverFromDevice. It keeps on the device the explicit allreduces and the
// gradients of no compressor, when the transport takes device memory.
#pragma once

#include <memory>

#include "daemon/common/config.h"
#include "daemon/device/sparsify_plugin.h"
#include "daemon/pipeline/reduce_path.h"
#include "daemon/transport/transport.h"

namespace sparsync::device {

// `base`: the daemon's configuration (its compressor decides which gradients go dense).
// `transport` outlives the path.
std::unique_ptr<pipeline::ReducePath> MakeDeviceDensePath(const Config& base,
                                                          std::shared_ptr<SparsifyPlugin> plugin,
                                                          transport::Transport* transport);

}  // namespace sparsync::device
