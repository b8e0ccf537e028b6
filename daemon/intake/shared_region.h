// SharedRegion: memory created with memfd_create and mapped into the daemon, whose descriptor is
// passed to a worker with SCM_RIGHTS. Needs no /dev/shm space and leaves no names behind.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "daemon/common/status.h"

namespace sparsync::intake {

// RegionBudget: how much shared memory the workers of a node may have registered at once
// (SPARSYNC_MAX_REGISTERED_BYTES; issue 16, D10: one worker with the token must not exhaust the
// daemon's address space). Each region created against it holds its mapped bytes until it goes.
// Thread-safe.
class RegionBudget {
 public:
  // `limit` 0: the machine's physical memory.
  explicit RegionBudget(uint64_t limit);
  uint64_t limit() const { return limit_; }
  uint64_t used() const { return used_.load(); }
  // Takes `bytes` of the budget for `name`; an error naming the limit when they do not fit.
  Status Take(const std::string& name, uint64_t bytes);
  void Give(uint64_t bytes) { used_.fetch_sub(bytes); }

 private:
  const uint64_t limit_;
  std::atomic<uint64_t> used_{0};
};

class SharedRegion {
 public:
  // Creates and maps `bytes` bytes (at least one page is mapped), zero-filled. With a `budget`,
  // the mapped bytes count against it for the region's lifetime.
  static Result<std::shared_ptr<SharedRegion>> Create(
      const std::string& name, size_t bytes, std::shared_ptr<RegionBudget> budget = nullptr);
  ~SharedRegion();
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;

  void* data() const { return data_; }
  size_t size() const { return size_; }
  // The memfd, until ReleaseFd; to be sent to the worker.
  int fd() const { return fd_; }
  // Closes the descriptor; the mapping stays.
  void ReleaseFd();

 private:
  SharedRegion(int fd, void* data, size_t size, size_t mapped,
               std::shared_ptr<RegionBudget> budget)
      : fd_(fd), data_(data), size_(size), mapped_(mapped), budget_(std::move(budget)) {}
  int fd_;
  void* data_;
  size_t size_;
  size_t mapped_;
  std::shared_ptr<RegionBudget> budget_;  // null: not counted
};

}  // namespace sparsync::intake
