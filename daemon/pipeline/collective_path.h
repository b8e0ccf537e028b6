// CollectivePath: what the two paths of the collectives that do not reduce (gather_path.cc,
// broadcast_path.cc) share: each takes the entries of one op, and works with the node's world
// and transport.
#pragma once

#include "daemon/pipeline/reduce_path.h"
#include "daemon/transport/transport.h"

namespace sparsync::pipeline {

class CollectivePath : public ReducePath {
 public:
  CollectivePath(const char* name, CollectiveOp op, World world, transport::Transport* transport)
      : ReducePath(name), op_(op), world_(world), transport_(transport) {}

  bool Takes(const Group& group) const override { return group.op == op_; }

  // Both collectives name one tensor per entry.
  Status Prepare(Group& group, Scratch&, bool*) override {
    if (group.members.size() == 1) return Status::Ok();
    return Internal(std::string("a ") + OpName(op_) + " entry names " +
                    std::to_string(group.members.size()) + " tensors");
  }

 protected:
  const CollectiveOp op_;
  const World world_;
  transport::Transport* const transport_;
};

}  // namespace sparsync::pipeline
