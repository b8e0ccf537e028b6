#include "daemon/observe/trace_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

namespace sparsync::observe {
namespace {
constexpr std::string_view kEmpty = "[\n]\n";
constexpr std::string_view kClose = "\n]\n";
}  // namespace

Result<std::unique_ptr<TraceFile>> TraceFile::Create(const std::string& path) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus("cannot create the timeline file '" + path + "'", errno);
  std::unique_ptr<TraceFile> file(new TraceFile(fd, path));
  SPARSYNC_RETURN_IF_ERROR(file->WriteAt(0, kEmpty));
  return file;
}

TraceFile::~TraceFile() { close(fd_); }

Status TraceFile::WriteAt(uint64_t offset, std::string_view bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = pwrite(fd_, bytes.data() + done, bytes.size() - done,
                       static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus("writing the timeline file '" + path_ + "'", errno);
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status TraceFile::Append(std::string_view events) {
  if (events.empty()) return Status::Ok();
  std::string chunk;
  chunk.reserve(events.size() + 8);
  chunk.append(empty_ ? "" : ",\n").append(events).append(kClose);
  // The file before: "[\n" ... "]\n" at end_. After: the same up to end_ (the "]\n" and the
  // newline before it replaced), then the events and a new "\n]\n": valid at every moment the
  // single pwrite is not in progress, and never shorter, so no stale bytes remain.
  const uint64_t at = empty_ ? end_ : end_ - 1;  // overwrite the "\n" before "]" too
  SPARSYNC_RETURN_IF_ERROR(WriteAt(at, chunk));
  end_ = at + chunk.size() - 2;
  empty_ = false;
  return Status::Ok();
}

}  // namespace sparsync::observe
