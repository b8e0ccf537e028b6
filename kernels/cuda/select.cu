// CUDA top-k, top-k with error feedback, and DGC; and the shared selection launchers (launch.h).
//
// Top-k with error feedback: Aji & Heafield, "Sparse Communication for Distributed Gradient
// Descent", EMNLP 2017; Stich, Cordonnier, Jaggi, "Sparsified SGD with Memory", NeurIPS 2018.
// DGC: Lin, Han, Mao, Wang, Dally, "Deep Gradient Compression", ICLR 2018 (eq. 6 momentum
// correction, eq. 7 momentum factor masking, §3.2 local gradient clipping). The paper estimates
// the threshold from a sample; like reference/dgc.cc we select the exact top-k.
// The engine (radix select + ordered compaction) is described in select_kernels.cuh.
//
// Passes over the data for top-k with error feedback: one fused read of grad and residual with
// the write of a = residual + grad (level 1), one read of a (level 2 + candidates), one read of a
// for the ordered write; the rest touches only candidates and per-tile counts.

#include <algorithm>
#include <string>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/select_kernels.cuh"
#include "kernels/dgc_state.h"

namespace sparsync::kernels::cuda {
namespace internal {
namespace {

__global__ void InitKernel(DeviceBuffers b, InitParams p) {
  SelectState* s = b.state;
  if (threadIdx.x == 0) {
    *s = SelectState{};
    s->need = p.need;
    s->keep_all_ties = p.keep_all_ties ? 1 : 0;
    s->candidate_capacity = b.candidate_capacity;
    s->cut = p.cut;
    s->tie_key = p.tie_key;
    s->tie_need = p.tie_need;
    s->capacity = p.capacity;
    s->first_bad = kNoIndex;
    s->clip_factor = 1.0;
  }
  for (int i = threadIdx.x; i < kRadixLevels * kRadixBins; i += blockDim.x) b.hist[i] = 0;
}

__global__ void __launch_bounds__(kBlockThreads) Level3CandidatesKernel(DeviceBuffers b) {
  __shared__ uint32_t hist[kRadixBins];
  SelectState* s = b.state;
  if (BlockSeesBadInput(s) || !s->filtered) return;
  const uint32_t prefix = s->prefix;
  const uint32_t mask = s->prefix_mask;
  const uint32_t count = s->candidates;
  for (int i = threadIdx.x; i < kRadixBins; i += kBlockThreads) hist[i] = 0;
  __syncthreads();
  for (uint32_t c = blockIdx.x * kBlockThreads + threadIdx.x; c < count;
       c += gridDim.x * kBlockThreads) {
    const uint32_t key = b.candidates[c].y;
    if ((key & mask) == prefix) atomicAdd(&hist[key & 0x1FFu], 1u);
  }
  MergeAndPick(s, hist, b.hist + 2 * kRadixBins, 2);
}

// Fast path: the per-tile counts are "above T's level-1 bin" (FilterKernel) plus the candidates
// above or equal to T.
__global__ void __launch_bounds__(kBlockThreads) CandidateTileCountKernel(DeviceBuffers b) {
  SelectState* s = b.state;
  if (BlockSeesBadInput(s) || !s->filtered) return;
  const uint32_t t = static_cast<uint32_t>(s->cut);
  const uint32_t count = s->candidates;
  for (uint32_t c = blockIdx.x * kBlockThreads + threadIdx.x; c < count;
       c += gridDim.x * kBlockThreads) {
    const uint2 cand = b.candidates[c];
    const int64_t tile = cand.x / kTileSize;
    if (cand.y > t) {
      atomicAdd(b.tile_above + tile, 1u);
    } else if (cand.y == t) {
      atomicAdd(b.tile_tie + tile, 1u);
    }
  }
}

constexpr int kScanThreads = 1024;
constexpr int kScanItems = 4;

// One block: exclusive prefix sums of tile_above / tile_tie in place, totals at [tiles].
__global__ void __launch_bounds__(kScanThreads) ScanTilesKernel(DeviceBuffers b, int64_t tiles) {
  __shared__ uint2 scratch[kScanThreads / 32 + 1];
  SelectState* s = b.state;
  uint2 carry = make_uint2(0, 0);
  for (int64_t start = 0; start < tiles; start += int64_t{kScanThreads} * kScanItems) {
    const int64_t first = start + int64_t{threadIdx.x} * kScanItems;
    uint32_t above[kScanItems], tie[kScanItems];
    uint2 sum = make_uint2(0, 0);
#pragma unroll
    for (int q = 0; q < kScanItems; ++q) {
      const bool in = first + q < tiles;
      above[q] = in ? b.tile_above[first + q] : 0u;
      tie[q] = in ? b.tile_tie[first + q] : 0u;
      sum.x += above[q];
      sum.y += tie[q];
    }
    uint2 total;
    uint2 run = BlockExclusiveSum2<kScanThreads>(sum, &total, scratch);
    run.x += carry.x;
    run.y += carry.y;
#pragma unroll
    for (int q = 0; q < kScanItems; ++q) {
      if (first + q < tiles) {
        b.tile_above[first + q] = run.x;
        b.tile_tie[first + q] = run.y;
      }
      run.x += above[q];
      run.y += tie[q];
    }
    carry.x += total.x;
    carry.y += total.y;
  }
  if (threadIdx.x == 0) {
    b.tile_above[tiles] = carry.x;
    b.tile_tie[tiles] = carry.y;
    const int64_t ties = int64_t{carry.y} < s->tie_need ? int64_t{carry.y} : s->tie_need;
    s->selected = InputWasBad(s) ? 0 : int64_t{carry.x} + ties;
  }
}

// DGC, pass 0: the squared norm of grad (partials per block) and the finiteness check, so that a
// non-finite gradient leaves the state untouched.
__global__ void __launch_bounds__(kBlockThreads)
    SquaredNormKernel(const float* grad, int64_t n, DeviceBuffers b) {
  __shared__ double scratch[kWarps];
  double sq = 0.0;
  for (int64_t i = int64_t{blockIdx.x} * kBlockThreads + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * kBlockThreads) {
    const float g = grad[i];
    if (MagnitudeKey(g) >= kInfKey) ReportBad(b.state, i);
    sq += static_cast<double>(g) * g;
  }
  sq = BlockSum<kBlockThreads>(sq, scratch);
  if (threadIdx.x == 0) b.partials[blockIdx.x] = sq;
}

// One block of kReduceBlocks threads: the clip factor (reference/dgc.cc: clip when ||g|| > clip).
__global__ void __launch_bounds__(kReduceBlocks) ClipFactorKernel(DeviceBuffers b, double clip) {
  __shared__ double scratch[kReduceBlocks / 32];
  const double sq = BlockSum<kReduceBlocks>(b.partials[threadIdx.x], scratch);
  if (threadIdx.x == 0) {
    const double norm = sqrt(sq);
    b.state->clip = clip > 0 && norm > clip ? 1 : 0;
    b.state->clip_factor = clip / norm;
  }
}

template <class Source>
void LaunchHist1(const Source& source, int64_t n, bool check_finite, const DeviceBuffers& b,
                 cudaStream_t stream) {
  Hist1Kernel<<<TileGrid(b, NumTiles(n)), kBlockThreads, 0, stream>>>(source, n, b, check_finite);
}

int CandidateGrid(const DeviceBuffers& b) {
  const int64_t wanted =
      (int64_t{b.candidate_capacity} + kBlockThreads * 8 - 1) / (kBlockThreads * 8);
  return static_cast<int>(std::clamp<int64_t>(wanted, 1, int64_t{b.sm_count} * 4));
}

}  // namespace

int TileGrid(const DeviceBuffers& b, int64_t tiles) {
  return static_cast<int>(std::clamp<int64_t>(tiles, 1, int64_t{b.sm_count} * 8));
}

void LaunchInit(const DeviceBuffers& b, const InitParams& params, cudaStream_t stream) {
  InitKernel<<<1, kBlockThreads, 0, stream>>>(b, params);
}

void LaunchHist1Dense(const float* x, int64_t n, const DeviceBuffers& b, cudaStream_t stream) {
  LaunchHist1(DenseSource{x}, n, /*check_finite=*/true, b, stream);
}

void LaunchRefineDense(const float* x, int64_t n, bool tile_counts, const DeviceBuffers& b,
                       cudaStream_t stream) {
  const int grid = TileGrid(b, NumTiles(n));
  FilterKernel<<<grid, kBlockThreads, 0, stream>>>(DenseSource{x}, n, b, tile_counts);
  Level3DenseKernel<<<grid, kBlockThreads, 0, stream>>>(DenseSource{x}, n, b);
  LaunchLevel3Candidates(b, stream);
  if (tile_counts) {
    CandidateTileCountKernel<<<CandidateGrid(b), kBlockThreads, 0, stream>>>(b);
    CountTilesKernel<<<grid, kBlockThreads, 0, stream>>>(KeyCutRule{}, x, n, b,
                                                         /*skip_if_filtered=*/true,
                                                         /*check_finite=*/false);
  }
}

void LaunchLevel3Candidates(const DeviceBuffers& b, cudaStream_t stream) {
  Level3CandidatesKernel<<<CandidateGrid(b), kBlockThreads, 0, stream>>>(b);
}

void LaunchCountTiles(const float* x, int64_t n, bool check_finite, const DeviceBuffers& b,
                      cudaStream_t stream) {
  CountTilesKernel<<<TileGrid(b, NumTiles(n)), kBlockThreads, 0, stream>>>(
      KeyCutRule{}, x, n, b, /*skip_if_filtered=*/false, check_finite);
}

void LaunchScanTiles(int64_t tiles, const DeviceBuffers& b, cudaStream_t stream) {
  ScanTilesKernel<<<1, kScanThreads, 0, stream>>>(b, tiles);
}

void LaunchWrite(const float* x, int64_t n, const DeviceSparse& out, float* zero_a, float* zero_b,
                 const DeviceBuffers& b, cudaStream_t stream) {
  WriteKernel<<<TileGrid(b, NumTiles(n)), kBlockThreads, 0, stream>>>(
      KeyCutRule{}, x, n, b, out.indices, out.values, out.capacity, zero_a, zero_b);
}

Status CheckSelectionArgs(const char* who, const void* x, int64_t n, const DeviceSparse& out,
                          int64_t min_capacity, const Workspace& ws) {
  const std::string name(who);
  if (n < 0) return InvalidArgumentError(name + ": negative numel " + std::to_string(n));
  if (n > ws.limits().max_numel) {
    return FailedPreconditionError(name + ": numel " + std::to_string(n) +
                                   " exceeds the workspace's max_numel " +
                                   std::to_string(ws.limits().max_numel));
  }
  if (n > 0 && x == nullptr) return InvalidArgumentError(name + ": input is null");
  if (out.capacity < min_capacity) {
    return OutOfRangeError(name + ": output capacity " + std::to_string(out.capacity) +
                           " is below " + std::to_string(min_capacity));
  }
  if (out.capacity > 0 && (out.indices == nullptr || out.values == nullptr)) {
    return InvalidArgumentError(name + ": output indices or values are null");
  }
  return Status::Ok();
}

}  // namespace internal

using internal::DeviceBuffers;
using internal::InitParams;

namespace {

InitParams TopKInit(int64_t k, const DeviceSparse& out) {
  InitParams init;
  init.need = k;
  init.capacity = out.capacity;
  return init;
}

// After LaunchInit: top-k of the keys of `source` (level 1 fused into it), then the ordered write
// of x, which holds the values once the source has run.
template <class Source>
Status RunTopK(const char* who, const Source& source, bool check_finite, const float* x, int64_t n,
               const DeviceSparse& out, float* zero_a, float* zero_b, const DeviceBuffers& b,
               cudaStream_t stream) {
  if (n > 0) {
    internal::LaunchHist1(source, n, check_finite, b, stream);
    internal::LaunchRefineDense(x, n, /*tile_counts=*/true, b, stream);
    internal::LaunchScanTiles(internal::NumTiles(n), b, stream);
    internal::LaunchWrite(x, n, out, zero_a, zero_b, b, stream);
  }
  return LaunchStatus(who);
}

Status CheckK(const char* who, int64_t n, int64_t k) {
  if (n > 0 && (k < 1 || k > n)) {
    return InvalidArgumentError(std::string(who) + ": k = " + std::to_string(k) +
                                " must be in [1, numel = " + std::to_string(n) + "]");
  }
  return Status::Ok();
}

}  // namespace

Status TopK(const float* x, int64_t numel, int64_t k, DeviceSparse out, Workspace& ws,
            cudaStream_t stream) {
  SPARSYNC_KERNELS_RETURN_IF_ERROR(
      internal::CheckSelectionArgs("cuda TopK", x, numel, out, numel > 0 ? k : 0, ws));
  SPARSYNC_KERNELS_RETURN_IF_ERROR(CheckK("cuda TopK", numel, k));
  ws.set_error_source(x);
  internal::LaunchInit(ws.buffers(), TopKInit(k, out), stream);
  return RunTopK("cuda TopK", internal::DenseSource{x}, true, x, numel, out, nullptr, nullptr,
                 ws.buffers(), stream);
}

Status TopKWithResidual(const float* grad, float* residual, int64_t numel, int64_t k,
                        DeviceSparse out, Workspace& ws, cudaStream_t stream) {
  SPARSYNC_KERNELS_RETURN_IF_ERROR(internal::CheckSelectionArgs("cuda TopKWithResidual", grad,
                                                                numel, out, numel > 0 ? k : 0, ws));
  SPARSYNC_KERNELS_RETURN_IF_ERROR(CheckK("cuda TopKWithResidual", numel, k));
  if (numel > 0 && residual == nullptr) {
    return InvalidArgumentError("cuda TopKWithResidual: residual is null");
  }
  ws.set_error_source(residual);
  internal::LaunchInit(ws.buffers(), TopKInit(k, out), stream);
  return RunTopK("cuda TopKWithResidual", internal::ResidualSource{grad, residual}, true, residual,
                 numel, out, residual, nullptr, ws.buffers(), stream);
}

Status Dgc(const float* grad, int64_t numel, const SparsifierOptions& options, int64_t epoch,
           DeviceDgcState state, DeviceSparse out, Workspace& ws, cudaStream_t stream) {
  const int64_t k =
      SelectedCount(numel, DgcDensityForEpoch(options.density, epoch, options.warmup), options.k);
  SPARSYNC_KERNELS_RETURN_IF_ERROR(
      internal::CheckSelectionArgs("cuda Dgc", grad, numel, out, k, ws));
  if (numel > 0 && (state.momentum == nullptr || state.accumulation == nullptr)) {
    return InvalidArgumentError("cuda Dgc: momentum or accumulation is null");
  }
  if (!(options.momentum >= 0.0 && options.momentum < 1.0) || !(options.clip_norm >= 0.0)) {
    return InvalidArgumentError("cuda Dgc: momentum must be in [0, 1) and clip_norm >= 0");
  }
  ws.set_error_source(grad);
  const DeviceBuffers& b = ws.buffers();
  internal::LaunchInit(b, TopKInit(k, out), stream);
  if (numel == 0) return LaunchStatus("cuda Dgc");
  internal::SquaredNormKernel<<<internal::kReduceBlocks, internal::kBlockThreads, 0, stream>>>(
      grad, numel, b);
  internal::ClipFactorKernel<<<1, internal::kReduceBlocks, 0, stream>>>(b, options.clip_norm);
  const internal::DgcSource source{grad, state.momentum, state.accumulation,
                                   static_cast<float>(options.momentum)};
  return RunTopK("cuda Dgc", source, /*check_finite=*/false, state.accumulation, numel, out,
                 state.momentum, state.accumulation, b, stream);
}

}  // namespace sparsync::kernels::cuda
