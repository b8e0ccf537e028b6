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
#include "daemon/intake/local_nccl.h"
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
  // Non-null: the parts were summed on the node's GPUs (intake/local_nccl.h), so the node's sum
  // is parts[0]'s region alone, and the result goes back through it (DeliverResult).
  std::shared_ptr<intake::DeviceClique> clique;
  // The node's sum was left on the device, in parts[0]'s buffer (CudaOptions::keep_on_device):
  // the executor sparsifies it there, or copies it to parts[0]'s region first (StageToHost).
  bool on_device = false;
  // Set by the executor: the result is in parts[0]'s buffer, not in the regions.
  bool result_on_device = false;

  // The regions holding this node's contribution: every part's, or parts[0]'s alone.
  size_t num_inputs() const { return clique ? 1 : parts.size(); }
};

// How the table takes CUDA tensors.
struct CudaOptions {
  std::string cudart;      // SPARSYNC_CUDART; empty: the default search
  bool local_nccl = true;  // SPARSYNC_LOCAL_REDUCE=auto
  std::string libnccl;     // SPARSYNC_LIBNCCL; empty: libnccl.so.2
  // Whether a float32 gradient or allreduce whose parts are all on GPUs may keep its node sum
  // there for the executor (the device path, device_sparse.h); called on the staging thread.
  // Null: never.
  std::function<bool(const negotiation::TensorMeta&)> keep_on_device;
};

class TensorTable : public intake::IntakeHandler {
 public:
  using ReportFn = std::function<void(ReadyNotice)>;
  using FailFn = std::function<void(const Status&)>;

  TensorTable(World world, std::string job_token, ReportFn report, FailFn fail,
              CudaOptions cuda = {});

  // Loads now what the options name explicitly (SPARSYNC_LIBNCCL), so that a wrong setting
  // stops the daemon at start.
  Status LoadExplicitLibraries();

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

  // The names of the tensors no worker holds any more (every worker unregistered it or left)
  // since the last call. What the reducers keep for them must go before that name's next group:
  // a training run started again on the same daemons must not inherit the last run's residuals.
  std::vector<std::string> TakeReleased();

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
    std::shared_ptr<intake::DeviceClique> clique;  // this round's parts were summed with it
    bool on_device = false;                        // this round's sum was left on the device
  };

  // A locally ready round with CUDA parts, staged on the staging thread before it is reported.
  struct Staging {
    std::string name;
    uint64_t generation = 0;
    std::vector<WorkerPart> parts;
    ReadyNotice notice;
  };

  void EraseIfUnused(std::map<std::string, Tensor>::iterator it);  // REQUIRES: mu_ held
  Status CheckCompatible(const Tensor& t, const negotiation::TensorMeta& meta, int local_rank) const;
  void FailLocked(const Status& error, std::vector<std::pair<WorkerPart, Status>>* to_send);
  void Fail(const Status& error, bool shutting_down);
  // On the staging thread: copies a locally ready round's CUDA parts to their host staging (or
  // sums them on the GPUs and copies the sum), then reports the round, unless it was failed
  // meanwhile. A CUDA error fails the job.
  void Stage(Staging staging);

  const World world_;
  const std::string job_token_;
  const ReportFn report_;
  const FailFn fail_;
  intake::CudaStaging cuda_;
  const std::function<bool(const negotiation::TensorMeta&)> keep_on_device_;

  mutable std::mutex mu_;
  std::condition_variable slot_bound_;
  std::map<std::string, Tensor> tensors_;
  std::map<uint32_t, std::string> name_by_slot_;
  std::vector<std::weak_ptr<intake::WorkerSession>> workers_;  // by local rank
  std::vector<std::string> released_;  // TakeReleased()'s
  Status fatal_;

  intake::LocalNccl local_nccl_;
  intake::StagingThread staging_;  // last: its jobs use everything above
};

// DONE for `part` with `status` (and, for allgather, the result description). For a CUDA tensor
// and an OK status the result is first copied to the device and the done event recorded (unless
// `to_device` is false: DeliverResult did that); if that fails, the DONE carries the CUDA error
// instead.
Status SendDone(const WorkerPart& part, const Status& status, int result_fd = -1,
                uint64_t result_bytes = 0, int64_t result_dim0 = 0, bool to_device = true);

// DONE for every part of a reduced `member` whose result is in its input regions
// (member.num_inputs() of them), or on the device (member.result_on_device): through the GPUs
// when the member was summed there.
void DeliverResult(const GroupMember& member);

// For a member whose node sum was left on the device (on_device): copies it to parts[0]'s region,
// as the staging thread would have, and clears on_device. Blocks for the copy.
Status StageToHost(GroupMember& member);

}  // namespace sparsync::pipeline
