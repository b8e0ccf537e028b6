// libFuzzer target: the sparse payload decoder (daemon/pipeline/sparse_payload.h), the bytes a
// peer node sends in the exchange. Any bytes give OK or an error: never a read out of bounds, and
// an accumulator changed only by a payload that validates. What decodes re-encodes to a payload
// that decodes to the same coordinates.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "daemon/pipeline/sparse_payload.h"

namespace {

void Require(bool condition) {
  if (!condition) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace sparsync::pipeline;
  std::vector<uint8_t> payload(data, data + size);  // exact size for AddressSanitizer
  auto decoded = Decode(payload);
  // DecodeAdd agrees with Decode, and leaves the accumulator alone on an error.
  const int64_t numel = decoded.ok() ? decoded->numel : 64;
  if (numel > (int64_t{1} << 20)) return 0;  // a valid header may claim 2^31 elements
  std::vector<float> acc(static_cast<size_t>(numel), 0.5f);
  sparsync::Status added = DecodeAdd(payload, numel, acc);
  Require(added.ok() == decoded.ok());
  if (!decoded.ok()) {
    for (float v : acc) Require(v == 0.5f);
    return 0;
  }
  const DecodedSparse& d = *decoded;
  Require(d.indices.size() == d.values.size());
  for (size_t j = 0; j < d.indices.size(); ++j) {
    Require(d.indices[j] >= 0 && d.indices[j] < d.numel);
    Require(j == 0 || d.indices[j] > d.indices[j - 1]);
    Require(std::isfinite(d.values[j]));
  }
  // Round trip through the encoder with the payload's own codings (header bytes 5 and 6).
  const auto index_coding = static_cast<sparsync::IndexCoding>(payload[5]);
  const auto value_coding = static_cast<ValueCoding>(payload[6]);
  SparseTensor tensor{d.numel, d.indices, d.values};
  std::vector<uint8_t> again(MaxEncodedBytes(d.numel, static_cast<int64_t>(d.indices.size()),
                                             index_coding, value_coding));
  auto written = Encode(tensor, index_coding, value_coding, again);
  if (!written.ok()) return 0;  // e.g. a float16 payload's values re-coded lossily: not an error
  again.resize(*written);
  auto twice = Decode(again);
  Require(twice.ok());
  Require(twice->indices == d.indices);
  return 0;
}
