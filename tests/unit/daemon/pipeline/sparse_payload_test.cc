#include "daemon/pipeline/sparse_payload.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/dtype.h"

namespace sparsync::pipeline {
namespace {

using kernels::FloatBits;
using kernels::FloatToHalf;
using kernels::HalfToFloat;
using ::testing::HasSubstr;

constexpr IndexCoding kIndexCodings[] = {IndexCoding::kRaw32, IndexCoding::kDeltaVarint};
constexpr ValueCoding kValueCodings[] = {ValueCoding::kFloat32, ValueCoding::kFloat16,
                                         ValueCoding::kSignScale};

std::string CodingName(IndexCoding ic, ValueCoding vc) {
  const char* i = ic == IndexCoding::kRaw32 ? "Raw32" : "DeltaVarint";
  const char* v = vc == ValueCoding::kFloat32   ? "Float32"
                  : vc == ValueCoding::kFloat16 ? "Float16"
                                                : "SignScale";
  return std::string(i) + "_" + v;
}

// A selection: strictly ascending indices and their values.
struct Selection {
  int64_t numel = 0;
  std::vector<int32_t> indices;
  std::vector<float> values;
  SparseTensor View() const { return {numel, indices, values}; }
};

int64_t CountFor(int64_t numel, double density) {
  if (numel == 0) return 0;
  return std::min<int64_t>(numel, std::max<int64_t>(1, static_cast<int64_t>(density * numel)));
}

// Values shaped like Wangni's output for kSignScale (most at one magnitude, up to float32
// rounding, a few larger), otherwise spread over several decades with both signs and zeros.
Selection RandomSelection(int64_t numel, int64_t k, ValueCoding vc, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Selection s;
  s.numel = numel;
  std::vector<int32_t> all(static_cast<size_t>(numel));
  std::iota(all.begin(), all.end(), 0);
  std::sample(all.begin(), all.end(), std::back_inserter(s.indices), k, rng);
  std::uniform_real_distribution<float> unit(0.f, 1.f);
  const float magnitude = 0.0123f;
  for (int64_t j = 0; j < k; ++j) {
    const float sign = (rng() & 1) ? -1.f : 1.f;
    float v;
    if (vc == ValueCoding::kSignScale) {
      v = unit(rng) < 0.8f ? magnitude * (1.f + 1e-6f * unit(rng))
                           : magnitude * (1.5f + 9 * unit(rng));
    } else {
      const uint64_t r = rng() % 50;
      v = r == 0 ? 0.f : std::pow(10.f, -3.f + 5.f * unit(rng));
    }
    s.values.push_back(sign * v);
  }
  return s;
}

std::vector<uint8_t> MustEncode(const SparseTensor& t, IndexCoding ic, ValueCoding vc) {
  const size_t bound = MaxEncodedBytes(t.numel, static_cast<int64_t>(t.indices.size()), ic, vc);
  // Poison the slack so a write past the returned length would show up as a changed byte.
  std::vector<uint8_t> out(bound + 64, 0xA5);
  Result<size_t> n = Encode(t, ic, vc, std::span<uint8_t>(out.data(), bound));
  EXPECT_TRUE(n.ok()) << n.status().ToString();
  if (!n.ok()) return {};
  EXPECT_LE(n.value(), bound);
  for (size_t b = bound; b < out.size(); ++b) EXPECT_EQ(out[b], 0xA5) << "wrote past the bound";
  out.resize(n.value());
  return out;
}

// An accumulator surrounded by guard elements, to catch writes outside it without a sanitizer.
class GuardedAcc {
 public:
  GuardedAcc(size_t n, uint64_t seed) : n_(n), buf_(n + 2 * kGuard, kGuardValue) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> d(-4.f, 4.f);
    for (size_t i = 0; i < n; ++i) buf_[kGuard + i] = d(rng);
  }
  std::span<float> span() { return {buf_.data() + kGuard, n_}; }
  std::vector<float> Copy() const {
    return {buf_.begin() + kGuard, buf_.begin() + static_cast<std::ptrdiff_t>(kGuard + n_)};
  }
  bool GuardsIntact() const {
    for (size_t i = 0; i < kGuard; ++i) {
      if (FloatBits(buf_[i]) != FloatBits(kGuardValue)) return false;
      if (FloatBits(buf_[kGuard + n_ + i]) != FloatBits(kGuardValue)) return false;
    }
    return true;
  }

 private:
  static constexpr size_t kGuard = 8;
  static constexpr float kGuardValue = 1234.5f;
  size_t n_;
  std::vector<float> buf_;
};

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  return a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// ---------------------------------------------------------------------------------------------
// Round trip over codings, sizes and densities.

using RoundTripParam = std::tuple<IndexCoding, ValueCoding, int64_t, double>;

class SparsePayloadRoundTrip : public ::testing::TestWithParam<RoundTripParam> {};

TEST_P(SparsePayloadRoundTrip, DecodesWhatWasEncodedAndAddsIt) {
  const auto [ic, vc, numel, density] = GetParam();
  const int64_t k = CountFor(numel, density);
  const Selection s = RandomSelection(numel, k, vc, static_cast<uint64_t>(numel * 31 + k));
  const std::vector<uint8_t> payload = MustEncode(s.View(), ic, vc);
  ASSERT_FALSE(payload.empty());

  Result<DecodedSparse> decoded = Decode(payload);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(decoded->numel, numel);
  ASSERT_EQ(decoded->indices, s.indices);
  ASSERT_EQ(decoded->values.size(), s.values.size());

  float scale = INFINITY;
  for (float v : s.values) scale = std::min(scale, std::fabs(v));
  const double limit = static_cast<double>(scale) * (1.0 + kSignScaleTolerance);
  for (size_t j = 0; j < s.values.size(); ++j) {
    const float want = s.values[j], got = decoded->values[j];
    switch (vc) {
      case ValueCoding::kFloat32:
        ASSERT_EQ(FloatBits(got), FloatBits(want)) << "coordinate " << j;
        break;
      case ValueCoding::kFloat16:
        ASSERT_EQ(FloatBits(got), FloatBits(HalfToFloat(FloatToHalf(want)))) << "coordinate " << j;
        ASSERT_LE(std::fabs(got - want), std::fabs(want) * 0x1p-11f + 0x1p-25f) << j;
        break;
      case ValueCoding::kSignScale:
        if (std::fabs(want) > limit) {
          ASSERT_EQ(FloatBits(got), FloatBits(want)) << "full coordinate " << j;
        } else {
          ASSERT_EQ(got, std::copysign(scale, want)) << "sign-coded coordinate " << j;
          ASSERT_EQ(std::signbit(got), std::signbit(want)) << j;
        }
        break;
    }
  }

  // DecodeAdd adds the decoded values onto what acc holds and leaves other elements alone.
  GuardedAcc acc(static_cast<size_t>(numel), 7);
  std::vector<float> want = acc.Copy();
  for (size_t j = 0; j < s.indices.size(); ++j) want[s.indices[j]] += decoded->values[j];
  ASSERT_TRUE(DecodeAdd(payload, numel, acc.span()).ok());
  EXPECT_TRUE(SameBits(acc.Copy(), want));
  EXPECT_TRUE(acc.GuardsIntact());
}

std::string RoundTripName(const ::testing::TestParamInfo<RoundTripParam>& info) {
  const auto [ic, vc, numel, density] = info.param;
  std::string d = std::to_string(density);
  d.erase(d.find_last_not_of('0') + 1);
  if (d.back() == '.') d.pop_back();
  std::replace(d.begin(), d.end(), '.', '_');
  return CodingName(ic, vc) + "_n" + std::to_string(numel) + "_d" + d;
}

INSTANTIATE_TEST_SUITE_P(AllCodings, SparsePayloadRoundTrip,
                         ::testing::Combine(::testing::ValuesIn(kIndexCodings),
                                            ::testing::ValuesIn(kValueCodings),
                                            ::testing::Values<int64_t>(0, 1, 2, 1000, 1000000),
                                            ::testing::Values(1e-4, 1e-3, 1e-2, 0.1, 1.0)),
                         RoundTripName);

// ---------------------------------------------------------------------------------------------
// The layout, byte for byte (sparse_payload.h documents it; peers built from other versions of
// this code read these bytes).

TEST(SparsePayloadTest, DeltaVarintFloat32Bytes) {
  const Selection s{300, {2, 3, 200}, {1.0f, -2.0f, 0.5f}};
  // clang-format off
  const std::vector<uint8_t> want = {
      'S', 'P', 'R', 'S', 1, 1, 0, 0,  // magic, version, index coding, value coding, reserved
      0x2C, 0x01, 0, 0, 3, 0, 0, 0,    // numel 300, k 3
      0x02, 0x00, 0xC4, 0x01,          // gaps - 1: 2, 0, 196
      0, 0, 0x80, 0x3F, 0, 0, 0, 0xC0, 0, 0, 0, 0x3F};  // 1.0, -2.0, 0.5
  // clang-format on
  EXPECT_EQ(MustEncode(s.View(), IndexCoding::kDeltaVarint, ValueCoding::kFloat32), want);
}

TEST(SparsePayloadTest, Raw32SignScaleBytes) {
  const Selection s{300, {2, 3, 200}, {0.5f, -0.5f, 3.0f}};
  // clang-format off
  const std::vector<uint8_t> want = {
      'S', 'P', 'R', 'S', 1, 0, 2, 0,  // raw32, sign-scale
      0x2C, 0x01, 0, 0, 3, 0, 0, 0,    // numel 300, k 3
      0, 0, 0, 0x3F, 1, 0, 0, 0,       // scale 0.5, 1 full coordinate
      2, 0, 0, 0, 3, 0, 0, 0, 200, 0, 0, 0,  // indices
      0, 0, 0x40, 0x40,                // full value 3.0
      0x04,                            // mask: coordinate 2 is full
      0x02};                           // signs of coordinates 0 (+) and 1 (-)
  // clang-format on
  EXPECT_EQ(MustEncode(s.View(), IndexCoding::kRaw32, ValueCoding::kSignScale), want);
}

TEST(SparsePayloadTest, Float16RoundsToNearestEven) {
  // 1 + 2^-11 is halfway between two binary16 values: ties go to the even one, 1.0.
  const Selection s{4, {0, 1, 3}, {1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, -65504.f}};
  Result<DecodedSparse> d =
      Decode(MustEncode(s.View(), IndexCoding::kRaw32, ValueCoding::kFloat16));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->values, (std::vector<float>{1.0f, 1.0f + 4 * 0x1p-11f, -65504.f}));
}

TEST(SparsePayloadTest, LargestNumelAndLongestGapsRoundTrip) {
  const Selection s{kMaxNumel, {0, 1, 1 << 20, INT32_MAX}, {1.f, 2.f, 3.f, 4.f}};
  for (IndexCoding ic : kIndexCodings) {
    const std::vector<uint8_t> payload = MustEncode(s.View(), ic, ValueCoding::kFloat32);
    Result<DecodedSparse> d = Decode(payload);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    EXPECT_EQ(d->numel, kMaxNumel);
    EXPECT_EQ(d->indices, s.indices);
    EXPECT_EQ(d->values, s.values);
  }
  // One index at the very end is a 5-byte varint, the longest there is.
  const Selection last{kMaxNumel, {INT32_MAX}, {1.f}};
  EXPECT_EQ(MustEncode(last.View(), IndexCoding::kDeltaVarint, ValueCoding::kFloat32).size(),
            kSparsePayloadHeaderBytes + 5 + 4);
}

TEST(SparsePayloadTest, DeltaVarintIsSmallerForClusteredIndices) {
  Selection s{1 << 20, {}, {}};
  for (int32_t i = 0; i < 1000; ++i) {
    s.indices.push_back(1000 + i);
    s.values.push_back(1.f);
  }
  const size_t raw = MustEncode(s.View(), IndexCoding::kRaw32, ValueCoding::kFloat32).size();
  const size_t varint =
      MustEncode(s.View(), IndexCoding::kDeltaVarint, ValueCoding::kFloat32).size();
  EXPECT_EQ(raw, kSparsePayloadHeaderBytes + 8000);
  EXPECT_EQ(varint, kSparsePayloadHeaderBytes + 2 + 999 + 4000);  // 1000 is 2 bytes, gaps 1 byte
}

TEST(SparsePayloadTest, SignScaleSendsOneBitPerCoordinateAtOneMagnitude) {
  Selection s{100000, {}, {}};
  for (int32_t j = 0; j < 800; ++j) {
    s.indices.push_back(j * 100);
    s.values.push_back(j % 3 ? 0.25f : -0.25f);
  }
  const std::vector<uint8_t> payload =
      MustEncode(s.View(), IndexCoding::kDeltaVarint, ValueCoding::kSignScale);
  // 24 header + 800 one-byte gaps (99) + 100 mask bytes + 100 sign bytes.
  EXPECT_EQ(payload.size(), 24u + 800 + 100 + 100);
  Result<DecodedSparse> d = Decode(payload);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->values, s.values);
}

TEST(SparsePayloadTest, SignScaleKeepsSignedZeros) {
  const Selection s{8, {1, 5, 6}, {-0.f, 0.f, 2.f}};
  Result<DecodedSparse> d =
      Decode(MustEncode(s.View(), IndexCoding::kRaw32, ValueCoding::kSignScale));
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(std::signbit(d->values[0]));
  EXPECT_FALSE(std::signbit(d->values[1]));
  EXPECT_EQ(d->values[2], 2.f);
}

TEST(SparsePayloadTest, DecodeAddAddsRatherThanOverwrites) {
  const Selection s{4, {1, 3}, {1.5f, -2.f}};
  for (IndexCoding ic : kIndexCodings) {
    for (ValueCoding vc : kValueCodings) {
      const std::vector<uint8_t> payload = MustEncode(s.View(), ic, vc);
      std::vector<float> acc = {10.f, 10.f, 10.f, 10.f};
      ASSERT_TRUE(DecodeAdd(payload, 4, acc).ok());
      ASSERT_TRUE(DecodeAdd(payload, 4, acc).ok());
      // sign-scale: 1.5 is the smallest magnitude and 2 is full; both exact here.
      EXPECT_EQ(acc, (std::vector<float>{10.f, 13.f, 10.f, 6.f})) << CodingName(ic, vc);
    }
  }
}

TEST(SparsePayloadTest, MaxEncodedBytesBoundsTheWorstCases) {
  // Every index a 5-byte varint is impossible, but the widest gaps must fit: k = 1 at the end,
  // k = 2 with the second at the end, and sign-scale with all but one coordinate full.
  for (ValueCoding vc : kValueCodings) {
    for (int64_t k : {1, 2, 3}) {
      Selection s{kMaxNumel, {}, {}};
      for (int64_t j = 0; j < k; ++j) {
        s.indices.push_back(static_cast<int32_t>(INT32_MAX - (k - 1 - j)));
        s.values.push_back(1.f + static_cast<float>(j));
      }
      MustEncode(s.View(), IndexCoding::kDeltaVarint, vc);  // checks the bound
      MustEncode(s.View(), IndexCoding::kRaw32, vc);
    }
  }
  // Sign-scale with every coordinate but the smallest full is the largest value section, and the
  // bound is tight for it.
  Selection most_full{5000, {}, {}};
  for (int32_t j = 0; j < 1000; ++j) {
    most_full.indices.push_back(j * 5);
    most_full.values.push_back(j == 500 ? 0.5f : -1.f - static_cast<float>(j));
  }
  EXPECT_EQ(MustEncode(most_full.View(), IndexCoding::kRaw32, ValueCoding::kSignScale).size(),
            MaxEncodedBytes(5000, 1000, IndexCoding::kRaw32, ValueCoding::kSignScale));
  // The varint bound follows numel: the largest gap of each size class.
  for (int64_t numel : {int64_t{1}, int64_t{128}, int64_t{129}, int64_t{16384}, int64_t{16385},
                        (int64_t{1} << 21) + 1, (int64_t{1} << 28) + 1, kMaxNumel}) {
    for (ValueCoding vc : kValueCodings) {
      MustEncode(Selection{numel, {static_cast<int32_t>(numel - 1)}, {1.f}}.View(),
                 IndexCoding::kDeltaVarint, vc);
      if (numel > 1) {
        MustEncode(Selection{numel, {0, static_cast<int32_t>(numel - 1)}, {1.f, 2.f}}.View(),
                   IndexCoding::kDeltaVarint, vc);
      }
    }
  }
  EXPECT_EQ(MaxEncodedBytes(128, 3, IndexCoding::kDeltaVarint, ValueCoding::kFloat32),
            kSparsePayloadHeaderBytes + 3 + 12);
  EXPECT_EQ(MaxEncodedBytes(10, 0, IndexCoding::kRaw32, ValueCoding::kFloat32),
            kSparsePayloadHeaderBytes);
  EXPECT_EQ(MaxEncodedBytes(10, 0, IndexCoding::kRaw32, ValueCoding::kSignScale),
            kSparsePayloadHeaderBytes + kSignScaleHeaderBytes);
}

// ---------------------------------------------------------------------------------------------
// Encode refuses bad input and writes nothing.

void ExpectEncodeFails(const Selection& s, ValueCoding vc, const std::string& message,
                       size_t out_bytes = 4096) {
  for (IndexCoding ic : kIndexCodings) {
    std::vector<uint8_t> out(out_bytes, 0x5A);
    Result<size_t> r = Encode(s.View(), ic, vc, out);
    ASSERT_FALSE(r.ok()) << CodingName(ic, vc);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(r.status().message(), HasSubstr(message));
    EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](uint8_t b) { return b == 0x5A; }))
        << "Encode wrote into out before failing";
  }
}

TEST(SparsePayloadTest, EncodeRejectsBadSelections) {
  const ValueCoding f32 = ValueCoding::kFloat32;
  ExpectEncodeFails({10, {3, 2}, {1.f, 1.f}}, f32, "not strictly ascending");
  ExpectEncodeFails({10, {2, 2}, {1.f, 1.f}}, f32, "not strictly ascending");
  ExpectEncodeFails({10, {-1}, {1.f}}, f32, "out of range");
  ExpectEncodeFails({10, {10}, {1.f}}, f32, "out of range");
  ExpectEncodeFails({1, {0, 1}, {1.f, 1.f}}, f32, "exceeds numel");
  ExpectEncodeFails({10, {1, 2}, {1.f}}, f32, "2 indices but 1 values");
  ExpectEncodeFails({-1, {}, {}}, f32, "numel -1");
  ExpectEncodeFails({kMaxNumel + 1, {}, {}}, f32, "numel");
  for (ValueCoding vc : kValueCodings) {
    ExpectEncodeFails({10, {1, 4}, {1.f, NAN}}, vc, "not finite");
    ExpectEncodeFails({10, {1, 4}, {-INFINITY, 1.f}}, vc, "not finite");
  }
  ExpectEncodeFails({10, {1}, {70000.f}}, ValueCoding::kFloat16, "overflows float16");
  ExpectEncodeFails({10, {1}, {-65520.f}}, ValueCoding::kFloat16, "overflows float16");
  ExpectEncodeFails({10, {1, 2}, {1.f, 1.f}}, f32, "output buffer", /*out_bytes=*/20);
  ExpectEncodeFails({10, {1}, {1.f}}, static_cast<ValueCoding>(3), "unknown value coding");
}

// ---------------------------------------------------------------------------------------------
// Corrupt payloads: specific errors, acc untouched.

void PutU32(std::vector<uint8_t>& b, uint32_t v) {
  for (int s = 0; s < 32; s += 8) b.push_back(static_cast<uint8_t>(v >> s));
}
void PutF32(std::vector<uint8_t>& b, float v) { PutU32(b, FloatBits(v)); }

std::vector<uint8_t> Header(IndexCoding ic, ValueCoding vc, uint32_t numel, uint32_t k) {
  std::vector<uint8_t> b = {
      'S', 'P', 'R', 'S', 1, static_cast<uint8_t>(ic), static_cast<uint8_t>(vc), 0};
  PutU32(b, numel);
  PutU32(b, k);
  return b;
}

// Decode and DecodeAdd both fail with `message`; acc and its surroundings are unchanged.
void ExpectCorrupt(const std::vector<uint8_t>& payload, int64_t numel, const std::string& message,
                   StatusCode code = StatusCode::kInvalidArgument) {
  GuardedAcc acc(static_cast<size_t>(numel), 3);
  const std::vector<float> before = acc.Copy();
  const Status st = DecodeAdd(payload, numel, acc.span());
  ASSERT_FALSE(st.ok()) << "expected: " << message;
  EXPECT_EQ(st.code(), code) << st.ToString();
  EXPECT_THAT(st.message(), HasSubstr(message));
  EXPECT_TRUE(SameBits(acc.Copy(), before));
  EXPECT_TRUE(acc.GuardsIntact());
  if (code == StatusCode::kInvalidArgument) {
    Result<DecodedSparse> d = Decode(payload);
    ASSERT_FALSE(d.ok());
    EXPECT_THAT(d.status().message(), HasSubstr(message));
  }
}

class SparsePayloadCorruptTest : public ::testing::Test {
 protected:
  // numel 1000; indices 5, 6, 900; values 1, -2, 3.
  const Selection s_{1000, {5, 6, 900}, {1.f, -2.f, 3.f}};
  std::vector<uint8_t> Valid(IndexCoding ic, ValueCoding vc) {
    return MustEncode(s_.View(), ic, vc);
  }
};

TEST_F(SparsePayloadCorruptTest, BadMagic) {
  std::vector<uint8_t> p = Valid(IndexCoding::kRaw32, ValueCoding::kFloat32);
  p[0] = 'X';
  ExpectCorrupt(p, 1000, "bad magic");
  ExpectCorrupt(std::vector<uint8_t>(32, 0), 1000, "bad magic");
}

TEST_F(SparsePayloadCorruptTest, VersionCodingsAndReservedByte) {
  std::vector<uint8_t> p = Valid(IndexCoding::kRaw32, ValueCoding::kFloat32);
  p[4] = 2;
  ExpectCorrupt(p, 1000, "unsupported version 2");
  p = Valid(IndexCoding::kRaw32, ValueCoding::kFloat32);
  p[5] = 2;
  ExpectCorrupt(p, 1000, "unknown index coding 2");
  p = Valid(IndexCoding::kRaw32, ValueCoding::kFloat32);
  p[6] = 3;
  ExpectCorrupt(p, 1000, "unknown value coding 3");
  p = Valid(IndexCoding::kRaw32, ValueCoding::kFloat32);
  p[7] = 1;
  ExpectCorrupt(p, 1000, "reserved header byte");
}

TEST_F(SparsePayloadCorruptTest, Truncated) {
  ExpectCorrupt({}, 1000, "truncated");
  ExpectCorrupt({'S', 'P', 'R', 'S'}, 1000, "truncated");
  for (IndexCoding ic : kIndexCodings) {
    for (ValueCoding vc : kValueCodings) {
      std::vector<uint8_t> p = Valid(ic, vc);
      p.pop_back();
      ExpectCorrupt(p, 1000, "truncated");
    }
  }
  // A huge k in a short payload.
  std::vector<uint8_t> p =
      Header(IndexCoding::kDeltaVarint, ValueCoding::kFloat32, kMaxNumel, 0x7FFFFFF0u);
  p.resize(p.size() + 40, 0);
  ExpectCorrupt(p, 1000, "truncated");
}

TEST_F(SparsePayloadCorruptTest, TrailingBytes) {
  for (IndexCoding ic : kIndexCodings) {
    for (ValueCoding vc : kValueCodings) {
      std::vector<uint8_t> p = Valid(ic, vc);
      p.push_back(0);
      ExpectCorrupt(p, 1000, "1 trailing bytes");
    }
  }
}

TEST_F(SparsePayloadCorruptTest, IndexOutOfRange) {
  // Raw: the last index (offset 16 + 8) becomes 1000.
  std::vector<uint8_t> p = Valid(IndexCoding::kRaw32, ValueCoding::kFloat32);
  p[24] = 0xE8;
  p[25] = 0x03;
  ExpectCorrupt(p, 1000, "index 1000 of coordinate 2 out of range for 1000 elements");
  p[27] = 0x80;  // negative
  ExpectCorrupt(p, 1000, "out of range");
  // Varint: gaps - 1 are 5, 0, 893 (0xFD 0x06); 993 (0xE1 0x07) puts the last index at 1000.
  p = Valid(IndexCoding::kDeltaVarint, ValueCoding::kFloat32);
  ASSERT_EQ(p[18], 0xFD);
  ASSERT_EQ(p[19], 0x06);
  p[18] = 0xE1;
  p[19] = 0x07;
  ExpectCorrupt(p, 1000, "index 1000 of coordinate 2 out of range");
  // The largest 32-bit varint is in range of no tensor.
  std::vector<uint8_t> q = Header(IndexCoding::kDeltaVarint, ValueCoding::kFloat32, kMaxNumel, 1);
  for (uint8_t b : {0xFF, 0xFF, 0xFF, 0xFF, 0x0F}) q.push_back(b);
  PutF32(q, 1.f);
  ExpectCorrupt(q, 16, "index 4294967295 of coordinate 0 out of range");
}

TEST_F(SparsePayloadCorruptTest, NotAscending) {
  std::vector<uint8_t> p = Valid(IndexCoding::kRaw32, ValueCoding::kFloat32);
  p[20] = 5;  // 5, 5, 900
  ExpectCorrupt(p, 1000, "indices not ascending at coordinate 1 (5 after 5)");
  p[20] = 4;  // 5, 4, 900
  ExpectCorrupt(p, 1000, "not ascending");
}

TEST_F(SparsePayloadCorruptTest, VarintOverflowAndNonCanonicalVarint) {
  std::vector<uint8_t> p = Header(IndexCoding::kDeltaVarint, ValueCoding::kFloat32, kMaxNumel, 1);
  for (uint8_t b : {0xFF, 0xFF, 0xFF, 0xFF, 0x1F}) p.push_back(b);  // 36 bits
  PutF32(p, 1.f);
  ExpectCorrupt(p, 16, "varint overflow at coordinate 0");
  p = Header(IndexCoding::kDeltaVarint, ValueCoding::kFloat32, kMaxNumel, 1);
  for (uint8_t b : {0x80, 0x80, 0x80, 0x80, 0x80, 0x00}) p.push_back(b);  // 6 bytes
  PutF32(p, 1.f);
  ExpectCorrupt(p, 16, "varint overflow");
  p = Header(IndexCoding::kDeltaVarint, ValueCoding::kFloat32, 1000, 1);
  for (uint8_t b : {0x85, 0x00}) p.push_back(b);  // 5 written in two bytes
  PutF32(p, 1.f);
  ExpectCorrupt(p, 1000, "non-canonical varint at coordinate 0");
  p = Header(IndexCoding::kDeltaVarint, ValueCoding::kFloat32, 1000, 2);
  for (uint8_t b : {0x05, 0x85}) p.push_back(b);  // ends inside the second varint
  ExpectCorrupt(p, 1000, "truncated");
}

TEST_F(SparsePayloadCorruptTest, CountsAndSizes) {
  std::vector<uint8_t> p = Header(IndexCoding::kRaw32, ValueCoding::kFloat32, 10, 11);
  ExpectCorrupt(p, 10, "k = 11 exceeds numel = 10");
  p = Header(IndexCoding::kRaw32, ValueCoding::kFloat32, 0x80000001u, 0);
  ExpectCorrupt(p, 10, "numel 2147483649 exceeds");
  // A valid payload for another tensor size, or an acc of the wrong size.
  ExpectCorrupt(Valid(IndexCoding::kRaw32, ValueCoding::kFloat32), 1001,
                "describes a tensor of 1000 elements, expected 1001", StatusCode::kMismatch);
  std::vector<float> acc(999);
  const Status st = DecodeAdd(Valid(IndexCoding::kRaw32, ValueCoding::kFloat32), 1000, acc);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("accumulator has 999 elements, expected 1000"));
}

TEST_F(SparsePayloadCorruptTest, NonFiniteValuesAndScale) {
  std::vector<uint8_t> p = Valid(IndexCoding::kRaw32, ValueCoding::kFloat32);
  std::memcpy(p.data() + 28 + 4, "\x00\x00\xc0\x7f", 4);  // value 1 := NaN
  ExpectCorrupt(p, 1000, "value 1 is not finite");
  p = Valid(IndexCoding::kRaw32, ValueCoding::kFloat16);
  p[28 + 5] = 0x7C;  // value 2 := +Inf (0x7C00)
  p[28 + 4] = 0x00;
  ExpectCorrupt(p, 1000, "value 2 is not finite");
  // Sign-scale: scale at offset 16.
  p = Valid(IndexCoding::kRaw32, ValueCoding::kSignScale);
  std::memcpy(p.data() + 16, "\x00\x00\x80\x7f", 4);  // +Inf
  ExpectCorrupt(p, 1000, "scale inf is not finite and >= 0");
  p = Valid(IndexCoding::kRaw32, ValueCoding::kSignScale);
  p[19] |= 0x80;  // -1.0
  ExpectCorrupt(p, 1000, "is not finite and >= 0");
}

TEST_F(SparsePayloadCorruptTest, SignScaleMaskAndPadding) {
  // 1, -2, 3: scale 1, full = 2 (coordinates 1 and 2). Sections after the 24-byte header and 12
  // index bytes: 8 bytes of full values (offset 36), mask (44), signs (45).
  std::vector<uint8_t> p = Valid(IndexCoding::kRaw32, ValueCoding::kSignScale);
  ASSERT_EQ(p.size(), 46u);
  ASSERT_EQ(p[44], 0x06);
  ASSERT_EQ(p[45], 0x00);
  p[20] = 4;  // full = 4 > k
  ExpectCorrupt(p, 1000, "full count 4 exceeds k = 3");
  p = Valid(IndexCoding::kRaw32, ValueCoding::kSignScale);
  p[44] = 0x07;  // 3 set bits, header says 2
  ExpectCorrupt(p, 1000, "full mask has 3 set bits, header says 2");
  p[44] = 0x0E;  // bit 3 is padding
  ExpectCorrupt(p, 1000, "padding bits of the full mask are not zero");
  p[44] = 0x06;
  p[45] = 0x02;  // one sign-coded coordinate: bit 1 is padding
  ExpectCorrupt(p, 1000, "padding bits of the sign bits are not zero");
}

// ---------------------------------------------------------------------------------------------
// Fuzz: any bytes give an error with acc untouched, or a result consistent with Decode.

// Runs DecodeAdd and Decode on `payload`; returns whether it was accepted.
bool CheckAnyPayload(const std::vector<uint8_t>& payload, int64_t numel, uint64_t seed) {
  GuardedAcc acc(static_cast<size_t>(numel), seed);
  const std::vector<float> before = acc.Copy();
  const Status st = DecodeAdd(payload, numel, acc.span());
  Result<DecodedSparse> d = Decode(payload);
  EXPECT_TRUE(acc.GuardsIntact());
  if (!st.ok()) {
    EXPECT_TRUE(SameBits(acc.Copy(), before)) << st.ToString();
    if (st.code() == StatusCode::kInvalidArgument) {
      EXPECT_FALSE(d.ok());
      if (!d.ok()) {
        EXPECT_EQ(d.status().message(), st.message());
      }
    }
    return false;
  }
  EXPECT_TRUE(d.ok());
  if (!d.ok()) return true;
  EXPECT_EQ(d->numel, numel);
  std::vector<float> want = before;
  int64_t prev = -1;
  for (size_t j = 0; j < d->indices.size(); ++j) {
    const int32_t i = d->indices[j];
    EXPECT_GT(i, prev);
    EXPECT_LT(i, numel);
    EXPECT_TRUE(std::isfinite(d->values[j]));
    if (i <= prev || i >= numel) return true;
    want[i] += d->values[j];
    prev = i;
  }
  EXPECT_TRUE(SameBits(acc.Copy(), want));
  // A valid payload is the one canonical encoding of what it holds (sign-scale excepted: its
  // split between full and sign-coded depends on the values, which a forged payload picks).
  const ValueCoding vc = static_cast<ValueCoding>(payload[6]);
  if (vc != ValueCoding::kSignScale) {
    const Selection again{d->numel, d->indices, d->values};
    EXPECT_EQ(MustEncode(again.View(), static_cast<IndexCoding>(payload[5]), vc), payload);
  }
  return true;
}

TEST(SparsePayloadFuzzTest, RandomBuffers) {
  std::mt19937_64 rng(20240601);
  int accepted = 0;
  constexpr int kIterations = 120000;
  for (int it = 0; it < kIterations; ++it) {
    std::vector<uint8_t> p;
    int64_t numel = 1 + static_cast<int64_t>(rng() % 64);
    const size_t body = rng() % 48;
    if (it % 4 == 0) {
      // Pure noise.
      for (size_t b = 0; b < 16 + body; ++b) p.push_back(static_cast<uint8_t>(rng()));
    } else {
      // A plausible header with small counts, then noise: exercises the section checks.
      const auto ic = static_cast<IndexCoding>(rng() % 2);
      const auto vc = static_cast<ValueCoding>(rng() % 3);
      p = Header(ic, vc, static_cast<uint32_t>(numel), static_cast<uint32_t>(rng() % 6));
      if (vc == ValueCoding::kSignScale) {
        PutF32(p, static_cast<float>(rng() % 100) / 8);
        PutU32(p, static_cast<uint32_t>(rng() % 4));
      }
      for (size_t b = 0; b < body % 24; ++b) {
        // Small bytes make valid gaps and masks likelier.
        p.push_back(static_cast<uint8_t>(rng() % 3 ? rng() % 8 : rng()));
      }
    }
    accepted += CheckAnyPayload(p, numel, it);
    if (::testing::Test::HasFailure()) FAIL() << "iteration " << it;
  }
  // Some of the structured buffers must decode, or this test checks only the error paths.
  EXPECT_GT(accepted, 100);
}

class SparsePayloadMutationTest
    : public ::testing::TestWithParam<std::tuple<IndexCoding, ValueCoding>> {
 protected:
  std::vector<uint8_t> ValidPayload() {
    const auto [ic, vc] = GetParam();
    const Selection s = RandomSelection(5000, 60, vc, 99);
    return MustEncode(s.View(), ic, vc);
  }
};

TEST_P(SparsePayloadMutationTest, EveryTruncationIsAnError) {
  const std::vector<uint8_t> p = ValidPayload();
  ASSERT_TRUE(CheckAnyPayload(p, 5000, 1));
  for (size_t len = 0; len < p.size(); ++len) {
    const std::vector<uint8_t> cut(p.begin(), p.begin() + static_cast<std::ptrdiff_t>(len));
    GuardedAcc acc(5000, len);
    const std::vector<float> before = acc.Copy();
    const Status st = DecodeAdd(cut, 5000, acc.span());
    ASSERT_FALSE(st.ok()) << "prefix of " << len << " bytes";
    EXPECT_THAT(st.message(), HasSubstr("truncated")) << len;
    EXPECT_TRUE(SameBits(acc.Copy(), before));
    EXPECT_TRUE(acc.GuardsIntact());
  }
}

TEST_P(SparsePayloadMutationTest, RandomByteFlipsNeverCrash) {
  const std::vector<uint8_t> valid = ValidPayload();
  std::mt19937_64 rng(7 + static_cast<uint64_t>(std::get<1>(GetParam())));
  int accepted = 0, rejected = 0;
  for (int it = 0; it < 20000; ++it) {
    std::vector<uint8_t> p = valid;
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int f = 0; f < flips; ++f) {
      const size_t at = rng() % p.size();
      p[at] ^= static_cast<uint8_t>(1 + rng() % 255);
    }
    if (rng() % 8 == 0) p.resize(rng() % (p.size() + 1));  // and sometimes cut
    (CheckAnyPayload(p, 5000, it) ? accepted : rejected)++;
    if (::testing::Test::HasFailure()) FAIL() << "iteration " << it;
  }
  EXPECT_GT(rejected, 1000);
  EXPECT_GT(accepted, 100);  // flips of value bytes mostly decode
}

INSTANTIATE_TEST_SUITE_P(AllCodings, SparsePayloadMutationTest,
                         ::testing::Combine(::testing::ValuesIn(kIndexCodings),
                                            ::testing::ValuesIn(kValueCodings)),
                         [](const auto& info) {
                           return CodingName(std::get<0>(info.param), std::get<1>(info.param));
                         });

}  // namespace
}  // namespace sparsync::pipeline
