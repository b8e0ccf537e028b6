#include "daemon/common/job_failure.h"

namespace sparsync {

bool JobFailure::Fail(const Status& error, Source source) {
  const Status first = error.ok() ? Internal("job failed with an OK status") : error;
  {
    std::lock_guard lock(mu_);
    if (!error_.ok()) return false;
    error_ = first;
  }
  for (const Observer& observe : observers_) observe(first, source);
  return true;
}

Status JobFailure::status() const {
  std::lock_guard lock(mu_);
  return error_;
}

bool JobFailure::failed() const {
  std::lock_guard lock(mu_);
  return !error_.ok();
}

Status ShutdownReason(int node) {
  return Aborted("the daemon of node " + std::to_string(node) + " is shutting down");
}

bool IsShutdownReason(const Status& error, int node) {
  const Status reason = ShutdownReason(node);
  return error.code() == reason.code() && error.message() == reason.message();
}

}  // namespace sparsync
