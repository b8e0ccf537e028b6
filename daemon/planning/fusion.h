// Fixed-size fusion buckets (SPARSYNC_MERGE=fixed:BYTES): the merge policy of the dense path, in
// the manner of Horovod's tensor fusion.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace sparsync::planning {

struct FusionCandidate {
  uint64_t bytes = 0;
  uint64_t fusion_key = 0;  // only tensors with equal keys may share a bucket; kNeverFuse: alone
};

inline constexpr uint64_t kNeverFuse = ~0ull;

// Splits `candidates` (in the order they became ready) into buckets of consecutive compatible
// tensors whose total stays within `bucket_bytes`. A tensor larger than the bucket goes alone.
// Returns the buckets as lists of indices into `candidates`, in order; every index appears once.
std::vector<std::vector<size_t>> FixedBuckets(const std::vector<FusionCandidate>& candidates,
                                              uint64_t bucket_bytes);

}  // namespace sparsync::planning
