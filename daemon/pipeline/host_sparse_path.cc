#include "daemon/pipeline/delivery.h"
#include "daemon/pipeline/host_paths.h"
#include "daemon/pipeline/host_sum.h"

namespace sparsync::pipeline {
namespace {

// A compressed gradient group on the host (docs/algorithms.md §6). Two ways, the same results
// bit for bit:
//  - In place, for float32 gradients when the reducer selects over pieces (top-k with error
//    feedback): stage A adds each tensor's local sum (its workers' regions, summed element by
//    element) into its residual and selects over the residuals; stage B exchanges, updates the
//    residuals where they are and decodes the average straight into the regions. No group-sized
//    buffer: the daemon holds the residuals and nothing else per element.
//  - Otherwise stage A sums the local workers' regions into the slot's float32 work buffer and
//    hands it to the group's SparseReducer (residual, non-finite check, selection, packing);
//    stage B runs the reducer's exchange, which leaves the decompressed sum in the buffer, and
//    writes it back into every region, divided on the way.
// Residuals a tensor left on a GPU join the host's (TensorState::AddTo, OpenResidual).
class HostSparsePath final : public ReducePath {
 public:
  HostSparsePath() : ReducePath("host sparse") {}

  bool Takes(const Group& group) const override { return group.reducer != nullptr; }

  std::unique_ptr<Scratch> NewScratch() const override { return std::make_unique<Selection>(); }

  Status Prepare(Group& group, Scratch& scratch, bool*) override {
    auto& s = static_cast<Selection&>(scratch);
    SPARSYNC_RETURN_IF_ERROR(StageToHost(group));
    s.prepared.marks = &group.marks;
    s.regions.resize(group.members.size());
    s.inputs.clear();
    if (InPlace(group)) {
      for (size_t i = 0; i < group.members.size(); ++i) {
        const GroupMember& m = group.members[i];
        s.regions[i].clear();
        for (size_t r = 0; r < m.num_inputs(); ++r) {
          s.regions[i].emplace_back(static_cast<float*>(m.parts[r].region->data()),
                                    group.slices[i].count);
        }
        s.inputs.push_back(s.regions[i]);
      }
      group.marks.Add("local reduce");  // nothing to do: the sum is formed with the residual
      return group.reducer->PrepareInPlace(group.slices, s.inputs, group.step, group.group_id,
                                           &s.prepared);
    }
    // The local sum goes straight into the reducer's work buffer (no staging copy of the group).
    SizeScratch(&s.prepared.work, group.elements);
    SumMembersInto(group, s.prepared.work.data());
    group.marks.Add("local reduce");
    return group.reducer->PrepareWork(group.slices, group.step, group.group_id, &s.prepared);
  }

  Status Exchange(Group& group, Scratch& scratch, uint32_t* tag) override {
    auto& s = static_cast<Selection&>(scratch);
    if (s.prepared.in_place) {
      SPARSYNC_RETURN_IF_ERROR(group.reducer->ExchangeInPlace(group.slices, s.prepared, s.inputs,
                                                              group.divisor, tag));
      group.marks.Add("write-back");  // the division, in the regions
      return Status::Ok();
    }
    // The reducer leaves the sum over the nodes; the write-back into the regions divides it on
    // the way (the same float division, one pass less).
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
    // In place: each member's input regions (its local workers'), which receive the result.
    std::vector<std::vector<std::span<float>>> regions;
    std::vector<LocalBuffers> inputs;  // regions[i], as the reducer takes them
    PreparedGroup prepared;
  };

  static bool InPlace(const Group& group) {
    if (!group.reducer->ReducesInPlace()) return false;
    for (const GroupMember& m : group.members) {
      if (m.meta.dtype != DType::kFloat32 || m.num_inputs() == 0) return false;
    }
    return true;
  }
};

}  // namespace

std::unique_ptr<ReducePath> MakeHostSparsePath() { return std::make_unique<HostSparsePath>(); }

}  // namespace sparsync::pipeline
