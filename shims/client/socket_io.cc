#include "shims/client/socket_io.h"

#include "proto/intake/wire.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <utility>

namespace sparsync::client {
namespace {

std::string Errno(const char* what, int err) { return std::string(what) + ": " + strerror(err); }

IoError Fail(std::string message) {
  IoError e;
  e.ok = false;
  e.message = std::move(message);
  return e;
}

}  // namespace

int ReceivedFds::Take() {
  int fd = fds_.front();
  fds_.erase(fds_.begin());
  return fd;
}

void ReceivedFds::CloseAll() {
  for (int fd : fds_) ::close(fd);
  fds_.clear();
}

IoError ConnectUnix(const std::string& path, int* fd, bool* retryable) {
  *retryable = false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return Fail("socket path '" + path + "' is empty or longer than " +
                std::to_string(sizeof(addr.sun_path) - 1) + " bytes");
  }
  memcpy(addr.sun_path, path.data(), path.size());
  int s = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (s < 0) return Fail(Errno("socket", errno));
  if (::connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    int err = errno;
    ::close(s);
    // Not there yet, or there but not listening yet (stale file / daemon starting).
    *retryable = err == ENOENT || err == ECONNREFUSED || err == EAGAIN || err == EINTR;
    return Fail(Errno("connect", err));
  }
  ucred peer{};
  socklen_t len = sizeof(peer);
  if (::getsockopt(s, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0) {
    int err = errno;
    ::close(s);
    return Fail(Errno("checking who listens on the socket (SO_PEERCRED)", err));
  }
  if (peer.uid != ::geteuid() && peer.uid != 0) {
    ::close(s);
    IoError e = Fail("the process listening there (pid " + std::to_string(peer.pid) +
                     ") runs as uid " + std::to_string(peer.uid) + ", not as this worker's uid " +
                     std::to_string(::geteuid()) +
                     ": not sending it the job token (another user may have taken the path)");
    e.foreign = true;
    return e;
  }
  *fd = s;
  return IoError::Ok();
}

IoError ReadTokenFile(const std::string& path, std::string* token, bool* missing) {
  *missing = false;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    *missing = errno == ENOENT;
    return Fail(Errno(("opening the job token file " + path).c_str(), errno));
  }
  struct stat st {};
  char buf[SPARSYNC_MAX_TOKEN_BYTES + 3];
  ssize_t n = -1;
  std::string problem;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    problem = "is not a regular file";
  } else if (st.st_uid != ::geteuid() || (st.st_mode & 077) != 0) {
    problem = "must belong to this user and be readable by nobody else (chmod 600)";
  } else if ((n = ::read(fd, buf, sizeof(buf))) < 0) {
    problem = strerror(errno);
  }
  ::close(fd);
  std::string text = n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  if (problem.empty() && (text.empty() || text.size() > SPARSYNC_MAX_TOKEN_BYTES)) {
    problem = "must hold a token of 1 to " + std::to_string(SPARSYNC_MAX_TOKEN_BYTES) + " bytes";
  }
  if (!problem.empty()) return Fail("the job token file " + path + " " + problem);
  *token = text;
  return IoError::Ok();
}

IoError SendDatagram(int fd, const void* data, size_t bytes) {
  for (;;) {
    ssize_t n = ::send(fd, data, bytes, MSG_NOSIGNAL);
    if (n == static_cast<ssize_t>(bytes)) return IoError::Ok();
    if (n >= 0) return Fail("short send on the control socket");
    if (errno == EINTR) continue;
    IoError e = Fail(Errno("send to sparsyncd", errno));
    e.closed = errno == EPIPE || errno == ECONNRESET || errno == ENOTCONN;
    return e;
  }
}

IoError ReceiveDatagram(int fd, void* buffer, size_t capacity, Clock::time_point deadline,
                        size_t* received, ReceivedFds* fds) {
  for (;;) {
    int timeout_ms = -1;
    if (deadline != Clock::time_point::max()) {
      auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
      timeout_ms = static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30));
    }
    pollfd p{fd, POLLIN, 0};
    int r = ::poll(&p, 1, timeout_ms);
    if (r < 0) {
      if (errno == EINTR) continue;
      return Fail(Errno("poll on the control socket", errno));
    }
    if (r == 0) {
      IoError e = Fail("timed out");
      e.timed_out = true;
      return e;
    }
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)];
    iovec iov{buffer, capacity};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t n = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      IoError e = Fail(Errno("receive from sparsyncd", errno));
      e.closed = errno == ECONNRESET || errno == ENOTCONN;
      return e;
    }
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
        size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        const unsigned char* p_fd = CMSG_DATA(c);
        for (size_t i = 0; i < count; ++i) {
          int received_fd;
          memcpy(&received_fd, p_fd + i * sizeof(int), sizeof(int));
          fds->Add(received_fd);
        }
      }
    }
    if (n == 0) {
      IoError e = Fail("sparsyncd closed the connection");
      e.closed = true;
      return e;
    }
    if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
      return Fail("sparsyncd sent a datagram that is too long or carries too many descriptors");
    }
    *received = static_cast<size_t>(n);
    return IoError::Ok();
  }
}

Mapping& Mapping::operator=(Mapping&& other) noexcept {
  if (this != &other) {
    Reset();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void Mapping::Reset() {
  if (data_ != nullptr) ::munmap(data_, std::max<size_t>(bytes_, 1));
  data_ = nullptr;
  bytes_ = 0;
}

IoError MapRegion(int fd, size_t bytes, Mapping* out) {
  size_t length = std::max<size_t>(bytes, 1);
  struct stat st {};
  if (::fstat(fd, &st) != 0) return Fail(Errno("fstat of a shared region", errno));
  if (st.st_size < 0 || static_cast<uint64_t>(st.st_size) < length) {
    return Fail("shared region from sparsyncd holds " + std::to_string(st.st_size) +
                " bytes, expected at least " + std::to_string(length));
  }
  void* p = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return Fail(Errno("mmap of a shared region", errno));
  out->Reset();
  out->data_ = p;
  out->bytes_ = bytes;
  return IoError::Ok();
}

void CloseFd(int fd) {
  if (fd >= 0) ::close(fd);
}

}  // namespace sparsync::client
