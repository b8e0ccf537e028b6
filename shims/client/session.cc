#include "shims/client/session.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <variant>

#include "shims/client/codec.h"

namespace sparsync::client {
namespace {

// How long register waits for its reply; the daemon answers at once unless it is wedged.
constexpr double kReplyTimeoutS = 300.0;
// The handshake gets at least this long even when the connect timeout is nearly used up.
constexpr double kMinHandshakeS = 5.0;
// Pause between connection attempts while the daemon's socket does not exist yet.
constexpr auto kConnectRetry = std::chrono::milliseconds(50);

Clock::time_point DeadlineAfter(double seconds) {
  if (seconds < 0) return Clock::time_point::max();
  auto now = Clock::now();
  auto d = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  if (d > Clock::time_point::max() - now) return Clock::time_point::max();
  return now + d;
}

std::string Seconds(double s) {
  char buf[64];
  snprintf(buf, sizeof(buf), "%.1f", s);
  return buf;
}

}  // namespace

Status Session::Connect(const ConnectOptions& options, std::unique_ptr<Session>* out) {
  out->reset();
  const auto start = Clock::now();
  const auto deadline = DeadlineAfter(std::max(options.timeout_s, 0.0));
  int fd = -1;
  IoError e;
  for (;;) {
    bool retryable = false;
    e = ConnectUnix(options.socket_path, &fd, &retryable);
    if (e.ok || !retryable || Clock::now() >= deadline) break;
    // The daemon creates its socket once the cluster has formed; nothing announces it.
    std::this_thread::sleep_for(kConnectRetry);
  }
  if (e.foreign) {
    return Status(SPARSYNC_ERR_PERMISSION,
                  "refusing sparsyncd at '" + options.socket_path + "': " + e.message);
  }
  if (!e.ok) {
    double waited = std::chrono::duration<double>(Clock::now() - start).count();
    return Status(SPARSYNC_ERR_UNAVAILABLE,
                  "cannot reach sparsyncd at '" + options.socket_path + "' (" + e.message +
                      ", retried for " + Seconds(waited) +
                      " s). The socket path comes from SPARSYNC_SOCKET; start the daemon with "
                      "`sparsyncd` using the same SPARSYNC_SOCKET, or run the job under "
                      "`sparsyncrun -np N <command>`");
  }
  std::unique_ptr<Session> session;
  try {
    session.reset(new Session(fd, options));
  } catch (...) {  // out of memory: the socket must not leak
    CloseFd(fd);
    throw;
  }
  std::string token;
  if (Status s = session->ResolveToken(&token); !s.ok()) return s;
  double left = std::chrono::duration<double>(deadline - Clock::now()).count();
  if (Status s = session->Handshake(token, left); !s.ok()) return s;
  *out = std::move(session);
  return Status::Ok();
}

Session::~Session() { CloseFd(fd_); }

Status Session::ResolveToken(std::string* token) const {
  if (options_.job_token) {
    *token = *options_.job_token;
    return Status::Ok();
  }
  const bool given = !options_.job_token_file.empty();
  const std::string path = given ? options_.job_token_file : options_.socket_path + ".token";
  bool missing = false;
  IoError e = ReadTokenFile(path, token, &missing);
  if (e.ok) return Status::Ok();
  if (missing && !given) {
    return Status(SPARSYNC_ERR_PERMISSION,
                  "no job token: SPARSYNC_JOB_TOKEN and SPARSYNC_JOB_TOKEN_FILE are not set, and "
                  "sparsyncd at '" + options_.socket_path + "' left none in " + path);
  }
  return Status(SPARSYNC_ERR_PERMISSION, e.message);
}

std::string Session::Daemon() const {
  const std::string where = "at '" + options_.socket_path + "'";
  if (world_.size == 0) return "sparsyncd " + where;
  return "sparsyncd of node " + std::to_string(world_.node_rank) + " " + where;
}

void Session::MarkBroken(const std::string& reason, bool closed) {
  if (broken_) return;
  broken_ = true;
  broken_reason_ = "connection to " + Daemon() + " lost: " + reason;
  if (job_error_.failed()) {
    broken_reason_ += " (last error from the daemon: " + job_error_.message + ")";
  } else if (closed && world_.size != 0) {
    broken_reason_ += " (the daemon of node " + std::to_string(world_.node_rank) +
                      " died or was stopped)";
  }
  cv_.notify_all();
}

Status Session::Send(const void* msg, size_t bytes) {
  if (broken_) return Broken();
  IoError e = SendDatagram(fd_, msg, bytes);
  if (!e.ok) {
    Lose(e);
    return Broken();
  }
  return Status::Ok();
}

Status Session::WaitUntil(Lock& lock, const std::function<bool()>& satisfied,
                          Clock::time_point deadline, double timeout_s, const std::string& what) {
  auto timeout = [&] {
    return Status(SPARSYNC_ERR_TIMEOUT, "timed out after " + Seconds(timeout_s) +
                                            " s waiting for " + what + " from " + Daemon());
  };
  while (!satisfied()) {
    if (broken_) return Broken();
    if (reading_) {  // a follower: the leader wakes us after each message
      if (deadline == Clock::time_point::max()) {
        cv_.wait(lock);
      } else if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && !satisfied() &&
                 !broken_) {
        return timeout();
      }
      continue;
    }
    reading_ = true;  // the leader: receive one message without the lock
    lock.unlock();
    alignas(8) char buf[SPARSYNC_MAX_MESSAGE_BYTES];
    size_t n = 0;
    ReceivedFds fds;
    IoError e = ReceiveDatagram(fd_, buf, sizeof(buf), deadline, &n, &fds);
    lock.lock();
    reading_ = false;
    cv_.notify_all();  // followers see what arrived, or one of them takes over receiving
    if (e.timed_out) {
      if (satisfied()) break;
      return timeout();
    }
    if (!e.ok) {
      Lose(e);
      if (satisfied()) break;  // what was awaited arrived before the end: the caller reads it
      return Broken();
    }
    Dispatch(buf, n, &fds);
  }
  return Status::Ok();
}

void Session::Lose(const IoError& e) {
  if (e.closed && !reading_) DrainQueued();
  MarkBroken(e.message, e.closed);
}

void Session::DrainQueued() {
  for (int i = 0; i < 64 && !broken_; ++i) {
    alignas(8) char buf[SPARSYNC_MAX_MESSAGE_BYTES];
    size_t n = 0;
    ReceivedFds fds;
    IoError e = ReceiveDatagram(fd_, buf, sizeof(buf), Clock::now(), &n, &fds);
    if (!e.ok) return;  // nothing more queued (or the end of the connection)
    Dispatch(buf, n, &fds);
  }
}

void Session::Dispatch(const char* buf, size_t n, ReceivedFds* fds) {
  Incoming message;
  if (Status s = Decode(buf, n, &message); !s.ok()) return MarkBroken(s.message());
  Status applied;
  if (auto* hello = std::get_if<sparsync_hello_reply>(&message)) {
    if (hello_arrived_ || fds->size() != 0) return MarkBroken("unexpected HELLO_REPLY");
    hello_reply_ = *hello;
    hello_arrived_ = true;
  } else if (auto* reply = std::get_if<sparsync_register_reply>(&message)) {
    applied = registry_.OnRegisterReply(*reply, fds);
  } else if (auto* join = std::get_if<sparsync_join_reply>(&message)) {
    if (!join_sent_ || join_answered_ || fds->size() != 0) return MarkBroken("unexpected JOIN_REPLY");
    join_reply_ = *join;
    join_answered_ = true;
  } else if (auto* timeline = std::get_if<sparsync_timeline_reply>(&message)) {
    if (!timeline_pending_ || fds->size() != 0) return MarkBroken("unexpected TIMELINE_REPLY");
    timeline_reply_ = *timeline;
    timeline_pending_ = false;
  } else {
    applied = registry_.OnDone(std::get<sparsync_done>(message), fds, &job_error_);
  }
  if (!applied.ok()) MarkBroken(applied.message());
}

Status Session::Handshake(const std::string& token, double timeout_s) {
  Lock lock(mu_);
  sparsync_hello m;
  if (Status s = EncodeHello(token, options_.local_rank, &m); !s.ok()) return s;
  if (Status s = Send(&m, sizeof(m)); !s.ok()) return s;
  double wait_s = std::max(timeout_s, kMinHandshakeS);
  if (Status s = WaitUntil(
          lock, [&] { return hello_arrived_; }, DeadlineAfter(wait_s), wait_s,
          "the handshake reply");
      !s.ok()) {
    return s;
  }
  const sparsync_hello_reply& r = hello_reply_;
  if (r.status != SPARSYNC_OK) {
    return Status(ToStatus(r.status),
                  "sparsyncd at '" + options_.socket_path +
                      "' refused this worker: " + BoundedString(r.message, sizeof(r.message)));
  }
  if (Status s = WorldFromReply(r, options_.local_rank, &world_); !s.ok()) {
    MarkBroken(s.message());
    return Broken();
  }
  return Status::Ok();
}

Status Session::LoadCuda(const std::string& tensor, int32_t device) {
  if (cuda_) return Status::Ok();
  std::string error;
  cuda_ = device::LoadCudaRuntime(options_.cuda_runtime, &error);
  if (cuda_) return Status::Ok();
  return Status(SPARSYNC_ERR_UNAVAILABLE, "tensor '" + tensor + "' is on CUDA device " +
                                              std::to_string(device) +
                                              " but the sparsync client cannot use CUDA: " + error);
}

Status Session::Register(const sparsync_tensor_spec& spec, const CudaTarget* cuda,
                         bool hand_over, Registration* out) {
  Lock lock(mu_);
  if (broken_) return Broken();
  sparsync_register_msg m;
  if (Status s = EncodeRegister(spec, &m); !s.ok()) return s;
  const std::string name = spec.name;
  std::unique_ptr<CudaBuffer> buffer;
  if (cuda != nullptr) {
    if (Status s = LoadCuda(name, cuda->device); !s.ok()) return s;
    uint64_t numel = 1;
    for (uint32_t d = 0; d < spec.ndim; ++d) numel *= static_cast<uint64_t>(spec.shape[d]);
    std::string error;
    buffer = CudaBuffer::Export(cuda_, cuda->device, cuda->data,
                                numel * sparsync_dtype_size(spec.dtype), &m, &error);
    if (!buffer) return Status(SPARSYNC_ERR_INVALID, "tensor '" + name + "': " + error);
  }
  uint32_t tid = 0;
  const RegionUse use = cuda != nullptr ? RegionUse::kDiscard
                        : hand_over     ? RegionUse::kHandOver
                                        : RegionUse::kMap;
  if (!registry_.Reserve(use, &tid)) {
    return Status(SPARSYNC_ERR_INVALID, "more than " +
                                            std::to_string(SPARSYNC_MAX_TENSORS_PER_WORKER) +
                                            " tensors registered by this worker");
  }
  m.tensor_id = tid;
  Status s = Send(&m, sizeof(m));
  if (s.ok()) {
    s = WaitUntil(
        lock, [&] { return registry_.Arrived(tid); }, DeadlineAfter(kReplyTimeoutS), kReplyTimeoutS,
        "the registration of tensor '" + name + "'");
  }
  PendingRegistration p = registry_.TakePending(tid);
  if (!s.ok()) return s;
  if (p.status != SPARSYNC_OK) {
    return Status(ToStatus(p.status), p.message.empty() ? "registration of tensor '" + name +
                                                              "' refused: " + StatusName(p.status)
                                                        : p.message);
  }
  if (buffer) {
    std::string error;
    if (!buffer->OpenDone(p.done_event, &error)) {
      auto u = NewMessage<sparsync_unregister_msg>(SPARSYNC_MSG_UNREGISTER);
      u.tensor_id = tid;
      (void)Send(&u, sizeof(u));
      return Status(SPARSYNC_ERR_INTERNAL, "tensor '" + name + "': " + error);
    }
  }
  out->id = tid;
  out->data = p.region.data();
  out->bytes = use == RegionUse::kHandOver ? p.fd_bytes : p.region.bytes();
  out->fd = p.fd.Release();
  Tensor t;
  t.name = name;
  t.op = spec.op;
  t.region = std::move(p.region);
  t.cuda = std::move(buffer);
  registry_.Add(tid, std::move(t));
  return Status::Ok();
}

Status Session::Find(uint32_t id, const char* what, Tensor** out) {
  *out = registry_.Find(id);
  if (*out != nullptr) return Status::Ok();
  return Status(SPARSYNC_ERR_INVALID,
                std::string(what) + ": tensor id " + std::to_string(id) + " is not registered");
}

Status Session::CheckMemory(const Tensor& t, bool cuda_call, const char* what) {
  if ((t.cuda != nullptr) == cuda_call) return Status::Ok();
  return Status(SPARSYNC_ERR_INVALID, std::string(what) + ": tensor '" + t.name + "' is a " +
                                          (t.cuda ? "CUDA tensor; use the _cuda variant"
                                                  : "host tensor; use the plain call"));
}

Status Session::PostReady(uint32_t id, const device::CudaStream* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_) return Broken();
  Tensor* t = nullptr;
  if (Status s = Find(id, "post_ready", &t); !s.ok()) return s;
  if (Status s = CheckMemory(*t, stream != nullptr, "post_ready"); !s.ok()) return s;
  std::string error;
  if (t->cuda && !t->cuda->RecordReady(*stream, &error)) {
    return Status(SPARSYNC_ERR_INTERNAL, "tensor '" + t->name + "': " + error);
  }
  t->result.Reset();  // the previous allgather result is invalid from now on
  t->result_dim0 = 0;
  sparsync_ready m = EncodeReady(id, t->posted + 1);
  if (Status s = Send(&m, sizeof(m)); !s.ok()) return s;
  t->posted = m.round;
  return Status::Ok();
}

Status Session::WaitDone(uint32_t id, double timeout_s, const device::CudaStream* stream) {
  Lock lock(mu_);
  Tensor* t = nullptr;
  if (Status s = Find(id, "wait_done", &t); !s.ok()) return s;
  if (Status s = CheckMemory(*t, stream != nullptr, "wait_done"); !s.ok()) return s;
  if (t->posted == 0) {
    return Status(SPARSYNC_ERR_INVALID, "wait_done: tensor '" + t->name + "' was never posted");
  }
  const std::string name = t->name;
  // Once the daemon reported the job's failure, no result will come: every wait ends with it
  // (issue 16, D4), also for a round whose own answer is still on its way.
  Status s = WaitUntil(
      lock,
      [&] {
        Tensor* now = registry_.Find(id);
        return now == nullptr || !now->in_flight() || job_error_.failed();
      },
      DeadlineAfter(timeout_s), timeout_s, "the result of tensor '" + name + "'");
  if (!s.ok()) return s;
  t = registry_.Find(id);  // the table may have changed while the lock was released
  if (t == nullptr) {
    return Status(SPARSYNC_ERR_INVALID, "tensor '" + name + "' was unregistered while waiting");
  }
  // The daemon's own deadline (SPARSYNC_TIMEOUT_S: a tensor or node missing elsewhere) failed
  // the job. Returned as TIMEOUT it would read as this wait's deadline, which callers that wait
  // in slices retry until their own limit, losing the daemon's explanation: it is ABORTED.
  auto failed = [](int status, const std::string& message) {
    return Status(status == SPARSYNC_ERR_TIMEOUT ? SPARSYNC_ERR_ABORTED : ToStatus(status),
                  message);
  };
  if (t->in_flight()) return failed(job_error_.status, job_error_.message);
  if (t->status == SPARSYNC_ERR_TIMEOUT) return failed(t->status, t->message);
  if (t->status != SPARSYNC_OK) return Status(ToStatus(t->status), t->message);
  std::string error;
  if (t->cuda && !t->cuda->StreamWaitDone(*stream, &error)) {
    return Status(SPARSYNC_ERR_INTERNAL, "tensor '" + name + "': " + error);
  }
  return Status::Ok();
}

Status Session::AllgatherResult(uint32_t id, const void** data, uint64_t* bytes, int64_t* dim0) {
  std::lock_guard<std::mutex> lock(mu_);
  const Tensor* t = registry_.Find(id);
  if (t == nullptr || t->op != SPARSYNC_OP_ALLGATHER) {
    return Status(SPARSYNC_ERR_INVALID, "allgather_result: tensor id " + std::to_string(id) +
                                            " is not a registered allgather tensor");
  }
  if (t->posted == 0 || t->in_flight() || t->status != SPARSYNC_OK || t->result.data() == nullptr) {
    return Status(SPARSYNC_ERR_INVALID,
                  "allgather_result: tensor '" + t->name + "' has no successful result to read");
  }
  *data = t->result.data();
  *bytes = t->result.bytes();
  *dim0 = t->result_dim0;
  return Status::Ok();
}

Status Session::Unregister(uint32_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  Tensor* t = nullptr;
  if (Status s = Find(id, "unregister", &t); !s.ok()) return s;
  registry_.Remove(id);
  cv_.notify_all();                  // a thread waiting for this tensor returns
  if (broken_) return Status::Ok();  // nothing to tell a daemon that is gone
  auto m = NewMessage<sparsync_unregister_msg>(SPARSYNC_MSG_UNREGISTER);
  m.tensor_id = id;
  return Send(&m, sizeof(m));
}

Status Session::Timeline(const std::string& path, double timeout_s) {
  std::lock_guard<std::mutex> one_at_a_time(timeline_mu_);
  Lock lock(mu_);
  sparsync_timeline_msg m;
  if (Status s = EncodeTimeline(path, &m); !s.ok()) return s;
  timeline_pending_ = true;
  if (Status s = Send(&m, sizeof(m)); !s.ok()) return s;
  if (Status s = WaitUntil(
          lock, [&] { return !timeline_pending_; }, DeadlineAfter(timeout_s), timeout_s,
          "the answer to a timeline request");
      !s.ok()) {
    return s;
  }
  if (timeline_reply_.status != SPARSYNC_OK) {
    return Status(ToStatus(timeline_reply_.status),
                  "sparsyncd at '" + options_.socket_path + "' could not " +
                      (path.empty() ? "stop its timeline" : "record a timeline into '" + path + "'") +
                      ": " + BoundedString(timeline_reply_.message, sizeof(timeline_reply_.message)));
  }
  return Status::Ok();
}

Status Session::Join(double timeout_s, int32_t* last_rank) {
  Lock lock(mu_);
  if (!join_sent_) {
    auto m = NewMessage<sparsync_join_msg>(SPARSYNC_MSG_JOIN);
    if (Status s = Send(&m, sizeof(m)); !s.ok()) return s;
    join_sent_ = true;
    join_answered_ = false;
  }
  if (Status s = WaitUntil(
          lock, [&] { return join_answered_; }, DeadlineAfter(timeout_s), timeout_s,
          "every worker to join");
      !s.ok()) {
    return s;  // a timeout leaves the JOIN pending: the next call waits on
  }
  join_sent_ = false;
  if (join_reply_.status != SPARSYNC_OK) {
    return Status(ToStatus(join_reply_.status),
                  "join: " + BoundedString(join_reply_.message, sizeof(join_reply_.message)));
  }
  *last_rank = join_reply_.last_rank;
  return Status::Ok();
}

void Session::Goodbye() {
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_) return;
  auto m = NewMessage<sparsync_goodbye>(SPARSYNC_MSG_GOODBYE);
  (void)SendDatagram(fd_, &m, sizeof(m));
}

}  // namespace sparsync::client
