// CUDA float16 packing of sent values, the scatter-add + average of gathered payloads
// (docs/algorithms.md §6: unpack and scatter-add in a fixed rank order, so that every node holds
// bit-identical results) and the in-place division of a dense sum into an average.
//
// Scatter-add without atomics and without sorting: the dense output is cut into tiles of
// kTileSize elements. Each payload's indices are ascending, so its entries that land in tile t are
// one contiguous run; RangesKernel finds every run boundary in one pass over the indices. Then
// AddKernel gives each block a tile in shared memory, adds payload 0's run, then payload 1's, ...
// (a block barrier between payloads; entries of one payload never collide), and writes the tile
// out once, divided. Memory traffic: one read of each payload and one write of dense.

#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/launch.h"

namespace sparsync::kernels::cuda {
namespace {

using internal::DeviceBuffers;
using internal::kBlockThreads;
using internal::kMaxPayloadsPerLaunch;
using internal::kTileSize;

// Up to kMaxPayloadsPerLaunch payloads, passed by value as a kernel argument.
struct PayloadBatch {
  const int32_t* indices[kMaxPayloadsPerLaunch];
  const void* values[kMaxPayloadsPerLaunch];
  int64_t count[kMaxPayloadsPerLaunch];
  int32_t half[kMaxPayloadsPerLaunch];
  int size;
};

__device__ __forceinline__ float PayloadValue(const PayloadBatch& batch, int p, int64_t e) {
  if (batch.half[p]) {
    return __half2float(__ushort_as_half(static_cast<const unsigned short*>(batch.values[p])[e]));
  }
  return static_cast<const float*>(batch.values[p])[e];
}

__device__ __forceinline__ int64_t TileOf(int64_t index, int64_t tiles) {
  if (index < 0) return 0;
  const int64_t t = index / kTileSize;
  return t < tiles ? t : tiles;
}

// ranges[p][t] = the first entry of payload p whose index is in tile t or later; ranges[p][tiles]
// = count. Also counts entries out of range or out of order (their ranges are then unreliable;
// AddKernel still never writes outside the tile it owns).
__global__ void RangesKernel(PayloadBatch batch, int64_t n, int64_t tiles, DeviceBuffers b) {
  const int p = blockIdx.y;
  const int32_t* idx = batch.indices[p];
  const int64_t count = batch.count[p];
  int32_t* ranges = b.ranges + p * (tiles + 1);
  for (int64_t j = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; j <= count;
       j += int64_t{gridDim.x} * blockDim.x) {
    int64_t current = tiles;
    if (j < count) {
      const int64_t i = idx[j];
      if (i < 0 || i >= n || (j > 0 && idx[j - 1] >= i)) {
        atomicAdd(&b.state->invalid, 1ull);
      }
      current = TileOf(i, tiles);
    }
    const int64_t previous = j == 0 ? -1 : TileOf(idx[j - 1], tiles);
    for (int64_t t = previous + 1; t <= current; ++t) ranges[t] = static_cast<int32_t>(j);
  }
}

__global__ void __launch_bounds__(kBlockThreads)
    AddKernel(PayloadBatch batch, float* dense, int64_t n, int64_t tiles, DeviceBuffers b,
              bool accumulate, bool divide, float divisor) {
  __shared__ float acc[kTileSize];
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t base = tile * kTileSize;
    const int64_t len = n - base < kTileSize ? n - base : kTileSize;
    for (int64_t l = threadIdx.x; l < kTileSize; l += kBlockThreads) {
      acc[l] = accumulate && l < len ? dense[base + l] : 0.0f;
    }
    __syncthreads();
    for (int p = 0; p < batch.size; ++p) {
      const int32_t* ranges = b.ranges + p * (tiles + 1);
      const int64_t count = batch.count[p];
      const int64_t start = ranges[tile] > 0 ? int64_t{ranges[tile]} : 0;
      const int64_t end = ranges[tile + 1] < count ? int64_t{ranges[tile + 1]} : count;
      const int32_t* idx = batch.indices[p];
      for (int64_t e = start + threadIdx.x; e < end; e += kBlockThreads) {
        const int64_t local = int64_t{idx[e]} - base;
        if (local >= 0 && local < len)
          acc[local] = __fadd_rn(acc[local], PayloadValue(batch, p, e));
      }
      __syncthreads();
    }
    for (int64_t l = threadIdx.x; l < len; l += kBlockThreads) {
      dense[base + l] = divide ? __fdiv_rn(acc[l], divisor) : acc[l];
    }
    __syncthreads();
  }
}

__global__ void PackKernel(const float* values, int64_t count, uint16_t* out) {
  for (int64_t j = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; j < count;
       j += int64_t{gridDim.x} * blockDim.x) {
    out[j] = __half_as_ushort(__float2half_rn(values[j]));
  }
}

__global__ void PackWithResidualKernel(const float* values, const int32_t* indices, int64_t count,
                                       uint16_t* out, float* residual, int64_t n) {
  for (int64_t j = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; j < count;
       j += int64_t{gridDim.x} * blockDim.x) {
    const float v = values[j];
    const __half h = __float2half_rn(v);
    out[j] = __half_as_ushort(h);
    const int64_t i = indices[j];
    if (i >= 0 && i < n) residual[i] = __fsub_rn(v, __half2float(h));
  }
}

// The host's `x / divisor`: __fdiv_rn rounds to nearest whatever -prec-div says, and the build
// flushes no subnormals (no -ftz, no --use_fast_math; kernels/cuda/CMakeLists.txt).
__global__ void DivideKernel(float* data, int64_t count, float divisor) {
  for (int64_t j = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; j < count;
       j += int64_t{gridDim.x} * blockDim.x) {
    data[j] = __fdiv_rn(data[j], divisor);
  }
}

int StrideGrid(int64_t items) {
  return static_cast<int>(
      std::clamp<int64_t>((items + kBlockThreads - 1) / kBlockThreads, 1, int64_t{1} << 16));
}

}  // namespace

Status PackFloat16(const float* values, int64_t count, uint16_t* out, cudaStream_t stream) {
  if (count < 0) return InvalidArgumentError("cuda PackFloat16: negative count");
  if (count == 0) return Status::Ok();
  if (values == nullptr || out == nullptr) {
    return InvalidArgumentError("cuda PackFloat16: null buffer");
  }
  PackKernel<<<StrideGrid(count), kBlockThreads, 0, stream>>>(values, count, out);
  return LaunchStatus("cuda PackFloat16");
}

Status PackFloat16WithResidual(const float* values, const int32_t* indices, int64_t count,
                               uint16_t* out, float* residual, int64_t numel, cudaStream_t stream) {
  if (count < 0 || numel < 0) {
    return InvalidArgumentError("cuda PackFloat16WithResidual: negative size");
  }
  if (count == 0) return Status::Ok();
  if (values == nullptr || indices == nullptr || out == nullptr || residual == nullptr) {
    return InvalidArgumentError("cuda PackFloat16WithResidual: null buffer");
  }
  PackWithResidualKernel<<<StrideGrid(count), kBlockThreads, 0, stream>>>(values, indices, count,
                                                                          out, residual, numel);
  return LaunchStatus("cuda PackFloat16WithResidual");
}

Status Divide(float* data, int64_t numel, double divisor, cudaStream_t stream) {
  if (numel < 0) return InvalidArgumentError("cuda Divide: negative numel");
  if (!std::isfinite(divisor) || divisor == 0) {
    return InvalidArgumentError("cuda Divide: divisor must be finite and non-zero");
  }
  if (numel == 0 || divisor == 1.0) return Status::Ok();
  if (data == nullptr) return InvalidArgumentError("cuda Divide: null data");
  DivideKernel<<<StrideGrid(numel), kBlockThreads, 0, stream>>>(data, numel,
                                                                static_cast<float>(divisor));
  return LaunchStatus("cuda Divide");
}

Status ScatterAddAverage(std::span<const DevicePayload> payloads, float* dense, int64_t numel,
                         double divisor, Workspace& ws, cudaStream_t stream) {
  constexpr const char* kWho = "cuda ScatterAddAverage";
  if (numel < 0 || numel > ws.limits().max_numel) {
    return FailedPreconditionError(std::string(kWho) + ": numel " + std::to_string(numel) +
                                   " is outside [0, the workspace's max_numel " +
                                   std::to_string(ws.limits().max_numel) + "]");
  }
  if (numel > 0 && dense == nullptr)
    return InvalidArgumentError(std::string(kWho) + ": null dense");
  if (!std::isfinite(divisor) || divisor == 0) {
    return InvalidArgumentError(std::string(kWho) + ": divisor must be finite and non-zero");
  }
  for (size_t p = 0; p < payloads.size(); ++p) {
    const DevicePayload& payload = payloads[p];
    if (payload.count < 0 || payload.count > numel) {
      return InvalidArgumentError(std::string(kWho) + ": payload " + std::to_string(p) + " has " +
                                  std::to_string(payload.count) + " entries for " +
                                  std::to_string(numel) + " elements");
    }
    if (payload.count > 0 && (payload.indices == nullptr || payload.values == nullptr)) {
      return InvalidArgumentError(std::string(kWho) + ": payload " + std::to_string(p) +
                                  " has null buffers");
    }
  }
  ws.set_error_source(nullptr);
  const DeviceBuffers& b = ws.buffers();
  internal::LaunchInit(b, internal::InitParams{}, stream);
  if (numel == 0) return LaunchStatus(kWho);
  const int64_t tiles = internal::NumTiles(numel);
  const int add_grid = internal::TileGrid(b, tiles);
  size_t first = 0;
  do {  // at least once: with no payloads, dense becomes zero
    PayloadBatch batch{};
    int64_t most = 0;
    for (; first < payloads.size() && batch.size < kMaxPayloadsPerLaunch; ++first, ++batch.size) {
      const DevicePayload& payload = payloads[first];
      batch.indices[batch.size] = payload.indices;
      batch.values[batch.size] = payload.values;
      batch.count[batch.size] = payload.count;
      batch.half[batch.size] = payload.value_type == PayloadValues::kFloat16 ? 1 : 0;
      most = std::max(most, payload.count);
    }
    const bool accumulate = first > static_cast<size_t>(batch.size);  // not the first batch
    const bool last = first == payloads.size();
    if (batch.size > 0) {
      SPARSYNC_KERNELS_RETURN_IF_ERROR(CudaStatus(
          cudaMemsetAsync(b.ranges, 0, static_cast<size_t>(batch.size * (tiles + 1)) * 4, stream),
          kWho));
      const dim3 grid(static_cast<unsigned>(StrideGrid(most + 1)),
                      static_cast<unsigned>(batch.size));
      RangesKernel<<<grid, kBlockThreads, 0, stream>>>(batch, numel, tiles, b);
    }
    AddKernel<<<add_grid, kBlockThreads, 0, stream>>>(batch, dense, numel, tiles, b, accumulate,
                                                      last && divisor != 1.0,
                                                      static_cast<float>(divisor));
  } while (first < payloads.size());
  return LaunchStatus(kWho);
}

}  // namespace sparsync::kernels::cuda
