#include "daemon/common/status.h"

#include <cstring>

namespace sparsync {

namespace {
const char* CodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "INVALID_ARGUMENT";
    case StatusCode::kUnavailable: return "UNAVAILABLE";
    case StatusCode::kDeadlineExceeded: return "DEADLINE_EXCEEDED";
    case StatusCode::kMismatch: return "MISMATCH";
    case StatusCode::kAborted: return "ABORTED";
    case StatusCode::kInternal: return "INTERNAL";
    case StatusCode::kPermissionDenied: return "PERMISSION_DENIED";
  }
  return "UNKNOWN";
}
}  // namespace

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(CodeName(code_)) + ": " + message_;
}

Status Status::WithContext(const std::string& context) const {
  if (ok()) return *this;
  return Status(code_, context + ": " + message_);
}

Status ErrnoStatus(const std::string& what, int err) {
  StatusCode code = StatusCode::kInternal;
  if (err == ENOENT || err == ECONNREFUSED || err == EPIPE || err == ECONNRESET) {
    code = StatusCode::kUnavailable;
  } else if (err == EACCES || err == EPERM) {
    code = StatusCode::kPermissionDenied;
  } else if (err == EINVAL) {
    code = StatusCode::kInvalidArgument;
  }
  return Status(code, what + ": " + std::strerror(err));
}

}  // namespace sparsync
