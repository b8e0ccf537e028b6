// Workspace: allocation of the device scratch (sizes below) and the read-back of a call's result.

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/device_state.h"

namespace sparsync::kernels::cuda {

using internal::DeviceBuffers;
using internal::SelectState;

namespace {

int64_t NextPowerOfTwo(int64_t v) {
  int64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

template <typename T>
Status Allocate(T** ptr, int64_t count, const char* what) {
  const auto bytes = static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(T);
  void* raw = nullptr;
  SPARSYNC_KERNELS_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&raw, bytes), what));
  *ptr = static_cast<T*>(raw);
  return Status::Ok();
}

}  // namespace

Workspace::Workspace(const WorkspaceLimits& limits, std::unique_ptr<DeviceBuffers> buffers)
    : limits_(limits), buffers_(std::move(buffers)) {}

Workspace::~Workspace() {
  DeviceBuffers& b = *buffers_;
  // Errors here (a context already broken by a kernel fault) cannot be acted on.
  void* device[] = {b.state, b.hist,     b.tile_above, b.tile_tie,   b.candidates, b.partials,
                    b.draws, b.repeated, b.hash_keys,  b.hash_steps, b.bitmap,     b.ranges};
  for (void* p : device) {
    if (p != nullptr) cudaFree(p);
  }
  if (b.host_state != nullptr) cudaFreeHost(b.host_state);
}

Result<std::unique_ptr<Workspace>> Workspace::Create(const WorkspaceLimits& limits) {
  if (limits.max_numel < 0 || limits.max_numel > std::numeric_limits<int32_t>::max()) {
    return InvalidArgumentError("cuda Workspace: max_numel " + std::to_string(limits.max_numel) +
                                " must be in [0, INT32_MAX]");
  }
  if (limits.max_k < 0 || limits.max_k > limits.max_numel) {
    return InvalidArgumentError("cuda Workspace: max_k " + std::to_string(limits.max_k) +
                                " must be in [0, max_numel]");
  }
  int device = 0;
  SPARSYNC_KERNELS_RETURN_IF_ERROR(CudaStatus(cudaGetDevice(&device), "cuda Workspace"));
  auto buffers = std::make_unique<DeviceBuffers>();
  DeviceBuffers& b = *buffers;
  SPARSYNC_KERNELS_RETURN_IF_ERROR(
      CudaStatus(cudaDeviceGetAttribute(&b.sm_count, cudaDevAttrMultiProcessorCount, device),
                 "cuda Workspace: reading the multiprocessor count"));
  b.max_numel = limits.max_numel;
  b.max_k = limits.max_k;
  b.max_tiles = internal::NumTiles(std::max<int64_t>(limits.max_numel, 1));
  // Candidates of top-k's fast path: T's level-1 bin usually holds far fewer than this.
  b.candidate_capacity = static_cast<uint32_t>(
      std::min<int64_t>(std::max<int64_t>(limits.max_numel, 1),
                        2 * limits.max_k + limits.max_numel / 32 + internal::kTileSize));
  const int64_t hash_slots = NextPowerOfTwo(std::max<int64_t>(2 * limits.max_k, 2));
  b.hash_mask = static_cast<uint32_t>(hash_slots - 1);

  // From here on the Workspace owns whatever was allocated, so a failure frees it.
  std::unique_ptr<Workspace> ws(new Workspace(limits, std::move(buffers)));
  DeviceBuffers& d = *ws->buffers_;
  void* pinned = nullptr;
  SPARSYNC_KERNELS_RETURN_IF_ERROR(CudaStatus(cudaMallocHost(&pinned, sizeof(SelectState)),
                                              "cuda Workspace: pinned result slot"));
  d.host_state = static_cast<SelectState*>(pinned);
  std::memset(d.host_state, 0, sizeof(SelectState));
  const int64_t tiles = d.max_tiles + 1;
  SPARSYNC_KERNELS_RETURN_IF_ERROR(Allocate(&d.state, 1, "cuda Workspace: state"));
  SPARSYNC_KERNELS_RETURN_IF_ERROR(Allocate(
      &d.hist, int64_t{internal::kRadixLevels} * internal::kRadixBins, "cuda Workspace: hist"));
  SPARSYNC_KERNELS_RETURN_IF_ERROR(Allocate(&d.tile_above, tiles, "cuda Workspace: tiles"));
  SPARSYNC_KERNELS_RETURN_IF_ERROR(Allocate(&d.tile_tie, tiles, "cuda Workspace: tiles"));
  SPARSYNC_KERNELS_RETURN_IF_ERROR(
      Allocate(&d.candidates, d.candidate_capacity, "cuda Workspace: candidates"));
  SPARSYNC_KERNELS_RETURN_IF_ERROR(
      Allocate(&d.partials, 2 * internal::kReduceBlocks, "cuda Workspace: partial sums"));
  if (limits.max_k > 0) {
    SPARSYNC_KERNELS_RETURN_IF_ERROR(Allocate(&d.draws, limits.max_k, "cuda Workspace: random-k"));
    SPARSYNC_KERNELS_RETURN_IF_ERROR(
        Allocate(&d.repeated, limits.max_k, "cuda Workspace: random-k"));
    SPARSYNC_KERNELS_RETURN_IF_ERROR(
        Allocate(&d.hash_keys, hash_slots, "cuda Workspace: random-k"));
    SPARSYNC_KERNELS_RETURN_IF_ERROR(
        Allocate(&d.hash_steps, hash_slots, "cuda Workspace: random-k"));
    SPARSYNC_KERNELS_RETURN_IF_ERROR(
        Allocate(&d.bitmap, (limits.max_numel + 31) / 32, "cuda Workspace: random-k"));
  }
  SPARSYNC_KERNELS_RETURN_IF_ERROR(Allocate(
      &d.ranges, int64_t{internal::kMaxPayloadsPerLaunch} * tiles, "cuda Workspace: ranges"));
  return ws;
}

const int64_t* Workspace::device_count() const { return &buffers_->state->selected; }

bool Workspace::last_used_candidates() const { return buffers_->host_state->filtered != 0; }

Result<int64_t> Workspace::Finish(cudaStream_t stream) {
  const DeviceBuffers& b = *buffers_;
  last_nonfinite_index_ = -1;
  SPARSYNC_KERNELS_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(b.host_state, b.state, sizeof(SelectState), cudaMemcpyDeviceToHost, stream),
      "cuda Workspace::Finish: reading the result"));
  SPARSYNC_KERNELS_RETURN_IF_ERROR(
      CudaStatus(cudaStreamSynchronize(stream), "cuda Workspace::Finish: waiting for the kernels"));
  const SelectState& s = *b.host_state;
  if (s.first_bad != internal::kNoIndex) {
    float value = std::numeric_limits<float>::quiet_NaN();
    if (error_source_ != nullptr) {
      SPARSYNC_KERNELS_RETURN_IF_ERROR(CudaStatus(
          cudaMemcpy(&value, error_source_ + s.first_bad, sizeof(float), cudaMemcpyDeviceToHost),
          "cuda Workspace::Finish: reading the non-finite element"));
    }
    last_nonfinite_index_ = static_cast<int64_t>(s.first_bad);
    return NonFiniteError(last_nonfinite_index_, value);
  }
  if (s.invalid != 0) {
    return InvalidArgumentError("cuda ScatterAddAverage: " + std::to_string(s.invalid) +
                                " payload entries have an index out of range or out of order; "
                                "they were skipped");
  }
  if (s.selected > s.capacity) {
    return OutOfRangeError("cuda selection: " + std::to_string(s.selected) +
                           " pairs selected but the output holds " + std::to_string(s.capacity) +
                           "; only the first were written");
  }
  return s.selected;
}

}  // namespace sparsync::kernels::cuda
