#include "kernels/status.h"

#include <gtest/gtest.h>

#include <memory>

namespace sparsync::kernels {
namespace {

Result<int> Half(int x) {
  if (x % 2) return InvalidArgumentError(std::to_string(x) + " is odd");
  return x / 2;
}

Status Chain(int x, int* out) {
  auto r = Half(x);
  SPARSYNC_KERNELS_RETURN_IF_ERROR(r.status());
  *out = *r;
  return Status::Ok();
}

TEST(StatusTest, OkAndErrors) {
  EXPECT_TRUE(Status::Ok().ok());
  EXPECT_EQ(Status::Ok().ToString(), "OK");
  const Status s = OutOfRangeError("too big");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange);
  EXPECT_EQ(s.ToString(), "OUT_OF_RANGE: too big");
}

TEST(StatusTest, ResultCarriesValueOrError) {
  auto good = Half(8);
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(*good, 4);
  auto bad = Half(7);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "7 is odd");
  int out = 0;
  EXPECT_TRUE(Chain(10, &out).ok());
  EXPECT_EQ(out, 5);
  EXPECT_EQ(Chain(3, &out).code(), StatusCode::kInvalidArgument);
  Result<std::unique_ptr<int>> moved(std::make_unique<int>(3));
  std::unique_ptr<int> p = std::move(moved).value();
  EXPECT_EQ(*p, 3);
}

}  // namespace
}  // namespace sparsync::kernels
