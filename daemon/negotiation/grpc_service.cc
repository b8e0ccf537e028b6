#include "daemon/negotiation/grpc_service.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "daemon/common/job_failure.h"
#include "daemon/negotiation/grpc_convert.h"
#include "sparsync/v1/coordinator.grpc.pb.h"

namespace sparsync::negotiation {
namespace {
constexpr auto kMaxPollWait = std::chrono::milliseconds(5000);
constexpr auto kMaxStoreWait = std::chrono::milliseconds(600000);
const grpc::Status kBadToken(grpc::StatusCode::PERMISSION_DENIED, "wrong SPARSYNC_JOB_TOKEN");

std::chrono::milliseconds Millis(uint32_t ms, std::chrono::milliseconds cap) {
  return std::min(std::chrono::milliseconds(ms), cap);
}

}  // namespace

std::string PeerHost(const std::string& peer) {
  const size_t scheme = peer.find(':');
  if (scheme == std::string::npos) return "";
  std::string rest = peer.substr(scheme + 1);
  if (!rest.empty() && rest.front() == '[') {
    const size_t close = rest.find(']');
    return close == std::string::npos ? "" : rest.substr(1, close - 1);
  }
  const size_t port = rest.rfind(':');
  return port == std::string::npos ? rest : rest.substr(0, port);
}

CoordinatorHandlers::CoordinatorHandlers(CoordinatorCore* core, std::chrono::milliseconds max_wait)
    : core_(core), max_wait_(max_wait) {}

grpc::Status CoordinatorHandlers::Join(const v1::JoinRequest& req, std::chrono::milliseconds wait,
                                       const std::string& peer) {
  JoinInfo info{req.protocol_version(), req.job_token(), static_cast<int>(req.node_rank()),
                static_cast<int>(req.num_nodes()), static_cast<int>(req.local_size()),
                PeerHost(peer)};
  return ToGrpc(core_->Join(info, std::clamp(wait, std::chrono::milliseconds(0),
                                             std::chrono::milliseconds(3600000))));
}

grpc::Status CoordinatorHandlers::StoreSet(const v1::StoreSetRequest& req) {
  if (!core_->TokenMatches(req.job_token())) return kBadToken;
  return ToGrpc(core_->StoreSet(req.key(), req.value()));
}

grpc::Status CoordinatorHandlers::StoreGet(const v1::StoreGetRequest& req,
                                           v1::StoreGetResponse* resp) {
  if (!core_->TokenMatches(req.job_token())) return kBadToken;
  std::vector<std::string> keys(req.keys().begin(), req.keys().end());
  auto values = core_->StoreGet(keys, Millis(req.wait_ms(), std::min(kMaxStoreWait, max_wait_)));
  if (!values.ok()) return ToGrpc(values.status());
  for (auto& v : *values) resp->add_values(std::move(v));
  return grpc::Status::OK;
}

grpc::Status CoordinatorHandlers::Report(const v1::ReportRequest& req, v1::ReportResponse* resp) {
  if (!core_->TokenMatches(req.job_token())) return kBadToken;
  std::vector<TensorMeta> metas;
  for (const auto& m : req.new_tensors()) {
    auto meta = FromProto(m);
    if (!meta.ok()) {
      return ToGrpc(meta.status().WithContext("node " + std::to_string(req.node_rank())));
    }
    metas.push_back(std::move(*meta));
  }
  std::vector<ReportedReady> ready;
  for (const auto& r : req.ready()) {
    ReportedReady rr;
    if (r.ref_case() == v1::ReadyTensor::kSlot) rr.slot = r.slot();
    if (r.ref_case() == v1::ReadyTensor::kNewIndex) rr.new_index = r.new_index();
    rr.worker_dim0.assign(r.worker_dim0().begin(), r.worker_dim0().end());
    rr.ready_ns = r.ready_ns();
    ready.push_back(std::move(rr));
  }
  RankNews ranks;
  ranks.joined.assign(req.joined_ranks().begin(), req.joined_ranks().end());
  ranks.gone.assign(req.gone_ranks().begin(), req.gone_ranks().end());
  ranks.back.assign(req.back_ranks().begin(), req.back_ranks().end());
  auto slots = core_->Report(static_cast<int>(req.node_rank()), metas, ready, ranks);
  if (!slots.ok()) return ToGrpc(slots.status());
  for (uint32_t s : *slots) resp->add_new_slots(s);
  return grpc::Status::OK;
}

grpc::Status CoordinatorHandlers::Poll(const v1::PollRequest& req, v1::PollResponse* resp) {
  if (!core_->TokenMatches(req.job_token())) return kBadToken;
  auto entries = core_->Poll(static_cast<int>(req.node_rank()), req.after_seq(),
                             Millis(req.wait_ms(), std::min(kMaxPollWait, max_wait_)));
  if (!entries.ok()) return ToGrpc(entries.status());
  for (const auto& e : *entries) ToProto(e, resp->add_entries());
  return grpc::Status::OK;
}

grpc::Status CoordinatorHandlers::Fail(const v1::FailRequest& req) {
  if (!core_->TokenMatches(req.job_token())) return kBadToken;
  uint32_t code = req.code();
  Status error(code >= 1 && code <= 7 ? static_cast<StatusCode>(code) : StatusCode::kAborted,
               req.message().empty() ? "node " + std::to_string(req.node_rank()) + " failed"
                                     : req.message());
  if (IsShutdownReason(error, static_cast<int>(req.node_rank()))) {
    spdlog::info("{}", error.message());  // the end of every job, or a SIGTERM mid-job
  } else {
    spdlog::error("node {} reports a failure: {}", req.node_rank(), error.message());
  }
  return ToGrpc(core_->Fail(static_cast<int>(req.node_rank()), error));
}

grpc::Status CoordinatorHandlers::Leave(const v1::LeaveRequest& req) {
  if (!core_->TokenMatches(req.job_token())) return kBadToken;
  return ToGrpc(core_->Leave(static_cast<int>(req.node_rank())));
}

class CoordinatorServer::Service final : public v1::Coordinator::Service {
 public:
  explicit Service(CoordinatorCore* core) : handlers_(core, std::chrono::hours(1)) {}

  grpc::Status Join(grpc::ServerContext* ctx, const v1::JoinRequest* req,
                    v1::JoinResponse*) override {
    auto remaining = std::chrono::duration_cast<std::chrono::milliseconds>(
        ctx->deadline() - std::chrono::system_clock::now());
    return handlers_.Join(*req, remaining, ctx->peer());
  }
  grpc::Status StoreSet(grpc::ServerContext*, const v1::StoreSetRequest* req,
                        v1::StoreSetResponse*) override {
    return handlers_.StoreSet(*req);
  }
  grpc::Status StoreGet(grpc::ServerContext*, const v1::StoreGetRequest* req,
                        v1::StoreGetResponse* resp) override {
    return handlers_.StoreGet(*req, resp);
  }
  grpc::Status Report(grpc::ServerContext*, const v1::ReportRequest* req,
                      v1::ReportResponse* resp) override {
    return handlers_.Report(*req, resp);
  }
  grpc::Status Poll(grpc::ServerContext*, const v1::PollRequest* req,
                    v1::PollResponse* resp) override {
    return handlers_.Poll(*req, resp);
  }
  grpc::Status Fail(grpc::ServerContext*, const v1::FailRequest* req,
                    v1::FailResponse*) override {
    return handlers_.Fail(*req);
  }
  grpc::Status Leave(grpc::ServerContext*, const v1::LeaveRequest* req,
                     v1::LeaveResponse*) override {
    return handlers_.Leave(*req);
  }

 private:
  CoordinatorHandlers handlers_;
};

CoordinatorServer::CoordinatorServer(CoordinatorCore* core,
                                     std::shared_ptr<grpc::ServerCredentials> credentials)
    : service_(std::make_unique<Service>(core)), credentials_(std::move(credentials)) {}

CoordinatorServer::~CoordinatorServer() { Stop(); }

Status CoordinatorServer::Start(const std::string& address, int nodes) {
  grpc::ServerBuilder builder;
  // gRPC's synchronous server ends a thread whenever more than MAX_POLLERS (default 2) wait for
  // work, and starts one when none does: with every node's Poll held for up to a second, that is
  // a thread started and ended every round, and each new thread takes malloc arena pages that the
  // old one left (issue 16's soak). Idle threads are cheap; keep one for each call in flight.
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS,
                              2 * std::max(nodes, 1) + 2);
  int port = 0;
  builder.AddListeningPort(address, credentials_, &port);
  builder.RegisterService(service_.get());
  builder.SetMaxReceiveMessageSize(64 << 20);
  builder.SetMaxSendMessageSize(64 << 20);
  server_ = builder.BuildAndStart();
  port_ = port;
  if (!server_ || port == 0) {
    return Unavailable("cannot serve the coordinator on " + address +
                       " (SPARSYNC_COORDINATOR): the port is in use or the address is not local");
  }
  return Status::Ok();
}

void CoordinatorServer::Stop() {
  if (server_) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    server_.reset();
  }
}

}  // namespace sparsync::negotiation
