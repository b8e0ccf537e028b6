// DeviceSparse: the device path of a merge group whose node sum is on a GPU (issue 5; DESIGN.md
// §1.6): top-k, described here, and dense groups on a transport that takes device memory (see
// "Dense groups" below). The workers' CUDA gradients are summed on the node's GPUs (intake/local_nccl.h) or,
// with one worker, left in its buffer; instead of copying that sum to the host, the daemon runs
// top-k with error feedback on the device and moves only the k selected pairs across PCIe:
//
//   stage A (Select)   each tensor's sum and residual go into the slot's group buffers on the
//                      device (device-to-device copies); top-k of |sum + residual| is selected
//                      there (kernels/cuda TopKWithResidual, through the CUDA sparsification
//                      library, kernels/cuda/sparsify_plugin.h), which also leaves the new
//                      residual (with float16 values, what their rounding drops goes back into
//                      it there); the k pairs are copied to the host and encoded as on the host
//                      path (SparseReducer::PrepareSelected).
//   stage B (Finish)   after the exchange (SparseReducer::ExchangeSelected) the decoded pairs of
//                      every node are copied to the device and scatter-added in node order and
//                      averaged there (ScatterAddAverage, bit-identical to the host's decoding);
//                      each tensor's slice is copied into local rank 0's buffer, whence
//                      DeliverResult broadcasts it to the other GPUs; the residuals are kept.
//
// Residuals are per tensor, in device memory on the tensor's GPU, so they follow any re-plan as
// the host's do (tensor_state.h). A tensor that goes through the host path meanwhile (a group
// that mixes host and device tensors, or tensors on different GPUs) takes its residual along
// (SparseReducer::AddResidual) and brings it back (TakeResidual): none is lost or counted twice.
//
// The library is loaded at the first use (SPARSYNC_SPARSIFY_LIBRARY, else
// libsparsync_sparsify_cuda.so beside the daemon's executable), like the CUDA runtime and NCCL,
// so a CPU-only build or machine is unaffected. It must use the same CUDA runtime as the intake
// (SPARSYNC_CUDART). If it does not load, or its first device workspace cannot be made, the log
// says why once and the node's CUDA gradients are sparsified on the host from then on.
//
// Threads: Select runs on the executor's stage A, Finish on stage B, on different slots. All
// device work goes to the per-device stream of the CUDA intake, in that order, so it is ordered
// with the staging copies of the same tensors.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "daemon/common/status.h"
#include "daemon/pipeline/sparse_reducer.h"
#include "daemon/pipeline/tensor_table.h"
#include "daemon/transport/transport.h"
#include "kernels/cuda/sparsify_plugin.h"

namespace sparsync::pipeline {

struct SparsifyLibrary;

class DeviceSparse {
 public:
  // `library`: SPARSYNC_SPARSIFY_LIBRARY (empty: beside the executable).
  explicit DeviceSparse(std::string library);
  ~DeviceSparse();
  DeviceSparse(const DeviceSparse&) = delete;
  DeviceSparse& operator=(const DeviceSparse&) = delete;

  // When a library is named: loads it now, so that a wrong setting stops the daemon at start.
  Status LoadExplicit();
  // Whether the device path is usable: the library loaded (at the first call) and no device
  // workspace failed since. Thread-safe.
  bool Available();

  // One executor slot's device buffers (group, residual, selection, gathered pairs) and the
  // library's workspace, on one device; grown as groups grow, freed with the slot.
  struct Scratch {
    Scratch() = default;
    ~Scratch();
    Scratch(const Scratch&) = delete;
    Scratch& operator=(const Scratch&) = delete;

    void Clear();  // frees everything; the next Select allocates again

    std::shared_ptr<const SparsifyLibrary> lib;
    std::shared_ptr<const intake::CudaRuntime> rt;
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

  // Whether `members` can take the device path: each one's node sum still on the device
  // (GroupMember::on_device), all on one GPU.
  static bool Takes(std::span<const GroupMember> members);

  // Stage A. `members` and `slices` describe the group (slices[i] is members[i]'s); `sparse`
  // must SelectsOnDevice(). Fills `prepared` as SparseReducer::Prepare does. An error that the
  // device path cannot go on from (the workspace cannot be made) is returned with
  // *fall_back = true and nothing changed: the caller stages the group to the host instead.
  Status Select(std::span<GroupMember> members, std::span<const GroupSlice> slices,
                SparseReducer* sparse, Scratch* scratch, PreparedGroup* prepared,
                bool* fall_back);
  // Stage B, after Select on the same slot: the exchange, the average into each member's
  // local rank 0 buffer, and the residuals. Sets every member's result_on_device.
  Status Finish(std::span<GroupMember> members, std::span<const GroupSlice> slices,
                SparseReducer* sparse, Scratch* scratch, PreparedGroup& prepared, double divisor,
                uint32_t* tag);

  // ---- Dense groups on the device ----
  // With a transport that takes the GPU's memory (the NCCL backend, Transport::cuda_device), a
  // dense group whose node sum is on the device is reduced there too: stage A puts the tensors'
  // sums side by side in the slot's group buffer (a lone tensor stays in its own buffer), stage B
  // allreduces that buffer in device memory, divides it (sparsync_sp_divide, bit-identical to the
  // host's division) and copies each tensor's slice into local rank 0's buffer. Nothing of the
  // group crosses PCIe.

  // Whether a dense group of `members` can take this path on `transport`: Takes(members), all
  // float32, on the transport's GPU.
  static bool TakesDense(std::span<const GroupMember> members,
                         const transport::Transport& transport);
  // Stage A. Leaves the group ready for the transport (the stream synchronised). *fall_back as
  // for Select: the library is not available, or the group buffer cannot be had.
  Status PrepareDense(std::span<GroupMember> members, std::span<const GroupSlice> slices,
                      Scratch* scratch, bool* fall_back);
  // Stage B, after PrepareDense on the same slot. Sets every member's result_on_device.
  Status FinishDense(std::span<GroupMember> members, std::span<const GroupSlice> slices,
                     Scratch* scratch, transport::Transport* transport, double divisor,
                     uint32_t* tag);

  // A tensor's residual leaves the device (to `sparse`'s host state), when its group goes
  // through the host path. Blocks for the copy.
  Status MoveResidualsToHost(std::span<const GroupSlice> slices, SparseReducer* sparse);

  // Frees `name`'s device residual, if any (SparseReducer::Forget's counterpart). REQUIRES: no
  // group of it in flight.
  void Forget(const std::string& name);

  // Bytes of device residuals held, for tests.
  size_t residual_bytes() const;

 private:
  struct Residual {
    std::shared_ptr<const intake::CudaRuntime> rt;
    int device = 0;
    float* data = nullptr;
    size_t count = 0;
  };
  bool LoadLocked(std::string* error);  // REQUIRES: mu_ held
  // `name`'s residual, taken out of the map (data null: it had none); the caller owns it.
  Residual Release(const std::string& name);
  // The library, unless the device path was disabled (null then).
  std::shared_ptr<const SparsifyLibrary> Library() const;
  // Points `scratch` at `device` and `lib` (freeing what it held elsewhere) and grows its group
  // buffer to `n` elements.
  static Status Bind(Scratch* scratch, const std::shared_ptr<const SparsifyLibrary>& lib,
                     const std::shared_ptr<const intake::CudaRuntime>& rt, int device, size_t n);
  // `name`'s residual on `device`: the one kept there, or one brought from the host or another
  // GPU (its upload queued on `stream` from a vector added to `uploads`); null when it has none.
  Result<float*> ResidualOn(const std::string& name, size_t count, int device,
                            const std::shared_ptr<const intake::CudaRuntime>& rt, void* stream,
                            SparseReducer* sparse, std::vector<std::vector<float>>* uploads);
  void Disable(const std::string& why);

  const std::string library_;
  mutable std::mutex mu_;
  std::shared_ptr<const SparsifyLibrary> lib_;
  bool load_failed_ = false;
  bool disabled_ = false;
  std::atomic<bool> announced_{false};        // the first sparse group on a device was logged
  std::atomic<bool> announced_dense_{false};  // the first dense one
  std::map<std::string, Residual> residuals_;  // guarded by mu_ (the map; one stage per tensor)
};

}  // namespace sparsync::pipeline
