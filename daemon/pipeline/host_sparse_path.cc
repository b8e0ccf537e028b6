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

  // The local sum goes straight into the reducer's work buffer (no staging copy of the group).
  Status Prepare(Group& group, Scratch& scratch, bool*) override {
    auto& s = static_cast<Selection&>(scratch);
    SPARSYNC_RETURN_IF_ERROR(StageToHost(group));
    SizeScratch(&s.prepared.work, group.elements);
    SumMembersInto(group, s.prepared.work.data());
    group.marks.Add("local reduce");
    s.prepared.marks = &group.marks;
    return group.reducer->PrepareWork(group.slices, group.step, group.group_id, &s.prepared);
  }

  // The reducer leaves the sum over the nodes; the write-back into the regions divides it on the
  // way (the same float division, one pass less).
  Status Exchange(Group& group, Scratch& scratch, uint32_t* tag) override {
    auto& s = static_cast<Selection&>(scratch);
    std::span<float> sum(s.prepared.work);  // the allgather exchange decodes over its input
    if (!group.reducer->DecodesIntoWork()) {
      if (s.fusion.size() < group.elements) SizeScratch(&s.fusion, group.elements);
      sum = std::span<float>(s.fusion.data(), group.elements);
    }
    SPARSYNC_RETURN_IF_ERROR(
        group.reducer->Exchange(group.slices, s.prepared, sum, /*divisor=*/1.0, tag));
    WriteBackMembers(group, reinterpret_cast<const char*>(sum.data()), group.divisor);
    group.marks.Add("write-back");
    return Status::Ok();
  }

  void Deliver(const GroupMember& member, Group&, Scratch&) override { DeliverFromHost(member); }

 private:
  struct Selection : Scratch {
    std::vector<float> fusion;  // the decoded sum over the nodes, when not prepared.work
    PreparedGroup prepared;
  };
};

}  // namespace

std::unique_ptr<ReducePath> MakeHostSparsePath() { return std::make_unique<HostSparsePath>(); }

}  // namespace sparsync::pipeline
