// LogLimit: lets through at most `burst` lines of one kind per `window` and counts the rest, so
// that a flood of bad connections cannot fill the disk with the daemon's log (issue 16, D11).
// The count of lines held back is handed to the next line let through.
//
// Thread-safety: none; each limiter belongs to one thread (the intake thread).
#pragma once

#include <chrono>
#include <cstdint>

namespace sparsync::intake {

class LogLimit {
 public:
  using Clock = std::chrono::steady_clock;

  LogLimit(int burst, Clock::duration window) : burst_(burst), window_(window) {}

  // Whether a line may be logged at `now`. When it may, *held_back is set to the number of lines
  // refused since the last one allowed (to be mentioned in it) and the count restarts.
  bool Allow(Clock::time_point now, uint64_t* held_back) {
    if (now - window_start_ >= window_) {
      window_start_ = now;
      used_ = 0;
    }
    if (used_ >= burst_) {
      ++held_back_;
      return false;
    }
    ++used_;
    *held_back = held_back_;
    held_back_ = 0;
    return true;
  }

 private:
  const int burst_;
  const Clock::duration window_;
  Clock::time_point window_start_{};
  int used_ = 0;
  uint64_t held_back_ = 0;
};

}  // namespace sparsync::intake
