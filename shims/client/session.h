// Session: one worker's connection to its node's sparsyncd, the object behind a handle of the C
// ABI (include/sparsync/client.h, c_api.cc). It connects, shakes hands, registers tensors,
// posts rounds and waits for their DONE.
//
// Threading: every call takes `mu_`. Waiting callers share the socket with a leader/follower
// scheme: at most one thread at a time receives (without holding `mu_`), records what arrived
// (replies, DONEs of any tensor) and wakes the others, so a thread waiting for one tensor never
// keeps another from posting or from seeing its own DONE.
// Failures: the first I/O error or protocol violation breaks the session for good; that call and
// every later one fail UNAVAILABLE with the reason, naming the socket path.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "daemon/device/cuda_runtime.h"
#include "shims/client/include/sparsync/client.h"
#include "shims/client/socket_io.h"
#include "shims/client/status.h"
#include "shims/client/tensor_registry.h"

namespace sparsync::client {

struct ConnectOptions {
  std::string socket_path;
  // nullopt: read from job_token_file, or when that is empty from the file the daemon leaves
  // beside its socket (<socket_path>.token), after the listener's user is checked.
  std::optional<std::string> job_token;
  std::string job_token_file;
  uint32_t local_rank = 0;
  double timeout_s = 0;      // keep retrying to connect this long (the daemon may be starting)
  std::string cuda_runtime;  // for CUDA tensors; empty: the default search of LoadCudaRuntime
};

// The device buffer a CUDA registration exports.
struct CudaTarget {
  int32_t device;
  void* data;
};

// What a successful registration hands back: the id and, for host tensors, the shared buffer.
struct Registration {
  uint32_t id = 0;
  void* data = nullptr;  // the library's mapping (RegionUse::kMap)
  uint64_t bytes = 0;
  int fd = -1;  // RegionUse::kHandOver: the memfd, which the caller now owns
};

class Session {
 public:
  // Connects to options.socket_path, retrying until options.timeout_s has passed, and performs
  // the handshake. On failure *out is null; the message names the path and what to check.
  static Status Connect(const ConnectOptions& options, std::unique_ptr<Session>* out);
  ~Session();  // closes the socket and unmaps every region; see Goodbye
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Set by the handshake, constant afterwards.
  const sparsync_world& world() const { return world_; }

  // `cuda` null: a host tensor in a shared region, mapped here or (`hand_over`) handed to the
  // caller as its memfd; else the device buffer to export (the CUDA runtime is loaded on the
  // first such call). REQUIRES: spec.name is not null.
  Status Register(const sparsync_tensor_spec& spec, const CudaTarget* cuda, bool hand_over,
                  Registration* out);
  // `stream` null: a host tensor; else (CUDA tensors) the stream to record the ready event on.
  Status PostReady(uint32_t id, const device::CudaStream* stream);
  // `stream` null: a host tensor; else (CUDA tensors) the stream made to wait on the done event.
  Status WaitDone(uint32_t id, double timeout_s, const device::CudaStream* stream);
  Status AllgatherResult(uint32_t id, const void** data, uint64_t* bytes, int64_t* dim0);
  Status Unregister(uint32_t id);
  // Starts the daemon's timeline into `path`, or stops it (""); waits for its answer.
  Status Timeline(const std::string& path, double timeout_s);
  // hvd.join() (sparsync_join): sends JOIN unless one is pending, then waits up to `timeout_s`.
  Status Join(double timeout_s, int32_t* last_rank);
  // Tells the daemon this worker leaves on purpose (best effort; not after a failure).
  void Goodbye();

 private:
  using Lock = std::unique_lock<std::mutex>;
  Session(int fd, ConnectOptions options) : fd_(fd), options_(std::move(options)) {}

  // The token to present: options_.job_token, or read from its file.
  Status ResolveToken(std::string* token) const;
  Status Handshake(const std::string& token, double timeout_s);
  // "sparsyncd of node N at 'path'" once the handshake named the node, else "sparsyncd at 'path'".
  std::string Daemon() const;
  Status Broken() const { return Status(SPARSYNC_ERR_UNAVAILABLE, broken_reason_); }
  // `closed`: the daemon's end of the connection went away (not a protocol violation).
  void MarkBroken(const std::string& reason, bool closed = false);
  Status Send(const void* msg, size_t bytes);
  // Receives until `satisfied()` holds or `deadline` passes; `what` names the wait in errors.
  Status WaitUntil(Lock& lock, const std::function<bool()>& satisfied, Clock::time_point deadline,
                   double timeout_s, const std::string& what);
  void Dispatch(const char* buf, size_t n, ReceivedFds* fds);
  // Applies the messages already queued on the socket, without waiting.
  void DrainQueued();
  // A send or receive failed with `e`: marks the connection lost, after applying what the daemon
  // sent before it closed (its reason, as a job error) unless a waiting thread is receiving it.
  // A daemon that closes with our messages unread resets the connection, and the kernel reports
  // the reset before the datagrams still queued here.
  void Lose(const IoError& e);
  // The registered tensor `id` for call `what`; INVALID when it is not registered.
  Status Find(uint32_t id, const char* what, Tensor** out);
  // INVALID unless the tensor's memory kind matches the call: CUDA tensors use the _cuda calls.
  static Status CheckMemory(const Tensor& t, bool cuda_call, const char* what);
  Status LoadCuda(const std::string& tensor, int32_t device);

  std::mutex mu_;
  std::condition_variable cv_;
  const int fd_;
  const ConnectOptions options_;
  bool reading_ = false;  // a thread is receiving (the leader)
  bool broken_ = false;
  std::string broken_reason_;
  JobError job_error_;  // last error DONE that named no round in flight: the job failed
  sparsync_world world_{};
  bool hello_arrived_ = false;
  sparsync_hello_reply hello_reply_{};
  std::mutex timeline_mu_;          // one TIMELINE in flight at a time; taken before mu_
  bool timeline_pending_ = false;   // a TIMELINE awaits its reply
  sparsync_timeline_reply timeline_reply_{};
  bool join_sent_ = false;     // a JOIN awaits its reply
  bool join_answered_ = false;  // ... and it came: join_reply_
  sparsync_join_reply join_reply_{};
  TensorRegistry registry_;
  std::shared_ptr<const device::CudaRuntime> cuda_;  // loaded at the first CUDA registration
};

}  // namespace sparsync::client
