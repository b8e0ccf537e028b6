// StartupHeartbeat: keeps a node other than 0 known to the coordinator while the daemon starts.
// The coordinator fails a node that is silent for its liveness window from the node's join on
// (coordinator_state.h), and the steps between the join and the agent's first poll, the
// transport's mesh and calibration, may take longer than that: calibration over a slow link, say.
// While it lives, the heartbeat polls the coordinator every `every` on a thread of its own. What a
// poll returns is dropped (the agent reads the schedule itself, from the start); a failed poll is
// logged at debug level and left to the start-up step that waits on the same coordinator.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "daemon/negotiation/coordinator_link.h"

namespace sparsync::negotiation {

class StartupHeartbeat {
 public:
  // REQUIRES: `link` outlives the heartbeat and is safe to call from another thread.
  StartupHeartbeat(CoordinatorLink* link, int node, std::chrono::milliseconds every);
  // Stops polling; returns once the thread ended (a poll in flight returns at once: wait 0).
  ~StartupHeartbeat();

  StartupHeartbeat(const StartupHeartbeat&) = delete;
  StartupHeartbeat& operator=(const StartupHeartbeat&) = delete;

 private:
  void Run(CoordinatorLink* link, int node, std::chrono::milliseconds every);

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // guarded by mu_
  std::thread thread_;
};

}  // namespace sparsync::negotiation
