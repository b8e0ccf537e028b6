#include "daemon/device/staging_thread.h"

#include "daemon/common/thread_name.h"

namespace sparsync::device {

StagingThread::~StagingThread() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    jobs_.clear();
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void StagingThread::Post(std::function<void()> job) {
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    jobs_.push_back(std::move(job));
    if (!thread_.joinable()) {
      thread_ = std::thread([this] {
        NameThisThread("ssd-staging");
        std::unique_lock lock(mu_);
        while (true) {
          wake_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
          if (stopping_) return;
          std::function<void()> next = std::move(jobs_.front());
          jobs_.pop_front();
          lock.unlock();
          next();
          next = nullptr;  // what the job holds goes before the lock is taken again
          lock.lock();
        }
      });
    }
  }
  wake_.notify_one();
}

}  // namespace sparsync::device
