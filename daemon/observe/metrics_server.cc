#include "daemon/observe/metrics_server.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <cerrno>

#include "daemon/common/thread_name.h"

namespace sparsync::observe {

MetricsServer::MetricsServer(const Metrics* metrics) : metrics_(metrics) {}

MetricsServer::~MetricsServer() { Stop(); }

Status MetricsServer::Start(const std::string& address, int port) {
  server_ = std::make_unique<httplib::Server>();
  // One request at a time: a scrape is rare and cheap, and the daemon's cores are the training's.
  server_->new_task_queue = [] { return new httplib::ThreadPool(1); };
  server_->set_read_timeout(std::chrono::seconds(5));
  server_->set_write_timeout(std::chrono::seconds(5));
  server_->Get("/metrics", [this](const httplib::Request&, httplib::Response& response) {
    response.set_content(metrics_->Render(), "text/plain; version=0.0.4; charset=utf-8");
  });
  errno = 0;
  if (!server_->bind_to_port(address, port)) {
    const int err = errno;
    server_.reset();
    const std::string where = address + ":" + std::to_string(port);
    return err ? ErrnoStatus("cannot serve the metrics on " + where + " (SPARSYNC_METRICS_PORT, "
                             "SPARSYNC_METRICS_ADDRESS)", err)
               : Unavailable("cannot serve the metrics on " + where + " (SPARSYNC_METRICS_PORT, "
                             "SPARSYNC_METRICS_ADDRESS): the address does not resolve or bind");
  }
  serving_ = true;
  thread_ = std::thread([this] {
    NameThisThread("ssd-metrics");
    server_->listen_after_bind();
    std::lock_guard lock(mu_);
    serving_ = false;
    ended_.notify_all();
  });
  spdlog::info("metrics: serving Prometheus' text format on http://{}:{}/metrics", address, port);
  return Status::Ok();
}

void MetricsServer::Stop() {
  if (thread_.joinable()) {
    // httplib's stop() does nothing until the thread is inside listen_after_bind, and there is no
    // way to wait for that: repeat it until the thread has returned.
    std::unique_lock lock(mu_);
    do {
      server_->stop();
    } while (!ended_.wait_for(lock, std::chrono::milliseconds(20), [&] { return !serving_; }));
    lock.unlock();
    thread_.join();
  }
  server_.reset();
}

}  // namespace sparsync::observe
