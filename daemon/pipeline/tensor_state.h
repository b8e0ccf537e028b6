// TensorState: what the sparse path remembers per tensor between steps — the error-feedback
// residual (Stich et al. 2018; Aji & Heafield 2017) and DGC's momentum and accumulation. Keyed by
// tensor name, not by merge group, so that it survives any change of grouping: a group's state is
// gathered from its tensors before sparsifying and scattered back after.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

namespace sparsync::pipeline {

// One tensor's slice of a merge group buffer.
struct GroupSlice {
  const std::string* name;
  size_t offset;  // elements from the group's start
  size_t count;
};

class TensorState {
 public:
  // kind: which per-tensor vector ("residual", "momentum", "accumulation").
  enum class Kind { kResidual = 0, kMomentum = 1, kAccumulation = 2 };

  // group[i] += state[i] over every slice (missing state counts as zero).
  void AddTo(Kind kind, std::span<const GroupSlice> slices, std::span<float> group);
  // Copies the group's slices into the state (creating it), or out of it into `group`.
  void Store(Kind kind, std::span<const GroupSlice> slices, std::span<const float> group);
  void Load(Kind kind, std::span<const GroupSlice> slices, std::span<float> group);

  // Removes `name`'s vector of `kind` and returns it (empty if none).
  std::vector<float> Take(Kind kind, const std::string& name);
  // Drops every vector of `name`.
  void Forget(const std::string& name);
  // The stored vector of `name` (empty if none), for tests and the conservation checks.
  std::span<const float> Get(Kind kind, const std::string& name) const;
  size_t bytes() const;

 private:
  std::vector<float>& Slot(Kind kind, const std::string& name, size_t count);
  std::unordered_map<std::string, std::vector<float>> state_[3];
};

}  // namespace sparsync::pipeline
