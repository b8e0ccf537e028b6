// ScriptedDaemon: the daemon's end of the intake protocol for the client library's tests. The
// real IntakeServer (daemon/intake/server.h) on a temporary socket, with a handler that accepts
// workers with the right token, registers host regions, and hands every READY to the test,
// which answers it (or not) as the case needs.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "daemon/intake/server.h"

namespace sparsync::client_test {

class ScriptedDaemon : public intake::IntakeHandler {
 public:
  // A READY as the handler saw it, with what the test needs to answer it.
  struct Ready {
    std::shared_ptr<intake::WorkerSession> session;
    uint32_t tensor_id = 0;
    uint64_t round = 0;
    std::string name;
    std::shared_ptr<intake::SharedRegion> region;  // the tensor's buffer, shared with the worker
  };

  ScriptedDaemon();
  ~ScriptedDaemon() override;  // stops the server and removes the socket's directory

  // Starts serving socket_path(); false (and a gtest failure) if it cannot.
  bool Start();
  void Stop();
  const std::string& socket_path() const { return path_; }

  // What the HELLO_REPLY says; set before workers connect.
  std::string token = "t0k";
  std::string refusal = "wrong job token";  // the message when the token does not match
  uint32_t node_rank = 0;
  uint32_t num_nodes = 1;
  uint32_t local_size = 1;

  // `answer` is called on the intake thread for every READY from now on; without one (the
  // default) a READY is only recorded (see WaitForReadies) and the test answers it itself.
  void SetOnReady(std::function<void(const Ready&)> answer);

  // Sends DONE for `r` with `status` and `message`; `fd` (>= 0) travels with it.
  static void SendDone(const Ready& r, int32_t status, const std::string& message = "",
                       uint64_t result_bytes = 0, int64_t result_dim0 = 0, int fd = -1);

  // Waits up to `timeout` until `n` READYs have been recorded; returns them (fewer on timeout).
  std::vector<Ready> WaitForReadies(size_t n, std::chrono::milliseconds timeout);
  // The REGISTER messages, and the tensor ids of the UNREGISTERs, received so far.
  std::vector<sparsync_register_msg> registrations();
  std::vector<uint32_t> unregistered();

  // intake::IntakeHandler
  void OnHello(const std::shared_ptr<intake::WorkerSession>& session, const sparsync_hello& hello,
               sparsync_hello_reply* reply) override;
  void OnRegister(const std::shared_ptr<intake::WorkerSession>& session,
                  const sparsync_register_msg& msg, sparsync_register_reply* reply,
                  std::shared_ptr<intake::SharedRegion>* region) override;
  Status OnReady(const std::shared_ptr<intake::WorkerSession>& session,
                 const sparsync_ready& msg) override;
  Status OnUnregister(const std::shared_ptr<intake::WorkerSession>& session,
                      const sparsync_unregister_msg& msg) override;
  void OnDisconnect(const std::shared_ptr<intake::WorkerSession>& session,
                    const Status& reason) override;
  // Records the path ("" for a stop) and answers with `timeline_answer`.
  void OnTimeline(const std::shared_ptr<intake::WorkerSession>& session,
                  const sparsync_timeline_msg& msg, sparsync_timeline_reply* reply) override;
  std::vector<std::string> timelines();
  Status timeline_answer;  // set before the worker asks
  // Records the JOIN; the test answers it with AnswerJoin.
  Status OnJoin(const std::shared_ptr<intake::WorkerSession>& session) override;
  size_t joins();
  // Sends JOIN_REPLY to the worker that joined last.
  void AnswerJoin(const Status& status, int32_t last_rank);

 private:
  struct Tensor {
    std::string name;
    std::shared_ptr<intake::SharedRegion> region;
  };

  std::string dir_;
  std::string path_;
  std::unique_ptr<intake::IntakeServer> server_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void(const Ready&)> on_ready_;
  std::map<std::pair<const intake::WorkerSession*, uint32_t>, Tensor> tensors_;
  std::vector<Ready> readies_;
  std::vector<sparsync_register_msg> registrations_;
  std::vector<uint32_t> unregistered_;
  std::vector<std::string> timelines_;
  std::vector<std::shared_ptr<intake::WorkerSession>> joined_;
};

}  // namespace sparsync::client_test
