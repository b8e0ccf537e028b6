#include "daemon/planning/fusion.h"

#include <gtest/gtest.h>

#include <random>

namespace sparsync::planning {
namespace {

using Buckets = std::vector<std::vector<size_t>>;

TEST(FixedBucketsTest, FillsUpToTheBucketSize) {
  EXPECT_EQ(FixedBuckets({{40, 1}, {40, 1}, {40, 1}}, 100), (Buckets{{0, 1}, {2}}));
  EXPECT_EQ(FixedBuckets({{50, 1}, {50, 1}}, 100), (Buckets{{0, 1}})) << "exactly full";
}

TEST(FixedBucketsTest, OversizedTensorsGoAlone) {
  EXPECT_EQ(FixedBuckets({{10, 1}, {500, 1}, {10, 1}}, 100), (Buckets{{0}, {1}, {2}}));
}

TEST(FixedBucketsTest, IncompatibleKeysSplitBuckets) {
  EXPECT_EQ(FixedBuckets({{1, 1}, {1, 2}, {1, 2}, {1, kNeverFuse}, {1, kNeverFuse}}, 100),
            (Buckets{{0}, {1, 2}, {3}, {4}}));
}

TEST(FixedBucketsTest, EmptyInputGivesNoBuckets) { EXPECT_TRUE(FixedBuckets({}, 100).empty()); }

TEST(FixedBucketsTest, EveryIndexOnceInOrderAndNoBucketOverflows) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<FusionCandidate> c(rng() % 50);
    for (auto& x : c) x = {rng() % 300, rng() % 3};
    uint64_t bucket = 1 + rng() % 400;
    auto buckets = FixedBuckets(c, bucket);
    size_t next = 0;
    for (const auto& b : buckets) {
      uint64_t bytes = 0;
      for (size_t i : b) {
        ASSERT_EQ(i, next++);
        bytes += c[i].bytes;
        ASSERT_EQ(c[i].fusion_key, c[b.front()].fusion_key);
      }
      if (b.size() > 1) {
        ASSERT_LE(bytes, bucket);
      }
    }
    ASSERT_EQ(next, c.size());
  }
}

}  // namespace
}  // namespace sparsync::planning
