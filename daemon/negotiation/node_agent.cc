#include "daemon/negotiation/node_agent.h"

#include <spdlog/spdlog.h>

namespace sparsync::negotiation {
namespace {
constexpr auto kPollWait = std::chrono::milliseconds(500);
}

NodeAgent::NodeAgent(CoordinatorLink* link, int node_rank, bool direct, BindSlotFn bind_slot,
                     std::chrono::milliseconds give_up_after)
    : link_(link),
      node_rank_(node_rank),
      direct_(direct),
      bind_slot_(std::move(bind_slot)),
      give_up_after_(give_up_after) {}

NodeAgent::~NodeAgent() { Stop(); }

void NodeAgent::Start() {
  if (direct_) return;
  reporter_ = std::thread([this] {
    std::unique_lock lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stopping_ || !outbox_.empty(); });
      if (stopping_) return;
      std::vector<ReadyTensorReport> batch(std::make_move_iterator(outbox_.begin()),
                                           std::make_move_iterator(outbox_.end()));
      outbox_.clear();
      lock.unlock();
      SendReports(std::move(batch));
      lock.lock();
    }
  });
  poller_ = std::thread([this] { PollLoop(); });
}

void NodeAgent::Stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (reporter_.joinable()) reporter_.join();
  if (poller_.joinable()) poller_.join();
}

void NodeAgent::Report(ReadyTensorReport report) {
  if (direct_) {
    SendReports({std::move(report)});
    return;
  }
  {
    std::lock_guard lock(mu_);
    outbox_.push_back(std::move(report));
  }
  cv_.notify_all();
}

void NodeAgent::SendReports(std::vector<ReadyTensorReport> batch) {
  std::lock_guard send_lock(send_mu_);
  std::vector<TensorMeta> new_tensors;
  std::vector<ReportedReady> ready;
  std::vector<std::pair<size_t, std::string>> new_names;  // new_tensors index -> signature
  for (auto& r : batch) {
    ReportedReady rr;
    rr.worker_dim0 = std::move(r.worker_dim0);
    rr.ready_ns = r.ready_ns;
    uint32_t slot = r.slot;
    if (slot == 0) {
      std::string key = r.meta.SignatureKey();
      auto it = slots_.find(key);
      if (it != slots_.end()) {
        slot = it->second;
        bind_slot_(r.meta.name, slot);  // the table forgot it (the tensor was re-registered)
      }
    }
    if (slot != 0) {
      rr.slot = slot;
    } else {
      rr.new_index = static_cast<uint32_t>(new_tensors.size());
      new_names.emplace_back(new_tensors.size(), r.meta.SignatureKey());
      new_tensors.push_back(std::move(r.meta));
    }
    ready.push_back(std::move(rr));
  }
  // Bind before the coordinator can schedule: the table waits briefly for unbound slots anyway.
  auto slots = link_->Report(node_rank_, new_tensors, ready);
  if (!slots.ok()) {
    if (slots.status().code() == StatusCode::kAborted) return;  // the fatal entry will follow
    InjectFatal(slots.status());
    return;
  }
  if (slots->size() != new_tensors.size()) {
    InjectFatal(Internal("the coordinator answered a report with the wrong number of slots"));
    return;
  }
  for (size_t i = 0; i < new_tensors.size(); ++i) {
    slots_[new_names[i].second] = (*slots)[i];
    bind_slot_(new_tensors[i].name, (*slots)[i]);
  }
}

void NodeAgent::PollLoop() {
  auto failing_since = std::chrono::steady_clock::now();
  bool failing = false;
  std::unique_lock lock(mu_);
  while (!stopping_) {
    uint64_t after = received_seq_;
    lock.unlock();
    auto entries = link_->Poll(node_rank_, after, kPollWait);
    lock.lock();
    if (stopping_) break;
    if (!entries.ok()) {
      auto now = std::chrono::steady_clock::now();
      if (!failing) {
        failing = true;
        failing_since = now;
        spdlog::warn("coordinator poll failed: {}", entries.status().message());
      }
      if (now - failing_since > give_up_after_) {
        lock.unlock();
        InjectFatal(Unavailable("lost the coordinator on node 0: " + entries.status().message()));
        lock.lock();
      }
      cv_.wait_for(lock, std::chrono::milliseconds(200), [&] { return stopping_; });
      continue;
    }
    failing = false;
    for (auto& e : *entries) {
      if (e.seq <= received_seq_) continue;
      received_seq_ = e.seq;
      inbox_.push_back(std::move(e));
    }
    if (!entries->empty()) cv_.notify_all();
  }
}

void NodeAgent::InjectFatal(const Status& error) {
  {
    std::lock_guard lock(mu_);
    if (fatal_injected_) return;
    fatal_injected_ = true;
    ScheduleEntry e;
    e.seq = ~0ull;
    e.fatal = error;
    inbox_.push_back(std::move(e));
  }
  cv_.notify_all();
}

std::vector<ScheduleEntry> NodeAgent::Next(std::chrono::milliseconds wait) {
  return FollowPlans(Receive(wait));
}

std::vector<ScheduleEntry> NodeAgent::FollowPlans(std::vector<ScheduleEntry> entries) {
  std::vector<ScheduleEntry> out;
  out.reserve(entries.size());
  for (ScheduleEntry& e : entries) {
    if (e.plan) {
      spdlog::info("following merge plan v{} ({}) from step {}: {} groups, predicted {:.2f} ms",
                   e.plan->version, e.plan->planner, e.plan->effective_step,
                   e.plan->groups.size(), e.plan->predicted_s * 1e3);
      plan_ = *e.plan;
      continue;
    }
    if (e.plan_version != 0 && e.fatal.ok()) {
      // The coordinator's groups are the plan it announced; a mismatch is a bug, not noise.
      bool matches = plan_ && plan_->version == e.plan_version &&
                     e.group_index < plan_->groups.size() &&
                     plan_->groups[e.group_index].size() == e.group.size();
      for (size_t i = 0; matches && i < e.group.size(); ++i) {
        matches = plan_->groups[e.group_index][i] == e.group[i].slot;
      }
      if (!matches) {
        e.fatal = Internal("schedule entry " + std::to_string(e.seq) + " claims group " +
                           std::to_string(e.group_index) + " of plan v" +
                           std::to_string(e.plan_version) + " but does not match the plan node " +
                           std::to_string(node_rank_) + " received");
        e.group.clear();
      }
    }
    out.push_back(std::move(e));
  }
  return out;
}

std::vector<ScheduleEntry> NodeAgent::Receive(std::chrono::milliseconds wait) {
  std::vector<ScheduleEntry> out;
  if (direct_) {
    uint64_t after;
    {
      std::lock_guard lock(mu_);
      while (!inbox_.empty()) {  // locally injected failures
        out.push_back(std::move(inbox_.front()));
        inbox_.pop_front();
      }
      after = received_seq_;
    }
    if (!out.empty()) return out;
    auto entries = link_->Poll(node_rank_, after, wait);
    if (!entries.ok()) return out;
    std::lock_guard lock(mu_);
    for (auto& e : *entries) {
      if (e.seq <= received_seq_) continue;
      received_seq_ = e.seq;
      out.push_back(std::move(e));
    }
    return out;
  }
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, wait, [&] { return stopping_ || !inbox_.empty(); });
  while (!inbox_.empty()) {
    out.push_back(std::move(inbox_.front()));
    inbox_.pop_front();
  }
  return out;
}

void NodeAgent::Fail(const Status& error) {
  Status st = link_->Fail(node_rank_, error);
  if (!st.ok()) {
    spdlog::error("could not tell the coordinator about the failure: {}", st.message());
    InjectFatal(error);
  }
}

void NodeAgent::Leave() { (void)link_->Leave(node_rank_); }

}  // namespace sparsync::negotiation
