// TensorState: the node's one store of what the sparse paths remember per tensor between steps —
// the error-feedback residual (Stich et al. 2018; Aji & Heafield 2017; docs/algorithms.md §7.1)
// and DGC's momentum and accumulation (§7.7). Keyed by tensor name, not by merge group, so that it
// survives any change of grouping: a group's state is gathered from its tensors before
// sparsifying and scattered back after.
//
// A residual lives either on the host or in the memory of the GPU whose path sparsified the
// tensor last (DeviceResidual, made by the device paths), never in both: a path that needs it
// elsewhere moves it (AddTo on the host; the device paths' TakeHost / TakeDevice / PutDevice), so
// none is lost or counted twice when a tensor changes path. Forget drops everything of a tensor.
//
// Thread-safety: every method is thread-safe (one lock around the maps). Callers guarantee that a
// tensor is in at most one group in flight, so the lock never orders the pipeline's stages.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "daemon/common/status.h"

namespace sparsync::pipeline {

// One tensor's slice of a merge group buffer.
struct GroupSlice {
  const std::string* name;
  size_t offset;  // elements from the group's start
  size_t count;
};

// A residual in a GPU's memory; the destructor frees it.
class DeviceResidual {
 public:
  virtual ~DeviceResidual() = default;
  virtual int device() const = 0;
  virtual size_t count() const = 0;
  virtual float* data() const = 0;  // device memory of device()
  // host[i] += residual[i] for count() elements. Blocks for the copy.
  virtual Status AddToHost(std::span<float> host) const = 0;
};

class TensorState {
 public:
  // kind: which per-tensor vector ("residual", "momentum", "accumulation").
  enum class Kind { kResidual = 0, kMomentum = 1, kAccumulation = 2 };

  // group[i] += state[i] over every slice (missing state counts as zero). For kResidual a
  // residual kept on a device comes to the host first (and stays there).
  Status AddTo(Kind kind, std::span<const GroupSlice> slices, std::span<float> group);
  // Copies the group's slices into the state (creating it), or out of it into `group`.
  void Store(Kind kind, std::span<const GroupSlice> slices, std::span<const float> group);
  void Load(Kind kind, std::span<const GroupSlice> slices, std::span<float> group);

  // `name`'s host residual of `count` elements, for a path that updates it in place outside the
  // lock (the host sparse path's in-place reduction) until CloseResidual(name): one kept on a
  // device comes to the host first. `*fresh`: there was none of that size, and the one returned
  // holds zeros. Valid until `name`'s residual is taken or forgotten; the caller's group is the
  // only one of `name` in flight.
  Result<std::span<float>> OpenResidual(const std::string& name, size_t count, bool* fresh);
  void CloseResidual(const std::string& name);
  // Removes `name`'s host vector of `kind` and returns it (empty if none).
  std::vector<float> Take(Kind kind, const std::string& name);
  // The device residual of `name`, if any (not removed; valid until it is taken or forgotten).
  DeviceResidual* Device(const std::string& name);
  // Removes `name`'s device residual and returns it (null if none).
  std::unique_ptr<DeviceResidual> TakeDevice(const std::string& name);
  // Keeps `residual` as `name`'s residual. REQUIRES: `name` has no host residual.
  void PutDevice(const std::string& name, std::unique_ptr<DeviceResidual> residual);

  // Drops everything of `name` (its device residual is freed).
  void Forget(const std::string& name);
  // The stored host vector of `name` (empty if none), for tests and the conservation checks.
  // Valid while no other call changes it.
  std::span<const float> Get(Kind kind, const std::string& name) const;
  size_t bytes() const;         // host
  size_t device_bytes() const;  // device residuals
  // The L2 norm of every residual kept on the host (for the metrics; takes the lock for one pass
  // over them, so it is for scrapes, not for every step). An open residual (OpenResidual) counts
  // with its value at the last scrape that found it closed: it is being written.
  double HostResidualNorm() const;

 private:
  std::vector<float>& Slot(Kind kind, const std::string& name, size_t count);  // REQUIRES: mu_
  // Moves the device residuals of `slices` into the host's (added to any of the same size).
  Status BringResidualsHome(std::span<const GroupSlice> slices);
  mutable std::mutex mu_;
  std::unordered_map<std::string, std::vector<float>> state_[3];
  std::unordered_map<std::string, std::unique_ptr<DeviceResidual>> device_;
  std::unordered_set<std::string> open_;  // residuals written outside the lock
  mutable std::unordered_map<std::string, double> squared_norm_;  // HostResidualNorm's last
};

}  // namespace sparsync::pipeline
