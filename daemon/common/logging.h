// Logging: spdlog with the node rank on every line.
//
// Levels (docs/operations.md, "logs"): at info a job logs its start, each plan change once (node
// 0's planner), its warnings and errors, and its end; per-worker, per-group and per-plan copies
// are debug. A message that can repeat without bound (a rejected connection) goes through a
// LogLimiter.
#pragma once

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace sparsync {

// Installs the default logger: "[time] [node N] [level] message" on stderr.
void InitLogging(int node_rank, const std::string& level);

// Lets a repeated message through at most once per `interval`. Thread-safe; one per message,
// owned by whoever logs it.
class LogLimiter {
 public:
  explicit LogLimiter(std::chrono::steady_clock::duration interval = std::chrono::seconds(10))
      : interval_(interval) {}
  // Whether to log now; if so, *held_back is how many were not logged since the last one.
  bool Allow(uint64_t* held_back);

 private:
  const std::chrono::steady_clock::duration interval_;
  std::mutex mu_;
  bool logged_ = false;
  std::chrono::steady_clock::time_point last_;
  uint64_t held_back_ = 0;
};

}  // namespace sparsync
