// TraceFile: a Chrome trace file (the JSON array form of the Trace Event Format, which Perfetto
// and chrome://tracing open) that is valid JSON after every Append, so that a daemon killed by
// SIGKILL, or a job that failed, still leaves a file the viewers and json.load read: the file
// always ends in "\n]\n", and each Append overwrites that end with ",\n<events>\n]\n" in one
// pwrite. Nothing is buffered here: the caller batches (timeline.h does, once a second).
//
// Not thread-safe: one owner (the timeline's writer thread).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "daemon/common/status.h"

namespace sparsync::observe {

class TraceFile {
 public:
  // Creates or truncates `path` (mode 0644 before the umask) and writes an empty trace, "[\n]\n".
  static Result<std::unique_ptr<TraceFile>> Create(const std::string& path);
  ~TraceFile();
  TraceFile(const TraceFile&) = delete;
  TraceFile& operator=(const TraceFile&) = delete;

  // Appends `events`: one or more JSON objects separated by ",\n", without a trailing separator.
  // Empty: nothing happens. On an error the file keeps its last valid content.
  Status Append(std::string_view events);
  const std::string& path() const { return path_; }

 private:
  TraceFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  Status WriteAt(uint64_t offset, std::string_view bytes);

  const int fd_;
  const std::string path_;
  uint64_t end_ = 2;     // where the closing "]\n" starts (after "[\n")
  bool empty_ = true;    // no event written yet: the next one needs no separator
};

}  // namespace sparsync::observe
