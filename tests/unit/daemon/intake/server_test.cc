#include "daemon/intake/server.h"

#include <gtest/gtest.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

namespace sparsync::intake {
namespace {

// Records what the server hands over; accepts every worker and registers 64-byte regions.
class RecordingHandler : public IntakeHandler {
 public:
  void OnHello(const std::shared_ptr<WorkerSession>& s, const sparsync_hello& h,
               sparsync_hello_reply* reply) override {
    s->greeted = true;
    s->local_rank = h.local_rank;
    reply->status = SPARSYNC_OK;
    reply->rank = h.local_rank;
    reply->size = 2;
  }
  void OnRegister(const std::shared_ptr<WorkerSession>&, const sparsync_register_msg& m,
                  sparsync_register_reply* reply, std::shared_ptr<SharedRegion>* region) override {
    if (m.name[0] == 'x') {  // refused: a reply without a descriptor
      reply->status = SPARSYNC_ERR_INVALID;
      CopyMessage(reply->message, "refused for the test");
      return;
    }
    auto r = SharedRegion::Create("test", 64);
    std::memset((*r)->data(), 0x5a, 64);
    *region = *r;
    regions.push_back(*r);
    reply->status = SPARSYNC_OK;
    reply->region_bytes = 64;
  }
  Status OnReady(const std::shared_ptr<WorkerSession>&, const sparsync_ready& m) override {
    std::lock_guard lock(mu);
    ++readies;
    return m.tensor_id == 666 ? InvalidArgument("tensor 666 is cursed") : Status::Ok();
  }
  Status OnUnregister(const std::shared_ptr<WorkerSession>&, const sparsync_unregister_msg&) override {
    return Status::Ok();
  }
  void OnDisconnect(const std::shared_ptr<WorkerSession>&, const Status& reason) override {
    std::lock_guard lock(mu);
    disconnects.push_back(reason);
  }
  std::mutex mu;
  int readies = 0;
  std::vector<Status> disconnects;
  std::vector<std::shared_ptr<SharedRegion>> regions;
};

class IntakeServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sparsync-intake-XXXXXX";
    dir_ = mkdtemp(tmpl);
    path_ = dir_ + "/d.sock";
    server_ = std::make_unique<IntakeServer>(path_, 0, &handler_, std::chrono::seconds(2));
    ASSERT_TRUE(server_->Start().ok());
  }
  void TearDown() override {
    server_->Stop();
    EXPECT_FALSE(std::filesystem::exists(path_)) << "the socket file must be removed";
    std::filesystem::remove_all(dir_);
  }
  int Connect() {
    int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path_.c_str(), sizeof(addr.sun_path) - 1);
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    return fd;
  }
  // Receives one datagram (and an fd) within 2 s; returns its size, 0 on close, -1 on timeout.
  // Static: the open-file-limit test calls it with no descriptor free, and UBSan's check of a
  // member call on a polymorphic object needs a pipe to read the object's vtable.
  static ssize_t Recv(int fd, void* buf, size_t size, int* passed_fd = nullptr) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 2000) <= 0) return -1;
    iovec iov{buf, size};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t n = recvmsg(fd, &msg, 0);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    if (passed_fd && c && c->cmsg_type == SCM_RIGHTS) std::memcpy(passed_fd, CMSG_DATA(c), sizeof(int));
    return n;
  }
  // The handler hears of a disconnect just after the peer sees the close: wait for it.
  void WaitForDisconnects(size_t n) {
    for (int i = 0; i < 200; ++i) {
      {
        std::lock_guard lock(handler_.mu);
        if (handler_.disconnects.size() >= n) return;
      }
      usleep(10000);
    }
  }
  // Whether the server closes the connection, after at most a reply that says why (issue 16,
  // D12: a refused peer is told before the close).
  bool ClosedByServer(int fd) {
    char buf[4096];
    for (int replies = 0; replies < 4; ++replies) {
      ssize_t n = Recv(fd, buf, sizeof(buf));
      if (n <= 0) return n == 0;
    }
    return false;
  }
  void Hello(int fd, uint32_t local_rank) {
    sparsync_hello h{};
    FillHeader(&h.header, SPARSYNC_MSG_HELLO, sizeof(h));
    h.local_rank = local_rank;
    ASSERT_EQ(send(fd, &h, sizeof(h), 0), static_cast<ssize_t>(sizeof(h)));
    sparsync_hello_reply reply{};
    ASSERT_EQ(Recv(fd, &reply, sizeof(reply)), static_cast<ssize_t>(sizeof(reply)));
    ASSERT_EQ(reply.status, SPARSYNC_OK);
  }

  std::string dir_, path_;
  RecordingHandler handler_;
  std::unique_ptr<IntakeServer> server_;
};

TEST_F(IntakeServerTest, RefusesASecondDaemonOnTheSameSocket) {
  RecordingHandler other;
  IntakeServer second(path_, 1, &other, std::chrono::seconds(1));
  Status st = second.Start();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("another daemon"), std::string::npos);
}

TEST_F(IntakeServerTest, RegisterPassesAMappableRegion) {
  int fd = Connect();
  Hello(fd, 0);
  sparsync_register_msg r{};
  FillHeader(&r.header, SPARSYNC_MSG_REGISTER, sizeof(r));
  r.ndim = 1;
  r.shape[0] = 16;
  r.name_len = 1;
  r.name[0] = 'w';
  ASSERT_EQ(send(fd, &r, sizeof(r), 0), static_cast<ssize_t>(sizeof(r)));
  sparsync_register_reply reply{};
  int region_fd = -1;
  ASSERT_EQ(Recv(fd, &reply, sizeof(reply), &region_fd), static_cast<ssize_t>(sizeof(reply)));
  ASSERT_EQ(reply.status, SPARSYNC_OK);
  ASSERT_GE(region_fd, 0);
  void* p = mmap(nullptr, 64, PROT_READ | PROT_WRITE, MAP_SHARED, region_fd, 0);
  ASSERT_NE(p, MAP_FAILED);
  EXPECT_EQ(static_cast<unsigned char*>(p)[63], 0x5a);
  static_cast<unsigned char*>(p)[0] = 0x11;  // the daemon sees the worker's writes
  EXPECT_EQ(static_cast<unsigned char*>(handler_.regions.back()->data())[0], 0x11);
  munmap(p, 64);
  close(region_fd);
  close(fd);
}

TEST_F(IntakeServerTest, MalformedMessagesCloseOnlyTheirConnection) {
  int good = Connect();
  Hello(good, 0);
  // Garbage before the handshake, a READY before HELLO, an oversized datagram, a wrong version.
  std::vector<std::vector<char>> bad;
  bad.push_back(std::vector<char>(3, 'x'));
  {
    sparsync_ready m{};
    FillHeader(&m.header, SPARSYNC_MSG_READY, sizeof(m));
    m.round = 1;
    bad.emplace_back(reinterpret_cast<char*>(&m), reinterpret_cast<char*>(&m) + sizeof(m));
  }
  bad.push_back(std::vector<char>(SPARSYNC_MAX_MESSAGE_BYTES + 100, 0));
  {
    sparsync_hello h{};
    FillHeader(&h.header, SPARSYNC_MSG_HELLO, sizeof(h));
    h.header.version = 77;
    bad.emplace_back(reinterpret_cast<char*>(&h), reinterpret_cast<char*>(&h) + sizeof(h));
  }
  for (const auto& b : bad) {
    int fd = Connect();
    ASSERT_EQ(send(fd, b.data(), b.size(), 0), static_cast<ssize_t>(b.size()));
    EXPECT_TRUE(ClosedByServer(fd));
    close(fd);
  }
  // A greeted worker that breaks the protocol is closed, and the handler hears why.
  int rude = Connect();
  Hello(rude, 1);
  sparsync_ready cursed{};
  FillHeader(&cursed.header, SPARSYNC_MSG_READY, sizeof(cursed));
  cursed.tensor_id = 666;
  cursed.round = 1;
  send(rude, &cursed, sizeof(cursed), 0);
  EXPECT_TRUE(ClosedByServer(rude));
  close(rude);
  // The first worker is undisturbed.
  sparsync_ready fine = cursed;
  fine.tensor_id = 1;
  ASSERT_EQ(send(good, &fine, sizeof(fine), 0), static_cast<ssize_t>(sizeof(fine)));
  sparsync_goodbye bye{};
  FillHeader(&bye.header, SPARSYNC_MSG_GOODBYE, sizeof(bye));
  send(good, &bye, sizeof(bye), 0);
  EXPECT_TRUE(ClosedByServer(good));
  close(good);
  WaitForDisconnects(2);
  std::lock_guard lock(handler_.mu);
  EXPECT_EQ(handler_.readies, 2);
  ASSERT_EQ(handler_.disconnects.size(), 2u);
  EXPECT_NE(handler_.disconnects[0].message().find("cursed"), std::string::npos);
  EXPECT_TRUE(handler_.disconnects[1].ok()) << "GOODBYE is a clean disconnect";
}

TEST_F(IntakeServerTest, DisconnectWithoutGoodbyeIsReported) {
  int fd = Connect();
  Hello(fd, 0);
  close(fd);
  WaitForDisconnects(1);
  std::lock_guard lock(handler_.mu);
  ASSERT_EQ(handler_.disconnects.size(), 1u);
  EXPECT_NE(handler_.disconnects[0].message().find("without saying goodbye"), std::string::npos);
}

// ---- Hardening (issue 16) ----

sparsync_register_msg Register(uint32_t tensor_id, char name) {
  sparsync_register_msg r{};
  FillHeader(&r.header, SPARSYNC_MSG_REGISTER, sizeof(r));
  r.tensor_id = tensor_id;
  r.ndim = 1;
  r.shape[0] = 16;
  r.name_len = 1;
  r.name[0] = name;
  return r;
}

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// D1: a directory others can enter, or that is not ours, is refused with its name.
TEST_F(IntakeServerTest, RefusesASocketDirectoryOthersCanWrite) {
  const std::string open_dir = dir_ + "/open";
  ASSERT_EQ(mkdir(open_dir.c_str(), 0777), 0);
  ASSERT_EQ(chmod(open_dir.c_str(), 0777), 0);
  RecordingHandler other;
  IntakeServer server(open_dir + "/d.sock", 1, &other, std::chrono::seconds(1));
  Status st = server.Start();
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(Contains(st.message(), open_dir)) << st.message();
  EXPECT_TRUE(Contains(st.message(), "0777")) << st.message();
  EXPECT_FALSE(std::filesystem::exists(open_dir + "/d.sock"));
}

TEST_F(IntakeServerTest, RefusesASocketDirectoryThatIsALink) {
  const std::string link = dir_ + "/link";
  ASSERT_EQ(symlink(dir_.c_str(), link.c_str()), 0);
  RecordingHandler other;
  IntakeServer server(link + "/e.sock", 1, &other, std::chrono::seconds(1));
  Status st = server.Start();
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(Contains(st.message(), "symbolic link")) << st.message();
}

TEST_F(IntakeServerTest, RefusesASocketDirectoryOfAnotherUser) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to give a directory to another user";
  const std::string theirs = dir_ + "/theirs";
  ASSERT_EQ(mkdir(theirs.c_str(), 0700), 0);
  ASSERT_EQ(chown(theirs.c_str(), 65534, 65534), 0);
  RecordingHandler other;
  IntakeServer server(theirs + "/d.sock", 1, &other, std::chrono::seconds(1));
  Status st = server.Start();
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(Contains(st.message(), "belongs to")) << st.message();
}

TEST_F(IntakeServerTest, CreatesAMissingSocketDirectoryPrivate) {
  const std::string fresh = dir_ + "/fresh";
  RecordingHandler other;
  IntakeServer server(fresh + "/d.sock", 1, &other, std::chrono::seconds(1));
  ASSERT_TRUE(server.Start().ok());
  struct stat st {};
  ASSERT_EQ(stat(fresh.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  server.Stop();
}

// D7: whatever is not a socket stays where it is.
TEST_F(IntakeServerTest, NeverRemovesAFileThatIsNotASocket) {
  const std::string file = dir_ + "/precious.txt";
  std::ofstream(file) << "keep me";
  RecordingHandler other;
  IntakeServer server(file, 1, &other, std::chrono::seconds(1));
  Status st = server.Start();
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(Contains(st.message(), "not a socket")) << st.message();
  std::ifstream in(file);
  std::string text;
  std::getline(in, text);
  EXPECT_EQ(text, "keep me");
}

// The token the workers read when their environment has none: 0600, removed on Stop.
TEST_F(IntakeServerTest, LeavesThePrivateTokenFileForWorkers) {
  const std::string path = dir_ + "/t.sock";
  RecordingHandler other;
  auto server = std::make_unique<IntakeServer>(path, 1, &other, std::chrono::seconds(1), "abc");
  ASSERT_TRUE(server->Start().ok());
  struct stat st {};
  ASSERT_EQ(stat((path + ".token").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  std::ifstream in(path + ".token");
  std::string token;
  in >> token;
  EXPECT_EQ(token, "abc");
  server->Stop();
  EXPECT_FALSE(std::filesystem::exists(path + ".token"));
}

// D12: a refused HELLO and a refused REGISTER say why.
TEST_F(IntakeServerTest, AWrongVersionHelloIsAnsweredWithTheReason) {
  int fd = Connect();
  sparsync_hello h{};
  FillHeader(&h.header, SPARSYNC_MSG_HELLO, sizeof(h));
  h.header.version = 2;
  ASSERT_EQ(send(fd, &h, sizeof(h), 0), static_cast<ssize_t>(sizeof(h)));
  sparsync_hello_reply reply{};
  ASSERT_EQ(Recv(fd, &reply, sizeof(reply)), static_cast<ssize_t>(sizeof(reply)));
  EXPECT_EQ(reply.status, SPARSYNC_ERR_PERMISSION);
  EXPECT_TRUE(Contains(reply.message, "version 2")) << reply.message;
  EXPECT_TRUE(ClosedByServer(fd));
  close(fd);
}

TEST_F(IntakeServerTest, TheReservedHelloFieldIsChecked) {
  int fd = Connect();
  sparsync_hello h{};
  FillHeader(&h.header, SPARSYNC_MSG_HELLO, sizeof(h));
  h.reserved = 1;
  ASSERT_EQ(send(fd, &h, sizeof(h), 0), static_cast<ssize_t>(sizeof(h)));
  sparsync_hello_reply reply{};
  ASSERT_EQ(Recv(fd, &reply, sizeof(reply)), static_cast<ssize_t>(sizeof(reply)));
  EXPECT_EQ(reply.status, SPARSYNC_ERR_INVALID);
  EXPECT_TRUE(Contains(reply.message, "reserved")) << reply.message;
  EXPECT_TRUE(ClosedByServer(fd));
  close(fd);
}

TEST_F(IntakeServerTest, AMalformedRegisterIsRefusedAndTheConnectionStays) {
  int fd = Connect();
  Hello(fd, 0);
  sparsync_register_msg bad = Register(7, 'w');
  bad.dtype = 99;
  ASSERT_EQ(send(fd, &bad, sizeof(bad), 0), static_cast<ssize_t>(sizeof(bad)));
  sparsync_register_reply reply{};
  ASSERT_EQ(Recv(fd, &reply, sizeof(reply)), static_cast<ssize_t>(sizeof(reply)));
  EXPECT_EQ(reply.tensor_id, 7u);
  EXPECT_EQ(reply.status, SPARSYNC_ERR_INVALID);
  EXPECT_TRUE(Contains(reply.message, "unknown dtype 99")) << reply.message;
  sparsync_register_msg good = Register(8, 'w');
  ASSERT_EQ(send(fd, &good, sizeof(good), 0), static_cast<ssize_t>(sizeof(good)));
  int region_fd = -1;
  ASSERT_EQ(Recv(fd, &reply, sizeof(reply), &region_fd), static_cast<ssize_t>(sizeof(reply)));
  EXPECT_EQ(reply.status, SPARSYNC_OK);
  if (region_fd >= 0) close(region_fd);
  close(fd);
}

// D6: a worker that stops reading holds up nobody, and is closed at the stall limit (2 s here).
TEST_F(IntakeServerTest, AWorkerThatDoesNotReadStallsNobody) {
  int deaf = Connect();
  Hello(deaf, 0);
  // Refused registrations: replies without descriptors, more than the socket buffer holds.
  for (uint32_t i = 0; i < 2000; ++i) {
    sparsync_register_msg r = Register(i, 'x');
    ASSERT_EQ(send(deaf, &r, sizeof(r), 0), static_cast<ssize_t>(sizeof(r)));
  }
  int other = Connect();
  const auto start = std::chrono::steady_clock::now();
  Hello(other, 1);
  sparsync_register_msg r = Register(1, 'w');
  ASSERT_EQ(send(other, &r, sizeof(r), 0), static_cast<ssize_t>(sizeof(r)));
  sparsync_register_reply reply{};
  int region_fd = -1;
  ASSERT_EQ(Recv(other, &reply, sizeof(reply), &region_fd), static_cast<ssize_t>(sizeof(reply)));
  EXPECT_EQ(reply.status, SPARSYNC_OK);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(500));
  if (region_fd >= 0) close(region_fd);
  WaitForDisconnects(1);  // up to 2 s
  for (int i = 0; i < 100; ++i) {
    {
      std::lock_guard lock(handler_.mu);
      if (!handler_.disconnects.empty()) break;
    }
    usleep(50000);
  }
  {
    std::lock_guard lock(handler_.mu);
    ASSERT_EQ(handler_.disconnects.size(), 1u) << "the worker that does not read is closed";
    EXPECT_TRUE(Contains(handler_.disconnects[0].message(), "has not read"))
        << handler_.disconnects[0].message();
  }
  close(deaf);
  close(other);
}

// D5: at the open-file limit a connection is answered with the reason, and the loop idles.
TEST_F(IntakeServerTest, AtTheOpenFileLimitConnectionsHearWhy) {
  // Sockets made first: connecting them needs no descriptor of this process.
  int first = socket(AF_UNIX, SOCK_SEQPACKET, 0);
  int second = socket(AF_UNIX, SOCK_SEQPACKET, 0);
  ASSERT_GE(first, 0);
  ASSERT_GE(second, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path_.c_str(), sizeof(addr.sun_path) - 1);
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  rlimit low = saved;
  low.rlim_cur = std::min<rlim_t>(saved.rlim_cur, 512);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  // Use up every descriptor this process may have.
  std::vector<int> hogs;
  for (int fd; (fd = open("/dev/null", O_RDONLY)) >= 0;) hogs.push_back(fd);
  const int exhausted = errno;
  const bool first_connected = connect(first, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  sparsync_hello_reply reply{};
  ssize_t n = Recv(first, &reply, sizeof(reply));
  const bool second_connected =
      connect(second, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  sparsync_hello_reply second_reply{};
  ssize_t second_n = Recv(second, &second_reply, sizeof(second_reply));
  // The loop must not spin while the limit lasts.
  timespec cpu0{}, cpu1{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu0);
  usleep(500000);
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu1);
  for (int fd : hogs) close(fd);
  setrlimit(RLIMIT_NOFILE, &saved);
  const double cpu_s = (cpu1.tv_sec - cpu0.tv_sec) + (cpu1.tv_nsec - cpu0.tv_nsec) * 1e-9;
  EXPECT_EQ(exhausted, EMFILE);
  EXPECT_TRUE(first_connected && second_connected);
  ASSERT_EQ(n, static_cast<ssize_t>(sizeof(reply))) << "no reply at the open-file limit";
  EXPECT_EQ(reply.status, SPARSYNC_ERR_UNAVAILABLE);
  EXPECT_TRUE(Contains(reply.message, "no free file descriptor")) << reply.message;
  EXPECT_EQ(second_n, static_cast<ssize_t>(sizeof(second_reply)));
  EXPECT_EQ(second_reply.status, SPARSYNC_ERR_UNAVAILABLE);
  EXPECT_LT(cpu_s, 0.2) << "the intake loop spins";
  close(first);
  close(second);
  // With descriptors again, workers are served.
  int fd = Connect();
  Hello(fd, 0);
  close(fd);
}

// D11: connections refused before their handshake do not flood the log.
TEST_F(IntakeServerTest, RefusedConnectionsAreLoggedAtALimitedRate) {
  std::ostringstream log;
  // The default logger is swapped only while no server thread runs (spdlog's free functions use
  // it without a lock).
  server_->Stop();
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>(
      "capture", std::make_shared<spdlog::sinks::ostream_sink_mt>(log)));
  server_ = std::make_unique<IntakeServer>(path_, 0, &handler_, std::chrono::seconds(2));
  ASSERT_TRUE(server_->Start().ok());
  for (int i = 0; i < 300; ++i) {
    int fd = Connect();
    char junk[3] = {'x', 'y', 'z'};
    send(fd, junk, sizeof(junk), 0);
    EXPECT_TRUE(ClosedByServer(fd));
    close(fd);
  }
  server_->Stop();
  spdlog::set_default_logger(previous);
  int lines = 0;
  std::istringstream in(log.str());
  for (std::string line; std::getline(in, line);) {
    if (Contains(line, "before its handshake")) ++lines;
  }
  EXPECT_GE(lines, 1);
  EXPECT_LE(lines, 10) << log.str().substr(0, 2000);
}

}  // namespace
}  // namespace sparsync::intake
