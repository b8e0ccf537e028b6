#include "daemon/pipeline/collective_paths.h"

#include <cstring>

#include "daemon/pipeline/delivery.h"

namespace sparsync::pipeline {
namespace {

struct GatherScratch : ReducePath::Scratch {
  std::shared_ptr<intake::SharedRegion> gathered;  // this group's result
  std::vector<char> staging;                       // the node's parts side by side
};

}  // namespace

// ---- GatherPath ----

std::unique_ptr<ReducePath::Scratch> GatherPath::NewScratch() const {
  return std::make_unique<GatherScratch>();
}

Status GatherPath::Prepare(Group& group, Scratch& scratch, bool*) {
  static_cast<GatherScratch&>(scratch).gathered = nullptr;
  if (group.members.size() != 1) {
    return Internal("an allgather entry names " + std::to_string(group.members.size()) +
                    " tensors");
  }
  return Status::Ok();
}

Status GatherPath::Exchange(Group& group, Scratch& scratch, uint32_t* tag) {
  auto& s = static_cast<GatherScratch&>(scratch);
  const GroupMember& member = group.members.front();
  const auto& dims = member.scheduled.worker_dim0;
  if (dims.size() != static_cast<size_t>(world_.size())) {
    return Internal("allgather of '" + member.meta.name + "' scheduled with " +
                    std::to_string(dims.size()) + " sizes for " + std::to_string(world_.size()) +
                    " workers");
  }
  int64_t row = 1;
  for (size_t i = 1; i < member.meta.shape.size(); ++i) row *= member.meta.shape[i];
  const size_t row_bytes = static_cast<size_t>(row) * DTypeSize(member.meta.dtype);
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
  const void* send = member.parts.front().region->data();
  if (world_.local_size > 1) {
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
  s.gathered = *region;
  return Status::Ok();
}

void GatherPath::Deliver(const GroupMember& member, Group&, Scratch& scratch) {
  auto& s = static_cast<GatherScratch&>(scratch);
  DeliverGathered(member, *s.gathered);
  s.gathered = nullptr;  // the workers have their descriptors; the daemon lets go
}

// ---- BroadcastPath ----

Status BroadcastPath::Prepare(Group& group, Scratch&, bool*) {
  if (group.members.size() != 1) {
    return Internal("a broadcast entry names " + std::to_string(group.members.size()) +
                    " tensors");
  }
  return Status::Ok();
}

Status BroadcastPath::Exchange(Group& group, Scratch&, uint32_t* tag) {
  const GroupMember& member = group.members.front();
  const int root = member.meta.root_rank;
  const int root_node = root / world_.local_size;
  const int root_local = root % world_.local_size;
  const size_t bytes = member.meta.Bytes();
  const int source = world_.node_rank == root_node ? root_local : 0;
  void* buffer = member.parts[source].region->data();
  SPARSYNC_RETURN_IF_ERROR(transport_->Broadcast(buffer, bytes, root_node, (*tag)++));
  for (int r = 0; r < world_.local_size; ++r) {
    if (r != source && bytes) std::memcpy(member.parts[r].region->data(), buffer, bytes);
  }
  return Status::Ok();
}

void BroadcastPath::Deliver(const GroupMember& member, Group&, Scratch&) {
  DeliverFromHost(member);
}

}  // namespace sparsync::pipeline
