#include "daemon/common/logging.h"

#include <spdlog/sinks/stdout_sinks.h>

namespace sparsync {

void InitLogging(int node_rank, const std::string& level) {
  auto logger = spdlog::stderr_logger_mt("sparsyncd");
  logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [node " + std::to_string(node_rank) + "] [%l] %v");
  logger->set_level(spdlog::level::from_str(level));
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
}

bool LogLimiter::Allow(uint64_t* held_back) {
  std::lock_guard lock(mu_);
  const auto now = std::chrono::steady_clock::now();
  if (logged_ && now - last_ < interval_) {
    ++held_back_;
    return false;
  }
  *held_back = held_back_;
  held_back_ = 0;
  logged_ = true;
  last_ = now;
  return true;
}

}  // namespace sparsync
