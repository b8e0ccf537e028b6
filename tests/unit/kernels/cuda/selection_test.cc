// CUDA random-k, threshold, Gaussian-k and Wangni against the reference oracles. Random-k and
// threshold draw the same numbers as the reference, so their selections must be identical;
// Gaussian-k and Wangni sum in another order (last-bit differences in tau / lambda), which the
// reference comparison tolerates as the CPU kernel tests do.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <string>
#include <tuple>
#include <utility>

#include "kernels/cuda/cuda_kernels.h"
#include "tests/unit/kernels/cuda/cuda_test_util.h"

namespace sparsync::kernels::cuda {
namespace {

using kernels::testing::Apply;
using kernels::testing::DataKind;
using kernels::testing::ExpectSameSelection;
using kernels::testing::ExpectStrictlyAscending;
using kernels::testing::MakeData;
using kernels::testing::MustMake;
using kernels::testing::Selection;
using testing::CudaParamTest;
using testing::CudaTest;
using testing::DeviceArray;
using testing::MustCreate;
using testing::RunSelection;

const auto kKinds = ::testing::Values(DataKind::kNormal, DataKind::kHeavyTailed, DataKind::kTies,
                                      DataKind::kSignedZeros, DataKind::kDenormals);

// "n1000_d1e-02_normal": sizes in test names, so a run can be filtered by size.
std::string DensityName(double d) {
  char text[32];
  std::snprintf(text, sizeof text, "d%.0e", d);
  std::string s(text);
  for (char& c : s) {
    if (c == '-' || c == '+' || c == '.') c = '_';
  }
  return s;
}

using SizeDensityKind = std::tuple<int64_t, double, DataKind>;

std::string SizeDensityKindName(const ::testing::TestParamInfo<SizeDensityKind>& info) {
  return "n" + std::to_string(std::get<0>(info.param)) + "_" +
         DensityName(std::get<1>(info.param)) + "_" +
         kernels::testing::DataKindName(std::get<2>(info.param));
}

// ---- Random-k.

class RandomKSweep : public CudaParamTest<std::tuple<int64_t, double, uint64_t>> {};

TEST_P(RandomKSweep, SameSetAsReference) {
  const auto [n, density, seed] = GetParam();
  SparsifierOptions o;
  o.density = density;
  const int64_t k = SelectedCount(n, density);
  const std::vector<float> x = MakeData(DataKind::kNormal, n, seed);
  SparsifyContext ctx;
  ctx.seed = seed;
  const Selection want = Apply(*MustMake("reference:randomk", o), x, ctx);
  auto ws = MustCreate(n, k);
  ASSERT_NE(ws, nullptr);
  DeviceArray<float> dx(x);
  const Selection got = RunSelection(*ws, k, stream_, [&](DeviceSparse out) {
    return RandomK(dx.get(), n, k, seed, out, *ws, stream_);
  });
  ExpectSameSelection(got, want);
}

// The unbiased form (no error feedback): the same set, each value RandomKScaled(x_i, d/k), the
// reference's bits.
TEST_P(RandomKSweep, UnbiasedSameValuesAsReference) {
  const auto [n, density, seed] = GetParam();
  SparsifierOptions o;
  o.density = density;
  o.unbiased = true;
  const int64_t k = SelectedCount(n, density);
  const std::vector<float> x = MakeData(DataKind::kHeavyTailed, n, seed);
  SparsifyContext ctx;
  ctx.seed = seed;
  const Selection want = Apply(*MustMake("reference:randomk", o), x, ctx);
  auto ws = MustCreate(n, k);
  ASSERT_NE(ws, nullptr);
  DeviceArray<float> dx(x);
  const Selection got = RunSelection(*ws, k, stream_, [&](DeviceSparse out) {
    return RandomK(dx.get(), n, k, seed, out, *ws, stream_, /*unbiased=*/true);
  });
  ExpectSameSelection(got, want);
}

INSTANTIATE_TEST_SUITE_P(
    Sweep, RandomKSweep,
    ::testing::Combine(::testing::Values<int64_t>(1, 2, 1000, 8193, 65537, 1000003),
                       ::testing::Values(1e-6, 0.001, 0.01, 0.3, 1.0),
                       ::testing::Values<uint64_t>(1, 0xDEADBEEFCAFEull)),
    [](const ::testing::TestParamInfo<std::tuple<int64_t, double, uint64_t>>& info) {
      return "n" + std::to_string(std::get<0>(info.param)) + "_" +
             DensityName(std::get<1>(info.param)) + "_seed" +
             std::to_string(std::get<2>(info.param) % 1000);
    });

TEST_F(CudaTest, RandomKNeedsItsScratchSized) {
  auto ws = MustCreate(1000, 10);
  ASSERT_NE(ws, nullptr);
  DeviceArray<float> dx(1000);
  DeviceArray<int32_t> idx(20);
  DeviceArray<float> val(20);
  EXPECT_EQ(RandomK(dx.get(), 1000, 20, 1, {idx.get(), val.get(), 20}, *ws, stream_).code(),
            StatusCode::kFailedPrecondition);
}

// ---- Threshold.

struct ThresholdParam {
  int64_t n;
  double threshold;  // > 0: fixed
  double density;
  int64_t min_sample;
  DataKind kind;
};

class ThresholdSweep : public CudaParamTest<ThresholdParam> {};

TEST_P(ThresholdSweep, EqualsReference) {
  const ThresholdParam p = GetParam();
  SparsifierOptions o;
  o.threshold = p.threshold;
  o.density = p.density;
  o.min_sample_size = p.min_sample;
  const std::vector<float> x = MakeData(p.kind, p.n, 31 + static_cast<uint64_t>(p.n));
  SparsifyContext ctx;
  ctx.seed = 99;
  const Selection want = Apply(*MustMake("reference:threshold", o), x, ctx);
  auto ws = MustCreate(p.n, 0);
  ASSERT_NE(ws, nullptr);
  DeviceArray<float> dx(x);
  const Selection got = RunSelection(*ws, p.n, stream_, [&](DeviceSparse out) {
    return Threshold(dx.get(), p.n, o, ctx.seed, out, *ws, stream_);
  });
  ExpectSameSelection(got, want);
}

std::vector<ThresholdParam> ThresholdParams() {
  std::vector<ThresholdParam> params;
  for (DataKind kind : {DataKind::kNormal, DataKind::kHeavyTailed, DataKind::kTies,
                        DataKind::kSignedZeros, DataKind::kDenormals}) {
    for (int64_t n : {1, 999, 8193, 200003}) {
      params.push_back({n, 1.5, 0.001, 1000, kind});    // fixed tau (ties at 1.5 excluded)
      params.push_back({n, 0.0, 0.01, 1000, kind});     // quantile: sample or whole tensor
      params.push_back({n, 0.0, 0.001, 100000, kind});  // quantile over the whole tensor
    }
  }
  return params;
}

INSTANTIATE_TEST_SUITE_P(Sweep, ThresholdSweep, ::testing::ValuesIn(ThresholdParams()),
                         [](const ::testing::TestParamInfo<ThresholdParam>& info) {
                           const ThresholdParam& p = info.param;
                           return "n" + std::to_string(p.n) + "_" +
                                  (p.threshold > 0 ? std::string("fixed")
                                                   : DensityName(p.density) + "_sample" +
                                                         std::to_string(p.min_sample)) +
                                  "_" + kernels::testing::DataKindName(p.kind) + "_" +
                                  std::to_string(info.index);
                         });

TEST_F(CudaTest, ThresholdOverflowingTheOutputIsReported) {
  const int64_t n = 100000;
  const std::vector<float> x = MakeData(DataKind::kNormal, n, 8);
  SparsifierOptions o;
  o.threshold = 0.5;  // keeps about 62 % of the elements
  const Selection want = Apply(*MustMake("reference:threshold", o), x);
  auto ws = MustCreate(n, 0);
  ASSERT_NE(ws, nullptr);
  DeviceArray<float> dx(x);
  DeviceArray<int32_t> idx(1000);
  DeviceArray<float> val(1000);
  ASSERT_TRUE(Threshold(dx.get(), n, o, 0, {idx.get(), val.get(), 1000}, *ws, stream_).ok());
  auto k = ws->Finish(stream_);
  EXPECT_EQ(k.status().code(), StatusCode::kOutOfRange);
  // The first `capacity` pairs were written, in order.
  const std::vector<int32_t> first = idx.Download(1000);
  EXPECT_EQ(first, std::vector<int32_t>(want.indices.begin(), want.indices.begin() + 1000));
}

// ---- Gaussian-k.

class GaussianKSweep : public CudaParamTest<SizeDensityKind> {};

TEST_P(GaussianKSweep, EqualsReference) {
  const auto [n, density, kind] = GetParam();
  SparsifierOptions o;
  o.density = density;
  const std::vector<float> x = MakeData(kind, n, 77 + static_cast<uint64_t>(n));
  const Selection want = Apply(*MustMake("reference:gaussiank", o), x);
  auto ws = MustCreate(n, 0);
  ASSERT_NE(ws, nullptr);
  DeviceArray<float> dx(x);
  const Selection got = RunSelection(*ws, n, stream_, [&](DeviceSparse out) {
    return GaussianK(dx.get(), n, o, out, *ws, stream_);
  });
  ExpectSameSelection(got, want);
}

INSTANTIATE_TEST_SUITE_P(Sweep, GaussianKSweep,
                         ::testing::Combine(::testing::Values<int64_t>(1, 2, 1000, 8193, 300007),
                                            ::testing::Values(0.001, 0.01, 0.3), kKinds),
                         SizeDensityKindName);

// ---- Wangni.

class WangniSweep : public CudaParamTest<SizeDensityKind> {};

TEST_P(WangniSweep, EqualsReference) {
  const auto [n, kappa, kind] = GetParam();
  SparsifierOptions o;
  o.density = kappa;
  const std::vector<float> g = MakeData(kind, n, 51 + static_cast<uint64_t>(n));
  SparsifyContext ctx;
  ctx.seed = 7;
  const Selection want = Apply(*MustMake("reference:wangni", o), g, ctx);
  auto ws = MustCreate(n, 0);
  ASSERT_NE(ws, nullptr);
  DeviceArray<float> dg(g);
  const Selection got = RunSelection(*ws, n, stream_, [&](DeviceSparse out) {
    return Wangni(dg.get(), n, o, ctx.seed, out, *ws, stream_);
  });
  ASSERT_TRUE(got.status.ok()) << got.status.ToString();
  ASSERT_TRUE(want.status.ok());
  ASSERT_EQ(got.indices, want.indices);
  ExpectStrictlyAscending(got.indices);
  for (size_t j = 0; j < got.values.size(); ++j) {
    ASSERT_NEAR(got.values[j], want.values[j], 1e-6f * std::fabs(want.values[j])) << j;
  }
}

INSTANTIATE_TEST_SUITE_P(Sweep, WangniSweep,
                         ::testing::Combine(::testing::Values<int64_t>(1, 2, 1000, 100003),
                                            ::testing::Values(1e-4, 1e-2, 0.5, 1.0), kKinds),
                         SizeDensityKindName);

// Expected density: E nnz = kappa d; with d = 1e6 and kappa = 0.01 the count is within a few
// standard deviations (sqrt(sum p(1-p)) <= 100) of 1e4.
TEST_F(CudaTest, WangniMeanDensityIsKappa) {
  const int64_t n = 1000000;
  const std::vector<float> g = MakeData(DataKind::kHeavyTailed, n, 4);
  SparsifierOptions o;
  o.density = 0.01;
  auto ws = MustCreate(n, 0);
  ASSERT_NE(ws, nullptr);
  DeviceArray<float> dg(g);
  const Selection got = RunSelection(*ws, n, stream_, [&](DeviceSparse out) {
    return Wangni(dg.get(), n, o, 12345, out, *ws, stream_);
  });
  ASSERT_TRUE(got.status.ok()) << got.status.ToString();
  EXPECT_NEAR(static_cast<double>(got.indices.size()), 1e4, 500.0);
}

TEST_F(CudaTest, WangniVarianceBudgetIsCpuOnly) {
  auto ws = MustCreate(10, 0);
  ASSERT_NE(ws, nullptr);
  DeviceArray<float> dg(10);
  DeviceArray<int32_t> idx(10);
  DeviceArray<float> val(10);
  SparsifierOptions o;
  o.variance_budget = 0.5;
  EXPECT_EQ(Wangni(dg.get(), 10, o, 1, {idx.get(), val.get(), 10}, *ws, stream_).code(),
            StatusCode::kInvalidArgument);
}

TEST_F(CudaTest, NonFiniteInputIsRejectedByEveryCompressor) {
  const int64_t n = 30000;
  std::vector<float> x = MakeData(DataKind::kNormal, n, 1);
  x[20001] = std::numeric_limits<float>::quiet_NaN();
  DeviceArray<float> dx(x);
  auto ws = MustCreate(n, 1000);
  ASSERT_NE(ws, nullptr);
  SparsifierOptions o;
  o.density = 0.01;
  SparsifierOptions fixed = o;
  fixed.threshold = 1.0;
  const std::vector<std::pair<const char*, std::function<Status(DeviceSparse)>>> calls = {
      {"randomk",
       [&](DeviceSparse out) { return RandomK(dx.get(), n, 300, 1, out, *ws, stream_); }},
      {"threshold",
       [&](DeviceSparse out) { return Threshold(dx.get(), n, o, 1, out, *ws, stream_); }},
      {"threshold fixed",
       [&](DeviceSparse out) { return Threshold(dx.get(), n, fixed, 1, out, *ws, stream_); }},
      {"gaussiank", [&](DeviceSparse out) { return GaussianK(dx.get(), n, o, out, *ws, stream_); }},
      {"wangni", [&](DeviceSparse out) { return Wangni(dx.get(), n, o, 1, out, *ws, stream_); }},
  };
  for (const auto& [name, call] : calls) {
    const Selection got = RunSelection(*ws, n, stream_, call);
    EXPECT_EQ(got.status.code(), StatusCode::kInvalidArgument) << name;
    EXPECT_NE(got.status.message().find("element 20001 is NaN"), std::string::npos)
        << name << ": " << got.status.ToString();
  }
}

}  // namespace
}  // namespace sparsync::kernels::cuda
