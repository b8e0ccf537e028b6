#include "daemon/pipeline/delivery.h"
#include "daemon/pipeline/host_paths.h"
#include "daemon/pipeline/host_sum.h"

namespace sparsync::pipeline {
namespace {

// A compressed gradient group on the host (docs/algorithms.md §6): stage A sums the local
// workers' regions into the slot's float32 buffer and hands it to the group's SparseReducer
// (residual, non-finite check, selection, packing); stage B runs the reducer's exchange, which
// leaves the decompressed average in the buffer, and writes it back into every region. Residuals
// a tensor left on a GPU join the host's (TensorState::AddTo).
class HostSparsePath final : public ReducePath {
 public:
  HostSparsePath() : ReducePath("host sparse") {}

  bool Takes(const Group& group) const override { return group.reducer != nullptr; }

  std::unique_ptr<Scratch> NewScratch() const override { return std::make_unique<Selection>(); }

  Status Prepare(Group& group, Scratch& scratch, bool*) override {
    auto& s = static_cast<Selection&>(scratch);
    SPARSYNC_RETURN_IF_ERROR(StageToHost(group));
    SumMembers(group, &s.fusion);
    return group.reducer->Prepare(group.slices, s.group(group.elements), group.step,
                                  group.group_id, &s.prepared);
  }

  Status Exchange(Group& group, Scratch& scratch, uint32_t* tag) override {
    auto& s = static_cast<Selection&>(scratch);
    SPARSYNC_RETURN_IF_ERROR(group.reducer->Exchange(group.slices, s.prepared,
                                                     s.group(group.elements), group.divisor, tag));
    WriteBackMembers(group, s.fusion.data(), /*divisor=*/1.0);  // averaged by the reducer
    return Status::Ok();
  }

  void Deliver(const GroupMember& member, Group&, Scratch&) override { DeliverFromHost(member); }

 private:
  struct Selection : Scratch {
    std::vector<char> fusion;  // the local sum (float32); Exchange leaves the average in it
    PreparedGroup prepared;
    std::span<float> group(size_t elements) {
      return {reinterpret_cast<float*>(fusion.data()), elements};
    }
  };
};

}  // namespace

std::unique_ptr<ReducePath> MakeHostSparsePath() { return std::make_unique<HostSparsePath>(); }

}  // namespace sparsync::pipeline
