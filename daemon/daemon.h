// Daemon: the composition root. Builds every part from the Config, starts them in order, waits
// for a signal and stops them in reverse. Holds no algorithm.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>

#include "daemon/common/config.h"
#include "daemon/common/job_failure.h"
#include "daemon/observe/observer.h"

namespace sparsync {

namespace negotiation {
class CoordinatorCore;
class CoordinatorServer;
class CoordinatorLink;
class NodeAgent;
}  // namespace negotiation
namespace transport {
class Transport;
class RendezvousStore;
}  // namespace transport
namespace pipeline {
class TensorTable;
class SparseReducers;
class Executor;
}  // namespace pipeline
namespace device {
class DeviceIntake;
}
namespace intake {
class IntakeServer;
class WorkerHandler;
}
namespace observe {
class Timeline;
class Metrics;
class MetricsServer;
class CountingTransport;
}  // namespace observe

class Daemon {
 public:
  explicit Daemon(Config config);
  ~Daemon();

  // Joins the cluster, connects the transport and opens the control socket. Returns early (not
  // OK) once Interrupt was called.
  Status Start();
  // Drains: pending collectives fail with a clear error on this node and, through the
  // coordinator, on every node; workers are told, the socket is removed.
  void Stop();
  // A stop signal arrived (any thread, also during Start): ends every wait of Start and wakes
  // WaitForInterrupt. Idempotent.
  void Interrupt();
  void WaitForInterrupt();
  bool interrupted() const { return interrupted_; }

 private:
  Status StartParts();
  // Makes the parts Start may be blocked in give up (the link's calls, the coordinator's waits,
  // the transport) while Start runs. REQUIRES: parts_mu_ held.
  void CancelStartWaits();
  // The timeline (always there, recording when SPARSYNC_TIMELINE or a worker asks) and, with
  // SPARSYNC_METRICS_PORT, the metrics, which count the transport's bytes.
  Status StartObservers();
  Status ServeMetrics();
  transport::Transport* transport() const;  // the counting transport when there is one

  Config config_;
  observe::ObserverList observers_;
  std::unique_ptr<observe::Timeline> timeline_;
  std::unique_ptr<observe::Metrics> metrics_;
  std::unique_ptr<observe::MetricsServer> metrics_server_;
  std::unique_ptr<observe::CountingTransport> counting_;
  std::unique_ptr<negotiation::CoordinatorCore> core_;
  std::unique_ptr<negotiation::CoordinatorServer> server_;
  std::unique_ptr<negotiation::CoordinatorLink> remote_link_;
  negotiation::CoordinatorLink* link_ = nullptr;
  std::unique_ptr<transport::RendezvousStore> store_;
  std::unique_ptr<transport::Transport> transport_;
  JobFailure failure_;  // the node's one sticky failure; observed by the handler and the agent
  std::unique_ptr<pipeline::TensorTable> table_;
  std::unique_ptr<device::DeviceIntake> device_;
  std::unique_ptr<intake::WorkerHandler> handler_;
  std::unique_ptr<negotiation::NodeAgent> agent_;
  std::unique_ptr<pipeline::SparseReducers> sparse_;
  std::unique_ptr<pipeline::Executor> executor_;
  std::unique_ptr<intake::IntakeServer> intake_;
  bool stopped_ = false;
  bool joined_ = false;
  std::mutex parts_mu_;  // Start's assignments of core_, remote_link_, transport_ vs Interrupt
  bool starting_ = false;  // guarded by parts_mu_
  std::condition_variable interrupted_cv_;
  std::atomic<bool> interrupted_{false};
};

}  // namespace sparsync
