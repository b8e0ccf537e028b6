// The sparse wire format (layout and contracts in sparse_payload.h).
//
// Decoding runs in two steps: Parse() checks every byte of the payload (header, every index,
// every value, bit padding, exact length) without writing anything, then ForEachCoordinate()
// re-reads the now trusted sections in one tight loop per coding pair. DecodeAdd never touches
// acc before Parse() succeeded.

#include "daemon/pipeline/sparse_payload.h"

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>

#include "kernels/dtype.h"
#include "kernels/pieces.h"

namespace sparsync::pipeline {
namespace {

using kernels::BitsToFloat;
using kernels::FloatBits;
using kernels::FloatToHalf;
using kernels::HalfToFloat;

constexpr uint8_t kMagic[4] = {'S', 'P', 'R', 'S'};
// |v| at or above this rounds to +-Inf in binary16 (65504 + half an ulp of 32).
constexpr float kHalfOverflow = 65520.0f;

// Little-endian loads and stores; compilers turn these into plain moves on little-endian hosts.
inline uint16_t LoadU16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
inline uint32_t LoadU32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}
inline float LoadF32(const uint8_t* p) { return BitsToFloat(LoadU32(p)); }
inline void StoreU16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}
inline void StoreU32(uint8_t* p, uint32_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
  p[2] = static_cast<uint8_t>(v >> 16);
  p[3] = static_cast<uint8_t>(v >> 24);
}
inline void StoreF32(uint8_t* p, float v) { StoreU32(p, FloatBits(v)); }

inline size_t VarintBytes(uint32_t v) {
  return 1 + (v >= (1u << 7)) + (v >= (1u << 14)) + (v >= (1u << 21)) + (v >= (1u << 28));
}
inline uint8_t* PutVarint(uint8_t* p, uint32_t v) {
  while (v >= 0x80) {
    *p++ = static_cast<uint8_t>(v | 0x80);
    v >>= 7;
  }
  *p++ = static_cast<uint8_t>(v);
  return p;
}
// REQUIRES: a varint that Parse() accepted starts at p.
inline uint32_t GetVarintTrusted(const uint8_t*& p) {
  uint32_t b = *p++;
  if (b < 0x80) return b;
  uint32_t v = b & 0x7F;
  int shift = 7;
  do {
    b = *p++;
    v |= (b & 0x7F) << shift;
    shift += 7;
  } while (b >= 0x80);
  return v;
}

inline size_t BitmapBytes(uint64_t bits) { return static_cast<size_t>((bits + 7) / 8); }
inline bool Bit(const uint8_t* bitmap, uint64_t j) { return (bitmap[j >> 3] >> (j & 7)) & 1u; }

size_t HeaderBytes(ValueCoding vc) {
  return kSparsePayloadHeaderBytes + (vc == ValueCoding::kSignScale ? kSignScaleHeaderBytes : 0);
}

size_t ValueBytes(ValueCoding vc, uint64_t k, uint64_t full) {
  switch (vc) {
    case ValueCoding::kFloat32:
      return 4 * k;
    case ValueCoding::kFloat16:
      return 2 * k;
    case ValueCoding::kSignScale:
      return 4 * full + BitmapBytes(k) + BitmapBytes(k - full);
  }
  return 0;
}

bool KnownIndexCoding(uint8_t c) { return c <= static_cast<uint8_t>(IndexCoding::kDeltaVarint); }
bool KnownValueCoding(uint8_t c) { return c <= static_cast<uint8_t>(ValueCoding::kSignScale); }

Status Corrupt(const std::string& what) { return InvalidArgument("sparse payload: " + what); }
Status BadInput(const std::string& what) { return InvalidArgument("sparse encode: " + what); }

std::string Str(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// A payload that passed Parse(): every section is in bounds and every value checked.
struct Layout {
  int64_t numel = 0;
  uint32_t k = 0;
  IndexCoding index_coding = IndexCoding::kRaw32;
  ValueCoding value_coding = ValueCoding::kFloat32;
  float scale = 0;
  uint32_t full = 0;
  const uint8_t* indices = nullptr;
  const uint8_t* values = nullptr;  // float32 / binary16 values; kSignScale: the full values
  const uint8_t* mask = nullptr;    // kSignScale only
  const uint8_t* signs = nullptr;   // kSignScale only
};

Status CheckRaw32Indices(const uint8_t* p, uint32_t k, int64_t numel) {
  int64_t prev = -1;
  for (uint32_t j = 0; j < k; ++j) {
    const int64_t i = static_cast<int32_t>(LoadU32(p + 4 * static_cast<size_t>(j)));
    if (i < 0 || i >= numel) {
      return Corrupt("index " + std::to_string(i) + " of coordinate " + std::to_string(j) +
                     " out of range for " + std::to_string(numel) + " elements");
    }
    if (i <= prev) {
      return Corrupt("indices not ascending at coordinate " + std::to_string(j) + " (" +
                     std::to_string(i) + " after " + std::to_string(prev) + ")");
    }
    prev = i;
  }
  return Status::Ok();
}

// Walks k varints from *p, not past end; on success *p is just after the last one.
Status CheckVarintIndices(const uint8_t** p_inout, const uint8_t* end, uint32_t k, int64_t numel) {
  const uint8_t* p = *p_inout;
  int64_t prev = -1;
  for (uint32_t j = 0; j < k; ++j) {
    uint32_t v = 0;
    for (int shift = 0;; shift += 7) {
      if (p == end) {
        return Corrupt("truncated in the varint of coordinate " + std::to_string(j) + " of " +
                       std::to_string(k));
      }
      const uint8_t b = *p++;
      if (shift == 28 && b > 0x0F) {
        return Corrupt("varint overflow at coordinate " + std::to_string(j) +
                       " (more than 32 bits)");
      }
      v |= static_cast<uint32_t>(b & 0x7F) << shift;
      if (b < 0x80) {
        if (b == 0 && shift > 0) {
          return Corrupt("non-canonical varint at coordinate " + std::to_string(j));
        }
        break;
      }
    }
    const int64_t i = prev + 1 + static_cast<int64_t>(v);
    if (i >= numel) {
      return Corrupt("index " + std::to_string(i) + " of coordinate " + std::to_string(j) +
                     " out of range for " + std::to_string(numel) + " elements");
    }
    prev = i;
  }
  *p_inout = p;
  return Status::Ok();
}

Status CheckFloat32Values(const uint8_t* p, uint32_t n) {
  for (uint32_t j = 0; j < n; ++j) {
    if ((LoadU32(p + 4 * static_cast<size_t>(j)) & 0x7F800000u) == 0x7F800000u) {
      return Corrupt("value " + std::to_string(j) + " is not finite");
    }
  }
  return Status::Ok();
}

Status CheckFloat16Values(const uint8_t* p, uint32_t n) {
  for (uint32_t j = 0; j < n; ++j) {
    if ((LoadU16(p + 2 * static_cast<size_t>(j)) & 0x7C00u) == 0x7C00u) {
      return Corrupt("value " + std::to_string(j) + " is not finite");
    }
  }
  return Status::Ok();
}

// Counts the set bits of a `bits`-bit bitmap; fails if a padding bit of the last byte is set.
Status CheckBitmap(const uint8_t* p, uint64_t bits, const char* what, uint64_t* set_bits) {
  const size_t bytes = BitmapBytes(bits);
  uint64_t count = 0;
  for (size_t b = 0; b < bytes; ++b) count += std::popcount(p[b]);
  if (bits % 8 != 0 && (p[bytes - 1] >> (bits % 8)) != 0) {
    return Corrupt(std::string("padding bits of the ") + what + " are not zero");
  }
  *set_bits = count;
  return Status::Ok();
}

Result<Layout> Parse(std::span<const uint8_t> payload) {
  const size_t size = payload.size();
  const uint8_t* const base = payload.data();
  if (size < kSparsePayloadHeaderBytes) {
    return Corrupt("truncated: " + std::to_string(size) + " bytes, the header needs " +
                   std::to_string(kSparsePayloadHeaderBytes));
  }
  if (std::memcmp(base, kMagic, sizeof kMagic) != 0) {
    return Corrupt("bad magic (not a sparse payload)");
  }
  if (base[4] != kSparsePayloadVersion) {
    return Corrupt("unsupported version " + std::to_string(base[4]) + " (this build reads " +
                   std::to_string(kSparsePayloadVersion) + ")");
  }
  if (!KnownIndexCoding(base[5])) return Corrupt("unknown index coding " + std::to_string(base[5]));
  if (!KnownValueCoding(base[6])) return Corrupt("unknown value coding " + std::to_string(base[6]));
  if (base[7] != 0) return Corrupt("reserved header byte is " + std::to_string(base[7]));

  Layout l;
  l.index_coding = static_cast<IndexCoding>(base[5]);
  l.value_coding = static_cast<ValueCoding>(base[6]);
  l.numel = LoadU32(base + 8);
  l.k = LoadU32(base + 12);
  if (l.numel > kMaxNumel) {
    return Corrupt("numel " + std::to_string(l.numel) + " exceeds " + std::to_string(kMaxNumel));
  }
  if (l.k > l.numel) {
    return Corrupt("k = " + std::to_string(l.k) + " exceeds numel = " + std::to_string(l.numel));
  }
  const size_t header = HeaderBytes(l.value_coding);
  if (size < header) {
    return Corrupt("truncated: " + std::to_string(size) + " bytes, the header needs " +
                   std::to_string(header));
  }
  if (l.value_coding == ValueCoding::kSignScale) {
    l.scale = LoadF32(base + 16);
    l.full = LoadU32(base + 20);
    if (!std::isfinite(l.scale) || std::signbit(l.scale)) {
      return Corrupt("sign-scale scale " + Str(l.scale) + " is not finite and >= 0");
    }
    if (l.full > l.k) {
      return Corrupt("full count " + std::to_string(l.full) +
                     " exceeds k = " + std::to_string(l.k));
    }
  }

  // Index section, then the exact length.
  const size_t value_bytes = ValueBytes(l.value_coding, l.k, l.full);
  const uint8_t* const end = base + size;
  const uint8_t* p = base + header;
  const size_t min_index_bytes =
      static_cast<size_t>(l.k) * (l.index_coding == IndexCoding::kRaw32 ? 4 : 1);
  l.indices = p;
  if (static_cast<size_t>(end - p) < min_index_bytes + value_bytes) {
    return Corrupt("truncated: " + std::to_string(size) + " bytes, " + std::to_string(l.k) +
                   " coordinates need at least " +
                   std::to_string(header + min_index_bytes + value_bytes));
  }
  if (l.index_coding == IndexCoding::kRaw32) {
    SPARSYNC_RETURN_IF_ERROR(CheckRaw32Indices(p, l.k, l.numel));
    p += min_index_bytes;
  } else {
    SPARSYNC_RETURN_IF_ERROR(CheckVarintIndices(&p, end, l.k, l.numel));
  }
  const size_t left = static_cast<size_t>(end - p);
  if (left < value_bytes) {
    return Corrupt("truncated: the value section has " + std::to_string(left) + " of " +
                   std::to_string(value_bytes) + " bytes");
  }
  if (left > value_bytes) {
    return Corrupt(std::to_string(left - value_bytes) + " trailing bytes after the value section");
  }

  // Value section.
  l.values = p;
  switch (l.value_coding) {
    case ValueCoding::kFloat32:
      SPARSYNC_RETURN_IF_ERROR(CheckFloat32Values(p, l.k));
      break;
    case ValueCoding::kFloat16:
      SPARSYNC_RETURN_IF_ERROR(CheckFloat16Values(p, l.k));
      break;
    case ValueCoding::kSignScale: {
      SPARSYNC_RETURN_IF_ERROR(CheckFloat32Values(p, l.full));
      l.mask = p + 4 * static_cast<size_t>(l.full);
      l.signs = l.mask + BitmapBytes(l.k);
      uint64_t set = 0, unused = 0;
      SPARSYNC_RETURN_IF_ERROR(CheckBitmap(l.mask, l.k, "full mask", &set));
      if (set != l.full) {
        return Corrupt("full mask has " + std::to_string(set) + " set bits, header says " +
                       std::to_string(l.full));
      }
      SPARSYNC_RETURN_IF_ERROR(CheckBitmap(l.signs, l.k - l.full, "sign bits", &unused));
      break;
    }
  }
  return l;
}

struct Raw32Indices {
  const uint8_t* p;
  int32_t Next() {
    const int32_t i = static_cast<int32_t>(LoadU32(p));
    p += 4;
    return i;
  }
};

struct VarintIndices {
  const uint8_t* p;
  int64_t prev = -1;
  int32_t Next() {
    prev += 1 + static_cast<int64_t>(GetVarintTrusted(p));
    return static_cast<int32_t>(prev);
  }
};

// Calls fn(index, value) for every coordinate in order. REQUIRES: l came from Parse().
template <typename Indices, typename Fn>
void ForEachValue(Indices indices, const Layout& l, Fn& fn) {
  const uint32_t k = l.k;
  const uint8_t* v = l.values;
  switch (l.value_coding) {
    case ValueCoding::kFloat32:
      for (uint32_t j = 0; j < k; ++j) fn(indices.Next(), LoadF32(v + 4 * static_cast<size_t>(j)));
      break;
    case ValueCoding::kFloat16:
      for (uint32_t j = 0; j < k; ++j) {
        fn(indices.Next(), HalfToFloat(LoadU16(v + 2 * static_cast<size_t>(j))));
      }
      break;
    case ValueCoding::kSignScale: {
      const float pos = l.scale, neg = -l.scale;
      uint64_t f = 0, s = 0;
      for (uint32_t j = 0; j < k; ++j) {
        float value;
        if (Bit(l.mask, j)) {
          value = LoadF32(v + 4 * f++);
        } else {
          value = Bit(l.signs, s++) ? neg : pos;
        }
        fn(indices.Next(), value);
      }
      break;
    }
  }
}

template <typename Fn>
void ForEachCoordinate(const Layout& l, Fn fn) {
  if (l.index_coding == IndexCoding::kRaw32) {
    ForEachValue(Raw32Indices{l.indices}, l, fn);
  } else {
    ForEachValue(VarintIndices{l.indices}, l, fn);
  }
}

}  // namespace

size_t MaxEncodedBytes(int64_t numel, int64_t k, IndexCoding index_coding,
                       ValueCoding value_coding) {
  const uint64_t kk = k > 0 ? static_cast<uint64_t>(k) : 0;
  // Every varint codes a value <= numel - 1 (a gap minus one, or the first index).
  const size_t varint_bytes =
      numel >= 1 && numel <= kMaxNumel ? VarintBytes(static_cast<uint32_t>(numel - 1)) : 5;
  const size_t index_bytes = (index_coding == IndexCoding::kRaw32 ? 4 : varint_bytes) * kk;
  // kSignScale: the coordinate of the smallest magnitude is always sign-coded, so at most k - 1
  // are full, and more full ones cost more.
  const size_t value_bytes = value_coding == ValueCoding::kSignScale
                                 ? (kk == 0 ? 0 : ValueBytes(value_coding, kk, kk - 1))
                                 : ValueBytes(value_coding, kk, 0);
  return HeaderBytes(value_coding) + index_bytes + value_bytes;
}

Result<size_t> Encode(const SparseTensor& tensor, IndexCoding index_coding,
                      ValueCoding value_coding, std::span<uint8_t> out) {
  if (!KnownIndexCoding(static_cast<uint8_t>(index_coding))) {
    return BadInput("unknown index coding " + std::to_string(static_cast<int>(index_coding)));
  }
  if (!KnownValueCoding(static_cast<uint8_t>(value_coding))) {
    return BadInput("unknown value coding " + std::to_string(static_cast<int>(value_coding)));
  }
  const int64_t numel = tensor.numel;
  if (numel < 0 || numel > kMaxNumel) {
    return BadInput("numel " + std::to_string(numel) + " is outside [0, " +
                    std::to_string(kMaxNumel) + "]");
  }
  const std::span<const int32_t> idx = tensor.indices;
  const std::span<const float> val = tensor.values;
  if (idx.size() != val.size()) {
    return BadInput(std::to_string(idx.size()) + " indices but " + std::to_string(val.size()) +
                    " values");
  }
  const size_t k = idx.size();
  if (static_cast<int64_t>(k) > numel) {
    return BadInput("k = " + std::to_string(k) + " exceeds numel = " + std::to_string(numel));
  }

  // Check everything and size the payload before writing a byte.
  size_t index_bytes = 4 * k;
  {
    int64_t prev = -1;
    size_t varint_bytes = 0;
    for (size_t j = 0; j < k; ++j) {
      const int64_t i = idx[j];
      if (i < 0 || i >= numel) {
        return BadInput("index " + std::to_string(i) + " of coordinate " + std::to_string(j) +
                        " out of range for " + std::to_string(numel) + " elements");
      }
      if (i <= prev) {
        return BadInput("indices not strictly ascending at coordinate " + std::to_string(j) + " (" +
                        std::to_string(i) + " after " + std::to_string(prev) + ")");
      }
      varint_bytes += VarintBytes(static_cast<uint32_t>(i - prev - 1));
      prev = i;
    }
    if (index_coding == IndexCoding::kDeltaVarint) index_bytes = varint_bytes;
  }
  float scale = 0;
  size_t full = 0;
  {
    float min_abs = INFINITY;
    for (size_t j = 0; j < k; ++j) {
      const float a = std::fabs(val[j]);
      if (!(a <= std::numeric_limits<float>::max())) {  // NaN or Inf
        return BadInput("value " + Str(val[j]) + " at index " + std::to_string(idx[j]) +
                        " is not finite");
      }
      if (value_coding == ValueCoding::kFloat16 && a >= kHalfOverflow) {
        return BadInput("value " + Str(val[j]) + " at index " + std::to_string(idx[j]) +
                        " overflows float16");
      }
      min_abs = a < min_abs ? a : min_abs;
    }
    if (value_coding == ValueCoding::kSignScale && k > 0) {
      scale = min_abs;
      const double limit = static_cast<double>(scale) * (1.0 + kSignScaleTolerance);
      for (size_t j = 0; j < k; ++j) full += static_cast<double>(std::fabs(val[j])) > limit;
    }
  }
  const size_t header = HeaderBytes(value_coding);
  const size_t total = header + index_bytes + ValueBytes(value_coding, k, full);
  if (out.size() < total) {
    return BadInput("output buffer has " + std::to_string(out.size()) +
                    " bytes, the payload needs " + std::to_string(total));
  }

  uint8_t* p = out.data();
  std::memcpy(p, kMagic, sizeof kMagic);
  p[4] = kSparsePayloadVersion;
  p[5] = static_cast<uint8_t>(index_coding);
  p[6] = static_cast<uint8_t>(value_coding);
  p[7] = 0;
  StoreU32(p + 8, static_cast<uint32_t>(numel));
  StoreU32(p + 12, static_cast<uint32_t>(k));
  if (value_coding == ValueCoding::kSignScale) {
    StoreF32(p + 16, scale);
    StoreU32(p + 20, static_cast<uint32_t>(full));
  }
  p += header;

  if (index_coding == IndexCoding::kRaw32) {
    for (size_t j = 0; j < k; ++j) StoreU32(p + 4 * j, static_cast<uint32_t>(idx[j]));
    p += 4 * k;
  } else {
    int64_t prev = -1;
    for (size_t j = 0; j < k; ++j) {
      p = PutVarint(p, static_cast<uint32_t>(idx[j] - prev - 1));
      prev = idx[j];
    }
  }

  switch (value_coding) {
    case ValueCoding::kFloat32:
      for (size_t j = 0; j < k; ++j) StoreF32(p + 4 * j, val[j]);
      break;
    case ValueCoding::kFloat16:
      for (size_t j = 0; j < k; ++j) StoreU16(p + 2 * j, FloatToHalf(val[j]));
      break;
    case ValueCoding::kSignScale: {
      uint8_t* const mask = p + 4 * full;
      uint8_t* const signs = mask + BitmapBytes(k);
      std::memset(mask, 0, BitmapBytes(k) + BitmapBytes(k - full));
      const double limit = static_cast<double>(scale) * (1.0 + kSignScaleTolerance);
      size_t f = 0, s = 0;
      for (size_t j = 0; j < k; ++j) {
        const float v = val[j];
        if (static_cast<double>(std::fabs(v)) > limit) {
          StoreF32(p + 4 * f++, v);
          mask[j >> 3] |= static_cast<uint8_t>(1u << (j & 7));
        } else {
          signs[s >> 3] |= static_cast<uint8_t>((std::signbit(v) ? 1u : 0u) << (s & 7));
          ++s;
        }
      }
      break;
    }
  }
  return total;
}

namespace {

// The layout of a payload that DecodeAdd may add into an accumulator of `acc_numel` elements.
Result<Layout> ParseFor(std::span<const uint8_t> payload, int64_t expected_numel,
                        int64_t acc_numel) {
  if (expected_numel < 0 || acc_numel != expected_numel) {
    return InvalidArgument("sparse payload: accumulator has " + std::to_string(acc_numel) +
                           " elements, expected " + std::to_string(expected_numel));
  }
  Result<Layout> parsed = Parse(payload);
  if (!parsed.ok()) return parsed.status();
  if (parsed->numel != expected_numel) {
    return Mismatch("sparse payload: describes a tensor of " + std::to_string(parsed->numel) +
                    " elements, expected " + std::to_string(expected_numel));
  }
  return parsed;
}

}  // namespace

Status DecodeAdd(std::span<const uint8_t> payload, int64_t expected_numel, std::span<float> acc) {
  Result<Layout> l = ParseFor(payload, expected_numel, static_cast<int64_t>(acc.size()));
  if (!l.ok()) return l.status();
  float* const a = acc.data();
  ForEachCoordinate(*l, [a](int32_t i, float v) { a[i] += v; });
  return Status::Ok();
}

Status DecodeAddPieces(std::span<const uint8_t> payload, int64_t expected_numel,
                       std::span<const std::span<float>> acc) {
  Result<Layout> l = ParseFor(payload, expected_numel, kernels::TotalElements(acc));
  if (!l.ok()) return l.status();
  kernels::PieceWalker<float> a(acc);  // the indices ascend: one walk over the pieces
  ForEachCoordinate(*l, [&a](int32_t i, float v) { a[i] += v; });
  return Status::Ok();
}

Result<DecodedSparse> Decode(std::span<const uint8_t> payload) {
  Result<Layout> parsed = Parse(payload);
  if (!parsed.ok()) return parsed.status();
  const Layout& l = parsed.value();
  DecodedSparse d;
  d.numel = l.numel;
  d.indices.resize(l.k);  // bounded by the payload size: Parse checked the exact length
  d.values.resize(l.k);
  int32_t* const idx = d.indices.data();
  float* const val = d.values.data();
  size_t j = 0;
  ForEachCoordinate(l, [&](int32_t i, float v) {
    idx[j] = i;
    val[j] = v;
    ++j;
  });
  return d;
}

}  // namespace sparsync::pipeline
