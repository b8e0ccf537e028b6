#include "daemon/intake/server.h"

#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace sparsync::intake {
namespace {

Status MakeParentDir(const std::string& path) {
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (parent.empty()) return Status::Ok();
  std::error_code ec;
  if (std::filesystem::exists(parent, ec)) return Status::Ok();
  std::filesystem::create_directories(parent, ec);
  if (ec) return Unavailable("cannot create " + parent.string() + ": " + ec.message());
  chmod(parent.c_str(), 0700);
  return Status::Ok();
}

sockaddr_un Address(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  return addr;
}

}  // namespace

IntakeServer::IntakeServer(std::string socket_path, int node_rank, IntakeHandler* handler,
                           std::chrono::milliseconds send_timeout)
    : socket_path_(std::move(socket_path)),
      node_rank_(node_rank),
      handler_(handler),
      send_timeout_(send_timeout) {}

IntakeServer::~IntakeServer() { Stop(); }

Status IntakeServer::Start() {
  if (socket_path_.size() >= sizeof(sockaddr_un::sun_path)) {
    return InvalidArgument("SPARSYNC_SOCKET path is too long for a Unix socket: " + socket_path_);
  }
  SPARSYNC_RETURN_IF_ERROR(MakeParentDir(socket_path_));
  sockaddr_un addr = Address(socket_path_);
  // A socket file may be left from a daemon that died; refuse only if someone still answers.
  int probe = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (probe >= 0) {
    bool alive = connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    close(probe);
    if (alive) {
      return Unavailable("another daemon is serving SPARSYNC_SOCKET=" + socket_path_ +
                         "; stop it or choose another path");
    }
  }
  unlink(socket_path_.c_str());
  listen_fd_ = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (listen_fd_ < 0) return ErrnoStatus("socket", errno);
  // Create the socket under a temporary name and rename it: the path appears only when the
  // daemon accepts workers.
  std::string tmp = socket_path_ + ".tmp" + std::to_string(getpid());
  if (tmp.size() >= sizeof(addr.sun_path)) tmp = socket_path_;
  unlink(tmp.c_str());
  sockaddr_un tmp_addr = Address(tmp);
  if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&tmp_addr), sizeof(tmp_addr)) != 0) {
    return ErrnoStatus("binding SPARSYNC_SOCKET=" + socket_path_, errno);
  }
  chmod(tmp.c_str(), 0600);
  if (listen(listen_fd_, 128) != 0) return ErrnoStatus("listen on " + socket_path_, errno);
  if (tmp != socket_path_ && rename(tmp.c_str(), socket_path_.c_str()) != 0) {
    int err = errno;
    unlink(tmp.c_str());
    return ErrnoStatus("renaming the socket to " + socket_path_, err);
  }
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (epoll_fd_ < 0 || wake_fd_ < 0) return ErrnoStatus("epoll/eventfd", errno);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = listen_fd_;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev);
  ev.data.fd = wake_fd_;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  thread_ = std::thread([this] {
    while (!stopping_) RunOnce(std::chrono::milliseconds(1000));
  });
  spdlog::info("accepting workers on {}", socket_path_);
  return Status::Ok();
}

void IntakeServer::Stop() {
  if (stopping_.exchange(true)) return;
  if (wake_fd_ >= 0) {
    uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
  }
  if (thread_.joinable()) thread_.join();
  std::vector<int> fds;
  for (auto& [fd, s] : sessions_) fds.push_back(fd);
  for (int fd : fds) Close(fd, Aborted("the daemon is shutting down"));
  if (listen_fd_ >= 0) {
    close(listen_fd_);
    unlink(socket_path_.c_str());
    listen_fd_ = -1;
  }
  if (epoll_fd_ >= 0) close(epoll_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
  epoll_fd_ = wake_fd_ = -1;
}

void IntakeServer::RunOnce(std::chrono::milliseconds timeout) {
  epoll_event events[64];
  int n = epoll_wait(epoll_fd_, events, 64, static_cast<int>(timeout.count()));
  for (int i = 0; i < n && !stopping_; ++i) {
    int fd = events[i].data.fd;
    if (fd == listen_fd_) {
      Accept();
    } else if (fd != wake_fd_) {
      HandleReadable(fd);
    }
  }
}

void IntakeServer::Accept() {
  while (true) {
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      uint64_t held_back = 0;
      if (err != EAGAIN && err != EWOULDBLOCK && err != EINTR && accept_log_.Allow(&held_back)) {
        spdlog::warn("accept on {}: {} ({} more since the last)", socket_path_, std::strerror(err),
                     held_back);
      }
      return;
    }
    timeval tv{};
    tv.tv_sec = send_timeout_.count() / 1000;
    tv.tv_usec = (send_timeout_.count() % 1000) * 1000;
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.fd = fd;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
    sessions_[fd] = std::make_shared<WorkerSession>(fd);
  }
}

void IntakeHandler::OnTimeline(const std::shared_ptr<WorkerSession>&,
                               const sparsync_timeline_msg&, sparsync_timeline_reply* reply) {
  reply->status = SPARSYNC_ERR_UNAVAILABLE;
  CopyMessage(reply->message, "this daemon records no timeline");
}

void IntakeServer::Close(int fd, const Status& reason) {
  auto it = sessions_.find(fd);
  if (it == sessions_.end()) return;
  std::shared_ptr<WorkerSession> session = it->second;
  sessions_.erase(it);
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  session->Shutdown();
  if (!reason.ok() && session->greeted) {
    spdlog::warn("closing the connection of {}: {}", session->Describe(node_rank_), reason.message());
  } else if (!reason.ok() && reason.code() == StatusCode::kUnavailable) {
    // Connected and left before saying anything: another daemon probing the socket at start-up.
    spdlog::debug("a connection closed before its handshake: {}", reason.message());
  } else if (!reason.ok()) {
    // Refused before the handshake (a wrong token, another program): can repeat without bound.
    uint64_t held_back = 0;
    if (refused_log_.Allow(&held_back)) {
      spdlog::warn("refused a connection before its handshake: {}{}", reason.message(),
                   held_back ? " (and " + std::to_string(held_back) + " more since the last)" : "");
    }
  }
  if (session->greeted) handler_->OnDisconnect(session, reason);
}

void IntakeServer::HandleReadable(int fd) {
  auto it = sessions_.find(fd);
  if (it == sessions_.end()) return;
  std::shared_ptr<WorkerSession> session = it->second;

  alignas(8) char buf[SPARSYNC_MAX_MESSAGE_BYTES + 1];
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 8)];
  iovec iov{buf, sizeof(buf)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n = recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (n < 0) {
    // A worker that dies with unread messages resets the connection instead of closing it.
    Close(fd, ErrnoStatus(session->Describe(node_rank_) +
                              " disconnected without saying goodbye (it crashed or was killed)",
                          errno));
    return;
  }
  // Close any descriptor a misbehaving peer attached.
  int num_fds = 0;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      int count = static_cast<int>((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
      for (int i = 0; i < count; ++i) {
        int passed;
        std::memcpy(&passed, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        close(passed);
      }
      num_fds += count;
    }
  }
  if (n == 0) {
    Close(fd, session->said_goodbye
                  ? Status::Ok()
                  : Unavailable(session->Describe(node_rank_) +
                                " disconnected without saying goodbye (it crashed or was killed)"));
    return;
  }
  if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
    Close(fd, InvalidArgument("message larger than " + std::to_string(SPARSYNC_MAX_MESSAGE_BYTES) +
                              " bytes"));
    return;
  }
  auto decoded = Decode(buf, static_cast<size_t>(n), num_fds);
  if (!decoded.ok()) {
    Close(fd, decoded.status().WithContext("protocol violation"));
    return;
  }
  Message& m = *decoded;
  if (!session->greeted && !std::holds_alternative<sparsync_hello>(m)) {
    Close(fd, InvalidArgument("protocol violation: the first message must be HELLO"));
    return;
  }
  if (auto* hello = std::get_if<sparsync_hello>(&m)) {
    if (session->greeted) {
      Close(fd, InvalidArgument("protocol violation: a second HELLO"));
      return;
    }
    sparsync_hello_reply reply{};
    FillHeader(&reply.header, SPARSYNC_MSG_HELLO_REPLY, sizeof(reply));
    handler_->OnHello(session, *hello, &reply);
    Status sent = session->Send(&reply, sizeof(reply));
    if (reply.status != SPARSYNC_OK || !sent.ok()) {
      Close(fd, Status(StatusCode::kPermissionDenied, reply.message));
    }
    return;
  }
  if (auto* reg = std::get_if<sparsync_register_msg>(&m)) {
    sparsync_register_reply reply{};
    FillHeader(&reply.header, SPARSYNC_MSG_REGISTER_REPLY, sizeof(reply));
    reply.tensor_id = reg->tensor_id;
    std::shared_ptr<SharedRegion> region;
    handler_->OnRegister(session, *reg, &reply, &region);
    Status sent = session->Send(&reply, sizeof(reply), region ? region->fd() : -1);
    if (region) region->ReleaseFd();
    if (!sent.ok()) Close(fd, sent);
    return;
  }
  if (auto* ready = std::get_if<sparsync_ready>(&m)) {
    Status st = handler_->OnReady(session, *ready);
    if (!st.ok()) Close(fd, st.WithContext("protocol violation"));
    return;
  }
  if (auto* unreg = std::get_if<sparsync_unregister_msg>(&m)) {
    Status st = handler_->OnUnregister(session, *unreg);
    if (!st.ok()) Close(fd, st.WithContext("protocol violation"));
    return;
  }
  if (auto* timeline = std::get_if<sparsync_timeline_msg>(&m)) {
    sparsync_timeline_reply reply{};
    FillHeader(&reply.header, SPARSYNC_MSG_TIMELINE_REPLY, sizeof(reply));
    handler_->OnTimeline(session, *timeline, &reply);
    Status sent = session->Send(&reply, sizeof(reply));
    if (!sent.ok()) Close(fd, sent);
    return;
  }
  if (std::holds_alternative<sparsync_goodbye>(m)) {
    session->said_goodbye = true;
    Close(fd, Status::Ok());
  }
}

}  // namespace sparsync::intake
