#include "daemon/pipeline/executor.h"

#include <spdlog/spdlog.h>

#include <cstring>

#include "daemon/intake/codec.h"
#include "daemon/pipeline/dense_math.h"

namespace sparsync::pipeline {

Executor::Executor(World world, TensorTable* table, transport::Transport* transport, NextFn next,
                   FailFn fail, std::chrono::milliseconds resolve_wait,
                   std::unique_ptr<SparseReducers> sparse)
    : world_(world),
      table_(table),
      transport_(transport),
      next_(std::move(next)),
      fail_(std::move(fail)),
      resolve_wait_(resolve_wait),
      sparse_(std::move(sparse)) {}

Executor::~Executor() { Stop(); }

void Executor::Start() {
  thread_ = std::thread([this] {
    while (!stopping_) RunOnce(std::chrono::milliseconds(500));
  });
}

void Executor::Stop() {
  stopping_ = true;
  if (thread_.joinable()) thread_.join();
}

void Executor::RunOnce(std::chrono::milliseconds wait) {
  for (const auto& entry : next_(wait)) {
    if (stopping_) return;
    Execute(entry);
  }
}

void Executor::Execute(const negotiation::ScheduleEntry& entry) {
  if (!entry.fatal.ok()) {
    transport_->Abort(entry.fatal);
    table_->FailAll(entry.fatal);
    return;
  }
  auto resolved = table_->Resolve(entry, resolve_wait_);
  if (!resolved.ok()) {
    table_->FailAll(resolved.status());
    fail_(resolved.status());
    return;
  }
  std::vector<GroupMember>& members = *resolved;
  uint32_t op = members.front().meta.op;
  auto started = std::chrono::steady_clock::now();
  Status st;
  std::vector<std::shared_ptr<intake::SharedRegion>> gathered;
  if (op == SPARSYNC_OP_ALLGATHER) {
    st = Gather(members.front(), &gathered);
  } else if (op == SPARSYNC_OP_BROADCAST) {
    st = Broadcast(members.front());
  } else {
    st = Reduce(members);
  }
  if (!st.ok()) {
    table_->FailAll(st);
    fail_(st);
    return;
  }
  spdlog::debug("entry {}: {} {} tensor(s), first '{}', {:.3f} ms", entry.seq,
                negotiation::OpName(op), members.size(), members.front().meta.name,
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count());
  for (const GroupMember* m : table_->Finish(members)) {
    for (const WorkerPart& part : m->parts) {
      if (op == SPARSYNC_OP_ALLGATHER) {
        int64_t dim0 = 0;
        for (int64_t d : m->scheduled.worker_dim0) dim0 += d;
        (void)SendDone(part, Status::Ok(), gathered.front()->fd(), gathered.front()->size(), dim0);
      } else {
        (void)SendDone(part, Status::Ok());
      }
    }
  }
}

Status Executor::Reduce(std::vector<GroupMember>& members) {
  const uint32_t dtype = members.front().meta.dtype;
  const transport::ElementType acc_type = AccumulatorType(dtype);
  const size_t acc_size = transport::ElementSize(acc_type);
  const double divisor =
      members.front().meta.reduce_op == SPARSYNC_REDUCE_AVERAGE ? world_.size() : 1.0;

  size_t total = 0;
  for (const GroupMember& m : members) total += static_cast<size_t>(m.meta.NumElements());
  SparseReducer* sparse = nullptr;
  if (sparse_ && members.front().meta.op == SPARSYNC_OP_GRADIENT &&
      acc_type == transport::ElementType::kFloat32 &&
      total * acc_size >= sparse_->min_compress_bytes()) {
    // Fused tensors share their compressor (it is part of the fusion key).
    SPARSYNC_ASSIGN_OR_RETURN(sparse, sparse_->For(members.front().meta.compressor,
                                                   members.front().meta.density));
  }

  // One tensor, one worker, a dtype that is its own accumulator: reduce the worker's buffer in
  // place, without staging.
  if (!sparse && members.size() == 1 && world_.local_size == 1 && AccumulatesInPlace(dtype)) {
    GroupMember& m = members.front();
    size_t count = static_cast<size_t>(m.meta.NumElements());
    void* data = m.parts.front().region->data();
    SPARSYNC_RETURN_IF_ERROR(transport_->AllReduceSum(data, count, acc_type, tag_++));
    DivideInPlace(data, count, divisor, dtype);
    return Status::Ok();
  }

  if (fusion_.size() < total * acc_size) fusion_.resize(total * acc_size);
  std::vector<const void*> inputs(world_.local_size);
  size_t offset = 0;
  for (const GroupMember& m : members) {
    for (int r = 0; r < world_.local_size; ++r) inputs[r] = m.parts[r].region->data();
    size_t count = static_cast<size_t>(m.meta.NumElements());
    SumInto(fusion_.data() + offset * acc_size, inputs, count, dtype);
    offset += count;
  }
  double write_divisor = divisor;
  if (sparse) {
    std::vector<GroupSlice> slices;
    offset = 0;
    for (const GroupMember& m : members) {
      size_t count = static_cast<size_t>(m.meta.NumElements());
      slices.push_back({&m.meta.name, offset, count});
      offset += count;
    }
    std::span<float> group(reinterpret_cast<float*>(fusion_.data()), total);
    SPARSYNC_RETURN_IF_ERROR(sparse->Reduce(slices, group, members.front().parts.front().round,
                                             members.front().scheduled.slot, divisor, &tag_));
    write_divisor = 1.0;  // averaged by the sparse reducer
  } else {
    SPARSYNC_RETURN_IF_ERROR(transport_->AllReduceSum(fusion_.data(), total, acc_type, tag_++));
  }
  offset = 0;
  for (const GroupMember& m : members) {
    size_t count = static_cast<size_t>(m.meta.NumElements());
    for (const WorkerPart& part : m.parts) {
      WriteBack(fusion_.data() + offset * acc_size, count, write_divisor, part.region->data(), dtype);
    }
    offset += count;
  }
  return Status::Ok();
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
