// CoordinatorLink: how a node's daemon talks to the coordinator. Node 0 calls its in-process
// CoordinatorCore directly; the other nodes go through gRPC (GrpcCoordinatorLink). Every call has
// a deadline and returns a Status; none throws.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "daemon/negotiation/coordinator_state.h"
#include "daemon/negotiation/types.h"

namespace sparsync::negotiation {

struct JoinInfo {
  uint32_t protocol_version = 0;
  std::string job_token;
  int node_rank = 0;
  int num_nodes = 1;
  int local_size = 1;
  std::string address;  // the node's host as the coordinator sees it ("" in-process), for errors
};

class CoordinatorLink {
 public:
  virtual ~CoordinatorLink() = default;
  // Blocks until every node joined or `timeout` passed.
  virtual Status Join(const JoinInfo& info, std::chrono::milliseconds timeout) = 0;
  virtual Status StoreSet(const std::string& key, const std::string& value) = 0;
  // Waits up to `timeout` for every key to exist.
  virtual Result<std::vector<std::string>> StoreGet(const std::vector<std::string>& keys,
                                                    std::chrono::milliseconds timeout) = 0;
  // `ranks`: news of `node`'s ranks since its last report, applied after `ready`: those that
  // called hvd.join() (CoordinatorState::Joined), then those whose worker came back, then those
  // whose worker has gone (CoordinatorState::Back, Gone).
  virtual Result<std::vector<uint32_t>> Report(int node, const std::vector<TensorMeta>& new_tensors,
                                               const std::vector<ReportedReady>& ready,
                                               const RankNews& ranks) = 0;
  Result<std::vector<uint32_t>> Report(int node, const std::vector<TensorMeta>& new_tensors,
                                       const std::vector<ReportedReady>& ready) {
    return Report(node, new_tensors, ready, {});
  }
  // Entries with seq > after_seq; waits up to `wait` when there are none (may return none).
  virtual Result<std::vector<ScheduleEntry>> Poll(int node, uint64_t after_seq,
                                                  std::chrono::milliseconds wait) = 0;
  virtual Status Fail(int node, const Status& error) = 0;
  virtual Status Leave(int node) = 0;
  // The daemon is stopping: ends every call in flight at once and fails the later ones, so that
  // no thread waits out an RPC deadline on the way down (issue 16, D9). Idempotent.
  virtual void Cancel() {}
};

}  // namespace sparsync::negotiation
