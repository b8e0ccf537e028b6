// WorkerSession: one worker's connection to the daemon. Owned jointly (shared_ptr) by the intake
// server and by work in flight, so that a DONE sent after a disconnect never reaches a recycled
// descriptor: the socket is closed only when the last owner lets go.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <mutex>
#include <string>
#include <unordered_map>

#include "daemon/common/status.h"

namespace sparsync::intake {

class WorkerSession {
 public:
  explicit WorkerSession(int fd) : fd_(fd) {}
  ~WorkerSession();

  int fd() const { return fd_; }
  // Sends one datagram, with `pass_fd` attached when >= 0. Thread-safe. Never raises SIGPIPE.
  Status Send(const void* data, size_t size, int pass_fd = -1);
  // Stops further I/O (the peer sees the connection close); the descriptor stays allocated.
  void Shutdown();

  // Set once by the handshake.
  bool greeted = false;
  uint32_t local_rank = 0;
  pid_t pid = 0;
  bool said_goodbye = false;
  // Worker tensor id -> tensor name; guarded by the owner of the tensor table.
  std::unordered_map<uint32_t, std::string> tensors;

  std::string Describe(int node_rank) const;

 private:
  const int fd_;
  std::mutex send_mu_;
  std::atomic<bool> shut_{false};
};

}  // namespace sparsync::intake
