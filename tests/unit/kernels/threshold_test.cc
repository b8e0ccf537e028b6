// Threshold sparsification: fixed tau and the sampled quantile (Aji & Heafield).

#include <gtest/gtest.h>

#include <cmath>
#include <tuple>

#include "tests/unit/kernels/test_util.h"

namespace sparsync::kernels {
namespace {

using testing::DataKind;
using testing::MakeData;
using testing::Apply;

TEST(ThresholdTest, FixedThresholdIsStrict) {
  const std::vector<float> x = {0.5f, -0.5f, 0.50001f, -2.0f, 0.0f, 0.49999f};
  SparsifierOptions o;
  o.threshold = 0.5;
  for (const char* name : {"threshold", "reference:threshold"}) {
    const auto r = Apply(*testing::MustMake(name, o), x);
    ASSERT_TRUE(r.status.ok());
    EXPECT_EQ(r.indices, (std::vector<int32_t>{2, 3})) << name;
    EXPECT_EQ(r.values, (std::vector<float>{0.50001f, -2.0f}));
  }
}

TEST(ThresholdTest, FixedThresholdBetweenFloatsAndOnDenormals) {
  // tau = 0.1 (not a float): |x| = float(0.1) is above 0.1 in double, the float below is not.
  const float f = 0.1f;  // 0.100000001490116...
  const float dmin = std::numeric_limits<float>::denorm_min();  // 1.4e-45
  const std::vector<float> x = {f, std::nextafter(f, 0.0f), dmin, -2 * dmin};
  SparsifierOptions o;
  o.threshold = 0.1;
  for (const char* name : {"threshold", "reference:threshold"}) {
    EXPECT_EQ(Apply(*testing::MustMake(name, o), x).indices, (std::vector<int32_t>{0})) << name;
  }
  o.threshold = 2e-45;  // between the two denormals
  for (const char* name : {"threshold", "reference:threshold"}) {
    EXPECT_EQ(Apply(*testing::MustMake(name, o), x).indices, (std::vector<int32_t>{0, 1, 3}))
        << name;
  }
}

class ThresholdSweep
    : public ::testing::TestWithParam<std::tuple<int64_t, double, DataKind, bool>> {};

TEST_P(ThresholdSweep, CpuEqualsReference) {
  const auto [n, density, kind, fixed] = GetParam();
  const std::vector<float> x = MakeData(kind, n, 31 + static_cast<uint64_t>(n));
  SparsifierOptions o;
  o.density = density;
  o.threshold = fixed ? (kind == DataKind::kDenormals ? 1e-43 : 1.5) : 0.0;
  SparsifyContext ctx;
  ctx.seed = 99;
  const auto actual = Apply(*testing::MustMake("threshold", o), x, ctx);
  testing::ExpectSameSelection(actual,
                               Apply(*testing::MustMake("reference:threshold", o), x, ctx));
  testing::ExpectStrictlyAscending(actual.indices);
}

INSTANTIATE_TEST_SUITE_P(
    Sweep, ThresholdSweep,
    ::testing::Combine(::testing::Values<int64_t>(0, 1, 2, 999, 1000, 1001, 100000, 1000000),
                       ::testing::Values(1e-4, 1e-2, 1.0),
                       ::testing::Values(DataKind::kNormal, DataKind::kTies,
                                         DataKind::kSignedZeros, DataKind::kDenormals),
                       ::testing::Bool()));

TEST(ThresholdTest, QuantileModeHitsTheDensityApproximately) {
  // 1M normal values, 0.1 % sample (1000 values), density 1 %: the sample quantile's rank error
  // gives a count of 10000 +- ~3000 (sd of the 10th order statistic of 1000 is ~3 ranks = 30 %).
  const std::vector<float> x = MakeData(DataKind::kNormal, 1000000, 5);
  SparsifierOptions o;
  o.density = 0.01;
  for (uint64_t seed : {1u, 2u, 3u}) {
    SparsifyContext ctx;
    ctx.seed = seed;
    const auto r = Apply(*testing::MustMake("threshold", o), x, ctx);
    EXPECT_GT(r.indices.size(), 4000u);
    EXPECT_LT(r.indices.size(), 25000u);
  }
}

TEST(ThresholdTest, NonFiniteIsAnError) {
  std::vector<float> x = MakeData(DataKind::kNormal, 5000, 1);
  x[4000] = -std::numeric_limits<float>::infinity();
  SparsifierOptions o;
  o.threshold = 100.0;  // the Inf would be selected if not refused
  for (const char* name : {"threshold", "reference:threshold"}) {
    const auto r = Apply(*testing::MustMake(name, o), x);
    EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status.message().find("element 4000 is -Inf"), std::string::npos)
        << r.status.message();
  }
}

}  // namespace
}  // namespace sparsync::kernels
