// StagingThread: runs jobs (forming the node's sum of CUDA tensors, device_intake.h) one at a
// time in the order posted, on a thread of its own started by the first Post, so that no CUDA
// copy holds up the intake thread. Destruction finishes the running job and drops the queued
// ones (the daemon has failed them by then).
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace sparsync::device {

class StagingThread {
 public:
  StagingThread() = default;
  ~StagingThread();
  StagingThread(const StagingThread&) = delete;
  StagingThread& operator=(const StagingThread&) = delete;

  void Post(std::function<void()> job);

 private:
  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace sparsync::device
