#include "daemon/pipeline/host_dense_path.h"

#include "daemon/pipeline/delivery.h"
#include "daemon/pipeline/dense_math.h"
#include "daemon/pipeline/host_sum.h"

namespace sparsync::pipeline {
namespace {

struct FusionScratch : ReducePath::Scratch {
  std::vector<char> fusion;  // the local sum in the accumulator type; Exchange leaves the result
};

}  // namespace

// ---- InPlacePath ----

bool InPlacePath::Takes(const Group& group) const {
  return Reduces(group.op) && group.reducer == nullptr && group.members.size() == 1 &&
         world_.local_size == 1 && AccumulatesInPlace(group.members[0].meta.dtype);
}

Status InPlacePath::Prepare(Group& group, Scratch&, bool*) { return StageToHost(group); }

Status InPlacePath::Exchange(Group& group, Scratch&, uint32_t* tag) {
  const GroupMember& m = group.members.front();
  void* data = m.parts.front().region->data();
  SPARSYNC_RETURN_IF_ERROR(
      transport_->AllReduceSum(data, group.elements, AccumulatorType(m.meta.dtype), (*tag)++));
  DivideInPlace(data, group.elements, group.divisor, m.meta.dtype);
  return Status::Ok();
}

void InPlacePath::Deliver(const GroupMember& member, Group&, Scratch&) {
  DeliverFromHost(member);
}

// ---- HostDensePath ----

bool HostDensePath::Takes(const Group& group) const {
  return Reduces(group.op) && group.reducer == nullptr;
}

std::unique_ptr<ReducePath::Scratch> HostDensePath::NewScratch() const {
  return std::make_unique<FusionScratch>();
}

Status HostDensePath::Prepare(Group& group, Scratch& scratch, bool*) {
  SPARSYNC_RETURN_IF_ERROR(StageToHost(group));
  SumMembers(group, &static_cast<FusionScratch&>(scratch).fusion);
  return Status::Ok();
}

Status HostDensePath::Exchange(Group& group, Scratch& scratch, uint32_t* tag) {
  std::vector<char>& fusion = static_cast<FusionScratch&>(scratch).fusion;
  const DType dtype = group.members.front().meta.dtype;
  SPARSYNC_RETURN_IF_ERROR(
      transport_->AllReduceSum(fusion.data(), group.elements, AccumulatorType(dtype), (*tag)++));
  WriteBackMembers(group, fusion.data(), group.divisor);
  return Status::Ok();
}

void HostDensePath::Deliver(const GroupMember& member, Group&, Scratch&) {
  DeliverFromHost(member);
}

}  // namespace sparsync::pipeline
