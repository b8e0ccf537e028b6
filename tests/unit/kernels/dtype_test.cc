// float16 / bfloat16 conversions: exhaustive widening, round to nearest even on narrowing.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "kernels/dtype.h"

namespace sparsync::kernels {
namespace {

// Independent decoding of binary16 from its definition.
double HalfValue(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 0x1F, mant = h & 0x3FF;
  double v;
  if (exp == 0x1F) {
    v = mant ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (exp == 0) {
    v = std::ldexp(mant, -24);
  } else {
    v = std::ldexp(1024 + mant, exp - 25);
  }
  return sign ? -v : v;
}

TEST(DTypeTest, HalfToFloatIsExactForEveryHalf) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const double expected = HalfValue(static_cast<uint16_t>(h));
    const float got = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(expected)) {
      ASSERT_TRUE(std::isnan(got)) << h;
    } else {
      ASSERT_EQ(static_cast<double>(got), expected) << h;
      ASSERT_EQ(std::signbit(got), (h & 0x8000) != 0) << h;
    }
  }
}

TEST(DTypeTest, HalfRoundTripsThroughFloat) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const auto hh = static_cast<uint16_t>(h);
    const uint16_t back = FloatToHalf(HalfToFloat(hh));
    if (std::isnan(HalfToFloat(hh))) {
      ASSERT_TRUE(std::isnan(HalfToFloat(back))) << h;
    } else {
      ASSERT_EQ(back, hh) << h;
    }
  }
}

// Nearest representable, ties to even mantissa, by brute force over neighbours.
template <typename ToBits, typename FromBits>
void ExpectNearestEven(float f, ToBits to, FromBits from) {
  const uint16_t h = to(f);
  const double x = f;
  const double got = from(h);
  if (std::isinf(got)) return;  // overflow handled by explicit tests
  for (int delta : {-1, 1}) {
    const auto other = static_cast<uint16_t>(h + delta);
    const double o = from(other);
    if (std::isnan(o) || ((other ^ h) & 0x8000)) continue;  // crossed sign or into NaN
    const double dg = std::fabs(got - x), dn = std::fabs(o - x);
    ASSERT_LE(dg, dn) << f;
    if (dg == dn) {
      ASSERT_EQ(h & 1, 0) << "tie not to even for " << f;
    }
  }
}

TEST(DTypeTest, FloatToHalfRoundsToNearestEven) {
  std::mt19937 rng(1);
  for (int i = 0; i < 200000; ++i) {
    const uint32_t bits = rng();
    float f;
    std::memcpy(&f, &bits, 4);
    if (!std::isfinite(f) || std::fabs(f) > 65504.0f) continue;
    int e = 0;
    f = std::ldexp(std::frexp(f, &e), static_cast<int>(rng() % 40) - 26);  // half range
    ExpectNearestEven(f, FloatToHalf, [](uint16_t h) { return HalfValue(h); });
  }
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7BFF);        // max half 65504
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7C00);        // halfway to 65536: ties to even -> Inf
  EXPECT_EQ(FloatToHalf(-1e10f), 0xFC00);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);  // tie between 0 and 2^-24 -> 0
  EXPECT_EQ(FloatToHalf(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(FloatToHalf(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 ulp: tie -> even (2)
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3C00);  // tie -> 1.0 (even)
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(3.0f, -11)), 0x3C02);  // tie -> even
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::infinity()), 0x7C00);
}

TEST(DTypeTest, BFloat16RoundTripAndNearestEven) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const float f = BFloat16ToFloat(static_cast<uint16_t>(b));
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    ASSERT_EQ(bits, b << 16);
    if (!std::isnan(f)) {
      ASSERT_EQ(FloatToBFloat16(f), b);
    }
  }
  std::mt19937 rng(2);
  for (int i = 0; i < 200000; ++i) {
    const uint32_t bits = rng();
    float f;
    std::memcpy(&f, &bits, 4);
    if (!std::isfinite(f) || std::fabs(f) > 3.38e38f) continue;
    ExpectNearestEven(f, FloatToBFloat16,
                      [](uint16_t b) { return static_cast<double>(BFloat16ToFloat(b)); });
  }
  EXPECT_EQ(FloatToBFloat16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);  // tie -> even
  EXPECT_EQ(FloatToBFloat16(1.0f + std::ldexp(3.0f, -8)), 0x3F82);
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::max()), 0x7F80);  // rounds to Inf
}

TEST(DTypeTest, ConvertToFloat32EachDType) {
  const double d[] = {1.5, -2.25, 1e300};
  float out[3];
  ConvertToFloat32(d, DType::kFloat64, 3, out);
  EXPECT_EQ(out[0], 1.5f);
  EXPECT_EQ(out[1], -2.25f);
  EXPECT_TRUE(std::isinf(out[2]));
  const uint16_t h[] = {0x3C00, 0xC000, 0x0001};
  ConvertToFloat32(h, DType::kFloat16, 3, out);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.0f);
  EXPECT_EQ(out[2], std::ldexp(1.0f, -24));
  const uint16_t b[] = {0x3F80, 0xC040};
  ConvertToFloat32(b, DType::kBFloat16, 2, out);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -3.0f);
  EXPECT_EQ(DTypeSize(DType::kBFloat16), 2);
  EXPECT_EQ(DTypeName(DType::kFloat16), "float16");
}

}  // namespace
}  // namespace sparsync::kernels
