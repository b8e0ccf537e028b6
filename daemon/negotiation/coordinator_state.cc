#include "daemon/negotiation/coordinator_state.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "daemon/planning/fusion.h"

namespace sparsync::negotiation {
namespace {

uint64_t FusionKey(const TensorMeta& m) {
  // A process set's tensors go alone: the members decide each node's share of a group.
  if (!Reduces(m.op) || !m.members.empty()) return planning::kNeverFuse;
  // Tensors fuse only if they are reduced the same way: op, dtype, reduce op and compressor.
  uint32_t density_bits;
  std::memcpy(&density_bits, &m.density, sizeof(density_bits));
  return (uint64_t{density_bits} << 32) | (uint64_t{ToWire(m.compressor)} << 24) |
         (uint64_t{ToWire(m.op)} << 16) | (uint64_t{ToWire(m.dtype)} << 8) | ToWire(m.reduce_op);
}

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

CoordinatorState::CoordinatorState(CoordinatorOptions options)
    : options_(options),
      joined_(static_cast<size_t>(options.num_nodes) * options.local_size, false),
      gone_(joined_.size()),
      last_poll_(options.num_nodes),
      acked_(options.num_nodes, 0),
      left_(options.num_nodes, false),
      addresses_(options.num_nodes),
      merge_(options.merge, options.num_nodes) {}

const TensorMeta* CoordinatorState::Meta(uint32_t slot) const {
  if (slot == 0 || slot > metas_.size()) return nullptr;
  return &metas_[slot - 1];
}

Result<std::vector<uint32_t>> CoordinatorState::Report(int node,
                                                       const std::vector<TensorMeta>& new_tensors,
                                                       const std::vector<ReportedReady>& ready,
                                                       Clock::time_point now) {
  if (failed()) return Aborted(fatal_.message());
  if (node < 0 || node >= options_.num_nodes) {
    return InvalidArgument("report from unknown node " + std::to_string(node));
  }
  // Validate the whole report before changing anything (a tensor without a name after a good one
  // used to register the good one and fail the report: found by tests/fuzz's coordinator target).
  const int world_size = options_.num_nodes * options_.local_size;
  for (const TensorMeta& meta : new_tensors) {
    if (meta.name.empty()) return InvalidArgument("a tensor without a name");
    if ((meta.group_size == 0) != (meta.group == 0) || meta.group_size == 1 ||
        (meta.group_size != 0 && meta.op == CollectiveOp::kGradient)) {
      return InvalidArgument("tensor '" + meta.name + "' is in a malformed group");
    }
    if (meta.members.empty()) continue;
    if (meta.members.back() >= world_size || meta.op == CollectiveOp::kGradient) {
      return InvalidArgument("tensor '" + meta.name + "' has the process set " +
                             RanksText(meta.members) + " in a job of " +
                             std::to_string(world_size) + " workers");
    }
  }
  // Only a node that hosts a member of a tensor's process set may report it.
  auto outside_set = [&](const TensorMeta& meta) -> Status {
    if (meta.members.empty()) return Status::Ok();
    const int first = node * options_.local_size;
    auto it = std::lower_bound(meta.members.begin(), meta.members.end(), first);
    if (it != meta.members.end() && *it < first + options_.local_size) return Status::Ok();
    return InvalidArgument("node " + std::to_string(node) + " reported tensor '" + meta.name +
                           "' of the process set " + RanksText(meta.members) +
                           ", which has no rank on it");
  };
  for (const TensorMeta& meta : new_tensors) SPARSYNC_RETURN_IF_ERROR(outside_set(meta));
  for (const ReportedReady& r : ready) {
    if (r.slot.has_value() == r.new_index.has_value()) {
      return InvalidArgument("a ready tensor needs exactly one of slot and new_index");
    }
    if (r.slot && Meta(*r.slot) == nullptr) {
      return InvalidArgument("unknown slot " + std::to_string(*r.slot));
    }
    if (r.slot) SPARSYNC_RETURN_IF_ERROR(outside_set(*Meta(*r.slot)));
    if (r.new_index && *r.new_index >= new_tensors.size()) {
      return InvalidArgument("new_index " + std::to_string(*r.new_index) + " out of range");
    }
  }
  std::vector<uint32_t> slots;
  slots.reserve(new_tensors.size());
  for (const TensorMeta& meta : new_tensors) {
    auto [it, inserted] = slot_by_signature_.try_emplace(meta.SignatureKey(), 0);
    if (inserted) {
      metas_.push_back(meta);
      it->second = static_cast<uint32_t>(metas_.size());
    }
    slots.push_back(it->second);
  }
  for (const ReportedReady& r : ready) {
    uint32_t slot = r.slot ? *r.slot : slots[*r.new_index];
    MarkReady(node, slot, r.worker_dim0, r.ready_ns, now);
    if (failed()) break;
  }
  if (!failed()) {
    bool due = !batch_.empty() &&
               (batch_urgent_ || options_.cycle.count() == 0 || now - batch_started_ >= options_.cycle);
    if (due) Flush();
  }
  return slots;
}

void CoordinatorState::MarkReady(int node, uint32_t slot, std::vector<int64_t> dims,
                                 int64_t ready_ns, Clock::time_point now) {
  const TensorMeta& meta = metas_[slot - 1];
  auto by_name = pending_by_name_.find(meta.name);
  if (by_name != pending_by_name_.end() && by_name->second != slot) {
    const Pending& other = pending_.at(by_name->second);
    const TensorMeta& theirs = metas_[by_name->second - 1];
    Fail(-1, Mismatch("tensor '" + meta.name + "' differs across nodes: " + theirs.Describe() +
                      " on node(s) " + NodeList(other, true) + " but " + meta.Describe() +
                      " on node " + std::to_string(node)));
    return;
  }
  auto [it, inserted] = pending_.try_emplace(slot);
  Pending& p = it->second;
  if (inserted) {
    p.ready.assign(options_.num_nodes, false);
    SetNeeded(meta, &p);
    p.node_dims.assign(options_.num_nodes, {});
    p.node_ready_ns.assign(options_.num_nodes, 0);
    p.first_report = now;
    pending_by_name_[meta.name] = slot;
  }
  if (p.ready[node]) {
    Fail(-1, Internal("node " + std::to_string(node) + " reported tensor '" + meta.name +
                      "' twice in one round"));
    return;
  }
  p.ready[node] = true;
  p.node_dims[node] = std::move(dims);
  p.node_ready_ns[node] = ready_ns;
  if (p.needed[node]) --p.waiting;
  if (p.waiting == 0) {
    Ready(it, now);
  } else {
    FailIfHeldByGone(now);
  }
}

template <typename Fn>
void CoordinatorState::ForEachGoneHolder(const TensorMeta* meta, const Pending* p,
                                         Fn&& consider) const {
  if (gone_count_ == 0) return;
  for (int r = 0; r < static_cast<int>(gone_.size()); ++r) {
    if (!gone_[r] || joined_[r]) continue;
    if (meta && (!meta->HasMember(r) || p->ready[r / options_.local_size])) continue;
    consider(r, *gone_[r] + GoneGrace());
  }
}

bool CoordinatorState::FailIfHeldByGone(Clock::time_point now) {
  if (gone_count_ == 0) return false;
  int gone = -1;
  auto due = [&](int r, Clock::time_point end) {
    if (gone < 0 && end <= now) gone = r;
  };
  auto who = [&] {
    return "rank " + std::to_string(gone) + " on " + NodeName(gone / options_.local_size) +
           " has left the job";
  };
  if (joined_count_ > 0) {
    ForEachGoneHolder(nullptr, nullptr, due);
    if (gone >= 0) {
      std::string waiting;
      for (int r = 0; r < static_cast<int>(joined_.size()); ++r) {
        if (joined_[r]) waiting += (waiting.empty() ? "" : ",") + std::to_string(r);
      }
      Fail(-1, Mismatch(who() + " while rank(s) " + waiting +
                        " wait in join(): every rank must call join() before it ends"));
      return true;
    }
  }
  for (const auto& [slot, p] : pending_) {
    const TensorMeta& meta = metas_[slot - 1];
    ForEachGoneHolder(&meta, &p, due);
    if (gone < 0) continue;
    Fail(-1, Mismatch("tensor '" + meta.name + "' was posted on node(s) " + NodeList(p, true) +
                      " but " + who() +
                      " without posting it (its worker called shutdown(), ended or crashed): "
                      "every rank must make the same collectives"));
    return true;
  }
  return false;
}

void CoordinatorState::SetNeeded(const TensorMeta& meta, Pending* p) const {
  // The common case, every rank taking part, costs no walk over the ranks.
  if (meta.members.empty() && joined_count_ == 0) {
    p->needed.assign(options_.num_nodes, true);
  } else {
    p->needed.assign(options_.num_nodes, false);
    for (int r = 0; r < static_cast<int>(joined_.size()); ++r) {
      if (meta.HasMember(r) && !joined_[r]) p->needed[r / options_.local_size] = true;
    }
  }
  p->waiting = 0;
  for (int n = 0; n < options_.num_nodes; ++n) p->waiting += p->needed[n] && !p->ready[n];
}

void CoordinatorState::Ready(std::map<uint32_t, Pending>::iterator it, Clock::time_point now) {
  const uint32_t slot = it->first;
  Pending& p = it->second;
  const TensorMeta& meta = metas_[slot - 1];
  if (meta.op == CollectiveOp::kBroadcast && joined_[meta.root_rank]) {
    Fail(-1, InvalidArgument("broadcast of '" + meta.name + "' from root rank " +
                             std::to_string(meta.root_rank) +
                             ", which has called join(): it takes part in no collective until "
                             "every rank has joined"));
    return;
  }
  if (meta.op == CollectiveOp::kGradient) {
    // The merge scheduler measures every gradient and groups those its plan covers.
    ReadyGradient g;
    g.slot = slot;
    g.name = meta.name;
    g.elements = static_cast<uint64_t>(meta.NumElements());
    g.merge_class = FusionKey(meta);
    g.dense = meta.compressor ? *meta.compressor == Compressor::kNone
                              : options_.merge.dense_by_default;
    g.node_ready_ns = std::move(p.node_ready_ns);
    bool planned = merge_.Ready(g, now);
    AppendMergeOutputs();
    if (planned) {
      pending_by_name_.erase(meta.name);
      pending_.erase(it);
      return;
    }
  }

  Batched b;
  b.tensor.slot = slot;
  if (meta.op == CollectiveOp::kAllGather) {
    // One size per member rank, in rank order: a node that did not report (its members have all
    // joined) adds none of its rows.
    for (int n = 0; n < options_.num_nodes; ++n) {
      if (p.ready[n]) {
        const auto& d = p.node_dims[n];
        b.tensor.worker_dim0.insert(b.tensor.worker_dim0.end(), d.begin(), d.end());
        continue;
      }
      for (int r = n * options_.local_size; r < (n + 1) * options_.local_size; ++r) {
        if (meta.HasMember(r)) b.tensor.worker_dim0.push_back(0);
      }
    }
  }
  // Nodes with no member taking part may never have registered the tensor: they learn it here.
  if (!meta.members.empty() || joined_count_ > 0) {
    b.tensor.meta = std::make_shared<const TensorMeta>(meta);
  }
  b.bytes = meta.Bytes();
  b.fusion_key = FusionKey(meta);
  pending_by_name_.erase(meta.name);
  pending_.erase(it);
  std::vector<Batched> ready;
  if (meta.group_size == 0) {
    ready.push_back(std::move(b));
  } else {
    // A grouped collective is scheduled as one: held until every tensor of its group is ready.
    auto [held, first] = groups_.try_emplace(meta.group);
    if (first) held->second.since = now;
    held->second.ready.push_back(std::move(b));
    if (held->second.ready.size() < meta.group_size) return;
    ready = std::move(held->second.ready);
    groups_.erase(held);
  }
  if (batch_.empty()) batch_started_ = now;
  batch_urgent_ = batch_urgent_ || meta.op != CollectiveOp::kGradient;
  for (Batched& r : ready) batch_.push_back(std::move(r));
}

Status CoordinatorState::CheckRankOf(int node, int rank, const char* what) const {
  if (node < 0 || node >= options_.num_nodes || rank < node * options_.local_size ||
      rank >= (node + 1) * options_.local_size) {
    return InvalidArgument("node " + std::to_string(node) + " reported rank " +
                           std::to_string(rank) + " " + what + ", which is not one of its ranks");
  }
  return Status::Ok();
}

Status CoordinatorState::CheckRanks(int node, const RankNews& news) const {
  if (failed()) return Aborted(fatal_.message());
  const std::vector<int32_t>& joins = news.joined;
  for (size_t i = 0; i < joins.size(); ++i) {
    const int rank = joins[i];
    SPARSYNC_RETURN_IF_ERROR(CheckRankOf(node, rank, "joined"));
    if (joined_[rank] || std::find(joins.begin(), joins.begin() + i, rank) != joins.begin() + i) {
      return InvalidArgument("rank " + std::to_string(rank) + " joined twice");
    }
  }
  for (int32_t rank : news.back) SPARSYNC_RETURN_IF_ERROR(CheckRankOf(node, rank, "back"));
  for (int32_t rank : news.gone) SPARSYNC_RETURN_IF_ERROR(CheckRankOf(node, rank, "gone"));
  return Status::Ok();
}

Status CoordinatorState::Gone(int node, int rank, Clock::time_point now) {
  if (failed()) return Aborted(fatal_.message());
  SPARSYNC_RETURN_IF_ERROR(CheckRankOf(node, rank, "gone"));
  if (gone_[rank]) return Status::Ok();
  gone_[rank] = now;
  ++gone_count_;
  if (gone_count_ == static_cast<int>(gone_.size())) {
    // Every worker has left: the run is over. The daemons may serve another, whose workers
    // connect in any order; none of them is gone.
    gone_.assign(gone_.size(), std::nullopt);
    gone_count_ = 0;
    return Status::Ok();
  }
  FailIfHeldByGone(now);  // fails at once only when the grace period is 0
  return Status::Ok();
}

Status CoordinatorState::Back(int node, int rank) {
  if (failed()) return Aborted(fatal_.message());
  SPARSYNC_RETURN_IF_ERROR(CheckRankOf(node, rank, "back"));
  if (gone_[rank]) {
    gone_[rank].reset();
    --gone_count_;
  }
  return Status::Ok();
}

Status CoordinatorState::Joined(int node, int rank, Clock::time_point now) {
  RankNews news;
  news.joined = {rank};
  SPARSYNC_RETURN_IF_ERROR(CheckRanks(node, news));
  joined_[rank] = true;
  ++joined_count_;
  if (joined_count_ == static_cast<int>(joined_.size())) {
    // Everyone is out of data: the join ends, after whatever is scheduled already.
    if (!batch_.empty()) Flush();
    joined_.assign(joined_.size(), false);
    joined_count_ = 0;
    ScheduleEntry entry;
    entry.join_last_rank = rank;
    Append(std::move(entry));
    return Status::Ok();
  }
  if (FailIfHeldByGone(now)) return Status::Ok();
  // Tensors that waited only for this rank's node go now, without it.
  std::vector<uint32_t> complete;
  for (auto& [slot, p] : pending_) {
    SetNeeded(metas_[slot - 1], &p);
    if (p.waiting == 0) complete.push_back(slot);
  }
  for (uint32_t slot : complete) {
    Ready(pending_.find(slot), now);
    if (failed()) break;
  }
  if (!failed() && !batch_.empty()) Flush();
  return Status::Ok();
}

void CoordinatorState::Flush() {
  std::vector<planning::FusionCandidate> candidates;
  candidates.reserve(batch_.size());
  for (const Batched& b : batch_) candidates.push_back({b.bytes, b.fusion_key});
  for (const auto& bucket : planning::FixedBuckets(candidates, options_.bucket_bytes)) {
    ScheduleEntry entry;
    for (size_t i : bucket) entry.group.push_back(std::move(batch_[i].tensor));
    Append(std::move(entry));
  }
  batch_.clear();
  batch_urgent_ = false;
}

void CoordinatorState::AppendMergeOutputs() {
  for (MergeOutput& out : merge_.Take()) {
    ScheduleEntry entry;
    entry.plan = std::move(out.plan);
    entry.plan_version = out.plan_version;
    entry.group_index = out.group_index;
    for (uint32_t slot : out.group) entry.group.push_back({slot, {}, {}, nullptr});
    Append(std::move(entry));
  }
}

void CoordinatorState::Append(ScheduleEntry entry) {
  entry.seq = next_seq_++;
  log_.push_back(std::move(entry));
}

void CoordinatorState::Fail(int node, const Status& error) {
  if (failed() || error.ok()) return;
  fatal_ = error;
  merge_.Reset();
  pending_.clear();
  pending_by_name_.clear();
  batch_.clear();
  groups_.clear();
  ScheduleEntry entry;
  entry.fatal = error;
  Append(std::move(entry));
}

void CoordinatorState::Leave(int node) {
  if (node < 0 || node >= options_.num_nodes) return;
  left_[node] = true;
  Fail(node, Aborted("the daemon of " + NodeName(node) + " shut down; restart the job"));
}

void CoordinatorState::SetAddress(int node, std::string address) {
  if (node >= 0 && node < options_.num_nodes) addresses_[node] = std::move(address);
}

std::string CoordinatorState::NodeName(int node) const {
  std::string name = "node " + std::to_string(node);
  if (node >= 0 && node < options_.num_nodes && !addresses_[node].empty()) {
    name += " (" + addresses_[node] + ")";
  }
  return name;
}

void CoordinatorState::Polled(int node, uint64_t after_seq, Clock::time_point now) {
  if (node < 0 || node >= options_.num_nodes) return;
  last_poll_[node] = now;
  acked_[node] = std::max(acked_[node], after_seq);
  // Entries every node has received are no longer needed.
  uint64_t everyone = ~0ull;
  for (int n = 0; n < options_.num_nodes; ++n) {
    if (!left_[n]) everyone = std::min(everyone, acked_[n]);
  }
  while (!log_.empty() && log_.front().seq <= everyone && log_.front().fatal.ok()) {
    log_.pop_front();
  }
}

std::vector<ScheduleEntry> CoordinatorState::EntriesAfter(uint64_t after_seq) const {
  std::vector<ScheduleEntry> out;
  for (const ScheduleEntry& e : log_) {
    if (e.seq > after_seq) out.push_back(e);
  }
  return out;
}

std::string CoordinatorState::NodeList(const Pending& p, bool ready) const {
  std::ostringstream o;
  bool first = true;
  for (int n = 0; n < options_.num_nodes; ++n) {
    if (!p.needed[n] || p.ready[n] != ready) continue;
    o << (first ? "" : ",") << n;
    first = false;
  }
  return o.str();
}

std::vector<std::string> CoordinatorState::Tick(Clock::time_point now) {
  std::vector<std::string> warnings;
  if (failed()) return warnings;
  if (!batch_.empty() && (batch_urgent_ || now - batch_started_ >= options_.cycle)) Flush();
  merge_.Tick(now);
  AppendMergeOutputs();
  if (FailIfHeldByGone(now)) return warnings;
  for (auto& [slot, p] : pending_) {
    const std::string& name = metas_[slot - 1].name;
    auto waited = now - p.first_report;
    if (waited >= options_.timeout) {
      Fail(-1, DeadlineExceeded("tensor '" + name + "' was posted on node(s) " + NodeList(p, true) +
                                " but not on node(s) " + NodeList(p, false) + " within " +
                                std::to_string(static_cast<int>(Seconds(options_.timeout))) +
                                " s (SPARSYNC_TIMEOUT_S)"));
      return warnings;
    }
    if (!p.warned && waited >= options_.stall_warn) {
      p.warned = true;
      warnings.push_back("tensor '" + name + "' is ready on node(s) " + NodeList(p, true) +
                         " but node(s) " + NodeList(p, false) + " have not posted it for " +
                         std::to_string(static_cast<int>(Seconds(waited))) + " s");
    }
  }
  for (const auto& [key, held] : groups_) {
    if (now - held.since < options_.timeout) continue;
    const TensorMeta& first = metas_[held.ready.front().tensor.slot - 1];
    Fail(-1, DeadlineExceeded("tensor '" + first.name + "' is one of a group of " +
                              std::to_string(first.group_size) + " of which only " +
                              std::to_string(held.ready.size()) + " were posted on every node within " +
                              std::to_string(static_cast<int>(Seconds(options_.timeout))) +
                              " s (SPARSYNC_TIMEOUT_S); the group's other tensors were never posted"));
    return warnings;
  }
  // Nodes that stopped polling. When every other node went silent at once, the likely loss is
  // this node's own network, and the message says so.
  // Polls last up to half a second, so nodes cut off together fall silent up to that far apart.
  const auto almost = options_.node_liveness - std::min<Clock::duration>(
                                                   options_.node_liveness / 2, std::chrono::seconds(1));
  std::vector<int> silent;
  int watched = 0;
  bool overdue = false;
  for (int n = 1; n < options_.num_nodes; ++n) {
    if (left_[n] || !last_poll_[n]) continue;
    ++watched;
    overdue = overdue || now - *last_poll_[n] > options_.node_liveness;
    if (now - *last_poll_[n] > almost) silent.push_back(n);
  }
  if (overdue) {
    const int seconds = static_cast<int>(Seconds(now - *last_poll_[silent.front()]));
    if (silent.size() == 1) {
      Fail(-1, Unavailable(NodeName(silent.front()) + " has not contacted the coordinator for " +
                           std::to_string(seconds) +
                           " s: its daemon died or the network failed"));
    } else {
      std::string names;
      for (int n : silent) names += (names.empty() ? "" : ", ") + NodeName(n);
      Fail(-1, Unavailable(
                   names + " have not contacted the coordinator on node 0 for " +
                   std::to_string(seconds) + " s: " +
                   (static_cast<int>(silent.size()) == watched && watched > 1
                        ? "node 0 lost its network, or their daemons died"
                        : "their daemons died or the network failed")));
    }
  }
  return warnings;
}

std::optional<Clock::time_point> CoordinatorState::NextDeadline() const {
  if (failed()) return std::nullopt;
  std::optional<Clock::time_point> next;
  auto consider = [&](Clock::time_point t) {
    if (!next || t < *next) next = t;
  };
  if (!batch_.empty()) consider(batch_started_ + options_.cycle);
  if (auto merge = merge_.NextDeadline()) consider(*merge);
  for (const auto& [slot, p] : pending_) {
    consider(p.first_report + options_.timeout);
    if (!p.warned) consider(p.first_report + options_.stall_warn);
  }
  for (const auto& [key, held] : groups_) consider(held.since + options_.timeout);
  auto grace_ends = [&](int, Clock::time_point end) { consider(end); };
  if (joined_count_ > 0) ForEachGoneHolder(nullptr, nullptr, grace_ends);
  for (const auto& [slot, p] : pending_) ForEachGoneHolder(&metas_[slot - 1], &p, grace_ends);
  for (int n = 1; n < options_.num_nodes; ++n) {
    if (!left_[n] && last_poll_[n]) consider(*last_poll_[n] + options_.node_liveness);
  }
  return next;
}

}  // namespace sparsync::negotiation
