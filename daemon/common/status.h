// Status and Result<T>: the daemon's error values (docs/style.md §2). No exceptions cross a module
// boundary; each foreign error space is converted where it is called.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace sparsync {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,
  kUnavailable = 2,
  kDeadlineExceeded = 3,
  kMismatch = 4,
  kAborted = 5,
  kInternal = 6,
  kPermissionDenied = 7,
};

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string ToString() const;
  // Prefixes the message with `context: `, keeping the code.
  Status WithContext(const std::string& context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status DeadlineExceeded(std::string m) { return {StatusCode::kDeadlineExceeded, std::move(m)}; }
inline Status Mismatch(std::string m) { return {StatusCode::kMismatch, std::move(m)}; }
inline Status Aborted(std::string m) { return {StatusCode::kAborted, std::move(m)}; }
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status PermissionDenied(std::string m) { return {StatusCode::kPermissionDenied, std::move(m)}; }

// Errno converted once, at the syscall wrapper: "what: strerror(errno)".
Status ErrnoStatus(const std::string& what, int err);

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {}  // NOLINT
  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }
  T&& operator*() && { return std::move(*value_); }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace sparsync

#define SPARSYNC_RETURN_IF_ERROR(expr)          \
  do {                                          \
    ::sparsync::Status _st = (expr);            \
    if (!_st.ok()) return _st;                  \
  } while (0)

#define SPARSYNC_CONCAT_INNER(a, b) a##b
#define SPARSYNC_CONCAT(a, b) SPARSYNC_CONCAT_INNER(a, b)
#define SPARSYNC_ASSIGN_OR_RETURN(lhs, expr)                                   \
  auto SPARSYNC_CONCAT(_res_, __LINE__) = (expr);                              \
  if (!SPARSYNC_CONCAT(_res_, __LINE__).ok())                                  \
    return SPARSYNC_CONCAT(_res_, __LINE__).status();                          \
  lhs = std::move(SPARSYNC_CONCAT(_res_, __LINE__)).value()
