#include <algorithm>
#include <cstring>
#include <vector>

#include "daemon/pipeline/collective_path.h"
#include "daemon/pipeline/delivery.h"
#include "daemon/pipeline/host_paths.h"

namespace sparsync::pipeline {
namespace {

// A broadcast: the root worker's region to every node (the transport's broadcast from the root's
// node), then to every local worker's region. All in stage B; CUDA tensors were staged to the
// host at local readiness and go back from there.
class BroadcastPath final : public CollectivePath {
 public:
  using CollectivePath::CollectivePath;

  std::unique_ptr<Scratch> NewScratch() const override { return std::make_unique<Received>(); }

  Status Exchange(Group& group, Scratch& scratch, uint32_t* tag) override {
    const GroupMember& member = group.members.front();
    const int root_node = member.meta.root_rank / world_.local_size;
    const int root_local = member.meta.root_rank % world_.local_size;
    const size_t bytes = member.meta.Bytes();
    // The parts are the local workers that take part (all, or a process set's), in local-rank
    // order; the root's node sends from the root's part.
    size_t source = 0;
    for (size_t i = 0; world_.node_rank == root_node && i < member.parts.size(); ++i) {
      if (static_cast<int>(member.parts[i].session->local_rank) == root_local) source = i;
    }
    void* buffer = nullptr;
    if (member.parts.empty()) {  // no member of the process set here: receive and drop
      auto& received = static_cast<Received&>(scratch).bytes;
      received.resize(std::max<size_t>(bytes, 1));
      buffer = received.data();
    } else {
      buffer = member.parts[source].region->data();
    }
    SPARSYNC_RETURN_IF_ERROR(transport_->Broadcast(buffer, bytes, root_node, (*tag)++));
    for (size_t i = 0; i < member.parts.size(); ++i) {
      if (i != source && bytes) std::memcpy(member.parts[i].region->data(), buffer, bytes);
    }
    return Status::Ok();
  }

  void Deliver(const GroupMember& member, Group&, Scratch&) override { DeliverFromHost(member); }

 private:
  struct Received : Scratch {
    std::vector<char> bytes;
  };
};

}  // namespace

std::unique_ptr<ReducePath> MakeBroadcastPath(World world, transport::Transport* transport) {
  return std::make_unique<BroadcastPath>("broadcast", CollectiveOp::kBroadcast, world, transport);
}

}  // namespace sparsync::pipeline
