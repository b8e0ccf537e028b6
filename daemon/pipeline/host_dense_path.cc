#include <cstring>
#include <vector>

#include "daemon/pipeline/delivery.h"
#include "daemon/pipeline/dense_math.h"
#include "daemon/pipeline/host_paths.h"
#include "daemon/pipeline/host_sum.h"

namespace sparsync::pipeline {
namespace {

// A member this large whose node sum is one region in its own accumulator type is allreduced in
// that region: copying it into the fusion buffer and back would cost more than its own call's
// start-up. Smaller members are packed side by side and reduced with one call.
constexpr size_t kOwnRegionBytes = size_t{1} << 20;

// Every node must make the same calls, so the choice may not depend on how many of a node's
// workers take part (hvd.join() leaves some out; a node whose workers all joined has no part and
// sends zeros). A process set's tensor, whose parts differ from node to node, is always packed.
// The node's single input: one worker per node, or the node's sum formed on its GPUs.
bool ReducedInItsRegion(const GroupMember& m, int local_size) {
  const bool one_input = local_size == 1 || m.sum != NodeSum::kRegions;
  return m.meta.members.empty() && one_input && AccumulatesInPlace(m.meta.dtype) &&
         m.meta.Bytes() >= kOwnRegionBytes;
}

// Any dense reduction: large members in their own regions, the rest packed into the slot's
// buffer and reduced with one allreduce.
class HostDensePath final : public ReducePath {
 public:
  HostDensePath(World world, transport::Transport* transport)
      : ReducePath("host dense"), local_size_(world.local_size), transport_(transport) {}

  bool Takes(const Group& group) const override {
    return Reduces(group.op) && group.reducer == nullptr;
  }

  std::unique_ptr<Scratch> NewScratch() const override { return std::make_unique<Fusion>(); }

  Status Prepare(Group& group, Scratch& scratch, bool*) override {
    auto& f = static_cast<Fusion&>(scratch);
    SPARSYNC_RETURN_IF_ERROR(StageToHost(group));
    f.packed.clear();
    f.own.clear();
    size_t packed_elements = 0;
    for (size_t i = 0; i < group.members.size(); ++i) {
      if (ReducedInItsRegion(group.members[i], local_size_)) {
        f.own.push_back(i);
      } else {
        f.packed.push_back({i, packed_elements});
        packed_elements += group.slices[i].count;
      }
    }
    for (size_t i : f.own) {
      if (group.members[i].parts.empty()) continue;  // zeros (Exchange)
      SPARSYNC_RETURN_IF_ERROR(
          FlushResidual(group, i, static_cast<float*>(group.members[i].parts[0].region->data())));
    }
    if (f.packed.empty()) return Status::Ok();
    const DType dtype = group.members.front().meta.dtype;
    const size_t acc_size = transport::ElementSize(AccumulatorType(dtype));
    f.elements = packed_elements;
    if (f.buffer.size() < packed_elements * acc_size) {
      SizeScratch(&f.buffer, packed_elements * acc_size);
    }
    std::vector<const void*> inputs;
    for (const auto& [i, offset] : f.packed) {
      const GroupMember& m = group.members[i];
      inputs.clear();
      // Parts summed on the node's GPUs arrive as one input.
      for (size_t r = 0; r < m.num_inputs(); ++r) inputs.push_back(m.parts[r].region->data());
      if (inputs.empty()) {  // no member here: this node adds zeros
        std::memset(f.buffer.data() + offset * acc_size, 0, group.slices[i].count * acc_size);
      }
      SumInto(f.buffer.data() + offset * acc_size, inputs, group.slices[i].count, dtype);
      if (group.residuals) {  // float32: the only dtype that is compressed
        SPARSYNC_RETURN_IF_ERROR(
            FlushResidual(group, i, reinterpret_cast<float*>(f.buffer.data() + offset * acc_size)));
      }
    }
    group.marks.Add("local reduce");
    return Status::Ok();
  }

  Status Exchange(Group& group, Scratch& scratch, uint32_t* tag) override {
    auto& f = static_cast<Fusion&>(scratch);
    const DType dtype = group.members.front().meta.dtype;
    const transport::ElementType acc_type = AccumulatorType(dtype);
    if (!f.packed.empty()) {
      SPARSYNC_RETURN_IF_ERROR(
          transport_->AllReduceSum(f.buffer.data(), f.elements, acc_type, (*tag)++));
      group.marks.Add("transfer");
      const size_t acc_size = transport::ElementSize(acc_type);
      for (const auto& [i, offset] : f.packed) {
        const GroupMember& m = group.members[i];
        for (size_t r = 0; r < m.num_inputs(); ++r) {
          WriteBack(f.buffer.data() + offset * acc_size, group.slices[i].count, group.divisor,
                    m.parts[r].region->data(), dtype);
        }
      }
      group.marks.Add("write-back");
    }
    for (size_t i : f.own) {
      const GroupMember& m = group.members[i];
      const size_t count = group.slices[i].count;
      if (m.parts.empty()) {  // no worker here takes part: zeros, and nothing to write back
        const size_t bytes = count * transport::ElementSize(acc_type);
        f.zeros.assign(bytes, 0);
        SPARSYNC_RETURN_IF_ERROR(transport_->AllReduceSum(f.zeros.data(), count, acc_type, (*tag)++));
        group.marks.Add("transfer");
        continue;
      }
      void* data = m.parts[0].region->data();
      SPARSYNC_RETURN_IF_ERROR(transport_->AllReduceSum(data, count, acc_type, (*tag)++));
      group.marks.Add("transfer");
      DivideInPlace(data, count, group.divisor, dtype);
      group.marks.Add("write-back");
    }
    return Status::Ok();
  }

  void Deliver(const GroupMember& member, Group&, Scratch&) override { DeliverFromHost(member); }

 private:
  struct Fusion : Scratch {
    std::vector<char> buffer;  // the packed members' local sum, then their result
    size_t elements = 0;       // of the packed members
    std::vector<std::pair<size_t, size_t>> packed;  // (member, element offset in buffer)
    std::vector<size_t> own;                        // members reduced in their own region
    std::vector<char> zeros;  // an own member's contribution from a node where none takes part
  };
  const int local_size_;
  transport::Transport* const transport_;
};

}  // namespace

std::unique_ptr<ReducePath> MakeHostDensePath(World world, transport::Transport* transport) {
  return std::make_unique<HostDensePath>(world, transport);
}

}  // namespace sparsync::pipeline
