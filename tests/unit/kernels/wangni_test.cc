// Wangni et al. (NeurIPS 2018): unbiasedness, expected density, the greedy fixed point, the
// variance-budget closed form, lower variance than random-k, and CPU against reference.
// Statistical tests use fixed seeds; each states its bound.

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <tuple>

#include "kernels/reference/reference.h"
#include "tests/unit/kernels/test_util.h"

namespace sparsync::kernels {
namespace {

using testing::DataKind;
using testing::MakeData;
using testing::Apply;

// Magnitudes log-uniform in [0.1, 10] with random signs: every p_i is well away from 0.
std::vector<float> SpreadGradient(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> e(std::log(0.1), std::log(10.0));
  std::vector<float> g(static_cast<size_t>(n));
  for (float& v : g) v = static_cast<float>(std::exp(e(rng)) * (rng() % 2 ? 1 : -1));
  return g;
}

TEST(WangniTest, GreedyProbabilitiesSumToKappaDWhenFeasible) {
  const std::vector<float> g = MakeData(DataKind::kHeavyTailed, 100000, 3);
  for (double kappa : {1e-3, 1e-2, 0.1, 0.5}) {
    int passes = 0;
    const auto p = reference::WangniGreedyProbabilities(g, kappa, 64, &passes);
    const double sum = std::accumulate(p.begin(), p.end(), 0.0);
    EXPECT_NEAR(sum, kappa * 1e5, 1e-6 * kappa * 1e5) << "kappa " << kappa;
    EXPECT_LT(passes, 64);
    for (double pi : p) ASSERT_TRUE(pi >= 0.0 && pi <= 1.0);
    // Optimal form: p_i = min(lambda |g_i|, 1), i.e. p_i / |g_i| is constant where p_i < 1.
    double ratio = -1;
    for (size_t i = 0; i < g.size(); ++i) {
      if (p[i] < 1.0 && g[i] != 0) {
        const double r = p[i] / std::fabs(static_cast<double>(g[i]));
        if (ratio < 0) ratio = r;
        ASSERT_NEAR(r, ratio, 1e-9 * ratio);
      }
    }
  }
}

TEST(WangniTest, GreedyInfeasibleBudgetSendsEveryNonZero) {
  std::vector<float> g = MakeData(DataKind::kNormal, 1000, 4);
  for (size_t i = 0; i < g.size(); i += 2) g[i] = 0.0f;  // 500 non-zeros, kappa d = 900
  const auto p = reference::WangniGreedyProbabilities(g, 0.9, 64);
  for (size_t i = 0; i < g.size(); ++i) EXPECT_EQ(p[i], g[i] == 0 ? 0.0 : 1.0);
  SparsifierOptions o;
  o.density = 0.9;
  const auto r = Apply(*testing::MustMake("wangni", o), g);
  EXPECT_EQ(r.indices.size(), 500u);
}

TEST(WangniTest, EstimateIsUnbiased) {
  // d = 200, kappa = 0.2, T = 20000 draws. Per coordinate, the mean of Q_i has sd
  // |g_i| sqrt((1 - p_i) / p_i) / sqrt(T); every p_i >= ~0.02 so T p_i >= 400 and the mean is
  // close to normal. Bounds: every |z_i| < 5 (Bonferroni false-alarm ~1e-4), mean z^2 in
  // [0.6, 1.4] (sd of mean z^2 is ~0.1); coordinates with p_i = 1 must be exact.
  const int64_t d = 200, trials = 20000;
  const std::vector<float> g = SpreadGradient(d, 12);
  SparsifierOptions o;
  o.density = 0.2;
  auto s = testing::MustMake("wangni", o);
  const auto p = reference::WangniGreedyProbabilities(g, 0.2, 64);
  std::vector<double> sum(d, 0.0);
  for (int64_t t = 0; t < trials; ++t) {
    SparsifyContext ctx;
    ctx.seed = 1000 + static_cast<uint64_t>(t);
    const auto r = Apply(*s, g, ctx);
    ASSERT_TRUE(r.status.ok());
    for (size_t j = 0; j < r.indices.size(); ++j) sum[r.indices[j]] += r.values[j];
  }
  double z2 = 0;
  int n_z = 0;
  for (int64_t i = 0; i < d; ++i) {
    const double mean = sum[i] / trials;
    if (p[i] >= 1.0) {
      EXPECT_NEAR(mean, g[i], 1e-9 * std::fabs(g[i]));
      continue;
    }
    const double sd = std::fabs(g[i]) * std::sqrt((1 - p[i]) / p[i] / trials);
    const double z = (mean - g[i]) / sd;
    EXPECT_LT(std::fabs(z), 5.0) << "coordinate " << i << " p=" << p[i];
    z2 += z * z;
    ++n_z;
  }
  ASSERT_GT(n_z, 100);
  EXPECT_GT(z2 / n_z, 0.6);
  EXPECT_LT(z2 / n_z, 1.4);
}

TEST(WangniTest, MeanNnzIsKappaDWithinThreeSigma) {
  const int64_t d = 20000, trials = 200;
  const std::vector<float> g = MakeData(DataKind::kHeavyTailed, d, 13);
  const double kappa = 0.01;
  const auto p = reference::WangniGreedyProbabilities(g, kappa, 64);
  double var = 0;
  for (double pi : p) var += pi * (1 - pi);
  SparsifierOptions o;
  o.density = kappa;
  auto s = testing::MustMake("wangni", o);
  double total = 0;
  for (int64_t t = 0; t < trials; ++t) {
    SparsifyContext ctx;
    ctx.seed = static_cast<uint64_t>(t);
    total += static_cast<double>(Apply(*s, g, ctx).indices.size());
  }
  const double mean = total / trials;
  EXPECT_NEAR(mean, kappa * d, 3 * std::sqrt(var / trials));
}

TEST(WangniTest, LowerVarianceThanRandomKAtEqualDensity) {
  // Heavy-tailed gradient, density 1 %: E||Q(g) - g||^2 for Wangni vs random-k rescaled by d/k.
  const int64_t d = 20000, trials = 100;
  const std::vector<float> g = MakeData(DataKind::kHeavyTailed, d, 14);
  SparsifierOptions o;
  o.density = 0.01;
  auto wangni = testing::MustMake("wangni", o);
  auto randomk = testing::MustMake("randomk", o);
  const double scale = static_cast<double>(d) / static_cast<double>(SelectedCount(d, 0.01));
  double err_w = 0, err_r = 0;
  double g2 = 0;
  for (float v : g) g2 += static_cast<double>(v) * v;
  for (int64_t t = 0; t < trials; ++t) {
    SparsifyContext ctx;
    ctx.seed = static_cast<uint64_t>(t);
    const auto w = Apply(*wangni, g, ctx);
    const auto r = Apply(*randomk, g, ctx);
    // ||Q - g||^2 = ||g||^2 + sum_sent (q^2 - 2 q g_i).
    double ew = g2, er = g2;
    for (size_t j = 0; j < w.indices.size(); ++j) {
      const double q = w.values[j], gi = g[w.indices[j]];
      ew += q * q - 2 * q * gi;
    }
    for (size_t j = 0; j < r.indices.size(); ++j) {
      const double q = scale * r.values[j], gi = g[r.indices[j]];
      er += q * q - 2 * q * gi;
    }
    err_w += ew / trials;
    err_r += er / trials;
  }
  EXPECT_LT(err_w, 0.5 * err_r) << "wangni " << err_w << " randomk " << err_r;
  // And the analytic variance agrees with the measurement to within 30 %.
  const auto p = reference::WangniGreedyProbabilities(g, 0.01, 64);
  double analytic = 0;
  for (int64_t i = 0; i < d; ++i) {
    if (p[i] > 0) analytic += static_cast<double>(g[i]) * g[i] * (1 / p[i] - 1);
  }
  EXPECT_NEAR(err_w, analytic, 0.3 * analytic);
}

TEST(WangniTest, VarianceBudgetClosedFormMeetsTheBudgetExactly) {
  const std::vector<float> g = MakeData(DataKind::kHeavyTailed, 50000, 15);
  double g2 = 0;
  for (float v : g) g2 += static_cast<double>(v) * v;
  for (double eps : {0.1, 1.0, 10.0, 1000.0}) {
    const auto p = reference::WangniVarianceBudgetProbabilities(g, eps);
    double second_moment = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      ASSERT_TRUE(p[i] > 0 && p[i] <= 1.0);
      second_moment += static_cast<double>(g[i]) * g[i] / p[i];
    }
    EXPECT_NEAR(second_moment, (1 + eps) * g2, 1e-9 * (1 + eps) * g2) << "eps " << eps;
    // Larger budgets send fewer coordinates.
    if (eps > 0.1) {
      const auto p_small = reference::WangniVarianceBudgetProbabilities(g, eps / 10);
      EXPECT_LT(std::accumulate(p.begin(), p.end(), 0.0),
                std::accumulate(p_small.begin(), p_small.end(), 0.0));
    }
  }
}

// CPU against reference: identical indices; values equal up to the last bits of p.
void ExpectWangniMatch(const std::vector<float>& g, const SparsifierOptions& o, uint64_t seed) {
  SparsifyContext ctx;
  ctx.seed = seed;
  const auto a = Apply(*testing::MustMake("wangni", o), g, ctx);
  const auto b = Apply(*testing::MustMake("reference:wangni", o), g, ctx);
  ASSERT_TRUE(a.status.ok() && b.status.ok());
  ASSERT_EQ(a.indices, b.indices);
  testing::ExpectStrictlyAscending(a.indices);
  for (size_t j = 0; j < a.values.size(); ++j) {
    ASSERT_NEAR(a.values[j], b.values[j], 1e-6f * std::fabs(b.values[j])) << j;
  }
}

class WangniSweep : public ::testing::TestWithParam<std::tuple<int64_t, double, DataKind>> {};

TEST_P(WangniSweep, CpuEqualsReference) {
  const auto [n, kappa, kind] = GetParam();
  SparsifierOptions o;
  o.density = kappa;
  ExpectWangniMatch(MakeData(kind, n, 51 + static_cast<uint64_t>(n)), o, 7);
}

INSTANTIATE_TEST_SUITE_P(
    Sweep, WangniSweep,
    ::testing::Combine(::testing::Values<int64_t>(0, 1, 2, 1000, 100000, 1000000),
                       ::testing::Values(1e-4, 1e-2, 0.5, 1.0),
                       ::testing::Values(DataKind::kNormal, DataKind::kHeavyTailed,
                                         DataKind::kTies, DataKind::kSignedZeros,
                                         DataKind::kDenormals)));

TEST(WangniTest, VarianceBudgetCpuEqualsReference) {
  for (double eps : {0.5, 5.0}) {
    SparsifierOptions o;
    o.variance_budget = eps;
    ExpectWangniMatch(MakeData(DataKind::kHeavyTailed, 100000, 16), o, 3);
    ExpectWangniMatch(MakeData(DataKind::kTies, 10000, 17), o, 4);
  }
}

}  // namespace
}  // namespace sparsync::kernels
