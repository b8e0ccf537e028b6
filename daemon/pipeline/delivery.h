// Delivery: how a reduce path hands a group member's result back to the node's workers: into
// each worker's memory (the host regions, or the GPUs: copied from the host staging, or
// broadcast from local rank 0's device buffer with the node's clique), then DONE. A CUDA error on
// the way becomes the DONE's status, so the worker hears it.
#pragma once

#include "daemon/intake/shared_region.h"
#include "daemon/pipeline/tensor_table.h"

namespace sparsync::pipeline {

// The result is in the member's input regions (member.num_inputs() of them): the workers' own
// regions for host tensors, the host staging of CUDA tensors.
void DeliverFromHost(const GroupMember& member);
// The result is in parts[0]'s device buffer, written on that device's intake stream.
void DeliverFromDevice(const GroupMember& member);
// An allgather's result: `gathered` travels to every worker with its first dimension.
void DeliverGathered(const GroupMember& member, const intake::SharedRegion& gathered);

}  // namespace sparsync::pipeline
