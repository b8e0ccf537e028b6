#include "daemon/device/device_intake.h"

namespace sparsync::device {

DeviceIntake::DeviceIntake(DeviceIntakeOptions options)
    : staging_(std::move(options.cudart)),
      local_nccl_(std::move(options.libnccl), options.local_nccl),
      keep_on_device_(std::move(options.keep_on_device)) {}

Status DeviceIntake::LoadExplicitLibraries() { return local_nccl_.LoadExplicit(); }

Result<std::shared_ptr<CudaTensor>> DeviceIntake::Attach(
    const sparsync_register_msg& msg, std::shared_ptr<intake::SharedRegion> staging, size_t bytes,
    uint8_t (&done_event)[SPARSYNC_CUDA_IPC_HANDLE_BYTES]) {
  return staging_.Attach(msg, std::move(staging), bytes, done_event);
}

void DeviceIntake::FormNodeSum(const TensorMeta& meta,
                               std::vector<std::shared_ptr<CudaTensor>> parts, SummedFn done) {
  thread_.Post([this, meta, parts = std::move(parts), done = std::move(done)]() mutable {
    std::vector<CudaTensor*> raw;
    for (const auto& p : parts) raw.push_back(p.get());
    Status st;
    NodeSumOnDevice where = Sum(meta, raw, &st);
    // The table and the executor hold the parts from here on; a worker that left meanwhile has
    // its buffer closed as soon as they let go.
    raw.clear();
    parts.clear();
    done(st, std::move(where));
  });
}

NodeSumOnDevice DeviceIntake::Sum(const TensorMeta& meta, std::span<CudaTensor* const> parts,
                                  Status* st) {
  NodeSumOnDevice where;
  if (Reduces(meta.op) && SummedOnDevice(meta.dtype)) where.clique = local_nccl_.CliqueFor(parts);
  // A sum a device path may reduce stays there: summed into local rank 0's buffer (with several
  // GPUs) or left in the worker's (with one).
  bool keep = Reduces(meta.op) && meta.dtype == DType::kFloat32 &&
              (where.clique || parts.size() == 1) && keep_on_device_ && keep_on_device_(meta);
  for (CudaTensor* c : parts) keep = keep && c != nullptr;
  where.on_device = keep;
  if (keep) {
    if (where.clique) *st = where.clique->ReduceOnDevice(parts, meta.dtype);
  } else if (where.clique) {
    *st = where.clique->ReduceToHost(parts, meta.dtype);
  } else {
    // Every copy is queued before the first wait, so that copies on different devices overlap.
    for (CudaTensor* c : parts) {
      if (c && st->ok()) *st = c->EnqueueCopyToHost();
    }
    for (CudaTensor* c : parts) {
      if (c) {
        Status synced = c->Synchronize();
        if (st->ok()) *st = synced;
      }
    }
  }
  return where;
}

}  // namespace sparsync::device
