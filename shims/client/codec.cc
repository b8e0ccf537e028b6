#include "shims/client/codec.h"

#include <unistd.h>

#include <chrono>
#include <cstring>

namespace sparsync::client {
namespace {

// Copies a datagram of exactly sizeof(Msg) bytes into *out.
template <typename Msg>
Status CopyExact(const void* data, size_t size, uint16_t type, Incoming* out) {
  if (size != sizeof(Msg)) {
    return Status(SPARSYNC_ERR_INVALID, "malformed message of type " + std::to_string(type) + ": " +
                                            std::to_string(size) + " bytes, expected " +
                                            std::to_string(sizeof(Msg)));
  }
  Msg m;
  memcpy(&m, data, sizeof(m));
  *out = m;
  return Status::Ok();
}

}  // namespace

const char* StatusName(int32_t status) {
  switch (status) {
    case SPARSYNC_OK: return "OK";
    case SPARSYNC_ERR_INVALID: return "INVALID";
    case SPARSYNC_ERR_UNAVAILABLE: return "UNAVAILABLE";
    case SPARSYNC_ERR_TIMEOUT: return "TIMEOUT";
    case SPARSYNC_ERR_MISMATCH: return "MISMATCH";
    case SPARSYNC_ERR_ABORTED: return "ABORTED";
    case SPARSYNC_ERR_INTERNAL: return "INTERNAL";
    case SPARSYNC_ERR_PERMISSION: return "PERMISSION";
    default: return "UNKNOWN";
  }
}

sparsync_status ToStatus(int32_t status) {
  if (status <= SPARSYNC_OK || status > SPARSYNC_ERR_PERMISSION) return SPARSYNC_ERR_INTERNAL;
  return static_cast<sparsync_status>(status);
}

std::string BoundedString(const char* field, size_t size) {
  return std::string(field, strnlen(field, size));
}

Status EncodeHello(const std::string& job_token, uint32_t local_rank, sparsync_hello* out) {
  if (job_token.size() > SPARSYNC_MAX_TOKEN_BYTES) {
    return Status(SPARSYNC_ERR_INVALID, "SPARSYNC_JOB_TOKEN is longer than " +
                                            std::to_string(SPARSYNC_MAX_TOKEN_BYTES) + " bytes");
  }
  sparsync_hello m = NewMessage<sparsync_hello>(SPARSYNC_MSG_HELLO);
  m.local_rank = local_rank;
  m.pid = static_cast<int32_t>(getpid());
  m.token_len = static_cast<uint32_t>(job_token.size());
  memcpy(m.job_token, job_token.data(), job_token.size());
  *out = m;
  return Status::Ok();
}

Status WorldFromReply(const sparsync_hello_reply& r, uint32_t local_rank, sparsync_world* world) {
  if (r.size == 0 || r.rank >= r.size || r.local_size == 0 || r.local_rank >= r.local_size ||
      r.num_nodes == 0 || r.node_rank >= r.num_nodes || r.local_rank != local_rank) {
    return Status(SPARSYNC_ERR_UNAVAILABLE,
                  "malformed HELLO_REPLY (rank " + std::to_string(r.rank) + " of " +
                      std::to_string(r.size) + ", local rank " + std::to_string(r.local_rank) +
                      " of " + std::to_string(r.local_size) + ")");
  }
  *world = {r.rank, r.size, r.local_rank, r.local_size, r.node_rank, r.num_nodes};
  return Status::Ok();
}

Status EncodeRegister(const sparsync_tensor_spec& spec, sparsync_register_msg* out) {
  const size_t name_len = strlen(spec.name);
  const std::string name(spec.name, name_len);
  if (name_len == 0 || name_len > SPARSYNC_MAX_NAME_BYTES) {
    return Status(SPARSYNC_ERR_INVALID, "tensor name '" + name + "' must have 1.." +
                                            std::to_string(SPARSYNC_MAX_NAME_BYTES) + " bytes");
  }
  if (spec.op >= SPARSYNC_OP_COUNT || spec.dtype >= SPARSYNC_DTYPE_COUNT ||
      spec.reduce_op >= SPARSYNC_REDUCE_COUNT || spec.ndim > SPARSYNC_MAX_DIMS ||
      (spec.ndim != 0 && spec.shape == nullptr)) {
    return Status(SPARSYNC_ERR_INVALID, "tensor '" + name +
                                            "': invalid op, dtype, reduce op or more than " +
                                            std::to_string(SPARSYNC_MAX_DIMS) + " dimensions");
  }
  sparsync_register_msg m = NewMessage<sparsync_register_msg>(SPARSYNC_MSG_REGISTER);
  m.op = static_cast<uint8_t>(spec.op);
  m.dtype = static_cast<uint8_t>(spec.dtype);
  m.reduce_op = static_cast<uint8_t>(spec.reduce_op);
  m.ndim = static_cast<uint8_t>(spec.ndim);
  m.root_rank = spec.op == SPARSYNC_OP_BROADCAST ? spec.root_rank : 0;
  m.name_len = static_cast<uint32_t>(name_len);
  m.compressor = static_cast<uint8_t>(spec.compressor);
  m.density = spec.density;
  for (uint32_t d = 0; d < spec.ndim; ++d) {
    if (spec.shape[d] < 0) {
      return Status(SPARSYNC_ERR_INVALID, "tensor '" + name + "' has a negative dimension");
    }
    m.shape[d] = spec.shape[d];
  }
  memcpy(m.name, name.data(), name_len);
  if (spec.num_members != 0 && spec.members == nullptr) {
    return Status(SPARSYNC_ERR_INVALID, "tensor '" + name + "': num_members without members");
  }
  for (uint32_t i = 0; i < spec.num_members; ++i) {
    const int32_t r = spec.members[i];
    if (r < 0 || r >= static_cast<int32_t>(SPARSYNC_MAX_SET_RANKS) ||
        (i > 0 && r <= spec.members[i - 1])) {
      return Status(SPARSYNC_ERR_INVALID,
                    "tensor '" + name + "': a process set's ranks must be distinct, ascending "
                    "and below " + std::to_string(SPARSYNC_MAX_SET_RANKS));
    }
    m.members[r / 64] |= uint64_t{1} << (r % 64);
  }
  if (spec.group_size == 1 || spec.group_size > SPARSYNC_MAX_GROUP_SIZE ||
      (spec.group_size == 0) != (spec.group == 0)) {
    return Status(SPARSYNC_ERR_INVALID,
                  "tensor '" + name + "': a group has a key other than 0 and 2.." +
                      std::to_string(SPARSYNC_MAX_GROUP_SIZE) + " tensors");
  }
  m.group = spec.group;
  m.group_size = spec.group_size;
  *out = m;
  return Status::Ok();
}

sparsync_ready EncodeReady(uint32_t tensor_id, uint64_t round) {
  sparsync_ready m = NewMessage<sparsync_ready>(SPARSYNC_MSG_READY);
  m.tensor_id = tensor_id;
  m.round = round;
  // steady_clock is CLOCK_MONOTONIC on Linux, the clock the daemon times backward with.
  m.timestamp_ns = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                             std::chrono::steady_clock::now().time_since_epoch())
                                             .count());
  return m;
}

Status EncodeTimeline(const std::string& path, sparsync_timeline_msg* out) {
  *out = NewMessage<sparsync_timeline_msg>(SPARSYNC_MSG_TIMELINE);
  if (path.size() > SPARSYNC_MAX_PATH_BYTES || path.find('\0') != std::string::npos) {
    return Status(SPARSYNC_ERR_INVALID, "timeline path '" + path + "' is longer than " +
                                            std::to_string(SPARSYNC_MAX_PATH_BYTES) +
                                            " bytes or contains a NUL byte");
  }
  out->start = path.empty() ? 0 : 1;
  out->path_len = static_cast<uint32_t>(path.size());
  memcpy(out->path, path.data(), path.size());
  return Status::Ok();
}

Status Decode(const void* data, size_t size, Incoming* out) {
  sparsync_msg_header h;
  if (size < sizeof(h)) {
    return Status(SPARSYNC_ERR_INVALID, "malformed message: " + std::to_string(size) + " bytes");
  }
  memcpy(&h, data, sizeof(h));
  if (h.magic == SPARSYNC_INTAKE_MAGIC && h.version != SPARSYNC_INTAKE_VERSION) {
    return Status(SPARSYNC_ERR_PERMISSION,
                  "sparsyncd speaks intake protocol version " + std::to_string(h.version) +
                      ", this client library version " + std::to_string(SPARSYNC_INTAKE_VERSION) +
                      ": use the sparsync of the daemon's version");
  }
  if (h.magic != SPARSYNC_INTAKE_MAGIC || h.size != size || h.reserved != 0) {
    return Status(SPARSYNC_ERR_INVALID,
                  "malformed message header (magic, version " + std::to_string(h.version) +
                      ", size " + std::to_string(h.size) + " of " + std::to_string(size) + ")");
  }
  switch (h.type) {
    case SPARSYNC_MSG_HELLO_REPLY: return CopyExact<sparsync_hello_reply>(data, size, h.type, out);
    case SPARSYNC_MSG_REGISTER_REPLY:
      return CopyExact<sparsync_register_reply>(data, size, h.type, out);
    case SPARSYNC_MSG_DONE: return CopyExact<sparsync_done>(data, size, h.type, out);
    case SPARSYNC_MSG_TIMELINE_REPLY:
      return CopyExact<sparsync_timeline_reply>(data, size, h.type, out);
    case SPARSYNC_MSG_JOIN_REPLY: return CopyExact<sparsync_join_reply>(data, size, h.type, out);
    default:
      return Status(SPARSYNC_ERR_INVALID, "unexpected message type " + std::to_string(h.type));
  }
}

}  // namespace sparsync::client
