#include "daemon/intake/session.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace sparsync::intake {

WorkerSession::~WorkerSession() { close(fd_); }

void WorkerSession::Shutdown() {
  if (!shut_.exchange(true)) shutdown(fd_, SHUT_RDWR);
}

std::string WorkerSession::Describe(int node_rank) const {
  return "worker local rank " + std::to_string(local_rank) + " (pid " + std::to_string(pid) +
         ") on node " + std::to_string(node_rank);
}

Status WorkerSession::Send(const void* data, size_t size, int pass_fd) {
  if (shut_) return Unavailable("the worker's connection is closed");
  iovec iov{const_cast<void*>(data), size};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  if (pass_fd >= 0) {
    std::memset(control, 0, sizeof(control));
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
  }
  std::lock_guard lock(send_mu_);
  while (true) {
    ssize_t n = sendmsg(fd_, &msg, MSG_NOSIGNAL);
    if (n == static_cast<ssize_t>(size)) return Status::Ok();
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus("sending to a worker", errno);
    return Internal("short send to a worker");
  }
}

}  // namespace sparsync::intake
