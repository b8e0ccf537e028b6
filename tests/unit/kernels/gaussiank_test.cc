// Gaussian-k (Shi et al. 2019): CPU against reference, and the count lands near k.

#include <gtest/gtest.h>

#include <tuple>

#include "tests/unit/kernels/test_util.h"

namespace sparsync::kernels {
namespace {

using testing::DataKind;
using testing::MakeData;
using testing::Apply;

class GaussianKSweep
    : public ::testing::TestWithParam<std::tuple<int64_t, double, DataKind>> {};

TEST_P(GaussianKSweep, CpuEqualsReference) {
  const auto [n, density, kind] = GetParam();
  const std::vector<float> x = MakeData(kind, n, 41 + static_cast<uint64_t>(n));
  SparsifierOptions o;
  o.density = density;
  const auto actual = Apply(*testing::MustMake("gaussiank", o), x);
  testing::ExpectSameSelection(actual, Apply(*testing::MustMake("reference:gaussiank", o), x));
  testing::ExpectStrictlyAscending(actual.indices);
}

INSTANTIATE_TEST_SUITE_P(
    Sweep, GaussianKSweep,
    ::testing::Combine(::testing::Values<int64_t>(0, 1, 2, 3, 1000, 100000, 1000000),
                       ::testing::Values(1e-4, 1e-3, 1e-2, 0.5, 1.0),
                       ::testing::Values(DataKind::kNormal, DataKind::kHeavyTailed,
                                         DataKind::kTies, DataKind::kSignedZeros,
                                         DataKind::kDenormals)));

TEST(GaussianKTest, CountIsWithinTheCorrectionBandOnGaussianData) {
  // On truly Gaussian data the first estimate is already good: count in [2k/3, 4k/3].
  const std::vector<float> x = MakeData(DataKind::kNormal, 1000000, 8);
  for (double density : {1e-3, 1e-2}) {
    SparsifierOptions o;
    o.density = density;
    const auto r = Apply(*testing::MustMake("gaussiank", o), x);
    const double k = density * 1e6;
    EXPECT_GE(static_cast<double>(r.indices.size()), 2 * k / 3) << density;
    EXPECT_LE(static_cast<double>(r.indices.size()), 4 * k / 3) << density;
  }
}

TEST(GaussianKTest, CorrectionsRaiseTheCountOnHeavyTails) {
  // Student-t(1.5) has a huge sigma, so mu + z sigma overshoots; the x0.5 corrections must
  // bring the count up compared with the uncorrected threshold (which selects almost nothing).
  const std::vector<float> x = MakeData(DataKind::kHeavyTailed, 1000000, 9);
  SparsifierOptions o;
  o.density = 1e-2;
  const auto r = Apply(*testing::MustMake("gaussiank", o), x);
  ASSERT_TRUE(r.status.ok());
  EXPECT_GT(r.indices.size(), 1000u);
}

}  // namespace
}  // namespace sparsync::kernels
