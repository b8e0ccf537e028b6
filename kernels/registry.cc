// MakeSparsifier: name -> implementation, with option checks in one place.

#include <cmath>
#include <string>

#include "kernels/cpu/cpu.h"
#include "kernels/reference/reference.h"
#include "kernels/sparsifier.h"

namespace sparsync::kernels {
namespace {

using Factory = std::unique_ptr<Sparsifier> (*)(const SparsifierOptions&);

struct Entry {
  std::string_view name;
  Factory cpu;
  Factory reference;
};

constexpr Entry kEntries[] = {
    {"topk", &cpu::MakeTopK, &reference::MakeTopK},
    {"randomk", &cpu::MakeRandomK, &reference::MakeRandomK},
    {"threshold", &cpu::MakeThreshold, &reference::MakeThreshold},
    {"gaussiank", &cpu::MakeGaussianK, &reference::MakeGaussianK},
    {"wangni", &cpu::MakeWangni, &reference::MakeWangni},
    {"dgc", &cpu::MakeDgc, &reference::MakeDgc},
};

constexpr std::string_view kReferencePrefix = "reference:";

std::string AcceptedNames() {
  std::string s;
  for (const std::string& n : SparsifierNames()) s += (s.empty() ? "" : ", ") + n;
  return s;
}

Status CheckOptions(std::string_view base, const SparsifierOptions& o) {
  const std::string who = "sparsifier '" + std::string(base) + "': ";
  if (!(o.density > 0.0 && o.density <= 1.0)) {
    return InvalidArgumentError(who + "density must be in (0, 1], got " +
                                std::to_string(o.density));
  }
  if (o.k < 0) return InvalidArgumentError(who + "k must be >= 0, got " + std::to_string(o.k));
  if (o.unbiased && base != "randomk") {
    return InvalidArgumentError(who + "unbiased (d/k scaling) applies to randomk only");
  }
  if (base == "threshold") {
    if (!std::isfinite(o.threshold)) return InvalidArgumentError(who + "threshold must be finite");
    if (o.threshold <= 0 && !(o.sample_fraction > 0.0 && o.sample_fraction <= 1.0)) {
      return InvalidArgumentError(who + "sample_fraction must be in (0, 1]");
    }
    if (o.min_sample_size < 1) return InvalidArgumentError(who + "min_sample_size must be >= 1");
  }
  if (base == "wangni") {
    if (!(o.variance_budget >= 0.0) || !std::isfinite(o.variance_budget)) {
      return InvalidArgumentError(who + "variance_budget must be finite and >= 0");
    }
    if (o.max_greedy_iterations < 0) {
      return InvalidArgumentError(who + "max_greedy_iterations must be >= 0");
    }
  }
  if (base == "dgc") {
    if (!(o.momentum >= 0.0 && o.momentum < 1.0)) {
      return InvalidArgumentError(who + "momentum must be in [0, 1)");
    }
    if (!(o.clip_norm >= 0.0) || !std::isfinite(o.clip_norm)) {
      return InvalidArgumentError(who + "clip_norm must be finite and >= 0 (0 = off)");
    }
  }
  return Status::Ok();
}

}  // namespace

std::vector<std::string> SparsifierNames() {
  std::vector<std::string> names;
  for (const Entry& e : kEntries) names.emplace_back(e.name);
  for (const Entry& e : kEntries) names.push_back(std::string(kReferencePrefix) + std::string(e.name));
  return names;
}

Result<std::unique_ptr<Sparsifier>> MakeSparsifier(std::string_view spec_name,
                                                   const SparsifierOptions& options) {
  std::string_view base = spec_name;
  const bool reference = base.starts_with(kReferencePrefix);
  if (reference) base.remove_prefix(kReferencePrefix.size());
  for (const Entry& e : kEntries) {
    if (e.name != base) continue;
    SPARSYNC_KERNELS_RETURN_IF_ERROR(CheckOptions(base, options));
    return reference ? e.reference(options) : e.cpu(options);
  }
  return NotFoundError("unknown sparsifier '" + std::string(spec_name) +
                       "'; accepted names: " + AcceptedNames());
}

}  // namespace sparsync::kernels
