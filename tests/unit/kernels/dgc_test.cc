// DGC (Lin et al., ICLR 2018): momentum correction, masking, warm-up, state handling.

#include <gtest/gtest.h>

#include <cmath>

#include "kernels/dgc_state.h"
#include "tests/unit/kernels/test_util.h"

namespace sparsync::kernels {
namespace {

using testing::DataKind;
using testing::MakeData;
using testing::Apply;

SparsifyContext WithState(DgcState* state, int64_t epoch = 10) {
  SparsifyContext ctx;
  ctx.dgc_state = state;
  ctx.epoch = epoch;
  return ctx;
}

TEST(DgcTest, HandComputedTwoSteps) {
  SparsifierOptions o;
  o.k = 1;
  o.momentum = 0.5;
  for (const char* name : {"dgc", "reference:dgc"}) {
    auto s = testing::MustMake(name, o);
    DgcState st;
    st.Reset(4);
    // u = {1, 2, 0, 0}, v = u; send index 1 (v = 2); mask it.
    auto r = Apply(*s, {1, 2, 0, 0}, WithState(&st));
    ASSERT_TRUE(r.status.ok());
    EXPECT_EQ(r.indices, (std::vector<int32_t>{1}));
    EXPECT_EQ(r.values, (std::vector<float>{2}));
    EXPECT_EQ(st.momentum, (std::vector<float>{1, 0, 0, 0}));
    EXPECT_EQ(st.accumulation, (std::vector<float>{1, 0, 0, 0}));
    // u = {0.5 + 1, 0, 0, 3}, v = {1 + 1.5, 0, 0, 3}; send index 3.
    r = Apply(*s, {1, 0, 0, 3}, WithState(&st));
    EXPECT_EQ(r.indices, (std::vector<int32_t>{3}));
    EXPECT_EQ(r.values, (std::vector<float>{3}));
    EXPECT_EQ(st.momentum, (std::vector<float>{1.5, 0, 0, 0}));
    EXPECT_EQ(st.accumulation, (std::vector<float>{2.5, 0, 0, 0}));
  }
}

TEST(DgcTest, WarmupScheduleBySteps) {
  const double expected[] = {0.25, 0.25, 0.25, 0.0625, 0.0625, 0.0625, 0.0156, 0.0156,
                             0.0156, 0.004, 0.004, 0.004, 0.001, 0.001};
  for (int64_t step = 0; step < 14; ++step) {
    EXPECT_EQ(WarmupDensity(0.001, step, 12), expected[step]) << "step " << step;
  }
  EXPECT_EQ(WarmupDensity(0.001, 0, 0), 0.001);     // off
  EXPECT_EQ(WarmupDensity(0.001, 2, 3), 0.0156);    // 4 * 2 / 3 = quarter 2
  EXPECT_EQ(WarmupDensity(0.05, 1, 4), 0.0625);
  EXPECT_EQ(WarmupDensity(0.05, 2, 4), 0.05);       // never below the target
  EXPECT_EQ(WarmupDensity(0.5, 0, 4), 0.5);
}

TEST(DgcTest, WarmupScheduleByEpoch) {
  EXPECT_EQ(DgcDensityForEpoch(0.001, 0, true), 0.25);
  EXPECT_EQ(DgcDensityForEpoch(0.001, 1, true), 0.0625);
  EXPECT_EQ(DgcDensityForEpoch(0.001, 2, true), 0.0156);
  EXPECT_EQ(DgcDensityForEpoch(0.001, 3, true), 0.004);
  EXPECT_EQ(DgcDensityForEpoch(0.001, 4, true), 0.001);
  EXPECT_EQ(DgcDensityForEpoch(0.01, 3, true), 0.01);  // never below the target
  EXPECT_EQ(DgcDensityForEpoch(0.001, 0, false), 0.001);
  SparsifierOptions o;
  o.density = 0.001;
  auto s = testing::MustMake("dgc", o);
  EXPECT_EQ(s->MaxSelected(100000), 25000);
  const int64_t expected[] = {25000, 6250, 1560, 400, 100, 100};
  DgcState st;
  st.Reset(100000);
  for (int64_t epoch = 0; epoch < 6; ++epoch) {
    const auto r = Apply(*s, MakeData(DataKind::kNormal, 100000, 60 + epoch), WithState(&st, epoch));
    EXPECT_EQ(static_cast<int64_t>(r.indices.size()), expected[epoch]) << "epoch " << epoch;
  }
}

void ExpectDgcMatch(const SparsifierOptions& o, int64_t n, bool exact) {
  auto cpu = testing::MustMake("dgc", o);
  auto ref = testing::MustMake("reference:dgc", o);
  DgcState sc, sr;
  sc.Reset(n);
  sr.Reset(n);
  for (int64_t step = 0; step < 8; ++step) {
    const std::vector<float> g = MakeData(DataKind::kNormal, n, 70 + static_cast<uint64_t>(step));
    const auto a = Apply(*cpu, g, WithState(&sc, step / 2));
    const auto b = Apply(*ref, g, WithState(&sr, step / 2));
    if (exact) {
      testing::ExpectSameSelection(a, b);
      ASSERT_EQ(sc.momentum, sr.momentum);
      ASSERT_EQ(sc.accumulation, sr.accumulation);
    } else {
      ASSERT_EQ(a.indices, b.indices);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_NEAR(sc.accumulation[i], sr.accumulation[i],
                    1e-5f * (1 + std::fabs(sr.accumulation[i])));
      }
    }
    // Momentum factor masking: everything sent is cleared.
    for (int32_t i : a.indices) {
      ASSERT_EQ(sc.momentum[i], 0.0f);
      ASSERT_EQ(sc.accumulation[i], 0.0f);
    }
  }
}

TEST(DgcTest, CpuEqualsReferenceOverStepsAndWarmup) {
  for (int64_t n : {1, 2, 1000, 100000}) {
    SparsifierOptions o;
    o.density = 0.001;
    ExpectDgcMatch(o, n, /*exact=*/true);
  }
}

TEST(DgcTest, CpuEqualsReferenceWithClipping) {
  SparsifierOptions o;
  o.density = 0.01;
  o.clip_norm = 10.0;  // the N(0,1) gradients of 100000 elements have norm ~316
  ExpectDgcMatch(o, 100000, /*exact=*/false);
}

TEST(DgcTest, ClippingBoundsTheFirstStep) {
  SparsifierOptions o;
  o.density = 1.0;
  o.warmup = false;
  o.clip_norm = 1.0;
  auto s = testing::MustMake("dgc", o);
  DgcState st;
  st.Reset(1000);
  const auto r = Apply(*s, MakeData(DataKind::kNormal, 1000, 1), WithState(&st));
  double sq = 0;
  for (float v : r.values) sq += static_cast<double>(v) * v;
  EXPECT_NEAR(std::sqrt(sq), 1.0, 1e-5);
}

TEST(DgcTest, StateErrorsAndNonFiniteLeaveStateUntouched) {
  SparsifierOptions o;
  o.density = 0.1;
  for (const char* name : {"dgc", "reference:dgc"}) {
    auto s = testing::MustMake(name, o);
    const std::vector<float> g = MakeData(DataKind::kNormal, 100, 1);
    EXPECT_EQ(Apply(*s, g, SparsifyContext{}).status.code(), StatusCode::kFailedPrecondition);
    DgcState st;
    st.Reset(99);
    const auto wrong = Apply(*s, g, WithState(&st));
    EXPECT_EQ(wrong.status.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(wrong.status.message().find("99"), std::string::npos);
    st.Reset(100);
    ASSERT_TRUE(Apply(*s, g, WithState(&st)).status.ok());
    const DgcState before = st;
    std::vector<float> bad = g;
    bad[57] = std::numeric_limits<float>::quiet_NaN();
    const auto r = Apply(*s, bad, WithState(&st));
    EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status.message().find("element 57 is NaN"), std::string::npos);
    EXPECT_EQ(st.momentum, before.momentum);
    EXPECT_EQ(st.accumulation, before.accumulation);
  }
}

}  // namespace
}  // namespace sparsync::kernels
