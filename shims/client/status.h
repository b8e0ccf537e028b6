// Status: the client library's error value, a sparsync_status code (proto/intake/wire.h) with a
// message a user can act on. The C API (c_api.cc) turns it into a return code and the handle's
// last error; nothing inside the library throws on purpose.
#pragma once

#include <string>
#include <utility>

#include "proto/intake/wire.h"

namespace sparsync::client {

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(sparsync_status code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == SPARSYNC_OK; }
  sparsync_status code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  sparsync_status code_ = SPARSYNC_OK;
  std::string message_;
};

}  // namespace sparsync::client
