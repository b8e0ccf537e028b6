// IntakeServer: the control socket (SOCK_SEQPACKET, docs/architecture.md §1). One thread runs an epoll
// loop over the listening socket and every worker connection; each datagram is decoded and
// validated (codec.h) and handed to the IntakeHandler. A malformed message closes that one
// connection with a logged reason; the daemon and the other workers go on.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>

#include "daemon/common/logging.h"
#include "daemon/intake/codec.h"
#include "daemon/intake/session.h"
#include "daemon/intake/shared_region.h"

namespace sparsync::intake {

// What the daemon does with valid messages. Called on the intake thread only.
class IntakeHandler {
 public:
  virtual ~IntakeHandler() = default;
  // Fills `reply` (status and world). Non-OK status: the connection is closed after the reply.
  virtual void OnHello(const std::shared_ptr<WorkerSession>& session, const sparsync_hello& hello,
                       sparsync_hello_reply* reply) = 0;
  // Fills `reply`; on OK also `region`, whose fd is sent with the reply.
  virtual void OnRegister(const std::shared_ptr<WorkerSession>& session,
                          const sparsync_register_msg& msg, sparsync_register_reply* reply,
                          std::shared_ptr<SharedRegion>* region) = 0;
  // Non-OK: a protocol violation; the connection is closed with that reason.
  virtual Status OnReady(const std::shared_ptr<WorkerSession>& session, const sparsync_ready& msg) = 0;
  virtual Status OnUnregister(const std::shared_ptr<WorkerSession>& session,
                              const sparsync_unregister_msg& msg) = 0;
  // Fills `reply`'s status and message: the timeline started or stopped, or why not. By default
  // it is refused (a handler without a timeline).
  virtual void OnTimeline(const std::shared_ptr<WorkerSession>& session,
                          const sparsync_timeline_msg& msg, sparsync_timeline_reply* reply);
  // The connection is gone: `reason` is OK after GOODBYE, else why it closed.
  virtual void OnDisconnect(const std::shared_ptr<WorkerSession>& session, const Status& reason) = 0;
};

class IntakeServer {
 public:
  IntakeServer(std::string socket_path, int node_rank, IntakeHandler* handler,
               std::chrono::milliseconds send_timeout);
  ~IntakeServer();

  // Creates the socket (refusing if another daemon serves it) and starts the thread.
  Status Start();
  // Stops the thread, closes every connection and removes the socket file. Idempotent.
  void Stop();
  // One pass of the loop: waits up to `timeout` for events and handles them.
  void RunOnce(std::chrono::milliseconds timeout);

 private:
  void Accept();
  void HandleReadable(int fd);
  void Close(int fd, const Status& reason);

  const std::string socket_path_;
  const int node_rank_;
  IntakeHandler* const handler_;
  const std::chrono::milliseconds send_timeout_;
  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;  // eventfd that interrupts epoll_wait on Stop
  std::atomic<bool> stopping_{false};
  std::unordered_map<int, std::shared_ptr<WorkerSession>> sessions_;
  LogLimiter refused_log_;  // connections refused before their handshake
  LogLimiter accept_log_;
  std::thread thread_;
};

}  // namespace sparsync::intake
