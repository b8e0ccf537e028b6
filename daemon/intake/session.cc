#include "daemon/intake/session.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace sparsync::intake {

WorkerSession::WorkerSession(int fd, WatchWritable watch_writable)
    : fd_(fd), watch_writable_(std::move(watch_writable)) {}

WorkerSession::~WorkerSession() {
  {
    std::lock_guard lock(send_mu_);
    Discard();
  }
  close(fd_);
}

void WorkerSession::Shutdown() {
  std::lock_guard lock(send_mu_);
  if (shut_) return;
  shut_ = true;
  Discard();
  shutdown(fd_, SHUT_RDWR);
}

Status WorkerSession::shutdown_reason() const {
  std::lock_guard lock(send_mu_);
  return broken_;
}

std::string WorkerSession::Describe(int node_rank) const {
  return "worker local rank " + std::to_string(local_rank) + " (pid " + std::to_string(pid) +
         ") on node " + std::to_string(node_rank);
}

int WorkerSession::TrySend(const void* data, size_t size, int pass_fd, int* err) {
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
  while (true) {
    ssize_t n = sendmsg(fd_, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n == static_cast<ssize_t>(size)) return 1;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    *err = n < 0 ? errno : EMSGSIZE;  // a datagram socket sends all or nothing
    return -1;
  }
}

void WorkerSession::Discard() {
  for (Waiting& w : outbox_) {
    if (w.fd >= 0) close(w.fd);
  }
  outbox_.clear();
  outbox_bytes_ = 0;
  outbox_fds_ = 0;
}

void WorkerSession::Break(const Status& reason) {
  if (broken_.ok()) broken_ = reason;
  Discard();
  if (watch_writable_ && !shut_) watch_writable_(fd_, false);
  // The intake loop sees the connection end and closes it with broken_ as the reason.
  shutdown(fd_, SHUT_RDWR);
}

Status WorkerSession::Send(const void* data, size_t size, int pass_fd) {
  std::lock_guard lock(send_mu_);
  if (shut_) return Unavailable("the worker's connection is closed");
  if (!broken_.ok()) return broken_;
  if (outbox_.empty()) {
    int err = 0;
    int sent = TrySend(data, size, pass_fd, &err);
    if (sent == 1) return Status::Ok();
    if (sent < 0) {
      Status st = ErrnoStatus("sending to a worker", err);
      Break(st);
      return st;
    }
  }
  if (outbox_bytes_ + size > kMaxOutboxBytes || (pass_fd >= 0 && outbox_fds_ >= kMaxOutboxFds)) {
    Break(Unavailable("the worker does not read the daemon's messages: " +
                      std::to_string(outbox_.size()) + " of them (" +
                      std::to_string(outbox_bytes_) + " bytes, " + std::to_string(outbox_fds_) +
                      " descriptors) wait for it"));
    return broken_;
  }
  Waiting w;
  w.bytes.assign(static_cast<const char*>(data), static_cast<const char*>(data) + size);
  if (pass_fd >= 0) {
    w.fd = fcntl(pass_fd, F_DUPFD_CLOEXEC, 0);
    if (w.fd < 0) {
      Break(ErrnoStatus("keeping a descriptor for a worker that is not reading", errno));
      return broken_;
    }
    ++outbox_fds_;
  }
  if (outbox_.empty()) {
    progress_ = Clock::now();
    if (watch_writable_) watch_writable_(fd_, true);
  }
  outbox_bytes_ += size;
  outbox_.push_back(std::move(w));
  return Status::Ok();
}

Status WorkerSession::Flush() {
  std::lock_guard lock(send_mu_);
  if (shut_) return Status::Ok();
  if (!broken_.ok()) return broken_;
  while (!outbox_.empty()) {
    Waiting& w = outbox_.front();
    int err = 0;
    int sent = TrySend(w.bytes.data(), w.bytes.size(), w.fd, &err);
    if (sent == 0) return Status::Ok();
    if (sent < 0) {
      Break(ErrnoStatus("sending to a worker", err));
      return broken_;
    }
    if (w.fd >= 0) {
      close(w.fd);
      --outbox_fds_;
    }
    outbox_bytes_ -= w.bytes.size();
    outbox_.pop_front();
    progress_ = Clock::now();
  }
  if (watch_writable_) watch_writable_(fd_, false);
  return Status::Ok();
}

WorkerSession::Clock::duration WorkerSession::Stalled(Clock::time_point now) const {
  std::lock_guard lock(send_mu_);
  if (outbox_.empty()) return Clock::duration::zero();
  return now - progress_;
}

}  // namespace sparsync::intake
