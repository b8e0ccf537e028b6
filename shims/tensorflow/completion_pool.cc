#include "shims/tensorflow/completion_pool.h"

#include <utility>

namespace sparsync::tensorflow_shim {

bool CompletionPool::Submit(std::function<void()> task) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return false;
  tasks_.push_back(std::move(task));
  // Idle threads not yet woken are already counted against the queue.
  if (idle_ >= tasks_.size() || threads_.size() >= max_threads_) {
    cv_.notify_one();
    return true;
  }
  threads_.emplace_back([this] { Run(); });
  return true;
}

void CompletionPool::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    ++idle_;
    cv_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
    --idle_;
    if (tasks_.empty()) return;  // stopping, nothing left to run
    std::function<void()> task = std::move(tasks_.front());
    tasks_.pop_front();
    lock.unlock();
    task();
    task = nullptr;  // whatever it captured goes before the lock is taken again
    lock.lock();
  }
}

void CompletionPool::Stop() {
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    threads.swap(threads_);
  }
  cv_.notify_all();
  for (std::thread& t : threads) t.join();
}

size_t CompletionPool::threads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return threads_.size();
}

}  // namespace sparsync::tensorflow_shim
