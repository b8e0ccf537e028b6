// CUDA threshold sparsification and Gaussian-k.
//
// Threshold: fixed tau (Strom, Interspeech 2015: send |x| > tau) or the quantile mode of Aji &
// Heafield, "Sparse Communication for Distributed Gradient Descent", EMNLP 2017, §3: tau is the
// m-th largest |x| of a seeded sample (the whole tensor when it is small), send |x| >= tau. The
// sample is never materialised: the radix select reads x[pos_j] with pos_j drawn on the fly
// (SampledSource), exactly the positions of reference/threshold.cc.
//
// Gaussian-k: Shi, Chu, Cheung, See, "Understanding Top-k Sparsification in Distributed Deep
// Learning", arXiv 1911.08772 (2019): tau = mu + |z_{rho/2}| sigma with the mean and the sample
// standard deviation (n - 1), then up to three corrections tau *= 0.5 (count < 2k/3) or 1.5
// (count > 4k/3); send |x| > tau. Sums are in double over a fixed reduction tree, so tau may differ
// from the reference's in the last bits of a double (as the CPU kernel's may); the selections
// agree unless an element lies within that of tau.

#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/select_kernels.cuh"
#include "kernels/normal.h"

namespace sparsync::kernels::cuda {
namespace {

using internal::DeviceBuffers;
using internal::InitParams;
using internal::kBlockThreads;
using internal::kReduceBlocks;
using internal::kWarps;
using internal::SelectState;

// Largest float f >= 0 with double(f) <= tau, as magnitude bits, so that for finite x
// double(|x|) > tau <=> key(x) > result (as kernels/cpu/scan.h FloatBitsAtMost). tau >= 0.
__host__ __device__ inline uint32_t KeyAtMost(double tau) {
  float f = static_cast<float>(tau);
  if (static_cast<double>(f) > tau) f = nextafterf(f, 0.0f);
  if (f > 3.402823466e38f) f = 3.402823466e38f;  // Inf -> FLT_MAX
  uint32_t bits;
  memcpy(&bits, &f, sizeof bits);
  return bits & 0x7FFFFFFFu;
}

// Gaussian-k, pass 1: partial sums of x (double) and the non-finite check.
__global__ void __launch_bounds__(kBlockThreads)
    SumKernel(const float* x, int64_t n, DeviceBuffers b) {
  __shared__ double scratch[kWarps];
  double sum = 0.0;
  for (int64_t i = int64_t{blockIdx.x} * kBlockThreads + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * kBlockThreads) {
    const float v = x[i];
    if (internal::MagnitudeKey(v) >= internal::kInfKey) internal::ReportBad(b.state, i);
    sum += v;
  }
  sum = internal::BlockSum<kBlockThreads>(sum, scratch);
  if (threadIdx.x == 0) b.partials[blockIdx.x] = sum;
}

// Pass 2: partial sums of (x - mean)^2.
__global__ void __launch_bounds__(kBlockThreads)
    DeviationKernel(const float* x, int64_t n, DeviceBuffers b) {
  __shared__ double scratch[kWarps];
  if (internal::InputWasBad(b.state)) return;  // set by an earlier kernel: uniform
  const double mean = b.state->mean;
  double ss = 0.0;
  for (int64_t i = int64_t{blockIdx.x} * kBlockThreads + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * kBlockThreads) {
    const double d = x[i] - mean;
    ss += d * d;
  }
  ss = internal::BlockSum<kBlockThreads>(ss, scratch);
  if (threadIdx.x == 0) b.partials[blockIdx.x] = ss;
}

// Count of |x| > tau, as partial sums.
__global__ void __launch_bounds__(kBlockThreads)
    CountAboveKernel(const float* x, int64_t n, DeviceBuffers b) {
  __shared__ double scratch[kWarps];
  const SelectState* s = b.state;
  if (internal::InputWasBad(s) || s->done) return;
  const double tau = s->tau;
  double count = 0.0;
  for (int64_t i = int64_t{blockIdx.x} * kBlockThreads + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * kBlockThreads) {
    count += static_cast<double>(fabsf(x[i])) > tau ? 1.0 : 0.0;
  }
  count = internal::BlockSum<kBlockThreads>(count, scratch);
  if (threadIdx.x == 0) b.partials[blockIdx.x] = count;
}

enum class GaussianStep { kMean, kTau, kAdjust, kCut };

// One block of kReduceBlocks threads: combines the partial sums and advances Gaussian-k.
__global__ void __launch_bounds__(kReduceBlocks)
    GaussianStepKernel(DeviceBuffers b, GaussianStep step, int64_t n, int64_t k, double abs_z) {
  __shared__ double scratch[kReduceBlocks / 32];
  SelectState* s = b.state;
  if (internal::InputWasBad(s)) return;
  if (step == GaussianStep::kAdjust && s->done) return;
  const double total = step == GaussianStep::kCut
                           ? 0.0
                           : internal::BlockSum<kReduceBlocks>(b.partials[threadIdx.x], scratch);
  if (threadIdx.x != 0) return;
  switch (step) {
    case GaussianStep::kMean:
      s->mean = total / static_cast<double>(n);
      break;
    case GaussianStep::kTau: {
      const double sigma = n > 1 ? sqrt(total / static_cast<double>(n - 1)) : 0.0;
      s->tau = s->mean + abs_z * sigma;
      break;
    }
    case GaussianStep::kAdjust: {
      const auto count = static_cast<int64_t>(total);
      if (3 * count < 2 * k) {
        s->tau *= 0.5;
      } else if (3 * count > 4 * k) {
        s->tau *= 1.5;
      } else {
        s->done = 1;
      }
      break;
    }
    case GaussianStep::kCut:
      s->cut = s->tau < 0 ? -1 : static_cast<int64_t>(KeyAtMost(s->tau));
      s->tie_key = -1;
      s->tie_need = 0;
      break;
  }
}

Status FinishSelection(const float* x, int64_t n, const DeviceSparse& out, const DeviceBuffers& b,
                       cudaStream_t stream, const char* who) {
  internal::LaunchScanTiles(internal::NumTiles(n), b, stream);
  internal::LaunchWrite(x, n, out, nullptr, nullptr, b, stream);
  return LaunchStatus(who);
}

}  // namespace

Status Threshold(const float* x, int64_t numel, const SparsifierOptions& options, uint64_t seed,
                 DeviceSparse out, Workspace& ws, cudaStream_t stream) {
  constexpr const char* kWho = "cuda Threshold";
  SPARSYNC_KERNELS_RETURN_IF_ERROR(internal::CheckSelectionArgs(kWho, x, numel, out, 0, ws));
  if (!std::isfinite(options.threshold) ||
      (options.threshold <= 0 &&
       (!(options.sample_fraction > 0.0 && options.sample_fraction <= 1.0) ||
        options.min_sample_size < 1 || !(options.density > 0.0 && options.density <= 1.0)))) {
    return InvalidArgumentError(std::string(kWho) + ": invalid threshold options");
  }
  ws.set_error_source(x);
  const DeviceBuffers& b = ws.buffers();
  InitParams init;
  init.capacity = out.capacity;
  if (options.threshold > 0) {
    init.cut = KeyAtMost(options.threshold);
    internal::LaunchInit(b, init, stream);
    if (numel == 0) return LaunchStatus(kWho);
    internal::LaunchCountTiles(x, numel, /*check_finite=*/true, b, stream);
    return FinishSelection(x, numel, out, b, stream, kWho);
  }
  if (numel == 0) {
    internal::LaunchInit(b, init, stream);
    return LaunchStatus(kWho);
  }
  init.keep_all_ties = true;
  if (numel <= options.min_sample_size) {
    // The sample is the whole tensor: the radix select runs on x itself.
    init.need = std::clamp<int64_t>(
        static_cast<int64_t>(std::ceil(options.density * static_cast<double>(numel))), 1, numel);
    internal::LaunchInit(b, init, stream);
    internal::LaunchHist1Dense(x, numel, b, stream);
    internal::LaunchRefineDense(x, numel, /*tile_counts=*/true, b, stream);
    return FinishSelection(x, numel, out, b, stream, kWho);
  }
  const int64_t s = std::max<int64_t>(
      options.min_sample_size,
      static_cast<int64_t>(std::ceil(options.sample_fraction * static_cast<double>(numel))));
  init.need = std::clamp<int64_t>(
      static_cast<int64_t>(std::ceil(options.density * static_cast<double>(s))), 1, s);
  internal::LaunchInit(b, init, stream);
  const internal::SampledSource sample{x, numel, seed};
  const int grid = internal::TileGrid(b, internal::NumTiles(s));
  internal::Hist1Kernel<<<grid, kBlockThreads, 0, stream>>>(sample, s, b, false);
  internal::FilterKernel<<<grid, kBlockThreads, 0, stream>>>(sample, s, b, false);
  internal::Level3DenseKernel<<<grid, kBlockThreads, 0, stream>>>(sample, s, b);
  internal::LaunchLevel3Candidates(b, stream);
  internal::LaunchCountTiles(x, numel, /*check_finite=*/true, b, stream);
  return FinishSelection(x, numel, out, b, stream, kWho);
}

Status GaussianK(const float* x, int64_t numel, const SparsifierOptions& options, DeviceSparse out,
                 Workspace& ws, cudaStream_t stream) {
  constexpr const char* kWho = "cuda GaussianK";
  SPARSYNC_KERNELS_RETURN_IF_ERROR(internal::CheckSelectionArgs(kWho, x, numel, out, 0, ws));
  if (!(options.density > 0.0 && options.density <= 1.0)) {
    return InvalidArgumentError(std::string(kWho) + ": density must be in (0, 1]");
  }
  ws.set_error_source(x);
  const DeviceBuffers& b = ws.buffers();
  InitParams init;
  init.capacity = out.capacity;
  internal::LaunchInit(b, init, stream);
  if (numel == 0) return LaunchStatus(kWho);
  const int64_t k = SelectedCount(numel, options.density, options.k);
  const double rho = static_cast<double>(k) / static_cast<double>(numel);
  const double abs_z = std::fabs(NormalQuantile(1.0 - rho / 2.0));
  SumKernel<<<kReduceBlocks, kBlockThreads, 0, stream>>>(x, numel, b);
  GaussianStepKernel<<<1, kReduceBlocks, 0, stream>>>(b, GaussianStep::kMean, numel, k, abs_z);
  DeviationKernel<<<kReduceBlocks, kBlockThreads, 0, stream>>>(x, numel, b);
  GaussianStepKernel<<<1, kReduceBlocks, 0, stream>>>(b, GaussianStep::kTau, numel, k, abs_z);
  for (int correction = 0; correction < 3; ++correction) {
    CountAboveKernel<<<kReduceBlocks, kBlockThreads, 0, stream>>>(x, numel, b);
    GaussianStepKernel<<<1, kReduceBlocks, 0, stream>>>(b, GaussianStep::kAdjust, numel, k, abs_z);
  }
  GaussianStepKernel<<<1, kReduceBlocks, 0, stream>>>(b, GaussianStep::kCut, numel, k, abs_z);
  internal::LaunchCountTiles(x, numel, /*check_finite=*/false, b, stream);
  return FinishSelection(x, numel, out, b, stream, kWho);
}

}  // namespace sparsync::kernels::cuda
