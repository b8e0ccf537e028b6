// Config: the daemon's configuration, the only reader of SPARSYNC_* variables and flags.
// Precedence: command-line flag > SPARSYNC_* environment variable > default.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "daemon/common/status.h"

namespace sparsync {

enum class Compressor { kNone };
enum class TransportKind { kGloo };

struct MergePolicy {
  enum class Kind { kFixed } kind = Kind::kFixed;
  uint64_t bucket_bytes = 64ull << 20;  // kFixed: fuse ready tensors up to this many bytes
};

struct Config {
  int node_rank = 0;
  int num_nodes = 1;
  int local_size = 1;                   // workers per node
  std::string coordinator = "127.0.0.1:29400";
  std::string listen = "127.0.0.1";     // address this daemon binds for peers
  std::string socket_path;              // control socket; default per-user runtime dir
  std::string job_token;
  Compressor compressor = Compressor::kNone;
  MergePolicy merge;
  TransportKind transport = TransportKind::kGloo;
  double timeout_s = 300;
  double stall_warn_s = 60;
  double cycle_ms = 1.0;                // negotiation batching window on the coordinator
  std::string log_level = "info";

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
ParsedConfig ParseConfig(int argc, const char* const* argv,
                         const std::map<std::string, std::string>& env);

// The process environment as a map (SPARSYNC_* only).
std::map<std::string, std::string> SparsyncEnvironment();

// The default control socket: $XDG_RUNTIME_DIR/sparsync/sparsyncd.sock, else
// /tmp/sparsync-<uid>/sparsyncd.sock.
std::string DefaultSocketPath(const std::map<std::string, std::string>& env);

}  // namespace sparsync
