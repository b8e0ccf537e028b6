// The host paths' common steps: bring a group's node sum to the host, sum the local workers'
// regions into one accumulator buffer, and write a result back into the regions.
#pragma once

#include <vector>

#include "daemon/pipeline/reduce_path.h"

namespace sparsync::pipeline {

// Copies the node's sum of every member left on the device (NodeSum::kDeviceZero) to parts[0]'s
// region, as the staging thread would have. Blocks for the copies.
Status StageToHost(Group& group);

// The members' local sums side by side in `acc`, in the accumulator type of the group's dtype
// (dense_math.h). REQUIRES: `acc` holds group.elements accumulator elements.
void SumMembersInto(const Group& group, void* acc);
// SumMembersInto `fusion`, which grows as needed (SizeScratch) and keeps its capacity.
void SumMembers(const Group& group, std::vector<char>* fusion);

// malloc_trim(0): the pages of freed heap blocks back to the kernel (nothing under ASan and
// TSan, whose allocators hold no glibc heap).
void ReturnFreedMemory();

// Sizes a group's scratch buffer to `n` elements; what it held before is not kept. A buffer that
// must grow frees its old block first and hands the freed pages back to the kernel: glibc keeps
// freed blocks below its (rising) mmap threshold resident, so a slot's buffer growing group by
// group over the first step would otherwise leave each earlier size in the daemon's resident set
// (bench/daemon_memory.py). Growth happens a few times per job, so the trim costs nothing later.
template <typename T>
void SizeScratch(std::vector<T>* buffer, size_t n) {
  if (buffer->capacity() < n) {
    std::vector<T>().swap(*buffer);
    ReturnFreedMemory();
  }
  buffer->resize(n);
}

// A dense exchange of a compressing job's group carries what its tensors' residuals hold (the
// gradient that top-k held back and has not sent yet): adds member `i`'s residual into
// `local_sum` (its float32 local sum, the member's slice) and clears the residual, so that none
// of it is lost and none sent twice. Nothing when the group has no residuals (Group::residuals).
Status FlushResidual(const Group& group, size_t i, float* local_sum);

// Writes `acc` (the group in the accumulator type) divided by `divisor` into every member's input
// regions (GroupMember::num_inputs()), converted to the member's dtype.
void WriteBackMembers(const Group& group, const char* acc, double divisor);

}  // namespace sparsync::pipeline
