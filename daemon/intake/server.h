// IntakeServer: the control socket (SOCK_SEQPACKET, docs/architecture.md §1). One thread runs an epoll
// loop over the listening socket and every worker connection; each datagram is decoded and
// validated (codec.h) and handed to the IntakeHandler. A malformed message closes that one
// connection with a logged reason; the daemon and the other workers go on.
//
// Hardening (issue 16): the socket's directory must be this user's and of mode 0700, or Start
// refuses naming it (D1); a path that exists and is not a socket is never removed (D7); the job
// token is left beside the socket in a 0600 file for the workers; no send blocks the loop (D6,
// session.h); at the open-file limit a connection is answered with the reason and closed instead
// of being retried forever (D5); the lines logged about connections refused before their
// handshake are rate-limited (D11); a refused HELLO or REGISTER gets a reply that says why (D12).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
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
  // JOIN (hvd.join()). A non-OK status is a protocol violation. By default refused.
  virtual Status OnJoin(const std::shared_ptr<WorkerSession>& session);
  // The connection is gone: `reason` is OK after GOODBYE, else why it closed.
  virtual void OnDisconnect(const std::shared_ptr<WorkerSession>& session, const Status& reason) = 0;
};

class IntakeServer {
 public:
  // `stall_limit`: how long a worker may leave the daemon's messages unread before it is
  // disconnected. `worker_token`: written to WorkerTokenPath(socket_path) for the workers ("":
  // no file).
  IntakeServer(std::string socket_path, int node_rank, IntakeHandler* handler,
               std::chrono::milliseconds stall_limit, std::string worker_token = "");
  ~IntakeServer();

  // Creates the socket (refusing if another daemon serves it) and starts the thread.
  Status Start();
  // Stops the thread, tells every greeted worker `why` (an error DONE of no round, which the
  // client keeps as the job's error), closes every connection and removes the socket file.
  // Idempotent.
  void Stop(const Status& why = Aborted("the daemon is shutting down"));
  // One pass of the loop: waits up to `timeout` for events and handles them.
  void RunOnce(std::chrono::milliseconds timeout);

 private:
  Status Bind();
  void Accept();
  // At the open-file limit: answers one waiting connection with the reason, using the spare
  // descriptor. False when nothing could be accepted.
  bool RefuseForLackOfDescriptors();
  void PauseAccepting();
  void HandleReadable(int fd);
  void HandleMessage(int fd, const std::shared_ptr<WorkerSession>& session, const char* buf,
                     size_t n, int num_fds);
  void Reject(int fd, const std::shared_ptr<WorkerSession>& session, const char* buf, size_t n,
              const Status& error);
  void CloseStalled();
  void Close(int fd, const Status& reason);
  void Watch(int fd, bool writable);

  const std::string socket_path_;
  const int node_rank_;
  IntakeHandler* const handler_;
  const std::chrono::milliseconds stall_limit_;
  const std::string worker_token_;
  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;   // eventfd that interrupts epoll_wait on Stop
  int spare_fd_ = -1;  // held back for answering connections at the open-file limit
  bool wrote_token_ = false;
  std::optional<std::chrono::steady_clock::time_point> paused_until_;  // accepting paused
  std::atomic<bool> stopping_{false};
  std::unordered_map<int, std::shared_ptr<WorkerSession>> sessions_;
  LogLimiter refused_log_;  // connections refused before their handshake
  LogLimiter accept_log_;   // accept failures and connections refused for lack of descriptors
  std::thread thread_;
};

}  // namespace sparsync::intake
