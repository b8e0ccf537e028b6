#include "daemon/observe/metrics_server.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace sparsync::observe {
namespace {

// A port nobody listens on now, and a socket that holds another one.
int FreePort(int* holder = nullptr) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  if (holder) {
    listen(fd, 1);
    *holder = fd;
  } else {
    close(fd);
  }
  return ntohs(a.sin_port);
}

TEST(MetricsServerTest, ServesTheTextFormatOnMetricsOnly) {
  Metrics metrics(0, 1);
  metrics.SetSources({[] { return 3; }, nullptr});
  MetricsServer server(&metrics);
  const int port = FreePort();
  ASSERT_TRUE(server.Start("127.0.0.1", port).ok());
  httplib::Client client("127.0.0.1", port);
  auto got = client.Get("/metrics");
  ASSERT_TRUE(got) << httplib::to_string(got.error());
  EXPECT_EQ(got->status, 200);
  EXPECT_EQ(got->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_NE(got->body.find("\nsparsync_connected_workers 3\n"), std::string::npos) << got->body;
  auto other = client.Get("/");
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 404);
  server.Stop();
  server.Stop();  // idempotent
  EXPECT_FALSE(client.Get("/metrics")) << "still serving after Stop";
}

TEST(MetricsServerTest, APortInUseIsAnErrorNamingIt) {
  Metrics metrics(0, 1);
  MetricsServer server(&metrics);
  int holder = -1;
  const int port = FreePort(&holder);
  Status st = server.Start("127.0.0.1", port);
  close(holder);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("127.0.0.1:" + std::to_string(port)), std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("SPARSYNC_METRICS_PORT"), std::string::npos) << st.message();
}

// Stop right after Start must not hang (the server's thread may not be listening yet).
TEST(MetricsServerTest, StopsRightAfterStarting) {
  Metrics metrics(0, 1);
  for (int i = 0; i < 20; ++i) {
    MetricsServer server(&metrics);
    ASSERT_TRUE(server.Start("127.0.0.1", FreePort()).ok());
  }
}

}  // namespace
}  // namespace sparsync::observe
