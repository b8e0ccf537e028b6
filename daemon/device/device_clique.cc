#include "daemon/device/device_clique.h"

#include <spdlog/spdlog.h>

namespace sparsync::device {

namespace {

std::string DeviceList(const std::vector<int>& devices) {
  std::string s;
  for (int d : devices) s += (s.empty() ? "" : ",") + std::to_string(d);
  return s;
}

}  // namespace

// ---- DeviceClique ----

DeviceClique::~DeviceClique() {
  for (void* comm : comms_) {
    Status st = NcclStatus(*nccl_, nccl_->CommDestroy(comm), "ncclCommDestroy");
    if (!st.ok()) spdlog::warn("{}", st.message());
  }
}

Status DeviceClique::Check(int result, const std::string& what, const std::string& tensor) const {
  return NcclStatus(*nccl_, result,
                    what + " of tensor '" + tensor + "' across CUDA devices " + DeviceList(devices_));
}

template <typename Call>
Status DeviceClique::Group(const char* name, const std::string& tensor, Call call) {
  SPARSYNC_RETURN_IF_ERROR(Check(nccl_->GroupStart(), "ncclGroupStart", tensor));
  Status first;
  for (size_t r = 0; r < comms_.size(); ++r) {
    Status st = Check(call(r), name, tensor);
    if (first.ok()) first = st;
  }
  // The group is closed whatever happened inside it.
  Status end = Check(nccl_->GroupEnd(), "ncclGroupEnd", tensor);
  return first.ok() ? end : first;
}

template <typename Step>
Status DeviceClique::ForEachDevice(std::span<CudaTensor* const> parts, Step step) {
  for (CudaTensor* part : parts) {
    SPARSYNC_RETURN_IF_ERROR(part->Check(part->rt().SetDevice(part->device()), "cudaSetDevice"));
    SPARSYNC_RETURN_IF_ERROR(step(*part));
  }
  return Status::Ok();
}

Status DeviceClique::ReduceOnDevice(std::span<CudaTensor* const> parts, DType dtype) {
  CudaTensor& root = *parts[0];
  const size_t count = root.bytes() / DTypeSize(dtype);
  const int type = NcclDataType(dtype);
  std::lock_guard lock(mu_);
  SPARSYNC_RETURN_IF_ERROR(
      ForEachDevice(parts, [](CudaTensor& p) { return p.EnqueueWaitReady(); }));
  if (count == 0) return Status::Ok();
  return Group("ncclReduce", root.name(), [&](size_t r) {
    return nccl_->Reduce(parts[r]->data_, parts[r]->data_, count, type, kNcclSum, 0, comms_[r],
                         parts[r]->stream());
  });
}

Status DeviceClique::ReduceToHost(std::span<CudaTensor* const> parts, DType dtype) {
  SPARSYNC_RETURN_IF_ERROR(ReduceOnDevice(parts, dtype));
  // In stream order after the reduce: the copy needs no lock.
  SPARSYNC_RETURN_IF_ERROR(ForEachDevice(parts.first(1), [](CudaTensor& p) {
    return p.EnqueueDeviceToHost();
  }));
  return parts[0]->Synchronize();
}

Status DeviceClique::BroadcastFromDevice(std::span<CudaTensor* const> parts, DType dtype) {
  CudaTensor& root = *parts[0];
  const size_t count = root.bytes() / DTypeSize(dtype);
  const int type = NcclDataType(dtype);
  std::lock_guard lock(mu_);
  if (count != 0) {
    SPARSYNC_RETURN_IF_ERROR(Group("ncclBroadcast", root.name(), [&](size_t r) {
      return nccl_->Broadcast(root.data_, parts[r]->data_, count, type, 0, comms_[r],
                              parts[r]->stream());
    }));
  }
  return ForEachDevice(parts, [](CudaTensor& p) { return p.EnqueueRecordDone(); });
}

Status DeviceClique::BroadcastFromHost(std::span<CudaTensor* const> parts, DType dtype) {
  SPARSYNC_RETURN_IF_ERROR(ForEachDevice(parts.first(1), [](CudaTensor& p) {
    return p.EnqueueHostToDevice();
  }));
  return BroadcastFromDevice(parts, dtype);
}

// ---- LocalNccl ----

LocalNccl::LocalNccl(std::string library, bool enabled)
    : library_(std::move(library)), enabled_(enabled) {}

bool LocalNccl::Load() {
  if (nccl_ || load_failed_) return nccl_ != nullptr;
  std::string error;
  nccl_ = LoadNccl(library_, &error);
  if (!nccl_) {
    load_failed_ = true;
    spdlog::info("{}: the workers' CUDA tensors are summed on the host", error);
    return false;
  }
  spdlog::info("local reduce across GPUs: using NCCL {} from {}", nccl_->version, nccl_->library);
  return true;
}

Status LocalNccl::LoadExplicit() {
  if (library_.empty() || !enabled_) return Status::Ok();
  std::lock_guard lock(mu_);
  std::string error;
  nccl_ = LoadNccl(library_, &error);
  if (!nccl_) {
    return InvalidArgument("SPARSYNC_LIBNCCL=" + library_ + ": " + error +
                           "; unset it to use libnccl.so.2, or set SPARSYNC_LOCAL_REDUCE=host");
  }
  return Status::Ok();
}

std::shared_ptr<DeviceClique> LocalNccl::CliqueFor(std::span<CudaTensor* const> parts) {
  if (!enabled_ || parts.size() < 2) return nullptr;
  std::vector<int> devices;
  for (const CudaTensor* p : parts) {
    if (p == nullptr) return nullptr;
    devices.push_back(p->device());
  }
  std::lock_guard lock(mu_);
  for (size_t r = 1; r < devices.size(); ++r) {
    for (size_t q = 0; q < r; ++q) {
      if (devices[q] != devices[r]) continue;
      // Two workers on one GPU: NCCL takes one rank per device.
      if (!warned_shared_device_) {
        warned_shared_device_ = true;
        spdlog::info("local ranks {} and {} both train on CUDA device {}: the node's CUDA tensors "
                     "are summed on the host (give each worker a GPU of its own to sum them "
                     "with NCCL)",
                     q, r, devices[r]);
      }
      return nullptr;
    }
  }
  auto it = cliques_.find(devices);
  if (it != cliques_.end()) return it->second;
  if (!Load()) return nullptr;
  std::shared_ptr<DeviceClique> clique(new DeviceClique(nccl_, devices));
  clique->comms_.assign(devices.size(), nullptr);
  Status made = NcclStatus(*nccl_,
                           nccl_->CommInitAll(clique->comms_.data(),
                                              static_cast<int>(devices.size()), devices.data()),
                           "ncclCommInitAll on CUDA devices " + DeviceList(devices));
  if (!made.ok()) {
    clique->comms_.clear();
    spdlog::warn("{}; their tensors are summed on the host", made.message());
    clique = nullptr;
  } else {
    spdlog::info("summing the node's CUDA tensors on devices {} with NCCL", DeviceList(devices));
  }
  cliques_[devices] = clique;
  return clique;
}

}  // namespace sparsync::device
