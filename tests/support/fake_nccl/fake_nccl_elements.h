// The fake NCCL's arithmetic: how each ncclDataType_t is stored and combined for each ncclRedOp_t
// (sum, prod, max, min, avg), so that its collectives compute what NCCL's kernels compute. Half
// types are combined in float and rounded to nearest even once, when stored.
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace sparsync::fake_nccl {

constexpr int kDatatypes = 10;  // ncclInt8 .. ncclBfloat16
constexpr size_t kDatatypeBytes[kDatatypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
enum Op { kSum = 0, kProd = 1, kMax = 2, kMin = 3, kAvg = 4, kOps = 5 };

inline float HalfToFloat(uint16_t h) {
  int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  float v = exp == 31  ? (mant ? std::numeric_limits<float>::quiet_NaN() : HUGE_VALF)
            : exp == 0 ? std::ldexp(static_cast<float>(mant), -24)  // zero or subnormal
                       : std::ldexp(static_cast<float>(mant | 0x400), exp - 25);
  return h & 0x8000 ? -v : v;
}

inline uint16_t FloatToHalf(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f), a = x & 0x7fffffff;
  auto sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  if (a > 0x7f800000) return sign | 0x7e00;    // NaN: a quiet NaN
  if (a >= 0x477ff000) return sign | 0x7c00;   // 65520 and above round to infinity
  if (a < 0x38800000) {                        // below 2^-14: a subnormal half, in units of 2^-24
    float units = std::fabs(f) * 16777216.0f;  // exact: scaling by a power of two
    return sign | static_cast<uint16_t>(std::nearbyint(units));  // to nearest even
  }
  uint32_t h = (a >> 13) - ((127 - 15) << 10);  // rebias the exponent, keep 10 mantissa bits
  uint32_t dropped = a & 0x1fff;
  if (dropped > 0x1000 || (dropped == 0x1000 && (h & 1))) ++h;  // a carry may reach the exponent
  return sign | static_cast<uint16_t>(h);
}

inline float Bf16ToFloat(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

inline uint16_t FloatToBf16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((x >> 16) | 0x0040);  // quiet
  x += 0x7fff + ((x >> 16) & 1);  // to nearest even; an overflow carries into infinity
  return static_cast<uint16_t>(x >> 16);
}

template <typename A>
A Identity(A v) {
  return v;
}

// Elements stored as T, combined as A. Integers wrap around on overflow, as NCCL's do (through
// unsigned arithmetic, so without undefined behaviour); a NaN propagates through max and min.
template <typename T, typename A = T, A (*Widen)(T) = &Identity<T>, T (*Narrow)(A) = &Identity<T>>
struct Codec {
  using Acc = A;
  using Bits = typename std::conditional_t<std::is_integral_v<A>, std::make_unsigned<A>,
                                           std::type_identity<A>>::type;
  static Acc Load(const unsigned char* p, size_t i) {
    T v;
    std::memcpy(&v, p + i * sizeof(T), sizeof(T));
    return Widen(v);
  }
  static void Store(unsigned char* p, size_t i, Acc v) {
    T t = Narrow(v);
    std::memcpy(p + i * sizeof(T), &t, sizeof(T));
  }
  static Acc Add(Acc a, Acc b) { return Acc(Bits(a) + Bits(b)); }
  static Acc Mul(Acc a, Acc b) { return Acc(Bits(a) * Bits(b)); }
  static Acc Max(Acc a, Acc b) { return EitherNan(a, b) ? a + b : (a < b ? b : a); }
  static Acc Min(Acc a, Acc b) { return EitherNan(a, b) ? a + b : (b < a ? b : a); }
  static bool EitherNan(Acc a, Acc b) {
    if constexpr (std::is_floating_point_v<Acc>) return std::isnan(a) || std::isnan(b);
    return false;
  }
};

// out[i] = op over the ranks' in[r][i], combined in rank order.
template <typename C>
void Combine(const std::vector<const unsigned char*>& in, size_t count, int op,
             unsigned char* out) {
  using Acc = typename C::Acc;
  const int n = static_cast<int>(in.size());
  for (size_t i = 0; i < count; ++i) {
    Acc acc = C::Load(in[0], i);
    for (int r = 1; r < n; ++r) {
      Acc v = C::Load(in[r], i);
      acc = op == kProd  ? C::Mul(acc, v)
            : op == kMax ? C::Max(acc, v)
            : op == kMin ? C::Min(acc, v)
                         : C::Add(acc, v);  // kSum, kAvg
    }
    C::Store(out, i, op == kAvg ? Acc(acc / Acc(n)) : acc);
  }
}

using CombineFn = void (*)(const std::vector<const unsigned char*>&, size_t, int, unsigned char*);

// By ncclDataType_t; the half types are combined in float and rounded once, when stored.
inline constexpr CombineFn kCombine[kDatatypes] = {
    &Combine<Codec<int8_t>>,
    &Combine<Codec<uint8_t>>,
    &Combine<Codec<int32_t>>,
    &Combine<Codec<uint32_t>>,
    &Combine<Codec<int64_t>>,
    &Combine<Codec<uint64_t>>,
    &Combine<Codec<uint16_t, float, &HalfToFloat, &FloatToHalf>>,
    &Combine<Codec<float>>,
    &Combine<Codec<double>>,
    &Combine<Codec<uint16_t, float, &Bf16ToFloat, &FloatToBf16>>};

}  // namespace sparsync::fake_nccl
