// Validation of intake messages (proto/intake/wire.h). Pure functions: every byte a worker sends
// passes through Decode before anything else looks at it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <variant>

#include "daemon/common/status.h"
#include "daemon/common/tensor_meta.h"
#include "proto/intake/wire.h"

namespace sparsync::intake {

// Limits the daemon enforces beyond the wire format's own.
inline constexpr uint64_t kMaxTensorBytes = 1ull << 40;  // 1 TiB: a safe upper bound on numel

using Message = std::variant<sparsync_hello, sparsync_register_msg, sparsync_ready,
                             sparsync_unregister_msg, sparsync_goodbye, sparsync_timeline_msg,
                             sparsync_join_msg>;

// Decodes one datagram a worker sent. `num_fds`: descriptors that came with it (workers never
// send any). Errors say what is wrong in words a shim author can act on.
Result<Message> Decode(const void* data, size_t size, int num_fds);

// What a datagram that Decode refused claims to be, so that the worker hears why (issue 16, D12):
// the server answers a refused HELLO with a HELLO_REPLY (whatever its version: the reply's header
// shows the daemon's) and a refused REGISTER of the right size with a REGISTER_REPLY for its
// tensor id. Anything else is closed without a reply.
struct Claim {
  uint16_t type = 0;       // SPARSYNC_MSG_HELLO, SPARSYNC_MSG_REGISTER, or 0
  uint32_t tensor_id = 0;  // REGISTER: the tensor id it names
};
Claim ClaimOf(const void* data, size_t size);

// The daemon's view of a REGISTER that Decode accepted: the wire numbers become the daemon's
// types here, at the intake edge (common/tensor_meta.h).
Result<TensorMeta> MetaOf(const sparsync_register_msg& msg);

// The file a TIMELINE that Decode accepted names ("" to stop).
std::string TimelinePath(const sparsync_timeline_msg& msg);

// Element size of a wire dtype, 0 if unknown.
size_t WireDTypeSize(uint32_t dtype);

// Fills the header of an outgoing message of type `type` and size `size`.
void FillHeader(sparsync_msg_header* header, sparsync_msg_type type, uint32_t size);

// Writes `text` (truncated) NUL-terminated into a fixed message field.
void CopyMessage(char (&field)[SPARSYNC_MAX_ERROR_BYTES], const std::string& text);

// Status -> sparsync_status.
int32_t WireStatus(const Status& status);

}  // namespace sparsync::intake
