// Random-k: same draws as the reference, uniformity, and the shared-seed mode.

#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <tuple>

#include "tests/unit/kernels/test_util.h"

namespace sparsync::kernels {
namespace {

using testing::DataKind;
using testing::MakeData;
using testing::Apply;

class RandomKSweep : public ::testing::TestWithParam<std::tuple<int64_t, double>> {};

TEST_P(RandomKSweep, CpuEqualsReferenceAndIsAValidSet) {
  const auto [n, density] = GetParam();
  const std::vector<float> x = MakeData(DataKind::kNormal, n, 21);
  SparsifierOptions o;
  o.density = density;
  SparsifyContext ctx;
  ctx.seed = 0xABCDEF + static_cast<uint64_t>(n);
  const auto actual = Apply(*testing::MustMake("randomk", o), x, ctx);
  testing::ExpectSameSelection(actual, Apply(*testing::MustMake("reference:randomk", o), x, ctx));
  EXPECT_EQ(static_cast<int64_t>(actual.indices.size()), SelectedCount(n, density));
  testing::ExpectStrictlyAscending(actual.indices);
  for (size_t j = 0; j < actual.indices.size(); ++j) {
    ASSERT_TRUE(testing::SameBits(actual.values[j], x[static_cast<size_t>(actual.indices[j])]));
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, RandomKSweep,
                         ::testing::Combine(::testing::Values<int64_t>(0, 1, 2, 5, 1000, 65537),
                                            ::testing::Values(1e-4, 1e-2, 0.5, 1.0)));
INSTANTIATE_TEST_SUITE_P(Million, RandomKSweep,
                         ::testing::Combine(::testing::Values<int64_t>(1000000),
                                            ::testing::Values(1e-4, 1e-2)));

TEST(RandomKTest, SharedSeedModeIgnoresDataAndNodeSeed) {
  SparsifierOptions o;
  o.density = 0.01;
  o.shared_seed = true;
  auto s = testing::MustMake("randomk", o);
  SparsifyContext node0, node1;
  node0.seed = 1;  // node-specific seeds differ
  node1.seed = 2;
  node0.shared_seed = node1.shared_seed = 77;
  const auto a = Apply(*s, MakeData(DataKind::kNormal, 100000, 1), node0);
  const auto b = Apply(*s, MakeData(DataKind::kHeavyTailed, 100000, 2), node1);
  ASSERT_TRUE(a.status.ok() && b.status.ok());
  EXPECT_EQ(a.indices, b.indices);
  EXPECT_NE(a.values, b.values);
  // A different step (shared seed) gives a different set.
  node1.shared_seed = 78;
  EXPECT_NE(Apply(*s, MakeData(DataKind::kNormal, 100000, 1), node1).indices, a.indices);
}

TEST(RandomKTest, NodeSeedModeDiffersBetweenNodes) {
  SparsifierOptions o;
  o.density = 0.01;
  auto s = testing::MustMake("randomk", o);
  SparsifyContext node0, node1;
  node0.seed = 1;
  node1.seed = 2;
  node0.shared_seed = node1.shared_seed = 77;
  const std::vector<float> x = MakeData(DataKind::kNormal, 100000, 1);
  EXPECT_NE(Apply(*s, x, node0).indices, Apply(*s, x, node1).indices);
  EXPECT_EQ(Apply(*s, x, node0).indices, Apply(*s, x, node0).indices);  // reproducible
}

TEST(RandomKTest, EveryIndexIsEquallyLikely) {
  // n = 100, k = 10, 20000 draws: each index expected 2000 times, sd = sqrt(2000 * 0.9) = 42.4.
  // Bound: every count within 5 sd (a false alarm has probability ~6e-5 per run; seeds fixed).
  SparsifierOptions o;
  o.k = 10;
  auto s = testing::MustMake("randomk", o);
  const std::vector<float> x(100, 1.0f);
  std::vector<int> hits(100, 0);
  for (uint64_t seed = 0; seed < 20000; ++seed) {
    SparsifyContext ctx;
    ctx.seed = seed;
    for (int32_t i : Apply(*s, x, ctx).indices) ++hits[static_cast<size_t>(i)];
  }
  double chi2 = 0;
  for (int h : hits) {
    EXPECT_NEAR(h, 2000, 5 * 42.4);
    chi2 += (h - 2000.0) * (h - 2000.0) / 2000.0;
  }
  // chi2 with 99 dof (scaled by 0.9 for sampling without replacement): mean ~89, sd ~13.
  EXPECT_LT(chi2, 89 + 5 * 13.3);
}

}  // namespace
}  // namespace sparsync::kernels
