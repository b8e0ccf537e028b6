#include "daemon/pipeline/tensor_state.h"

#include <algorithm>
#include <cstring>

namespace sparsync::pipeline {

std::vector<float>& TensorState::Slot(Kind kind, const std::string& name, size_t count) {
  std::vector<float>& v = state_[static_cast<int>(kind)][name];
  if (v.size() != count) v.assign(count, 0.0f);  // new tensor, or its shape changed
  return v;
}

void TensorState::AddTo(Kind kind, std::span<const GroupSlice> slices, std::span<float> group) {
  const auto& map = state_[static_cast<int>(kind)];
  for (const GroupSlice& s : slices) {
    auto it = map.find(*s.name);
    if (it == map.end() || it->second.size() != s.count) continue;
    const float* src = it->second.data();
    float* dst = group.data() + s.offset;
    for (size_t i = 0; i < s.count; ++i) dst[i] += src[i];
  }
}

void TensorState::Store(Kind kind, std::span<const GroupSlice> slices,
                        std::span<const float> group) {
  for (const GroupSlice& s : slices) {
    std::vector<float>& v = Slot(kind, *s.name, s.count);
    std::memcpy(v.data(), group.data() + s.offset, s.count * sizeof(float));
  }
}

void TensorState::Load(Kind kind, std::span<const GroupSlice> slices, std::span<float> group) {
  for (const GroupSlice& s : slices) {
    std::vector<float>& v = Slot(kind, *s.name, s.count);
    std::memcpy(group.data() + s.offset, v.data(), s.count * sizeof(float));
  }
}

std::vector<float> TensorState::Take(Kind kind, const std::string& name) {
  auto& map = state_[static_cast<int>(kind)];
  auto it = map.find(name);
  if (it == map.end()) return {};
  std::vector<float> v = std::move(it->second);
  map.erase(it);
  return v;
}

void TensorState::Forget(const std::string& name) {
  for (auto& map : state_) map.erase(name);
}

std::span<const float> TensorState::Get(Kind kind, const std::string& name) const {
  const auto& map = state_[static_cast<int>(kind)];
  auto it = map.find(name);
  if (it == map.end()) return {};
  return it->second;
}

size_t TensorState::bytes() const {
  size_t total = 0;
  for (const auto& map : state_) {
    for (const auto& [name, v] : map) total += v.size() * sizeof(float);
  }
  return total;
}

}  // namespace sparsync::pipeline
