#include "daemon/intake/done.h"

#include "daemon/intake/codec.h"

namespace sparsync::intake {

Status SendDone(WorkerSession& session, uint32_t tensor_id, uint64_t round, const Status& status,
                int result_fd, uint64_t result_bytes, int64_t result_dim0) {
  sparsync_done done{};
  FillHeader(&done.header, SPARSYNC_MSG_DONE, sizeof(done));
  done.tensor_id = tensor_id;
  done.round = round;
  done.status = WireStatus(status);
  done.result_bytes = result_bytes;
  done.result_dim0 = result_dim0;
  if (!status.ok()) CopyMessage(done.message, status.message());
  return session.Send(&done, sizeof(done), result_fd);
}

}  // namespace sparsync::intake
