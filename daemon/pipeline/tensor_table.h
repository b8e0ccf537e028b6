// TensorTable: the node's view of every tensor its workers registered (the intake handler).
// A tensor is "locally ready" once every local worker has posted the same round; it is then
// reported to the coordinator. The executor resolves schedule entries against the table and
// completes them; a fatal error fails everything pending, now and later (sticky).
//
// Thread-safety: all methods lock one mutex; no method blocks on I/O while holding it except the
// small control-socket sends of replies, which have a send timeout.
#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "daemon/intake/cuda_staging.h"
#include "daemon/intake/server.h"
#include "daemon/negotiation/types.h"

namespace sparsync::pipeline {

struct World {
  int node_rank = 0;
  int num_nodes = 1;
  int local_size = 1;
  int size() const { return num_nodes * local_size; }
};

// A tensor all local workers posted: what the node reports to the coordinator.
struct ReadyNotice {
  negotiation::TensorMeta meta;
  uint32_t slot = 0;                 // 0 until the coordinator assigned one
  std::vector<int64_t> worker_dim0;  // ALLGATHER: each local worker's first dimension
  int64_t ready_ns = 0;              // steady clock when the last local worker posted it
};

// One local worker's part of a tensor in a group being executed.
struct WorkerPart {
  std::shared_ptr<intake::WorkerSession> session;
  uint32_t tensor_id = 0;
  uint64_t round = 0;
  std::shared_ptr<intake::SharedRegion> region;  // the data; for a CUDA tensor its host staging
  int64_t dim0 = 0;
  std::shared_ptr<intake::CudaTensor> cuda;  // memory CUDA: the worker's device buffer, else null
};

// A tensor of a group being executed, with its local parts in local-rank order.
struct GroupMember {
  negotiation::TensorMeta meta;
  negotiation::GroupTensor scheduled;
  std::vector<WorkerPart> parts;
  uint64_t generation = 0;  // the table's round generation, to detect a fail-all in between
  int64_t ready_ns = 0;     // steady clock when every local worker had posted this round
};

class TensorTable : public intake::IntakeHandler {
 public:
  using ReportFn = std::function<void(ReadyNotice)>;
  using FailFn = std::function<void(const Status&)>;

  // `cudart`: the CUDA runtime for CUDA tensors (SPARSYNC_CUDART; empty: the default search).
  TensorTable(World world, std::string job_token, ReportFn report, FailFn fail,
              std::string cudart = {});

  // intake::IntakeHandler
  void OnHello(const std::shared_ptr<intake::WorkerSession>& session, const sparsync_hello& hello,
               sparsync_hello_reply* reply) override;
  void OnRegister(const std::shared_ptr<intake::WorkerSession>& session,
                  const sparsync_register_msg& msg, sparsync_register_reply* reply,
                  std::shared_ptr<intake::SharedRegion>* region) override;
  Status OnReady(const std::shared_ptr<intake::WorkerSession>& session,
                 const sparsync_ready& msg) override;
  Status OnUnregister(const std::shared_ptr<intake::WorkerSession>& session,
                      const sparsync_unregister_msg& msg) override;
  void OnDisconnect(const std::shared_ptr<intake::WorkerSession>& session,
                    const Status& reason) override;

  // The coordinator's slot for a tensor name (from the node's negotiation agent).
  void BindSlot(const std::string& name, uint32_t slot);

  // The members of a schedule entry. Waits up to `wait` for slots still being bound.
  Result<std::vector<GroupMember>> Resolve(const negotiation::ScheduleEntry& entry,
                                           std::chrono::milliseconds wait);
  // Ends the round of `members`: resets their readiness so workers may post again. Returns the
  // members whose round was still current (the ones to answer; others were failed meanwhile).
  std::vector<const GroupMember*> Finish(const std::vector<GroupMember>& members);
  // Fails the job on this node: every posted tensor gets a DONE with `error`, and so will every
  // later READY, HELLO and REGISTER. First error wins.
  void FailAll(const Status& error);
  // FailAll for a daemon that is stopping: logs only if collectives were still pending.
  void Shutdown(const Status& reason);
  Status fatal() const;

 private:
  struct Tensor {
    negotiation::TensorMeta meta;  // shape of the first registrant (ALLGATHER: dim0 may differ)
    uint32_t slot = 0;
    std::vector<std::unique_ptr<WorkerPart>> parts;  // by local rank; null: not registered
    std::vector<bool> posted;
    int posted_count = 0;
    bool in_flight = false;  // reported; waiting for the schedule or executing
    int64_t ready_ns = 0;    // steady clock when the round became locally ready
    uint64_t generation = 0;
  };

  void EraseIfUnused(std::map<std::string, Tensor>::iterator it);  // REQUIRES: mu_ held
  Status CheckCompatible(const Tensor& t, const negotiation::TensorMeta& meta, int local_rank) const;
  void FailLocked(const Status& error, std::vector<std::pair<WorkerPart, Status>>* to_send);
  void Fail(const Status& error, bool shutting_down);
  // READY of a CUDA tensor: copies its device buffer into the staging region. Takes the lock
  // only to look the part up; the copy runs without it.
  void StageFromDevice(const intake::WorkerSession& session, const sparsync_ready& msg);

  const World world_;
  const std::string job_token_;
  const ReportFn report_;
  const FailFn fail_;
  intake::CudaStaging cuda_;

  mutable std::mutex mu_;
  std::condition_variable slot_bound_;
  std::map<std::string, Tensor> tensors_;
  std::map<uint32_t, std::string> name_by_slot_;
  std::vector<std::weak_ptr<intake::WorkerSession>> workers_;  // by local rank
  Status fatal_;
};

// DONE for `part` with `status` (and, for allgather, the result description). For a CUDA tensor
// and an OK status the result is first copied to the device and the done event recorded; if that
// fails, the DONE carries the CUDA error instead.
Status SendDone(const WorkerPart& part, const Status& status, int result_fd = -1,
                uint64_t result_bytes = 0, int64_t result_dim0 = 0);

}  // namespace sparsync::pipeline
