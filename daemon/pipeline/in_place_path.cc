#include "daemon/pipeline/delivery.h"
#include "daemon/pipeline/dense_math.h"
#include "daemon/pipeline/host_paths.h"
#include "daemon/pipeline/host_sum.h"

namespace sparsync::pipeline {
namespace {

// One tensor of one worker, a dtype that is its own accumulator: no staging copy at all.
class InPlacePath final : public ReducePath {
 public:
  InPlacePath(World world, transport::Transport* transport)
      : ReducePath("in place"), local_size_(world.local_size), transport_(transport) {}

  bool Takes(const Group& group) const override {
    // Not a process set's tensor, and this node's worker takes part: a node whose worker does
    // not (outside the set, or joined) has no region; the host dense path makes the same call.
    return Reduces(group.op) && group.reducer == nullptr && group.members.size() == 1 &&
           local_size_ == 1 && AccumulatesInPlace(group.members[0].meta.dtype) &&
           group.members[0].meta.members.empty() && group.members[0].parts.size() == 1;
  }

  Status Prepare(Group& group, Scratch&, bool*) override {
    SPARSYNC_RETURN_IF_ERROR(StageToHost(group));
    return FlushResidual(group, 0,
                         static_cast<float*>(group.members.front().parts.front().region->data()));
  }

  Status Exchange(Group& group, Scratch&, uint32_t* tag) override {
    const GroupMember& m = group.members.front();
    void* data = m.parts.front().region->data();
    SPARSYNC_RETURN_IF_ERROR(
        transport_->AllReduceSum(data, group.elements, AccumulatorType(m.meta.dtype), (*tag)++));
    group.marks.Add("transfer");
    DivideInPlace(data, group.elements, group.divisor, m.meta.dtype);
    group.marks.Add("write-back");
    return Status::Ok();
  }

  void Deliver(const GroupMember& member, Group&, Scratch&) override { DeliverFromHost(member); }

 private:
  const int local_size_;
  transport::Transport* const transport_;
};

}  // namespace

std::unique_ptr<ReducePath> MakeInPlacePath(World world, transport::Transport* transport) {
  return std::make_unique<InPlacePath>(world, transport);
}

std::vector<std::unique_ptr<ReducePath>> HostPaths(World world, transport::Transport* transport) {
  std::vector<std::unique_ptr<ReducePath>> paths;
  paths.push_back(MakeInPlacePath(world, transport));
  paths.push_back(MakeHostSparsePath());
  paths.push_back(MakeHostDensePath(world, transport));
  paths.push_back(MakeGatherPath(world, transport));
  paths.push_back(MakeBroadcastPath(world, transport));
  return paths;
}

}  // namespace sparsync::pipeline
