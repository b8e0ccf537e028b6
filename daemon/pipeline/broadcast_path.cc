#include <cstring>

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

  Status Exchange(Group& group, Scratch&, uint32_t* tag) override {
    const GroupMember& member = group.members.front();
    const int root_node = member.meta.root_rank / world_.local_size;
    const int root_local = member.meta.root_rank % world_.local_size;
    const size_t bytes = member.meta.Bytes();
    const int source = world_.node_rank == root_node ? root_local : 0;
    void* buffer = member.parts[source].region->data();
    SPARSYNC_RETURN_IF_ERROR(transport_->Broadcast(buffer, bytes, root_node, (*tag)++));
    for (int r = 0; r < world_.local_size; ++r) {
      if (r != source && bytes) std::memcpy(member.parts[r].region->data(), buffer, bytes);
    }
    return Status::Ok();
  }

  void Deliver(const GroupMember& member, Group&, Scratch&) override { DeliverFromHost(member); }
};

}  // namespace

std::unique_ptr<ReducePath> MakeBroadcastPath(World world, transport::Transport* transport) {
  return std::make_unique<BroadcastPath>("broadcast", CollectiveOp::kBroadcast, world, transport);
}

}  // namespace sparsync::pipeline
