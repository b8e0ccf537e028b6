#include "daemon/intake/codec.h"

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstring>
#include <iterator>
#include <string>

namespace sparsync::intake {
namespace {

template <typename T>
Result<Message> Exact(const void* data, size_t size, const char* what) {
  if (size != sizeof(T)) {
    return InvalidArgument(std::string(what) + " message has " + std::to_string(size) +
                           " bytes, expected " + std::to_string(sizeof(T)));
  }
  T msg;
  std::memcpy(&msg, data, sizeof(T));
  return Message(msg);
}

bool AllZero(const uint8_t (&bytes)[SPARSYNC_CUDA_IPC_HANDLE_BYTES]) {
  for (uint8_t b : bytes) {
    if (b != 0) return false;
  }
  return true;
}

// The memory kind and, for CUDA tensors, the IPC fields (their contents are opaque here; the
// CUDA runtime checks them when the daemon opens them).
Status ValidateMemory(const sparsync_register_msg& r) {
  if (r.memory >= SPARSYNC_MEMORY_COUNT) {
    return InvalidArgument("unknown memory kind " + std::to_string(r.memory) +
                           " (0: host shared memory, 1: CUDA)");
  }
  if (r.memory == SPARSYNC_MEMORY_HOST) {
    if (r.cuda_device != 0 || r.cuda_offset != 0 || !AllZero(r.cuda_memory) ||
        !AllZero(r.cuda_ready_event)) {
      return InvalidArgument("a host tensor must leave the CUDA fields 0");
    }
    return Status::Ok();
  }
  if (r.op == SPARSYNC_OP_ALLGATHER) {
    return InvalidArgument("allgather of a CUDA tensor is not supported (its result has no "
                           "device buffer): gather through host memory");
  }
  if (r.cuda_device < 0 || r.cuda_device >= static_cast<int32_t>(SPARSYNC_MAX_CUDA_DEVICES)) {
    return InvalidArgument("CUDA device " + std::to_string(r.cuda_device) + " is not in [0, " +
                           std::to_string(SPARSYNC_MAX_CUDA_DEVICES) + ")");
  }
  if (r.cuda_offset > kMaxTensorBytes) {
    return InvalidArgument("CUDA offset " + std::to_string(r.cuda_offset) +
                           " is beyond any allocation (1 TiB)");
  }
  if (AllZero(r.cuda_memory)) {
    return InvalidArgument("the CUDA memory handle is empty: export the buffer with "
                           "cudaIpcGetMemHandle");
  }
  if (AllZero(r.cuda_ready_event)) {
    return InvalidArgument("the CUDA ready-event handle is empty: export an interprocess event "
                           "with cudaIpcGetEventHandle");
  }
  return Status::Ok();
}

Status ValidateRegister(const sparsync_register_msg& r) {
  if (r.tensor_id >= SPARSYNC_MAX_TENSORS_PER_WORKER) {
    return InvalidArgument("tensor id " + std::to_string(r.tensor_id) + " is not below " +
                           std::to_string(SPARSYNC_MAX_TENSORS_PER_WORKER));
  }
  if (r.op >= SPARSYNC_OP_COUNT) return InvalidArgument("unknown op " + std::to_string(r.op));
  if (r.dtype >= SPARSYNC_DTYPE_COUNT) {
    return InvalidArgument("unknown dtype " + std::to_string(r.dtype));
  }
  if (r.reduce_op >= SPARSYNC_REDUCE_COUNT) {
    return InvalidArgument("unknown reduce op " + std::to_string(r.reduce_op));
  }
  if (r.ndim > SPARSYNC_MAX_DIMS) {
    return InvalidArgument("ndim " + std::to_string(r.ndim) + " exceeds " +
                           std::to_string(SPARSYNC_MAX_DIMS));
  }
  if (r.name_len == 0 || r.name_len > SPARSYNC_MAX_NAME_BYTES) {
    return InvalidArgument("name length " + std::to_string(r.name_len) + " is not in [1, " +
                           std::to_string(SPARSYNC_MAX_NAME_BYTES) + "]");
  }
  if (std::memchr(r.name, '\0', r.name_len) != nullptr) {
    return InvalidArgument("the tensor name contains a NUL byte");
  }
  uint64_t numel = 1;
  for (uint32_t i = 0; i < SPARSYNC_MAX_DIMS; ++i) {
    if (i >= r.ndim) {
      if (r.shape[i] != 0) return InvalidArgument("shape entries past ndim must be 0");
      continue;
    }
    if (r.shape[i] < 0) return InvalidArgument("negative dimension " + std::to_string(r.shape[i]));
    uint64_t d = static_cast<uint64_t>(r.shape[i]);
    if (d != 0 && numel > kMaxTensorBytes / d) {
      return InvalidArgument("the tensor is larger than 1 TiB");
    }
    numel *= d;
  }
  if (numel * WireDTypeSize(r.dtype) > kMaxTensorBytes) {
    return InvalidArgument("the tensor is larger than 1 TiB");
  }
  if (r.op == SPARSYNC_OP_ALLGATHER && r.ndim == 0) {
    return InvalidArgument("allgather needs at least one dimension");
  }
  bool reduces = r.op == SPARSYNC_OP_ALLREDUCE || r.op == SPARSYNC_OP_GRADIENT;
  bool floating = r.dtype == SPARSYNC_FLOAT32 || r.dtype == SPARSYNC_FLOAT64 ||
                  r.dtype == SPARSYNC_FLOAT16 || r.dtype == SPARSYNC_BFLOAT16;
  if (reduces && r.dtype == SPARSYNC_UINT8) {
    return InvalidArgument("uint8 tensors can be gathered and broadcast, not reduced");
  }
  if (reduces && !floating && r.reduce_op == SPARSYNC_REDUCE_AVERAGE) {
    return InvalidArgument("an average needs a floating-point dtype; use Sum for integers");
  }
  if (r.op == SPARSYNC_OP_GRADIENT && !floating) {
    return InvalidArgument("gradients must be floating-point");
  }
  if (r.compressor >= SPARSYNC_COMPRESSOR_COUNT) {
    return InvalidArgument("unknown compressor " + std::to_string(r.compressor));
  }
  if (r.reserved[0] || r.reserved[1] || r.reserved2) {
    return InvalidArgument("reserved register fields are not 0");
  }
  if (!(r.density >= 0.0f && r.density <= 1.0f)) {  // also rejects NaN
    return InvalidArgument("density must be in [0, 1] (0: the daemon's SPARSYNC_DENSITY)");
  }
  if (r.op != SPARSYNC_OP_GRADIENT &&
      (r.compressor != SPARSYNC_COMPRESSOR_DEFAULT || r.density != 0.0f)) {
    return InvalidArgument("only gradients are compressed: explicit " +
                           std::string(r.op == SPARSYNC_OP_ALLREDUCE ? "allreduce" : "collectives") +
                           " are always exact");
  }
  if (r.op == SPARSYNC_OP_BROADCAST && r.root_rank < 0) {
    return InvalidArgument("negative broadcast root rank");
  }
  const bool in_set =
      std::any_of(std::begin(r.members), std::end(r.members), [](uint64_t w) { return w != 0; });
  if (in_set && r.op == SPARSYNC_OP_GRADIENT) {
    return InvalidArgument("gradients are exchanged among every rank: a process set takes "
                           "explicit collectives only (allreduce, allgather, broadcast)");
  }
  if (in_set && r.memory != SPARSYNC_MEMORY_HOST) {
    return InvalidArgument("a process set's collectives take host tensors only");
  }
  if (r.reserved3 != 0) return InvalidArgument("reserved3 must be 0");
  if (r.group_size == 1 || r.group_size > SPARSYNC_MAX_GROUP_SIZE ||
      (r.group_size == 0) != (r.group == 0)) {
    return InvalidArgument("a group has a key other than 0 and 2.." +
                           std::to_string(SPARSYNC_MAX_GROUP_SIZE) + " tensors");
  }
  if (r.group_size != 0 && r.op == SPARSYNC_OP_GRADIENT) {
    return InvalidArgument("gradients are grouped by the daemon's planner: a group takes "
                           "explicit collectives only");
  }
  return ValidateMemory(r);
}

Status ValidateTimeline(const sparsync_timeline_msg& t) {
  if (t.start > 1) return InvalidArgument("TIMELINE start must be 0 or 1");
  if (t.start == 0) {
    if (t.path_len != 0) return InvalidArgument("TIMELINE stop carries no path");
    return Status::Ok();
  }
  if (t.path_len == 0 || t.path_len > SPARSYNC_MAX_PATH_BYTES) {
    return InvalidArgument("timeline path length " + std::to_string(t.path_len) +
                           " is not in [1, " + std::to_string(SPARSYNC_MAX_PATH_BYTES) + "]");
  }
  if (std::memchr(t.path, '\0', t.path_len) != nullptr) {
    return InvalidArgument("the timeline path contains a NUL byte");
  }
  return Status::Ok();
}

}  // namespace

std::string TimelinePath(const sparsync_timeline_msg& msg) {
  return std::string(msg.path, std::min<size_t>(msg.path_len, sizeof(msg.path)));
}

Result<TensorMeta> MetaOf(const sparsync_register_msg& r) {
  TensorMeta m;
  m.name.assign(r.name, strnlen(r.name, std::min<size_t>(r.name_len, sizeof(r.name))));
  SPARSYNC_ASSIGN_OR_RETURN(m.op, OpFromWire(r.op));
  SPARSYNC_ASSIGN_OR_RETURN(m.dtype, DTypeFromWire(r.dtype));
  SPARSYNC_ASSIGN_OR_RETURN(m.reduce_op, ReduceOpFromWire(r.reduce_op));
  SPARSYNC_ASSIGN_OR_RETURN(m.compressor, CompressorFromWire(r.compressor));
  m.root_rank = m.op == CollectiveOp::kBroadcast ? r.root_rank : 0;
  m.shape.assign(r.shape, r.shape + std::min<uint32_t>(r.ndim, SPARSYNC_MAX_DIMS));
  m.density = r.density;
  for (uint32_t w = 0; w < SPARSYNC_SET_WORDS; ++w) {
    for (uint64_t bits = r.members[w]; bits != 0; bits &= bits - 1) {
      m.members.push_back(static_cast<int32_t>(w * 64 + std::countr_zero(bits)));
    }
  }
  m.group = r.group;
  m.group_size = r.group_size;
  return m;
}

size_t WireDTypeSize(uint32_t dtype) {
  return sparsync_dtype_size(dtype);
}

Result<Message> Decode(const void* data, size_t size, int num_fds) {
  if (num_fds != 0) return InvalidArgument("workers must not send file descriptors");
  if (size < sizeof(sparsync_msg_header)) {
    return InvalidArgument("message of " + std::to_string(size) + " bytes is shorter than a header");
  }
  sparsync_msg_header h;
  std::memcpy(&h, data, sizeof(h));
  if (h.magic != SPARSYNC_INTAKE_MAGIC) return InvalidArgument("bad magic: not a sparsync client");
  if (h.version != SPARSYNC_INTAKE_VERSION) {
    return PermissionDenied("intake protocol version " + std::to_string(h.version) +
                            ", the daemon speaks " + std::to_string(SPARSYNC_INTAKE_VERSION) +
                            ": use a shim of the daemon's version");
  }
  if (h.size != size) {
    return InvalidArgument("header says " + std::to_string(h.size) + " bytes but " +
                           std::to_string(size) + " arrived");
  }
  if (h.reserved != 0) return InvalidArgument("reserved header field is not 0");
  switch (h.type) {
    case SPARSYNC_MSG_HELLO: {
      auto m = Exact<sparsync_hello>(data, size, "HELLO");
      if (!m.ok()) return m;
      const sparsync_hello& hello = std::get<sparsync_hello>(*m);
      if (hello.token_len > SPARSYNC_MAX_TOKEN_BYTES) {
        return InvalidArgument("job token longer than 64 bytes");
      }
      if (hello.reserved != 0) return InvalidArgument("reserved HELLO field is not 0");
      return m;
    }
    case SPARSYNC_MSG_REGISTER: {
      auto m = Exact<sparsync_register_msg>(data, size, "REGISTER");
      if (!m.ok()) return m;
      SPARSYNC_RETURN_IF_ERROR(ValidateRegister(std::get<sparsync_register_msg>(*m)));
      return m;
    }
    case SPARSYNC_MSG_READY: {
      auto m = Exact<sparsync_ready>(data, size, "READY");
      if (m.ok() && std::get<sparsync_ready>(*m).round == 0) {
        return InvalidArgument("READY round 0: rounds start at 1");
      }
      return m;
    }
    case SPARSYNC_MSG_UNREGISTER: return Exact<sparsync_unregister_msg>(data, size, "UNREGISTER");
    case SPARSYNC_MSG_GOODBYE: return Exact<sparsync_goodbye>(data, size, "GOODBYE");
    case SPARSYNC_MSG_JOIN: return Exact<sparsync_join_msg>(data, size, "JOIN");
    case SPARSYNC_MSG_TIMELINE: {
      auto m = Exact<sparsync_timeline_msg>(data, size, "TIMELINE");
      if (!m.ok()) return m;
      SPARSYNC_RETURN_IF_ERROR(ValidateTimeline(std::get<sparsync_timeline_msg>(*m)));
      return m;
    }
    default:
      return InvalidArgument("message type " + std::to_string(h.type) +
                             " is not one a worker may send");
  }
}

Claim ClaimOf(const void* data, size_t size) {
  Claim claim;
  sparsync_msg_header h;
  if (size < sizeof(h)) return claim;
  std::memcpy(&h, data, sizeof(h));
  if (h.magic != SPARSYNC_INTAKE_MAGIC) return claim;
  if (h.type == SPARSYNC_MSG_HELLO) {
    claim.type = SPARSYNC_MSG_HELLO;
  } else if (h.type == SPARSYNC_MSG_REGISTER && h.version == SPARSYNC_INTAKE_VERSION &&
             h.size == size && size == sizeof(sparsync_register_msg)) {
    claim.type = SPARSYNC_MSG_REGISTER;
    std::memcpy(&claim.tensor_id,
                static_cast<const char*>(data) + offsetof(sparsync_register_msg, tensor_id),
                sizeof(claim.tensor_id));
  }
  return claim;
}

void FillHeader(sparsync_msg_header* header, sparsync_msg_type type, uint32_t size) {
  header->magic = SPARSYNC_INTAKE_MAGIC;
  header->version = SPARSYNC_INTAKE_VERSION;
  header->type = static_cast<uint16_t>(type);
  header->size = size;
  header->reserved = 0;
}

void CopyMessage(char (&field)[SPARSYNC_MAX_ERROR_BYTES], const std::string& text) {
  size_t n = std::min(text.size(), sizeof(field) - 1);
  std::memcpy(field, text.data(), n);
  field[n] = '\0';
}

int32_t WireStatus(const Status& status) {
  switch (status.code()) {
    case StatusCode::kOk: return SPARSYNC_OK;
    case StatusCode::kInvalidArgument: return SPARSYNC_ERR_INVALID;
    case StatusCode::kUnavailable: return SPARSYNC_ERR_UNAVAILABLE;
    case StatusCode::kDeadlineExceeded: return SPARSYNC_ERR_TIMEOUT;
    case StatusCode::kMismatch: return SPARSYNC_ERR_MISMATCH;
    case StatusCode::kAborted: return SPARSYNC_ERR_ABORTED;
    case StatusCode::kInternal: return SPARSYNC_ERR_INTERNAL;
    case StatusCode::kPermissionDenied: return SPARSYNC_ERR_PERMISSION;
  }
  return SPARSYNC_ERR_INTERNAL;
}

}  // namespace sparsync::intake
