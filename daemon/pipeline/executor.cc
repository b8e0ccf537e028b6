#include "daemon/pipeline/executor.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "daemon/intake/codec.h"
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

// One schedule entry in flight: what stage A made of it and stage B sends. Reused; the vectors
// keep their capacity.
struct Executor::Slot {
  enum class Kind {
    kError,      // stage A failed: `error`
    kGather,     // ALLGATHER, all in stage B
    kBroadcast,  // BROADCAST, all in stage B
    kInPlace,    // dense, one tensor of one worker reduced in its own buffer in stage B
    kDense,      // dense, the local sum in `fusion` (or on the device: `on_device`)
    kSparse,     // sparse, the local sum in `fusion` (or on the device: `on_device`) and its
                 // selection in `prepared`
  };
  Kind kind = Kind::kError;
  uint64_t seq = 0;
  Status error;
  std::vector<GroupMember> members;
  uint32_t op = 0;
  std::vector<char> fusion;  // local sum in the accumulator type; B leaves the result in it
  size_t total = 0;          // elements of the group
  double divisor = 1.0;
  std::vector<GroupSlice> slices;  // kSparse; names point into `members`
  SparseReducer* sparse = nullptr;
  PreparedGroup prepared;
  bool on_device = false;  // kDense or kSparse on the GPU: the group is in `device` (or, dense
                           // and alone, in its buffer), not `fusion`
  std::unique_ptr<DeviceSparse::Scratch> device;
  std::chrono::steady_clock::time_point started;
  GroupCost cost;  // sparsify_s filled by stage A, the rest by B
};

Executor::Executor(World world, TensorTable* table, transport::Transport* transport, NextFn next,
                   FailFn fail, std::chrono::milliseconds resolve_wait,
                   std::unique_ptr<SparseReducers> sparse, ExecutorOptions options)
    : world_(world),
      table_(table),
      transport_(transport),
      next_(std::move(next)),
      fail_(std::move(fail)),
      resolve_wait_(resolve_wait),
      sparse_(std::move(sparse)),
      options_(std::move(options)) {
  const int pipelined = std::max(1, options_.depth) + 1;
  for (int i = 0; i < pipelined + 1; ++i) slots_.push_back(std::make_unique<Slot>());
  for (int i = 0; i < pipelined; ++i) free_.push_back(slots_[i].get());
}

Executor::~Executor() { Stop(); }

void Executor::Start() {
  prepare_thread_ = std::thread([this] { PrepareLoop(); });
  exchange_thread_ = std::thread([this] { ExchangeLoop(); });
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
    if (slot->kind == Slot::Kind::kError) OnError(slot->error);
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
  if (entry.group.empty() || failed()) return;
  Slot* slot = slots_.back().get();  // never in the hand-off
  Prepare(entry, slot);
  if (options_.on_prepared) options_.on_prepared(entry.seq);
  Complete(slot);
  slot->members.clear();
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
      // A plan announcement has nothing to exchange. After a failure the table refuses
      // everything; later entries have nothing to do.
      if (entry.group.empty() || prepare_failed_ || failed()) continue;
      Slot* slot = AcquireSlot();
      if (!slot) return;
      Prepare(entry, slot);
      if (options_.on_prepared) options_.on_prepared(entry.seq);
      prepare_failed_ = slot->kind == Slot::Kind::kError;
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
    if (options_.device_sparse) options_.device_sparse->Forget(name);
  }
  slot->seq = entry.seq;
  slot->started = std::chrono::steady_clock::now();
  slot->kind = Slot::Kind::kError;
  slot->error = Status::Ok();
  slot->sparse = nullptr;
  slot->on_device = false;
  slot->slices.clear();
  slot->cost = {};
  slot->cost.plan_version = entry.plan_version;
  auto resolved = table_->Resolve(entry, resolve_wait_);
  if (!resolved.ok()) {
    slot->error = resolved.status();
    return;
  }
  int64_t begin_ns = prepare_free_ns_;
  for (const GroupMember& m : *resolved) begin_ns = std::max(begin_ns, m.ready_ns);
  slot->members = std::move(*resolved);
  if (slot->members.empty()) {
    slot->error = Internal("schedule entry " + std::to_string(entry.seq) + " names no tensor");
    return;
  }
  slot->op = slot->members.front().meta.op;
  if (slot->op == SPARSYNC_OP_ALLGATHER) {
    slot->kind = Slot::Kind::kGather;
  } else if (slot->op == SPARSYNC_OP_BROADCAST) {
    slot->kind = Slot::Kind::kBroadcast;
  } else {
    Status st = PrepareReduce(slot);
    if (!st.ok()) {
      slot->kind = Slot::Kind::kError;
      slot->error = st;
    }
  }
  prepare_free_ns_ = NowNs();
  if (begin_ns > 0) slot->cost.sparsify_s = std::max<int64_t>(0, prepare_free_ns_ - begin_ns) * 1e-9;
}

Status Executor::PrepareReduce(Slot* slot) {
  std::vector<GroupMember>& members = slot->members;
  const GroupMember& first = members.front();
  const uint32_t dtype = first.meta.dtype;
  const transport::ElementType acc_type = AccumulatorType(dtype);
  const size_t acc_size = transport::ElementSize(acc_type);
  slot->divisor = first.meta.reduce_op == SPARSYNC_REDUCE_AVERAGE ? world_.size() : 1.0;

  size_t total = 0;
  for (const GroupMember& m : members) total += static_cast<size_t>(m.meta.NumElements());
  slot->total = total;
  SparseReducer* sparse = nullptr;
  if (sparse_ && first.meta.op == SPARSYNC_OP_GRADIENT &&
      acc_type == transport::ElementType::kFloat32 &&
      total * acc_size >= sparse_->min_compress_bytes()) {
    // Fused tensors share their compressor (it is part of the fusion key).
    SPARSYNC_ASSIGN_OR_RETURN(sparse, sparse_->For(first.meta.compressor, first.meta.density));
  }

  auto slice_members = [&] {
    size_t offset = 0;
    for (const GroupMember& m : members) {
      size_t count = static_cast<size_t>(m.meta.NumElements());
      slot->slices.push_back({&m.meta.name, offset, count});
      offset += count;
    }
  };
  DeviceSparse* device = options_.device_sparse.get();
  if (sparse && device && sparse->SelectsOnDevice() && DeviceSparse::Takes(members)) {
    slice_members();
    if (!slot->device) slot->device = std::make_unique<DeviceSparse::Scratch>();
    bool fall_back = false;
    Status st = device->Select(members, slot->slices, sparse, slot->device.get(), &slot->prepared,
                               &fall_back);
    if (!fall_back) {
      slot->kind = Slot::Kind::kSparse;
      slot->sparse = sparse;
      slot->on_device = true;
      return st;
    }
    slot->slices.clear();
  }
  if (!sparse && device && DeviceSparse::TakesDense(members, *transport_)) {
    slice_members();
    if (!slot->device) slot->device = std::make_unique<DeviceSparse::Scratch>();
    bool fall_back = false;
    Status st = device->PrepareDense(members, slot->slices, slot->device.get(), &fall_back);
    if (!fall_back) {
      slot->kind = Slot::Kind::kDense;
      slot->on_device = true;
      return st;
    }
    slot->slices.clear();
  }
  // The host path: members whose sum was left on the device come to the host first.
  for (GroupMember& m : members) SPARSYNC_RETURN_IF_ERROR(StageToHost(m));

  // One tensor, one worker, a dtype that is its own accumulator: stage B reduces the worker's
  // buffer in place, without staging.
  if (!sparse && members.size() == 1 && world_.local_size == 1 && AccumulatesInPlace(dtype)) {
    slot->kind = Slot::Kind::kInPlace;
    return Status::Ok();
  }

  if (slot->fusion.size() < total * acc_size) slot->fusion.resize(total * acc_size);
  std::vector<const void*> inputs(world_.local_size);
  size_t offset = 0;
  for (const GroupMember& m : members) {
    // Parts summed on the node's GPUs arrive as one input.
    const size_t num_inputs = m.num_inputs();
    for (size_t r = 0; r < num_inputs; ++r) inputs[r] = m.parts[r].region->data();
    size_t count = static_cast<size_t>(m.meta.NumElements());
    SumInto(slot->fusion.data() + offset * acc_size,
            std::span<const void* const>(inputs.data(), num_inputs), count, dtype);
    offset += count;
  }
  if (!sparse) {
    slot->kind = Slot::Kind::kDense;
    return Status::Ok();
  }
  slice_members();
  // Residuals some of these tensors left on a GPU join the host's.
  if (device) SPARSYNC_RETURN_IF_ERROR(device->MoveResidualsToHost(slot->slices, sparse));
  slot->kind = Slot::Kind::kSparse;
  slot->sparse = sparse;
  std::span<const float> group(reinterpret_cast<const float*>(slot->fusion.data()), total);
  return sparse->Prepare(slot->slices, group, first.parts.front().round, first.scheduled.slot,
                         &slot->prepared);
}

// ---- Stage B ----

void Executor::ExchangeLoop() {
  while (Slot* slot = TakePrepared()) {
    Complete(slot);
    ReleaseSlot(slot);
  }
}

void Executor::Complete(Slot* slot) {
  if (failed()) return;  // every pending tensor was failed with the first error
  if (slot->kind == Slot::Kind::kError) {
    OnError(slot->error);
    return;
  }
  if (options_.on_exchange) options_.on_exchange(slot->seq);
  const int64_t exchange_begin_ns = NowNs();
  std::vector<GroupMember>& members = slot->members;
  Status st;
  std::vector<std::shared_ptr<intake::SharedRegion>> gathered;
  if (slot->kind == Slot::Kind::kGather) {
    st = Gather(members.front(), &gathered);
  } else if (slot->kind == Slot::Kind::kBroadcast) {
    st = Broadcast(members.front());
  } else {
    st = ExchangeReduce(slot);
  }
  if (!st.ok()) {
    OnError(st);
    return;
  }
  spdlog::debug(
      "entry {}: {} {} tensor(s), first '{}', {:.3f} ms", slot->seq, negotiation::OpName(slot->op),
      members.size(), members.front().meta.name,
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - slot->started)
          .count());
  for (const GroupMember* m : table_->Finish(members)) {
    if (slot->op != SPARSYNC_OP_ALLGATHER) {
      DeliverResult(*m);
      continue;
    }
    int64_t dim0 = 0;
    for (int64_t d : m->scheduled.worker_dim0) dim0 += d;
    for (const WorkerPart& part : m->parts) {
      (void)SendDone(part, Status::Ok(), gathered.front()->fd(), gathered.front()->size(), dim0);
    }
  }
  if (slot->op == SPARSYNC_OP_GRADIENT) {
    GroupCost& cost = slot->cost;
    cost.elements = slot->total;
    cost.sparse = slot->kind == Slot::Kind::kSparse;
    cost.exchange_s = std::max<int64_t>(0, NowNs() - exchange_begin_ns) * 1e-9;
    spdlog::debug("group cost: {} elements ({}), t_s {:.3f} ms, t_c {:.3f} ms", cost.elements,
                  cost.sparse ? "sparse" : "dense", cost.sparsify_s * 1e3, cost.exchange_s * 1e3);
    if (options_.on_group_cost) options_.on_group_cost(cost);
  }
}

Status Executor::ExchangeReduce(Slot* slot) {
  const uint32_t dtype = slot->members.front().meta.dtype;
  const transport::ElementType acc_type = AccumulatorType(dtype);
  const size_t acc_size = transport::ElementSize(acc_type);
  if (slot->kind == Slot::Kind::kInPlace) {
    GroupMember& m = slot->members.front();
    void* data = m.parts.front().region->data();
    SPARSYNC_RETURN_IF_ERROR(transport_->AllReduceSum(data, slot->total, acc_type, tag_++));
    DivideInPlace(data, slot->total, slot->divisor, dtype);
    return Status::Ok();
  }
  if (slot->on_device && slot->kind == Slot::Kind::kDense) {
    return options_.device_sparse->FinishDense(slot->members, slot->slices, slot->device.get(),
                                               transport_, slot->divisor, &tag_);
  }
  if (slot->on_device) {
    return options_.device_sparse->Finish(slot->members, slot->slices, slot->sparse,
                                          slot->device.get(), slot->prepared, slot->divisor, &tag_);
  }
  double write_divisor = slot->divisor;
  if (slot->kind == Slot::Kind::kSparse) {
    std::span<float> group(reinterpret_cast<float*>(slot->fusion.data()), slot->total);
    SPARSYNC_RETURN_IF_ERROR(
        slot->sparse->Exchange(slot->slices, slot->prepared, group, slot->divisor, &tag_));
    write_divisor = 1.0;  // averaged by the sparse reducer
  } else {
    SPARSYNC_RETURN_IF_ERROR(
        transport_->AllReduceSum(slot->fusion.data(), slot->total, acc_type, tag_++));
  }
  size_t offset = 0;
  for (const GroupMember& m : slot->members) {
    size_t count = static_cast<size_t>(m.meta.NumElements());
    for (size_t r = 0; r < m.num_inputs(); ++r) {
      WriteBack(slot->fusion.data() + offset * acc_size, count, write_divisor,
                m.parts[r].region->data(), dtype);
    }
    offset += count;
  }
  return Status::Ok();
}

// ---- Failures ----

void Executor::OnFatal(const Status& fatal) {
  {
    std::lock_guard lock(mu_);
    if (failed_.ok()) failed_ = fatal;
  }
  transport_->Abort(fatal);
  table_->FailAll(fatal);
}

void Executor::OnError(const Status& error) {
  bool first = false;
  {
    std::lock_guard lock(mu_);
    first = failed_.ok();
    if (first) failed_ = error;
  }
  table_->FailAll(error);
  if (first) fail_(error);
}

bool Executor::failed() const {
  std::lock_guard lock(mu_);
  return !failed_.ok();
}

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
  slot->members.clear();  // lets go of the workers' regions and sessions
  slot->slices.clear();
  {
    std::lock_guard lock(mu_);
    free_.push_back(slot);
  }
  changed_.notify_all();
}

Status Executor::Gather(GroupMember& member,
                        std::vector<std::shared_ptr<intake::SharedRegion>>* results) {
  const auto& dims = member.scheduled.worker_dim0;
  if (dims.size() != static_cast<size_t>(world_.size())) {
    return Internal("allgather of '" + member.meta.name + "' scheduled with " +
                    std::to_string(dims.size()) + " sizes for " + std::to_string(world_.size()) +
                    " workers");
  }
  int64_t row = 1;
  for (size_t i = 1; i < member.meta.shape.size(); ++i) row *= member.meta.shape[i];
  const size_t row_bytes = static_cast<size_t>(row) * intake::WireDTypeSize(member.meta.dtype);
  std::vector<size_t> node_bytes(world_.num_nodes, 0);
  size_t total = 0;
  for (int w = 0; w < world_.size(); ++w) {
    if (dims[w] < 0) return Internal("negative allgather size");
    node_bytes[w / world_.local_size] += static_cast<size_t>(dims[w]) * row_bytes;
    total += static_cast<size_t>(dims[w]) * row_bytes;
  }
  auto region = intake::SharedRegion::Create(member.meta.name + ".gathered", total);
  if (!region.ok()) return region.status();
  const size_t mine = node_bytes[world_.node_rank];
  std::vector<char> staging;
  const void* send = member.parts.front().region->data();
  if (world_.local_size > 1) {
    staging.resize(mine);
    size_t off = 0;
    for (const WorkerPart& part : member.parts) {
      size_t n = static_cast<size_t>(part.dim0) * row_bytes;
      if (n) std::memcpy(staging.data() + off, part.region->data(), n);
      off += n;
    }
    send = staging.data();
  }
  SPARSYNC_RETURN_IF_ERROR(
      transport_->AllGatherV(send, mine, (*region)->data(), node_bytes, tag_++));
  results->push_back(*region);
  return Status::Ok();
}

Status Executor::Broadcast(GroupMember& member) {
  const int root = member.meta.root_rank;
  const int root_node = root / world_.local_size;
  const int root_local = root % world_.local_size;
  const size_t bytes =
      static_cast<size_t>(member.meta.NumElements()) * intake::WireDTypeSize(member.meta.dtype);
  const int source = world_.node_rank == root_node ? root_local : 0;
  void* buffer = member.parts[source].region->data();
  SPARSYNC_RETURN_IF_ERROR(transport_->Broadcast(buffer, bytes, root_node, tag_++));
  for (int r = 0; r < world_.local_size; ++r) {
    if (r != source && bytes) std::memcpy(member.parts[r].region->data(), buffer, bytes);
  }
  return Status::Ok();
}

}  // namespace sparsync::pipeline
