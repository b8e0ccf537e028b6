#include "daemon/negotiation/grpc_link.h"

#include <spdlog/spdlog.h>

#include <cstdio>

#include "daemon/negotiation/coordinator_core.h"
#include "daemon/negotiation/grpc_convert.h"

namespace sparsync::negotiation {

// Registers `ctx` for the duration of one call; refused once the link is cancelled.
class GrpcCoordinatorLink::Call {
 public:
  Call(GrpcCoordinatorLink* link, grpc::ClientContext* ctx) : link_(link), ctx_(ctx) {
    std::lock_guard lock(link_->calls_mu_);
    admitted_ = !link_->cancelled_;
    if (admitted_) link_->calls_.insert(ctx_);
  }
  ~Call() {
    if (!admitted_) return;
    std::lock_guard lock(link_->calls_mu_);
    link_->calls_.erase(ctx_);
  }
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;
  bool admitted() const { return admitted_; }

 private:
  GrpcCoordinatorLink* const link_;
  grpc::ClientContext* const ctx_;
  bool admitted_ = false;
};

namespace {
Status ShuttingDown() { return Unavailable("this daemon is shutting down"); }
// Fail and Leave are the last words of a failing or stopping daemon: they must not hold it up.
constexpr std::chrono::milliseconds kTellTimeout(2000);
}  // namespace

GrpcCoordinatorLink::GrpcCoordinatorLink(const std::string& address, std::string job_token,
                                         std::chrono::milliseconds rpc_timeout,
                                         std::shared_ptr<grpc::ChannelCredentials> credentials)
    : address_(address), job_token_(std::move(job_token)), rpc_timeout_(rpc_timeout) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  channel_ = grpc::CreateCustomChannel(address, std::move(credentials), args);
  stub_ = v1::Coordinator::NewStub(channel_);
}

GrpcCoordinatorLink::~GrpcCoordinatorLink() = default;

void GrpcCoordinatorLink::Cancel() {
  std::lock_guard lock(calls_mu_);
  cancelled_ = true;
  for (grpc::ClientContext* ctx : calls_) ctx->TryCancel();
  cancelled_cv_.notify_all();
}

void GrpcCoordinatorLink::SetDeadline(grpc::ClientContext* ctx, std::chrono::milliseconds d) const {
  ctx->set_deadline(std::chrono::system_clock::now() + d);
}

Status GrpcCoordinatorLink::Check(const grpc::Status& status, const char* doing) const {
  // Every error names the address tried: a user's first question when a node cannot reach node 0.
  const int rank = node_rank_.load();
  const bool lost = status.error_code() == grpc::StatusCode::UNAVAILABLE ||
                    status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
  if (!lost || rank < 0) return FromGrpc(status, std::string(doing) + " at " + address_);
  return FromGrpc(status, "node " + std::to_string(rank) + " lost the coordinator (node 0 at " +
                              address_ + ": node 0 died, or the network between them failed) " +
                              doing);
}

namespace {

std::string Seconds(std::chrono::milliseconds d) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g s", static_cast<double>(d.count()) / 1000.0);
  return text;
}

}  // namespace

Status GrpcCoordinatorLink::Join(const JoinInfo& info, std::chrono::milliseconds timeout) {
  // Node 0 may not be up yet: wait for the channel, retrying until the deadline.
  auto deadline = std::chrono::steady_clock::now() + timeout;
  int attempt = 0;
  std::string last_error;
  while (true) {
    grpc::ClientContext ctx;
    Call call(this, &ctx);
    if (!call.admitted()) return ShuttingDown();
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      return DeadlineExceeded("could not join the coordinator at " + address_ +
                              " (SPARSYNC_COORDINATOR) within " + Seconds(timeout) +
                              "; is node 0 running?" +
                              (last_error.empty() ? "" : " (last error: " + last_error + ")"));
    }
    SetDeadline(&ctx, left);
    ctx.set_wait_for_ready(true);
    v1::JoinRequest req;
    req.set_protocol_version(info.protocol_version);
    req.set_job_token(info.job_token);
    req.set_node_rank(info.node_rank);
    req.set_num_nodes(info.num_nodes);
    req.set_local_size(info.local_size);
    v1::JoinResponse resp;
    grpc::Status st = stub_->Join(&ctx, req, &resp);
    if (st.ok()) {
      node_rank_ = static_cast<int>(info.node_rank);
      return Status::Ok();
    }
    // The call waits for the channel, so a node 0 that is not there yet ends it at the deadline:
    // the loop's own message then says what to check.
    const bool unreachable = st.error_code() == grpc::StatusCode::UNAVAILABLE ||
                             st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
    if (st.error_code() == grpc::StatusCode::CANCELLED) return ShuttingDown();
    if (!unreachable) return Check(st, "joining the coordinator");
    if (st.error_code() == grpc::StatusCode::UNAVAILABLE) last_error = st.error_message();
    if (++attempt % 10 == 1) spdlog::info("waiting for the coordinator at {}", address_);
    std::unique_lock lock(calls_mu_);  // the reconnect back-off, cut short by Cancel
    cancelled_cv_.wait_for(lock, std::chrono::milliseconds(200), [&] { return cancelled_; });
  }
}

Status GrpcCoordinatorLink::StoreSet(const std::string& key, const std::string& value) {
  grpc::ClientContext ctx;
  Call call(this, &ctx);
  if (!call.admitted()) return ShuttingDown();
  SetDeadline(&ctx, rpc_timeout_);
  v1::StoreSetRequest req;
  req.set_job_token(job_token_);
  req.set_key(key);
  req.set_value(value);
  v1::StoreSetResponse resp;
  return Check(stub_->StoreSet(&ctx, req, &resp), "rendezvous store set");
}

Result<std::vector<std::string>> GrpcCoordinatorLink::StoreGet(const std::vector<std::string>& keys,
                                                               std::chrono::milliseconds timeout) {
  grpc::ClientContext ctx;
  Call call(this, &ctx);
  if (!call.admitted()) return ShuttingDown();
  SetDeadline(&ctx, timeout + rpc_timeout_);
  v1::StoreGetRequest req;
  req.set_job_token(job_token_);
  for (const auto& k : keys) req.add_keys(k);
  req.set_wait_ms(static_cast<uint32_t>(timeout.count()));
  v1::StoreGetResponse resp;
  SPARSYNC_RETURN_IF_ERROR(Check(stub_->StoreGet(&ctx, req, &resp), "rendezvous store get"));
  return std::vector<std::string>(resp.values().begin(), resp.values().end());
}

Result<std::vector<uint32_t>> GrpcCoordinatorLink::Report(
    int node, const std::vector<TensorMeta>& new_tensors, const std::vector<ReportedReady>& ready,
    const RankNews& ranks) {
  grpc::ClientContext ctx;
  Call call(this, &ctx);
  if (!call.admitted()) return ShuttingDown();
  SetDeadline(&ctx, rpc_timeout_);
  v1::ReportRequest req;
  req.set_job_token(job_token_);
  req.set_node_rank(node);
  for (const auto& m : new_tensors) ToProto(m, req.add_new_tensors());
  for (const auto& r : ready) {
    auto* out = req.add_ready();
    if (r.slot) out->set_slot(*r.slot);
    if (r.new_index) out->set_new_index(*r.new_index);
    for (int64_t d : r.worker_dim0) out->add_worker_dim0(d);
    out->set_ready_ns(r.ready_ns);
  }
  for (int32_t rank : ranks.joined) req.add_joined_ranks(rank);
  for (int32_t rank : ranks.gone) req.add_gone_ranks(rank);
  for (int32_t rank : ranks.back) req.add_back_ranks(rank);
  v1::ReportResponse resp;
  SPARSYNC_RETURN_IF_ERROR(Check(stub_->Report(&ctx, req, &resp), "reporting to the coordinator"));
  return std::vector<uint32_t>(resp.new_slots().begin(), resp.new_slots().end());
}

Result<std::vector<ScheduleEntry>> GrpcCoordinatorLink::Poll(int node, uint64_t after_seq,
                                                             std::chrono::milliseconds wait) {
  grpc::ClientContext ctx;
  Call call(this, &ctx);
  if (!call.admitted()) return ShuttingDown();
  SetDeadline(&ctx, wait + rpc_timeout_);
  v1::PollRequest req;
  req.set_job_token(job_token_);
  req.set_node_rank(node);
  req.set_after_seq(after_seq);
  req.set_wait_ms(static_cast<uint32_t>(wait.count()));
  v1::PollResponse resp;
  SPARSYNC_RETURN_IF_ERROR(Check(stub_->Poll(&ctx, req, &resp), "polling the coordinator"));
  std::vector<ScheduleEntry> entries;
  for (const auto& e : resp.entries()) entries.push_back(FromProto(e));
  return entries;
}

Status GrpcCoordinatorLink::Fail(int node, const Status& error) {
  grpc::ClientContext ctx;
  Call call(this, &ctx);
  if (!call.admitted()) return ShuttingDown();
  SetDeadline(&ctx, std::min(rpc_timeout_, kTellTimeout));
  v1::FailRequest req;
  req.set_job_token(job_token_);
  req.set_node_rank(node);
  req.set_message(error.message());
  req.set_code(static_cast<uint32_t>(error.code()));
  v1::FailResponse resp;
  return Check(stub_->Fail(&ctx, req, &resp), "reporting a failure to the coordinator");
}

Status GrpcCoordinatorLink::Leave(int node) {
  grpc::ClientContext ctx;
  Call call(this, &ctx);
  if (!call.admitted()) return ShuttingDown();
  SetDeadline(&ctx, kTellTimeout);
  v1::LeaveRequest req;
  req.set_job_token(job_token_);
  req.set_node_rank(node);
  v1::LeaveResponse resp;
  return Check(stub_->Leave(&ctx, req, &resp), "leaving the coordinator");
}

}  // namespace sparsync::negotiation
