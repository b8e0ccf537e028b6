#include "daemon/intake/server.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "daemon/common/job_token.h"
#include "daemon/common/private_files.h"
#include "daemon/common/thread_name.h"
#include "daemon/intake/done.h"

namespace sparsync::intake {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kAcceptPause = std::chrono::seconds(1);
// A worker sends HELLO right after connecting; a connection silent for this long is closed.
constexpr auto kHandshakeLimit = std::chrono::seconds(10);

sockaddr_un Address(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  return addr;
}

// " (N more like it since the last such line)" when lines were held back.
std::string HeldBack(uint64_t n) {
  return n == 0 ? std::string() : " (" + std::to_string(n) + " more since the last such line)";
}

std::string OpenFileLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return "its limit";
  return "its limit of " + std::to_string(limit.rlim_cur);
}

// A socket file may be left from a daemon that died; anything else at the path is left alone.
Status CheckSocketPath(const std::string& path) {
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) return Status::Ok();
  if (!S_ISSOCK(st.st_mode)) {
    return InvalidArgument("SPARSYNC_SOCKET=" + path +
                           " exists and is not a socket: not removing it; choose another path");
  }
  sockaddr_un addr = Address(path);
  int probe = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (probe < 0) return ErrnoStatus("socket", errno);
  bool alive = connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(probe);
  if (alive) {
    return Unavailable("another daemon is serving SPARSYNC_SOCKET=" + path +
                       "; stop it or choose another path");
  }
  return Status::Ok();
}

}  // namespace

IntakeServer::IntakeServer(std::string socket_path, int node_rank, IntakeHandler* handler,
                           std::chrono::milliseconds stall_limit, std::string worker_token)
    : socket_path_(std::move(socket_path)),
      node_rank_(node_rank),
      handler_(handler),
      stall_limit_(stall_limit),
      worker_token_(std::move(worker_token)) {}

IntakeServer::~IntakeServer() { Stop(); }

Status IntakeServer::Bind() {
  if (socket_path_.size() >= sizeof(sockaddr_un::sun_path)) {
    return InvalidArgument("SPARSYNC_SOCKET path is too long for a Unix socket: " + socket_path_);
  }
  std::string dir = std::filesystem::path(socket_path_).parent_path().string();
  SPARSYNC_RETURN_IF_ERROR(
      EnsurePrivateDirectory(dir.empty() ? "." : dir, "the directory of SPARSYNC_SOCKET"));
  SPARSYNC_RETURN_IF_ERROR(CheckSocketPath(socket_path_));
  // Create the socket under a temporary name and rename it: the path appears only when the
  // daemon accepts workers, and the token file is there before it.
  std::string tmp = socket_path_ + ".tmp" + std::to_string(getpid());
  if (tmp.size() >= sizeof(sockaddr_un::sun_path)) tmp = socket_path_;
  SPARSYNC_RETURN_IF_ERROR(CheckSocketPath(tmp));
  if (!worker_token_.empty()) {
    SPARSYNC_RETURN_IF_ERROR(WritePrivateFile(WorkerTokenPath(socket_path_), worker_token_));
    wrote_token_ = true;
  }
  unlink(socket_path_.c_str());
  unlink(tmp.c_str());
  listen_fd_ = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (listen_fd_ < 0) return ErrnoStatus("socket", errno);
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
  return Status::Ok();
}

Status IntakeServer::Start() {
  SPARSYNC_RETURN_IF_ERROR(Bind());
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  spare_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (epoll_fd_ < 0 || wake_fd_ < 0 || spare_fd_ < 0) return ErrnoStatus("epoll/eventfd", errno);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = listen_fd_;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev);
  ev.data.fd = wake_fd_;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  thread_ = std::thread([this] {
    NameThisThread("ssd-intake");
    while (!stopping_) RunOnce(std::chrono::milliseconds(1000));
  });
  spdlog::info("accepting workers on {}", socket_path_);
  return Status::Ok();
}

void IntakeServer::Stop(const Status& why) {
  if (stopping_.exchange(true)) return;
  if (wake_fd_ >= 0) {
    uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
  }
  if (thread_.joinable()) thread_.join();
  std::vector<int> fds;
  for (auto& [fd, s] : sessions_) {
    // A worker between two posts would otherwise learn only that the connection broke.
    if (s->greeted) (void)SendDone(*s, /*tensor_id=*/0, /*round=*/0, why);
    fds.push_back(fd);
  }
  for (int fd : fds) Close(fd, why);
  if (listen_fd_ >= 0) {
    close(listen_fd_);
    unlink(socket_path_.c_str());
    listen_fd_ = -1;
  }
  if (wrote_token_) RemovePrivateFile(WorkerTokenPath(socket_path_));
  wrote_token_ = false;
  for (int* fd : {&epoll_fd_, &wake_fd_, &spare_fd_}) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
  }
}

void IntakeServer::RunOnce(std::chrono::milliseconds timeout) {
  epoll_event events[64];
  int n = epoll_wait(epoll_fd_, events, 64, static_cast<int>(timeout.count()));
  for (int i = 0; i < n && !stopping_; ++i) {
    int fd = events[i].data.fd;
    if (fd == listen_fd_) {
      Accept();
    } else if (fd != wake_fd_) {
      if (events[i].events & EPOLLOUT) {
        auto it = sessions_.find(fd);
        Status flushed = it == sessions_.end() ? Status::Ok() : it->second->Flush();
        if (!flushed.ok()) Close(fd, flushed);
      }
      if (events[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) HandleReadable(fd);
    }
  }
  if (paused_until_ && Clock::now() >= *paused_until_) {
    paused_until_.reset();
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = listen_fd_;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev);
  }
  CloseStalled();
}

void IntakeServer::Watch(int fd, bool writable) {
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP | (writable ? EPOLLOUT : 0u);
  ev.data.fd = fd;
  epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, fd, &ev);  // ENOENT once the connection is closed: fine
}

void IntakeServer::Accept() {
  while (true) {
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      if (err == EAGAIN || err == EWOULDBLOCK || err == EINTR) return;
      if (err == ECONNABORTED) continue;
      if ((err == EMFILE || err == ENFILE) && RefuseForLackOfDescriptors()) continue;
      uint64_t held = 0;
      if (accept_log_.Allow(&held)) {
        spdlog::warn("accept on {}: {}; not accepting for {} s{}", socket_path_,
                     std::strerror(err), kAcceptPause.count(), HeldBack(held));
      }
      PauseAccepting();
      return;
    }
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.fd = fd;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
    sessions_[fd] = std::make_shared<WorkerSession>(
        fd, [this](int session_fd, bool writable) { Watch(session_fd, writable); });
  }
}

bool IntakeServer::RefuseForLackOfDescriptors() {
  if (spare_fd_ < 0) return false;
  close(spare_fd_);
  spare_fd_ = -1;
  int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
  const std::string why = "sparsyncd of node " + std::to_string(node_rank_) +
                          " has no free file descriptor (" + OpenFileLimit() +
                          ", RLIMIT_NOFILE): raise it (ulimit -n) or run fewer workers";
  if (fd >= 0) {
    sparsync_hello_reply reply{};
    FillHeader(&reply.header, SPARSYNC_MSG_HELLO_REPLY, sizeof(reply));
    reply.status = SPARSYNC_ERR_UNAVAILABLE;
    CopyMessage(reply.message, why);
    (void)!send(fd, &reply, sizeof(reply), MSG_NOSIGNAL | MSG_DONTWAIT);
    char drain[sizeof(sparsync_hello)];  // an unread HELLO would turn the close into a reset
    (void)!recv(fd, drain, sizeof(drain), MSG_DONTWAIT);
    close(fd);
    uint64_t held = 0;
    if (accept_log_.Allow(&held)) {
      spdlog::warn("refused a connection: {}{}", why, HeldBack(held));
    }
  }
  spare_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
  return fd >= 0;
}

void IntakeServer::PauseAccepting() {
  // Level-triggered epoll would report the waiting connection again at once: stop listening
  // for a moment instead of spinning.
  if (paused_until_) return;
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
  paused_until_ = Clock::now() + kAcceptPause;
}

void IntakeServer::CloseStalled() {
  const auto now = Clock::now();
  std::vector<int> stalled, silent;
  for (const auto& [fd, session] : sessions_) {
    if (session->Stalled(now) > stall_limit_) stalled.push_back(fd);
    if (!session->greeted && now - session->accepted_at > kHandshakeLimit) silent.push_back(fd);
  }
  for (int fd : stalled) {
    Close(fd, Unavailable("it has not read the daemon's messages for " +
                          std::to_string(stall_limit_.count() / 1000) +
                          " s (SPARSYNC_TIMEOUT_S): closing its connection"));
  }
  for (int fd : silent) {
    Close(fd, Unavailable("no HELLO within " + std::to_string(kHandshakeLimit.count()) + " s"));
  }
}

void IntakeHandler::OnTimeline(const std::shared_ptr<WorkerSession>&,
                               const sparsync_timeline_msg&, sparsync_timeline_reply* reply) {
  reply->status = SPARSYNC_ERR_UNAVAILABLE;
  CopyMessage(reply->message, "this daemon records no timeline");
}

Status IntakeHandler::OnJoin(const std::shared_ptr<WorkerSession>&) {
  return InvalidArgument("this daemon takes no JOIN");
}

void IntakeServer::Close(int fd, const Status& reason) {
  auto it = sessions_.find(fd);
  if (it == sessions_.end()) return;
  std::shared_ptr<WorkerSession> session = it->second;
  sessions_.erase(it);
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  // A session that gave up on a worker that does not read says so better than the close does.
  const Status own = session->shutdown_reason();
  const Status why = own.ok() || reason.ok() ? reason : own;
  session->Shutdown();
  if (!why.ok() && session->greeted) {
    spdlog::warn("closing the connection of {}: {}", session->Describe(node_rank_), why.message());
  } else if (!why.ok() && why.code() == StatusCode::kUnavailable) {
    // Connected and left (or stayed silent) before saying anything: another daemon probing the
    // socket at start-up, or a stray program.
    spdlog::debug("a connection closed before its handshake: {}", why.message());
  } else if (!why.ok()) {
    // Refused before the handshake (a wrong token, another program): can repeat without bound.
    uint64_t held = 0;
    if (refused_log_.Allow(&held)) {
      spdlog::warn("refused a connection before its handshake: {}{}", why.message(),
                   HeldBack(held));
    }
  }
  if (session->greeted) handler_->OnDisconnect(session, why);
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
  HandleMessage(fd, session, buf, static_cast<size_t>(n), num_fds);
}

void IntakeServer::Reject(int fd, const std::shared_ptr<WorkerSession>& session, const char* buf,
                          size_t n, const Status& error) {
  const Claim claim = ClaimOf(buf, n);
  if (claim.type == SPARSYNC_MSG_REGISTER && session->greeted) {
    // The framing is intact: refuse this registration and keep the connection.
    sparsync_register_reply reply{};
    FillHeader(&reply.header, SPARSYNC_MSG_REGISTER_REPLY, sizeof(reply));
    reply.tensor_id = claim.tensor_id;
    reply.status = WireStatus(error);
    CopyMessage(reply.message, "sparsyncd refused the registration: " + error.message());
    Status sent = session->Send(&reply, sizeof(reply));
    if (!sent.ok()) Close(fd, sent);
    return;
  }
  if (claim.type == SPARSYNC_MSG_HELLO && !session->greeted) {
    sparsync_hello_reply reply{};
    FillHeader(&reply.header, SPARSYNC_MSG_HELLO_REPLY, sizeof(reply));
    reply.status = WireStatus(error);
    CopyMessage(reply.message, error.message());
    (void)session->Send(&reply, sizeof(reply));
  }
  Close(fd, error.WithContext("protocol violation"));
}

void IntakeServer::HandleMessage(int fd, const std::shared_ptr<WorkerSession>& session,
                                 const char* buf, size_t n, int num_fds) {
  auto decoded = Decode(buf, n, num_fds);
  if (!decoded.ok()) return Reject(fd, session, buf, n, decoded.status());
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
  if (std::holds_alternative<sparsync_join_msg>(m)) {
    Status st = handler_->OnJoin(session);
    if (!st.ok()) Close(fd, st.WithContext("protocol violation"));
    return;
  }
  if (std::holds_alternative<sparsync_goodbye>(m)) {
    session->said_goodbye = true;
    Close(fd, Status::Ok());
  }
}

}  // namespace sparsync::intake
