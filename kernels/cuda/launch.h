#pragma once
// Internal to kernels/cuda/: host-side launchers shared between the .cu files (each is defined in
// select.cu, so its kernels are compiled once), and the argument checks every entry point makes.
// Launchers only enqueue; the caller collects launch errors with LaunchStatus().

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_state.h"

namespace sparsync::kernels::cuda::internal {

// What the first kernel of a call writes into the state (see SelectState).
struct InitParams {
  int64_t need = 0;            // rank of T for the radix select (k)
  bool keep_all_ties = false;  // select key >= T instead of exactly `need`
  int64_t capacity = 0;        // of the output
  int64_t cut = -1;            // compaction rule when no radix select runs
  int64_t tie_key = -1;
  int64_t tie_need = 0;
};

// Blocks for a grid-stride pass over `tiles` tiles.
int TileGrid(const DeviceBuffers& b, int64_t tiles);

void LaunchInit(const DeviceBuffers& b, const InitParams& params, cudaStream_t stream);

// Radix select over dense x, level 1 (with the non-finite check) ...
void LaunchHist1Dense(const float* x, int64_t n, const DeviceBuffers& b, cudaStream_t stream);
// ... and levels 2-3. With tile_counts, also leaves the per-tile counts for the compaction.
void LaunchRefineDense(const float* x, int64_t n, bool tile_counts, const DeviceBuffers& b,
                       cudaStream_t stream);
// Level 3 over the candidates (no-op unless the fast path was taken).
void LaunchLevel3Candidates(const DeviceBuffers& b, cudaStream_t stream);
// Per-tile counts of the state's key rule over dense x, optionally checking finiteness.
void LaunchCountTiles(const float* x, int64_t n, bool check_finite, const DeviceBuffers& b,
                      cudaStream_t stream);
// Exclusive scan of the per-tile counts of `tiles` tiles; sets state.selected.
void LaunchScanTiles(int64_t tiles, const DeviceBuffers& b, cudaStream_t stream);
// Compaction of dense x under the state's key rule.
void LaunchWrite(const float* x, int64_t n, const DeviceSparse& out, float* zero_a, float* zero_b,
                 const DeviceBuffers& b, cudaStream_t stream);

// Checks shared by the selection entry points: sizes against the workspace, null pointers, and
// out.capacity >= min_capacity.
Status CheckSelectionArgs(const char* who, const void* x, int64_t n, const DeviceSparse& out,
                          int64_t min_capacity, const Workspace& ws);

}  // namespace sparsync::kernels::cuda::internal
