// SharedRegion: memory created with memfd_create and mapped into the daemon, whose descriptor is
// passed to a worker with SCM_RIGHTS. Needs no /dev/shm space and leaves no names behind.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "daemon/common/status.h"

namespace sparsync::intake {

class SharedRegion {
 public:
  // Creates and maps `bytes` bytes (at least one page is mapped), zero-filled.
  static Result<std::shared_ptr<SharedRegion>> Create(const std::string& name, size_t bytes);
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
  SharedRegion(int fd, void* data, size_t size, size_t mapped)
      : fd_(fd), data_(data), size_(size), mapped_(mapped) {}
  int fd_;
  void* data_;
  size_t size_;
  size_t mapped_;
};

}  // namespace sparsync::intake
