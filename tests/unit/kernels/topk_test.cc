// Exact top-k: the CPU kernel against the sorting reference, ties, special values, fallbacks.

#include <gtest/gtest.h>

#include <algorithm>
#include <tuple>

#include "kernels/cpu/topk_select.h"
#include "kernels/pieces.h"
#include "kernels/reference/reference.h"
#include "tests/unit/kernels/test_util.h"

namespace sparsync::kernels {
namespace {

using testing::DataKind;
using testing::MakeData;
using testing::Apply;

TEST(TopKTest, HandComputedExampleWithTieBreak) {
  // |x| = 1 3 3 0 2: the two 3s tie; the smaller index wins.
  const std::vector<float> x = {1.0f, -3.0f, 3.0f, 0.0f, 2.0f};
  SparsifierOptions o;
  o.k = 1;
  auto s = testing::MustMake("topk", o);
  auto r = Apply(*s, x);
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.indices, (std::vector<int32_t>{1}));
  EXPECT_EQ(r.values, (std::vector<float>{-3.0f}));
  o.k = 3;
  s = testing::MustMake("topk", o);
  r = Apply(*s, x);
  EXPECT_EQ(r.indices, (std::vector<int32_t>{1, 2, 4}));
  EXPECT_EQ(r.values, (std::vector<float>{-3.0f, 3.0f, 2.0f}));
}

TEST(TopKTest, SignedZerosTieByIndexAndKeepTheirSign) {
  const std::vector<float> x = {-0.0f, 0.0f, -0.0f, 5.0f};
  SparsifierOptions o;
  o.k = 3;
  auto r = Apply(*testing::MustMake("topk", o), x);
  ASSERT_TRUE(r.status.ok());
  EXPECT_EQ(r.indices, (std::vector<int32_t>{0, 1, 3}));
  EXPECT_TRUE(std::signbit(r.values[0]));
  EXPECT_FALSE(std::signbit(r.values[1]));
}

TEST(TopKTest, KAtLeastNSelectsEverything) {
  const std::vector<float> x = MakeData(DataKind::kNormal, 37, 1);
  SparsifierOptions o;
  o.k = 100;
  auto cpu = testing::MustMake("topk", o);
  EXPECT_EQ(cpu->MaxSelected(37), 37);
  auto r = Apply(*cpu, x);
  ASSERT_TRUE(r.status.ok());
  ASSERT_EQ(r.indices.size(), 37u);
  for (int32_t i = 0; i < 37; ++i) EXPECT_EQ(r.indices[i], i);
  testing::ExpectSameSelection(r, Apply(*testing::MustMake("reference:topk", o), x));
}

using SweepParam = std::tuple<int64_t, double, DataKind>;
class TopKSweep : public ::testing::TestWithParam<SweepParam> {};

TEST_P(TopKSweep, CpuEqualsReference) {
  const auto [n, density, kind] = GetParam();
  const std::vector<float> x = MakeData(kind, n, 1000 + static_cast<uint64_t>(n));
  SparsifierOptions o;
  o.density = density;
  const auto expected = Apply(*testing::MustMake("reference:topk", o), x);
  const auto actual = Apply(*testing::MustMake("topk", o), x);
  testing::ExpectSameSelection(actual, expected);
  EXPECT_EQ(static_cast<int64_t>(actual.indices.size()), SelectedCount(n, density));
  testing::ExpectStrictlyAscending(actual.indices);
}

INSTANTIATE_TEST_SUITE_P(
    Small, TopKSweep,
    ::testing::Combine(::testing::Values<int64_t>(0, 1, 2, 3, 17, 1000, 5000, 100000),
                       ::testing::Values(1e-4, 1e-3, 1e-2, 0.1, 0.5, 1.0),
                       ::testing::Values(DataKind::kNormal, DataKind::kHeavyTailed,
                                         DataKind::kTies, DataKind::kSignedZeros,
                                         DataKind::kDenormals)));
INSTANTIATE_TEST_SUITE_P(
    Million, TopKSweep,
    ::testing::Combine(::testing::Values<int64_t>(1000000), ::testing::Values(1e-4, 1e-2, 0.3),
                       ::testing::Values(DataKind::kNormal, DataKind::kTies,
                                         DataKind::kSignedZeros)));

TEST(TopKSelectorTest, RadixFallbackEqualsReference) {
  for (DataKind kind : {DataKind::kNormal, DataKind::kTies, DataKind::kDenormals,
                        DataKind::kSignedZeros}) {
    const std::vector<float> x = MakeData(kind, 200000, 7);
    for (int64_t k : {1, 2, 199, 5000, 199999}) {
      cpu::TopKSelector selector;
      selector.Reserve(200000, k);
      selector.set_force_fallback(true);
      std::vector<int32_t> idx(static_cast<size_t>(k));
      std::vector<float> val(static_cast<size_t>(k));
      ASSERT_TRUE(selector.Select(x.data(), 200000, k, idx.data(), val.data()).ok());
      EXPECT_EQ(selector.fallback_count(), 1);
      EXPECT_EQ(idx, reference::TopKIndices(x, k))
          << testing::DataKindName(kind) << " k=" << k;
    }
  }
}

TEST(TopKSelectorTest, AllZeroTensorFallsBackAndTakesTheFirstIndices) {
  // Every magnitude ties: the sample cannot separate anything, so the fast path must give up.
  const std::vector<float> x(1 << 20, 0.0f);
  cpu::TopKSelector selector;
  selector.Reserve(1 << 20, 100);
  std::vector<int32_t> idx(100);
  std::vector<float> val(100);
  ASSERT_TRUE(selector.Select(x.data(), 1 << 20, 100, idx.data(), val.data()).ok());
  EXPECT_EQ(selector.fallback_count(), 1);
  for (int32_t j = 0; j < 100; ++j) EXPECT_EQ(idx[j], j);
}

TEST(TopKSelectorTest, FastPathTakenOnOrdinaryData) {
  const std::vector<float> x = MakeData(DataKind::kNormal, 1 << 20, 3);
  cpu::TopKSelector selector;
  selector.Reserve(1 << 20, 1000);
  std::vector<int32_t> idx(1000);
  std::vector<float> val(1000);
  for (int rep = 0; rep < 3; ++rep) {
    ASSERT_TRUE(selector.Select(x.data(), 1 << 20, 1000, idx.data(), val.data()).ok());
  }
  EXPECT_EQ(selector.fallback_count(), 0);
}

// `x` cut at `cuts` (ascending offsets): the pieces of a merge group stored tensor by tensor.
std::vector<std::span<const float>> Cut(const std::vector<float>& x, std::vector<size_t> cuts) {
  cuts.push_back(x.size());
  std::vector<std::span<const float>> pieces;
  size_t at = 0;
  for (size_t c : cuts) {
    pieces.emplace_back(x.data() + at, c - at);
    at = c;
  }
  return pieces;
}

testing::Selection ApplyPieces(Sparsifier& s, std::span<const std::span<const float>> pieces) {
  const int64_t n = TotalElements(pieces);
  testing::Selection result;
  result.status = s.Prepare(n, DType::kFloat32);
  const int64_t cap = s.MaxSelected(n);
  result.indices.assign(static_cast<size_t>(cap), -1);
  result.values.assign(static_cast<size_t>(cap), 0.0f);
  SparseView out{result.indices.data(), result.values.data(), cap, -1};
  if (result.status.ok()) result.status = s.SparsifyPieces(pieces, &out, {});
  result.indices.resize(static_cast<size_t>(std::max<int64_t>(out.k, 0)));
  result.values.resize(static_cast<size_t>(std::max<int64_t>(out.k, 0)));
  return result;
}

TEST(TopKPiecesTest, PiecesSelectWhatTheJoinedBufferSelects) {
  for (DataKind kind : {DataKind::kNormal, DataKind::kHeavyTailed, DataKind::kTies,
                        DataKind::kSignedZeros}) {
    const std::vector<float> x = MakeData(kind, 300000, 11);
    // Empty pieces, one-element pieces and a piece holding most of the group.
    const auto pieces = Cut(x, {0, 1, 1, 2, 4097, 150000, 299999});
    for (double density : {1e-4, 1e-2, 1.0}) {
      SparsifierOptions o;
      o.density = density;
      auto s = testing::MustMake("topk", o);
      ASSERT_TRUE(s->SparsifiesPieces());
      const auto joined = Apply(*s, x);
      testing::ExpectSameSelection(ApplyPieces(*s, pieces), joined);
      testing::ExpectSameSelection(ApplyPieces(*testing::MustMake("topk", o), pieces), joined);
    }
  }
}

TEST(TopKPiecesTest, RadixFallbackOverPiecesEqualsReference) {
  const std::vector<float> x = MakeData(DataKind::kTies, 200000, 7);
  const auto pieces = Cut(x, {3, 70000, 70000, 123457});
  for (int64_t k : {1, 199, 5000}) {
    cpu::TopKSelector selector;
    selector.Reserve(200000, k);
    selector.set_force_fallback(true);
    std::vector<int32_t> idx(static_cast<size_t>(k));
    std::vector<float> val(static_cast<size_t>(k));
    ASSERT_TRUE(selector.SelectPieces(pieces, k, idx.data(), val.data()).ok());
    EXPECT_EQ(selector.fallback_count(), 1);
    EXPECT_EQ(idx, reference::TopKIndices(x, k)) << "k=" << k;
    for (int64_t j = 0; j < k; ++j) EXPECT_TRUE(testing::SameBits(val[j], x[idx[j]]));
  }
}

TEST(TopKPiecesTest, ANonFiniteElementIsNamedByItsIndexInTheWhole) {
  std::vector<float> x = MakeData(DataKind::kNormal, 100000, 5);
  x[60001] = std::numeric_limits<float>::infinity();
  SparsifierOptions o;
  o.density = 0.01;
  const auto r = ApplyPieces(*testing::MustMake("topk", o), Cut(x, {1000, 60000}));
  EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status.message().find("60001"), std::string::npos) << r.status.ToString();
  EXPECT_TRUE(r.indices.empty());
}

TEST(TopKPiecesTest, SparsifiersThatNeedOneBufferRefusePieces) {
  const std::vector<float> x = MakeData(DataKind::kNormal, 1000, 5);
  for (const char* name : {"randomk", "gaussiank", "wangni", "reference:topk"}) {
    auto s = testing::MustMake(name, {});
    EXPECT_FALSE(s->SparsifiesPieces()) << name;
    EXPECT_EQ(ApplyPieces(*s, Cut(x, {500})).status.code(), StatusCode::kFailedPrecondition)
        << name;
  }
}

TEST(TopKTest, AdversarialOutliersBeyondTheSample) {
  // A few huge values the sample will almost surely miss, plus many ties at the k-th magnitude.
  std::vector<float> x(300000, 1.0f);
  for (int i = 0; i < 50; ++i) x[static_cast<size_t>(i * 5999)] = 1e30f * (i % 2 ? -1 : 1);
  for (int i = 0; i < 300000; i += 3) x[static_cast<size_t>(i)] = 0.5f;
  for (int64_t k : {10, 50, 51, 60, 1000, 100000, 250000}) {
    SparsifierOptions o;
    o.k = k;
    testing::ExpectSameSelection(Apply(*testing::MustMake("topk", o), x),
                                 Apply(*testing::MustMake("reference:topk", o), x));
  }
}

TEST(TopKTest, NonFiniteInputIsAnErrorNamingTheElement) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    for (int64_t pos : {0, 4321, 99999}) {
      std::vector<float> x = MakeData(DataKind::kNormal, 100000, 5);
      x[static_cast<size_t>(pos)] = bad;
      for (const char* name : {"topk", "reference:topk"}) {
        SparsifierOptions o;
        o.density = 0.01;
        const auto r = Apply(*testing::MustMake(name, o), x);
        ASSERT_EQ(r.status.code(), StatusCode::kInvalidArgument) << name;
        EXPECT_NE(r.status.message().find("element " + std::to_string(pos)), std::string::npos)
            << r.status.message();
        EXPECT_NE(r.status.message().find(std::isnan(bad) ? "NaN" : "Inf"), std::string::npos);
        EXPECT_TRUE(r.indices.empty());
      }
    }
  }
}

TEST(TopKTest, HalfAndBFloat16AndDoubleInputMatchConvertedFloat) {
  const std::vector<float> base = MakeData(DataKind::kNormal, 50000, 11);
  std::vector<uint16_t> half(base.size()), bf(base.size());
  std::vector<double> dbl(base.size());
  std::vector<float> half_f(base.size()), bf_f(base.size()), dbl_f(base.size());
  for (size_t i = 0; i < base.size(); ++i) {
    half[i] = FloatToHalf(base[i]);
    half_f[i] = HalfToFloat(half[i]);
    bf[i] = FloatToBFloat16(base[i]);
    bf_f[i] = BFloat16ToFloat(bf[i]);
    dbl[i] = static_cast<double>(base[i]) * (1.0 + 1e-12);
    dbl_f[i] = static_cast<float>(dbl[i]);
  }
  SparsifierOptions o;
  o.density = 0.01;
  auto cpu = testing::MustMake("topk", o);
  auto ref = testing::MustMake("reference:topk", o);
  const int64_t n = static_cast<int64_t>(base.size());
  testing::ExpectSameSelection(testing::ApplyRaw(*cpu, half.data(), n, DType::kFloat16),
                               Apply(*ref, half_f));
  testing::ExpectSameSelection(testing::ApplyRaw(*cpu, bf.data(), n, DType::kBFloat16),
                               Apply(*ref, bf_f));
  testing::ExpectSameSelection(testing::ApplyRaw(*cpu, dbl.data(), n, DType::kFloat64),
                               Apply(*ref, dbl_f));
}

}  // namespace
}  // namespace sparsync::kernels
