// sparsyncd: parses the configuration, starts the Daemon and runs until SIGTERM or SIGINT.
#include <signal.h>

#include <cstdio>

#include "daemon/common/config.h"
#include "daemon/common/logging.h"
#include "daemon/daemon.h"

int main(int argc, char** argv) {
  sparsync::ParsedConfig parsed =
      sparsync::ParseConfig(argc, argv, sparsync::SparsyncEnvironment());
  if (parsed.exit) {
    std::fprintf(parsed.exit_code == 0 ? stdout : stderr, "%s\n", parsed.message.c_str());
    return parsed.exit_code;
  }
  // Block the stop signals in every thread; the main thread waits for them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  signal(SIGPIPE, SIG_IGN);

  sparsync::InitLogging(parsed.config.node_rank, parsed.config.log_level);
  sparsync::Daemon daemon(parsed.config);
  sparsync::Status started = daemon.Start();
  if (!started.ok()) {
    spdlog::error("cannot start: {}", started.message());
    daemon.Stop();
    return 1;
  }
  int sig = 0;
  sigwait(&stop, &sig);
  spdlog::info("received {}, shutting down", sig == SIGTERM ? "SIGTERM" : "SIGINT");
  daemon.Stop();
  return 0;
}
