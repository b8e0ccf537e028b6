// CUDA random-k and Wangni sparsification: the seeded compressors.
//
// Random-k (Stich, Cordonnier, Jaggi, "Sparsified SGD with Memory", NeurIPS 2018) draws its set
// with Floyd's algorithm (Bentley & Floyd, CACM 1987), as reference/randomk.cc: for the steps
// j = d-k .. d-1, t_j = uniform{0..j}; the step adds t_j, or j itself when t_j is already in.
// The loop is sequential, but whether "t_j is already in" has a closed form that parallelises.
// With base = d - k, let R(j) = [t_i == t_j for some earlier step i] and dup(j) = "t_j is in".
//   * t_j < base: only draws add t_j, so dup(j) = R(j).
//   * t_j == j: j cannot be in yet, dup(j) = false (and R(j) is false too).
//   * base <= t_j < j: t_j is in iff step t_j added itself (t_{t_j} == t_j, which is R(j) for
//     i = t_j, or dup(t_j)) or a step between drew it (R(j)): dup(j) = R(j) || dup(t_j).
// So dup(j) follows the chain j -> t_j -> t_{t_j} ... while t stays in [base, step), stopping
// at the first R; the chain shrinks geometrically (t_j is uniform below j). R comes from a hash
// table holding the first step that drew each value. The chosen elements go into a bitmap, which
// an ordered compaction turns into ascending indices.
//
// Wangni, Wang, Liu, Zhang, "Gradient Sparsification for Communication-Efficient Distributed
// Optimization", NeurIPS 2018: greedy probabilities for expected density kappa. As in
// kernels/cpu/wangni.cc, every pass keeps p_i = min(lambda |g_i|, 1), so a pass needs only the
// count and the sum of |g_i| where lambda |g_i| < 1 (one reduction); the host loops until c <= 1.
// Then Bernoulli draws u_i < p_i (counter i of kWangniBernoulli) and the ordered compaction sends
// g_i / p_i. The reductions run in a fixed order, so lambda may differ from the CPU's in the last
// bit of a double; the chosen set agrees unless a draw falls within that bit of p_i.

#include <algorithm>
#include <string>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/select_kernels.cuh"

namespace sparsync::kernels::cuda {
namespace {

using internal::DeviceBuffers;
using internal::InitParams;
using internal::kBlockThreads;
using internal::kReduceBlocks;
using internal::kWarps;
using internal::SelectState;

constexpr uint32_t kEmptySlot = 0xFFFFFFFFu;  // hash key and step sentinel (memset 0xFF)

__device__ __forceinline__ uint32_t HashSlot(uint32_t value, uint32_t mask) {
  return static_cast<uint32_t>(internal::Mix64OnDevice(value)) & mask;
}

__global__ void CheckFiniteKernel(const float* x, int64_t n, DeviceBuffers b) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    if (internal::MagnitudeKey(x[i]) >= internal::kInfKey) internal::ReportBad(b.state, i);
  }
}

// Step `base + s` of Floyd's loop: its draw, recorded with the first step that drew the value.
__global__ void DrawKernel(int64_t base, int64_t k, uint64_t seed, uint32_t mask, DeviceBuffers b) {
  for (int64_t s = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; s < k;
       s += int64_t{gridDim.x} * blockDim.x) {
    const auto j = static_cast<uint64_t>(base + s);
    const auto t = static_cast<uint32_t>(
        internal::RandomBelowOnDevice(seed, RandomStream::kRandomKIndices, j, j + 1));
    b.draws[s] = static_cast<int32_t>(t);
    uint32_t slot = HashSlot(t, mask);
    for (;;) {
      const uint32_t previous = atomicCAS(b.hash_keys + slot, kEmptySlot, t);
      if (previous == kEmptySlot || previous == t) {
        atomicMin(b.hash_steps + slot, static_cast<uint32_t>(s));
        break;
      }
      slot = (slot + 1) & mask;
    }
  }
}

// R(s): an earlier step drew the same value.
__global__ void RepeatKernel(int64_t k, uint32_t mask, DeviceBuffers b) {
  for (int64_t s = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; s < k;
       s += int64_t{gridDim.x} * blockDim.x) {
    const auto t = static_cast<uint32_t>(b.draws[s]);
    uint32_t slot = HashSlot(t, mask);
    while (b.hash_keys[slot] != t) slot = (slot + 1) & mask;
    b.repeated[s] = b.hash_steps[slot] < static_cast<uint32_t>(s) ? 1 : 0;
  }
}

// The element step `base + s` adds, into the bitmap.
__global__ void ResolveKernel(int64_t base, int64_t k, DeviceBuffers b) {
  for (int64_t s = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; s < k;
       s += int64_t{gridDim.x} * blockDim.x) {
    int64_t at = s;
    bool taken = false;
    for (;;) {
      if (b.repeated[at]) {
        taken = true;
        break;
      }
      const int64_t t = b.draws[at];
      if (t >= base && t < base + at) {
        at = t - base;
      } else {
        break;
      }
    }
    const int64_t chosen = taken ? base + s : b.draws[s];
    atomicOr(b.bitmap + (chosen >> 5), 1u << (chosen & 31));
  }
}

// Bitmap tiles: kBlockThreads threads x kWordsPerThread words, in index order.
constexpr int kWordsPerThread = 8;
constexpr int64_t kBitmapTileWords = int64_t{kBlockThreads} * kWordsPerThread;

__global__ void __launch_bounds__(kBlockThreads) CountBitmapKernel(int64_t words, DeviceBuffers b) {
  __shared__ uint2 scratch[kWarps + 1];
  const int64_t tiles = (words + kBitmapTileWords - 1) / kBitmapTileWords;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t first = tile * kBitmapTileWords + int64_t{threadIdx.x} * kWordsPerThread;
    uint32_t count = 0;
    for (int q = 0; q < kWordsPerThread; ++q) {
      if (first + q < words) count += __popc(b.bitmap[first + q]);
    }
    uint2 total;
    internal::BlockExclusiveSum2<kBlockThreads>(make_uint2(count, 0), &total, scratch);
    if (threadIdx.x == 0) {
      b.tile_above[tile] = total.x;
      b.tile_tie[tile] = 0;
    }
  }
}

__global__ void __launch_bounds__(kBlockThreads)
    WriteBitmapKernel(const float* x, int64_t words, DeviceBuffers b, int32_t* out_indices,
                      float* out_values, int64_t capacity, bool unbiased, double scale) {
  __shared__ uint2 scratch[kWarps + 1];
  if (internal::InputWasBad(b.state)) return;  // set by an earlier kernel: uniform
  const int64_t tiles = (words + kBitmapTileWords - 1) / kBitmapTileWords;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t first = tile * kBitmapTileWords + int64_t{threadIdx.x} * kWordsPerThread;
    uint32_t w[kWordsPerThread];
    uint32_t count = 0;
    for (int q = 0; q < kWordsPerThread; ++q) {
      w[q] = first + q < words ? b.bitmap[first + q] : 0u;
      count += __popc(w[q]);
    }
    uint2 total;
    const uint2 before =
        internal::BlockExclusiveSum2<kBlockThreads>(make_uint2(count, 0), &total, scratch);
    int64_t pos = int64_t{b.tile_above[tile]} + before.x;
    for (int q = 0; q < kWordsPerThread; ++q) {
      uint32_t bits = w[q];
      while (bits != 0) {
        const int bit = __ffs(bits) - 1;
        bits &= bits - 1;
        const int64_t i = (first + q) * 32 + bit;
        if (pos < capacity) {
          out_indices[pos] = static_cast<int32_t>(i);
          // As RandomKScaled (kernels/sparsifier.h): one double product, one rounding.
          out_values[pos] = unbiased ? static_cast<float>(static_cast<double>(x[i]) * scale) : x[i];
        }
        ++pos;
      }
    }
  }
}

// Wangni: partial sums of |g| and the non-finite check.
__global__ void __launch_bounds__(kBlockThreads)
    AbsSumKernel(const float* g, int64_t n, DeviceBuffers b) {
  __shared__ double scratch[kWarps];
  double sum = 0.0;
  for (int64_t i = int64_t{blockIdx.x} * kBlockThreads + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * kBlockThreads) {
    const float v = g[i];
    if (internal::MagnitudeKey(v) >= internal::kInfKey) internal::ReportBad(b.state, i);
    sum += fabs(static_cast<double>(v));
  }
  sum = internal::BlockSum<kBlockThreads>(sum, scratch);
  if (threadIdx.x == 0) b.partials[blockIdx.x] = sum;
}

// One greedy pass: count and sum of |g_i| over {i : lambda |g_i| < 1}.
__global__ void __launch_bounds__(kBlockThreads)
    SumBelowKernel(const float* g, int64_t n, DeviceBuffers b) {
  __shared__ double scratch[kWarps];
  const SelectState* s = b.state;
  if (internal::InputWasBad(s) || s->done) return;  // set by earlier kernels: uniform
  const double lambda = s->lambda;
  double count = 0.0, sum = 0.0;
  for (int64_t i = int64_t{blockIdx.x} * kBlockThreads + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * kBlockThreads) {
    const double a = fabs(static_cast<double>(g[i]));
    if (lambda * a < 1.0) {
      count += 1.0;
      sum += a;
    }
  }
  count = internal::BlockSum<kBlockThreads>(count, scratch);
  sum = internal::BlockSum<kBlockThreads>(sum, scratch);
  if (threadIdx.x == 0) {
    b.partials[blockIdx.x] = count;
    b.partials[kReduceBlocks + blockIdx.x] = sum;
  }
}

// One block of kReduceBlocks threads. first: lambda = kappa d / sum|g|. Otherwise one greedy
// update: c = (kappa d - d + |I|) / (lambda sum_I |g|); stop if c <= 1, else lambda *= c.
__global__ void __launch_bounds__(kReduceBlocks)
    WangniStepKernel(DeviceBuffers b, bool first, double kappa, int64_t n, int max_passes) {
  __shared__ double scratch[kReduceBlocks / 32];
  SelectState* s = b.state;
  if (internal::InputWasBad(s) || s->done) {
    if (threadIdx.x == 0) s->done = 1;  // a non-finite gradient ends the host's loop too
    return;
  }
  const double a = internal::BlockSum<kReduceBlocks>(b.partials[threadIdx.x], scratch);
  const double c =
      first ? 0.0
            : internal::BlockSum<kReduceBlocks>(b.partials[kReduceBlocks + threadIdx.x], scratch);
  if (threadIdx.x != 0) return;
  const double d = static_cast<double>(n);
  if (first) {
    s->lambda = a > 0 ? kappa * d / a : 0.0;
    s->done = a > 0 && max_passes > 0 ? 0 : 1;
    return;
  }
  const double in_count = a, in_sum = s->lambda * c;
  if (in_sum == 0) {
    s->done = 1;
    return;
  }
  const double scale = (kappa * d - d + in_count) / in_sum;
  if (scale <= 1.0) {
    s->done = 1;
    return;
  }
  s->lambda *= scale;
  s->passes += 1;
  if (s->passes >= max_passes) s->done = 1;
}

}  // namespace

Status RandomK(const float* x, int64_t numel, int64_t k, uint64_t seed, DeviceSparse out,
               Workspace& ws, cudaStream_t stream, bool unbiased) {
  constexpr const char* kWho = "cuda RandomK";
  SPARSYNC_KERNELS_RETURN_IF_ERROR(
      internal::CheckSelectionArgs(kWho, x, numel, out, numel > 0 ? k : 0, ws));
  if (numel > 0 && (k < 1 || k > numel)) {
    return InvalidArgumentError(std::string(kWho) + ": k = " + std::to_string(k) +
                                " must be in [1, numel]");
  }
  if (k > ws.limits().max_k) {
    return FailedPreconditionError(std::string(kWho) + ": k = " + std::to_string(k) +
                                   " exceeds the workspace's max_k " +
                                   std::to_string(ws.limits().max_k));
  }
  ws.set_error_source(x);
  const DeviceBuffers& b = ws.buffers();
  InitParams init;
  init.capacity = out.capacity;
  internal::LaunchInit(b, init, stream);
  if (numel == 0) return LaunchStatus(kWho);
  uint32_t mask = 1;
  while (mask + 1 < 2 * k) mask = mask * 2 + 1;  // 2k <= slots <= the workspace's
  const int64_t words = (numel + 31) / 32;
  SPARSYNC_KERNELS_RETURN_IF_ERROR(CudaStatus(
      cudaMemsetAsync(b.hash_keys, 0xFF, (mask + size_t{1}) * sizeof(uint32_t), stream), kWho));
  SPARSYNC_KERNELS_RETURN_IF_ERROR(CudaStatus(
      cudaMemsetAsync(b.hash_steps, 0xFF, (mask + size_t{1}) * sizeof(uint32_t), stream), kWho));
  SPARSYNC_KERNELS_RETURN_IF_ERROR(CudaStatus(
      cudaMemsetAsync(b.bitmap, 0, static_cast<size_t>(words) * sizeof(uint32_t), stream), kWho));
  const int stride_grid = b.sm_count * 8;
  CheckFiniteKernel<<<internal::TileGrid(b, internal::NumTiles(numel)), kBlockThreads, 0, stream>>>(
      x, numel, b);
  const int k_grid =
      static_cast<int>(std::min<int64_t>((k + kBlockThreads - 1) / kBlockThreads, stride_grid));
  const int64_t base = numel - k;
  DrawKernel<<<k_grid, kBlockThreads, 0, stream>>>(base, k, seed, mask, b);
  RepeatKernel<<<k_grid, kBlockThreads, 0, stream>>>(k, mask, b);
  ResolveKernel<<<k_grid, kBlockThreads, 0, stream>>>(base, k, b);
  const int64_t bitmap_tiles = (words + kBitmapTileWords - 1) / kBitmapTileWords;
  const int bitmap_grid = internal::TileGrid(b, bitmap_tiles);
  CountBitmapKernel<<<bitmap_grid, kBlockThreads, 0, stream>>>(words, b);
  internal::LaunchScanTiles(bitmap_tiles, b, stream);
  WriteBitmapKernel<<<bitmap_grid, kBlockThreads, 0, stream>>>(
      x, words, b, out.indices, out.values, out.capacity, unbiased, RandomKScale(numel, k));
  return LaunchStatus(kWho);
}

Status Wangni(const float* grad, int64_t numel, const SparsifierOptions& options, uint64_t seed,
              DeviceSparse out, Workspace& ws, cudaStream_t stream) {
  constexpr const char* kWho = "cuda Wangni";
  SPARSYNC_KERNELS_RETURN_IF_ERROR(internal::CheckSelectionArgs(kWho, grad, numel, out, 0, ws));
  if (options.variance_budget > 0) {
    return InvalidArgumentError(std::string(kWho) +
                                ": the variance-budget mode sorts |g| and is CPU-only");
  }
  if (!(options.density > 0.0 && options.density <= 1.0) || options.max_greedy_iterations < 0) {
    return InvalidArgumentError(std::string(kWho) + ": invalid density or max_greedy_iterations");
  }
  ws.set_error_source(grad);
  const DeviceBuffers& b = ws.buffers();
  InitParams init;
  init.capacity = out.capacity;
  internal::LaunchInit(b, init, stream);
  if (numel == 0) return LaunchStatus(kWho);
  const int max_passes = options.max_greedy_iterations;
  AbsSumKernel<<<kReduceBlocks, kBlockThreads, 0, stream>>>(grad, numel, b);
  WangniStepKernel<<<1, kReduceBlocks, 0, stream>>>(b, true, options.density, numel, max_passes);
  // Two passes per round trip: most gradients reach the fixed point within the first round.
  for (int pass = 0; pass < max_passes; pass += 2) {
    for (int q = pass; q < pass + 2 && q < max_passes; ++q) {
      SumBelowKernel<<<kReduceBlocks, kBlockThreads, 0, stream>>>(grad, numel, b);
      WangniStepKernel<<<1, kReduceBlocks, 0, stream>>>(b, false, options.density, numel,
                                                        max_passes);
    }
    SPARSYNC_KERNELS_RETURN_IF_ERROR(LaunchStatus(kWho));
    SPARSYNC_KERNELS_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpyAsync(&b.host_state->done, &b.state->done, sizeof(int32_t),
                                   cudaMemcpyDeviceToHost, stream),
                   kWho));
    SPARSYNC_KERNELS_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream), kWho));
    if (b.host_state->done) break;
  }
  internal::WangniRule rule;
  rule.seed = seed;
  const int grid = internal::TileGrid(b, internal::NumTiles(numel));
  internal::CountTilesKernel<<<grid, kBlockThreads, 0, stream>>>(rule, grad, numel, b, false,
                                                                 false);
  internal::LaunchScanTiles(internal::NumTiles(numel), b, stream);
  internal::WriteKernel<<<grid, kBlockThreads, 0, stream>>>(
      rule, grad, numel, b, out.indices, out.values, out.capacity, nullptr, nullptr);
  return LaunchStatus(kWho);
}

}  // namespace sparsync::kernels::cuda
