#include "daemon/pipeline/tensor_state.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace sparsync::pipeline {

std::vector<float>& TensorState::Slot(Kind kind, const std::string& name, size_t count) {
  std::vector<float>& v = state_[static_cast<int>(kind)][name];
  if (v.size() != count) v.assign(count, 0.0f);  // new tensor, or its shape changed
  return v;
}

Status TensorState::BringResidualsHome(std::span<const GroupSlice> slices) {
  std::vector<std::pair<const GroupSlice*, std::unique_ptr<DeviceResidual>>> arriving;
  {
    std::lock_guard lock(mu_);
    for (const GroupSlice& s : slices) {
      auto it = device_.find(*s.name);
      if (it == device_.end()) continue;
      arriving.emplace_back(&s, std::move(it->second));
      device_.erase(it);
    }
  }
  // Copied outside the lock.
  for (auto& [s, residual] : arriving) {
    std::vector<float> host(s->count, 0.0f);
    if (residual->count() == s->count) SPARSYNC_RETURN_IF_ERROR(residual->AddToHost(host));
    std::lock_guard lock(mu_);
    std::vector<float>& v = state_[static_cast<int>(Kind::kResidual)][*s->name];
    if (v.size() == s->count) {
      for (size_t i = 0; i < s->count; ++i) v[i] += host[i];
    } else {
      v = std::move(host);
    }
  }
  return Status::Ok();
}

Status TensorState::AddTo(Kind kind, std::span<const GroupSlice> slices, std::span<float> group) {
  if (kind == Kind::kResidual) SPARSYNC_RETURN_IF_ERROR(BringResidualsHome(slices));
  std::lock_guard lock(mu_);
  const auto& map = state_[static_cast<int>(kind)];
  for (const GroupSlice& s : slices) {
    auto it = map.find(*s.name);
    if (it == map.end() || it->second.size() != s.count) continue;
    const float* src = it->second.data();
    float* dst = group.data() + s.offset;
    for (size_t i = 0; i < s.count; ++i) dst[i] += src[i];
  }
  return Status::Ok();
}

void TensorState::Store(Kind kind, std::span<const GroupSlice> slices,
                        std::span<const float> group) {
  std::lock_guard lock(mu_);
  for (const GroupSlice& s : slices) {
    std::vector<float>& v = Slot(kind, *s.name, s.count);
    std::memcpy(v.data(), group.data() + s.offset, s.count * sizeof(float));
  }
}

void TensorState::Load(Kind kind, std::span<const GroupSlice> slices, std::span<float> group) {
  std::lock_guard lock(mu_);
  for (const GroupSlice& s : slices) {
    std::vector<float>& v = Slot(kind, *s.name, s.count);
    std::memcpy(group.data() + s.offset, v.data(), s.count * sizeof(float));
  }
}

Result<std::span<float>> TensorState::OpenResidual(const std::string& name, size_t count,
                                                   bool* fresh) {
  const GroupSlice whole{&name, 0, count};
  SPARSYNC_RETURN_IF_ERROR(BringResidualsHome({&whole, 1}));
  std::lock_guard lock(mu_);
  std::vector<float>& v = state_[static_cast<int>(Kind::kResidual)][name];
  *fresh = v.size() != count;
  if (*fresh) v.assign(count, 0.0f);
  open_.insert(name);
  return std::span<float>(v);
}

void TensorState::CloseResidual(const std::string& name) {
  std::lock_guard lock(mu_);
  open_.erase(name);
}

std::vector<float> TensorState::Take(Kind kind, const std::string& name) {
  std::lock_guard lock(mu_);
  auto& map = state_[static_cast<int>(kind)];
  auto it = map.find(name);
  if (it == map.end()) return {};
  std::vector<float> v = std::move(it->second);
  map.erase(it);
  return v;
}

DeviceResidual* TensorState::Device(const std::string& name) {
  std::lock_guard lock(mu_);
  auto it = device_.find(name);
  return it == device_.end() ? nullptr : it->second.get();
}

std::unique_ptr<DeviceResidual> TensorState::TakeDevice(const std::string& name) {
  std::lock_guard lock(mu_);
  auto it = device_.find(name);
  if (it == device_.end()) return nullptr;
  std::unique_ptr<DeviceResidual> r = std::move(it->second);
  device_.erase(it);
  return r;
}

void TensorState::PutDevice(const std::string& name, std::unique_ptr<DeviceResidual> residual) {
  std::lock_guard lock(mu_);
  device_[name] = std::move(residual);
}

void TensorState::Forget(const std::string& name) {
  std::unique_ptr<DeviceResidual> freed;  // after the lock is released
  std::lock_guard lock(mu_);
  for (auto& map : state_) map.erase(name);
  open_.erase(name);
  squared_norm_.erase(name);
  auto it = device_.find(name);
  if (it != device_.end()) {
    freed = std::move(it->second);
    device_.erase(it);
  }
}

std::span<const float> TensorState::Get(Kind kind, const std::string& name) const {
  std::lock_guard lock(mu_);
  const auto& map = state_[static_cast<int>(kind)];
  auto it = map.find(name);
  if (it == map.end()) return {};
  return it->second;
}

size_t TensorState::bytes() const {
  std::lock_guard lock(mu_);
  size_t total = 0;
  for (const auto& map : state_) {
    for (const auto& [name, v] : map) total += v.size() * sizeof(float);
  }
  return total;
}

double TensorState::HostResidualNorm() const {
  std::lock_guard lock(mu_);
  double sum = 0;
  for (const auto& [name, v] : state_[static_cast<int>(Kind::kResidual)]) {
    double& squared = squared_norm_[name];
    if (!open_.contains(name)) {
      squared = 0;
      for (float x : v) squared += static_cast<double>(x) * x;
    }
    sum += squared;
  }
  return std::sqrt(sum);
}

size_t TensorState::device_bytes() const {
  std::lock_guard lock(mu_);
  size_t total = 0;
  for (const auto& [name, r] : device_) total += r->count() * sizeof(float);
  return total;
}

}  // namespace sparsync::pipeline
