// WorkerSession: one worker's connection to the daemon. Owned jointly (shared_ptr) by the intake
// server and by work in flight, so that a DONE sent after a disconnect never reaches a recycled
// descriptor: the socket is closed only when the last owner lets go.
//
// Sending never blocks (issue 16, D6: one worker that stops reading must not stall the intake
// thread, or the executor's DONE messages to everyone else). A message that does not fit in the
// socket's buffer waits in the session's outbox, in order, with a copy of the descriptor it
// carries; the intake loop sends the outbox when the socket has room again (Flush). A worker that
// lets more than kMaxOutboxBytes or kMaxOutboxFds pile up, or reads nothing for the server's
// stall limit, is disconnected.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "daemon/common/status.h"

namespace sparsync::intake {

class WorkerSession {
 public:
  using Clock = std::chrono::steady_clock;
  // Asks the intake loop to report (true) or stop reporting (false) when the socket has room.
  // Called with the session's send lock held, from any thread that sends.
  using WatchWritable = std::function<void(int fd, bool watch)>;
  // What may wait for one worker: far more than the DONEs of every tensor it may register, and
  // descriptors (regions, allgather results) enough for every registration in flight, but few
  // against the daemon's open-file limit.
  static constexpr size_t kMaxOutboxBytes = 64u << 20;
  static constexpr size_t kMaxOutboxFds = 64;

  explicit WorkerSession(int fd, WatchWritable watch_writable = {});
  ~WorkerSession();

  int fd() const { return fd_; }
  // Sends one datagram, with `pass_fd` attached when >= 0 (the caller keeps its descriptor).
  // Thread-safe; never blocks; never raises SIGPIPE. An error means the message will not arrive
  // (the connection is closed or the worker does not read); the connection is then shut down.
  Status Send(const void* data, size_t size, int pass_fd = -1);
  // Sends what waits in the outbox until the socket is full again. The intake thread calls it
  // when the socket has room. An error: the connection is broken.
  Status Flush();
  // How long the oldest waiting message has waited without the worker reading anything; zero
  // when nothing waits.
  Clock::duration Stalled(Clock::time_point now) const;
  // Stops further I/O (the peer sees the connection close); the descriptor stays allocated.
  void Shutdown();
  // Why the session shut itself down (a worker that does not read); OK otherwise.
  Status shutdown_reason() const;

  // When the connection was accepted: one that has not shaken hands within the server's limit
  // is closed (it holds a descriptor of the daemon's).
  const Clock::time_point accepted_at = Clock::now();
  // Set once by the handshake.
  bool greeted = false;
  uint32_t local_rank = 0;
  pid_t pid = 0;
  bool said_goodbye = false;
  // Worker tensor id -> tensor name; guarded by the owner of the tensor table.
  std::unordered_map<uint32_t, std::string> tensors;

  std::string Describe(int node_rank) const;

 private:
  struct Waiting {
    std::vector<char> bytes;
    int fd = -1;  // a duplicate, closed once sent
  };
  // One non-blocking sendmsg: 1 sent, 0 no room, -1 error (errno kept in *err).
  int TrySend(const void* data, size_t size, int pass_fd, int* err);
  void Break(const Status& reason);  // REQUIRES: send_mu_ held
  void Discard();                    // REQUIRES: send_mu_ held

  const int fd_;
  const WatchWritable watch_writable_;
  mutable std::mutex send_mu_;
  bool shut_ = false;          // guarded by send_mu_
  Status broken_;              // guarded by send_mu_
  std::deque<Waiting> outbox_;  // guarded by send_mu_
  size_t outbox_bytes_ = 0;     // guarded by send_mu_
  size_t outbox_fds_ = 0;       // guarded by send_mu_
  Clock::time_point progress_;  // guarded by send_mu_: the outbox's last progress
};

}  // namespace sparsync::intake
