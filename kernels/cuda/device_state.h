#pragma once
// Internal to kernels/cuda/: the device scratch a Workspace owns, the per-call state block the
// kernels share through it, and the launch geometry. Plain C++, included by host (.cc) and device
// (.cu) files alike.

#include <vector_types.h>

#include <cstdint>

namespace sparsync::kernels::cuda::internal {

// Every dense pass walks the data in tiles of kTileSize elements, one block per tile at a time:
// kBlockThreads threads with kTileItems elements each, element (j, t) of a tile at j * 256 + t,
// so each warp-wide load is 128 contiguous bytes.
inline constexpr int kBlockThreads = 256;
inline constexpr int kWarps = kBlockThreads / 32;
inline constexpr int kTileItems = 32;
inline constexpr int64_t kTileSize = int64_t{kBlockThreads} * kTileItems;  // 8192

// Radix select over the 31-bit magnitude key bits(x) & 0x7FFFFFFF in three digits: bits 30..20
// (sign-free exponent and 3 mantissa bits), 19..9 and 8..0.
inline constexpr int kRadixLevels = 3;
inline constexpr int kRadixBins = 2048;  // of the first two digits; the last has 512

// Reductions (sums in double) run on a fixed number of blocks and combine their partial results in
// a fixed order, so results do not depend on the GPU model or on timing.
inline constexpr int kReduceBlocks = 512;

// ScatterAddAverage handles this many payloads per launch (their pointers are kernel arguments).
inline constexpr int kMaxPayloadsPerLaunch = 32;

inline constexpr unsigned long long kNoIndex = ~0ull;

// The state of one call, in device memory. Reset by the first kernel of every call.
struct SelectState {
  // Radix select: finds T, the `need`-th largest key of a source. After each level, `prefix`
  // holds T's digits decided so far (under `prefix_mask`), `above` counts the keys known to be
  // larger than T and `need` is T's rank among the keys that match the prefix.
  uint32_t prefix;
  uint32_t prefix_mask;
  int64_t need;
  int64_t above;
  // Fast path: after level 1, if the keys in T's level-1 bin fit the candidate buffer, they are
  // copied there (index, key) and levels 2-3 read only them.
  uint32_t candidate_capacity;
  uint32_t candidates;
  int32_t filtered;
  // If set, the final pick keeps every key equal to T (threshold: "|x| >= tau").
  int32_t keep_all_ties;
  // Last-block-done ticket of the histogram kernels (reset by the last block).
  uint32_t ticket;

  // The rule the compaction applies: select key > cut, and among keys == tie_key (if >= 0) the
  // tie_need with the smallest indices.
  int64_t cut;
  int64_t tie_key;
  int64_t tie_need;

  // Results (Workspace::Finish).
  int64_t selected;
  int64_t capacity;
  unsigned long long first_bad;  // smallest index of a non-finite input, kNoIndex if none
  unsigned long long invalid;    // ScatterAddAverage: invalid payload entries

  // Scalars of the compressors that are not top-k.
  double mean;         // gaussiank
  double tau;          // gaussiank
  double lambda;       // wangni: p_i = min(lambda |g_i|, 1)
  double clip_factor;  // dgc: gradient scale, applied when `clip` is set
  int32_t clip;
  int32_t done;  // gaussiank corrections / wangni passes finished
  int32_t passes;
};

// Device buffers of a Workspace (see workspace.cc for the sizes).
struct DeviceBuffers {
  SelectState* state = nullptr;       // device
  SelectState* host_state = nullptr;  // pinned host copy for Finish
  uint32_t* hist = nullptr;           // kRadixLevels * kRadixBins
  uint32_t* tile_above = nullptr;     // max_tiles + 1: per-tile counts, then exclusive prefix sums
  uint32_t* tile_tie = nullptr;       // max_tiles + 1
  uint2* candidates = nullptr;        // (index, key)
  uint32_t candidate_capacity = 0;
  double* partials = nullptr;  // 2 * kReduceBlocks
  // Random-k.
  int32_t* draws = nullptr;        // max_k
  uint8_t* repeated = nullptr;     // max_k
  uint32_t* hash_keys = nullptr;   // hash_mask + 1
  uint32_t* hash_steps = nullptr;  // hash_mask + 1
  uint32_t hash_mask = 0;
  uint32_t* bitmap = nullptr;  // ceil(max_numel / 32) words
  // ScatterAddAverage: kMaxPayloadsPerLaunch * (max_tiles + 1) entry offsets.
  int32_t* ranges = nullptr;
  int64_t max_numel = 0;
  int64_t max_k = 0;
  int64_t max_tiles = 0;
  int sm_count = 0;
};

inline int64_t NumTiles(int64_t n) { return (n + kTileSize - 1) / kTileSize; }

}  // namespace sparsync::kernels::cuda::internal
