#include "daemon/negotiation/grpc_convert.h"

namespace sparsync::negotiation {

grpc::Status ToGrpc(const Status& status) {
  if (status.ok()) return grpc::Status::OK;
  grpc::StatusCode code = grpc::StatusCode::INTERNAL;
  switch (status.code()) {
    case StatusCode::kInvalidArgument: code = grpc::StatusCode::INVALID_ARGUMENT; break;
    case StatusCode::kUnavailable: code = grpc::StatusCode::UNAVAILABLE; break;
    case StatusCode::kDeadlineExceeded: code = grpc::StatusCode::DEADLINE_EXCEEDED; break;
    case StatusCode::kMismatch: code = grpc::StatusCode::FAILED_PRECONDITION; break;
    case StatusCode::kAborted: code = grpc::StatusCode::ABORTED; break;
    case StatusCode::kPermissionDenied: code = grpc::StatusCode::PERMISSION_DENIED; break;
    default: break;
  }
  return grpc::Status(code, status.message());
}

Status FromGrpc(const grpc::Status& status, const std::string& what) {
  if (status.ok()) return Status::Ok();
  StatusCode code = StatusCode::kInternal;
  switch (status.error_code()) {
    case grpc::StatusCode::INVALID_ARGUMENT: code = StatusCode::kInvalidArgument; break;
    case grpc::StatusCode::UNAVAILABLE: code = StatusCode::kUnavailable; break;
    case grpc::StatusCode::DEADLINE_EXCEEDED: code = StatusCode::kDeadlineExceeded; break;
    case grpc::StatusCode::FAILED_PRECONDITION: code = StatusCode::kMismatch; break;
    case grpc::StatusCode::ABORTED: code = StatusCode::kAborted; break;
    case grpc::StatusCode::PERMISSION_DENIED: code = StatusCode::kPermissionDenied; break;
    default: break;
  }
  return Status(code, what + ": " + status.error_message());
}

void ToProto(const TensorMeta& in, v1::TensorMeta* out) {
  out->set_name(in.name);
  out->set_op(ToWire(in.op));
  out->set_dtype(ToWire(in.dtype));
  out->set_reduce_op(ToWire(in.reduce_op));
  out->set_root_rank(in.root_rank);
  for (int64_t d : in.shape) out->add_shape(d);
  out->set_compressor(ToWire(in.compressor));
  out->set_density(in.density);
  for (int32_t r : in.members) out->add_members(r);
  out->set_group(in.group);
  out->set_group_size(in.group_size);
}

Result<TensorMeta> FromProto(const v1::TensorMeta& in) {
  TensorMeta m;
  m.name = in.name();
  auto context = [&](const Status& st) { return st.WithContext("tensor '" + m.name + "'"); };
  auto op = OpFromWire(in.op());
  if (!op.ok()) return context(op.status());
  auto dtype = DTypeFromWire(in.dtype());
  if (!dtype.ok()) return context(dtype.status());
  auto reduce_op = ReduceOpFromWire(in.reduce_op());
  if (!reduce_op.ok()) return context(reduce_op.status());
  auto compressor = CompressorFromWire(in.compressor());
  if (!compressor.ok()) return context(compressor.status());
  m.op = *op;
  m.dtype = *dtype;
  m.reduce_op = *reduce_op;
  m.root_rank = in.root_rank();
  m.shape.assign(in.shape().begin(), in.shape().end());
  m.compressor = *compressor;
  m.density = in.density();
  m.members.assign(in.members().begin(), in.members().end());
  m.group = in.group();
  m.group_size = in.group_size();
  for (size_t i = 0; i < m.members.size(); ++i) {
    if (m.members[i] < 0 || (i > 0 && m.members[i] <= m.members[i - 1])) {
      return context(InvalidArgument("a process set's ranks must be distinct, ascending and "
                                     "non-negative"));
    }
  }
  return m;
}

void ToProto(const ScheduleEntry& in, v1::ScheduleEntry* out) {
  out->set_seq(in.seq);
  for (const GroupTensor& t : in.group) {
    auto* g = out->add_group();
    g->set_slot(t.slot);
    for (int64_t d : t.worker_dim0) g->add_worker_dim0(d);
    if (t.meta) ToProto(*t.meta, g->mutable_meta());
  }
  if (!in.fatal.ok()) {
    out->set_fatal_error(in.fatal.message());
    out->set_fatal_code(static_cast<uint32_t>(in.fatal.code()));
  }
  if (in.plan) {
    v1::Plan* p = out->mutable_plan();
    p->set_version(in.plan->version);
    p->set_effective_step(in.plan->effective_step);
    p->set_planner(in.plan->planner);
    for (size_t i = 0; i < in.plan->groups.size(); ++i) {
      auto* g = p->add_groups();
      for (uint32_t slot : in.plan->groups[i]) g->add_slots(slot);
      g->set_dense(i < in.plan->dense.size() && in.plan->dense[i]);
    }
    p->set_predicted_s(in.plan->predicted_s);
    p->set_summary(in.plan->summary);
  }
  out->set_plan_version(in.plan_version);
  out->set_group_index(in.group_index);
  if (in.join_last_rank >= 0) out->set_join_last_rank_plus_one(in.join_last_rank + 1);
}

ScheduleEntry FromProto(const v1::ScheduleEntry& in) {
  ScheduleEntry e;
  e.seq = in.seq();
  for (const auto& g : in.group()) {
    e.group.push_back({g.slot(), {g.worker_dim0().begin(), g.worker_dim0().end()}, {}, nullptr});
    if (!g.has_meta()) continue;
    auto meta = FromProto(g.meta());
    if (!meta.ok()) {
      e.fatal = Internal("the schedule's entry " + std::to_string(e.seq) + ": " +
                         meta.status().message());
      continue;
    }
    e.group.back().meta = std::make_shared<const TensorMeta>(*std::move(meta));
  }
  // The code marks a fatal entry (its message may be empty); a message with no code known here
  // (a daemon of another build) is fatal too.
  if (in.fatal_code() != 0 || !in.fatal_error().empty()) {
    uint32_t code = in.fatal_code();
    e.fatal = Status(code >= 1 && code <= 7 ? static_cast<StatusCode>(code) : StatusCode::kAborted,
                     in.fatal_error());
  }
  if (in.has_plan()) {
    PlanInfo p;
    p.version = in.plan().version();
    p.effective_step = in.plan().effective_step();
    p.planner = in.plan().planner();
    bool any_dense = false;
    for (const auto& g : in.plan().groups()) {
      p.groups.emplace_back(g.slots().begin(), g.slots().end());
      any_dense = any_dense || g.dense();
    }
    // All sparse travels as an empty list, as PlanInfo keeps it.
    for (int i = 0; any_dense && i < in.plan().groups_size(); ++i) {
      p.dense.push_back(in.plan().groups(i).dense());
    }
    p.predicted_s = in.plan().predicted_s();
    p.summary = in.plan().summary();
    e.plan = std::make_shared<const PlanInfo>(std::move(p));
  }
  e.plan_version = in.plan_version();
  e.group_index = in.group_index();
  if (in.join_last_rank_plus_one() != 0) {
    e.join_last_rank = static_cast<int32_t>(in.join_last_rank_plus_one() - 1);
  }
  return e;
}

}  // namespace sparsync::negotiation
