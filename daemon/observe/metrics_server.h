// MetricsServer: serves the daemon's metrics (metrics.h) over HTTP for Prometheus to scrape
// (GET /metrics, the text format 0.0.4), with cpp-httplib (Debian's libcpp-httplib-dev) on one
// thread of its own. Anything else gets 404. Off unless SPARSYNC_METRICS_PORT is set.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "daemon/common/status.h"
#include "daemon/observe/metrics.h"

namespace httplib {
class Server;
}

namespace sparsync::observe {

class MetricsServer {
 public:
  // `metrics` outlives the server.
  explicit MetricsServer(const Metrics* metrics);
  ~MetricsServer();  // Stop()

  // Binds `address`:`port` (errors name both, e.g. a port in use) and starts serving.
  Status Start(const std::string& address, int port);
  // Stops serving and joins the thread. Idempotent.
  void Stop();

 private:
  const Metrics* const metrics_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable ended_;
  bool serving_ = false;  // guarded by mu_: the thread has not returned from listening
};

}  // namespace sparsync::observe
