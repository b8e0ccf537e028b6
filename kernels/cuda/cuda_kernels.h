#pragma once
// Device API of the CUDA sparsification kernels: the compressors of kernels/sparsifier.h on
// float32 data that lives on the GPU, the float16 packing of sent values, and the scatter-add +
// average that turns every node's gathered (indices, values) payload into the dense result (or,
// for a dense sum, the division that averages it).
//
// Same selection rules as kernels/reference/ (the test oracles; each rule is described, with its
// paper, in the reference .cc file), with these differences of form:
//  * Pointers are device pointers; every call only enqueues work on `stream` and returns at once,
//    except Wangni(), which waits on the stream between greedy passes (see there).
//  * The number of selected pairs and the non-finite check are results on the device. After a
//    selection call, Workspace::Finish(stream) waits for the stream and returns the count, or
//    INVALID_ARGUMENT naming the first non-finite element (then nothing was written). Consumers
//    that stay on the device read Workspace::device_count() instead.
//  * Output indices are strictly ascending, as in the CPU contract. A variable-count compressor
//    may select more pairs than `out.capacity`: it then writes the first `capacity` and Finish
//    returns OUT_OF_RANGE with the count, so a caller can size the output below numel.
//  * The Status a call returns covers its arguments and the launch; CUDA errors are converted in
//    one place (cuda_status.h).
//
// Threading: a Workspace belongs to one stream at a time; calls that share a Workspace must be
// ordered on one stream and each one's result read (Finish) before the next call is enqueued.
// Distinct Workspaces are independent.

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <span>

#include "kernels/sparsifier.h"
#include "kernels/status.h"

namespace sparsync::kernels::cuda {

// Caller-owned output in device memory with room for `capacity` (index, value) pairs.
struct DeviceSparse {
  int32_t* indices = nullptr;
  float* values = nullptr;
  int64_t capacity = 0;
};

struct WorkspaceLimits {
  int64_t max_numel = 0;  // largest tensor any call will see; REQUIRES <= INT32_MAX
  // Largest k of topk / dgc / randomk. Random-k needs it (its scratch is O(k)); for top-k it sizes
  // the candidate buffer of the fast path (a larger k still works, through a slower path).
  int64_t max_k = 0;
};

namespace internal {
struct DeviceBuffers;
}

// Device scratch of the kernels, allocated once (cudaMalloc on the current device): no call
// allocates. About 8 * (2 max_k + max_numel / 32) bytes of candidates, 16 * max_k for random-k,
// max_numel / 8 for its bitmap and a few small tables.
class Workspace {
 public:
  static Result<std::unique_ptr<Workspace>> Create(const WorkspaceLimits& limits);
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  const WorkspaceLimits& limits() const { return limits_; }

  // Waits for `stream`, then returns the number of pairs the last call wrote, or its error:
  // INVALID_ARGUMENT for a non-finite input element (as NonFiniteError) or an invalid payload
  // entry, OUT_OF_RANGE when the selection exceeded the output capacity, or a CUDA error.
  Result<int64_t> Finish(cudaStream_t stream);

  // Device address of the selected count (int64) of the last call, valid in stream order.
  const int64_t* device_count() const;

  // The index of the first non-finite input element when the last Finish returned NonFiniteError,
  // else -1: the index as a value, for callers that pass it on (the C plugin, sparsify_plugin.h).
  int64_t last_nonfinite_index() const { return last_nonfinite_index_; }

  // Diagnostics (tests, benchmarks): whether the last top-k / DGC / quantile-threshold call that
  // Finish read back took the candidate fast path rather than the dense radix passes.
  bool last_used_candidates() const;

  // For the implementation files (kernels/cuda/*.cu).
  const internal::DeviceBuffers& buffers() const { return *buffers_; }
  // The array the last call checked for non-finite values (Finish reads the offending value).
  void set_error_source(const float* data) { error_source_ = data; }

 private:
  Workspace(const WorkspaceLimits& limits, std::unique_ptr<internal::DeviceBuffers> buffers);

  WorkspaceLimits limits_;
  std::unique_ptr<internal::DeviceBuffers> buffers_;
  const float* error_source_ = nullptr;
  int64_t last_nonfinite_index_ = -1;
};

// Exact top-k of |x| with the reference tie-break (equal magnitudes: smaller index first).
// REQUIRES: 1 <= k <= numel (or numel == 0), out.capacity >= k.
Status TopK(const float* x, int64_t numel, int64_t k, DeviceSparse out, Workspace& ws,
            cudaStream_t stream);

// Top-k with error feedback fused (Aji & Heafield, EMNLP 2017; Stich et al., NeurIPS 2018):
//   a = residual + grad; send TopK(a); residual = a with the sent coordinates zeroed.
// One read of grad and residual and one write of residual, plus reads of a for the selection.
// If a holds a non-finite value, nothing is selected (Finish reports it) and the residual is left
// unspecified (blocks that start after the value was reported stop early, so it is part a, part
// the old residual): the caller must discard or reset it.
Status TopKWithResidual(const float* grad, float* residual, int64_t numel, int64_t k,
                        DeviceSparse out, Workspace& ws, cudaStream_t stream);

// Random-k with Floyd's algorithm, the same set as reference/randomk.cc for the same seed (pass
// context.shared_seed for the shared-seed mode), and the same values: x_i, or with `unbiased`
// (SparsifierOptions::unbiased) RandomKScaled(x_i, d/k). REQUIRES: k <= ws.limits().max_k.
Status RandomK(const float* x, int64_t numel, int64_t k, uint64_t seed, DeviceSparse out,
               Workspace& ws, cudaStream_t stream, bool unbiased = false);

// Threshold sparsification, fixed (options.threshold > 0: |x| > tau) or quantile-estimated from
// a seeded sample (Aji & Heafield), as reference/threshold.cc.
Status Threshold(const float* x, int64_t numel, const SparsifierOptions& options, uint64_t seed,
                 DeviceSparse out, Workspace& ws, cudaStream_t stream);

// Gaussian-k (Shi, Chu, Cheung, See 2019), as reference/gaussiank.cc.
Status GaussianK(const float* x, int64_t numel, const SparsifierOptions& options, DeviceSparse out,
                 Workspace& ws, cudaStream_t stream);

// Wangni et al. (NeurIPS 2018), greedy probabilities for expected density options.density,
// seeded Bernoulli sampling and rescaling, as reference/wangni.cc. Waits on `stream` after every
// two greedy passes to learn whether the fixed point was reached (usually once in all).
// options.variance_budget > 0 (the closed form, which sorts) is CPU-only: INVALID_ARGUMENT.
Status Wangni(const float* grad, int64_t numel, const SparsifierOptions& options, uint64_t seed,
              DeviceSparse out, Workspace& ws, cudaStream_t stream);

// DGC state on the device, numel floats each, zero-initialised by the caller.
struct DeviceDgcState {
  float* momentum = nullptr;      // u
  float* accumulation = nullptr;  // v
};

// Deep Gradient Compression step (Lin et al., ICLR 2018), as reference/dgc.cc: optional clipping,
// momentum correction, exact top-k of |v|, momentum factor masking. The state is untouched when
// grad holds a non-finite value. k = SelectedCount(numel, DgcDensityForEpoch(...), options.k).
Status Dgc(const float* grad, int64_t numel, const SparsifierOptions& options, int64_t epoch,
           DeviceDgcState state, DeviceSparse out, Workspace& ws, cudaStream_t stream);

// out[j] = float16 bits of values[j], rounded to nearest even (as kernels/dtype.h FloatToHalf for
// every non-NaN value; NaN stays NaN).
Status PackFloat16(const float* values, int64_t count, uint16_t* out, cudaStream_t stream);

// PackFloat16, and residual[indices[j]] = values[j] - float(out[j]): the part of each sent value
// that float16 does not deliver goes back to the residual (TopKWithResidual left those entries
// zero). Entries whose index is outside [0, numel) are skipped.
Status PackFloat16WithResidual(const float* values, const int32_t* indices, int64_t count,
                               uint16_t* out, float* residual, int64_t numel, cudaStream_t stream);

// In place: data[i] = data[i] / float(divisor), an IEEE float32 division, skipped for divisor 1:
// bit-identical to the host's float32 averaging (a NaN stays NaN; its payload may not). One read
// and one write of data; numel 0 launches nothing. REQUIRES: divisor finite and non-zero.
Status Divide(float* data, int64_t numel, double divisor, cudaStream_t stream);

enum class PayloadValues : uint8_t { kFloat32, kFloat16 };

// One node's decoded payload in device memory: `count` pairs, indices strictly ascending in
// [0, numel), values float32 or float16 bits.
struct DevicePayload {
  const int32_t* indices = nullptr;
  const void* values = nullptr;
  int64_t count = 0;
  PayloadValues value_type = PayloadValues::kFloat32;
};

// dense[i] = (sum over payloads, in the order given, of their value at i) / divisor, in float32;
// zero where no payload has i. The additions happen in payload (rank) order and the division
// as float32 (skipped for divisor 1), as the CPU pipeline does, so every node that runs this on
// the same payloads holds bit-identical results. One write of dense and one read of the payloads.
// Invalid entries (index out of range, indices not strictly ascending) are never written out of
// bounds; Finish reports them as INVALID_ARGUMENT.
Status ScatterAddAverage(std::span<const DevicePayload> payloads, float* dense, int64_t numel,
                         double divisor, Workspace& ws, cudaStream_t stream);

}  // namespace sparsync::kernels::cuda
