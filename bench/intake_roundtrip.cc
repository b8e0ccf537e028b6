// Intake round trip: one worker, one node, compressor none. For each size, times
//   memcpy        - a plain memcpy of the same bytes (the baseline, same run)
//   daemon's part - READY -> DONE with the data already in the shared region (protocol, table,
//                   negotiation, the reduce path): what DistributedOptimizer waits for, since
//                   backward writes each gradient into its region (docs/intake.md)
//   user's part   - what a shim adds for an explicit op on a tensor of its own: the copy into
//                   the region before READY and the copy of the result out after DONE
// and prints a Markdown table of medians. Needs a running sparsyncd (SPARSYNC_SOCKET).
//
//   bench/run_intake_bench.sh      (starts a daemon, runs this, stops the daemon)
#include <sparsync/client.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int Reps(size_t bytes) {
  if (bytes <= (1u << 20)) return 2000;
  if (bytes <= (16u << 20)) return 60;
  return 12;
}

void Check(sparsync_status st, sparsync_client* c, const char* what) {
  if (st != SPARSYNC_OK) {
    std::fprintf(stderr, "%s failed: %s\n", what, c ? sparsync_last_error(c) : "");
    std::exit(1);
  }
}

}  // namespace

int main() {
  const char* socket = std::getenv("SPARSYNC_SOCKET");
  const char* token = std::getenv("SPARSYNC_JOB_TOKEN");
  char error[512];
  sparsync_client* client = nullptr;
  if (sparsync_connect(socket ? socket : "", token ? token : "", 0, 10.0, &client, error,
                       sizeof(error)) != SPARSYNC_OK) {
    std::fprintf(stderr, "connect: %s\n", error);
    return 1;
  }
  // With the gradient in its region the user waits for the daemon's part alone.
  std::printf("| bytes | memcpy (us) | daemon's part, READY->DONE (us) | gradient in the region: "
              "memcpy time / total | explicit op: user's part, the copies (us) | explicit op: "
              "total (us) | explicit op: memcpy time / total |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|\n");
  for (size_t bytes = 4096; bytes <= (256u << 20); bytes *= 4) {
    int64_t shape[1] = {static_cast<int64_t>(bytes / 4)};
    std::string name = "bench." + std::to_string(bytes);
    sparsync_tensor_spec spec{name.c_str(), SPARSYNC_OP_ALLREDUCE, SPARSYNC_FLOAT32,
                              SPARSYNC_REDUCE_AVERAGE, 0, 1, shape};
    uint32_t id;
    void* shared;
    uint64_t region_bytes;
    Check(sparsync_register_tensor(client, &spec, &id, &shared, &region_bytes), client, "register");
    std::vector<char> src(bytes, 1), dst(bytes, 0);
    std::memset(shared, 1, bytes);
    const int reps = Reps(bytes);
    std::vector<double> copy_us, daemon_us, user_us, explicit_us;
    for (int i = 0; i < reps + 3; ++i) {
      auto t0 = Clock::now();
      std::memcpy(dst.data(), src.data(), bytes);
      auto t1 = Clock::now();
      Check(sparsync_post_ready(client, id), client, "post");
      Check(sparsync_wait_done(client, id, 30.0), client, "wait");
      auto t2 = Clock::now();
      std::memcpy(shared, src.data(), bytes);
      auto t3 = Clock::now();
      Check(sparsync_post_ready(client, id), client, "post");
      Check(sparsync_wait_done(client, id, 30.0), client, "wait");
      auto t4 = Clock::now();
      std::memcpy(dst.data(), shared, bytes);
      auto t5 = Clock::now();
      if (i < 3) continue;  // warm-up: page faults of first touch
      using Us = std::chrono::duration<double, std::micro>;
      copy_us.push_back(Us(t1 - t0).count());
      daemon_us.push_back(Us(t2 - t1).count());
      user_us.push_back(Us(t3 - t2).count() + Us(t5 - t4).count());
      explicit_us.push_back(Us(t5 - t2).count());
    }
    const double c = Median(copy_us), d = Median(daemon_us), u = Median(user_us),
                 e = Median(explicit_us);
    std::printf("| %zu | %.1f | %.1f | %.2f | %.1f | %.1f | %.2f |\n", bytes, c, d, c / d, u, e,
                c / e);
    Check(sparsync_unregister_tensor(client, id), client, "unregister");
  }
  sparsync_close(client);
  return 0;
}
