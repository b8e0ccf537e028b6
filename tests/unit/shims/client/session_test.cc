// One connection's hardening (shims/client/session.cc, issue 16): where the job token comes
// from when the caller gives none, a job's failure ending every wait, and a daemon of another
// protocol version named as such.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "daemon/intake/codec.h"
#include "shims/client/include/sparsync/client.h"
#include "tests/unit/shims/client/scripted_daemon.h"

namespace sparsync::client_test {
namespace {

using Clock = std::chrono::steady_clock;
using ::testing::HasSubstr;

class SessionTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(daemon_.Start()); }
  void TearDown() override {
    sparsync_close(client_);
    daemon_.Stop();
    if (!scratch_.empty()) std::filesystem::remove_all(scratch_);
  }
  sparsync_connect_options Options(const char* token) {
    sparsync_connect_options o{};
    o.struct_size = sizeof(o);
    o.socket_path = daemon_.socket_path().c_str();
    o.job_token = token;
    o.timeout_s = 5.0;
    return o;
  }
  sparsync_status Connect(const sparsync_connect_options& o) {
    error_[0] = '\0';
    return sparsync_connect_with_options(&o, &client_, error_, sizeof(error_));
  }
  std::string TokenFile(const std::string& text, mode_t mode) {
    char tmpl[] = "/tmp/sparsync-session-XXXXXX";
    scratch_ = mkdtemp(tmpl);
    std::string path = scratch_ + "/token";
    std::ofstream(path) << text;
    chmod(path.c_str(), mode);
    return path;
  }

  ScriptedDaemon daemon_;
  sparsync_client* client_ = nullptr;
  char error_[1024] = "";
  std::string scratch_;
};

// D2: a worker without a token reads the one its daemon left beside the socket.
TEST_F(SessionTest, WithoutATokenTheDaemonsTokenFileIsUsed) {
  ASSERT_EQ(Connect(Options(nullptr)), SPARSYNC_OK) << error_;
}

TEST_F(SessionTest, AGivenTokenFileIsRead) {
  const std::string file = TokenFile("t0k\n", 0600);
  sparsync_connect_options o = Options(nullptr);
  o.job_token_file = file.c_str();
  ASSERT_EQ(Connect(o), SPARSYNC_OK) << error_;
}

TEST_F(SessionTest, ATokenFileOthersCanReadIsRefused) {
  const std::string file = TokenFile("t0k\n", 0644);
  sparsync_connect_options o = Options(nullptr);
  o.job_token_file = file.c_str();
  EXPECT_EQ(Connect(o), SPARSYNC_ERR_PERMISSION);
  EXPECT_THAT(std::string(error_), HasSubstr("chmod 600"));
  EXPECT_EQ(client_, nullptr);
}

TEST_F(SessionTest, NoTokenAnywhereSaysWhereItLooked) {
  std::filesystem::remove(daemon_.socket_path() + ".token");
  EXPECT_EQ(Connect(Options(nullptr)), SPARSYNC_ERR_PERMISSION);
  EXPECT_THAT(std::string(error_), HasSubstr("no job token"));
  EXPECT_THAT(std::string(error_), HasSubstr(daemon_.socket_path() + ".token"));
}

// D4: once the daemon reported the job's failure, a wait for another tensor whose answer has
// not come ends at once with that failure, not at its timeout.
TEST_F(SessionTest, TheJobsFailureEndsEveryWait) {
  ASSERT_EQ(Connect(Options("t0k")), SPARSYNC_OK) << error_;
  int64_t shape[1] = {4};
  sparsync_tensor_spec spec{};
  spec.op = SPARSYNC_OP_ALLREDUCE;
  spec.dtype = SPARSYNC_FLOAT32;
  spec.reduce_op = SPARSYNC_REDUCE_SUM;
  spec.ndim = 1;
  spec.shape = shape;
  uint32_t a = 0, b = 0;
  void* data = nullptr;
  uint64_t bytes = 0;
  spec.name = "a";
  ASSERT_EQ(sparsync_register_tensor(client_, &spec, &a, &data, &bytes), SPARSYNC_OK);
  spec.name = "b";
  ASSERT_EQ(sparsync_register_tensor(client_, &spec, &b, &data, &bytes), SPARSYNC_OK);
  ASSERT_EQ(sparsync_post_ready(client_, a), SPARSYNC_OK);
  ASSERT_EQ(sparsync_post_ready(client_, b), SPARSYNC_OK);
  auto readies = daemon_.WaitForReadies(2, std::chrono::seconds(5));
  ASSERT_EQ(readies.size(), 2u);
  const std::string why = "node 2 (10.0.0.3) has not contacted the coordinator for 10 s";
  ScriptedDaemon::SendDone(readies[0].name == "a" ? readies[0] : readies[1], SPARSYNC_ERR_ABORTED,
                           why);
  const auto start = Clock::now();
  EXPECT_EQ(sparsync_wait_done(client_, b, 30.0), SPARSYNC_ERR_ABORTED);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 5.0);
  EXPECT_EQ(std::string(sparsync_last_error(client_)), why);
  EXPECT_EQ(sparsync_wait_done(client_, a, 30.0), SPARSYNC_ERR_ABORTED);
}

// A listening socket at a fresh path, for a raw daemon that answers the handshake by hand.
class RawDaemon {
 public:
  RawDaemon() {
    char tmpl[] = "/tmp/sparsync-raw-XXXXXX";
    dir_ = mkdtemp(tmpl);
    path_ = dir_ + "/d.sock";
    listener_ = socket(AF_UNIX, SOCK_SEQPACKET, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path_.c_str(), sizeof(addr.sun_path) - 1);
    EXPECT_EQ(bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(listen(listener_, 1), 0);
  }
  ~RawDaemon() {
    close(listener_);
    std::filesystem::remove_all(dir_);
  }
  int Accept() const { return accept(listener_, nullptr, nullptr); }
  const std::string& path() const { return path_; }

 private:
  std::string dir_, path_;
  int listener_ = -1;
};

// D12: a daemon of another version answers the handshake in its own version; the client says so
// instead of calling the reply malformed.
TEST(SessionVersionTest, ADaemonOfAnotherVersionIsNamedAsSuch) {
  RawDaemon daemon;
  std::thread other_version([&] {
    int fd = daemon.Accept();
    char hello[sizeof(sparsync_hello)];
    (void)!recv(fd, hello, sizeof(hello), 0);
    sparsync_hello_reply reply{};
    intake::FillHeader(&reply.header, SPARSYNC_MSG_HELLO_REPLY, sizeof(reply));
    reply.header.version = SPARSYNC_INTAKE_VERSION + 1;
    (void)!send(fd, &reply, sizeof(reply), 0);
    close(fd);
  });
  sparsync_client* client = nullptr;
  char error[1024] = "";
  EXPECT_EQ(sparsync_connect(daemon.path().c_str(), "t", 0, 5.0, &client, error, sizeof(error)),
            SPARSYNC_ERR_UNAVAILABLE);
  other_version.join();
  EXPECT_THAT(std::string(error),
              HasSubstr("intake protocol version " + std::to_string(SPARSYNC_INTAKE_VERSION + 1)));
}

// A daemon that answers and closes while the worker's message is still unread in its queue
// resets the connection; Linux reports the reset on the worker's next receive before the answer
// queued ahead of it (a SIGTERM'd daemon's "shutting down" was lost this way). The worker still
// reads the daemon's answer.
TEST(SessionResetTest, TheAnswerQueuedBeforeAResetIsRead) {
  RawDaemon daemon;
  std::thread refuser([&] {
    int fd = daemon.Accept();
    pollfd p{fd, POLLIN, 0};
    ASSERT_EQ(poll(&p, 1, 5000), 1) << "no HELLO arrived";  // left unread on purpose
    sparsync_hello_reply reply{};
    intake::FillHeader(&reply.header, SPARSYNC_MSG_HELLO_REPLY, sizeof(reply));
    reply.status = SPARSYNC_ERR_PERMISSION;
    std::strncpy(reply.message, "wrong job token", sizeof(reply.message) - 1);
    (void)!send(fd, &reply, sizeof(reply), 0);
    close(fd);
  });
  sparsync_client* client = nullptr;
  char error[1024] = "";
  // The worker, woken by the answer, mostly reads after the close (the reset first); when it is
  // quicker, it reads the answer the ordinary way. Either way it must report the refusal.
  EXPECT_EQ(sparsync_connect(daemon.path().c_str(), "t", 0, 5.0, &client, error, sizeof(error)),
            SPARSYNC_ERR_PERMISSION)
      << error;
  refuser.join();
  EXPECT_THAT(std::string(error), HasSubstr("refused this worker: wrong job token"));
}

}  // namespace
}  // namespace sparsync::client_test
