// Config: the daemon's configuration, the only reader of SPARSYNC_* variables and flags.
// Precedence: command-line flag > SPARSYNC_* environment variable > Slurm's SLURM_* variables
// (a daemon started by srun: node rank, node count, coordinator, listen; common/slurm.h) >
// default.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "daemon/common/slurm.h"
#include "daemon/common/status.h"
#include "daemon/common/tensor_meta.h"

namespace sparsync {

// How a sparse payload codes its indices (pipeline/sparse_payload.h; the values are the
// payload's header byte): raw int32, or varint gaps of the sorted indices.
enum class IndexCoding : uint8_t { kRaw32 = 0, kDeltaVarint = 1 };
enum class ValueDType { kFloat32, kFloat16 };
enum class NonFinitePolicy { kError, kSkip };
enum class TransportKind { kGloo, kNccl };

// How gradient tensors are merged into groups (planning/planner.h). The coordinator runs the
// first `warmup_steps` steps with fixed buckets while it measures, then plans with `planners[0]`;
// each later re-plan takes the next planner of the list (a list is for experiments and tests).
struct MergePolicy {
  // optimal, omgs, layerwise, single, mgwfbp, fixed. `optimal` by default: on the emulated
  // clusters it was never slower than OMGS-SGD's greedy rule and often faster (bench/RESULTS.md).
  std::vector<std::string> planners{"optimal"};
  uint64_t bucket_bytes = 64ull << 20;  // fixed: group size limit; also the warm-up buckets
  int warmup_steps = 5;                 // steps measured before the first plan
  double replan_drift = 0.2;            // re-plan when backward time drifts by this fraction
  int replan_steps = 0;                 // also re-plan every this many steps (0: only on drift)
  bool calibrate = true;                // measure t_s and t_c at start-up and while training
  // SPARSYNC_COMPRESS: `auto` lets the plan send a group dense where the cost model predicts
  // that faster than compressing it (planning/planner.h); `always` compresses every group of
  // at least SPARSYNC_MIN_COMPRESS_BYTES, as the paper does.
  bool compress_always = false;
};

struct Config {
  int node_rank = 0;
  int num_nodes = 1;
  int local_size = 1;                   // workers per node
  std::string coordinator = "127.0.0.1:29400";
  std::string listen = "127.0.0.1";     // address this daemon binds for peers
  std::string socket_path;              // control socket; default per-user runtime dir
  std::string job_token;                // see job_token.h: environment, file, or generated
  std::string job_token_file;
  bool job_token_generated = false;     // set by ResolveJobToken
  struct Tls {                          // mutual TLS on the coordinator's gRPC channel
    std::string cert, key, ca;          // PEM files; all three or none
    bool enabled() const { return !cert.empty(); }
  } tls;
  uint64_t max_registered_bytes = 0;    // workers' shared regions in all; 0: physical memory
  Compressor compressor = Compressor::kTopK;
  double density = 0.001;               // fraction of elements sent (rho)
  int density_warmup_steps = 0;         // steps of DGC's density schedule first; 0: none
  double threshold = 0;                 // threshold compressor: fixed tau; 0 = sampled quantile
  // Emulation only: a host selection of x elements lasts at least this * x * log2(x) seconds.
  double emulated_select_cost = 0;
  int error_feedback = -1;              // -1: the compressor's default (see ErrorFeedback())
  ValueDType value_dtype = ValueDType::kFloat32;
  IndexCoding index_coding = IndexCoding::kDeltaVarint;
  uint64_t min_compress_bytes = 64 << 10;  // smaller merge groups go dense
  NonFinitePolicy nonfinite = NonFinitePolicy::kError;
  uint64_t seed = 0;                    // job seed of the random compressors
  MergePolicy merge;
  TransportKind transport = TransportKind::kGloo;
  double timeout_s = 300;
  double stall_warn_s = 60;
  double cycle_ms = 1.0;                // negotiation batching window on the coordinator
  std::string log_level = "info";
  std::string cudart;                   // CUDA runtime for the CUDA IPC intake; "": search
  bool local_nccl = true;               // SPARSYNC_LOCAL_REDUCE=auto: NCCL across the node's GPUs
  std::string libnccl;                  // NCCL for the local reduce; "": libnccl.so.2
  bool device_sparsify = true;          // SPARSYNC_DEVICE_SPARSIFY=auto: top-k on the GPU
  std::string sparsify_library;         // the CUDA sparsification library; "": beside the daemon
  std::string timeline;                 // Chrome trace file ("{node}": the rank); "": none
  int metrics_port = 0;                 // Prometheus' /metrics on this port; 0: not served
  std::string metrics_address;          // the address it binds; "": `listen`
  bool from_slurm = false;              // some settings came from SLURM_* (for the log)

  // Whether residuals are kept: on by default for the biased compressors, off for Wangni's
  // unbiased one and for DGC (which accumulates in its own state).
  bool ErrorFeedback() const;
  // Whether merge plans may send a compressing job's groups dense (SPARSYNC_COMPRESS=auto): not
  // with compressor none (everything is dense) nor DGC, whose momentum a dense group bypasses.
  bool ChoosesDense() const;
  std::chrono::milliseconds timeout() const;
  std::chrono::milliseconds stall_warn() const;
  std::string CoordinatorHost() const;
  int CoordinatorPort() const;
  std::string Describe() const;  // one line for the start-up log
};

// The outcome of parsing: either a config, or text to print and an exit code (help, errors).
struct ParsedConfig {
  Config config;
  bool exit = false;     // true: print `message` and exit with `exit_code`
  int exit_code = 0;
  std::string message;
};

// Parses flags (argv) and the environment (`env`, normally the process environment). Invalid
// values produce exit=true with a message naming the variable, the flag and the accepted values.
// `hostnames` expands Slurm's node list (only called under Slurm without SPARSYNC_COORDINATOR).
ParsedConfig ParseConfig(int argc, const char* const* argv,
                         const std::map<std::string, std::string>& env,
                         const HostnamesFn& hostnames = ScontrolHostnames);

// The process environment as a map (SPARSYNC_*, SLURM_*, SLURMD_NODENAME, XDG_RUNTIME_DIR).
std::map<std::string, std::string> SparsyncEnvironment();

// The default control socket: $XDG_RUNTIME_DIR/sparsync/sparsyncd.sock, else
// /tmp/sparsync-<uid>/sparsyncd.sock.
std::string DefaultSocketPath(const std::map<std::string, std::string>& env);

}  // namespace sparsync
