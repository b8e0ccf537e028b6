#include "daemon/negotiation/grpc_service.h"

#include <spdlog/spdlog.h>

#include "daemon/negotiation/grpc_convert.h"
#include "sparsync/v1/coordinator.grpc.pb.h"

namespace sparsync::negotiation {
namespace {
constexpr uint32_t kMaxPollWaitMs = 5000;
const grpc::Status kBadToken(grpc::StatusCode::PERMISSION_DENIED, "wrong SPARSYNC_JOB_TOKEN");
}  // namespace

class CoordinatorServer::Service final : public v1::Coordinator::Service {
 public:
  explicit Service(CoordinatorCore* core) : core_(core) {}

  grpc::Status Join(grpc::ServerContext* ctx, const v1::JoinRequest* req,
                    v1::JoinResponse*) override {
    JoinInfo info{req->protocol_version(), req->job_token(), static_cast<int>(req->node_rank()),
                  static_cast<int>(req->num_nodes()), static_cast<int>(req->local_size())};
    auto remaining = std::chrono::duration_cast<std::chrono::milliseconds>(
        ctx->deadline() - std::chrono::system_clock::now());
    remaining = std::clamp(remaining, std::chrono::milliseconds(0), std::chrono::milliseconds(3600000));
    return ToGrpc(core_->Join(info, remaining));
  }

  grpc::Status StoreSet(grpc::ServerContext*, const v1::StoreSetRequest* req,
                        v1::StoreSetResponse*) override {
    if (!core_->TokenMatches(req->job_token())) return kBadToken;
    return ToGrpc(core_->StoreSet(req->key(), req->value()));
  }

  grpc::Status StoreGet(grpc::ServerContext*, const v1::StoreGetRequest* req,
                        v1::StoreGetResponse* resp) override {
    if (!core_->TokenMatches(req->job_token())) return kBadToken;
    std::vector<std::string> keys(req->keys().begin(), req->keys().end());
    auto values = core_->StoreGet(keys, std::chrono::milliseconds(std::min(req->wait_ms(), 600000u)));
    if (!values.ok()) return ToGrpc(values.status());
    for (auto& v : *values) resp->add_values(std::move(v));
    return grpc::Status::OK;
  }

  grpc::Status Report(grpc::ServerContext*, const v1::ReportRequest* req,
                      v1::ReportResponse* resp) override {
    if (!core_->TokenMatches(req->job_token())) return kBadToken;
    std::vector<TensorMeta> metas;
    for (const auto& m : req->new_tensors()) {
      auto meta = FromProto(m);
      if (!meta.ok()) {
        return ToGrpc(meta.status().WithContext("node " + std::to_string(req->node_rank())));
      }
      metas.push_back(std::move(*meta));
    }
    std::vector<ReportedReady> ready;
    for (const auto& r : req->ready()) {
      ReportedReady rr;
      if (r.ref_case() == v1::ReadyTensor::kSlot) rr.slot = r.slot();
      if (r.ref_case() == v1::ReadyTensor::kNewIndex) rr.new_index = r.new_index();
      rr.worker_dim0.assign(r.worker_dim0().begin(), r.worker_dim0().end());
      rr.ready_ns = r.ready_ns();
      ready.push_back(std::move(rr));
    }
    auto slots = core_->Report(static_cast<int>(req->node_rank()), metas, ready);
    if (!slots.ok()) return ToGrpc(slots.status());
    for (uint32_t s : *slots) resp->add_new_slots(s);
    return grpc::Status::OK;
  }

  grpc::Status Poll(grpc::ServerContext*, const v1::PollRequest* req,
                    v1::PollResponse* resp) override {
    if (!core_->TokenMatches(req->job_token())) return kBadToken;
    auto entries = core_->Poll(static_cast<int>(req->node_rank()), req->after_seq(),
                               std::chrono::milliseconds(std::min(req->wait_ms(), kMaxPollWaitMs)));
    if (!entries.ok()) return ToGrpc(entries.status());
    for (const auto& e : *entries) ToProto(e, resp->add_entries());
    return grpc::Status::OK;
  }

  grpc::Status Fail(grpc::ServerContext*, const v1::FailRequest* req,
                    v1::FailResponse*) override {
    if (!core_->TokenMatches(req->job_token())) return kBadToken;
    uint32_t code = req->code();
    Status error(code >= 1 && code <= 7 ? static_cast<StatusCode>(code) : StatusCode::kAborted,
                 req->message());
    spdlog::error("node {} reports a failure: {}", req->node_rank(), req->message());
    return ToGrpc(core_->Fail(static_cast<int>(req->node_rank()), error));
  }

  grpc::Status Leave(grpc::ServerContext*, const v1::LeaveRequest* req,
                     v1::LeaveResponse*) override {
    if (!core_->TokenMatches(req->job_token())) return kBadToken;
    return ToGrpc(core_->Leave(static_cast<int>(req->node_rank())));
  }

 private:
  CoordinatorCore* core_;
};

CoordinatorServer::CoordinatorServer(CoordinatorCore* core)
    : service_(std::make_unique<Service>(core)) {}

CoordinatorServer::~CoordinatorServer() { Stop(); }

Status CoordinatorServer::Start(const std::string& address) {
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(service_.get());
  builder.SetMaxReceiveMessageSize(64 << 20);
  builder.SetMaxSendMessageSize(64 << 20);
  server_ = builder.BuildAndStart();
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
