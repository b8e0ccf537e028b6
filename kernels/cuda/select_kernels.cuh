#pragma once
// The selection engine of the CUDA kernels, as templates over where the keys come from (a dense
// array, a fused producer that computes it, a seeded sample) and over the selection rule.
//
// Radix select of T, the k-th largest magnitude key (bits(x) & 0x7FFFFFFF), in three digits
// (11, 11 and 9 bits; see device_state.h):
//   1. Hist1Kernel: histogram of digit 1 over every key (fused with the producer: a = r + g for
//      top-k with error feedback, DGC's momentum update); the last block picks T's digit-1 bin.
//   2. FilterKernel: histogram of digit 2 over the keys in that bin; per tile, the count of keys
//      above the bin; and, when the bin's keys fit the candidate buffer ("filtered", the usual
//      case), a copy of them as (index, key) pairs. The last block picks digit 2.
//   3. Level 3 over the candidates (Level3CandKernel, select.cu) or, when they did not fit (many
//      equal magnitudes), over the dense keys again (Level3DenseKernel): T is exact.
// Compaction, in index order: per tile, the number of keys above T and equal to T (from the
// candidates, or a dense CountTilesKernel), an exclusive scan over tiles (ScanTilesKernel,
// select.cu), then WriteKernel: inside each tile, warp ballots and one block scan give every
// selected element its output position. Ties at T are taken lowest index first, so the result is
// the reference's (larger |x| first, then smaller index), whatever the thread schedule.
// Every kernel first checks the call's non-finite flag and does nothing once it is set.

#include <cstdint>

#include "kernels/cuda/device_common.cuh"

namespace sparsync::kernels::cuda::internal {
namespace {

// ---- Sources: LoadTile(base, n, v) fills this thread's kTileItems values of a tile (0 past n).

struct DenseSource {
  const float* x;
  __device__ void Setup(const SelectState*) {}
  __device__ __forceinline__ void LoadTile(int64_t base, int64_t n, float (&v)[kTileItems]) const {
#pragma unroll
    for (int j = 0; j < kTileItems; ++j) {
      const int64_t i = TileIndex(base, j);
      v[j] = i < n ? x[i] : 0.0f;
    }
  }
};

// a = residual + grad, written back to residual; the keys are those of a.
struct ResidualSource {
  const float* __restrict__ grad;
  float* __restrict__ residual;
  __device__ void Setup(const SelectState*) {}
  __device__ __forceinline__ void LoadTile(int64_t base, int64_t n, float (&v)[kTileItems]) const {
    constexpr int kChunk = 8;
#pragma unroll
    for (int c = 0; c < kTileItems; c += kChunk) {
      float g[kChunk], r[kChunk];
#pragma unroll
      for (int q = 0; q < kChunk; ++q) {
        const int64_t i = TileIndex(base, c + q);
        g[q] = i < n ? grad[i] : 0.0f;
        r[q] = i < n ? residual[i] : 0.0f;
      }
#pragma unroll
      for (int q = 0; q < kChunk; ++q) {
        const int64_t i = TileIndex(base, c + q);
        v[c + q] = __fadd_rn(r[q], g[q]);
        if (i < n) residual[i] = v[c + q];
      }
    }
  }
};

// DGC momentum correction (Lin et al., ICLR 2018, eq. 6), in reference/dgc.cc's float32 order:
// g' = float(double(g) * clip_factor) when clipping; u = m u + g'; v = v + u. Keys are those of v.
struct DgcSource {
  const float* __restrict__ grad;
  float* __restrict__ momentum;
  float* __restrict__ accumulation;
  float m;
  bool clip = false;
  double factor = 1.0;
  __device__ void Setup(const SelectState* s) {
    clip = s->clip != 0;
    factor = s->clip_factor;
  }
  __device__ __forceinline__ void LoadTile(int64_t base, int64_t n, float (&v)[kTileItems]) const {
    constexpr int kChunk = 8;
#pragma unroll
    for (int c = 0; c < kTileItems; c += kChunk) {
      float g[kChunk], u[kChunk], a[kChunk];
#pragma unroll
      for (int q = 0; q < kChunk; ++q) {
        const int64_t i = TileIndex(base, c + q);
        g[q] = i < n ? grad[i] : 0.0f;
        u[q] = i < n ? momentum[i] : 0.0f;
        a[q] = i < n ? accumulation[i] : 0.0f;
      }
#pragma unroll
      for (int q = 0; q < kChunk; ++q) {
        const int64_t i = TileIndex(base, c + q);
        const float gq = clip ? __double2float_rn(static_cast<double>(g[q]) * factor) : g[q];
        const float uq = __fadd_rn(__fmul_rn(m, u[q]), gq);
        const float vq = __fadd_rn(a[q], uq);
        v[c + q] = vq;
        if (i < n) {
          momentum[i] = uq;
          accumulation[i] = vq;
        }
      }
    }
  }
};

// Threshold's quantile sample (reference/threshold.cc): key j is |x[pos_j]| with
// pos_j = uniform{0..d-1} from counter j of the kThresholdSample stream.
struct SampledSource {
  const float* x;
  int64_t d;
  uint64_t seed;
  __device__ void Setup(const SelectState*) {}
  __device__ __forceinline__ void LoadTile(int64_t base, int64_t n, float (&v)[kTileItems]) const {
#pragma unroll
    for (int j = 0; j < kTileItems; ++j) {
      const int64_t i = TileIndex(base, j);
      v[j] = i < n ? x[RandomBelowOnDevice(seed, RandomStream::kThresholdSample,
                                           static_cast<uint64_t>(i), static_cast<uint64_t>(d))]
                   : 0.0f;
    }
  }
};

// ---- Rules: which elements the compaction keeps, and the value it sends for each.

// key > cut, and key == tie_key for the tie_need lowest indices (tie_need is applied by the
// caller through the tile prefix sums).
struct KeyCutRule {
  int64_t cut = -1;
  int64_t tie_key = -1;
  __device__ void Setup(const SelectState* s) {
    cut = s->cut;
    tie_key = s->tie_key;
  }
  __device__ __forceinline__ bool Above(int64_t, float v) const {
    return static_cast<int64_t>(MagnitudeKey(v)) > cut;
  }
  __device__ __forceinline__ bool Tie(int64_t, float v) const {
    return static_cast<int64_t>(MagnitudeKey(v)) == tie_key;
  }
  __device__ __forceinline__ float Value(int64_t, float v) const { return v; }
};

// Wangni et al. (NeurIPS 2018): keep i with probability p_i = min(lambda |g_i|, 1), drawn as
// u_i < p_i with u_i counter i of the kWangniBernoulli stream; send g_i / p_i (g_i when p_i = 1).
struct WangniRule {
  uint64_t seed = 0;
  double lambda = 0.0;
  __device__ void Setup(const SelectState* s) { lambda = s->lambda; }
  __device__ __forceinline__ bool Above(int64_t i, float v) const {
    const double a = fabs(static_cast<double>(v));
    if (a == 0.0) return false;
    const double p = lambda * a;
    return p >= 1.0 ||
           RandomUnitOnDevice(seed, RandomStream::kWangniBernoulli, static_cast<uint64_t>(i)) < p;
  }
  __device__ __forceinline__ bool Tie(int64_t, float) const { return false; }
  __device__ __forceinline__ float Value(int64_t, float v) const {
    const double p = lambda * fabs(static_cast<double>(v));
    return p >= 1.0 ? v : __double2float_rn(static_cast<double>(v) / p);
  }
};

// ---- Radix select.

// Run by warp 0 of the last block: picks the bin of `level` that holds T (the need-th largest
// key among those matching the prefix) and narrows the state to it.
__device__ __forceinline__ void PickDigit(SelectState* s, const uint32_t* hist, int level) {
  const int lane = threadIdx.x & 31;
  const int64_t need = s->need;  // every lane reads it before the winner rewrites it (syncwarp)
  const int per_lane = static_cast<int>(DigitMask(level) + 1) / 32;
  uint32_t local = 0;
  for (int q = 0; q < per_lane; ++q) local += __ldcg(hist + lane * per_lane + q);
  uint32_t suffix = local;  // keys in the bins of lanes >= this one
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const uint32_t t = __shfl_down_sync(0xFFFFFFFFu, suffix, offset);
    if (lane + offset < 32) suffix += t;
  }
  const int64_t higher = static_cast<int64_t>(suffix - local);
  __syncwarp();
  if (higher < need && need <= static_cast<int64_t>(suffix)) {  // exactly one lane
    int64_t cum = higher;
    int bin = lane * per_lane;
    uint32_t in_bin = 0;
    for (int q = per_lane - 1; q >= 0; --q) {
      in_bin = __ldcg(hist + lane * per_lane + q);
      if (cum + in_bin >= need) {
        bin = lane * per_lane + q;
        break;
      }
      cum += in_bin;
    }
    s->above += cum;
    s->need = need - cum;
    s->prefix |= static_cast<uint32_t>(bin) << DigitShift(level);
    s->prefix_mask |= DigitMask(level) << DigitShift(level);
    if (level == 0) s->filtered = in_bin <= s->candidate_capacity ? 1 : 0;
    if (level == kRadixLevels - 1) {
      s->cut = s->prefix;
      s->tie_key = s->prefix;
      s->tie_need = s->keep_all_ties ? INT64_MAX : s->need;
    }
  }
}

// Adds a block's shared histogram to the global one; the last block picks the digit.
__device__ __forceinline__ void MergeAndPick(SelectState* s, const uint32_t* shared_hist,
                                             uint32_t* global_hist, int level) {
  __syncthreads();
  const int bins = static_cast<int>(DigitMask(level) + 1);
  for (int b = threadIdx.x; b < bins; b += kBlockThreads) {
    if (shared_hist[b] != 0) atomicAdd(global_hist + b, shared_hist[b]);
  }
  if (LastBlockDone(&s->ticket)) {
    if (threadIdx.x < 32) PickDigit(s, global_hist, level);
    if (threadIdx.x == 0) s->ticket = 0;
  }
}

// Level 1 over every key of the source; with check_finite, also records the first non-finite.
template <class Source>
__global__ void __launch_bounds__(kBlockThreads)
    Hist1Kernel(Source source, int64_t n, DeviceBuffers b, bool check_finite) {
  __shared__ uint32_t hist[kRadixBins];
  SelectState* s = b.state;
  if (BlockSeesBadInput(s)) return;
  source.Setup(s);
  for (int i = threadIdx.x; i < kRadixBins; i += kBlockThreads) hist[i] = 0;
  __syncthreads();
  const int64_t tiles = TileCount(n);
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t base = tile * kTileSize;
    float v[kTileItems];
    source.LoadTile(base, n, v);
#pragma unroll
    for (int j = 0; j < kTileItems; ++j) {
      const int64_t i = TileIndex(base, j);
      if (i < n) {
        const uint32_t key = MagnitudeKey(v[j]);
        if (check_finite && key >= kInfKey) ReportBad(s, i);
        atomicAdd(&hist[key >> 20], 1u);
      }
    }
  }
  MergeAndPick(s, hist, b.hist, 0);
}

// Level 2 over the keys in T's level-1 bin, the candidate copy, and (with tile_counts) the count
// of keys above that bin per tile. tile_tie is zeroed for CandTileCountKernel to add to.
template <class Source>
__global__ void __launch_bounds__(kBlockThreads)
    FilterKernel(Source source, int64_t n, DeviceBuffers b, bool tile_counts) {
  __shared__ uint32_t hist[kRadixBins];
  __shared__ uint2 scratch[kWarps + 1];
  SelectState* s = b.state;
  if (BlockSeesBadInput(s)) return;
  source.Setup(s);
  const uint32_t bin1 = s->prefix >> 20;
  const bool filtered = s->filtered != 0;
  const int lane = threadIdx.x & 31;
  for (int i = threadIdx.x; i < kRadixBins; i += kBlockThreads) hist[i] = 0;
  __syncthreads();
  const int64_t tiles = TileCount(n);
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t base = tile * kTileSize;
    float v[kTileItems];
    source.LoadTile(base, n, v);
    uint32_t above = 0;
#pragma unroll
    for (int j = 0; j < kTileItems; ++j) {
      const int64_t i = TileIndex(base, j);
      const uint32_t key = MagnitudeKey(v[j]);
      const bool valid = i < n;
      above += (valid && (key >> 20) > bin1) ? 1u : 0u;
      const bool in_bin = valid && (key >> 20) == bin1;
      if (in_bin) atomicAdd(&hist[(key >> 9) & 0x7FFu], 1u);
      if (filtered) {
        // Warp-aggregated append; the bin's exact size fits the buffer, so no bound check.
        const uint32_t mask = __ballot_sync(0xFFFFFFFFu, in_bin);
        if (mask != 0) {
          const int leader = __ffs(mask) - 1;
          uint32_t slot = 0;
          if (lane == leader) slot = atomicAdd(&s->candidates, static_cast<uint32_t>(__popc(mask)));
          slot = __shfl_sync(0xFFFFFFFFu, slot, leader);
          if (in_bin) {
            b.candidates[slot + __popc(mask & LaneMaskBelow())] =
                make_uint2(static_cast<uint32_t>(i), key);
          }
        }
      }
    }
    if (tile_counts) {
      uint2 total;
      BlockExclusiveSum2<kBlockThreads>(make_uint2(above, 0), &total, scratch);
      if (threadIdx.x == 0) {
        b.tile_above[tile] = total.x;
        b.tile_tie[tile] = 0;
      }
    }
  }
  MergeAndPick(s, hist, b.hist + kRadixBins, 1);
}

// Level 3 over the dense keys that match the two digits picked, when the candidates did not fit.
template <class Source>
__global__ void __launch_bounds__(kBlockThreads)
    Level3DenseKernel(Source source, int64_t n, DeviceBuffers b) {
  __shared__ uint32_t hist[kRadixBins];
  SelectState* s = b.state;
  if (BlockSeesBadInput(s) || s->filtered) return;
  source.Setup(s);
  const uint32_t prefix = s->prefix;
  const uint32_t mask = s->prefix_mask;
  for (int i = threadIdx.x; i < kRadixBins; i += kBlockThreads) hist[i] = 0;
  __syncthreads();
  const int64_t tiles = TileCount(n);
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t base = tile * kTileSize;
    float v[kTileItems];
    source.LoadTile(base, n, v);
#pragma unroll
    for (int j = 0; j < kTileItems; ++j) {
      const uint32_t key = MagnitudeKey(v[j]);
      if (TileIndex(base, j) < n && (key & mask) == prefix) atomicAdd(&hist[key & 0x1FFu], 1u);
    }
  }
  MergeAndPick(s, hist, b.hist + 2 * kRadixBins, 2);
}

// ---- Compaction.

// Per tile of x: the number of elements the rule keeps outright and the number of ties.
// skip_if_filtered: top-k's fast path already has these counts from the candidates.
template <class Rule>
__global__ void __launch_bounds__(kBlockThreads)
    CountTilesKernel(Rule rule, const float* x, int64_t n, DeviceBuffers b, bool skip_if_filtered,
                     bool check_finite) {
  __shared__ uint2 scratch[kWarps + 1];
  SelectState* s = b.state;
  if (BlockSeesBadInput(s) || (skip_if_filtered && s->filtered)) return;
  rule.Setup(s);
  const DenseSource source{x};
  const int64_t tiles = TileCount(n);
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t base = tile * kTileSize;
    float v[kTileItems];
    source.LoadTile(base, n, v);
    uint2 count = make_uint2(0, 0);
#pragma unroll
    for (int j = 0; j < kTileItems; ++j) {
      const int64_t i = TileIndex(base, j);
      if (i < n) {
        if (check_finite && MagnitudeKey(v[j]) >= kInfKey) ReportBad(s, i);
        if (rule.Above(i, v[j])) {
          ++count.x;
        } else if (rule.Tie(i, v[j])) {
          ++count.y;
        }
      }
    }
    uint2 total;
    BlockExclusiveSum2<kBlockThreads>(count, &total, scratch);
    if (threadIdx.x == 0) {
      b.tile_above[tile] = total.x;
      b.tile_tie[tile] = total.y;
    }
  }
}

// Writes the kept elements of x in index order: out position of a kept element = (kept above
// before it) + min(ties before it, tie_need). Positions at or past `capacity` are not written
// (Finish reports the overflow). zero_a / zero_b (optional) are zeroed where kept: the residual
// of top-k, DGC's u and v (momentum factor masking).
template <class Rule>
__global__ void __launch_bounds__(kBlockThreads)
    WriteKernel(Rule rule, const float* x, int64_t n, DeviceBuffers b, int32_t* out_indices,
                float* out_values, int64_t capacity, float* zero_a, float* zero_b) {
  __shared__ uint32_t above_mask[kTileItems][kWarps];
  __shared__ uint32_t tie_mask[kTileItems][kWarps];
  __shared__ uint2 prefix[kTileItems * kWarps];
  __shared__ uint2 scratch[kWarps + 1];
  static_assert(kTileItems * kWarps == kBlockThreads, "one scan entry per thread");
  SelectState* s = b.state;
  if (BlockSeesBadInput(s)) return;
  rule.Setup(s);
  const int64_t tie_need = s->tie_need;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const DenseSource source{x};
  const int64_t tiles = TileCount(n);
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t above_before = b.tile_above[tile];
    const int64_t tie_before = b.tile_tie[tile];
    const int64_t above_here = b.tile_above[tile + 1] - above_before;
    const int64_t tie_here = b.tile_tie[tile + 1] - tie_before;
    if (above_here == 0 && (tie_here == 0 || tie_before >= tie_need)) continue;  // block-uniform
    const int64_t base = tile * kTileSize;
    float v[kTileItems];
    source.LoadTile(base, n, v);
#pragma unroll
    for (int j = 0; j < kTileItems; ++j) {
      const int64_t i = TileIndex(base, j);
      const bool above = i < n && rule.Above(i, v[j]);
      const bool tie = i < n && !above && rule.Tie(i, v[j]);
      const uint32_t am = __ballot_sync(0xFFFFFFFFu, above);
      const uint32_t tm = __ballot_sync(0xFFFFFFFFu, tie);
      if (lane == 0) {
        above_mask[j][warp] = am;
        tie_mask[j][warp] = tm;
      }
    }
    __syncthreads();
    {
      // Entry e = (j, w) covers elements base + j * 256 + w * 32 + [0, 32): e is in index order.
      const int j = threadIdx.x / kWarps;
      const int w = threadIdx.x % kWarps;
      uint2 total;
      prefix[threadIdx.x] = BlockExclusiveSum2<kBlockThreads>(
          make_uint2(__popc(above_mask[j][w]), __popc(tie_mask[j][w])), &total, scratch);
    }
    __syncthreads();
    const uint32_t below = LaneMaskBelow();
    const uint32_t bit = 1u << lane;
#pragma unroll
    for (int j = 0; j < kTileItems; ++j) {
      const uint32_t am = above_mask[j][warp];
      const uint32_t tm = tie_mask[j][warp];
      if ((am | tm) & bit) {
        const uint2 p = prefix[j * kWarps + warp];
        const int64_t above_rank = above_before + p.x + __popc(am & below);
        const int64_t tie_rank = tie_before + p.y + __popc(tm & below);
        if ((am & bit) || tie_rank < tie_need) {
          const int64_t pos = above_rank + (tie_rank < tie_need ? tie_rank : tie_need);
          const int64_t i = TileIndex(base, j);
          if (pos < capacity) {
            out_indices[pos] = static_cast<int32_t>(i);
            out_values[pos] = rule.Value(i, v[j]);
          }
          if (zero_a != nullptr) zero_a[i] = 0.0f;
          if (zero_b != nullptr) zero_b[i] = 0.0f;
        }
      }
    }
    __syncthreads();  // the masks and prefixes are rewritten for the next tile
  }
}

}  // namespace
}  // namespace sparsync::kernels::cuda::internal
