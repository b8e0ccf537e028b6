// DeviceTopKPath: top-k with error feedback of a gradient group whose node sum is on one GPU
// (docs/algorithms.md §6, §7.1). The workers' CUDA gradients were summed on the node's GPUs
// (device_clique.h) or, with one worker, left in its buffer (device_intake.h); instead of copying
// that sum to the host, the daemon selects on the device and moves only the k selected pairs
// across PCIe:
//
//   Prepare   each tensor's sum and residual go into the slot's group buffers on the device
//             (device-to-device copies); top-k of |sum + residual| is selected there (kernels/
//             cuda TopKWithResidual, through the CUDA sparsification library), which also leaves
//             the new residual (with float16 values, what their rounding drops goes back into it
//             there); the k pairs are copied to the host and encoded as on the host path
//             (SparseReducer::PrepareSelected).
//   Exchange  the allgather exchange of the host path (SparseReducer::ExchangeSelected); every
//             node's decoded pairs go to the device and are scatter-added in node order and
//             averaged there (ScatterAddAverage, bit-identical to the host's decoding); each
//             tensor's slice is copied into local rank 0's buffer; the residuals are kept on the
//             device (TensorState's device half, CudaResidual).
//   Deliver   DeliverFromDevice: the clique broadcasts to the other GPUs, or the done event.
//
// Residuals are per tensor, so they follow any re-plan as the host's do. A tensor whose group
// goes through a host path meanwhile takes its residual along (TensorState::AddTo brings it to
// the host); one that comes back brings it to the device: none is lost or counted twice.
//
// Threads: Prepare runs on the executor's stage A, Exchange on stage B, on different slots. All
// device work goes to the per-device stream of the CUDA intake, in that order, so it is ordered
// with the staging copies of the same tensors.
#pragma once

#include <array>
#include <memory>

#include "daemon/device/device_buffers.h"
#include "daemon/device/sparsify_plugin.h"
#include "daemon/pipeline/reduce_path.h"
#include "daemon/pipeline/sparse_reducer.h"
#include "daemon/pipeline/tensor_state.h"

namespace sparsync::device {

// Whether `group`'s members all have their node sum on one GPU (NodeSum::kDeviceZero); the
// device, or -1.
int GroupDevice(const pipeline::Group& group);

class DeviceTopKPath : public pipeline::ReducePath {
 public:
  // A slot's scratch: the device buffers and the group's selection (PreparedGroup), which
  // Exchange sends.
  struct TopKScratch : DeviceScratch {
    pipeline::PreparedGroup prepared;
  };

  // `base`: the daemon's configuration (which tensors select on the device follows from it).
  // `state` is the node's TensorState (SparseReducers::state()); both outlive the path.
  DeviceTopKPath(const Config& base, std::shared_ptr<SparsifyPlugin> plugin,
                 pipeline::TensorState* state);

  bool Takes(const pipeline::Group& group) const override;
  // Gradients whose compressor selects on the device, while the library is available.
  bool KeepsOnDevice(const TensorMeta& meta) const override;
  std::unique_ptr<Scratch> NewScratch() const override;
  Status Prepare(pipeline::Group& group, Scratch& scratch, bool* declined) override;
  Status Exchange(pipeline::Group& group, Scratch& scratch, uint32_t* tag) override;
  void Deliver(const pipeline::GroupMember& member, pipeline::Group& group,
               Scratch& scratch) override;

 private:
  // `name`'s residual on `device`: the one kept there, or one brought from the host or another
  // GPU (its upload queued on `stream` from a vector added to `uploads`); null when it has none.
  Result<float*> ResidualOn(const std::string& name, size_t count, int device,
                            const std::shared_ptr<const CudaRuntime>& rt, void* stream,
                            std::vector<std::vector<float>>* uploads);

  const std::shared_ptr<SparsifyPlugin> plugin_;
  pipeline::TensorState* const state_;
  // By compressor (the daemon's own at kCompressorCount): whether its groups select here.
  std::array<bool, kCompressorCount + 1> selects_here_{};
};

}  // namespace sparsync::device
