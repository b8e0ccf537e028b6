#include "daemon/pipeline/dense_math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/dtype.h"
#include "proto/intake/wire.h"

namespace sparsync::pipeline {
namespace {

using kernels::FloatToHalf;
using kernels::HalfToFloat;

TEST(DenseMathTest, SumAndAverageOfHalfAccumulateInFloat) {
  // 2048 + 1 is not representable in float16; accumulating in float32 keeps it until the end.
  uint16_t a[2] = {FloatToHalf(2048.f), FloatToHalf(1.f)};
  uint16_t b[2] = {FloatToHalf(1.f), FloatToHalf(1.f)};
  uint16_t c[2] = {FloatToHalf(1.f), FloatToHalf(1.f)};
  const void* inputs[] = {a, b, c};
  float acc[2];
  SumInto(acc, inputs, 2, DType::kFloat16);
  EXPECT_EQ(acc[0], 2050.f);
  uint16_t out[2];
  WriteBack(acc, 2, 2.0, out, DType::kFloat16);
  EXPECT_EQ(HalfToFloat(out[0]), 1025.f);
  EXPECT_EQ(HalfToFloat(out[1]), 1.5f);
}

TEST(DenseMathTest, IntegersAreSummedExactly) {
  int64_t a[1] = {int64_t{1} << 60};
  int64_t b[1] = {5};
  const void* inputs[] = {a, b};
  int64_t acc[1];
  SumInto(acc, inputs, 1, DType::kInt64);
  int64_t out[1];
  WriteBack(acc, 1, 1.0, out, DType::kInt64);
  EXPECT_EQ(out[0], (int64_t{1} << 60) + 5);
}

TEST(DenseMathTest, InPlaceAndStagedAveragesAgreeBitForBit) {
  float x[3] = {1.f, 2.f / 3.f, -7.25f};
  float staged[3];
  WriteBack(x, 3, 3.0, staged, DType::kFloat32);
  DivideInPlace(x, 3, 3.0, DType::kFloat32);
  EXPECT_EQ(0, std::memcmp(x, staged, sizeof(x)));
}

}  // namespace
}  // namespace sparsync::pipeline
