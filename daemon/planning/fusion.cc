#include "daemon/planning/fusion.h"

namespace sparsync::planning {

std::vector<std::vector<size_t>> FixedBuckets(const std::vector<FusionCandidate>& candidates,
                                              uint64_t bucket_bytes) {
  std::vector<std::vector<size_t>> buckets;
  uint64_t open_bytes = 0;
  uint64_t open_key = kNeverFuse;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const FusionCandidate& c = candidates[i];
    bool joins = !buckets.empty() && c.fusion_key != kNeverFuse && c.fusion_key == open_key &&
                 open_bytes + c.bytes <= bucket_bytes;
    if (joins) {
      buckets.back().push_back(i);
      open_bytes += c.bytes;
    } else {
      buckets.push_back({i});
      open_bytes = c.bytes;
      open_key = c.fusion_key;
    }
  }
  return buckets;
}

}  // namespace sparsync::planning
