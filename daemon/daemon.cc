#include "daemon/daemon.h"

#include <spdlog/spdlog.h>

#include <filesystem>
#include <optional>
#include <vector>

#include "daemon/common/job_token.h"
#include "daemon/common/private_files.h"
#include "daemon/device/device_dense_path.h"
#include "daemon/device/device_intake.h"
#include "daemon/device/device_topk_path.h"
#include "daemon/intake/server.h"
#include "daemon/intake/worker_handler.h"
#include "daemon/negotiation/coordinator_core.h"
#include "daemon/negotiation/grpc_link.h"
#include "daemon/negotiation/grpc_service.h"
#include "daemon/negotiation/grpc_tls.h"
#include "daemon/negotiation/node_agent.h"
#include "daemon/negotiation/startup_heartbeat.h"
#include "daemon/observe/counting_transport.h"
#include "daemon/observe/metrics.h"
#include "daemon/observe/metrics_server.h"
#include "daemon/observe/timeline.h"
#include "daemon/pipeline/calibration.h"
#include "daemon/pipeline/executor.h"
#include "daemon/pipeline/host_paths.h"
#include "daemon/pipeline/tensor_table.h"
#include "daemon/transport/gloo/gloo_transport.h"
#include "daemon/transport/nccl/create_nccl_transport.h"

namespace sparsync {
namespace {

// The Gloo rendezvous goes through the coordinator's key-value store.
class LinkStore : public transport::RendezvousStore {
 public:
  explicit LinkStore(negotiation::CoordinatorLink* link) : link_(link) {}
  Status Set(const std::string& key, const std::string& value) override {
    return link_->StoreSet(key, value);
  }
  Result<std::vector<std::string>> Get(const std::vector<std::string>& keys,
                                       std::chrono::milliseconds timeout) override {
    return link_->StoreGet(keys, timeout);
  }

 private:
  negotiation::CoordinatorLink* link_;
};

// How long a node tolerates an unreachable coordinator, and the coordinator a silent node.
std::chrono::milliseconds LivenessWindow(const Config& c) {
  return std::min(c.timeout(), std::chrono::milliseconds(10000));
}

}  // namespace

Daemon::Daemon(Config config) : config_(std::move(config)) {}

Daemon::~Daemon() { Stop(); }

void Daemon::Interrupt() {
  interrupted_ = true;
  {
    std::lock_guard lock(parts_mu_);
    if (starting_) CancelStartWaits();
  }
  interrupted_cv_.notify_all();
}

void Daemon::WaitForInterrupt() {
  std::unique_lock lock(parts_mu_);
  interrupted_cv_.wait(lock, [&] { return interrupted_.load(); });
}

void Daemon::CancelStartWaits() {
  if (core_) core_->Cancel();
  if (remote_link_) remote_link_->Cancel();
  if (transport_) transport_->Abort(Aborted("the daemon was stopped during start-up"));
}

transport::Transport* Daemon::transport() const {
  return counting_ ? counting_.get() : transport_.get();
}

Status Daemon::StartObservers() {
  timeline_ = std::make_unique<observe::Timeline>(config_.node_rank, config_.num_nodes);
  observers_.Add(timeline_.get());
  if (!config_.timeline.empty()) SPARSYNC_RETURN_IF_ERROR(timeline_->Start(config_.timeline));
  if (config_.metrics_port != 0) {
    // Made now so that the planner's first news reach them; their sources and the HTTP server
    // come once the parts they read exist (ServeMetrics).
    metrics_ = std::make_unique<observe::Metrics>(config_.node_rank, config_.num_nodes);
    observers_.Add(metrics_.get());
  }
  // Every failure but this daemon's own shutdown and the job's normal end is an incident.
  failure_.Observe([this](const Status& e, JobFailure::Source s) {
    if (s == JobFailure::Source::kShutdown || (handler_ && handler_->IsJobEnd(e))) return;
    observers_.OnIncident(observe::Incident::kFailure, e.message());
  });
  return Status::Ok();
}

Status Daemon::ServeMetrics() {
  if (config_.metrics_port == 0) return Status::Ok();
  observe::Metrics::Sources sources;
  intake::WorkerHandler* handler = handler_.get();
  sources.connected_workers = [handler] { return handler->connected_workers(); };
  pipeline::SparseReducers* sparse = sparse_.get();
  sources.residual_norm = [sparse] { return sparse->state().HostResidualNorm(); };
  metrics_->SetSources(std::move(sources));
  metrics_server_ = std::make_unique<observe::MetricsServer>(metrics_.get());
  const std::string address =
      config_.metrics_address.empty() ? config_.listen : config_.metrics_address;
  return metrics_server_->Start(address, config_.metrics_port);
}

Status Daemon::Start() {
  {
    std::lock_guard lock(parts_mu_);
    starting_ = true;
  }
  Status st = StartParts();
  std::lock_guard lock(parts_mu_);
  starting_ = false;
  if (interrupted_ && !st.ok()) return Aborted("stopped during start-up (" + st.message() + ")");
  return st;
}

Status Daemon::StartParts() {
  spdlog::info("starting: {}", config_.Describe());
  // Checked again when the socket is bound; here so that a refused directory fails the daemon
  // before it joins the other nodes and calibrates, not seconds later.
  const std::string socket_dir = std::filesystem::path(config_.socket_path).parent_path().string();
  SPARSYNC_RETURN_IF_ERROR(EnsurePrivateDirectory(socket_dir.empty() ? "." : socket_dir,
                                                  "the directory of SPARSYNC_SOCKET"));
  SPARSYNC_RETURN_IF_ERROR(StartObservers());
  if (config_.job_token_generated) {
    spdlog::info("no job token given: generated one; the workers of this node read it from {}{}",
                 WorkerTokenPath(config_.socket_path),
                 config_.num_nodes > 1 ? ", the other nodes need it in SPARSYNC_JOB_TOKEN_FILE"
                                       : "");
  }
  auto server_credentials = negotiation::ServerCredentials(config_.tls);
  if (!server_credentials.ok()) return server_credentials.status();
  auto channel_credentials = negotiation::ChannelCredentials(config_.tls);
  if (!channel_credentials.ok()) return channel_credentials.status();
  if (config_.node_rank == 0) {
    negotiation::CoordinatorOptions options;
    options.num_nodes = config_.num_nodes;
    options.local_size = config_.local_size;
    options.bucket_bytes = config_.merge.bucket_bytes;
    options.cycle = std::chrono::microseconds(static_cast<int64_t>(config_.cycle_ms * 1000));
    options.stall_warn = config_.stall_warn();
    options.timeout = config_.timeout();
    options.node_liveness = LivenessWindow(config_);
    options.merge.planners = config_.merge.planners;
    options.merge.bucket_bytes = config_.merge.bucket_bytes;
    options.merge.warmup_steps = config_.merge.warmup_steps;
    options.merge.replan_drift = config_.merge.replan_drift;
    options.merge.replan_steps = config_.merge.replan_steps;
    options.merge.dense_by_default = config_.compressor == Compressor::kNone;
    options.merge.choose_dense = config_.ChoosesDense();
    {
      std::lock_guard lock(parts_mu_);
      core_ = std::make_unique<negotiation::CoordinatorCore>(options, config_.local_size,
                                                             config_.job_token);
      if (interrupted_) CancelStartWaits();
    }
    core_->SetCostModel(planning::EstimatedCostModel(
        config_.num_nodes, config_.density, config_.compressor == Compressor::kNone));
    core_->SetObserver(&observers_);
    core_->Start();
    if (config_.num_nodes > 1) {
      server_ = std::make_unique<negotiation::CoordinatorServer>(core_.get(),
                                                                 *server_credentials);
      SPARSYNC_RETURN_IF_ERROR(server_->Start(config_.coordinator, config_.num_nodes));
      spdlog::info("coordinator serving on {}{}", config_.coordinator,
                   config_.tls.enabled() ? " (mutual TLS)" : "");
    }
    link_ = core_.get();
  } else {
    std::lock_guard lock(parts_mu_);
    remote_link_ = std::make_unique<negotiation::GrpcCoordinatorLink>(
        config_.coordinator, config_.job_token, std::chrono::seconds(10), *channel_credentials);
    link_ = remote_link_.get();
    if (interrupted_) CancelStartWaits();
  }

  negotiation::JoinInfo join{negotiation::kProtocolVersion, config_.job_token, config_.node_rank,
                             config_.num_nodes, config_.local_size, ""};
  SPARSYNC_RETURN_IF_ERROR(link_->Join(join, config_.timeout()));
  joined_ = true;
  spdlog::info("all {} node(s) joined", config_.num_nodes);
  // Until the agent polls, the mesh and calibration may outlast the coordinator's liveness window.
  std::optional<negotiation::StartupHeartbeat> heartbeat;
  if (config_.node_rank != 0) {
    heartbeat.emplace(link_, config_.node_rank, LivenessWindow(config_) / 4);
  }

  store_ = std::make_unique<LinkStore>(link_);
  if (config_.transport == TransportKind::kNccl) {
    // The CUDA runtime and NCCL that the device intake and the local reduce load, too.
    auto transport = transport::CreateNcclTransport(
        config_.node_rank, config_.num_nodes, store_.get(), config_.timeout(), /*device=*/0,
        transport::NcclLibraries{config_.cudart, config_.libnccl});
    if (!transport.ok()) return transport.status();
    std::lock_guard lock(parts_mu_);
    transport_ = std::move(*transport);
    if (interrupted_) CancelStartWaits();
    spdlog::info("NCCL communicator ready");
  } else {
    // A broken connection that names no node waits for the coordinator's liveness verdict, which
    // names it, plus the time that verdict takes to reach every node's next poll.
    auto transport = transport::GlooTransport::Create(
        config_.node_rank, config_.num_nodes, config_.listen, store_.get(), config_.timeout(),
        LivenessWindow(config_) + std::chrono::seconds(3));
    if (!transport.ok()) return transport.status();
    std::lock_guard lock(parts_mu_);
    transport_ = std::move(*transport);
    if (interrupted_) CancelStartWaits();
    spdlog::info("Gloo mesh connected");
  }
  if (metrics_) {
    counting_ = std::make_unique<observe::CountingTransport>(transport_.get());
    metrics_->CountBytesOf(counting_.get());
  }

  pipeline::World world{config_.node_rank, config_.num_nodes, config_.local_size};
  if (config_.merge.calibrate) {
    // Every node takes part; node 0's fit is broadcast, and its coordinator plans with it.
    pipeline::CalibrationOptions calibration;
    calibration.budget_s = 2.0;
    calibration.dense_too = config_.ChoosesDense();
    auto cost = pipeline::CalibrateCostModel(config_, world, transport(), calibration);
    if (!cost.ok()) return cost.status();
    spdlog::info("measured cost model: {}", cost->ToString());
    observers_.OnIncident(observe::Incident::kCalibration, cost->ToString());
    if (core_) core_->SetCostModel(*cost);
  }
  // The reduce paths, device first: a group takes the first that takes it (reduce_path.h).
  sparse_ = std::make_unique<pipeline::SparseReducers>(config_, config_.node_rank,
                                                       config_.num_nodes, transport());
  if (config_.compressor != Compressor::kNone) {
    // Fail at start, not at the first gradient, if the compressor cannot be built.
    auto probe = sparse_->For(std::nullopt, 0);
    if (!probe.ok()) return probe.status();
  }
  std::vector<std::unique_ptr<pipeline::ReducePath>> paths;
  device::DeviceIntakeOptions device_options{config_.cudart, config_.local_nccl, config_.libnccl,
                                             nullptr};
  if (config_.device_sparsify) {
    auto plugin = std::make_shared<device::SparsifyPlugin>(config_.sparsify_library);
    SPARSYNC_RETURN_IF_ERROR(plugin->LoadExplicit());
    paths.push_back(std::make_unique<device::DeviceTopKPath>(config_, plugin, &sparse_->state()));
    paths.push_back(device::MakeDeviceDensePath(config_, plugin, transport()));
  }
  for (auto& path : pipeline::HostPaths(world, transport())) paths.push_back(std::move(path));
  // A CUDA tensor's node sum stays on its GPU when a path wants tensors like it there.
  std::vector<const pipeline::ReducePath*> all_paths;
  for (const auto& path : paths) all_paths.push_back(path.get());
  device_options.keep_on_device = [all_paths](const TensorMeta& meta) {
    for (const pipeline::ReducePath* path : all_paths) {
      if (path->KeepsOnDevice(meta)) return true;
    }
    return false;
  };

  device_ = std::make_unique<device::DeviceIntake>(std::move(device_options));
  SPARSYNC_RETURN_IF_ERROR(device_->LoadExplicitLibraries());
  table_ = std::make_unique<pipeline::TensorTable>(world, &failure_);
  agent_ = std::make_unique<negotiation::NodeAgent>(link_, config_.node_rank,
                                                    /*direct=*/core_ != nullptr, &failure_,
                                                    LivenessWindow(config_), &observers_);
  handler_ = std::make_unique<intake::WorkerHandler>(
      world, config_.job_token, &failure_, table_.get(), device_.get(),
      [this](negotiation::ReadyTensor t) { agent_->Report(std::move(t)); },
      std::make_shared<intake::RegionBudget>(config_.max_registered_bytes));
  // The handler answers every pending collective, then the agent tells the coordinator.
  failure_.Observe([this](const Status& e, JobFailure::Source s) { handler_->OnFailure(e, s); });
  failure_.Observe([this](const Status& e, JobFailure::Source s) { agent_->OnFailure(e, s); });
  handler_->SetTimelineControl([this](const std::string& path) {
    if (!path.empty()) return timeline_->Start(path);
    timeline_->Stop();
    return Status::Ok();
  });
  handler_->SetRankReport(
      [this](negotiation::RankEvent event, int rank) { agent_->ReportRank(event, rank); });

  pipeline::ExecutorOptions executor_options;
  executor_options.observer = &observers_;
  executor_options.on_join_done = [this](int last_rank) { handler_->OnJoinDone(last_rank); };
  if (core_ && config_.merge.calibrate) {
    // Node 0's own group costs keep the planner's model current while the job trains.
    negotiation::CoordinatorCore* core = core_.get();
    executor_options.on_group_cost = [core](const pipeline::GroupCost& cost) {
      core->RecordGroupCost(cost.elements, cost.sparse, cost.sparsify_s, cost.exchange_s);
    };
  }
  executor_ = std::make_unique<pipeline::Executor>(
      world, table_.get(), transport(),
      [this](std::chrono::milliseconds wait) { return agent_->Next(wait); }, &failure_,
      sparse_.get(), std::move(paths), std::move(executor_options));
  heartbeat.reset();  // the agent polls from here on
  agent_->Start();
  executor_->Start();
  if (interrupted_) return Aborted("stopped during start-up");
  intake_ = std::make_unique<intake::IntakeServer>(config_.socket_path, config_.node_rank,
                                                   handler_.get(), config_.timeout(),
                                                   config_.job_token);
  SPARSYNC_RETURN_IF_ERROR(intake_->Start());
  return ServeMetrics();
}

void Daemon::Stop() {
  if (stopped_) return;
  stopped_ = true;
  const Status stopping = ShutdownReason(config_.node_rank);
  // The agent's loops stop first: a poll or report that fails from here on (node 0 may be
  // stopping too, at the end of a job) is this stop's doing, not news.
  if (agent_) agent_->BeginStop();
  if (handler_) {
    // Every waiting worker hears it, and the agent tells the coordinator, which fails the
    // collectives of every node with this reason (a second failure changes nothing).
    failure_.Fail(stopping, JobFailure::Source::kShutdown);
  } else if (link_ && joined_) {
    (void)link_->Leave(config_.node_rank);  // started half-way: the others need not wait
  }
  if (intake_) intake_->Stop(failure_.failed() ? failure_.status() : stopping);
  // Nothing may now wait out a deadline: the link's calls end, a collective blocked on a peer
  // ends (issue 16, D9).
  if (remote_link_) remote_link_->Cancel();
  if (transport_) transport_->Abort(stopping);
  if (executor_) executor_->Stop();
  if (agent_) agent_->Stop();
  if (server_) server_->Stop();
  if (core_) core_->Stop();
  if (metrics_server_) metrics_server_->Stop();
  if (timeline_) timeline_->Stop();  // after the executor: its last groups are in the file
  spdlog::info("stopped");
}

}  // namespace sparsync
