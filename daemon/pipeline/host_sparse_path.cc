#include "daemon/pipeline/host_sparse_path.h"

#include "daemon/pipeline/delivery.h"
#include "daemon/pipeline/host_sum.h"

namespace sparsync::pipeline {
namespace {

struct SparseScratch : ReducePath::Scratch {
  std::vector<char> fusion;  // the local sum (float32); Exchange leaves the average in it
  PreparedGroup prepared;

  std::span<float> group(size_t elements) {
    return {reinterpret_cast<float*>(fusion.data()), elements};
  }
};

}  // namespace

std::unique_ptr<ReducePath::Scratch> HostSparsePath::NewScratch() const {
  return std::make_unique<SparseScratch>();
}

Status HostSparsePath::Prepare(Group& group, Scratch& scratch, bool*) {
  auto& s = static_cast<SparseScratch&>(scratch);
  SPARSYNC_RETURN_IF_ERROR(StageToHost(group));
  SumMembers(group, &s.fusion);
  return group.reducer->Prepare(group.slices, s.group(group.elements), group.step, group.group_id,
                                &s.prepared);
}

Status HostSparsePath::Exchange(Group& group, Scratch& scratch, uint32_t* tag) {
  auto& s = static_cast<SparseScratch&>(scratch);
  SPARSYNC_RETURN_IF_ERROR(group.reducer->Exchange(group.slices, s.prepared,
                                                   s.group(group.elements), group.divisor, tag));
  WriteBackMembers(group, s.fusion.data(), /*divisor=*/1.0);  // averaged by the reducer
  return Status::Ok();
}

void HostSparsePath::Deliver(const GroupMember& member, Group&, Scratch&) {
  DeliverFromHost(member);
}

}  // namespace sparsync::pipeline
