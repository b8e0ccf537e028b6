#include "daemon/negotiation/coordinator_core.h"

#include <spdlog/spdlog.h>

#include "daemon/common/job_token.h"
#include "daemon/common/thread_name.h"

namespace sparsync::negotiation {

CoordinatorCore::CoordinatorCore(CoordinatorOptions options, int local_size, std::string job_token)
    : options_(options),
      local_size_(local_size),
      job_token_(std::move(job_token)),
      state_(options),
      joined_(options.num_nodes, false) {}

CoordinatorCore::~CoordinatorCore() { Stop(); }

void CoordinatorCore::Start() {
  timer_ = std::thread([this] {
    NameThisThread("ssd-coord-timer");
    std::unique_lock lock(mu_);
    while (!stopping_) {
      timer_deadline_ = state_.NextDeadline();
      if (timer_deadline_) {
        timer_cv_.wait_until(lock, *timer_deadline_);
      } else {
        timer_cv_.wait_for(lock, std::chrono::seconds(1));
      }
      if (stopping_) break;
      lock.unlock();
      RunOnce();
      lock.lock();
    }
  });
}

void CoordinatorCore::Stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  changed_.notify_all();
  schedule_grew_.notify_all();
  timer_cv_.notify_all();
  if (timer_.joinable()) timer_.join();
}

bool CoordinatorCore::TokenMatches(const std::string& token) const {
  return TokensEqual(token, job_token_);
}

void CoordinatorCore::SetCostModel(const planning::CostModel& cost) {
  std::lock_guard lock(mu_);
  state_.SetCostModel(cost);
}

void CoordinatorCore::RecordGroupCost(uint64_t elements, bool sparse, double sparsify_s,
                                      double exchange_s) {
  std::lock_guard lock(mu_);
  state_.RecordGroupCost(elements, sparse, sparsify_s, exchange_s);
}

void CoordinatorCore::RunOnce() {
  std::vector<std::string> warnings, notes;
  bool grew = false;
  {
    std::lock_guard lock(mu_);
    const uint64_t before = state_.last_seq();
    warnings = state_.Tick(Clock::now());
    grew = state_.last_seq() != before;
    notes = state_.TakeLog();
  }
  if (grew) schedule_grew_.notify_all();
  for (const auto& w : warnings) {
    spdlog::warn("stall: {}", w);
    if (observer_) observer_->OnIncident(observe::Incident::kStall, w);
  }
  Note(notes);
}

void CoordinatorCore::Note(const std::vector<std::string>& notes) {
  for (const auto& n : notes) {
    spdlog::info("planner: {}", n);
    if (observer_) observer_->OnIncident(observe::Incident::kPlannerNote, n);
  }
}

Status CoordinatorCore::Join(const JoinInfo& info, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  if (info.protocol_version != kProtocolVersion) {
    return PermissionDenied("node " + std::to_string(info.node_rank) + " speaks protocol " +
                            std::to_string(info.protocol_version) + ", the coordinator " +
                            std::to_string(kProtocolVersion) + ": run the same sparsync version");
  }
  if (!TokenMatches(info.job_token)) {
    return PermissionDenied("node " + std::to_string(info.node_rank) +
                            " presented a wrong SPARSYNC_JOB_TOKEN");
  }
  if (info.num_nodes != options_.num_nodes) {
    return InvalidArgument("node " + std::to_string(info.node_rank) + " has SPARSYNC_NUM_NODES=" +
                           std::to_string(info.num_nodes) + " but node 0 has " +
                           std::to_string(options_.num_nodes));
  }
  if (info.local_size != local_size_) {
    return InvalidArgument("node " + std::to_string(info.node_rank) + " has SPARSYNC_LOCAL_SIZE=" +
                           std::to_string(info.local_size) + " but node 0 has " +
                           std::to_string(local_size_) + "; every node needs the same");
  }
  if (info.node_rank < 0 || info.node_rank >= options_.num_nodes) {
    return InvalidArgument("node rank " + std::to_string(info.node_rank) + " out of range");
  }
  if (!info.address.empty()) state_.SetAddress(info.node_rank, info.address);
  if (!joined_[info.node_rank]) {
    joined_[info.node_rank] = true;
    ++joined_count_;
    state_.Polled(info.node_rank, 0, Clock::now());
    // The node's liveness deadline, for the timer. This call waits on mu_ below, so it tells
    // under the lock.
    if (WaitersFor(state_.last_seq()).timer) timer_cv_.notify_one();
    changed_.notify_all();
  }
  bool all = changed_.wait_for(lock, timeout, [&] {
    return stopping_ || joined_count_ == options_.num_nodes;
  });
  if (stopping_) return Unavailable("the coordinator is shutting down");
  if (!all) {
    std::string missing;
    for (int n = 0; n < options_.num_nodes; ++n) {
      if (!joined_[n]) missing += (missing.empty() ? "" : ",") + std::to_string(n);
    }
    return DeadlineExceeded("node(s) " + missing + " did not join within " +
                            std::to_string(timeout.count() / 1000) + " s");
  }
  return Status::Ok();
}

Status CoordinatorCore::StoreSet(const std::string& key, const std::string& value) {
  {
    std::lock_guard lock(mu_);
    store_[key] = value;
  }
  changed_.notify_all();
  return Status::Ok();
}

Result<std::vector<std::string>> CoordinatorCore::StoreGet(const std::vector<std::string>& keys,
                                                           std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  bool found = changed_.wait_for(lock, timeout, [&] {
    if (stopping_) return true;
    for (const auto& k : keys) {
      if (!store_.count(k)) return false;
    }
    return true;
  });
  if (stopping_) return Unavailable("the coordinator is shutting down");
  if (!found) return DeadlineExceeded("rendezvous keys did not appear in time");
  std::vector<std::string> values;
  for (const auto& k : keys) values.push_back(store_.at(k));
  return values;
}

Result<std::vector<uint32_t>> CoordinatorCore::Report(int node,
                                                      const std::vector<TensorMeta>& new_tensors,
                                                      const std::vector<ReportedReady>& ready,
                                                      const RankNews& ranks) {
  Result<std::vector<uint32_t>> result = Internal("unset");
  std::vector<std::string> notes;
  Waiters waiters;
  {
    std::lock_guard lock(mu_);
    const auto now = Clock::now();
    const uint64_t before = state_.last_seq();
    // The rank news is checked before the rest is applied: an error means nothing of the
    // report took effect (found by tests/fuzz's coordinator target: a bad rank after good
    // tensors registered them, and their slots reached the schedule unknown to the node).
    Status news = state_.CheckRanks(node, ranks);
    result = news.ok() ? state_.Report(node, new_tensors, ready, now) : news;
    auto apply = [&](const std::vector<int32_t>& of, auto&& change) {
      for (int32_t rank : of) {
        if (!result.ok()) return;
        if (Status st = change(rank); !st.ok()) result = st;
      }
    };
    apply(ranks.joined, [&](int rank) { return state_.Joined(node, rank, now); });
    apply(ranks.back, [&](int rank) { return state_.Back(node, rank); });
    apply(ranks.gone, [&](int rank) { return state_.Gone(node, rank, now); });
    waiters = WaitersFor(before);
    notes = state_.TakeLog();
  }
  Wake(waiters);
  Note(notes);
  return result;
}

Result<std::vector<ScheduleEntry>> CoordinatorCore::Poll(int node, uint64_t after_seq,
                                                         std::chrono::milliseconds wait) {
  std::unique_lock lock(mu_);
  state_.Polled(node, after_seq, Clock::now());
  schedule_grew_.wait_for(lock, wait, [&] { return stopping_ || state_.last_seq() > after_seq; });
  if (stopping_ && state_.last_seq() <= after_seq) {
    return Unavailable("the coordinator is shutting down");
  }
  state_.Polled(node, after_seq, Clock::now());
  return state_.EntriesAfter(after_seq);
}

Status CoordinatorCore::Fail(int node, const Status& error) {
  Waiters waiters;
  {
    std::lock_guard lock(mu_);
    const uint64_t before = state_.last_seq();
    state_.Fail(node, error);
    waiters = WaitersFor(before);
  }
  Wake(waiters);
  return Status::Ok();
}

Status CoordinatorCore::Leave(int node) {
  Waiters waiters;
  {
    std::lock_guard lock(mu_);
    const uint64_t before = state_.last_seq();
    state_.Leave(node);
    waiters = WaitersFor(before);
  }
  Wake(waiters);
  return Status::Ok();
}

CoordinatorCore::Waiters CoordinatorCore::WaitersFor(uint64_t seq_before) const {
  Waiters waiters;
  waiters.polls = state_.last_seq() != seq_before;
  // A deadline the timer does not wait for yet: a batch to flush after the cycle, or the first
  // deadline of all (the timer waits a second at a time while there is none).
  const auto next = state_.NextDeadline();
  waiters.timer = next && (!timer_deadline_ || *next < *timer_deadline_);
  return waiters;
}

void CoordinatorCore::Wake(Waiters waiters) {
  if (waiters.polls) schedule_grew_.notify_all();
  if (waiters.timer) timer_cv_.notify_one();
}

}  // namespace sparsync::negotiation
