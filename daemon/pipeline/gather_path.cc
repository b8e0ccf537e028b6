#include <cstring>

#include "daemon/pipeline/collective_path.h"
#include "daemon/pipeline/delivery.h"
#include "daemon/pipeline/host_paths.h"

namespace sparsync::pipeline {
namespace {

// An allgather: every worker's tensor concatenated along dim 0 in global rank order, into a
// fresh memfd region that travels to each worker with its DONE. All in stage B; CUDA tensors
// were refused at REGISTER (an allgather's result has no device buffer).
class GatherPath final : public CollectivePath {
 public:
  using CollectivePath::CollectivePath;

  std::unique_ptr<Scratch> NewScratch() const override { return std::make_unique<Gathered>(); }

  Status Prepare(Group& group, Scratch& scratch, bool* declined) override {
    static_cast<Gathered&>(scratch).result = nullptr;
    return CollectivePath::Prepare(group, scratch, declined);
  }

  Status Exchange(Group& group, Scratch& scratch, uint32_t* tag) override;

  void Deliver(const GroupMember& member, Group&, Scratch& scratch) override {
    auto& s = static_cast<Gathered&>(scratch);
    DeliverGathered(member, *s.result);
    s.result = nullptr;  // the workers have their descriptors; the daemon lets go
  }

 private:
  struct Gathered : Scratch {
    std::shared_ptr<intake::SharedRegion> result;  // this group's; null until exchanged
    std::vector<char> staging;                     // the node's parts side by side
  };
};

Status GatherPath::Exchange(Group& group, Scratch& scratch, uint32_t* tag) {
  auto& s = static_cast<Gathered&>(scratch);
  const GroupMember& member = group.members.front();
  const auto& dims = member.scheduled.worker_dim0;
  const int participants = member.meta.Participants(world_.size());
  if (dims.size() != static_cast<size_t>(participants)) {
    return Internal("allgather of '" + member.meta.name + "' scheduled with " +
                    std::to_string(dims.size()) + " sizes for " + std::to_string(participants) +
                    " workers");
  }
  // dims[i] is the i-th participant's: global rank i, or the process set's i-th member.
  const auto& members = member.meta.members;
  auto rank_of = [&](int i) { return members.empty() ? i : members[i]; };
  int64_t row = 1;
  for (size_t i = 1; i < member.meta.shape.size(); ++i) row *= member.meta.shape[i];
  const size_t row_bytes = static_cast<size_t>(row) * DTypeSize(member.meta.dtype);
  std::vector<size_t> node_bytes(world_.num_nodes, 0);
  size_t total = 0;
  for (int w = 0; w < participants; ++w) {
    if (dims[w] < 0) return Internal("negative allgather size");
    node_bytes[rank_of(w) / world_.local_size] += static_cast<size_t>(dims[w]) * row_bytes;
    total += static_cast<size_t>(dims[w]) * row_bytes;
  }
  auto region = intake::SharedRegion::Create(member.meta.name + ".gathered", total);
  if (!region.ok()) return region.status();
  const size_t mine = node_bytes[world_.node_rank];
  // A node with no member of a process set sends nothing (from a valid address: the transport
  // may hand it to its library).
  static const char kNothing = 0;
  const void* send = member.parts.empty() ? &kNothing : member.parts.front().region->data();
  if (member.parts.size() > 1) {
    s.staging.resize(mine);
    size_t off = 0;
    for (const WorkerPart& part : member.parts) {
      size_t n = static_cast<size_t>(part.dim0) * row_bytes;
      if (n) std::memcpy(s.staging.data() + off, part.region->data(), n);
      off += n;
    }
    send = s.staging.data();
  }
  SPARSYNC_RETURN_IF_ERROR(
      transport_->AllGatherV(send, mine, (*region)->data(), node_bytes, (*tag)++));
  s.result = *region;
  return Status::Ok();
}

}  // namespace

std::unique_ptr<ReducePath> MakeGatherPath(World world, transport::Transport* transport) {
  return std::make_unique<GatherPath>("allgather", CollectiveOp::kAllGather, world, transport);
}

}  // namespace sparsync::pipeline
