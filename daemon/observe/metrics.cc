#include "daemon/observe/metrics.h"

#include <algorithm>

namespace sparsync::observe {
namespace {

const char* Encoding(int sparse) { return sparse ? "sparse" : "dense"; }

double Seconds(int64_t begin_ns, int64_t end_ns) {
  return begin_ns > 0 && end_ns > begin_ns ? (end_ns - begin_ns) * 1e-9 : 0.0;
}

}  // namespace

Metrics::Metrics(int node_rank, int num_nodes) : node_rank_(node_rank), num_nodes_(num_nodes) {}

void Metrics::SetSources(Sources sources) {
  std::lock_guard lock(mu_);
  sources_ = std::move(sources);
}

Metrics::Traffic Metrics::Counted() const {
  if (!transport_) return {};
  return {transport_->sent_bytes(), transport_->received_bytes()};
}

void Metrics::OnExchange(const GroupView&) {
  const Traffic now = Counted();
  std::lock_guard lock(mu_);
  at_exchange_ = now;
}

void Metrics::OnGroup(const GroupView& g) {
  const Traffic now = Counted();
  std::lock_guard lock(mu_);
  const int sparse = g.sparse ? 1 : 0;
  ++groups_[{OpName(g.op), Encoding(sparse)}];
  if (g.exchange_begin_ns > 0) {
    // Stage B runs one group at a time, and every transport call after the start-up is one of
    // its groups': what was counted since OnExchange is this group's.
    const Traffic delta{now.sent - at_exchange_.sent, now.received - at_exchange_.received};
    traffic_[sparse].sent += delta.sent;
    traffic_[sparse].received += delta.received;
    if (sparse && g.ok && g.dense_bytes > delta.sent) saved_bytes_ += g.dense_bytes - delta.sent;
    if (g.exchange_end_ns > 0) {
      exchange_s_[sparse].Observe(Seconds(g.exchange_begin_ns, g.exchange_end_ns));
    }
  }
  if (sparse && g.prepare_end_ns > 0) {
    sparsify_s_.Observe(Seconds(g.prepare_begin_ns, g.prepare_end_ns));
  }
  if (g.op != CollectiveOp::kGradient || !g.ok) return;
  steps_ = std::max(steps_, g.step);
  int64_t first_ready = 0;
  for (const TensorView& t : g.tensors) {
    if (t.ready_ns > 0 && (first_ready == 0 || t.ready_ns < first_ready)) first_ready = t.ready_ns;
  }
  if (g.step > measuring_step_) {
    if (step_first_ready_ns_ > 0 && step_last_done_ns_ > step_first_ready_ns_) {
      iteration_s_ = Seconds(step_first_ready_ns_, step_last_done_ns_);
    }
    measuring_step_ = g.step;
    step_first_ready_ns_ = first_ready;
    step_last_done_ns_ = g.deliver_end_ns;
  } else if (g.step == measuring_step_) {
    if (first_ready > 0 && (step_first_ready_ns_ == 0 || first_ready < step_first_ready_ns_)) {
      step_first_ready_ns_ = first_ready;
    }
    step_last_done_ns_ = std::max(step_last_done_ns_, g.deliver_end_ns);
  }
}

void Metrics::OnPlan(const PlanView& plan) {
  std::lock_guard lock(mu_);
  plan_version_ = plan.version;
  predicted_s_ = plan.predicted_s;
}

void Metrics::OnIncident(Incident incident, std::string_view) {
  std::lock_guard lock(mu_);
  if (incident == Incident::kStall) ++stalls_;
  if (incident == Incident::kFailure) ++failures_;
}

std::string Metrics::Render() const {
  // The sources first, outside the lock: they take locks of their own.
  Sources sources;
  {
    std::lock_guard lock(mu_);
    sources = sources_;
  }
  const int workers = sources.connected_workers ? sources.connected_workers() : -1;
  const double residual = sources.residual_norm ? sources.residual_norm() : -1;
  using Type = Exposition::Type;
  Exposition e;
  std::lock_guard lock(mu_);
  e.Family("sparsync_node_info", Type::kGauge, "This daemon's node in its job (always 1).");
  e.Sample("sparsync_node_info",
           {{"node", std::to_string(node_rank_)}, {"num_nodes", std::to_string(num_nodes_)}}, 1);
  e.Family("sparsync_steps_total", Type::kCounter,
           "Training steps reduced: the highest round of a gradient group done on this node.");
  e.Sample("sparsync_steps_total", {}, static_cast<double>(steps_));
  e.Family("sparsync_groups_total", Type::kCounter,
           "Schedule entries done on this node (merge groups of gradients, and explicit "
           "collectives), by collective and encoding.");
  for (const auto& [key, count] : groups_) {
    e.Sample("sparsync_groups_total", {{"op", key.first}, {"encoding", key.second}},
             static_cast<double>(count));
  }
  for (auto [name, help] : {std::pair{"sparsync_sent_bytes_total",
                                      "Payload bytes this node handed to the transport for "
                                      "other nodes, by encoding."},
                            std::pair{"sparsync_received_bytes_total",
                                      "Payload bytes this node received from other nodes, by "
                                      "encoding."}}) {
    e.Family(name, Type::kCounter, help);
    const bool sent = std::string_view(name) == "sparsync_sent_bytes_total";
    for (int sparse = 0; sparse < 2; ++sparse) {
      e.Sample(name, {{"encoding", Encoding(sparse)}},
               static_cast<double>(sent ? traffic_[sparse].sent : traffic_[sparse].received));
    }
  }
  e.Family("sparsync_compression_saved_bytes_total", Type::kCounter,
           "Bytes compression kept off the network: for each sparse group, what a dense "
           "exchange would have sent less what was sent.");
  e.Sample("sparsync_compression_saved_bytes_total", {}, static_cast<double>(saved_bytes_));
  e.Family("sparsync_sparsify_seconds", Type::kHistogram,
           "Stage A of a sparse group: local sum, residual, selection and packing.");
  e.Write("sparsync_sparsify_seconds", {}, sparsify_s_);
  e.Family("sparsync_exchange_seconds", Type::kHistogram,
           "Stage B's transport calls of a group, unpacking included, by encoding.");
  for (int sparse = 0; sparse < 2; ++sparse) {
    e.Write("sparsync_exchange_seconds", {{"encoding", Encoding(sparse)}}, exchange_s_[sparse]);
  }
  e.Family("sparsync_plan_version", Type::kGauge,
           "The merge plan this node follows (0: fixed buckets while measuring).");
  e.Sample("sparsync_plan_version", {}, plan_version_);
  e.Family("sparsync_plan_predicted_iteration_seconds", Type::kGauge,
           "The current plan's predicted iteration time (0: no plan yet).");
  e.Sample("sparsync_plan_predicted_iteration_seconds", {}, predicted_s_);
  e.Family("sparsync_iteration_seconds", Type::kGauge,
           "The last step measured on this node, from its first gradient ready here to its last "
           "gradient group delivered.");
  e.Sample("sparsync_iteration_seconds", {}, iteration_s_);
  if (residual >= 0) {
    e.Family("sparsync_residual_norm", Type::kGauge,
             "L2 norm of the error-feedback residuals this node keeps in host memory.");
    e.Sample("sparsync_residual_norm", {}, residual);
  }
  e.Family("sparsync_stalls_total", Type::kCounter,
           "Stall warnings: a tensor some nodes have not reported for SPARSYNC_STALL_WARN_S "
           "(counted by node 0, whose coordinator sees them).");
  e.Sample("sparsync_stalls_total", {}, static_cast<double>(stalls_));
  e.Family("sparsync_failures_total", Type::kCounter, "Job failures seen by this node (0 or 1).");
  e.Sample("sparsync_failures_total", {}, static_cast<double>(failures_));
  if (workers >= 0) {
    e.Family("sparsync_connected_workers", Type::kGauge, "Workers connected to this daemon.");
    e.Sample("sparsync_connected_workers", {}, workers);
  }
  return e.text();
}

}  // namespace sparsync::observe
