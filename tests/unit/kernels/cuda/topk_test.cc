// CUDA top-k, top-k with error feedback and DGC against the reference oracles: exact indices and
// bit-identical values (the reference fixes the tie-break), across sizes around the 8192-element
// tile, k from 1 to numel, every data kind, and both paths of the radix select.

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <tuple>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/dgc_state.h"
#include "tests/unit/kernels/cuda/cuda_test_util.h"

namespace sparsync::kernels::cuda {
namespace {

using kernels::testing::Apply;
using kernels::testing::DataKind;
using kernels::testing::ExpectSameSelection;
using kernels::testing::MakeData;
using kernels::testing::MustMake;
using kernels::testing::Selection;
using testing::CudaParamTest;
using testing::CudaTest;
using testing::DeviceArray;
using testing::MustCreate;
using testing::RunSelection;

enum class KChoice { kOne, kPerMille, kPercent, kHalf, kAll };

int64_t ChooseK(KChoice choice, int64_t n) {
  switch (choice) {
    case KChoice::kOne:
      return 1;
    case KChoice::kPerMille:
      return SelectedCount(n, 0.001);
    case KChoice::kPercent:
      return SelectedCount(n, 0.01);
    case KChoice::kHalf:
      return std::max<int64_t>(1, n / 2);
    case KChoice::kAll:
      return n;
  }
  return 1;
}

const char* KChoiceName(KChoice choice) {
  switch (choice) {
    case KChoice::kOne:
      return "k1";
    case KChoice::kPerMille:
      return "kpermille";
    case KChoice::kPercent:
      return "kpercent";
    case KChoice::kHalf:
      return "khalf";
    case KChoice::kAll:
      return "kall";
  }
  return "?";
}

Selection Reference(const std::vector<float>& x, int64_t k) {
  SparsifierOptions o;
  o.k = k;
  return Apply(*MustMake("reference:topk", o), x);
}

using SweepParam = std::tuple<int64_t, KChoice, DataKind>;

class TopKSweep : public CudaParamTest<SweepParam> {};

TEST_P(TopKSweep, EqualsReference) {
  const auto [n, choice, kind] = GetParam();
  const int64_t k = ChooseK(choice, n);
  const std::vector<float> x = MakeData(kind, n, 11 + static_cast<uint64_t>(n));
  auto ws = MustCreate(n, k);
  ASSERT_NE(ws, nullptr);
  DeviceArray<float> dx(x);
  const Selection got = RunSelection(
      *ws, k, stream_, [&](DeviceSparse out) { return TopK(dx.get(), n, k, out, *ws, stream_); });
  ExpectSameSelection(got, Reference(x, k));
}

INSTANTIATE_TEST_SUITE_P(
    Sweep, TopKSweep,
    ::testing::Combine(::testing::Values<int64_t>(1, 7, 1000, 8191, 8192, 8193, 100003, 1048653),
                       ::testing::Values(KChoice::kOne, KChoice::kPerMille, KChoice::kPercent,
                                         KChoice::kHalf, KChoice::kAll),
                       ::testing::Values(DataKind::kNormal, DataKind::kHeavyTailed, DataKind::kTies,
                                         DataKind::kSignedZeros, DataKind::kDenormals)),
    [](const ::testing::TestParamInfo<SweepParam>& info) {
      return "n" + std::to_string(std::get<0>(info.param)) + "_" +
             KChoiceName(std::get<1>(info.param)) + "_" +
             kernels::testing::DataKindName(std::get<2>(info.param));
    });

// The candidate fast path and the dense fallback both run, and both match the reference.
TEST_F(CudaTest, TopKTakesBothRadixPaths) {
  const int64_t n = 300007;
  const int64_t k = 300;
  auto ws = MustCreate(n, k);
  ASSERT_NE(ws, nullptr);
  for (DataKind kind : {DataKind::kNormal, DataKind::kTies}) {
    const std::vector<float> x = MakeData(kind, n, 5);
    DeviceArray<float> dx(x);
    const Selection got = RunSelection(
        *ws, k, stream_, [&](DeviceSparse out) { return TopK(dx.get(), n, k, out, *ws, stream_); });
    ExpectSameSelection(got, Reference(x, k));
    // Normal data: T's level-1 bin is small. Ties: a seventh of the data equals T.
    EXPECT_EQ(ws->last_used_candidates(), kind == DataKind::kNormal)
        << kernels::testing::DataKindName(kind);
  }
}

TEST_F(CudaTest, TopKHandComputedTieBreak) {
  const std::vector<float> x = {1.0f, -3.0f, 3.0f, 0.0f, 2.0f, -0.0f, 3.0f};
  auto ws = MustCreate(7, 7);
  ASSERT_NE(ws, nullptr);
  DeviceArray<float> dx(x);
  const Selection got = RunSelection(
      *ws, 2, stream_, [&](DeviceSparse out) { return TopK(dx.get(), 7, 2, out, *ws, stream_); });
  ASSERT_TRUE(got.status.ok()) << got.status.ToString();
  EXPECT_EQ(got.indices, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(got.values, (std::vector<float>{-3.0f, 3.0f}));
}

TEST_F(CudaTest, TopKRejectsNonFiniteNamingTheFirst) {
  const int64_t n = 50000;
  std::vector<float> x = MakeData(DataKind::kNormal, n, 3);
  x[40000] = std::numeric_limits<float>::infinity();
  x[12345] = std::numeric_limits<float>::quiet_NaN();
  auto ws = MustCreate(n, 100);
  ASSERT_NE(ws, nullptr);
  DeviceArray<float> dx(x);
  const Selection got = RunSelection(*ws, 100, stream_, [&](DeviceSparse out) {
    return TopK(dx.get(), n, 100, out, *ws, stream_);
  });
  EXPECT_EQ(got.status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(got.status.message().find("element 12345 is NaN"), std::string::npos)
      << got.status.ToString();
  // The workspace is reusable after the error.
  x[12345] = 0.0f;
  x[40000] = 0.0f;
  dx.Upload(x);
  const Selection again = RunSelection(*ws, 100, stream_, [&](DeviceSparse out) {
    return TopK(dx.get(), n, 100, out, *ws, stream_);
  });
  ExpectSameSelection(again, Reference(x, 100));
}

TEST_F(CudaTest, TopKChecksArgumentsBeforeLaunching) {
  auto ws = MustCreate(1000, 10);
  ASSERT_NE(ws, nullptr);
  DeviceArray<float> dx(1000);
  DeviceArray<int32_t> idx(10);
  DeviceArray<float> val(10);
  EXPECT_EQ(TopK(dx.get(), 1000, 11, {idx.get(), val.get(), 10}, *ws, stream_).code(),
            StatusCode::kOutOfRange);
  EXPECT_EQ(TopK(dx.get(), 1001, 1, {idx.get(), val.get(), 10}, *ws, stream_).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(TopK(dx.get(), 1000, 0, {idx.get(), val.get(), 10}, *ws, stream_).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(TopK(nullptr, 1000, 1, {idx.get(), val.get(), 10}, *ws, stream_).code(),
            StatusCode::kInvalidArgument);
  // numel = 0 selects nothing.
  ASSERT_TRUE(TopK(dx.get(), 0, 0, {idx.get(), val.get(), 10}, *ws, stream_).ok());
  auto k = ws->Finish(stream_);
  ASSERT_TRUE(k.ok()) << k.status().ToString();
  EXPECT_EQ(*k, 0);
}

class TopKResidualSweep : public CudaParamTest<std::tuple<int64_t, KChoice>> {};

// Three steps of error feedback: every step's selection and residual equal a host replay with
// the reference (a = r + g in float32; r = a with the sent entries zeroed).
TEST_P(TopKResidualSweep, ThreeStepsEqualHostReplay) {
  const auto [n, choice] = GetParam();
  const int64_t k = ChooseK(choice, n);
  auto ws = MustCreate(n, k);
  ASSERT_NE(ws, nullptr);
  std::vector<float> residual(static_cast<size_t>(n), 0.0f);
  DeviceArray<float> dr(residual);
  for (int step = 0; step < 3; ++step) {
    const std::vector<float> g =
        MakeData(step == 1 ? DataKind::kHeavyTailed : DataKind::kNormal, n, 100 + step);
    DeviceArray<float> dg(g);
    const Selection got = RunSelection(*ws, k, stream_, [&](DeviceSparse out) {
      return TopKWithResidual(dg.get(), dr.get(), n, k, out, *ws, stream_);
    });
    std::vector<float> a(static_cast<size_t>(n));
    for (size_t i = 0; i < a.size(); ++i) a[i] = residual[i] + g[i];
    const Selection want = Reference(a, k);
    ExpectSameSelection(got, want);
    residual = a;
    for (int32_t i : want.indices) residual[static_cast<size_t>(i)] = 0.0f;
    const std::vector<float> device_residual = dr.Download();
    for (size_t i = 0; i < residual.size(); ++i) {
      ASSERT_TRUE(kernels::testing::SameBits(device_residual[i], residual[i]))
          << "step " << step << " element " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sweep, TopKResidualSweep,
                         ::testing::Combine(::testing::Values<int64_t>(1, 8193, 250001),
                                            ::testing::Values(KChoice::kOne, KChoice::kPerMille,
                                                              KChoice::kPercent, KChoice::kAll)),
                         [](const ::testing::TestParamInfo<std::tuple<int64_t, KChoice>>& info) {
                           return "n" + std::to_string(std::get<0>(info.param)) + "_" +
                                  KChoiceName(std::get<1>(info.param));
                         });

struct DgcParam {
  int64_t n;
  double density;
  double clip;
};

class DgcSweep : public CudaParamTest<DgcParam> {};

// Four epochs of DGC (density warm-up on): selections and the momentum / accumulation state
// equal the reference's. Without clipping the arithmetic is identical, so values and state are
// compared bit for bit; with clipping the norm is summed in another order (last-bit differences).
TEST_P(DgcSweep, EqualsReferenceOverSteps) {
  const DgcParam p = GetParam();
  SparsifierOptions o;
  o.density = p.density;
  o.clip_norm = p.clip;
  o.momentum = 0.9;
  auto reference = MustMake("reference:dgc", o);
  DgcState host_state;
  host_state.Reset(p.n);
  const int64_t max_k = SelectedCount(p.n, 0.25);
  auto ws = MustCreate(p.n, max_k);
  ASSERT_NE(ws, nullptr);
  DeviceArray<float> du(host_state.momentum);
  DeviceArray<float> dv(host_state.accumulation);
  for (int64_t epoch = 0; epoch < 5; ++epoch) {
    const std::vector<float> g = MakeData(DataKind::kNormal, p.n, 700 + epoch);
    DeviceArray<float> dg(g);
    SparsifyContext ctx;
    ctx.epoch = epoch;
    ctx.dgc_state = &host_state;
    const Selection want = Apply(*reference, g, ctx);
    const Selection got = RunSelection(*ws, max_k, stream_, [&](DeviceSparse out) {
      return Dgc(dg.get(), p.n, o, epoch, {du.get(), dv.get()}, out, *ws, stream_);
    });
    ASSERT_TRUE(got.status.ok()) << got.status.ToString();
    if (p.clip == 0) {
      ExpectSameSelection(got, want);
    } else {
      ASSERT_EQ(got.indices, want.indices) << "epoch " << epoch;
      for (size_t j = 0; j < got.values.size(); ++j) {
        ASSERT_NEAR(got.values[j], want.values[j], 1e-5f * std::fabs(want.values[j]) + 1e-30f);
      }
    }
    const std::vector<float> u = du.Download();
    const std::vector<float> v = dv.Download();
    for (size_t i = 0; i < u.size(); ++i) {
      if (p.clip == 0) {
        ASSERT_TRUE(kernels::testing::SameBits(u[i], host_state.momentum[i])) << i;
        ASSERT_TRUE(kernels::testing::SameBits(v[i], host_state.accumulation[i])) << i;
      } else {
        ASSERT_NEAR(u[i], host_state.momentum[i],
                    1e-5f * std::fabs(host_state.momentum[i]) + 1e-30f);
        ASSERT_NEAR(v[i], host_state.accumulation[i],
                    1e-5f * std::fabs(host_state.accumulation[i]) + 1e-30f);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sweep, DgcSweep,
                         ::testing::Values(DgcParam{1, 0.001, 0}, DgcParam{8193, 0.001, 0},
                                           DgcParam{100003, 0.001, 0}, DgcParam{100003, 0.01, 0},
                                           DgcParam{100003, 0.001, 5.0}),
                         [](const ::testing::TestParamInfo<DgcParam>& info) {
                           return "n" + std::to_string(info.param.n) + "_d" +
                                  std::to_string(static_cast<int>(info.param.density * 1e4)) +
                                  "e4" + (info.param.clip > 0 ? "_clip" : "");
                         });

TEST_F(CudaTest, DgcLeavesStateUntouchedOnNonFiniteGradient) {
  const int64_t n = 20000;
  SparsifierOptions o;
  o.density = 0.01;
  std::vector<float> u0 = MakeData(DataKind::kNormal, n, 1);
  std::vector<float> v0 = MakeData(DataKind::kNormal, n, 2);
  DeviceArray<float> du(u0), dv(v0);
  std::vector<float> g = MakeData(DataKind::kNormal, n, 3);
  g[777] = -std::numeric_limits<float>::infinity();
  DeviceArray<float> dg(g);
  auto ws = MustCreate(n, n / 4);
  ASSERT_NE(ws, nullptr);
  const Selection got = RunSelection(*ws, n / 4, stream_, [&](DeviceSparse out) {
    return Dgc(dg.get(), n, o, 0, {du.get(), dv.get()}, out, *ws, stream_);
  });
  EXPECT_EQ(got.status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(got.status.message().find("element 777 is -Inf"), std::string::npos);
  EXPECT_EQ(du.Download(), u0);
  EXPECT_EQ(dv.Download(), v0);
}

}  // namespace
}  // namespace sparsync::kernels::cuda
