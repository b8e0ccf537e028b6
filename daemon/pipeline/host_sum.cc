#include "daemon/pipeline/host_sum.h"

#include <malloc.h>

#include <cstring>

#include "daemon/pipeline/dense_math.h"

namespace sparsync::pipeline {

Status StageToHost(Group& group) {
  for (GroupMember& m : group.members) {
    if (m.sum != NodeSum::kDeviceZero) continue;
    m.sum = m.clique ? NodeSum::kRegionZero : NodeSum::kRegions;
    SPARSYNC_RETURN_IF_ERROR(m.parts[0].cuda->CopyToHost());
  }
  return Status::Ok();
}

Status FlushResidual(const Group& group, size_t i, float* local_sum) {
  if (!group.residuals) return Status::Ok();
  const GroupSlice& slice = group.slices[i];
  const GroupSlice own{slice.name, 0, slice.count};
  SPARSYNC_RETURN_IF_ERROR(
      group.residuals->AddTo(TensorState::Kind::kResidual, {&own, 1}, {local_sum, slice.count}));
  group.residuals->Take(TensorState::Kind::kResidual, *slice.name);  // now on the host
  return Status::Ok();
}

void SumMembers(const Group& group, std::vector<char>* fusion) {
  const size_t acc_size =
      transport::ElementSize(AccumulatorType(group.members.front().meta.dtype));
  if (fusion->size() < group.elements * acc_size) SizeScratch(fusion, group.elements * acc_size);
  SumMembersInto(group, fusion->data());
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SPARSYNC_SANITIZER_ALLOCATOR 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SPARSYNC_SANITIZER_ALLOCATOR 1
#endif
#endif

void ReturnFreedMemory() {
#ifndef SPARSYNC_SANITIZER_ALLOCATOR
  malloc_trim(0);
#endif
  // Under ASan and TSan malloc and free are the sanitizer's: glibc's heap holds none of the
  // daemon's blocks, so there is nothing to trim. Calling it there was also a hazard: glibc's
  // malloc, never used before, initialises itself on the first malloc_trim without a lock, and
  // two exchange threads of a multi-node test that trimmed first at the same moment both took
  // the main arena without counting it; the second to exit aborted on glibc's assertion
  // "a->attached_threads > 0" (one CI run of daemon_test under ASan, 2026-12-07). In a plain
  // build glibc's malloc is initialised by the daemon's first allocation, on its main thread.
}

void SumMembersInto(const Group& group, void* acc) {
  const DType dtype = group.members.front().meta.dtype;
  const size_t acc_size = transport::ElementSize(AccumulatorType(dtype));
  std::vector<const void*> inputs;
  for (size_t i = 0; i < group.members.size(); ++i) {
    const GroupMember& m = group.members[i];
    inputs.clear();
    // Parts summed on the node's GPUs arrive as one input.
    for (size_t r = 0; r < m.num_inputs(); ++r) inputs.push_back(m.parts[r].region->data());
    char* out = static_cast<char*>(acc) + group.slices[i].offset * acc_size;
    // No worker of this node takes part (joined, or outside the process set): it adds zeros.
    if (inputs.empty()) std::memset(out, 0, group.slices[i].count * acc_size);
    SumInto(out, inputs, group.slices[i].count, dtype);
  }
}

void WriteBackMembers(const Group& group, const char* acc, double divisor) {
  const DType dtype = group.members.front().meta.dtype;
  const size_t acc_size = transport::ElementSize(AccumulatorType(dtype));
  for (size_t i = 0; i < group.members.size(); ++i) {
    const GroupMember& m = group.members[i];
    for (size_t r = 0; r < m.num_inputs(); ++r) {
      WriteBack(acc + group.slices[i].offset * acc_size, group.slices[i].count, divisor,
                m.parts[r].region->data(), dtype);
    }
  }
}

}  // namespace sparsync::pipeline
