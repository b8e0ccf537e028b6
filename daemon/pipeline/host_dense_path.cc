#include "daemon/pipeline/delivery.h"
#include "daemon/pipeline/dense_math.h"
#include "daemon/pipeline/host_paths.h"
#include "daemon/pipeline/host_sum.h"

namespace sparsync::pipeline {
namespace {

// Any dense reduction: the local sum side by side in the slot's buffer, one allreduce of it.
class HostDensePath final : public ReducePath {
 public:
  explicit HostDensePath(transport::Transport* transport)
      : ReducePath("host dense"), transport_(transport) {}

  bool Takes(const Group& group) const override {
    return Reduces(group.op) && group.reducer == nullptr;
  }

  std::unique_ptr<Scratch> NewScratch() const override { return std::make_unique<Fusion>(); }

  Status Prepare(Group& group, Scratch& scratch, bool*) override {
    SPARSYNC_RETURN_IF_ERROR(StageToHost(group));
    SumMembers(group, &static_cast<Fusion&>(scratch).buffer);
    return Status::Ok();
  }

  Status Exchange(Group& group, Scratch& scratch, uint32_t* tag) override {
    std::vector<char>& fusion = static_cast<Fusion&>(scratch).buffer;
    const DType dtype = group.members.front().meta.dtype;
    SPARSYNC_RETURN_IF_ERROR(
        transport_->AllReduceSum(fusion.data(), group.elements, AccumulatorType(dtype), (*tag)++));
    WriteBackMembers(group, fusion.data(), group.divisor);
    return Status::Ok();
  }

  void Deliver(const GroupMember& member, Group&, Scratch&) override { DeliverFromHost(member); }

 private:
  // The local sum in the accumulator type; Exchange leaves the result in it.
  struct Fusion : Scratch {
    std::vector<char> buffer;
  };
  transport::Transport* const transport_;
};

}  // namespace

std::unique_ptr<ReducePath> MakeHostDensePath(transport::Transport* transport) {
  return std::make_unique<HostDensePath>(transport);
}

}  // namespace sparsync::pipeline
