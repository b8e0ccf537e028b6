#include "daemon/device/device_topk_path.h"

#include <spdlog/spdlog.h>

#include <climits>

#include "daemon/device/cuda_status.h"
#include "daemon/device/device_buffers.h"
#include "daemon/pipeline/delivery.h"

namespace sparsync::device {

using pipeline::GroupMember;
using pipeline::GroupSlice;
using pipeline::PreparedGroup;

namespace {

constexpr int kAnnounced = 0;  // SparsifyPlugin::FirstTime

}  // namespace

int GroupDevice(const pipeline::Group& group) {
  int device = -1;
  for (const GroupMember& m : group.members) {
    if (m.sum != pipeline::NodeSum::kDeviceZero || m.parts.empty() || !m.parts[0].cuda) return -1;
    if (device >= 0 && m.parts[0].cuda->device() != device) return -1;
    device = m.parts[0].cuda->device();
  }
  return device;
}

DeviceTopKPath::DeviceTopKPath(const Config& base, std::shared_ptr<SparsifyPlugin> plugin,
                               pipeline::TensorState* state)
    : ReducePath("device top-k"), plugin_(std::move(plugin)), state_(state) {
  // Worked out once, not for every gradient of every step (the density does not matter).
  for (int c = 0; c < kCompressorCount; ++c) {
    selects_here_[c] = pipeline::SelectsOnDevice(
        pipeline::TensorConfig(base, static_cast<Compressor>(c), 0));
  }
  selects_here_[kCompressorCount] = pipeline::SelectsOnDevice(base);
}

bool DeviceTopKPath::KeepsOnDevice(const TensorMeta& meta) const {
  if (meta.op != CollectiveOp::kGradient) return false;
  const size_t c = meta.compressor ? static_cast<size_t>(*meta.compressor) : kCompressorCount;
  return selects_here_[c] && plugin_->Available();
}

bool DeviceTopKPath::Takes(const pipeline::Group& group) const {
  return group.reducer != nullptr && group.reducer->SelectsOnDevice() && GroupDevice(group) >= 0;
}

std::unique_ptr<pipeline::ReducePath::Scratch> DeviceTopKPath::NewScratch() const {
  return std::make_unique<TopKScratch>();
}

Result<float*> DeviceTopKPath::ResidualOn(const std::string& name, size_t count, int device,
                                          const std::shared_ptr<const CudaRuntime>& rt,
                                          void* stream, std::vector<std::vector<float>>* uploads) {
  if (pipeline::DeviceResidual* kept = state_->Device(name);
      kept != nullptr && kept->device() == device && kept->count() == count) {
    return kept->data();
  }
  // On another GPU (or of another size), or on the host: it comes along through the host.
  std::unique_ptr<pipeline::DeviceResidual> elsewhere = state_->TakeDevice(name);
  std::vector<float> host = state_->Take(pipeline::TensorState::Kind::kResidual, name);
  if (elsewhere != nullptr) {
    if (host.size() != elsewhere->count()) host.assign(elsewhere->count(), 0.0f);
    SPARSYNC_RETURN_IF_ERROR(elsewhere->AddToHost(host));
    elsewhere.reset();
    SPARSYNC_RETURN_IF_ERROR(CudaStatus(*rt, rt->SetDevice(device), "cudaSetDevice", device));
  }
  if (host.size() != count) return static_cast<float*>(nullptr);
  // Kept in the store at once, so that a step this residual does not finish cannot lose it.
  SPARSYNC_ASSIGN_OR_RETURN(std::unique_ptr<CudaResidual> residual,
                            CudaResidual::Allocate(rt, device, count, name));
  float* data = residual->data();
  state_->PutDevice(name, std::move(residual));
  uploads->push_back(std::move(host));
  SPARSYNC_RETURN_IF_ERROR(CudaStatus(*rt,
                                      rt->MemcpyAsync(data, uploads->back().data(),
                                                      count * sizeof(float),
                                                      kCudaMemcpyHostToDevice, stream),
                                      "copying the residual of '" + name + "' to the device",
                                      device));
  return data;
}

Status DeviceTopKPath::Prepare(pipeline::Group& group, Scratch& scratch_base, bool* declined) {
  auto& scratch = static_cast<TopKScratch&>(scratch_base);
  PreparedGroup* prepared = &scratch.prepared;
  pipeline::SparseReducer* sparse = group.reducer;
  const std::shared_ptr<const SparsifyLibrary> lib = plugin_->Library();
  const size_t n = group.elements;
  if (!lib || n == 0 || n > static_cast<size_t>(INT32_MAX)) {
    *declined = true;
    return Status::Ok();
  }
  std::span<GroupMember> members = group.members;
  std::span<const GroupSlice> slices = group.slices;
  CudaTensor& first = *members[0].parts[0].cuda;
  const std::shared_ptr<const CudaRuntime> rt_ptr = first.runtime();
  const CudaRuntime& rt = *rt_ptr;
  const int device = first.device();
  void* stream = first.stream();
  const int64_t k = std::max<int64_t>(1, std::min<int64_t>(sparse->SelectedCount(n), n));
  SPARSYNC_RETURN_IF_ERROR(CudaStatus(rt, rt.SetDevice(device), "cudaSetDevice", device));

  // The slot's buffers, on this device and large enough. A failure here leaves the device path.
  Status reserved = [&]() -> Status {
    SPARSYNC_RETURN_IF_ERROR(scratch.Bind(lib, rt_ptr, device, n));
    if (scratch.residual_capacity < n) {
      scratch.residual_capacity = 0;
      SPARSYNC_RETURN_IF_ERROR(Grow(rt, device, &scratch.residual, n, "the residual buffer"));
      scratch.residual_capacity = n;
    }
    if (scratch.pairs_capacity < static_cast<size_t>(k)) {
      SPARSYNC_RETURN_IF_ERROR(Grow(rt, device, &scratch.indices, k, "the selection"));
      SPARSYNC_RETURN_IF_ERROR(Grow(rt, device, &scratch.values, k, "the selection"));
      scratch.pairs_capacity = k;
    }
    if (sparse->SendsFloat16() && scratch.halves_capacity < static_cast<size_t>(k)) {
      SPARSYNC_RETURN_IF_ERROR(Grow(rt, device, &scratch.halves, k, "the float16 values"));
      scratch.halves_capacity = k;
    }
    if (scratch.workspace_numel < static_cast<int64_t>(n) || scratch.workspace_k < k) {
      if (scratch.workspace != nullptr) lib->WorkspaceDestroy(scratch.workspace);
      scratch.workspace = nullptr;
      sparsync_sp_error error{};
      SPARSYNC_RETURN_IF_ERROR(PluginStatus(
          lib->WorkspaceCreate(static_cast<int64_t>(n), k, &scratch.workspace, &error), error,
          "making a sparsification workspace on CUDA device " + std::to_string(device)));
      scratch.workspace_numel = static_cast<int64_t>(n);
      scratch.workspace_k = k;
    }
    return Status::Ok();
  }();
  if (!reserved.ok()) {
    plugin_->Disable(reserved.message());
    *declined = true;
    return Status::Ok();
  }

  // Each tensor's sum and residual into the group buffers. Host copies stay alive until the
  // stream is synchronised below.
  std::vector<std::vector<float>> uploads;
  for (size_t i = 0; i < members.size(); ++i) {
    const GroupSlice& s = slices[i];
    CudaTensor& t = *members[i].parts[0].cuda;
    if (!members[i].clique) SPARSYNC_RETURN_IF_ERROR(t.EnqueueWaitReady());
    const size_t bytes = s.count * sizeof(float);
    SPARSYNC_RETURN_IF_ERROR(t.Check(rt.MemcpyAsync(scratch.group + s.offset, t.data(), bytes,
                                                    kCudaMemcpyDeviceToDevice, stream),
                                     "copying the tensor into the device group buffer"));
    SPARSYNC_ASSIGN_OR_RETURN(float* residual,
                              ResidualOn(*s.name, s.count, device, rt_ptr, stream, &uploads));
    float* dst = scratch.residual + s.offset;
    if (residual != nullptr) {
      SPARSYNC_RETURN_IF_ERROR(
          t.Check(rt.MemcpyAsync(dst, residual, bytes, kCudaMemcpyDeviceToDevice, stream),
                  "copying the residual into the device group buffer"));
    } else {
      SPARSYNC_RETURN_IF_ERROR(
          t.Check(rt.MemsetAsync(dst, 0, bytes, stream), "clearing the residual"));
    }
  }

  const std::string on_device = " on CUDA device " + std::to_string(device);
  sparsync_sp_error error{};
  SPARSYNC_RETURN_IF_ERROR(PluginStatus(
      lib->TopKResidual(scratch.group, scratch.residual, static_cast<int64_t>(n), k,
                        scratch.indices, scratch.values, k, scratch.workspace, stream, &error),
      error, "top-k" + on_device));
  int64_t count = 0;
  const int code = lib->Finish(scratch.workspace, stream, &count, &error);
  int64_t bad = -1;
  float bad_value = 0;
  prepared->finite = code != SPARSYNC_SP_NONFINITE;
  if (!prepared->finite) {
    bad = error.index;
    if (bad < 0 || static_cast<size_t>(bad) >= n)
      return Internal("top-k: " + std::string(error.message));
    // The node's sum at that element, for the message (the residual buffer is unspecified now).
    SPARSYNC_RETURN_IF_ERROR(CudaStatus(rt,
                                        rt.MemcpyAsync(&bad_value, scratch.group + bad,
                                                       sizeof(float), kCudaMemcpyDeviceToHost,
                                                       stream),
                                        "reading a non-finite value", device));
    count = 0;
  } else {
    SPARSYNC_RETURN_IF_ERROR(PluginStatus(code, error, "top-k" + on_device));
    if (count < 0 || count > k)
      return Internal("top-k selected " + std::to_string(count) + " of " + std::to_string(k));
  }
  if (count > 0 && sparse->SendsFloat16()) {
    // The peers get the values as float16: what that rounding drops stays in the residual (the
    // host encodes the same halves from the float32 values below).
    SPARSYNC_RETURN_IF_ERROR(PluginStatus(
        lib->PackFloat16Residual(scratch.values, scratch.indices, count, scratch.halves,
                                 scratch.residual, static_cast<int64_t>(n), stream, &error),
        error, "float16 packing" + on_device));
  }
  prepared->indices.resize(static_cast<size_t>(count));
  prepared->values.resize(static_cast<size_t>(count));
  if (count > 0) {
    SPARSYNC_RETURN_IF_ERROR(
        CudaStatus(rt,
                   rt.MemcpyAsync(prepared->indices.data(), scratch.indices,
                                  count * sizeof(int32_t), kCudaMemcpyDeviceToHost, stream),
                   "copying the selection to the host", device));
    SPARSYNC_RETURN_IF_ERROR(
        CudaStatus(rt,
                   rt.MemcpyAsync(prepared->values.data(), scratch.values, count * sizeof(float),
                                  kCudaMemcpyDeviceToHost, stream),
                   "copying the selection to the host", device));
  }
  SPARSYNC_RETURN_IF_ERROR(
      CudaStatus(rt, rt.StreamSynchronize(stream), "copying the selection to the host", device));
  if (prepared->finite && plugin_->FirstTime(kAnnounced)) {
    spdlog::info(
        "top-k on CUDA device {} for the group of '{}' ({} elements): only the {} "
        "selected pairs are copied to the host",
        device, *slices[0].name, n, count);
  }
  return sparse->PrepareSelected(slices, static_cast<int64_t>(n), bad, bad_value, prepared);
}

Status DeviceTopKPath::Exchange(pipeline::Group& group, Scratch& scratch_base, uint32_t* tag) {
  auto& scratch = static_cast<TopKScratch&>(scratch_base);
  PreparedGroup& prepared = scratch.prepared;
  const size_t n = group.elements;
  bool skip = false;
  std::vector<pipeline::DecodedSparse> payloads;
  SPARSYNC_RETURN_IF_ERROR(
      group.reducer->ExchangeSelected(prepared, static_cast<int64_t>(n), tag, &skip, &payloads));

  const CudaRuntime& rt = *scratch.rt;
  const int device = scratch.device;
  const SparsifyLibrary& lib = *scratch.lib;
  void* stream = group.members[0].parts[0].cuda->stream();
  const std::string on_device = " on CUDA device " + std::to_string(device);
  SPARSYNC_RETURN_IF_ERROR(CudaStatus(rt, rt.SetDevice(device), "cudaSetDevice", device));

  // The average of every node's pairs, into the group buffer.
  if (skip) {
    SPARSYNC_RETURN_IF_ERROR(CudaStatus(rt,
                                        rt.MemsetAsync(scratch.group, 0, n * sizeof(float), stream),
                                        "clearing the group buffer", device));
  } else {
    size_t pairs = 0;
    for (const pipeline::DecodedSparse& p : payloads) pairs += p.indices.size();
    if (scratch.pairs_capacity < pairs) {
      SPARSYNC_RETURN_IF_ERROR(Grow(rt, device, &scratch.indices, pairs, "the gathered pairs"));
      SPARSYNC_RETURN_IF_ERROR(Grow(rt, device, &scratch.values, pairs, "the gathered pairs"));
      scratch.pairs_capacity = pairs;
    }
    std::vector<sparsync_sp_payload> views;
    size_t at = 0;
    for (const pipeline::DecodedSparse& p : payloads) {
      const size_t c = p.indices.size();
      if (c > 0) {
        SPARSYNC_RETURN_IF_ERROR(
            CudaStatus(rt,
                       rt.MemcpyAsync(scratch.indices + at, p.indices.data(), c * sizeof(int32_t),
                                      kCudaMemcpyHostToDevice, stream),
                       "copying the gathered pairs to the device", device));
        SPARSYNC_RETURN_IF_ERROR(
            CudaStatus(rt,
                       rt.MemcpyAsync(scratch.values + at, p.values.data(), c * sizeof(float),
                                      kCudaMemcpyHostToDevice, stream),
                       "copying the gathered pairs to the device", device));
      }
      views.push_back({scratch.indices + at, scratch.values + at, static_cast<int64_t>(c)});
      at += c;
    }
    sparsync_sp_error error{};
    SPARSYNC_RETURN_IF_ERROR(PluginStatus(
        lib.ScatterAddAverage(views.data(), static_cast<int>(views.size()), scratch.group,
                              static_cast<int64_t>(n), group.divisor, scratch.workspace, stream,
                              &error),
        error, "scatter-add" + on_device));
    int64_t unused = 0;
    SPARSYNC_RETURN_IF_ERROR(PluginStatus(lib.Finish(scratch.workspace, stream, &unused, &error),
                                          error, "scatter-add" + on_device));
  }

  // Each tensor's result into local rank 0's buffer (Deliver takes it from there).
  for (size_t i = 0; i < group.members.size(); ++i) {
    CudaTensor& t = *group.members[i].parts[0].cuda;
    SPARSYNC_RETURN_IF_ERROR(t.Check(
        rt.MemcpyAsync(t.data(), scratch.group + group.slices[i].offset,
                       group.slices[i].count * sizeof(float), kCudaMemcpyDeviceToDevice, stream),
        "copying the result into the worker's buffer"));
  }

  // The residuals. Skipped step: a finite node keeps everything it would have sent (the
  // selected values go back where top-k zeroed them); a node that saw NaN/Inf keeps its old one.
  std::vector<float> restored;
  const float* source = scratch.residual;
  int kind = kCudaMemcpyDeviceToDevice;
  if (skip && prepared.finite) {
    restored.resize(n);
    SPARSYNC_RETURN_IF_ERROR(CudaStatus(rt,
                                        rt.MemcpyAsync(restored.data(), scratch.residual,
                                                       n * sizeof(float), kCudaMemcpyDeviceToHost,
                                                       stream),
                                        "copying the residual to the host", device));
    SPARSYNC_RETURN_IF_ERROR(
        CudaStatus(rt, rt.StreamSynchronize(stream), "cudaStreamSynchronize", device));
    for (size_t j = 0; j < prepared.indices.size(); ++j) {
      restored[prepared.indices[j]] = prepared.values[j];
    }
    source = restored.data();
    kind = kCudaMemcpyHostToDevice;
  }
  if (!skip || prepared.finite) {
    for (const GroupSlice& s : group.slices) {
      float* data = nullptr;
      if (pipeline::DeviceResidual* kept = state_->Device(*s.name); kept != nullptr) {
        data = kept->data();
      } else {
        SPARSYNC_ASSIGN_OR_RETURN(std::unique_ptr<CudaResidual> residual,
                                  CudaResidual::Allocate(scratch.rt, device, s.count, *s.name));
        data = residual->data();
        state_->PutDevice(*s.name, std::move(residual));
      }
      SPARSYNC_RETURN_IF_ERROR(CudaStatus(
          rt, rt.MemcpyAsync(data, source + s.offset, s.count * sizeof(float), kind, stream),
          "keeping the residual of '" + *s.name + "'", device));
    }
  }
  // Nothing on the host may go while the device still reads it.
  return CudaStatus(rt, rt.StreamSynchronize(stream), "cudaStreamSynchronize", device);
}

void DeviceTopKPath::Deliver(const GroupMember& member, pipeline::Group&, Scratch&) {
  pipeline::DeliverFromDevice(member);
}

}  // namespace sparsync::device
