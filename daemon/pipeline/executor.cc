#include "daemon/pipeline/executor.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "daemon/common/thread_name.h"
#include "daemon/pipeline/dense_math.h"

namespace sparsync::pipeline {

namespace {

// How long stage A waits for schedule entries before checking for Stop().
constexpr std::chrono::milliseconds kNextWait(500);

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

// One schedule entry in flight: its group, the path executing it, and every path's scratch for
// this slot (made at the path's first group here). Reused.
struct Executor::Slot {
  Group group;
  Status error;  // stage A failed: the entry fails in its place in stage B
  int join_last_rank = -1;  // >= 0: the join-done entry, nothing to exchange
  ReducePath* path = nullptr;
  size_t path_index = 0;
  std::vector<std::unique_ptr<ReducePath::Scratch>> scratch;  // by path index
  std::chrono::steady_clock::time_point started;
  GroupCost cost;  // sparsify_s filled by stage A, the rest by B
  // For the observer (steady ns, 0: the stage did not run): stage A's, then stage B's.
  int64_t received_ns = 0, prepare_begin_ns = 0, prepare_end_ns = 0;
  int64_t exchange_begin_ns = 0, exchange_end_ns = 0, deliver_end_ns = 0;

  ReducePath::Scratch& ScratchOf(size_t i, const ReducePath& p) {
    if (!scratch[i]) scratch[i] = p.NewScratch();
    return *scratch[i];
  }
};

Executor::Executor(World world, TensorTable* table, transport::Transport* transport, NextFn next,
                   JobFailure* failure, SparseReducers* sparse,
                   std::vector<std::unique_ptr<ReducePath>> paths, ExecutorOptions options)
    : world_(world),
      table_(table),
      transport_(transport),
      next_(std::move(next)),
      failure_(failure),
      sparse_(sparse),
      paths_(std::move(paths)),
      options_(std::move(options)) {
  const int pipelined = std::max(1, options_.depth) + 1;
  for (int i = 0; i < pipelined + 1; ++i) {
    slots_.push_back(std::make_unique<Slot>());
    slots_.back()->scratch.resize(paths_.size());
  }
  for (int i = 0; i < pipelined; ++i) free_.push_back(slots_[i].get());
}

Executor::~Executor() { Stop(); }

void Executor::Start() {
  prepare_thread_ = std::thread([this] {
    NameThisThread("ssd-prepare");
    PrepareLoop();
  });
  exchange_thread_ = std::thread([this] {
    NameThisThread("ssd-exchange");
    ExchangeLoop();
  });
}

void Executor::Stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (prepare_thread_.joinable()) prepare_thread_.join();
  if (exchange_thread_.joinable()) exchange_thread_.join();
  // Entries stage B never reached are dropped, but an error stage A found still fails the job.
  std::deque<Slot*> dropped;
  {
    std::lock_guard lock(mu_);
    dropped.swap(ready_);
  }
  for (Slot* slot : dropped) {
    if (!slot->error.ok()) OnError(slot->error);
    ReleaseSlot(slot);
  }
}

void Executor::RunOnce(std::chrono::milliseconds wait) {
  for (const auto& entry : next_(wait)) {
    if (stopping_) return;
    Execute(entry);
  }
}

void Executor::Execute(const negotiation::ScheduleEntry& entry) {
  if (!entry.fatal.ok()) {
    OnFatal(entry.fatal);
    return;
  }
  if (entry.join_last_rank >= 0 && !failure_->failed()) {
    if (options_.on_join_done) options_.on_join_done(entry.join_last_rank);
    return;
  }
  if (entry.group.empty() || failure_->failed()) return;
  Slot* slot = slots_.back().get();  // never in the hand-off
  Prepare(entry, slot);
  if (options_.on_prepared) options_.on_prepared(entry.seq);
  Complete(slot);
  slot->group.members.clear();
}

// ---- Stage A ----

void Executor::PrepareLoop() {
  while (!stopping_) {
    const std::vector<negotiation::ScheduleEntry> entries = next_(kNextWait);
    // A fatal entry ends the job: act on it at once, before waiting for a slot, since B may be
    // blocked in a collective that will not finish.
    for (const auto& entry : entries) {
      if (!entry.fatal.ok()) OnFatal(entry.fatal);
    }
    for (const auto& entry : entries) {
      if (stopping_) return;
      if (!entry.fatal.ok()) continue;
      if (entry.join_last_rank >= 0 && !prepare_failed_ && !failure_->failed()) {
        // The join ends after every earlier entry is delivered: in stage B's order.
        Slot* slot = AcquireSlot();
        if (!slot) return;
        slot->join_last_rank = entry.join_last_rank;
        HandOff(slot);
        continue;
      }
      // A plan announcement has nothing to exchange. After a failure the table refuses
      // everything; later entries have nothing to do.
      if (entry.group.empty() || prepare_failed_ || failure_->failed()) continue;
      Slot* slot = AcquireSlot();
      if (!slot) return;
      Prepare(entry, slot);
      if (options_.on_prepared) options_.on_prepared(entry.seq);
      prepare_failed_ = !slot->error.ok();
      HandOff(slot);
    }
  }
}

void Executor::Prepare(const negotiation::ScheduleEntry& entry, Slot* slot) {
  // Tensors gone since the last entry take what was kept for them along: a later tensor of the
  // same name starts afresh. None of them is in flight (a tensor is released only when no worker
  // has it posted, and its last group's state was written before its DONE).
  for (const std::string& name : table_->TakeReleased()) {
    if (sparse_) sparse_->Forget(name);
  }
  slot->started = std::chrono::steady_clock::now();
  slot->received_ns = entry.received_ns;
  slot->prepare_begin_ns = NowNs();
  slot->prepare_end_ns = slot->exchange_begin_ns = slot->exchange_end_ns = 0;
  slot->deliver_end_ns = 0;
  slot->path = nullptr;
  slot->cost = {};
  slot->cost.plan_version = entry.plan_version;
  slot->error = FormGroup(entry, slot);
  if (!slot->error.ok()) return;
  slot->error = ChoosePath(slot);
  slot->prepare_end_ns = NowNs();
  // Stage A's work only (GroupCost in executor.h): not the waits before it.
  slot->cost.sparsify_s = (slot->prepare_end_ns - slot->prepare_begin_ns) * 1e-9;
}

Status Executor::FormGroup(const negotiation::ScheduleEntry& entry, Slot* slot) {
  Group& group = slot->group;
  group.seq = entry.seq;
  group.slices.clear();
  group.marks.Clear();
  group.reducer = nullptr;
  group.residuals = nullptr;
  SPARSYNC_ASSIGN_OR_RETURN(group.members, table_->Resolve(entry));
  if (group.members.empty()) {
    return Internal("schedule entry " + std::to_string(entry.seq) + " names no tensor");
  }
  const GroupMember& first = group.members.front();
  group.op = first.meta.op;
  group.divisor =
      first.meta.reduce_op == ReduceOp::kAverage ? first.meta.Participants(world_.size()) : 1.0;
  // A node with no member of a process set's tensor holds no round of it (gradients always do).
  group.step = first.parts.empty() ? 0 : first.parts.front().round;
  group.group_id = first.scheduled.slot;
  size_t offset = 0;
  for (const GroupMember& m : group.members) {
    const size_t count = static_cast<size_t>(m.meta.NumElements());
    group.slices.push_back({&m.meta.name, offset, count});
    offset += count;
  }
  group.elements = offset;
  const transport::ElementType acc_type = AccumulatorType(first.meta.dtype);
  if (!sparse_ || group.op != CollectiveOp::kGradient ||
      acc_type != transport::ElementType::kFloat32) {
    return Status::Ok();
  }
  // The merge plan may send a group dense where the model predicts that faster (entry.dense,
  // the same on every node); small groups always go dense.
  if (!entry.dense &&
      group.elements * transport::ElementSize(acc_type) >= sparse_->min_compress_bytes()) {
    // Fused tensors share their compressor (it is part of the fusion key).
    const uint64_t step = group.step > 0 ? group.step - 1 : 0;  // rounds count from 1
    SPARSYNC_ASSIGN_OR_RETURN(group.reducer,
                              sparse_->For(first.meta.compressor, first.meta.density, step));
  }
  // A dense group of a compressing job sends its residuals along.
  if (!group.reducer) group.residuals = &sparse_->state();
  return Status::Ok();
}

Status Executor::ChoosePath(Slot* slot) {
  for (size_t i = 0; i < paths_.size(); ++i) {
    ReducePath& path = *paths_[i];
    if (!path.Takes(slot->group)) continue;
    bool declined = false;
    Status st = path.Prepare(slot->group, slot->ScratchOf(i, path), &declined);
    if (st.ok() && declined) continue;
    slot->path = &path;
    slot->path_index = i;
    return st;
  }
  return Internal("no reduce path takes the " + std::string(OpName(slot->group.op)) + " of '" +
                  slot->group.members.front().meta.name + "'");
}

// ---- Stage B ----

void Executor::ExchangeLoop() {
  while (Slot* slot = TakePrepared()) {
    Complete(slot);
    ReleaseSlot(slot);
  }
}

void Executor::Complete(Slot* slot) {
  if (failure_->failed()) return;  // every pending tensor was failed with the first error
  if (slot->join_last_rank >= 0) {
    if (options_.on_join_done) options_.on_join_done(slot->join_last_rank);
    return;
  }
  if (!slot->error.ok()) {
    OnError(slot->error);
    Notify(*slot, /*done=*/true);
    return;
  }
  if (options_.on_exchange) options_.on_exchange(slot->group.seq);
  slot->exchange_begin_ns = NowNs();
  Notify(*slot, /*done=*/false);
  Group& group = slot->group;
  ReducePath::Scratch& scratch = slot->ScratchOf(slot->path_index, *slot->path);
  Status st = slot->path->Exchange(group, scratch, &tag_);
  slot->exchange_end_ns = NowNs();
  if (!st.ok()) {
    OnError(st);
    Notify(*slot, /*done=*/true);
    return;
  }
  spdlog::debug(
      "entry {}: {} {} tensor(s) ({}), first '{}', {:.3f} ms", group.seq, OpName(group.op),
      group.members.size(), slot->path->name(), group.members.front().meta.name,
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - slot->started)
          .count());
  for (const GroupMember* m : table_->Finish(group.members)) {
    slot->path->Deliver(*m, group, scratch);
  }
  slot->deliver_end_ns = NowNs();
  Notify(*slot, /*done=*/true);
  if (group.op == CollectiveOp::kGradient) {
    GroupCost& cost = slot->cost;
    cost.elements = group.elements;
    cost.sparse = group.reducer != nullptr;
    cost.exchange_s = std::max<int64_t>(0, slot->deliver_end_ns - slot->exchange_begin_ns) * 1e-9;
    spdlog::debug("group cost: {} elements ({}), t_s {:.3f} ms, t_c {:.3f} ms", cost.elements,
                  cost.sparse ? "sparse" : "dense", cost.sparsify_s * 1e3, cost.exchange_s * 1e3);
    if (options_.on_group_cost) options_.on_group_cost(cost);
  }
}

void Executor::Notify(const Slot& slot, bool done) {
  observe::Observer* observer = options_.observer;
  if (!observer || slot.group.members.empty()) return;
  const Group& group = slot.group;
  observed_.clear();
  for (const GroupMember& m : group.members) observed_.push_back({&m.meta.name, m.ready_ns});
  observed_steps_.clear();
  for (const StepMarks::Mark& m : group.marks.marks()) observed_steps_.push_back({m.name, m.end_ns});
  observe::GroupView view;
  view.seq = group.seq;
  view.op = group.op;
  view.path = slot.path ? slot.path->name() : "";
  view.sparse = group.reducer != nullptr;
  view.step = group.step;
  view.plan_version = slot.cost.plan_version;
  view.elements = group.elements;
  view.dense_bytes =
      group.elements * transport::ElementSize(AccumulatorType(group.members.front().meta.dtype));
  view.tensors = observed_;
  view.received_ns = slot.received_ns;
  view.prepare_begin_ns = slot.prepare_begin_ns;
  view.prepare_end_ns = slot.prepare_end_ns;
  view.exchange_begin_ns = slot.exchange_begin_ns;
  view.exchange_end_ns = slot.exchange_end_ns;
  view.deliver_end_ns = slot.deliver_end_ns;
  view.steps = observed_steps_;
  view.ok = slot.error.ok() && slot.deliver_end_ns > 0;
  if (done) {
    observer->OnGroup(view);
  } else {
    observer->OnExchange(view);
  }
}

// ---- Failures ----

void Executor::OnFatal(const Status& fatal) {
  failure_->Fail(fatal, JobFailure::Source::kCoordinator);
  transport_->Abort(fatal);
}

void Executor::OnError(const Status& error) { failure_->Fail(error, JobFailure::Source::kLocal); }

// ---- The hand-off ----

Executor::Slot* Executor::AcquireSlot() {
  std::unique_lock lock(mu_);
  // Bounded by stage B, whose every transport call is bounded by the transport's timeout;
  // Stop() wakes it.
  changed_.wait(lock, [&] { return stopping_ || !free_.empty(); });
  if (stopping_) return nullptr;
  Slot* slot = free_.back();
  free_.pop_back();
  return slot;
}

void Executor::HandOff(Slot* slot) {
  {
    std::lock_guard lock(mu_);
    ready_.push_back(slot);
  }
  changed_.notify_all();
}

Executor::Slot* Executor::TakePrepared() {
  std::unique_lock lock(mu_);
  // Bounded by stage A's wait for entries; Stop() wakes it.
  changed_.wait(lock, [&] { return stopping_ || !ready_.empty(); });
  if (stopping_) return nullptr;
  Slot* slot = ready_.front();
  ready_.pop_front();
  return slot;
}

void Executor::ReleaseSlot(Slot* slot) {
  slot->join_last_rank = -1;
  slot->group.members.clear();  // lets go of the workers' regions and sessions
  slot->group.slices.clear();
  {
    std::lock_guard lock(mu_);
    free_.push_back(slot);
  }
  changed_.notify_all();
}

}  // namespace sparsync::pipeline
