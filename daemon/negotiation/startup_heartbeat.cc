#include "daemon/negotiation/startup_heartbeat.h"

#include <spdlog/spdlog.h>

namespace sparsync::negotiation {

StartupHeartbeat::StartupHeartbeat(CoordinatorLink* link, int node,
                                   std::chrono::milliseconds every)
    : thread_([this, link, node, every] { Run(link, node, every); }) {}

StartupHeartbeat::~StartupHeartbeat() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void StartupHeartbeat::Run(CoordinatorLink* link, int node, std::chrono::milliseconds every) {
  std::unique_lock lock(mu_);
  while (!cv_.wait_for(lock, every, [this] { return stop_; })) {
    lock.unlock();
    auto polled = link->Poll(node, /*after_seq=*/0, std::chrono::milliseconds(0));
    if (!polled.ok()) spdlog::debug("start-up heartbeat: {}", polled.status().ToString());
    lock.lock();
  }
}

}  // namespace sparsync::negotiation
