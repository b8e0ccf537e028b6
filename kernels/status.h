#pragma once
// Status and Result<T> for kernels/: a small, dependency-free error type. The daemon converts
// these to its own status type in exactly one place. No exceptions are thrown by kernels/.

#include <cassert>
#include <optional>
#include <string>
#include <utility>

namespace sparsync::kernels {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,     // the caller passed something unusable (bad option, NaN in the input)
  kFailedPrecondition,  // call order violated (Sparsify before Prepare, missing state)
  kOutOfRange,          // a size exceeds a prepared or representable limit
  kNotFound,            // unknown name
  kInternal,            // broken invariant inside kernels/
};

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "INVALID_ARGUMENT: element 12 of 'grad' is NaN" or "OK".
  std::string ToString() const;

  // Explicitly discards a status the caller has decided not to act on.
  void IgnoreError() const {}

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgumentError(std::string msg) {
  return Status(StatusCode::kInvalidArgument, std::move(msg));
}
inline Status FailedPreconditionError(std::string msg) {
  return Status(StatusCode::kFailedPrecondition, std::move(msg));
}
inline Status OutOfRangeError(std::string msg) {
  return Status(StatusCode::kOutOfRange, std::move(msg));
}
inline Status NotFoundError(std::string msg) {
  return Status(StatusCode::kNotFound, std::move(msg));
}
inline Status InternalError(std::string msg) {
  return Status(StatusCode::kInternal, std::move(msg));
}

// Either a value or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {  // NOLINT: implicit by design
    assert(!status_.ok() && "Result constructed from an OK status without a value");
    if (status_.ok()) status_ = InternalError("Result constructed from OK status without value");
  }

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }

  // REQUIRES: ok().
  T& value() & { assert(ok()); return *value_; }
  const T& value() const& { assert(ok()); return *value_; }
  T&& value() && { assert(ok()); return std::move(*value_); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace sparsync::kernels

#define SPARSYNC_KERNELS_RETURN_IF_ERROR(expr)              \
  do {                                                      \
    ::sparsync::kernels::Status sparsync_status_ = (expr);  \
    if (!sparsync_status_.ok()) return sparsync_status_;    \
  } while (0)
