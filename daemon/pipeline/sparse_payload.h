// SparsePayload: the wire format of one sparsified tensor (docs/algorithms.md §8):
// a fixed header, the indices, the values. Every payload is validated in
// full before anything is read out of it, so a corrupt or truncated buffer is an error Status,
// never an out-of-bounds access or a partial update.
//
// Layout (all integers little-endian, floats IEEE 754 binary32/binary16 little-endian):
//
//   offset size  field
//   0      4     magic: the bytes 'S' 'P' 'R' 'S'
//   4      1     version: 1
//   5      1     index coding (IndexCoding)
//   6      1     value coding (ValueCoding)
//   7      1     reserved, 0
//   8      4     numel: uint32, elements of the dense tensor, <= kMaxNumel (2^31)
//   12     4     k: uint32, coordinates sent, <= numel
//   -- only when value coding is kSignScale (the header is then 24 bytes, else 16):
//   16     4     scale: float32, finite and >= +0 (the shared magnitude 1/lambda)
//   20     4     full: uint32, coordinates sent with a float32 value, <= k
//
// then the index section (coordinates j = 0 .. k-1 in ascending index order):
//   kRaw32:       k x int32. Strictly ascending, each in [0, numel).
//   kDeltaVarint: k x LEB128 varint (7 bits per byte, low group first, high bit = "more"), of
//                 v_0 = i_0 and v_j = i_j - i_{j-1} - 1 (so ascending order is built in and a run
//                 of neighbours costs one byte each). At most 5 bytes, value < 2^32, canonical
//                 (no redundant trailing 0x80 .. 0x00 groups).
// then the value section:
//   kFloat32:   k x float32, finite.
//   kFloat16:   k x binary16, finite (a value that would round to +-Inf is refused by Encode).
//   kSignScale: full x float32 (the full coordinates' values, in coordinate order, finite), then a
//               mask of ceil(k/8) bytes (bit j%8 of byte j/8 set = coordinate j is full), then
//               ceil((k-full)/8) bytes of sign bits for the other coordinates in order (set =
//               negative). Unused high bits of the last mask and sign bytes are 0; the mask holds
//               exactly `full` set bits.
// The payload ends exactly there; trailing bytes are an error.
//
// kSignScale follows Wangni et al., NeurIPS 2018: every kept coordinate with p_i < 1 carries the
// same magnitude 1/lambda, so it needs only its index and a sign bit. Encode takes
// scale = min |v| over the selected values and sign-codes each value with
// |v| <= scale * (1 + kSignScaleTolerance); the others (p_i = 1) keep float32 values. Decoding
// gives +-scale for sign-coded coordinates. For a selection that is not Wangni's this is lossy.
//
// Thread-safety: every function is pure (no state); concurrent calls on distinct outputs are safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "daemon/common/config.h"
#include "daemon/common/status.h"

namespace sparsync::pipeline {

// Indices: sparsync::IndexCoding (common/config.h), one enum for the setting and the payload.
enum class ValueCoding : uint8_t { kFloat32 = 0, kFloat16 = 1, kSignScale = 2 };

// The largest numel a payload can describe: indices are int32.
inline constexpr int64_t kMaxNumel = int64_t{1} << 31;
inline constexpr uint8_t kSparsePayloadVersion = 1;
inline constexpr size_t kSparsePayloadHeaderBytes = 16;
inline constexpr size_t kSignScaleHeaderBytes = 8;  // scale + full, after the common header
// Relative tolerance of "equal to the smallest magnitude" for kSignScale (covers the rounding of
// g_i / p_i to float32 in the Wangni kernel).
inline constexpr double kSignScaleTolerance = 1e-5;

// A selection to encode. Not owned.
struct SparseTensor {
  int64_t numel = 0;
  std::span<const int32_t> indices;  // strictly ascending, each in [0, numel)
  std::span<const float> values;     // values[j] belongs to indices[j]; finite
};

// An upper bound on Encode's output for `k` coordinates of a tensor of `numel` elements (any
// index pattern); Encode never writes more. Inputs outside 0 <= k <= numel <= kMaxNumel give a
// bound for max(k, 0) coordinates of any tensor.
size_t MaxEncodedBytes(int64_t numel, int64_t k, IndexCoding index_coding,
                       ValueCoding value_coding);

// Writes the payload of `tensor` into the front of `out` and returns its length. Fails, writing
// nothing, with INVALID_ARGUMENT if numel is outside [0, kMaxNumel], the spans differ in length,
// k > numel, an index is out of range or not strictly ascending, a value is not finite, a
// kFloat16 value overflows binary16, a coding is unknown, or `out` is shorter than the payload
// (out.size() >= MaxEncodedBytes(...) always suffices).
Result<size_t> Encode(const SparseTensor& tensor, IndexCoding index_coding,
                      ValueCoding value_coding, std::span<uint8_t> out);

// Validates the whole payload (see the layout above) and adds each value into acc[index].
// REQUIRES nothing of `payload`: any bytes give either OK or an error. A payload that does not
// validate, describes a tensor of another size than expected_numel (MISMATCH), or an acc whose
// size is not expected_numel (INVALID_ARGUMENT) is an error and acc is left unchanged.
Status DecodeAdd(std::span<const uint8_t> payload, int64_t expected_numel, std::span<float> acc);
// DecodeAdd into an accumulator stored in pieces laid end to end (kernels/pieces.h): a merge
// group's tensors in buffers of their own. The same checks, with expected_numel the whole's size.
Status DecodeAddPieces(std::span<const uint8_t> payload, int64_t expected_numel,
                       std::span<const std::span<float>> acc);

// A decoded payload: indices strictly ascending, values as DecodeAdd would add them.
struct DecodedSparse {
  int64_t numel = 0;
  std::vector<int32_t> indices;
  std::vector<float> values;
};

// Decodes into vectors (tests, merge-and-reselect); the same validation as DecodeAdd.
Result<DecodedSparse> Decode(std::span<const uint8_t> payload);

}  // namespace sparsync::pipeline
