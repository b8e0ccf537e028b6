// Random-k: same draws as the reference, uniformity, the shared-seed mode, and the unbiased
// (d/k-scaled) form.

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

// The unbiased form: the same set as the unscaled one, each value RandomKScaled(x_i, d/k), and the
// CPU kernel sends the reference's bits.
TEST_P(RandomKSweep, UnbiasedScalesTheSameSetByDOverK) {
  const auto [n, density] = GetParam();
  const std::vector<float> x = MakeData(DataKind::kHeavyTailed, n, 22);
  SparsifierOptions o;
  o.density = density;
  SparsifierOptions unbiased = o;
  unbiased.unbiased = true;
  SparsifyContext ctx;
  ctx.seed = 0x5EED + static_cast<uint64_t>(n);
  const auto plain = Apply(*testing::MustMake("randomk", o), x, ctx);
  const auto scaled = Apply(*testing::MustMake("randomk", unbiased), x, ctx);
  testing::ExpectSameSelection(scaled,
                               Apply(*testing::MustMake("reference:randomk", unbiased), x, ctx));
  ASSERT_EQ(scaled.indices, plain.indices);
  const double scale = static_cast<double>(n) / static_cast<double>(SelectedCount(n, density));
  for (size_t j = 0; j < scaled.indices.size(); ++j) {
    const float want = static_cast<float>(static_cast<double>(plain.values[j]) * scale);
    ASSERT_TRUE(testing::SameBits(scaled.values[j], want)) << j;
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

TEST(RandomKTest, UnbiasedIsRefusedForOtherSparsifiers) {
  SparsifierOptions o;
  o.unbiased = true;
  for (const char* name : {"topk", "reference:wangni", "dgc"}) {
    auto made = MakeSparsifier(name, o);
    ASSERT_FALSE(made.ok()) << name;
    EXPECT_EQ(made.status().code(), StatusCode::kInvalidArgument) << name;
    EXPECT_NE(made.status().message().find("randomk only"), std::string::npos) << name;
  }
  EXPECT_TRUE(MakeSparsifier("reference:randomk", o).ok());
}

// Mean of T draws of Q(x) for one x: unbiased scaling makes it approach x; E||mean - x||^2 is
// exactly sum_i x_i^2 (d/k - 1) / T for uniform sampling of k of d. The unscaled form's mean is
// (k/d) x: it misses 1 - rho of x in every direction.
struct MeanOfDraws {
  double along = 0;           // <mean, x> / ||x||^2: 1 when unbiased
  double relative_error = 0;  // ||mean - x|| / ||x||
};

MeanOfDraws MeanOverDraws(bool unbiased, int64_t d, double density, int trials) {
  const std::vector<float> x = MakeData(DataKind::kNormal, d, 31);
  SparsifierOptions o;
  o.density = density;
  o.unbiased = unbiased;
  auto s = testing::MustMake("randomk", o);
  std::vector<double> mean(static_cast<size_t>(d), 0.0);
  for (int t = 0; t < trials; ++t) {
    SparsifyContext ctx;
    ctx.seed = 1000 + static_cast<uint64_t>(t);
    const auto q = Apply(*s, x, ctx);
    for (size_t j = 0; j < q.indices.size(); ++j) mean[q.indices[j]] += q.values[j] / trials;
  }
  double x2 = 0, dot = 0, err2 = 0;
  for (int64_t i = 0; i < d; ++i) {
    x2 += static_cast<double>(x[i]) * x[i];
    dot += mean[i] * x[i];
    err2 += (mean[i] - x[i]) * (mean[i] - x[i]);
  }
  return {dot / x2, std::sqrt(err2 / x2)};
}

TEST(RandomKTest, UnbiasedMeanApproachesTheInputAtUniformSamplingsRate) {
  const int64_t d = 4000;
  const double density = 0.05;  // k = 200, d/k = 20
  const int trials = 300;
  const MeanOfDraws scaled = MeanOverDraws(true, d, density, trials);
  // Normal data, so that no coordinate dominates. Along x: mean 1, sd at most
  // sqrt((d/k - 1) / T * sum x^4) / ||x||^2 = sqrt(19 / 300 * 3 / 4000) = 0.007.
  EXPECT_NEAR(scaled.along, 1.0, 0.05);
  // The whole error: sqrt((d/k - 1) / T) = 0.252 in expectation, relative sd about
  // sqrt(2 sum x^4) / ||x||^2 / 2 = 0.02; allowed 10 %.
  const double expected = std::sqrt((20.0 - 1.0) / trials);
  EXPECT_NEAR(scaled.relative_error, expected, 0.1 * expected);
  const MeanOfDraws plain = MeanOverDraws(false, d, density, trials);
  EXPECT_NEAR(plain.along, density, 0.02) << "the unscaled form sends (k/d) x in expectation";
  EXPECT_GT(plain.relative_error, 0.9);
}

}  // namespace
}  // namespace sparsync::kernels
