// The device paths' memory: the buffers one executor slot keeps on a GPU (DeviceScratch, grown as
// groups grow, freed with the slot) and a tensor's residual kept in device memory
// (CudaResidual, the device half of the node's TensorState).
#pragma once

#include <memory>
#include <span>
#include <string>

#include "daemon/common/status.h"
#include "daemon/device/cuda_runtime.h"
#include "daemon/device/sparsify_plugin.h"
#include "daemon/pipeline/reduce_path.h"
#include "daemon/pipeline/tensor_state.h"

namespace sparsync::device {

// One slot's device buffers (group, residual, selection, gathered pairs) and the library's
// workspace, on one device.
struct DeviceScratch : pipeline::ReducePath::Scratch {
  DeviceScratch() = default;
  ~DeviceScratch() override;
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;

  void Clear();  // frees everything; the next group allocates again
  // Points the scratch at `device` and `lib` (freeing what it held elsewhere) and grows its group
  // buffer to `n` elements.
  Status Bind(const std::shared_ptr<const SparsifyLibrary>& lib,
              const std::shared_ptr<const CudaRuntime>& rt, int device, size_t n);

  std::shared_ptr<const SparsifyLibrary> lib;
  std::shared_ptr<const CudaRuntime> rt;
  int device = -1;
  sparsync_sp_workspace* workspace = nullptr;
  int64_t workspace_numel = 0;
  int64_t workspace_k = 0;
  float* group = nullptr;  // the node's sum of the group, then the result
  size_t group_capacity = 0;
  float* residual = nullptr;  // the group's residuals, then the new ones
  size_t residual_capacity = 0;
  int32_t* indices = nullptr;  // the selection (k), then every node's pairs
  float* values = nullptr;
  size_t pairs_capacity = 0;
  uint16_t* halves = nullptr;  // the selection's values as float16 (SPARSYNC_VALUE_DTYPE)
  size_t halves_capacity = 0;
};

// Replaces *buffer (freed) by a new allocation of `count` elements on `device` (current).
template <typename T>
Status Grow(const CudaRuntime& rt, int device, T** buffer, size_t count, const char* what);

// A residual in the memory of one GPU.
class CudaResidual : public pipeline::DeviceResidual {
 public:
  // A new residual of `count` floats on `device` (current), contents unset.
  static Result<std::unique_ptr<CudaResidual>> Allocate(std::shared_ptr<const CudaRuntime> rt,
                                                        int device, size_t count,
                                                        const std::string& name);
  ~CudaResidual() override;
  int device() const override { return device_; }
  size_t count() const override { return count_; }
  float* data() const override { return data_; }
  Status AddToHost(std::span<float> host) const override;

 private:
  CudaResidual(std::shared_ptr<const CudaRuntime> rt, int device, size_t count, std::string name)
      : rt_(std::move(rt)), device_(device), count_(count), name_(std::move(name)) {}
  const std::shared_ptr<const CudaRuntime> rt_;
  const int device_;
  const size_t count_;
  const std::string name_;
  float* data_ = nullptr;
};

}  // namespace sparsync::device
