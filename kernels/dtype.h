#pragma once
// Element types the kernels accept, and float16 / bfloat16 <-> float32 conversions.
// Narrowing conversions round to nearest, ties to even; NaN stays NaN (quiet), overflow goes to
// +-Inf as IEEE 754 requires. Widening conversions are exact.

#include <cstdint>
#include <cstring>
#include <string_view>

namespace sparsync::kernels {

enum class DType : uint8_t { kFloat32, kFloat64, kFloat16, kBFloat16 };

std::string_view DTypeName(DType dtype);
// Bytes per element.
int64_t DTypeSize(DType dtype);

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// IEEE 754 binary16 (raw bits) -> float32. Exact, including subnormals, Inf and NaN payloads.
inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  if (exp == 0x1F) return BitsToFloat(sign | 0x7F800000u | (mant << 13));  // Inf / NaN
  if (exp != 0) return BitsToFloat(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return BitsToFloat(sign);  // signed zero
  // Subnormal half: value = mant * 2^-24; normalise.
  int e = -1;
  do {
    mant <<= 1;
    ++e;
  } while ((mant & 0x400u) == 0);
  mant &= 0x3FFu;
  return BitsToFloat(sign | (static_cast<uint32_t>(112 - e) << 23) | (mant << 13));
}

// float32 -> binary16 bits, round to nearest even.
inline uint16_t FloatToHalf(float f) {
  const uint32_t x = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t absx = x & 0x7FFFFFFFu;
  if (absx >= 0x7F800000u) {  // Inf or NaN
    return static_cast<uint16_t>(sign | 0x7C00u | (absx > 0x7F800000u ? 0x200u : 0u));
  }
  if (absx >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds to >= 65520
  if (absx < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
    if (absx < 0x33000000u) return sign;  // < 2^-25 (exactly 2^-25 ties to even = 0)
    const uint32_t e = absx >> 23;
    const uint32_t mant = (absx & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126u - e;  // 14 + 23 - (e - 127) - 10 ... result = mant >> (126-e)
    uint32_t result = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (result & 1u))) ++result;
    return static_cast<uint16_t>(sign | result);
  }
  // Normal: rebias exponent (127 -> 15) and round 13 dropped bits to nearest even. A carry out
  // of the mantissa correctly bumps the exponent (and can reach Inf only above the guard above).
  uint32_t result = ((absx >> 23) - 112u) << 10 | ((absx >> 13) & 0x3FFu);
  const uint32_t rem = absx & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (result & 1u))) ++result;
  return static_cast<uint16_t>(sign | result);
}

// bfloat16 bits -> float32. Exact.
inline float BFloat16ToFloat(uint16_t b) { return BitsToFloat(static_cast<uint32_t>(b) << 16); }

// float32 -> bfloat16 bits, round to nearest even.
inline uint16_t FloatToBFloat16(float f) {
  const uint32_t x = FloatBits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // NaN
  const uint32_t rounding = 0x7FFFu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

// Widens `n` elements of `dtype` at `src` to float32 in `dst` (float64 is rounded to nearest).
// REQUIRES: dst has room for n floats; src holds n elements of dtype.
void ConvertToFloat32(const void* src, DType dtype, int64_t n, float* dst);

}  // namespace sparsync::kernels
