// CoordinatorState: the negotiation state machine of node 0 (docs/architecture.md §2), free of gRPC and
// threads so that tests can step it. Not thread-safe: CoordinatorCore serialises calls.
//
// Protocol. Each node reports a tensor once all its local workers have posted it. The first
// report of a tensor from a node carries its metadata and is answered with a slot number; later
// rounds report only the slot, so the steady state costs a few integers per tensor, not a gather
// of names and shapes. A tensor reported by every node is "globally ready"; globally ready
// tensors are batched for up to `cycle` (explicit collectives are not held back), cut into fusion
// buckets and appended to one ordered schedule that every node executes in the same order.
// Name, op, dtype and shape are compared across nodes: a tensor name reported with two different
// signatures fails the job on every node with a message naming the tensor, both values and the
// nodes. So do a stall past `timeout`, a node that stops polling, a node that reports a failure
// and a node that leaves. Failures are sticky: the schedule then ends with one fatal entry.
#pragma once

#include <deque>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "daemon/negotiation/merge_scheduler.h"
#include "daemon/negotiation/types.h"

namespace sparsync::negotiation {

struct CoordinatorOptions {
  int num_nodes = 1;
  int local_size = 1;  // workers per node: global rank r is on node r / local_size
  uint64_t bucket_bytes = 64ull << 20;
  Clock::duration cycle = std::chrono::milliseconds(1);
  Clock::duration stall_warn = std::chrono::seconds(60);
  Clock::duration timeout = std::chrono::seconds(300);
  Clock::duration node_liveness = std::chrono::seconds(10);  // longest silence between polls
  // How long a rank's worker may be away (between hvd.shutdown() and hvd.init(), say) before a
  // tensor that needs it fails the job (CoordinatorState::Gone); at most `timeout` is used.
  Clock::duration gone_grace = std::chrono::seconds(5);
  MergeOptions merge;  // how gradient tensors are grouped (merge_scheduler.h)
};

// A ready tensor in a report: either a known slot or an index into the report's new tensors.
struct ReportedReady {
  std::optional<uint32_t> slot;
  std::optional<uint32_t> new_index;
  std::vector<int64_t> worker_dim0;
  int64_t ready_ns = 0;  // the node's steady clock when it became ready there (0: unknown)
};

class CoordinatorState {
 public:
  explicit CoordinatorState(CoordinatorOptions options);

  // Assigns slots to `new_tensors` (in order) and marks `ready` tensors ready on `node`.
  // Errors: INVALID_ARGUMENT for a malformed report (the report is ignored); ABORTED once the
  // job has failed.
  Result<std::vector<uint32_t>> Report(int node, const std::vector<TensorMeta>& new_tensors,
                                       const std::vector<ReportedReady>& ready,
                                       Clock::time_point now);

  // hvd.join(): global rank `rank` of `node` is out of data. Until every rank has joined it takes
  // part in nothing: a tensor no longer waits for a node whose members have all joined (the
  // entry carries the tensor's metadata for such nodes). The last join appends an entry that
  // names the last rank and ends the join. INVALID_ARGUMENT for a rank not on `node`, or one
  // already joined; ABORTED once the job has failed.
  Status Joined(int node, int rank, Clock::time_point now);
  // The worker of global rank `rank` of `node` left with nothing in flight (hvd.shutdown(), the
  // end of its script, or a crash before its first collective). Once it has been gone for the
  // grace period (CoordinatorOptions::gone_grace) a tensor that still needs the rank fails the
  // job, naming the tensor and the rank, rather than at SPARSYNC_TIMEOUT_S; so does a join it
  // can no longer complete. Back(): a worker of that rank connected again (hvd.init() after
  // shutdown(), within the grace period). Once every rank has gone the run is over and none
  // counts as gone (the daemons may serve the next run's workers, which connect in any order).
  // INVALID_ARGUMENT for a rank not on `node`; ABORTED once the job has failed.
  Status Gone(int node, int rank, Clock::time_point now);
  Status Back(int node, int rank);
  // Whether every piece of `news` from `node` would be accepted (a rank joined twice in
  // `news.joined` is one joined twice), changing nothing: a report's rank news is checked with
  // the rest of it before any of it is applied.
  Status CheckRanks(int node, const RankNews& news) const;

  // Fails the job (first failure wins). `node` < 0: the coordinator itself.
  void Fail(int node, const Status& error);
  // A node's daemon is shutting down: fails the job unless it already failed.
  void Leave(int node);
  // Where `node` joined from, to name it with its address in errors ("node 2 (10.0.0.3)").
  void SetAddress(int node, std::string address);
  // Records that `node` polled (liveness) and has received entries up to `after_seq`.
  void Polled(int node, uint64_t after_seq, Clock::time_point now);

  // Schedule entries with seq > after_seq, in order.
  std::vector<ScheduleEntry> EntriesAfter(uint64_t after_seq) const;
  uint64_t last_seq() const { return next_seq_ - 1; }
  bool failed() const { return !fatal_.ok(); }
  const Status& fatal() const { return fatal_; }

  // Flushes due batches into the schedule and checks stalls and liveness. Returns warning lines
  // to log (stalled tensors).
  std::vector<std::string> Tick(Clock::time_point now);
  // When Tick next has something to do, if ever.
  std::optional<Clock::time_point> NextDeadline() const;

  const TensorMeta* Meta(uint32_t slot) const;
  // The planner's cost model (measured at start-up by the daemon).
  void SetCostModel(const planning::CostModel& cost) { merge_.SetCostModel(cost); }
  void RecordGroupCost(uint64_t elements, bool sparse, double sparsify_s, double exchange_s) {
    merge_.RecordGroupCost(elements, sparse, sparsify_s, exchange_s);
  }
  const MergeScheduler& merge() const { return merge_; }
  // Informational lines for the log (plans made and dropped).
  std::vector<std::string> TakeLog() { return merge_.TakeLog(); }
  size_t retained_entries() const { return log_.size(); }

 private:
  struct Pending {
    std::vector<bool> ready;                      // per node
    std::vector<bool> needed;  // per node: hosts a member of the tensor's set that has not joined
    int waiting = 0;           // needed nodes that have not reported it
    std::vector<std::vector<int64_t>> node_dims;  // ALLGATHER: per node, per local worker
    std::vector<int64_t> node_ready_ns;           // per node, the node's own clock
    Clock::time_point first_report;
    bool warned = false;
  };
  struct Batched {
    GroupTensor tensor;
    uint64_t bytes = 0;
    uint64_t fusion_key = 0;
  };

  void MarkReady(int node, uint32_t slot, std::vector<int64_t> dims, int64_t ready_ns,
                 Clock::time_point now);
  // Sets which nodes `p` waits for (those hosting a member that has not joined) and how many of
  // them have not reported it.
  void SetNeeded(const TensorMeta& meta, Pending* p) const;
  // Ranks that hold `p` (or a join, for a null `meta`) up and are gone: `consider` is called
  // with each one's end of grace.
  template <typename Fn>
  void ForEachGoneHolder(const TensorMeta* meta, const Pending* p, Fn&& consider) const;
  // Fails the job for a tensor (or a join) held up by a rank gone for longer than the grace
  // period, if any. Returns whether it did.
  bool FailIfHeldByGone(Clock::time_point now);
  Clock::duration GoneGrace() const { return std::min(options_.gone_grace, options_.timeout); }
  // INVALID_ARGUMENT unless global rank `rank` is one of `node`'s.
  Status CheckRankOf(int node, int rank, const char* what) const;
  // A tensor reported by every node it needs: to the merge scheduler or the batch.
  void Ready(std::map<uint32_t, Pending>::iterator it, Clock::time_point now);
  void AppendMergeOutputs();
  void Flush();
  void Append(ScheduleEntry entry);
  std::string NodeList(const Pending& p, bool ready) const;  // of the nodes p needs
  std::string NodeName(int node) const;  // "node N", with its address when known

  CoordinatorOptions options_;
  std::vector<TensorMeta> metas_;  // slot - 1 -> metadata
  std::unordered_map<std::string, uint32_t> slot_by_signature_;
  std::map<uint32_t, Pending> pending_;               // slot -> readiness across nodes
  std::unordered_map<std::string, uint32_t> pending_by_name_;
  std::vector<Batched> batch_;                        // globally ready, not yet scheduled
  // Grouped collectives, by group key: the globally ready tensors of groups not yet complete.
  struct HeldGroup {
    std::vector<Batched> ready;
    Clock::time_point since;  // when its first tensor was ready
  };
  std::unordered_map<uint64_t, HeldGroup> groups_;
  std::vector<bool> joined_;  // by global rank: inside hvd.join()
  int joined_count_ = 0;
  std::vector<std::optional<Clock::time_point>> gone_;  // by global rank: when its worker left
  int gone_count_ = 0;
  Clock::time_point batch_started_;
  bool batch_urgent_ = false;
  std::deque<ScheduleEntry> log_;
  uint64_t next_seq_ = 1;
  std::vector<std::optional<Clock::time_point>> last_poll_;
  std::vector<uint64_t> acked_;
  std::vector<bool> left_;
  std::vector<std::string> addresses_;  // by node, "" when unknown
  MergeScheduler merge_;
  Status fatal_;
};

}  // namespace sparsync::negotiation
