// Implementation of the C ABI in include/sparsync/client.h over the intake wire format.
//
// One object per connection. Every call takes `mu_`. Waiting callers share the socket with a
// leader/follower scheme: at most one thread at a time receives (without holding `mu_`), records
// what arrived (replies, DONEs of any tensor) and wakes the others, so a thread waiting for one
// tensor never keeps another from posting or from seeing its own DONE.
#include "shims/client/include/sparsync/client.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "shims/client/cuda_buffer.h"
#include "shims/client/socket_io.h"

namespace sparsync::client {
namespace {

// How long register waits for its reply; the daemon answers at once unless it is wedged.
constexpr double kReplyTimeoutS = 300.0;
// The handshake gets at least this long even when the connect timeout is nearly used up.
constexpr double kMinHandshakeS = 5.0;

Clock::time_point DeadlineAfter(double seconds) {
  if (seconds < 0) return Clock::time_point::max();
  auto now = Clock::now();
  auto d = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  if (d > Clock::time_point::max() - now) return Clock::time_point::max();
  return now + d;
}

std::string BoundedString(const char* s, size_t max) { return std::string(s, strnlen(s, max)); }

sparsync_msg_header MakeHeader(sparsync_msg_type type, size_t size) {
  sparsync_msg_header h{};
  h.magic = SPARSYNC_INTAKE_MAGIC;
  h.version = SPARSYNC_INTAKE_VERSION;
  h.type = static_cast<uint16_t>(type);
  h.size = static_cast<uint32_t>(size);
  return h;
}

const char* StatusName(int32_t s) {
  switch (s) {
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

sparsync_status ToStatus(int32_t s) {
  if (s <= SPARSYNC_OK || s > SPARSYNC_ERR_PERMISSION) return SPARSYNC_ERR_INTERNAL;
  return static_cast<sparsync_status>(s);
}

struct TensorState {
  std::string name;
  sparsync_op op = SPARSYNC_OP_ALLREDUCE;
  void* data = nullptr;
  uint64_t bytes = 0;
  uint64_t posted = 0;  // last round posted
  uint64_t done = 0;    // last round whose DONE arrived
  int32_t status = SPARSYNC_OK;  // of round `done`
  std::string message;
  void* result = nullptr;  // ALLGATHER result of round `done`
  uint64_t result_bytes = 0;
  int64_t result_dim0 = 0;
  std::unique_ptr<CudaBuffer> cuda;  // CUDA tensors: the exported device buffer and its events
};

struct PendingRegister {
  bool arrived = false;
  int32_t status = SPARSYNC_OK;
  std::string message;
  void* data = nullptr;
  uint64_t bytes = 0;
  bool map = true;  // false for CUDA tensors: the daemon's staging region is not needed here
  uint8_t done_event[SPARSYNC_CUDA_IPC_HANDLE_BYTES] = {};
};

// The device buffer a CUDA registration exports.
struct CudaTarget {
  int32_t device;
  void* data;
};

}  // namespace

class Client {
 public:
  Client(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  ~Client();

  sparsync_status Handshake(const char* token, uint32_t local_rank, double timeout_s);
  sparsync_status World(sparsync_world* out);
  // `cuda` null: a host tensor in a shared region; else the device buffer to export.
  sparsync_status Register(const sparsync_tensor_spec* spec, uint32_t* id, void** data,
                           uint64_t* bytes, const CudaTarget* cuda = nullptr);
  // `stream` null: a host tensor; else (CUDA tensors) the stream to record the ready event on.
  sparsync_status PostReady(uint32_t id, const device::CudaStream* stream = nullptr);
  // `stream` null: a host tensor; else (CUDA tensors) the stream made to wait on the done event.
  sparsync_status WaitDone(uint32_t id, double timeout_s,
                           const device::CudaStream* stream = nullptr);
  sparsync_status AllgatherResult(uint32_t id, const void** data, uint64_t* bytes, int64_t* dim0);
  sparsync_status Unregister(uint32_t id);
  void Goodbye();
  const char* LastError() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_error_.c_str();
  }
  std::string TakeLastError() { return last_error_; }

 private:
  using Lock = std::unique_lock<std::mutex>;
  sparsync_status Fail(sparsync_status s, std::string message) {
    last_error_ = std::move(message);
    return s;
  }
  sparsync_status Broken() { return Fail(SPARSYNC_ERR_UNAVAILABLE, broken_reason_); }
  // The tensor's memory kind must match the call: CUDA tensors go through the _cuda calls.
  sparsync_status CheckMemory(const TensorState& t, bool cuda_call, const char* what);
  void MarkBroken(const std::string& reason);
  sparsync_status Send(const void* msg, size_t bytes);
  // Receives until `satisfied()` holds or `deadline` passes; `what` names the wait in errors.
  sparsync_status WaitUntil(Lock& lock, const std::function<bool()>& satisfied,
                            Clock::time_point deadline, double timeout_s, const std::string& what);
  void Dispatch(const char* buf, size_t n, ReceivedFds* fds);
  void OnRegisterReply(const sparsync_register_reply& m, ReceivedFds* fds);
  void OnDone(const sparsync_done& m, ReceivedFds* fds);
  void ReleaseResult(TensorState* t);
  bool AllocateId(uint32_t* id);

  std::mutex mu_;
  std::condition_variable cv_;
  int fd_;
  const std::string path_;
  bool reading_ = false;
  bool broken_ = false;
  std::string broken_reason_;
  std::string job_error_;  // last error DONE that named no tensor of ours
  std::string last_error_;
  sparsync_world world_{};
  sparsync_hello_reply hello_reply_{};
  bool hello_arrived_ = false;
  uint32_t next_id_ = 0;
  std::unordered_map<uint32_t, TensorState> tensors_;
  std::unordered_map<uint32_t, PendingRegister> pending_;
  std::unordered_set<uint32_t> retired_;  // unregistered with a round possibly in flight
  std::shared_ptr<const device::CudaRuntime> cuda_;  // loaded at the first CUDA registration
};

sparsync_status Client::CheckMemory(const TensorState& t, bool cuda_call, const char* what) {
  if ((t.cuda != nullptr) == cuda_call) return SPARSYNC_OK;
  return Fail(SPARSYNC_ERR_INVALID, std::string(what) + ": tensor '" + t.name + "' is a " +
                                        (t.cuda ? "CUDA tensor; use the _cuda variant"
                                                : "host tensor; use the plain call"));
}

Client::~Client() {
  for (auto& [id, t] : tensors_) {
    UnmapRegion(t.data, t.bytes);
    ReleaseResult(&t);
  }
  for (auto& [id, p] : pending_) UnmapRegion(p.data, p.bytes);
  CloseFd(fd_);
}

void Client::MarkBroken(const std::string& reason) {
  if (broken_) return;
  broken_ = true;
  broken_reason_ = "connection to sparsyncd at '" + path_ + "' lost: " + reason;
  if (!job_error_.empty()) broken_reason_ += " (last error from the daemon: " + job_error_ + ")";
  cv_.notify_all();
}

sparsync_status Client::Send(const void* msg, size_t bytes) {
  if (broken_) return Broken();
  IoError e = SendDatagram(fd_, msg, bytes);
  if (!e.ok) {
    MarkBroken(e.message);
    return Broken();
  }
  return SPARSYNC_OK;
}

sparsync_status Client::WaitUntil(Lock& lock, const std::function<bool()>& satisfied,
                                  Clock::time_point deadline, double timeout_s,
                                  const std::string& what) {
  auto timeout = [&] {
    char buf[64];
    snprintf(buf, sizeof(buf), "%.1f", timeout_s);
    return Fail(SPARSYNC_ERR_TIMEOUT, "timed out after " + std::string(buf) + " s waiting for " +
                                          what + " from sparsyncd at '" + path_ + "'");
  };
  while (!satisfied()) {
    if (broken_) return Broken();
    if (reading_) {
      if (deadline == Clock::time_point::max()) {
        cv_.wait(lock);
      } else if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && !satisfied() &&
                 !broken_) {
        return timeout();
      }
      continue;
    }
    reading_ = true;
    lock.unlock();
    alignas(8) char buf[SPARSYNC_MAX_MESSAGE_BYTES];
    size_t n = 0;
    ReceivedFds fds;
    IoError e = ReceiveDatagram(fd_, buf, sizeof(buf), deadline, &n, &fds);
    lock.lock();
    reading_ = false;
    cv_.notify_all();
    if (e.timed_out) {
      if (satisfied()) break;
      return timeout();
    }
    if (!e.ok) {
      MarkBroken(e.message);
      return Broken();
    }
    Dispatch(buf, n, &fds);
  }
  return SPARSYNC_OK;
}

void Client::Dispatch(const char* buf, size_t n, ReceivedFds* fds) {
  sparsync_msg_header h;
  if (n < sizeof(h)) return MarkBroken("malformed message: " + std::to_string(n) + " bytes");
  memcpy(&h, buf, sizeof(h));
  if (h.magic != SPARSYNC_INTAKE_MAGIC || h.version != SPARSYNC_INTAKE_VERSION ||
      h.size != n || h.reserved != 0) {
    return MarkBroken("malformed message header (magic, version " + std::to_string(h.version) +
                      ", size " + std::to_string(h.size) + " of " + std::to_string(n) + ")");
  }
  auto expect = [&](size_t size) {
    if (n == size) return true;
    MarkBroken("malformed message of type " + std::to_string(h.type) + ": " + std::to_string(n) +
               " bytes, expected " + std::to_string(size));
    return false;
  };
  switch (h.type) {
    case SPARSYNC_MSG_HELLO_REPLY:
      if (!expect(sizeof(sparsync_hello_reply))) return;
      if (hello_arrived_ || fds->size() != 0) return MarkBroken("unexpected HELLO_REPLY");
      memcpy(&hello_reply_, buf, sizeof(hello_reply_));
      hello_arrived_ = true;
      return;
    case SPARSYNC_MSG_REGISTER_REPLY: {
      if (!expect(sizeof(sparsync_register_reply))) return;
      sparsync_register_reply m;
      memcpy(&m, buf, sizeof(m));
      return OnRegisterReply(m, fds);
    }
    case SPARSYNC_MSG_DONE: {
      if (!expect(sizeof(sparsync_done))) return;
      sparsync_done m;
      memcpy(&m, buf, sizeof(m));
      return OnDone(m, fds);
    }
    default:
      return MarkBroken("unexpected message type " + std::to_string(h.type));
  }
}

void Client::OnRegisterReply(const sparsync_register_reply& m, ReceivedFds* fds) {
  auto it = pending_.find(m.tensor_id);
  if (it == pending_.end() || it->second.arrived) {
    return MarkBroken("REGISTER_REPLY for tensor id " + std::to_string(m.tensor_id) +
                      " that has no pending registration");
  }
  PendingRegister& p = it->second;
  p.arrived = true;
  p.status = m.status;
  p.message = BoundedString(m.message, sizeof(m.message));
  if (m.status != SPARSYNC_OK) {
    if (fds->size() != 0) return MarkBroken("failed REGISTER_REPLY carries a descriptor");
    return;
  }
  if (fds->size() != 1) return MarkBroken("REGISTER_REPLY without exactly one descriptor");
  int fd = fds->Take();
  if (!p.map) {
    CloseFd(fd);
    memcpy(p.done_event, m.cuda_done_event, sizeof(p.done_event));
    return;
  }
  IoError e = MapRegion(fd, m.region_bytes, &p.data);
  CloseFd(fd);
  if (!e.ok) return MarkBroken(e.message);
  p.bytes = m.region_bytes;
}

void Client::OnDone(const sparsync_done& m, ReceivedFds* fds) {
  std::string message = BoundedString(m.message, sizeof(m.message));
  auto it = tensors_.find(m.tensor_id);
  if (it == tensors_.end() || retired_.count(m.tensor_id) != 0) {
    if (m.status != SPARSYNC_OK) {
      job_error_ = message;
      cv_.notify_all();
      return;
    }
    if (retired_.count(m.tensor_id) != 0) return;  // a late DONE of an unregistered tensor
    return MarkBroken("DONE for unknown tensor id " + std::to_string(m.tensor_id));
  }
  TensorState& t = it->second;
  if ((m.round <= t.done || m.round > t.posted) && m.status != SPARSYNC_OK && fds->size() == 0) {
    job_error_ = message;  // a job-wide error delivered to a tensor with nothing in flight
    cv_.notify_all();
    return;
  }
  if (m.round <= t.done || m.round > t.posted) {
    return MarkBroken("DONE for tensor '" + t.name + "' round " + std::to_string(m.round) +
                      ", but rounds " + std::to_string(t.done + 1) + ".." +
                      std::to_string(t.posted) + " are in flight");
  }
  ReleaseResult(&t);
  t.status = m.status;
  t.message = message.empty() && m.status != SPARSYNC_OK
                  ? std::string("sparsyncd reported ") + StatusName(m.status)
                  : message;
  if (m.status == SPARSYNC_OK && t.op == SPARSYNC_OP_ALLGATHER) {
    if (fds->size() != 1) return MarkBroken("allgather DONE without exactly one descriptor");
    int fd = fds->Take();
    IoError e = MapRegion(fd, m.result_bytes, &t.result);
    CloseFd(fd);
    if (!e.ok) return MarkBroken(e.message);
    t.result_bytes = m.result_bytes;
    t.result_dim0 = m.result_dim0;
  } else if (fds->size() != 0) {
    return MarkBroken("DONE for tensor '" + t.name + "' carries an unexpected descriptor");
  }
  t.done = m.round;
  cv_.notify_all();
}

void Client::ReleaseResult(TensorState* t) {
  UnmapRegion(t->result, t->result_bytes);
  t->result = nullptr;
  t->result_bytes = 0;
  t->result_dim0 = 0;
}

sparsync_status Client::Handshake(const char* token, uint32_t local_rank, double timeout_s) {
  Lock lock(mu_);
  sparsync_hello m{};
  m.header = MakeHeader(SPARSYNC_MSG_HELLO, sizeof(m));
  m.local_rank = local_rank;
  m.pid = static_cast<int32_t>(getpid());
  size_t len = token == nullptr ? 0 : strlen(token);
  if (len > SPARSYNC_MAX_TOKEN_BYTES) {
    return Fail(SPARSYNC_ERR_INVALID, "SPARSYNC_JOB_TOKEN is longer than " +
                                          std::to_string(SPARSYNC_MAX_TOKEN_BYTES) + " bytes");
  }
  m.token_len = static_cast<uint32_t>(len);
  if (len != 0) memcpy(m.job_token, token, len);
  if (sparsync_status s = Send(&m, sizeof(m)); s != SPARSYNC_OK) return s;
  double wait_s = std::max(timeout_s, kMinHandshakeS);
  sparsync_status s = WaitUntil(
      lock, [&] { return hello_arrived_; }, DeadlineAfter(wait_s), wait_s, "the handshake reply");
  if (s != SPARSYNC_OK) return s;
  const sparsync_hello_reply& r = hello_reply_;
  if (r.status != SPARSYNC_OK) {
    return Fail(ToStatus(r.status), "sparsyncd at '" + path_ + "' refused this worker: " +
                                        BoundedString(r.message, sizeof(r.message)));
  }
  if (r.size == 0 || r.rank >= r.size || r.local_size == 0 || r.local_rank >= r.local_size ||
      r.num_nodes == 0 || r.node_rank >= r.num_nodes || r.local_rank != local_rank) {
    MarkBroken("malformed HELLO_REPLY (rank " + std::to_string(r.rank) + " of " +
               std::to_string(r.size) + ", local rank " + std::to_string(r.local_rank) + " of " +
               std::to_string(r.local_size) + ")");
    return Broken();
  }
  world_ = {r.rank, r.size, r.local_rank, r.local_size, r.node_rank, r.num_nodes};
  return SPARSYNC_OK;
}

sparsync_status Client::World(sparsync_world* out) {
  std::lock_guard<std::mutex> lock(mu_);
  *out = world_;
  return SPARSYNC_OK;
}

bool Client::AllocateId(uint32_t* id) {
  for (uint32_t i = 0; i < SPARSYNC_MAX_TENSORS_PER_WORKER; ++i) {
    uint32_t candidate = next_id_;
    next_id_ = (next_id_ + 1) % SPARSYNC_MAX_TENSORS_PER_WORKER;
    if (tensors_.count(candidate) == 0 && pending_.count(candidate) == 0) {
      retired_.erase(candidate);
      *id = candidate;
      return true;
    }
  }
  return false;
}

sparsync_status Client::Register(const sparsync_tensor_spec* spec, uint32_t* id, void** data,
                                 uint64_t* bytes, const CudaTarget* cuda) {
  Lock lock(mu_);
  if (broken_) return Broken();
  if (spec == nullptr || spec->name == nullptr || id == nullptr || data == nullptr ||
      bytes == nullptr) {
    return Fail(SPARSYNC_ERR_INVALID, "sparsync_register_tensor: null argument");
  }
  size_t name_len = strlen(spec->name);
  std::string name(spec->name, name_len);
  if (name_len == 0 || name_len > SPARSYNC_MAX_NAME_BYTES) {
    return Fail(SPARSYNC_ERR_INVALID, "tensor name '" + name + "' must have 1.." +
                                          std::to_string(SPARSYNC_MAX_NAME_BYTES) + " bytes");
  }
  if (spec->op >= SPARSYNC_OP_COUNT || spec->dtype >= SPARSYNC_DTYPE_COUNT ||
      spec->reduce_op >= SPARSYNC_REDUCE_COUNT || spec->ndim > SPARSYNC_MAX_DIMS ||
      (spec->ndim != 0 && spec->shape == nullptr)) {
    return Fail(SPARSYNC_ERR_INVALID, "tensor '" + name +
                                          "': invalid op, dtype, reduce op or more than " +
                                          std::to_string(SPARSYNC_MAX_DIMS) + " dimensions");
  }
  sparsync_register_msg m{};
  m.header = MakeHeader(SPARSYNC_MSG_REGISTER, sizeof(m));
  m.op = static_cast<uint8_t>(spec->op);
  m.dtype = static_cast<uint8_t>(spec->dtype);
  m.reduce_op = static_cast<uint8_t>(spec->reduce_op);
  m.ndim = static_cast<uint8_t>(spec->ndim);
  m.root_rank = spec->op == SPARSYNC_OP_BROADCAST ? spec->root_rank : 0;
  m.name_len = static_cast<uint32_t>(name_len);
  m.compressor = static_cast<uint8_t>(spec->compressor);
  m.density = spec->density;
  for (uint32_t d = 0; d < spec->ndim; ++d) {
    if (spec->shape[d] < 0) {
      return Fail(SPARSYNC_ERR_INVALID, "tensor '" + name + "' has a negative dimension");
    }
    m.shape[d] = spec->shape[d];
  }
  memcpy(m.name, name.data(), name_len);
  std::unique_ptr<CudaBuffer> buffer;
  if (cuda != nullptr) {
    std::string error;
    if (!cuda_) {
      const char* path = getenv("SPARSYNC_CUDART");
      cuda_ = device::LoadCudaRuntime(path ? path : "", &error);
      if (!cuda_) {
        return Fail(SPARSYNC_ERR_UNAVAILABLE, "tensor '" + name + "' is on CUDA device " +
                                                  std::to_string(cuda->device) +
                                                  " but the sparsync client cannot use CUDA: " +
                                                  error);
      }
    }
    uint64_t numel = 1;
    for (uint32_t d = 0; d < spec->ndim; ++d) numel *= static_cast<uint64_t>(spec->shape[d]);
    buffer = CudaBuffer::Export(cuda_, cuda->device, cuda->data,
                                numel * sparsync_dtype_size(spec->dtype), &m, &error);
    if (!buffer) return Fail(SPARSYNC_ERR_INVALID, "tensor '" + name + "': " + error);
  }
  if (!AllocateId(&m.tensor_id)) {
    return Fail(SPARSYNC_ERR_INVALID, "more than " +
                                          std::to_string(SPARSYNC_MAX_TENSORS_PER_WORKER) +
                                          " tensors registered by this worker");
  }
  const uint32_t tid = m.tensor_id;
  pending_[tid] = PendingRegister{};
  pending_[tid].map = cuda == nullptr;
  if (sparsync_status s = Send(&m, sizeof(m)); s != SPARSYNC_OK) {
    pending_.erase(tid);
    return s;
  }
  sparsync_status s = WaitUntil(
      lock, [&] { return pending_[tid].arrived; }, DeadlineAfter(kReplyTimeoutS), kReplyTimeoutS,
      "the registration of tensor '" + name + "'");
  PendingRegister p = pending_[tid];
  pending_.erase(tid);
  if (s != SPARSYNC_OK) {
    UnmapRegion(p.data, p.bytes);
    return s;
  }
  if (p.status != SPARSYNC_OK) {
    return Fail(ToStatus(p.status), p.message.empty() ? "registration of tensor '" + name +
                                                            "' refused: " + StatusName(p.status)
                                                      : p.message);
  }
  if (buffer) {
    std::string error;
    if (!buffer->OpenDone(p.done_event, &error)) {
      sparsync_unregister_msg u{};
      u.header = MakeHeader(SPARSYNC_MSG_UNREGISTER, sizeof(u));
      u.tensor_id = tid;
      (void)Send(&u, sizeof(u));
      return Fail(SPARSYNC_ERR_INTERNAL, "tensor '" + name + "': " + error);
    }
  }
  TensorState& t = tensors_[tid];
  t.name = name;
  t.op = spec->op;
  t.data = p.data;
  t.bytes = p.bytes;
  t.cuda = std::move(buffer);
  *id = tid;
  *data = p.data;
  *bytes = p.bytes;
  return SPARSYNC_OK;
}

sparsync_status Client::PostReady(uint32_t id, const device::CudaStream* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_) return Broken();
  auto it = tensors_.find(id);
  if (it == tensors_.end()) {
    return Fail(SPARSYNC_ERR_INVALID, "post_ready: tensor id " + std::to_string(id) +
                                          " is not registered");
  }
  TensorState& t = it->second;
  if (sparsync_status s = CheckMemory(t, stream != nullptr, "post_ready"); s != SPARSYNC_OK) {
    return s;
  }
  std::string error;
  if (t.cuda && !t.cuda->RecordReady(*stream, &error)) {
    return Fail(SPARSYNC_ERR_INTERNAL, "tensor '" + t.name + "': " + error);
  }
  ReleaseResult(&t);  // the previous allgather result is invalid from now on
  sparsync_ready m{};
  m.header = MakeHeader(SPARSYNC_MSG_READY, sizeof(m));
  m.tensor_id = id;
  m.round = t.posted + 1;
  m.timestamp_ns = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                             Clock::now().time_since_epoch())
                                             .count());
  if (sparsync_status s = Send(&m, sizeof(m)); s != SPARSYNC_OK) return s;
  t.posted = m.round;
  return SPARSYNC_OK;
}

sparsync_status Client::WaitDone(uint32_t id, double timeout_s, const device::CudaStream* stream) {
  Lock lock(mu_);
  auto it = tensors_.find(id);
  if (it == tensors_.end()) {
    return Fail(SPARSYNC_ERR_INVALID, "wait_done: tensor id " + std::to_string(id) +
                                          " is not registered");
  }
  if (sparsync_status s = CheckMemory(it->second, stream != nullptr, "wait_done");
      s != SPARSYNC_OK) {
    return s;
  }
  if (it->second.posted == 0) {
    return Fail(SPARSYNC_ERR_INVALID, "wait_done: tensor '" + it->second.name +
                                          "' was never posted");
  }
  const std::string name = it->second.name;
  sparsync_status s = WaitUntil(
      lock,
      [&] {
        auto t = tensors_.find(id);
        return t == tensors_.end() || t->second.done == t->second.posted;
      },
      DeadlineAfter(timeout_s), timeout_s, "the result of tensor '" + name + "'");
  if (s != SPARSYNC_OK) return s;
  it = tensors_.find(id);
  if (it == tensors_.end()) {
    return Fail(SPARSYNC_ERR_INVALID, "tensor '" + name + "' was unregistered while waiting");
  }
  if (it->second.status != SPARSYNC_OK) return Fail(ToStatus(it->second.status), it->second.message);
  std::string error;
  if (it->second.cuda && !it->second.cuda->StreamWaitDone(*stream, &error)) {
    return Fail(SPARSYNC_ERR_INTERNAL, "tensor '" + name + "': " + error);
  }
  return SPARSYNC_OK;
}

sparsync_status Client::AllgatherResult(uint32_t id, const void** data, uint64_t* bytes,
                                        int64_t* dim0) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tensors_.find(id);
  if (it == tensors_.end() || it->second.op != SPARSYNC_OP_ALLGATHER) {
    return Fail(SPARSYNC_ERR_INVALID, "allgather_result: tensor id " + std::to_string(id) +
                                          " is not a registered allgather tensor");
  }
  const TensorState& t = it->second;
  if (t.posted == 0 || t.done != t.posted || t.status != SPARSYNC_OK || t.result == nullptr) {
    return Fail(SPARSYNC_ERR_INVALID, "allgather_result: tensor '" + t.name +
                                          "' has no successful result to read");
  }
  *data = t.result;
  *bytes = t.result_bytes;
  *dim0 = t.result_dim0;
  return SPARSYNC_OK;
}

sparsync_status Client::Unregister(uint32_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tensors_.find(id);
  if (it == tensors_.end()) {
    return Fail(SPARSYNC_ERR_INVALID, "unregister: tensor id " + std::to_string(id) +
                                          " is not registered");
  }
  TensorState& t = it->second;
  if (t.done != t.posted) retired_.insert(id);
  UnmapRegion(t.data, t.bytes);
  ReleaseResult(&t);
  tensors_.erase(it);
  cv_.notify_all();
  if (broken_) return SPARSYNC_OK;  // nothing to tell a daemon that is gone
  sparsync_unregister_msg m{};
  m.header = MakeHeader(SPARSYNC_MSG_UNREGISTER, sizeof(m));
  m.tensor_id = id;
  return Send(&m, sizeof(m));
}

void Client::Goodbye() {
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_) return;
  sparsync_goodbye m{};
  m.header = MakeHeader(SPARSYNC_MSG_GOODBYE, sizeof(m));
  (void)SendDatagram(fd_, &m, sizeof(m));
}

}  // namespace sparsync::client

using sparsync::client::Client;
using sparsync::client::ConnectUnix;
using sparsync::client::IoError;

struct sparsync_client {
  explicit sparsync_client(int fd, std::string path) : impl(fd, std::move(path)) {}
  Client impl;
};

namespace {

void WriteError(char* error, size_t error_len, const std::string& message) {
  if (error == nullptr || error_len == 0) return;
  size_t n = std::min(message.size(), error_len - 1);
  memcpy(error, message.data(), n);
  error[n] = '\0';
}

template <typename F>
sparsync_status Guarded(F&& f) {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    return SPARSYNC_ERR_INTERNAL;
  }
}

}  // namespace

extern "C" {

sparsync_status sparsync_connect(const char* socket_path, const char* job_token,
                                 uint32_t local_rank, double timeout_s, sparsync_client** out,
                                 char* error, size_t error_len) {
  return Guarded([&]() -> sparsync_status {
    if (out == nullptr) return SPARSYNC_ERR_INVALID;
    *out = nullptr;
    const std::string path = socket_path == nullptr ? "" : socket_path;
    const auto start = sparsync::client::Clock::now();
    const auto deadline = sparsync::client::DeadlineAfter(timeout_s < 0 ? 0 : timeout_s);
    int fd = -1;
    IoError e;
    for (;;) {
      bool retryable = false;
      e = ConnectUnix(path, &fd, &retryable);
      if (e.ok || !retryable || sparsync::client::Clock::now() >= deadline) break;
      usleep(50 * 1000);  // the daemon creates its socket once the cluster has formed
    }
    if (!e.ok) {
      double waited = std::chrono::duration<double>(sparsync::client::Clock::now() - start).count();
      char secs[32];
      snprintf(secs, sizeof(secs), "%.1f", waited);
      WriteError(error, error_len,
                 "cannot reach sparsyncd at '" + path + "' (" + e.message + ", retried for " +
                     secs + " s). The socket path comes from SPARSYNC_SOCKET; start the daemon "
                     "with `sparsyncd` using the same SPARSYNC_SOCKET, or run the job under "
                     "`sparsyncrun -np N <command>`");
      return SPARSYNC_ERR_UNAVAILABLE;
    }
    auto* client = new sparsync_client(fd, path);
    double left = std::chrono::duration<double>(deadline - sparsync::client::Clock::now()).count();
    sparsync_status s = client->impl.Handshake(job_token, local_rank, left);
    if (s != SPARSYNC_OK) {
      WriteError(error, error_len, client->impl.TakeLastError());
      delete client;
      return s;
    }
    *out = client;
    return SPARSYNC_OK;
  });
}

void sparsync_close(sparsync_client* client) {
  if (client == nullptr) return;
  client->impl.Goodbye();
  delete client;
}

sparsync_status sparsync_get_world(sparsync_client* client, sparsync_world* out) {
  if (client == nullptr || out == nullptr) return SPARSYNC_ERR_INVALID;
  return client->impl.World(out);
}

sparsync_status sparsync_register_tensor(sparsync_client* client, const sparsync_tensor_spec* spec,
                                         uint32_t* tensor_id, void** data, uint64_t* bytes) {
  if (client == nullptr) return SPARSYNC_ERR_INVALID;
  return Guarded([&] { return client->impl.Register(spec, tensor_id, data, bytes); });
}

sparsync_status sparsync_register_cuda_tensor(sparsync_client* client,
                                              const sparsync_tensor_spec* spec, int32_t device,
                                              void* data, uint32_t* tensor_id) {
  if (client == nullptr) return SPARSYNC_ERR_INVALID;
  return Guarded([&] {
    sparsync::client::CudaTarget target{device, data};
    void* unused_data = nullptr;
    uint64_t unused_bytes = 0;
    return client->impl.Register(spec, tensor_id, &unused_data, &unused_bytes, &target);
  });
}

sparsync_status sparsync_post_ready_cuda(sparsync_client* client, uint32_t tensor_id,
                                         void* stream) {
  if (client == nullptr) return SPARSYNC_ERR_INVALID;
  return Guarded([&] { return client->impl.PostReady(tensor_id, &stream); });
}

sparsync_status sparsync_wait_done_cuda(sparsync_client* client, uint32_t tensor_id,
                                        double timeout_s, void* stream) {
  if (client == nullptr) return SPARSYNC_ERR_INVALID;
  return Guarded([&] { return client->impl.WaitDone(tensor_id, timeout_s, &stream); });
}

sparsync_status sparsync_post_ready(sparsync_client* client, uint32_t tensor_id) {
  if (client == nullptr) return SPARSYNC_ERR_INVALID;
  return Guarded([&] { return client->impl.PostReady(tensor_id); });
}

sparsync_status sparsync_wait_done(sparsync_client* client, uint32_t tensor_id, double timeout_s) {
  if (client == nullptr) return SPARSYNC_ERR_INVALID;
  return Guarded([&] { return client->impl.WaitDone(tensor_id, timeout_s); });
}

sparsync_status sparsync_allgather_result(sparsync_client* client, uint32_t tensor_id,
                                          const void** data, uint64_t* bytes, int64_t* dim0) {
  if (client == nullptr || data == nullptr || bytes == nullptr || dim0 == nullptr) {
    return SPARSYNC_ERR_INVALID;
  }
  return Guarded([&] { return client->impl.AllgatherResult(tensor_id, data, bytes, dim0); });
}

sparsync_status sparsync_unregister_tensor(sparsync_client* client, uint32_t tensor_id) {
  if (client == nullptr) return SPARSYNC_ERR_INVALID;
  return Guarded([&] { return client->impl.Unregister(tensor_id); });
}

const char* sparsync_last_error(sparsync_client* client) {
  if (client == nullptr) return "sparsync: null client handle";
  return client->impl.LastError();
}

}  // extern "C"
