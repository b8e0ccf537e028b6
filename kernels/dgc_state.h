#pragma once
// Per-tensor state of Deep Gradient Compression, owned by the caller (the daemon keeps one per
// tensor) and passed in SparsifyContext::dgc_state.
//
// Lin, Han, Mao, Wang, Dally, "Deep Gradient Compression: Reducing the Communication Bandwidth for
// Distributed Training", ICLR 2018: momentum correction (u = m u + g, v = v + u), momentum factor
// masking (u_i = v_i = 0 where sent), local gradient clipping and an exponential density warm-up.

#include <cstdint>
#include <vector>

namespace sparsync::kernels {

struct DgcState {
  std::vector<float> momentum;      // u
  std::vector<float> accumulation;  // v

  // Sizes both vectors to numel and zeroes them. Allocates; call outside the hot path.
  void Reset(int64_t numel) {
    momentum.assign(static_cast<size_t>(numel), 0.0f);
    accumulation.assign(static_cast<size_t>(numel), 0.0f);
  }
  int64_t numel() const { return static_cast<int64_t>(accumulation.size()); }
};

// The density DGC uses in `epoch` (0-based): 0.25, 0.0625, 0.0156, 0.004 for epochs 0..3 when
// warm-up is on, then `target`. A warm-up density below the target is raised to the target.
inline double DgcDensityForEpoch(double target, int64_t epoch, bool warmup) {
  static constexpr double kWarmup[] = {0.25, 0.0625, 0.0156, 0.004};
  if (!warmup || epoch < 0 || epoch >= 4) return target;
  return kWarmup[epoch] > target ? kWarmup[epoch] : target;
}

// The same schedule over steps instead of epochs (SPARSYNC_DENSITY_WARMUP_STEPS): step `step`
// (0-based) of a warm-up of `warmup_steps` steps falls in quarter `4 * step / warmup_steps`, which
// takes DGC's density of that epoch; from step `warmup_steps` on (or with warmup_steps <= 0),
// `target`.
inline double WarmupDensity(double target, int64_t step, int64_t warmup_steps) {
  if (warmup_steps <= 0 || step < 0 || step >= warmup_steps) return target;
  return DgcDensityForEpoch(target, 4 * step / warmup_steps, /*warmup=*/true);
}

}  // namespace sparsync::kernels
