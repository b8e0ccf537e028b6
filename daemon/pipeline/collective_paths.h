// The paths of the two collectives that do not reduce: an allgather (every worker's tensor
// concatenated along dim 0 in global rank order, into a fresh memfd region that travels to each
// worker with its DONE) and a broadcast (the root worker's region to every node, then to every
// local worker's region). Both are all stage B; CUDA tensors were staged to the host at local
// readiness.
#pragma once

#include "daemon/pipeline/reduce_path.h"
#include "daemon/transport/transport.h"

namespace sparsync::pipeline {

class GatherPath : public ReducePath {
 public:
  GatherPath(World world, transport::Transport* transport)
      : world_(world), transport_(transport) {}
  const char* name() const override { return "allgather"; }
  bool Takes(const Group& group) const override {
    return group.op == CollectiveOp::kAllGather;
  }
  std::unique_ptr<Scratch> NewScratch() const override;
  Status Prepare(Group& group, Scratch& scratch, bool* declined) override;
  Status Exchange(Group& group, Scratch& scratch, uint32_t* tag) override;
  void Deliver(const GroupMember& member, Group& group, Scratch& scratch) override;

 private:
  const World world_;
  transport::Transport* const transport_;
};

class BroadcastPath : public ReducePath {
 public:
  BroadcastPath(World world, transport::Transport* transport)
      : world_(world), transport_(transport) {}
  const char* name() const override { return "broadcast"; }
  bool Takes(const Group& group) const override {
    return group.op == CollectiveOp::kBroadcast;
  }
  std::unique_ptr<Scratch> NewScratch() const override { return std::make_unique<Scratch>(); }
  Status Prepare(Group& group, Scratch& scratch, bool* declined) override;
  Status Exchange(Group& group, Scratch& scratch, uint32_t* tag) override;
  void Deliver(const GroupMember& member, Group& group, Scratch& scratch) override;

 private:
  const World world_;
  transport::Transport* const transport_;
};

}  // namespace sparsync::pipeline
