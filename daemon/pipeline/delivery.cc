#include "daemon/pipeline/delivery.h"

#include <spdlog/spdlog.h>

#include "daemon/intake/done.h"

namespace sparsync::pipeline {
namespace {

void Done(const WorkerPart& part, const Status& st, int fd = -1, uint64_t bytes = 0,
          int64_t dim0 = 0) {
  (void)intake::SendDone(*part.session, part.tensor_id, part.round, st, fd, bytes, dim0);
}

// DONE for every part, with the status of getting the result onto the GPUs.
void DoneAfter(const GroupMember& member, const Status& st) {
  if (!st.ok()) spdlog::error("{}", st.message());
  for (const WorkerPart& part : member.parts) Done(part, st);
}

std::vector<device::CudaTensor*> CudaParts(const GroupMember& member) {
  std::vector<device::CudaTensor*> cuda;
  for (const WorkerPart& part : member.parts) cuda.push_back(part.cuda.get());
  return cuda;
}

}  // namespace

void DeliverFromHost(const GroupMember& member) {
  if (member.clique) {
    return DoneAfter(member,
                     member.clique->BroadcastFromHost(CudaParts(member), member.meta.dtype));
  }
  for (const WorkerPart& part : member.parts) {
    // A CUDA tensor's result goes from its staging to the worker's buffer first.
    Status st = part.cuda ? part.cuda->CopyToDevice() : Status::Ok();
    if (!st.ok()) spdlog::error("{}", st.message());
    Done(part, st);
  }
}

void DeliverFromDevice(const GroupMember& member) {
  if (member.clique) {
    return DoneAfter(member,
                     member.clique->BroadcastFromDevice(CudaParts(member), member.meta.dtype));
  }
  // One part: the result is in its buffer already; the done event orders the worker after it.
  device::CudaTensor& t = *member.parts[0].cuda;
  Status st = t.Check(t.rt().SetDevice(t.device()), "cudaSetDevice");
  if (st.ok()) st = t.EnqueueRecordDone();
  DoneAfter(member, st);
}

void DeliverGathered(const GroupMember& member, const intake::SharedRegion& gathered) {
  int64_t dim0 = 0;
  for (int64_t d : member.scheduled.worker_dim0) dim0 += d;
  for (const WorkerPart& part : member.parts) {
    Done(part, Status::Ok(), gathered.fd(), gathered.size(), dim0);
  }
}

}  // namespace sparsync::pipeline
