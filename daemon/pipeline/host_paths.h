// The host's reduce paths (reduce_path.h), one file each, in the order the executor offers them
// a group:
//
//   in_place_path.cc     a dense reduction of one tensor of one worker whose dtype is its own
//                        accumulator: the transport reduces the worker's region itself.
//   host_sparse_path.cc  a compressed gradient group: float32 top-k in place (the residuals
//                        take the regions' sum and select, the average is decoded into the
//                        regions); otherwise the local sum in float32 into the group's
//                        SparseReducer (residual, selection, packing, exchange, decoding), the
//                        average written back into the regions.
//   host_dense_path.cc   any other reduction: members of 1 MiB and more whose node sum is one
//                        region are allreduced in it; the rest are summed side by side (in
//                        float32 for the 16-bit floats), allreduced, divided, written back.
//   gather_path.cc       an allgather, into a fresh memfd region each worker receives.
//   broadcast_path.cc    a broadcast from the root worker's region to every worker's.
//
// A node sum left on a GPU comes to the host first (host_sum.h); results go back through the
// host (delivery.h). The device paths (daemon/device/) are offered a group before these.
#pragma once

#include <memory>
#include <vector>

#include "daemon/pipeline/reduce_path.h"
#include "daemon/transport/transport.h"

namespace sparsync::pipeline {

std::unique_ptr<ReducePath> MakeInPlacePath(World world, transport::Transport* transport);
std::unique_ptr<ReducePath> MakeHostSparsePath();
std::unique_ptr<ReducePath> MakeHostDensePath(World world, transport::Transport* transport);
std::unique_ptr<ReducePath> MakeGatherPath(World world, transport::Transport* transport);
std::unique_ptr<ReducePath> MakeBroadcastPath(World world, transport::Transport* transport);

// All of the above, in that order.
std::vector<std::unique_ptr<ReducePath>> HostPaths(World world, transport::Transport* transport);

}  // namespace sparsync::pipeline
