// The host paths of a dense reduction (allreduce, and gradients that go uncompressed):
//
//   InPlacePath     one tensor of one worker whose dtype is its own accumulator: the transport
//                   reduces the worker's region itself, with no staging copy.
//   HostDensePath   anything else: the local workers' regions summed side by side into the
//                   slot's buffer (in float32 for the 16-bit floats), allreduced, divided, and
//                   written back into every region.
//
// A node sum left on a GPU comes to the host first (host_sum.h). Results go back with
// DeliverFromHost.
#pragma once

#include "daemon/pipeline/reduce_path.h"
#include "daemon/transport/transport.h"

namespace sparsync::pipeline {

class InPlacePath : public ReducePath {
 public:
  InPlacePath(World world, transport::Transport* transport)
      : world_(world), transport_(transport) {}
  const char* name() const override { return "in place"; }
  bool Takes(const Group& group) const override;
  std::unique_ptr<Scratch> NewScratch() const override { return std::make_unique<Scratch>(); }
  Status Prepare(Group& group, Scratch& scratch, bool* declined) override;
  Status Exchange(Group& group, Scratch& scratch, uint32_t* tag) override;
  void Deliver(const GroupMember& member, Group& group, Scratch& scratch) override;

 private:
  const World world_;
  transport::Transport* const transport_;
};

class HostDensePath : public ReducePath {
 public:
  explicit HostDensePath(transport::Transport* transport) : transport_(transport) {}
  const char* name() const override { return "host dense"; }
  bool Takes(const Group& group) const override;
  std::unique_ptr<Scratch> NewScratch() const override;
  Status Prepare(Group& group, Scratch& scratch, bool* declined) override;
  Status Exchange(Group& group, Scratch& scratch, uint32_t* tag) override;
  void Deliver(const GroupMember& member, Group& group, Scratch& scratch) override;

 private:
  transport::Transport* const transport_;
};

}  // namespace sparsync::pipeline
