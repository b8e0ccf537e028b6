#include "daemon/intake/server.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>

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
  void OnRegister(const std::shared_ptr<WorkerSession>&, const sparsync_register_msg&,
                  sparsync_register_reply* reply, std::shared_ptr<SharedRegion>* region) override {
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
  ssize_t Recv(int fd, void* buf, size_t size, int* passed_fd = nullptr) {
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
  bool ClosedByServer(int fd) {
    char buf[16];
    return Recv(fd, buf, sizeof(buf)) == 0;
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

}  // namespace
}  // namespace sparsync::intake
