// The client's end of the intake wire format (proto/intake/wire.h): building the messages a
// worker sends and checking the ones the daemon sends. Pure functions, no I/O.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <variant>

#include "shims/client/include/sparsync/client.h"
#include "shims/client/status.h"

namespace sparsync::client {

// A zero-filled message of type `type` whose header is filled in.
template <typename Msg>
Msg NewMessage(sparsync_msg_type type) {
  Msg m{};
  m.header.magic = SPARSYNC_INTAKE_MAGIC;
  m.header.version = SPARSYNC_INTAKE_VERSION;
  m.header.type = static_cast<uint16_t>(type);
  m.header.size = static_cast<uint32_t>(sizeof(Msg));
  return m;
}

// "OK", "INVALID", ... for a wire status; "UNKNOWN" for anything else.
const char* StatusName(int32_t status);
// A failure status from the daemon as a sparsync_status; INTERNAL for OK or unknown values.
sparsync_status ToStatus(int32_t status);
// The text of a fixed-size, possibly unterminated, message field.
std::string BoundedString(const char* field, size_t size);

// HELLO of this process. INVALID when the token is longer than the wire allows.
Status EncodeHello(const std::string& job_token, uint32_t local_rank, sparsync_hello* out);
// The world of an OK HELLO_REPLY; an error (the daemon is broken) when its ranks make no sense
// or it does not echo `local_rank`.
Status WorldFromReply(const sparsync_hello_reply& reply, uint32_t local_rank,
                      sparsync_world* world);
// REGISTER for `spec` (host memory; CudaBuffer::Export adds the CUDA fields). INVALID, naming the
// tensor, for a bad name, op, dtype, reduce op or shape. REQUIRES: spec.name is not null.
// tensor_id is left 0 for the caller.
Status EncodeRegister(const sparsync_tensor_spec& spec, sparsync_register_msg* out);
// READY of round `round`, stamped with CLOCK_MONOTONIC now.
sparsync_ready EncodeReady(uint32_t tensor_id, uint64_t round);

// TIMELINE: start recording into `path`, or stop ("" ). INVALID for a path the wire cannot carry.
Status EncodeTimeline(const std::string& path, sparsync_timeline_msg* out);

// A message the daemon may send.
using Incoming = std::variant<sparsync_hello_reply, sparsync_register_reply, sparsync_done,
                              sparsync_timeline_reply, sparsync_join_reply>;

// Checks a datagram's header, type and size and copies it into *out. An error says what is
// malformed; the connection cannot be trusted after one.
Status Decode(const void* data, size_t size, Incoming* out);

}  // namespace sparsync::client
