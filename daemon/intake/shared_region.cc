#include "daemon/intake/shared_region.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace sparsync::intake {

Result<std::shared_ptr<SharedRegion>> SharedRegion::Create(const std::string& name, size_t bytes) {
  size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  size_t mapped = std::max(page, (bytes + page - 1) / page * page);
  int fd = memfd_create(("sparsync:" + name).substr(0, 240).c_str(), MFD_CLOEXEC);
  if (fd < 0) return ErrnoStatus("memfd_create", errno);
  if (ftruncate(fd, static_cast<off_t>(mapped)) != 0) {
    int err = errno;
    close(fd);
    return ErrnoStatus("ftruncate of a " + std::to_string(mapped) + "-byte region", err);
  }
  void* data = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) {
    int err = errno;
    close(fd);
    return ErrnoStatus("mmap of a " + std::to_string(mapped) + "-byte region", err);
  }
  return std::shared_ptr<SharedRegion>(new SharedRegion(fd, data, bytes, mapped));
}

SharedRegion::~SharedRegion() {
  munmap(data_, mapped_);
  ReleaseFd();
}

void SharedRegion::ReleaseFd() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

}  // namespace sparsync::intake
