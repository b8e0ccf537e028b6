// TensorRegistry: the tensors of one connection, by the ids this worker chose, and the
// registrations whose REGISTER_REPLY has not come yet. It applies REGISTER_REPLY and DONE to
// them and maps the memfd regions that come along (the tensor's buffer, an allgather's result).
//
// Thread-safety: none; the session calls it under its lock.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "proto/intake/wire.h"
#include "shims/client/cuda_buffer.h"
#include "shims/client/socket_io.h"
#include "shims/client/status.h"

namespace sparsync::client {

struct Tensor {
  std::string name;
  sparsync_op op = SPARSYNC_OP_ALLREDUCE;
  Mapping region;                // host tensors: the buffer the daemon reads and writes
  uint64_t posted = 0;           // last round posted
  uint64_t done = 0;             // last round whose DONE arrived
  int32_t status = SPARSYNC_OK;  // of round `done`
  std::string message;           // of round `done`, never empty when status is not OK
  Mapping result;                // ALLGATHER: the result of round `done`
  int64_t result_dim0 = 0;
  std::unique_ptr<CudaBuffer> cuda;  // CUDA tensors: the exported device buffer and its events

  bool in_flight() const { return done != posted; }
};

// A failure the daemon reported for the whole job (a DONE error of no round in flight). Every
// error DONE means the job failed: the daemon fails every collective with its first error.
struct JobError {
  int32_t status = SPARSYNC_OK;
  std::string message;
  bool failed() const { return status != SPARSYNC_OK; }
};

// What a registration does with the region descriptor of its REGISTER_REPLY.
enum class RegionUse {
  kMap,       // host tensors: the library maps the buffer
  kHandOver,  // host tensors whose caller maps the buffer (sparsync_register_tensor_fd)
  kDiscard,   // CUDA tensors: the daemon's staging region is not needed here
};

struct PendingRegistration {
  bool arrived = false;
  int32_t status = SPARSYNC_OK;
  std::string message;
  RegionUse use = RegionUse::kMap;
  Mapping region;         // kMap
  OwnedFd fd;             // kHandOver: the memfd, for the caller
  uint64_t fd_bytes = 0;  // kHandOver: its size
  uint8_t done_event[SPARSYNC_CUDA_IPC_HANDLE_BYTES] = {};
};

class TensorRegistry {
 public:
  TensorRegistry() = default;
  TensorRegistry(const TensorRegistry&) = delete;
  TensorRegistry& operator=(const TensorRegistry&) = delete;

  // Reserves a free id for a REGISTER about to be sent, whose reply's region is used as `use`
  // says. False when every id is in use.
  bool Reserve(RegionUse use, uint32_t* id);
  // Whether the reply of the registration reserved as `id` has arrived.
  bool Arrived(uint32_t id) const;
  // Ends the registration reserved as `id`, arrived or not; its mapping goes to the caller.
  PendingRegistration TakePending(uint32_t id);
  // Adds the tensor of a registration the daemon accepted.
  Tensor& Add(uint32_t id, Tensor tensor);
  // Null when `id` is not registered.
  Tensor* Find(uint32_t id);
  // Unmaps and forgets `id`; a DONE still in flight for it will be ignored.
  void Remove(uint32_t id);

  // Applies a REGISTER_REPLY and the descriptors that came with it. An error: the daemon broke
  // the protocol (the connection is unusable).
  Status OnRegisterReply(const sparsync_register_reply& m, ReceivedFds* fds);
  // Applies a DONE and its descriptors. A failure sets *job_error (the job failed), also when it
  // belongs to no round in flight. An error: the daemon broke the protocol.
  Status OnDone(const sparsync_done& m, ReceivedFds* fds, JobError* job_error);

 private:
  uint32_t next_id_ = 0;
  std::unordered_map<uint32_t, Tensor> tensors_;
  std::unordered_map<uint32_t, PendingRegistration> pending_;
  std::unordered_set<uint32_t> retired_;  // unregistered with a round possibly in flight
};

}  // namespace sparsync::client
