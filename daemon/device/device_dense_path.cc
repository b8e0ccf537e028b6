#include "daemon/device/device_dense_path.h"

#include <spdlog/spdlog.h>

#include "daemon/device/cuda_status.h"
#include "daemon/device/device_buffers.h"
#include "daemon/device/device_topk_path.h"
#include "daemon/pipeline/delivery.h"

namespace sparsync::device {

using pipeline::GroupMember;

namespace {

constexpr int kAnnounced = 1;  // SparsifyPlugin::FirstTime

class DeviceDensePath final : public pipeline::ReducePath {
 public:
  DeviceDensePath(const Config& base, std::shared_ptr<SparsifyPlugin> plugin,
                  transport::Transport* transport)
      : ReducePath("device dense"),
        default_compressor_(base.compressor),
        plugin_(std::move(plugin)),
        transport_(transport) {}

  bool Takes(const pipeline::Group& group) const override {
    if (!Reduces(group.op) || group.reducer != nullptr || transport_->cuda_device() < 0) {
      return false;
    }
    for (const GroupMember& m : group.members) {
      if (m.meta.dtype != DType::kFloat32) return false;
    }
    return GroupDevice(group) == transport_->cuda_device();
  }

  bool KeepsOnDevice(const TensorMeta& meta) const override {
    if (transport_->cuda_device() < 0) return false;
    const bool dense = meta.op == CollectiveOp::kAllReduce ||
                       meta.compressor.value_or(default_compressor_) == Compressor::kNone;
    return dense && plugin_->Available();
  }

  std::unique_ptr<Scratch> NewScratch() const override {
    return std::make_unique<DeviceScratch>();
  }

  Status Prepare(pipeline::Group& group, Scratch& scratch, bool* declined) override;
  Status Exchange(pipeline::Group& group, Scratch& scratch, uint32_t* tag) override;

  void Deliver(const GroupMember& member, pipeline::Group&, Scratch&) override {
    pipeline::DeliverFromDevice(member);
  }

 private:
  const Compressor default_compressor_;
  const std::shared_ptr<SparsifyPlugin> plugin_;
  transport::Transport* const transport_;
};

Status DeviceDensePath::Prepare(pipeline::Group& group, Scratch& scratch_base, bool* declined) {
  auto& scratch = static_cast<DeviceScratch&>(scratch_base);
  const std::shared_ptr<const SparsifyLibrary> lib = plugin_->Library();
  const size_t n = group.elements;
  if (!lib || n == 0) {
    *declined = true;
    return Status::Ok();
  }
  CudaTensor& first = *group.members[0].parts[0].cuda;
  const CudaRuntime& rt = first.rt();
  const int device = first.device();
  void* stream = first.stream();
  SPARSYNC_RETURN_IF_ERROR(CudaStatus(rt, rt.SetDevice(device), "cudaSetDevice", device));
  // A lone tensor is reduced in its own buffer; a group side by side in the slot's.
  const bool fused = group.members.size() > 1;
  if (Status st = scratch.Bind(lib, first.runtime(), device, fused ? n : 0); !st.ok()) {
    plugin_->Disable(st.message());
    *declined = true;
    return Status::Ok();
  }
  for (size_t i = 0; i < group.members.size(); ++i) {
    CudaTensor& t = *group.members[i].parts[0].cuda;
    if (!group.members[i].clique) SPARSYNC_RETURN_IF_ERROR(t.EnqueueWaitReady());
    if (!fused) continue;
    SPARSYNC_RETURN_IF_ERROR(
        t.Check(rt.MemcpyAsync(scratch.group + group.slices[i].offset, t.data(),
                               group.slices[i].count * sizeof(float), kCudaMemcpyDeviceToDevice,
                               stream),
                "copying the tensor into the device group buffer"));
  }
  // The transport works on a stream of its own: the group must be complete before it starts.
  SPARSYNC_RETURN_IF_ERROR(
      CudaStatus(rt, rt.StreamSynchronize(stream), "gathering the group on the device", device));
  if (plugin_->FirstTime(kAnnounced)) {
    spdlog::info(
        "dense groups stay on CUDA device {}: the transport reduces them in device memory "
        "(first: '{}', {} elements)",
        device, *group.slices[0].name, n);
  }
  return Status::Ok();
}

Status DeviceDensePath::Exchange(pipeline::Group& group, Scratch& scratch_base, uint32_t* tag) {
  auto& scratch = static_cast<DeviceScratch&>(scratch_base);
  const size_t n = group.elements;
  CudaTensor& first = *group.members[0].parts[0].cuda;
  const bool fused = group.members.size() > 1;
  float* data = fused ? scratch.group : static_cast<float*>(first.data());
  SPARSYNC_RETURN_IF_ERROR(
      transport_->AllReduceSumOnDevice(data, n, transport::ElementType::kFloat32, (*tag)++));

  const CudaRuntime& rt = first.rt();
  const int device = first.device();
  void* stream = first.stream();
  SPARSYNC_RETURN_IF_ERROR(CudaStatus(rt, rt.SetDevice(device), "cudaSetDevice", device));
  if (group.divisor != 1.0) {
    sparsync_sp_error error{};
    SPARSYNC_RETURN_IF_ERROR(PluginStatus(
        scratch.lib->Divide(data, static_cast<int64_t>(n), group.divisor, stream, &error), error,
        "averaging on CUDA device " + std::to_string(device)));
  }
  if (fused) {
    for (size_t i = 0; i < group.members.size(); ++i) {
      CudaTensor& t = *group.members[i].parts[0].cuda;
      SPARSYNC_RETURN_IF_ERROR(t.Check(
          rt.MemcpyAsync(t.data(), scratch.group + group.slices[i].offset,
                         group.slices[i].count * sizeof(float), kCudaMemcpyDeviceToDevice,
                         stream),
          "copying the result into the worker's buffer"));
    }
  }
  // Deliver orders the done events (and the broadcast to the other GPUs) after these.
  return Status::Ok();
}

}  // namespace

std::unique_ptr<pipeline::ReducePath> MakeDeviceDensePath(const Config& base,
                                                          std::shared_ptr<SparsifyPlugin> plugin,
                                                          transport::Transport* transport) {
  return std::make_unique<DeviceDensePath>(base, std::move(plugin), transport);
}

}  // namespace sparsync::device
