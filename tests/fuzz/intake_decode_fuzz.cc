// libFuzzer target: the intake decoder (daemon/intake/codec.h), every message type. The first
// byte says how many descriptors came along (0-2); the rest is one datagram as a worker sent it.
// Whatever Decode accepts must satisfy what the daemon relies on afterwards; whatever it refuses
// must say why, and a refused HELLO or REGISTER is classified without reading past the datagram.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "daemon/intake/codec.h"

namespace {

void Require(bool condition) {
  if (!condition) std::abort();
}

void CheckRegister(const sparsync_register_msg& r) {
  Require(r.tensor_id < SPARSYNC_MAX_TENSORS_PER_WORKER);
  Require(r.name_len >= 1 && r.name_len <= SPARSYNC_MAX_NAME_BYTES);
  Require(r.ndim <= SPARSYNC_MAX_DIMS);
  auto meta = sparsync::intake::MetaOf(r);
  Require(meta.ok());  // everything Decode accepts converts to the daemon's types
  Require(meta->name.size() == r.name_len);
  Require(meta->shape.size() == r.ndim);
  Require(meta->Bytes() <= sparsync::intake::kMaxTensorBytes);
  Require(meta->density >= 0.0f && meta->density <= 1.0f);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int fds = data[0] % 3;
  // A copy of exactly the datagram, so that AddressSanitizer sees any read past its end.
  std::vector<uint8_t> datagram(data + 1, data + size);
  const uint8_t* bytes = datagram.empty() ? nullptr : datagram.data();
  auto decoded = sparsync::intake::Decode(bytes, datagram.size(), fds);
  const sparsync::intake::Claim claim = sparsync::intake::ClaimOf(bytes, datagram.size());
  if (!decoded.ok()) {
    Require(!decoded.status().message().empty());
    return 0;
  }
  Require(fds == 0);
  Require(claim.type == 0 || claim.type == SPARSYNC_MSG_HELLO || claim.type == SPARSYNC_MSG_REGISTER);
  const sparsync::intake::Message& m = *decoded;
  if (auto* hello = std::get_if<sparsync_hello>(&m)) {
    Require(hello->token_len <= SPARSYNC_MAX_TOKEN_BYTES && hello->reserved == 0);
    Require(claim.type == SPARSYNC_MSG_HELLO);
  } else if (auto* reg = std::get_if<sparsync_register_msg>(&m)) {
    CheckRegister(*reg);
    Require(claim.type == SPARSYNC_MSG_REGISTER && claim.tensor_id == reg->tensor_id);
  } else if (auto* ready = std::get_if<sparsync_ready>(&m)) {
    Require(ready->round >= 1);
  } else if (auto* timeline = std::get_if<sparsync_timeline_msg>(&m)) {
    // A start names a file of exactly path_len bytes, no NUL inside; a stop names none.
    const std::string path = sparsync::intake::TimelinePath(*timeline);
    Require(timeline->start == 0 ? path.empty() : path.size() == timeline->path_len);
    Require(path.find('\0') == std::string::npos);
  }
  return 0;
}
