// Mutual TLS on the coordinator's channel (grpc_tls.h; issue 16, D2), with a throwaway
// certificate authority made by openssl for each run: nodes with a certificate the job's
// authority signed talk; a node without TLS, or with a certificate of another authority, is
// refused; a private key others can read is refused before anything starts.
#include "daemon/negotiation/grpc_tls.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "daemon/negotiation/grpc_link.h"
#include "daemon/negotiation/grpc_service.h"
#include "tests/unit/daemon/negotiation/test_util.h"

namespace sparsync::negotiation {
namespace {

using namespace std::chrono_literals;
constexpr char kToken[] = "tls-token";

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A certificate authority and one certificate it signed for 127.0.0.1, in a temporary directory.
class Authority {
 public:
  explicit Authority(const std::string& name) {
    char tmpl[] = "/tmp/sparsync-tls-XXXXXX";
    dir_ = mkdtemp(tmpl);
    std::ofstream(dir_ + "/ext.cnf") << "subjectAltName=IP:127.0.0.1\n";
    const std::string ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    ok_ = Run("openssl req -x509 " + ec + " -keyout ca.key -out ca.pem -days 1 -subj /CN=" +
              name) &&
          Run("openssl req " + ec + " -keyout node.key -out node.csr -subj /CN=node") &&
          Run("openssl x509 -req -in node.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
              "-out node.pem -days 1 -extfile ext.cnf") &&
          chmod((dir_ + "/node.key").c_str(), 0600) == 0;
  }
  ~Authority() { std::filesystem::remove_all(dir_); }
  bool ok() const { return ok_; }
  Config::Tls Files() const { return {dir_ + "/node.pem", dir_ + "/node.key", dir_ + "/ca.pem"}; }
  const std::string& dir() const { return dir_; }

 private:
  bool Run(const std::string& command) {
    return std::system(("cd " + dir_ + " && " + command + " >/dev/null 2>&1").c_str()) == 0;
  }
  std::string dir_;
  bool ok_ = false;
};

bool HaveOpenssl() { return std::system("openssl version >/dev/null 2>&1") == 0; }

class GrpcTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveOpenssl()) GTEST_SKIP() << "openssl is not installed: no throwaway authority";
    ASSERT_TRUE(job_.ok() && rogue_.ok()) << "openssl could not make the test certificates";
    CoordinatorOptions o;
    o.num_nodes = 2;
    o.cycle = 0ms;
    core_ = std::make_unique<CoordinatorCore>(o, 1, kToken);
    core_->Start();
    auto credentials = ServerCredentials(job_.Files());
    ASSERT_TRUE(credentials.ok()) << credentials.status().message();
    server_ = std::make_unique<CoordinatorServer>(core_.get(), *credentials);
    Status started = server_->Start("127.0.0.1:0");
    ASSERT_TRUE(started.ok()) << started.message();
    address_ = "127.0.0.1:" + std::to_string(server_->port());
  }
  void TearDown() override {
    if (core_) core_->Stop();
    server_.reset();
    core_.reset();
  }
  // Node 1's Join over a channel with `files` (empty: plaintext).
  Status JoinAsNode1(const Config::Tls& files, std::chrono::milliseconds timeout) {
    auto credentials = ChannelCredentials(files);
    if (!credentials.ok()) return credentials.status();
    GrpcCoordinatorLink link(address_, kToken, 2s, *credentials);
    return link.Join(testing::Joiner(1, 2, 1, kToken, kProtocolVersion), timeout);
  }

  Authority job_{"sparsync-job-ca"};
  Authority rogue_{"someone-else"};
  std::unique_ptr<CoordinatorCore> core_;
  std::unique_ptr<CoordinatorServer> server_;
  std::string address_;
};

TEST_F(GrpcTlsTest, NodesOfTheJobsAuthorityJoin) {
  Status node0;
  std::thread direct([&] {
    node0 = core_->Join(testing::Joiner(0, 2, 1, kToken, kProtocolVersion), 10s);
  });
  Status node1 = JoinAsNode1(job_.Files(), 10s);
  direct.join();
  EXPECT_TRUE(node0.ok()) << node0.message();
  EXPECT_TRUE(node1.ok()) << node1.message();
}

TEST_F(GrpcTlsTest, APlaintextNodeIsRefused) {
  Status st = JoinAsNode1({}, 1500ms);
  EXPECT_FALSE(st.ok());
  // The coordinator never counted it: node 0 alone still waits for node 1.
  Status alone = core_->Join(testing::Joiner(0, 2, 1, kToken, kProtocolVersion), 100ms);
  EXPECT_EQ(alone.code(), StatusCode::kDeadlineExceeded) << alone.message();
}

TEST_F(GrpcTlsTest, ANodeOfAnotherAuthorityIsRefused) {
  Status st = JoinAsNode1(rogue_.Files(), 1500ms);
  EXPECT_FALSE(st.ok());
  Status alone = core_->Join(testing::Joiner(0, 2, 1, kToken, kProtocolVersion), 100ms);
  EXPECT_EQ(alone.code(), StatusCode::kDeadlineExceeded) << alone.message();
}

TEST_F(GrpcTlsTest, AKeyOthersCanReadIsRefused) {
  Config::Tls files = job_.Files();
  ASSERT_EQ(chmod(files.key.c_str(), 0644), 0);
  auto credentials = ChannelCredentials(files);
  ASSERT_FALSE(credentials.ok());
  EXPECT_TRUE(Contains(credentials.status().message(), "SPARSYNC_TLS_KEY"))
      << credentials.status().message();
  EXPECT_TRUE(Contains(credentials.status().message(), "0644"))
      << credentials.status().message();
}

TEST(GrpcTlsFilesTest, WithoutFilesTheChannelIsPlaintext) {
  EXPECT_TRUE(ChannelCredentials({}).ok());
  EXPECT_TRUE(ServerCredentials({}).ok());
  Config::Tls missing{"/nonexistent/c.pem", "/nonexistent/k.pem", "/nonexistent/ca.pem"};
  auto st = ChannelCredentials(missing);
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(Contains(st.status().message(), "SPARSYNC_TLS_CERT")) << st.status().message();
}

}  // namespace
}  // namespace sparsync::negotiation
