// Metrics: the daemon's Prometheus metrics (SPARSYNC_METRICS_PORT, served by metrics_server.h),
// kept from what the executor, the agent and the coordinator tell their observers, and rendered
// in the text format (exposition.h) at each scrape. docs/operations.md lists them:
//   sparsync_node_info{node,num_nodes}                 1
//   sparsync_steps_total                               the highest gradient round reduced here
//   sparsync_groups_total{op,encoding}                 schedule entries done (encoding: dense or
//                                                      sparse; op: gradient, allreduce, ...)
//   sparsync_sent_bytes_total{encoding},
//   sparsync_received_bytes_total{encoding}            payload bytes of those entries' transport
//                                                      calls (counting_transport.h)
//   sparsync_compression_saved_bytes_total             sparse groups: the dense bytes a dense
//                                                      exchange would have sent, less those sent
//   sparsync_sparsify_seconds                          histogram: stage A of sparse groups
//   sparsync_exchange_seconds{encoding}                histogram: stage B's transport calls
//   sparsync_plan_version                              the merge plan followed (0: none yet)
//   sparsync_plan_predicted_iteration_seconds          that plan's predicted iteration time
//   sparsync_iteration_seconds                         the last step measured here: from its first
//                                                      gradient ready to its last group delivered
//   sparsync_residual_norm                             L2 norm of the error-feedback residuals
//                                                      kept on the host (computed at the scrape)
//   sparsync_stalls_total                              stall warnings (node 0's coordinator)
//   sparsync_failures_total                            the job failed here (0 or 1)
//   sparsync_connected_workers                         workers connected to this daemon
//
// Thread-safety: every method may be called from any thread (one mutex around the state, taken
// once per group; the sources are called at the scrape, outside it).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>

#include "daemon/observe/counting_transport.h"
#include "daemon/observe/exposition.h"
#include "daemon/observe/observer.h"

namespace sparsync::observe {

class Metrics : public Observer {
 public:
  Metrics(int node_rank, int num_nodes);

  // The transport whose bytes are counted (null: none); it outlives the metrics. REQUIRES:
  // before the first group.
  void CountBytesOf(const CountingTransport* transport) { transport_ = transport; }
  // What the metrics read at each scrape; either may be empty (its metric is then left out).
  struct Sources {
    std::function<int()> connected_workers;
    std::function<double()> residual_norm;
  };
  void SetSources(Sources sources);

  // The exposition of every metric.
  std::string Render() const;

  // Observer
  void OnExchange(const GroupView& group) override;
  void OnGroup(const GroupView& group) override;
  void OnPlan(const PlanView& plan) override;
  void OnIncident(Incident incident, std::string_view detail) override;

 private:
  struct Traffic {
    uint64_t sent = 0;
    uint64_t received = 0;
  };
  Traffic Counted() const;

  const int node_rank_;
  const int num_nodes_;
  const CountingTransport* transport_ = nullptr;
  mutable std::mutex mu_;
  // Guarded by mu_.
  Sources sources_;
  Traffic at_exchange_;  // the transport's counts when the current group's exchange began
  uint64_t steps_ = 0;
  std::map<std::pair<std::string, std::string>, uint64_t> groups_;  // (op, encoding)
  Traffic traffic_[2];  // by encoding: dense, sparse
  uint64_t saved_bytes_ = 0;
  Histogram sparsify_s_{SecondsBuckets()};
  Histogram exchange_s_[2]{Histogram(SecondsBuckets()), Histogram(SecondsBuckets())};
  uint32_t plan_version_ = 0;
  double predicted_s_ = 0;
  // The step being measured: its first gradient ready, its last group's end.
  uint64_t measuring_step_ = 0;
  int64_t step_first_ready_ns_ = 0;
  int64_t step_last_done_ns_ = 0;
  double iteration_s_ = 0;
  uint64_t stalls_ = 0;
  uint64_t failures_ = 0;
};

}  // namespace sparsync::observe
