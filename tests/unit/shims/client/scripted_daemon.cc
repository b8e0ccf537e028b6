#include "tests/unit/shims/client/scripted_daemon.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <utility>

namespace sparsync::client_test {

ScriptedDaemon::ScriptedDaemon() {
  char tmpl[] = "/tmp/sparsync-client-XXXXXX";
  dir_ = mkdtemp(tmpl);
  path_ = dir_ + "/d.sock";
}

ScriptedDaemon::~ScriptedDaemon() {
  Stop();
  std::filesystem::remove_all(dir_);
}

bool ScriptedDaemon::Start() {
  // The token is left beside the socket, as sparsyncd does, for workers that give none.
  server_ = std::make_unique<intake::IntakeServer>(path_, static_cast<int>(node_rank), this,
                                                   std::chrono::seconds(2), token);
  Status s = server_->Start();
  EXPECT_TRUE(s.ok()) << s.message();
  return s.ok();
}

void ScriptedDaemon::Stop() {
  if (server_) server_->Stop();
}

void ScriptedDaemon::SendDone(const Ready& r, int32_t status, const std::string& message,
                              uint64_t result_bytes, int64_t result_dim0, int fd) {
  sparsync_done d{};
  intake::FillHeader(&d.header, SPARSYNC_MSG_DONE, sizeof(d));
  d.tensor_id = r.tensor_id;
  d.status = status;
  d.round = r.round;
  d.result_bytes = result_bytes;
  d.result_dim0 = result_dim0;
  intake::CopyMessage(d.message, message);
  Status s = r.session->Send(&d, sizeof(d), fd);
  EXPECT_TRUE(s.ok()) << s.message();
}

void ScriptedDaemon::SetOnReady(std::function<void(const Ready&)> answer) {
  std::lock_guard lock(mu_);
  on_ready_ = std::move(answer);
}

std::vector<ScriptedDaemon::Ready> ScriptedDaemon::WaitForReadies(
    size_t n, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return readies_.size() >= n; });
  return readies_;
}

std::vector<sparsync_register_msg> ScriptedDaemon::registrations() {
  std::lock_guard lock(mu_);
  return registrations_;
}

std::vector<uint32_t> ScriptedDaemon::unregistered() {
  std::lock_guard lock(mu_);
  return unregistered_;
}

void ScriptedDaemon::OnHello(const std::shared_ptr<intake::WorkerSession>& session,
                             const sparsync_hello& hello, sparsync_hello_reply* reply) {
  if (std::string(hello.job_token, hello.token_len) != token) {
    reply->status = SPARSYNC_ERR_PERMISSION;
    intake::CopyMessage(reply->message, refusal);
    return;
  }
  session->greeted = true;
  session->local_rank = hello.local_rank;
  session->pid = hello.pid;
  reply->status = SPARSYNC_OK;
  reply->node_rank = node_rank;
  reply->num_nodes = num_nodes;
  reply->local_rank = hello.local_rank;
  reply->local_size = local_size;
  reply->rank = node_rank * local_size + hello.local_rank;
  reply->size = num_nodes * local_size;
}

void ScriptedDaemon::OnRegister(const std::shared_ptr<intake::WorkerSession>& session,
                                const sparsync_register_msg& msg, sparsync_register_reply* reply,
                                std::shared_ptr<intake::SharedRegion>* region) {
  uint64_t numel = 1;
  for (uint32_t d = 0; d < msg.ndim; ++d) numel *= static_cast<uint64_t>(msg.shape[d]);
  const uint64_t bytes = numel * intake::WireDTypeSize(msg.dtype);
  const std::string name(msg.name, msg.name_len);
  auto created = intake::SharedRegion::Create("test." + name, bytes);
  ASSERT_TRUE(created.ok()) << created.status().message();
  std::lock_guard lock(mu_);
  registrations_.push_back(msg);
  tensors_[{session.get(), msg.tensor_id}] = Tensor{name, *created};
  *region = *created;
  reply->status = SPARSYNC_OK;
  reply->region_bytes = bytes;
}

Status ScriptedDaemon::OnReady(const std::shared_ptr<intake::WorkerSession>& session,
                               const sparsync_ready& msg) {
  Ready r;
  std::function<void(const Ready&)> answer;
  {
    std::lock_guard lock(mu_);
    auto it = tensors_.find({session.get(), msg.tensor_id});
    if (it == tensors_.end()) return InvalidArgument("READY for an unknown tensor");
    r = Ready{session, msg.tensor_id, msg.round, it->second.name, it->second.region};
    readies_.push_back(r);
    answer = on_ready_;
  }
  cv_.notify_all();
  if (answer) answer(r);
  return Status::Ok();
}

Status ScriptedDaemon::OnUnregister(const std::shared_ptr<intake::WorkerSession>& session,
                                    const sparsync_unregister_msg& msg) {
  std::lock_guard lock(mu_);
  tensors_.erase({session.get(), msg.tensor_id});
  unregistered_.push_back(msg.tensor_id);
  return Status::Ok();
}

void ScriptedDaemon::OnTimeline(const std::shared_ptr<intake::WorkerSession>&,
                                const sparsync_timeline_msg& msg, sparsync_timeline_reply* reply) {
  std::lock_guard lock(mu_);
  timelines_.push_back(intake::TimelinePath(msg));
  reply->status = intake::WireStatus(timeline_answer);
  intake::CopyMessage(reply->message, timeline_answer.message());
}

std::vector<std::string> ScriptedDaemon::timelines() {
  std::lock_guard lock(mu_);
  return timelines_;
}

Status ScriptedDaemon::OnJoin(const std::shared_ptr<intake::WorkerSession>& session) {
  std::lock_guard lock(mu_);
  joined_.push_back(session);
  return Status::Ok();
}

size_t ScriptedDaemon::joins() {
  std::lock_guard lock(mu_);
  return joined_.size();
}

void ScriptedDaemon::AnswerJoin(const Status& status, int32_t last_rank) {
  std::shared_ptr<intake::WorkerSession> session;
  {
    std::lock_guard lock(mu_);
    session = joined_.back();
  }
  sparsync_join_reply reply{};
  intake::FillHeader(&reply.header, SPARSYNC_MSG_JOIN_REPLY, sizeof(reply));
  reply.status = intake::WireStatus(status);
  reply.last_rank = last_rank;
  intake::CopyMessage(reply.message, status.message());
  EXPECT_TRUE(session->Send(&reply, sizeof(reply)).ok());
}

void ScriptedDaemon::OnDisconnect(const std::shared_ptr<intake::WorkerSession>& session,
                                  const Status&) {
  std::lock_guard lock(mu_);
  std::erase_if(tensors_, [&](const auto& kv) { return kv.first.first == session.get(); });
}

}  // namespace sparsync::client_test
