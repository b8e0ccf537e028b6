// JobFailure: the node's one sticky job failure (docs/style.md §2). The first error wins and is
// kept; every part that must act on a failure observes this object instead of keeping a copy:
// the worker handler answers every pending collective and refuses new ones, the negotiation agent
// tells the coordinator, the executor stops exchanging.
//
// Thread-safety: Fail, status and failed may be called from any thread. Observers are added
// before the daemon starts its threads and are called on the thread whose Fail came first, after
// the failure is visible to status(); they must not call Fail.
#pragma once

#include <functional>
#include <mutex>
#include <vector>

#include "daemon/common/status.h"

namespace sparsync {

class JobFailure {
 public:
  // Where a failure comes from, which decides who still has to hear of it.
  enum class Source {
    kLocal,        // found on this node: the coordinator must be told, and tells every node
    kCoordinator,  // the coordinator's fatal entry: every node hears it from there
    kUnreported,   // found on this node, and the coordinator cannot be told (it is lost)
    kShutdown,     // this daemon is stopping: the coordinator is told, as for kLocal
  };
  using Observer = std::function<void(const Status& error, Source source)>;

  // REQUIRES: no thread calls Fail yet.
  void Observe(Observer observer) { observers_.push_back(std::move(observer)); }

  // Records `error` (not OK) unless the job has failed already, and on that first call tells
  // every observer, in the order they were added. Returns whether this call was the first.
  bool Fail(const Status& error, Source source);

  // The first error, or OK.
  Status status() const;
  bool failed() const;

 private:
  mutable std::mutex mu_;
  Status error_;  // guarded by mu_
  std::vector<Observer> observers_;
};

// The reason a stopping daemon gives its workers and the other nodes ("the daemon of node N is
// shutting down"), and whether an error is that reason of `node`: at the end of every job each
// daemon gives it, which the coordinator logs as the end it is, not as a failure.
Status ShutdownReason(int node);
bool IsShutdownReason(const Status& error, int node);
// Whether `error` is that reason of any node.
bool IsShutdownReason(const Status& error);

}  // namespace sparsync
