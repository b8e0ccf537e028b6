// Thin wrappers over the socket system calls of the intake control connection. This is the one
// file of the client library that reads errno: every failure comes back as an IoError with a
// message a user can act on.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace sparsync::client {

using Clock = std::chrono::steady_clock;

struct IoError {
  bool ok = true;
  bool closed = false;     // the peer closed the connection (or reset it)
  bool timed_out = false;  // the deadline passed before anything arrived
  bool foreign = false;    // ConnectUnix: the listener runs as another user
  std::string message;     // empty when ok
  static IoError Ok() { return {}; }
};

// Owns received descriptors until they are taken; closes whatever is left.
class ReceivedFds {
 public:
  ReceivedFds() = default;
  ReceivedFds(const ReceivedFds&) = delete;
  ReceivedFds& operator=(const ReceivedFds&) = delete;
  ~ReceivedFds() { CloseAll(); }
  void Add(int fd) { fds_.push_back(fd); }
  size_t size() const { return fds_.size(); }
  int Take();  // REQUIRES: size() > 0. The caller owns the returned descriptor.
  void CloseAll();

 private:
  std::vector<int> fds_;
};

// Connects a SOCK_SEQPACKET Unix socket to `path`. On success *fd is the connected socket
// (close-on-exec). `retryable` is set when the daemon may simply not be up yet. The listener must
// run as this process's user (or as root), checked with SO_PEERCRED before anything is sent:
// another local user who took the path must not receive the job token (issue 16, D1).
IoError ConnectUnix(const std::string& path, int* fd, bool* retryable);

// Reads the job token from `path`: a regular file of this user's that nobody else may read, its
// first line, 1 to SPARSYNC_MAX_TOKEN_BYTES bytes. `missing` is set when there is no such file.
IoError ReadTokenFile(const std::string& path, std::string* token, bool* missing);

// Sends one datagram; never raises SIGPIPE.
IoError SendDatagram(int fd, const void* data, size_t bytes);

// Receives one datagram of at most `capacity` bytes, waiting until `deadline` (a deadline of
// Clock::time_point::max() waits forever). Descriptors passed along land in *fds. A datagram
// longer than `capacity` or with truncated control data is an error.
IoError ReceiveDatagram(int fd, void* buffer, size_t capacity, Clock::time_point deadline,
                        size_t* received, ReceivedFds* fds);

// A shared, read-write mapping of a memfd region from the daemon; unmapped when destroyed.
class Mapping {
 public:
  Mapping() = default;
  ~Mapping() { Reset(); }
  Mapping(Mapping&& other) noexcept { *this = std::move(other); }
  Mapping& operator=(Mapping&& other) noexcept;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;

  void* data() const { return data_; }  // null when nothing is mapped
  size_t bytes() const { return bytes_; }
  void Reset();  // unmaps now

 private:
  friend IoError MapRegion(int fd, size_t bytes, Mapping* out);
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Maps `bytes` of the memfd `fd` (at least one byte is mapped) after checking that the file is
// that large, replacing what *out held. Does not close `fd`.
IoError MapRegion(int fd, size_t bytes, Mapping* out);

void CloseFd(int fd);

// An owned descriptor, closed when destroyed unless released.
class OwnedFd {
 public:
  OwnedFd() = default;
  explicit OwnedFd(int fd) : fd_(fd) {}
  ~OwnedFd() { CloseFd(fd_); }
  OwnedFd(OwnedFd&& other) noexcept : fd_(other.Release()) {}
  OwnedFd& operator=(OwnedFd&& other) noexcept {
    if (this != &other) {
      CloseFd(fd_);
      fd_ = other.Release();
    }
    return *this;
  }
  OwnedFd(const OwnedFd&) = delete;
  OwnedFd& operator=(const OwnedFd&) = delete;
  int get() const { return fd_; }
  int Release() { return std::exchange(fd_, -1); }

 private:
  int fd_ = -1;
};

}  // namespace sparsync::client
