// HostSparsePath: a compressed gradient group on the host (docs/algorithms.md §6). Stage A sums
// the local workers' regions into the slot's float32 buffer and hands it to the group's
// SparseReducer (residual, non-finite check, selection, packing); stage B runs the reducer's
// exchange, which leaves the decompressed average in the buffer, and writes it back into every
// region. Residuals a tensor left on a GPU join the host's (TensorState::AddTo).
#pragma once

#include "daemon/pipeline/reduce_path.h"

namespace sparsync::pipeline {

class HostSparsePath : public ReducePath {
 public:
  const char* name() const override { return "host sparse"; }
  bool Takes(const Group& group) const override { return group.reducer != nullptr; }
  std::unique_ptr<Scratch> NewScratch() const override;
  Status Prepare(Group& group, Scratch& scratch, bool* declined) override;
  Status Exchange(Group& group, Scratch& scratch, uint32_t* tag) override;
  void Deliver(const GroupMember& member, Group& group, Scratch& scratch) override;
};

}  // namespace sparsync::pipeline
