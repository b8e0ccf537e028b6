// TensorTable: the node's registry of the tensors its workers registered, and of their rounds. A
// tensor's round is "locally ready" once every local worker has posted it; the worker handler
// (intake/worker_handler.h) then forms the node's sum where needed and reports it. The executor
// resolves schedule entries against the table and ends their rounds.
//
// The table knows nothing of the intake protocol's messages: the worker handler turns HELLO,
// REGISTER, READY, UNREGISTER and disconnects into the calls below and answers the workers.
//
// Thread-safety: every method locks one mutex and none blocks. Post reads the node's JobFailure
// under that mutex, so a round is either refused at once or answered by FailPending later: a
// posted round is never lost.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "daemon/common/job_failure.h"
#include "daemon/device/cuda_tensor.h"
#include "daemon/device/device_clique.h"
#include "daemon/intake/session.h"
#include "daemon/intake/shared_region.h"
#include "daemon/negotiation/types.h"

namespace sparsync::pipeline {

struct World {
  int node_rank = 0;
  int num_nodes = 1;
  int local_size = 1;
  int size() const { return num_nodes * local_size; }
  int GlobalRank(int local_rank) const { return node_rank * local_size + local_rank; }
};

// One local worker's part of a tensor in a group being executed.
struct WorkerPart {
  std::shared_ptr<intake::WorkerSession> session;
  uint32_t tensor_id = 0;
  uint64_t round = 0;
  std::shared_ptr<intake::SharedRegion> region;  // the data; for a CUDA tensor its host staging
  int64_t dim0 = 0;
  std::shared_ptr<device::CudaTensor> cuda;  // memory CUDA: the worker's device buffer, else null
};

// Where a locally ready round's contribution of this node is.
enum class NodeSum {
  kRegions,     // every part's region holds its worker's input (host tensors, or CUDA tensors
                // copied to their staging)
  kRegionZero,  // summed on the node's GPUs (GroupMember::clique): parts[0]'s region holds it
  kDeviceZero,  // in parts[0]'s device buffer: summed on the node's GPUs there, or the only part
};

// A tensor of a group being executed, with its local parts in local-rank order.
struct GroupMember {
  TensorMeta meta;
  negotiation::GroupTensor scheduled;
  std::vector<WorkerPart> parts;
  uint64_t generation = 0;  // the table's round generation, to detect a failure in between
  int64_t ready_ns = 0;     // steady clock when every local worker had posted this round
  NodeSum sum = NodeSum::kRegions;
  // Non-null: the parts were summed on the node's GPUs (device/device_clique.h), and the result
  // goes back to every GPU through it.
  std::shared_ptr<device::DeviceClique> clique;

  // The regions holding this node's contribution: every part's, or parts[0]'s alone.
  size_t num_inputs() const { return sum == NodeSum::kRegions ? parts.size() : 1; }
};

// A round that became locally ready: what to report, and the parts whose node sum is still to
// be formed on the GPUs (empty for host tensors).
struct ReadyRound {
  negotiation::ReadyTensor report;
  uint64_t generation = 0;
  std::vector<WorkerPart> cuda_parts;
};

class TensorTable {
 public:
  // `failure` outlives the table.
  TensorTable(World world, const JobFailure* failure);

  // Registers `meta` for `session`'s `tensor_id` with its region (and CUDA buffer). Fails with
  // kInvalidArgument for a duplicate registration, and with kMismatch when another local worker
  // registered the name differently: the node's workers disagree and the job cannot go on.
  Status Register(const std::shared_ptr<intake::WorkerSession>& session, uint32_t tensor_id,
                  const TensorMeta& meta, std::shared_ptr<intake::SharedRegion> region,
                  std::shared_ptr<device::CudaTensor> cuda);

  // What a READY did: the part to refuse with the job's failure, or the round now locally ready.
  struct Posted {
    std::optional<WorkerPart> refused;
    std::optional<ReadyRound> ready;
  };
  // A worker posted `round` of `tensor_id`. A non-OK status is a protocol violation.
  Result<Posted> Post(const std::shared_ptr<intake::WorkerSession>& session, uint32_t tensor_id,
                      uint64_t round);
  // Sets where round `generation` of `name` has its node sum, once the GPUs formed it. False
  // when the round was failed meanwhile (every worker has its DONE then).
  bool SetNodeSum(const std::string& name, uint64_t generation, NodeSum sum,
                  std::shared_ptr<device::DeviceClique> clique);

  Status Unregister(const std::shared_ptr<intake::WorkerSession>& session, uint32_t tensor_id);
  // A worker's connection is gone: its parts go. Says whether it had registered or posted any.
  struct Departure {
    bool had_tensors = false;
    bool had_posted = false;
  };
  Departure Leave(const std::shared_ptr<intake::WorkerSession>& session);

  // The names of the tensors no worker holds any more (every worker unregistered it or left)
  // since the last call. What the reducers keep for them must go before that name's next group:
  // a training run started again on the same daemons must not inherit the last run's residuals.
  std::vector<std::string> TakeReleased();

  // The members of a schedule entry, by the names the negotiation agent filled in. A process
  // set's tensor with no member on this node resolves to a member with no parts: the node takes
  // part in the exchange with nothing of its own.
  Result<std::vector<GroupMember>> Resolve(const negotiation::ScheduleEntry& entry);
  // Ends the round of `members`: resets their readiness so workers may post again. Returns the
  // members whose round was still current (the ones to answer; others were failed meanwhile).
  std::vector<const GroupMember*> Finish(const std::vector<GroupMember>& members);
  // Ends every posted round because the job failed, returning the parts that await a DONE.
  std::vector<WorkerPart> FailPending();

  // hvd.join(): the worker of `local_rank` is out of data. Until EndJoin it takes part in no
  // round (a round needs the other local workers' posts only; it adds nothing), and may not
  // post. Returns the rounds that became locally ready by it.
  std::vector<ReadyRound> Join(int local_rank);
  // Every worker of the job has joined (the schedule's join entry): all take part again.
  void EndJoin();

 private:
  struct Tensor {
    TensorMeta meta;  // shape of the first registrant (ALLGATHER: dim0 may differ)
    std::vector<std::unique_ptr<WorkerPart>> parts;  // by local rank; null: not registered
    std::vector<bool> posted;
    int posted_count = 0;
    bool in_flight = false;  // reported; waiting for the schedule or executing
    int64_t ready_ns = 0;    // steady clock when the round became locally ready
    uint64_t generation = 0;
    NodeSum sum = NodeSum::kRegions;                // this round's
    std::shared_ptr<device::DeviceClique> clique;  // this round's parts were summed with it
  };

  void EraseIfUnused(std::map<std::string, Tensor>::iterator it);  // REQUIRES: mu_ held
  // Every worker that takes part has posted (or joined), one at least: the round is ready.
  bool LocallyComplete(const Tensor& t) const;                    // REQUIRES: mu_ held
  ReadyRound MakeReady(Tensor& t);                                // REQUIRES: mu_ held
  bool NoneTakesPart(const TensorMeta& meta) const;               // REQUIRES: mu_ held
  int GlobalRank(int local_rank) const { return world_.GlobalRank(local_rank); }
  Status CheckCompatible(const Tensor& t, const TensorMeta& meta, int local_rank) const;

  const World world_;
  const JobFailure* const failure_;
  mutable std::mutex mu_;
  std::map<std::string, Tensor> tensors_;
  std::vector<std::string> released_;  // TakeReleased()'s
  std::vector<bool> joined_;            // by local rank: inside hvd.join()
};

}  // namespace sparsync::pipeline
