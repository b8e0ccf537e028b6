// CompletionPool: the threads that wait for sparsyncd on behalf of TensorFlow's kernels.
//
// A kernel posts its tensor and returns at once; the wait for the daemon's DONE, the copy of the
// result into the output and TensorFlow's `done` callback run here, so no executor thread ever
// blocks on the daemon. The client library has no completion callback, and its waits are per
// tensor, so every collective in flight occupies one pool thread while it waits. A fixed number
// of threads could deadlock a job (ranks whose executors post in different orders, each rank
// waiting on a tensor another rank posts only after one of its own completes), so the pool grows
// to the number of collectives in flight and keeps its threads for the next step.
//
// Threading: Submit may be called from any thread. The pool owns its threads; Stop (or the
// destructor) runs every task already submitted and joins them.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace sparsync::tensorflow_shim {

class CompletionPool {
 public:
  // Past `max_threads` in flight, tasks wait for a thread to come free.
  explicit CompletionPool(size_t max_threads = 4096) : max_threads_(max_threads) {}
  ~CompletionPool() { Stop(); }
  CompletionPool(const CompletionPool&) = delete;
  CompletionPool& operator=(const CompletionPool&) = delete;

  // Runs `task` on an idle pool thread, else on a new one. False (the task is not run) after
  // Stop.
  [[nodiscard]] bool Submit(std::function<void()> task);
  // Runs the tasks submitted so far, joins every thread; later Submits fail. Idempotent; not
  // from a pool thread.
  void Stop();
  // Threads started so far (they live until Stop).
  size_t threads() const;

 private:
  void Run();

  const size_t max_threads_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  std::vector<std::thread> threads_;
  size_t idle_ = 0;
  bool stopping_ = false;
};

}  // namespace sparsync::tensorflow_shim
