#include "daemon/negotiation/node_agent.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "daemon/common/thread_name.h"

namespace sparsync::negotiation {
namespace {
constexpr auto kPollWait = std::chrono::milliseconds(500);
constexpr auto kPollWarnAfter = std::chrono::milliseconds(1000);

int64_t SteadyNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

// Adds one piece of rank news to a report's. The coordinator applies a report's returns before
// its departures, so a rank that went and came back within one report is left out of both.
void AddRankNews(RankEvent event, int32_t rank, RankNews* news) {
  switch (event) {
    case RankEvent::kJoined:
      news->joined.push_back(rank);
      return;
    case RankEvent::kGone:
      news->gone.push_back(rank);
      return;
    case RankEvent::kBack:
      if (auto it = std::find(news->gone.begin(), news->gone.end(), rank); it != news->gone.end()) {
        news->gone.erase(it);
      } else {
        news->back.push_back(rank);
      }
      return;
  }
}
}  // namespace

NodeAgent::NodeAgent(CoordinatorLink* link, int node_rank, bool direct, JobFailure* failure,
                     std::chrono::milliseconds give_up_after, observe::Observer* observer,
                     std::chrono::milliseconds hold_limit)
    : link_(link),
      node_rank_(node_rank),
      direct_(direct),
      failure_(failure),
      give_up_after_(give_up_after),
      observer_(observer),
      hold_limit_(hold_limit) {}

NodeAgent::~NodeAgent() { Stop(); }

void NodeAgent::Start() {
  // The reporter sends the queued reports (remote) and those held past hold_limit_ (both modes:
  // in direct mode everything else is sent on the reporting thread).
  reporter_ = std::thread([this] {
    NameThisThread("ssd-report");
    std::unique_lock send_lock(send_mu_, std::defer_lock);
    std::unique_lock lock(mu_);
    while (true) {
      auto work = [&] { return stopping_ || !outbox_.empty(); };
      if (groups_held_ > 0) {
        Clock::time_point first = Clock::time_point::max();
        for (const HeldGroup& g : held_) {
          if (!g.held.empty()) first = std::min(first, g.since);
        }
        outbox_cv_.wait_until(lock, first + hold_limit_, work);
      } else {
        // Woken by the first group held, to arm its deadline.
        outbox_cv_.wait(lock, [&] { return work() || groups_held_ > 0; });
      }
      if (stopping_) return;
      if (direct_) {  // send_mu_ comes before mu_
        lock.unlock();
        send_lock.lock();
        lock.lock();
      }
      std::vector<ReadyTensor> batch(std::make_move_iterator(outbox_.begin()),
                                     std::make_move_iterator(outbox_.end()));
      outbox_.clear();
      const size_t queued = batch.size();
      TakeHeld(/*all=*/false, Clock::now() - hold_limit_, &batch);
      reports_in_flight_ += static_cast<int>(batch.size() - queued);
      lock.unlock();
      if (!batch.empty()) SendReportsLocked(std::move(batch));
      if (send_lock.owns_lock()) send_lock.unlock();
      lock.lock();
    }
  });
  if (direct_) return;
  poller_ = std::thread([this] {
    NameThisThread("ssd-poll");
    PollLoop();
  });
}

void NodeAgent::BeginStop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  outbox_cv_.notify_all();
  inbox_cv_.notify_all();
  slots_cv_.notify_all();
}

void NodeAgent::Stop() {
  BeginStop();
  if (reporter_.joinable()) reporter_.join();
  if (poller_.joinable()) poller_.join();
}

void NodeAgent::Report(ReadyTensor tensor) {
  std::unique_lock send_lock(send_mu_, std::defer_lock);
  if (direct_) send_lock.lock();  // sent below, in the order taken
  std::vector<ReadyTensor> batch;
  bool wake = false;
  {
    std::lock_guard lock(mu_);
    if (tensor.event_rank >= 0) {
      TakeHeld(/*all=*/true, Clock::time_point::max(), &batch);  // the tensors before it
      batch.push_back(std::move(tensor));
    } else if (!Hold(&tensor, &batch, &wake)) {
      batch.push_back(std::move(tensor));
    }
    reports_in_flight_ += static_cast<int>(batch.size());
    if (!direct_) {
      for (ReadyTensor& r : batch) outbox_.push_back(std::move(r));
      wake = wake || !batch.empty();
      batch.clear();
    }
  }
  if (!batch.empty()) SendReportsLocked(std::move(batch));
  if (wake) outbox_cv_.notify_one();
}

bool NodeAgent::Hold(ReadyTensor* tensor, std::vector<ReadyTensor>* batch, bool* wake) {
  if (hold_position_.empty()) return false;
  auto slot = slot_by_signature_.find(tensor->meta.SignatureKey());
  if (slot == slot_by_signature_.end()) return false;
  auto at = hold_position_.find(slot->second);
  if (at == hold_position_.end()) return false;
  HeldGroup& group = held_[at->second.first];
  const uint32_t pos = at->second.second;
  // Ready again before its group was complete: a round this plan does not describe. What is
  // held goes, and this tensor starts the group's next round.
  if (group.seen[pos]) EndRound(&group, batch);
  group.seen[pos] = true;
  if (++group.seen_count == group.seen.size()) {
    EndRound(&group, batch);
    batch->push_back(std::move(*tensor));
    return true;
  }
  if (group.expired) return false;
  if (group.held.empty()) {
    group.since = Clock::now();
    if (groups_held_++ == 0) *wake = true;
  }
  group.held.push_back(std::move(*tensor));
  return true;
}

void NodeAgent::ReleaseGroup(HeldGroup* group, std::vector<ReadyTensor>* batch) {
  if (group->held.empty()) return;
  for (ReadyTensor& r : group->held) batch->push_back(std::move(r));
  group->held.clear();
  --groups_held_;
}

void NodeAgent::EndRound(HeldGroup* group, std::vector<ReadyTensor>* batch) {
  ReleaseGroup(group, batch);
  std::fill(group->seen.begin(), group->seen.end(), false);
  group->seen_count = 0;
  group->expired = false;
}

void NodeAgent::TakeHeld(bool all, Clock::time_point cutoff, std::vector<ReadyTensor>* batch) {
  if (groups_held_ == 0) return;
  for (HeldGroup& group : held_) {
    if (group.held.empty() || (!all && group.since > cutoff)) continue;
    ReleaseGroup(&group, batch);
    group.expired = true;
  }
}

void NodeAgent::HoldBy(const PlanInfo& plan) {
  std::unique_lock send_lock(send_mu_, std::defer_lock);
  if (direct_) send_lock.lock();
  std::vector<ReadyTensor> batch;
  {
    std::lock_guard lock(mu_);
    TakeHeld(/*all=*/true, Clock::time_point::max(), &batch);  // the previous plan's
    hold_position_.clear();
    held_.clear();
    for (const std::vector<uint32_t>& slots : plan.groups) {
      if (slots.size() < 2) continue;  // nothing to wait for
      for (size_t i = 0; i < slots.size(); ++i) {
        hold_position_[slots[i]] = {static_cast<uint32_t>(held_.size()),
                                    static_cast<uint32_t>(i)};
      }
      HeldGroup group;
      group.seen.assign(slots.size(), false);
      held_.push_back(std::move(group));
    }
    reports_in_flight_ += static_cast<int>(batch.size());
    if (!direct_) {
      for (ReadyTensor& r : batch) outbox_.push_back(std::move(r));
    }
  }
  if (batch.empty()) return;
  if (direct_) {
    SendReportsLocked(std::move(batch));
  } else {
    outbox_cv_.notify_one();
  }
}

void NodeAgent::SendReports(std::vector<ReadyTensor> batch) {
  std::lock_guard send_lock(send_mu_);
  SendReportsLocked(std::move(batch));
}

void NodeAgent::SendReportsLocked(std::vector<ReadyTensor> batch) {
  std::vector<TensorMeta> new_tensors;
  std::vector<ReportedReady> ready;
  RankNews ranks;
  {
    std::lock_guard lock(mu_);
    for (auto& r : batch) {
      if (r.event_rank >= 0) {
        AddRankNews(r.event, r.event_rank, &ranks);
        continue;
      }
      ReportedReady rr;
      rr.worker_dim0 = std::move(r.worker_dim0);
      rr.ready_ns = r.ready_ns;
      auto known = slot_by_signature_.find(r.meta.SignatureKey());
      if (known != slot_by_signature_.end()) {
        rr.slot = known->second;
      } else {
        rr.new_index = static_cast<uint32_t>(new_tensors.size());
        new_tensors.push_back(std::move(r.meta));
      }
      ready.push_back(std::move(rr));
    }
  }
  auto slots = link_->Report(node_rank_, new_tensors, ready, ranks);
  Status error;
  if (!slots.ok()) {
    error = slots.status();
  } else if (slots->size() != new_tensors.size()) {
    error = Internal("the coordinator answered a report with the wrong number of slots");
  }
  {
    std::lock_guard lock(mu_);
    if (error.ok()) {
      for (size_t i = 0; i < new_tensors.size(); ++i) {
        slot_by_signature_[new_tensors[i].SignatureKey()] = (*slots)[i];
        name_by_slot_[(*slots)[i]] = new_tensors[i].name;
      }
    }
    reports_in_flight_ -= static_cast<int>(batch.size());
  }
  slots_cv_.notify_all();
  // kAborted: the job failed already, and the coordinator's fatal entry follows.
  if (!error.ok() && error.code() != StatusCode::kAborted) FailUnreported(error);
}

void NodeAgent::PollLoop() {
  // The coordinator is lost when nothing has come from it for give_up_after_, counted from the
  // last answer: a poll that hangs until its deadline counts (a cut link), not only polls that
  // fail at once (a closed port).
  auto last_answer = std::chrono::steady_clock::now();
  bool failing = false, warned = false;
  auto first_failure = last_answer;
  std::unique_lock lock(mu_);
  while (!stopping_) {
    uint64_t after = received_seq_;
    lock.unlock();
    auto entries = link_->Poll(node_rank_, after, kPollWait);
    lock.lock();
    if (stopping_) break;
    if (!entries.ok()) {
      auto now = std::chrono::steady_clock::now();
      // A poll that fails once is not news: at the end of a job every daemon gets SIGTERM at
      // about the same time, and node 0's may stop serving before this one hears its own. A
      // coordinator that stays away for kPollWarnAfter is worth a warning.
      if (!failing) {
        failing = true;
        first_failure = now;
        spdlog::debug("coordinator poll failed: {}", entries.status().message());
      } else if (!warned && now - first_failure >= kPollWarnAfter) {
        warned = true;
        spdlog::warn("coordinator poll failed for {} ms: {}",
                     std::chrono::duration_cast<std::chrono::milliseconds>(now - first_failure)
                         .count(),
                     entries.status().message());
      }
      if (now - last_answer > give_up_after_) {
        lock.unlock();
        FailUnreported(Unavailable("node " + std::to_string(node_rank_) +
                                   " lost the coordinator on node 0: " +
                                   entries.status().message()));
        return;  // nothing more will come from it
      }
      inbox_cv_.wait_for(lock, std::chrono::milliseconds(200), [&] { return stopping_; });
      continue;
    }
    if (warned) spdlog::info("the coordinator answers again");
    failing = warned = false;
    last_answer = std::chrono::steady_clock::now();
    const int64_t received_ns = SteadyNs();
    bool coordinator_stops = false;
    for (auto& e : *entries) {
      if (e.seq <= received_seq_) continue;
      received_seq_ = e.seq;
      e.received_ns = received_ns;
      // Node 0's own shutdown: nothing follows it, and its server is about to go.
      coordinator_stops = coordinator_stops || IsShutdownReason(e.fatal, 0);
      inbox_.push_back(std::move(e));
    }
    if (!entries->empty()) {
      // Told after the lock is released: stage A, woken, takes mu_ at once.
      lock.unlock();
      inbox_cv_.notify_all();
      lock.lock();
    }
    if (coordinator_stops) {
      spdlog::debug("node 0 is shutting down: no more polls");
      return;
    }
  }
}

void NodeAgent::FailUnreported(const Status& error) {
  if (failure_->Fail(error, JobFailure::Source::kUnreported)) PushFatal(error);
}

void NodeAgent::PushFatal(const Status& error) {
  {
    std::lock_guard lock(mu_);
    ScheduleEntry e;
    e.seq = ~0ull;
    e.fatal = error;
    inbox_.push_back(std::move(e));
  }
  inbox_cv_.notify_all();
}

std::vector<ScheduleEntry> NodeAgent::Next(std::chrono::milliseconds wait) {
  std::vector<ScheduleEntry> entries = FollowPlans(Receive(wait));
  NameTensors(&entries);
  return entries;
}

void NodeAgent::NameTensors(std::vector<ScheduleEntry>* entries) {
  std::unique_lock lock(mu_);
  for (ScheduleEntry& e : *entries) {
    for (GroupTensor& t : e.group) {
      auto known = [&] { return name_by_slot_.count(t.slot) > 0; };
      // Bounded by the deadline of the reports in flight; Stop() wakes it.
      slots_cv_.wait(lock, [&] { return known() || reports_in_flight_ == 0 || stopping_; });
      if (!known() && t.meta) {
        // A process set's tensor with no member on this node: the node takes part with nothing
        // of its own (pipeline::TensorTable::Resolve), under the name the coordinator sent.
        t.name = t.meta->name;
        continue;
      }
      if (!known()) {
        e.fatal = Internal("the schedule names slot " + std::to_string(t.slot) + " which node " +
                           std::to_string(node_rank_) + " never reported");
        e.group.clear();
        break;
      }
      t.name = name_by_slot_.at(t.slot);
    }
  }
}

std::vector<ScheduleEntry> NodeAgent::FollowPlans(std::vector<ScheduleEntry> entries) {
  std::vector<ScheduleEntry> out;
  out.reserve(entries.size());
  for (ScheduleEntry& e : entries) {
    if (e.plan) {
      // Node 0's planner logs each plan once at info (coordinator_core.cc).
      spdlog::debug("following merge plan v{} ({}) from step {}: {} groups, predicted {:.2f} ms",
                    e.plan->version, e.plan->planner, e.plan->effective_step,
                    e.plan->groups.size(), e.plan->predicted_s * 1e3);
      plan_ = *e.plan;
      HoldBy(*plan_);
      if (observer_) {
        observer_->OnPlan({plan_->version, plan_->effective_step, plan_->planner,
                           plan_->groups.size(), plan_->predicted_s, plan_->summary});
      }
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
      // The plan's dense choice is the same on every node: it travels with the plan.
      if (matches) e.dense = plan_->dense.size() > e.group_index && plan_->dense[e.group_index];
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
      while (!inbox_.empty()) {  // locally raised failures
        out.push_back(std::move(inbox_.front()));
        inbox_.pop_front();
      }
      after = received_seq_;
    }
    if (!out.empty()) return out;
    auto entries = link_->Poll(node_rank_, after, wait);
    if (!entries.ok()) return out;
    std::lock_guard lock(mu_);
    const int64_t received_ns = SteadyNs();
    for (auto& e : *entries) {
      if (e.seq <= received_seq_) continue;
      received_seq_ = e.seq;
      e.received_ns = received_ns;
      out.push_back(std::move(e));
    }
    return out;
  }
  std::unique_lock lock(mu_);
  inbox_cv_.wait_for(lock, wait, [&] { return stopping_ || !inbox_.empty(); });
  while (!inbox_.empty()) {
    out.push_back(std::move(inbox_.front()));
    inbox_.pop_front();
  }
  return out;
}

void NodeAgent::OnFailure(const Status& error, JobFailure::Source source) {
  // A daemon that stops tells the others too: their collectives with it cannot finish.
  if (source != JobFailure::Source::kLocal && source != JobFailure::Source::kShutdown) return;
  Status st = link_->Fail(node_rank_, error);
  if (!st.ok()) {
    if (source == JobFailure::Source::kShutdown) {
      // At the end of a job node 0 may have stopped first: nobody is left to tell.
      spdlog::info("the coordinator did not hear of this stop: {}", st.message());
    } else {
      spdlog::error("could not tell the coordinator about the failure: {}", st.message());
    }
    PushFatal(error);
  }
}

void NodeAgent::Leave() { (void)link_->Leave(node_rank_); }

}  // namespace sparsync::negotiation
