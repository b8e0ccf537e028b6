// sparsyncd: parses the configuration, starts the Daemon and runs until SIGTERM, SIGINT or SIGHUP.
#include <malloc.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "daemon/common/config.h"
#include "daemon/common/job_token.h"
#include "daemon/common/logging.h"
#include "daemon/common/thread_name.h"
#include "daemon/daemon.h"

namespace {

// StopSignals: the thread that waits for the stop signals (blocked in every other thread) and
// interrupts the daemon, also while it is still starting (a start-up waits for the other nodes
// for up to SPARSYNC_TIMEOUT_S; issue 16, D9). The destructor ends the wait and joins.
class StopSignals {
 public:
  static sigset_t Set() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    return set;
  }
  explicit StopSignals(sparsync::Daemon* daemon) : daemon_(daemon) {
    thread_ = std::thread([this] {
      sparsync::NameThisThread("ssd-signals");
      sigset_t set = Set();
      int sig = 0;
      sigwait(&set, &sig);
      if (!done_) {
        spdlog::info("received {}, shutting down",
                     sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : "SIGHUP");
      }
      daemon_->Interrupt();
    });
  }
  ~StopSignals() {
    done_ = true;
    if (!daemon_->interrupted()) kill(getpid(), SIGTERM);  // wakes the wait; blocked elsewhere
    thread_.join();
  }

 private:
  sparsync::Daemon* const daemon_;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

}  // namespace

int main(int argc, char** argv) {
  sparsync::ParsedConfig parsed =
      sparsync::ParseConfig(argc, argv, sparsync::SparsyncEnvironment());
  if (parsed.exit) {
    std::fprintf(parsed.exit_code == 0 ? stdout : stderr, "%s\n", parsed.message.c_str());
    return parsed.exit_code;
  }
  if (sparsync::Status token = sparsync::ResolveJobToken(&parsed.config); !token.ok()) {
    std::fprintf(stderr, "sparsyncd: invalid configuration: %s\n", token.message().c_str());
    return 2;
  }
  // Block the stop signals in every thread; StopSignals waits for them.
  sigset_t stop = StopSignals::Set();
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  signal(SIGPIPE, SIG_IGN);
  // Debian's abseil keeps Mutex deadlock detection on: every gRPC lock then records the mutex in a
  // lock-order graph whose pages (mmapped 64 KiB at a time, never returned) grow with the
  // coordinator's calls, about 50 bytes a step on node 0 (issue 16's soak). Release builds of
  // abseil compile the detector out; the daemon turns it off before any thread starts.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // glibc gives each new thread its own malloc arena (up to 8 per core): the coordinator's gRPC
  // threads free on one what another allocated, and each arena's touched pages creep up over a
  // long job. Two arenas keep its resident memory flat and did not slow it (soaks at 24.9 and
  // 25.4 steps/s against 24.4 and 24.0 with 16: bench/RESULTS.md). MALLOC_ARENA_MAX still wins.
  if (std::getenv("MALLOC_ARENA_MAX") == nullptr) mallopt(M_ARENA_MAX, 2);

  sparsync::InitLogging(parsed.config.node_rank, parsed.config.log_level);
  sparsync::Daemon daemon(parsed.config);
  int code = 0;
  {
    StopSignals signals(&daemon);
    sparsync::Status started = daemon.Start();
    if (started.ok()) {
      daemon.WaitForInterrupt();
    } else if (!daemon.interrupted()) {
      spdlog::error("cannot start: {}", started.message());
      code = 1;
    }
    daemon.Stop();
  }
  return code;
}
