#include "daemon/intake/shared_region.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>

namespace sparsync::intake {
namespace {

uint64_t PhysicalMemory() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page)
                               : uint64_t{1} << 40;
}

std::string Gib(uint64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f GiB", static_cast<double>(bytes) / (1ull << 30));
  return text;
}

}  // namespace

RegionBudget::RegionBudget(uint64_t limit) : limit_(limit != 0 ? limit : PhysicalMemory()) {}

Status RegionBudget::Take(const std::string& name, uint64_t bytes) {
  uint64_t used = used_.load();
  do {
    if (bytes > limit_ || used > limit_ - bytes) {
      return Unavailable("tensor '" + name + "' needs " + Gib(bytes) +
                         " of shared memory, but this node's workers have " + Gib(used) +
                         " registered of the " + Gib(limit_) +
                         " allowed (SPARSYNC_MAX_REGISTERED_BYTES; default: the machine's memory)");
    }
  } while (!used_.compare_exchange_weak(used, used + bytes));
  return Status::Ok();
}

Result<std::shared_ptr<SharedRegion>> SharedRegion::Create(const std::string& name, size_t bytes,
                                                           std::shared_ptr<RegionBudget> budget) {
  size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  size_t mapped = std::max(page, (bytes + page - 1) / page * page);
  if (budget) SPARSYNC_RETURN_IF_ERROR(budget->Take(name, mapped));
  // From here on every failure gives the budget back.
  auto refund = [&] {
    if (budget) budget->Give(mapped);
  };
  int fd = memfd_create(("sparsync:" + name).substr(0, 240).c_str(), MFD_CLOEXEC);
  if (fd < 0) {
    refund();
    return ErrnoStatus("memfd_create", errno);
  }
  if (ftruncate(fd, static_cast<off_t>(mapped)) != 0) {
    int err = errno;
    close(fd);
    refund();
    return ErrnoStatus("ftruncate of a " + std::to_string(mapped) + "-byte region", err);
  }
  void* data = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) {
    int err = errno;
    close(fd);
    refund();
    return ErrnoStatus("mmap of a " + std::to_string(mapped) + "-byte region", err);
  }
  return std::shared_ptr<SharedRegion>(
      new SharedRegion(fd, data, bytes, mapped, std::move(budget)));
}

SharedRegion::~SharedRegion() {
  munmap(data_, mapped_);
  ReleaseFd();
  if (budget_) budget_->Give(mapped_);
}

void SharedRegion::ReleaseFd() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

}  // namespace sparsync::intake
