// DeviceDensePath: a dense reduction whose node sum is on the GPU the transport reduces in
// (Transport::cuda_device(), the NCCL backend): stage A puts the tensors' sums side by side in
// the slot's group buffer (a lone tensor stays in its own buffer); stage B allreduces that
// memory in place, divides it on the device (sparsync_sp_divide, bit-identical to the host's
// division) and copies each tensor's slice into local rank 0's buffer. Nothing of the group
// crosses PCIe. Results go back with DeliverFromDevice.
#pragma once

#include <memory>

#include "daemon/device/sparsify_plugin.h"
#include "daemon/pipeline/reduce_path.h"
#include "daemon/transport/transport.h"

namespace sparsync::device {

class DeviceDensePath : public pipeline::ReducePath {
 public:
  // `base`: the daemon's configuration (its compressor decides which gradients go dense).
  DeviceDensePath(const Config& base, std::shared_ptr<SparsifyPlugin> plugin,
                  transport::Transport* transport);

  const char* name() const override { return "device dense"; }
  bool Takes(const pipeline::Group& group) const override;
  std::unique_ptr<Scratch> NewScratch() const override;
  Status Prepare(pipeline::Group& group, Scratch& scratch, bool* declined) override;
  Status Exchange(pipeline::Group& group, Scratch& scratch, uint32_t* tag) override;
  void Deliver(const pipeline::GroupMember& member, pipeline::Group& group,
               Scratch& scratch) override;

  // Whether a reduction like `meta` whose parts are on GPUs should keep its node sum there for
  // this path (DeviceIntakeOptions::keep_on_device): an explicit allreduce, or a gradient of no
  // compressor, when the transport takes device memory.
  bool WantsOnDevice(const TensorMeta& meta) const;

 private:
  const Compressor default_compressor_;
  const std::shared_ptr<SparsifyPlugin> plugin_;
  transport::Transport* const transport_;
};

}  // namespace sparsync::device
