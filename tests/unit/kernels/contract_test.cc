// The Sparsifier contract, checked for every registered implementation.

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "kernels/dgc_state.h"
#include "tests/unit/kernels/test_util.h"

namespace sparsync::kernels {
namespace {

using testing::DataKind;
using testing::MakeData;

class ContractTest : public ::testing::TestWithParam<std::string> {
 protected:
  SparsifyContext Context(int64_t n) {
    state_.Reset(n);
    SparsifyContext ctx;
    ctx.seed = 5;
    ctx.shared_seed = 6;
    ctx.dgc_state = &state_;
    return ctx;
  }
  bool SendsInputValues() const {
    return GetParam().find("wangni") == std::string::npos &&
           GetParam().find("dgc") == std::string::npos;
  }
  DgcState state_;
};

TEST_P(ContractTest, AscendingIndicesWithinCapacity) {
  SparsifierOptions o;
  o.density = 0.01;
  auto s = testing::MustMake(GetParam(), o);
  for (int64_t n : {0, 1, 2, 1000, 12345}) {
    const std::vector<float> x = MakeData(DataKind::kHeavyTailed, n, 3);
    const auto r = testing::Apply(*s, x, Context(n));
    ASSERT_TRUE(r.status.ok()) << r.status.ToString();
    EXPECT_LE(static_cast<int64_t>(r.indices.size()), s->MaxSelected(n));
    testing::ExpectStrictlyAscending(r.indices);
    for (size_t j = 0; j < r.indices.size(); ++j) {
      ASSERT_GE(r.indices[j], 0);
      ASSERT_LT(r.indices[j], n);
      if (SendsInputValues()) {
        ASSERT_TRUE(testing::SameBits(r.values[j], x[static_cast<size_t>(r.indices[j])]));
      }
    }
    if (n == 0) {
      EXPECT_TRUE(r.indices.empty());
    }
  }
}

TEST_P(ContractTest, NonFiniteInputIsRefusedWithTheElementNamed) {
  auto s = testing::MustMake(GetParam(), SparsifierOptions{});
  std::vector<float> x = MakeData(DataKind::kNormal, 3000, 4);
  x[2999] = std::numeric_limits<float>::quiet_NaN();
  const auto r = testing::Apply(*s, x, Context(3000));
  EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status.message().find("element 2999 is NaN"), std::string::npos)
      << r.status.message();
  EXPECT_TRUE(r.indices.empty());
}

TEST_P(ContractTest, CapacityAndPrepareAreChecked) {
  auto s = testing::MustMake(GetParam(), SparsifierOptions{});
  const std::vector<float> x = MakeData(DataKind::kNormal, 5000, 4);
  auto ctx = Context(5000);
  std::vector<int32_t> idx(5000);
  std::vector<float> val(5000);
  SparseView small{idx.data(), val.data(), s->MaxSelected(5000) - 1, 0};
  ASSERT_TRUE(s->Prepare(4000, DType::kFloat32).ok());
  EXPECT_EQ(s->Sparsify(DenseView{x.data(), 5000, DType::kFloat32}, &small, ctx).code(),
            StatusCode::kOutOfRange);
  SparseView ok{idx.data(), val.data(), 5000, 0};
  const Status status = s->Sparsify(DenseView{x.data(), 5000, DType::kFloat32}, &ok, ctx);
  if (GetParam().starts_with("reference:")) {
    EXPECT_TRUE(status.ok()) << "reference sparsifiers need no Prepare";
  } else {
    EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition) << "numel above Prepare()";
    std::vector<uint16_t> half(4000);
    EXPECT_EQ(s->Sparsify(DenseView{half.data(), 4000, DType::kFloat16}, &ok, ctx).code(),
              StatusCode::kFailedPrecondition) << "dtype not prepared";
  }
  EXPECT_EQ(s->Prepare(-1, DType::kFloat32).ok(), GetParam().starts_with("reference:"));
}

INSTANTIATE_TEST_SUITE_P(AllSparsifiers, ContractTest,
                         ::testing::ValuesIn(SparsifierNames()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string n = info.param;
                           for (char& c : n) c = (c == ':') ? '_' : c;
                           return n;
                         });

}  // namespace
}  // namespace sparsync::kernels
