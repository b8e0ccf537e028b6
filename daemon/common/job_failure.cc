#include "daemon/common/job_failure.h"

#include <algorithm>
#include <string_view>

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

bool IsShutdownReason(const Status& error) {
  constexpr std::string_view kHead = "the daemon of node ", kTail = " is shutting down";
  const std::string_view m = error.message();
  if (error.code() != StatusCode::kAborted || m.size() <= kHead.size() + kTail.size()) return false;
  if (!m.starts_with(kHead) || !m.ends_with(kTail)) return false;
  const std::string_view node = m.substr(kHead.size(), m.size() - kHead.size() - kTail.size());
  return std::all_of(node.begin(), node.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace sparsync
