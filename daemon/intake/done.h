// SendDone: the intake protocol's DONE message (proto/intake/wire.h), the one answer a worker
// waits for after READY.
#pragma once

#include <cstdint>

#include "daemon/common/status.h"
#include "daemon/intake/session.h"

namespace sparsync::intake {

// DONE of `round` of `tensor_id` with `status` (its message travels along when not OK). For an
// allgather, `result_fd` (a memfd of `result_bytes`) travels with it and `result_dim0` is the
// result's first dimension.
Status SendDone(WorkerSession& session, uint32_t tensor_id, uint64_t round, const Status& status,
                int result_fd = -1, uint64_t result_bytes = 0, int64_t result_dim0 = 0);

}  // namespace sparsync::intake
