#include "daemon/common/config_settings.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

namespace sparsync::config_internal {
namespace {

Status Reject(const Setting& s, const std::string& value, const std::string& accepted) {
  return InvalidArgument(s.env + " (--" + s.flag + ") = '" + value + "' is not accepted; " +
                         accepted);
}

Result<long long> ParseInteger(const std::string& text) {
  if (text.empty()) return InvalidArgument("empty");
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') return InvalidArgument("not an integer");
  return v;
}

Result<double> ParseNumber(const std::string& text) {
  if (text.empty()) return InvalidArgument("empty");
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(text.c_str(), &end);
  if (errno != 0 || *end != '\0' || !std::isfinite(v)) return InvalidArgument("not a number");
  return v;
}

// "67108864", "64MiB", "512KiB", "1GiB".
Result<uint64_t> ParseBytes(const std::string& text) {
  static const std::pair<const char*, uint64_t> kSuffixes[] = {
      {"GiB", 1ull << 30}, {"MiB", 1ull << 20}, {"KiB", 1ull << 10}, {"B", 1}};
  std::string digits = text;
  uint64_t scale = 1;
  for (const auto& [suffix, mult] : kSuffixes) {
    std::string s(suffix);
    if (digits.size() > s.size() && digits.compare(digits.size() - s.size(), s.size(), s) == 0) {
      digits.resize(digits.size() - s.size());
      scale = mult;
      break;
    }
  }
  auto v = ParseInteger(digits);
  if (!v.ok() || *v <= 0) return InvalidArgument("not a positive byte count");
  return static_cast<uint64_t>(*v) * scale;
}

Status SetInt(const Setting& s, const std::string& v, int lo, int hi, int* out) {
  auto n = ParseInteger(v);
  if (!n.ok() || *n < lo || *n > hi) {
    return Reject(s, v, "expected an integer in [" + std::to_string(lo) + ", " +
                            std::to_string(hi) + "]");
  }
  *out = static_cast<int>(*n);
  return Status::Ok();
}

Status SetSeconds(const Setting& s, const std::string& v, double* out) {
  auto n = ParseNumber(v);
  if (!n.ok() || *n <= 0) return Reject(s, v, "expected a positive number of seconds");
  *out = *n;
  return Status::Ok();
}

}  // namespace

std::vector<Setting> Settings() {
  std::vector<Setting> s;
  auto add = [&](std::string flag, std::string env, std::string def, std::string help,
                 std::function<Status(const Setting&, const std::string&, Config*)> fn) {
    Setting setting{std::move(flag), std::move(env), std::move(def), std::move(help), nullptr, ""};
    setting.apply = [fn, setting](const std::string& v, Config* c) { return fn(setting, v, c); };
    s.push_back(std::move(setting));
  };
  add("node-rank", "SPARSYNC_NODE_RANK", "0", "this node's rank, 0 .. num-nodes-1",
      [](const Setting& st, const std::string& v, Config* c) {
        return SetInt(st, v, 0, 65535, &c->node_rank);
      });
  add("num-nodes", "SPARSYNC_NUM_NODES", "1", "number of nodes (one daemon each)",
      [](const Setting& st, const std::string& v, Config* c) {
        return SetInt(st, v, 1, 65536, &c->num_nodes);
      });
  add("local-size", "SPARSYNC_LOCAL_SIZE", "1", "training processes (workers) on this node",
      [](const Setting& st, const std::string& v, Config* c) {
        return SetInt(st, v, 1, 1024, &c->local_size);
      });
  add("coordinator", "SPARSYNC_COORDINATOR", "127.0.0.1:29400",
      "host:port of node 0's gRPC coordinator service",
      [](const Setting& st, const std::string& v, Config* c) {
        auto colon = v.rfind(':');
        if (colon == std::string::npos || colon == 0) return Reject(st, v, "expected host:port");
        auto port = ParseInteger(v.substr(colon + 1));
        if (!port.ok() || *port < 1 || *port > 65535) {
          return Reject(st, v, "expected host:port with a port in [1, 65535]");
        }
        c->coordinator = v;
        return Status::Ok();
      });
  add("listen", "SPARSYNC_LISTEN", "127.0.0.1", "address this daemon binds for its peers",
      [](const Setting& st, const std::string& v, Config* c) {
        if (v.empty()) return Reject(st, v, "expected an address");
        c->listen = v;
        return Status::Ok();
      });
  add("socket", "SPARSYNC_SOCKET", "$XDG_RUNTIME_DIR/sparsync/sparsyncd.sock or /tmp/sparsync-UID/sparsyncd.sock",
      "control socket shared by the daemon and its workers",
      [](const Setting& st, const std::string& v, Config* c) {
        if (v.empty() || v.size() >= 108) {
          return Reject(st, v, "expected a path of 1 to 107 bytes (a Unix socket limit)");
        }
        c->socket_path = v;
        return Status::Ok();
      });
  add("job-token", "SPARSYNC_JOB_TOKEN", "(generated)",
      "shared secret that daemons and workers must present to join, at most 64 bytes; from the "
      "environment only (a command line is visible to every user in ps). Without it and "
      "SPARSYNC_JOB_TOKEN_FILE, node 0 generates one; each daemon leaves its token in "
      "SPARSYNC_SOCKET.token (mode 0600) for its workers",
      [](const Setting& st, const std::string& v, Config* c) {
        if (v.size() > 64) return Reject(st, "<hidden>", "expected at most 64 bytes");
        c->job_token = v;
        return Status::Ok();
      });
  s.back().flag_refused =
      "--job-token would put the job's secret on the command line, where every user of this "
      "machine can read it (ps); set SPARSYNC_JOB_TOKEN in the environment or use "
      "--job-token-file FILE (mode 0600)";
  add("job-token-file", "SPARSYNC_JOB_TOKEN_FILE", "",
      "a file that holds the job token on its first line; it must be yours and of mode 0600 "
      "(empty: none)",
      [](const Setting&, const std::string& v, Config* c) {
        c->job_token_file = v;
        return Status::Ok();
      });
  add("tls-cert", "SPARSYNC_TLS_CERT", "",
      "PEM certificate of this node for the coordinator's gRPC channel (with SPARSYNC_TLS_KEY "
      "and SPARSYNC_TLS_CA: mutual TLS; the coordinator's must name the host of "
      "SPARSYNC_COORDINATOR)",
      [](const Setting&, const std::string& v, Config* c) {
        c->tls.cert = v;
        return Status::Ok();
      });
  add("tls-key", "SPARSYNC_TLS_KEY", "",
      "PEM private key of SPARSYNC_TLS_CERT; it must be yours and of mode 0600",
      [](const Setting&, const std::string& v, Config* c) {
        c->tls.key = v;
        return Status::Ok();
      });
  add("tls-ca", "SPARSYNC_TLS_CA", "",
      "PEM certificate of the authority that signed every node's certificate; peers whose "
      "certificate it did not sign are refused",
      [](const Setting&, const std::string& v, Config* c) {
        c->tls.ca = v;
        return Status::Ok();
      });
  add("max-registered-bytes", "SPARSYNC_MAX_REGISTERED_BYTES", "ram",
      "the most shared memory the workers of this node may register in all (tensor regions); "
      "ram: the machine's physical memory",
      [](const Setting& st, const std::string& v, Config* c) {
        if (v == "ram") {
          c->max_registered_bytes = 0;
          return Status::Ok();
        }
        auto bytes = ParseBytes(v);
        if (!bytes.ok()) return Reject(st, v, "expected ram or a byte count like 64GiB");
        c->max_registered_bytes = *bytes;
        return Status::Ok();
      });
  add("compressor", "SPARSYNC_COMPRESSOR", "topk",
      "gradient compressor: none, topk, randomk, threshold, gaussiank, wangni, dgc or gtopk",
      [](const Setting& st, const std::string& v, Config* c) {
        for (Compressor k : {Compressor::kNone, Compressor::kTopK, Compressor::kRandomK,
                             Compressor::kThreshold, Compressor::kGaussianK, Compressor::kWangni,
                             Compressor::kDgc, Compressor::kGTopK}) {
          if (v == CompressorName(k)) {
            c->compressor = k;
            return Status::Ok();
          }
        }
        return Reject(st, v,
                      "accepted values: none, topk, randomk, threshold, gaussiank, wangni, dgc, "
                      "gtopk");
      });
  add("density", "SPARSYNC_DENSITY", "0.001",
      "fraction of a merge group's elements a compressor sends, in (0, 1]",
      [](const Setting& st, const std::string& v, Config* c) {
        auto n = ParseNumber(v);
        if (!n.ok() || *n <= 0 || *n > 1) return Reject(st, v, "expected a number in (0, 1]");
        c->density = *n;
        return Status::Ok();
      });
  add("density-warmup-steps", "SPARSYNC_DENSITY_WARMUP_STEPS", "0",
      "send more over a tensor's first this many steps, a quarter each at densities 0.25, "
      "0.0625, 0.0156 and 0.004 (DGC's warm-up; never below SPARSYNC_DENSITY), then "
      "SPARSYNC_DENSITY; 0: no warm-up, SPARSYNC_DENSITY from the first step",
      [](const Setting& st, const std::string& v, Config* c) {
        return SetInt(st, v, 0, 1000000000, &c->density_warmup_steps);
      });
  add("threshold", "SPARSYNC_THRESHOLD", "0",
      "threshold compressor: send |x| > this; 0 estimates it from a sample for the density",
      [](const Setting& st, const std::string& v, Config* c) {
        auto n = ParseNumber(v);
        if (!n.ok() || *n < 0) return Reject(st, v, "expected a number >= 0");
        c->threshold = *n;
        return Status::Ok();
      });
  add("error-feedback", "SPARSYNC_ERROR_FEEDBACK", "auto",
      "keep what was not sent and add it next step: auto (on for topk, randomk, threshold, "
      "gaussiank; off for wangni, which is unbiased, and dgc, which accumulates itself), 1 or 0",
      [](const Setting& st, const std::string& v, Config* c) {
        if (v == "auto") {
          c->error_feedback = -1;
        } else if (v == "1" || v == "0") {
          c->error_feedback = v == "1";
        } else {
          return Reject(st, v, "accepted values: auto, 1, 0");
        }
        return Status::Ok();
      });
  add("value-dtype", "SPARSYNC_VALUE_DTYPE", "float32",
      "type of the sent values: float32 or float16",
      [](const Setting& st, const std::string& v, Config* c) {
        if (v == "float32" || v == "float16") {
          c->value_dtype = v == "float32" ? ValueDType::kFloat32 : ValueDType::kFloat16;
          return Status::Ok();
        }
        return Reject(st, v, "accepted values: float32, float16");
      });
  add("index-coding", "SPARSYNC_INDEX_CODING", "delta",
      "coding of the sent indices: raw (int32) or delta (gaps as varints)",
      [](const Setting& st, const std::string& v, Config* c) {
        if (v == "raw" || v == "delta") {
          c->index_coding = v == "raw" ? IndexCoding::kRaw32 : IndexCoding::kDeltaVarint;
          return Status::Ok();
        }
        return Reject(st, v, "accepted values: raw, delta");
      });
  add("min-compress-bytes", "SPARSYNC_MIN_COMPRESS_BYTES", "64KiB",
      "merge groups smaller than this are reduced dense",
      [](const Setting& st, const std::string& v, Config* c) {
        auto bytes = v == "0" ? Result<uint64_t>(uint64_t{0}) : ParseBytes(v);
        if (!bytes.ok()) return Reject(st, v, "expected a byte count like 65536 or 64KiB");
        c->min_compress_bytes = *bytes;
        return Status::Ok();
      });
  add("nonfinite", "SPARSYNC_NONFINITE", "error",
      "a NaN or Inf gradient: error (fail the job naming tensor and node) or skip (every node "
      "drops that merge group's update for the step)",
      [](const Setting& st, const std::string& v, Config* c) {
        if (v == "error" || v == "skip") {
          c->nonfinite = v == "error" ? NonFinitePolicy::kError : NonFinitePolicy::kSkip;
          return Status::Ok();
        }
        return Reject(st, v, "accepted values: error, skip");
      });
  add("emulate-select-cost", "SPARSYNC_EMULATE_SELECT_COST", "0",
      "emulated clusters only: a host selection of a merge group of n elements lasts at least "
      "C * n * log2(n) seconds (the daemon waits out the rest), to model a GPU's top-k on a "
      "CPU; 0: off",
      [](const Setting& st, const std::string& v, Config* c) {
        auto n = ParseNumber(v);
        if (!n.ok() || !(*n >= 0) || *n > 1e-3) {
          return Reject(st, v, "expected a number of seconds in [0, 1e-3]");
        }
        c->emulated_select_cost = *n;
        return Status::Ok();
      });
  add("seed", "SPARSYNC_SEED", "0", "job seed of the random compressors (same on every node)",
      [](const Setting& st, const std::string& v, Config* c) {
        auto n = ParseInteger(v);
        if (!n.ok() || *n < 0) return Reject(st, v, "expected a non-negative integer");
        c->seed = static_cast<uint64_t>(*n);
        return Status::Ok();
      });
  add("merge", "SPARSYNC_MERGE", "optimal",
      "how gradient tensors are merged into groups: optimal (exact under the cost model), omgs "
      "(OMGS-SGD's greedy rule; MG-WFBP's with compressor none), layerwise, single, mgwfbp, or "
      "fixed:BYTES (consecutive tensors up to BYTES, e.g. fixed:64MiB); a comma list takes the "
      "next planner at each re-plan",
      [](const Setting& st, const std::string& v, Config* c) {
        MergePolicy merge = c->merge;
        merge.planners.clear();
        std::stringstream items(v);
        std::string item;
        while (std::getline(items, item, ',')) {
          if (item.rfind("fixed:", 0) == 0) {
            auto bytes = ParseBytes(item.substr(6));
            if (!bytes.ok()) break;
            merge.bucket_bytes = *bytes;
            merge.planners.push_back("fixed");
            continue;
          }
          if (item != "omgs" && item != "optimal" && item != "layerwise" && item != "single" &&
              item != "mgwfbp") {
            break;
          }
          merge.planners.push_back(item);
        }
        if (merge.planners.empty() || !items.eof() || v.empty() || v.back() == ',') {
          return Reject(st, v,
                        "accepted values: omgs, optimal, layerwise, single, mgwfbp, fixed:BYTES "
                        "(BYTES like 67108864, 64MiB, 512KiB), or a comma list of them");
        }
        c->merge = merge;
        return Status::Ok();
      });
  add("plan-warmup-steps", "SPARSYNC_PLAN_WARMUP_STEPS", "5",
      "steps run with fixed buckets while backward times are measured, before the first plan",
      [](const Setting& st, const std::string& v, Config* c) {
        return SetInt(st, v, 1, 100000, &c->merge.warmup_steps);
      });
  add("replan-drift", "SPARSYNC_REPLAN_DRIFT", "0.2",
      "plan again when the measured backward time, or the plan's prediction under the measured "
      "costs, moves by more than this fraction; the new plan replaces the one in force only where "
      "it gains over 1 % at worst (docs/planning.md)",
      [](const Setting& st, const std::string& v, Config* c) {
        auto n = ParseNumber(v);
        if (!n.ok() || *n <= 0) return Reject(st, v, "expected a positive fraction such as 0.2");
        c->merge.replan_drift = *n;
        return Status::Ok();
      });
  add("replan-steps", "SPARSYNC_REPLAN_STEPS", "0",
      "also plan again every this many steps (0: only when the measured times drift)",
      [](const Setting& st, const std::string& v, Config* c) {
        return SetInt(st, v, 0, 1000000000, &c->merge.replan_steps);
      });
  add("compress", "SPARSYNC_COMPRESS", "auto",
      "auto: the merge plan sends a group dense where the cost model predicts that faster than "
      "compressing it; always: compress every group of at least SPARSYNC_MIN_COMPRESS_BYTES",
      [](const Setting& st, const std::string& v, Config* c) {
        if (v != "auto" && v != "always") return Reject(st, v, "accepted values: auto, always");
        c->merge.compress_always = v == "always";
        return Status::Ok();
      });
  add("calibrate", "SPARSYNC_CALIBRATE", "1",
      "measure the selection and exchange costs across the nodes at start-up and keep "
      "measuring them while training (0: plan with the built-in 1 Gb/s estimates only)",
      [](const Setting& st, const std::string& v, Config* c) {
        if (v != "0" && v != "1") return Reject(st, v, "accepted values: 0, 1");
        c->merge.calibrate = v == "1";
        return Status::Ok();
      });
  add("transport", "SPARSYNC_TRANSPORT", "auto",
      "collective backend between nodes: auto (gloo), gloo, or nccl (CUDA device 0; host "
      "gradients are staged through it, a CUDA gradient's dense groups on that GPU are reduced "
      "in place when SPARSYNC_DEVICE_SPARSIFY=auto)",
      [](const Setting& st, const std::string& v, Config* c) {
        if (v == "auto" || v == "gloo") {
          c->transport = TransportKind::kGloo;
          return Status::Ok();
        }
        if (v == "nccl") {
          c->transport = TransportKind::kNccl;
          return Status::Ok();
        }
        return Reject(st, v, "accepted values: auto, gloo, nccl");
      });
  add("device", "SPARSYNC_DEVICE", "auto", "where gradients are reduced: auto or cpu",
      [](const Setting& st, const std::string& v, Config*) {
        if (v == "auto" || v == "cpu") return Status::Ok();
        return Reject(st, v, "accepted values: auto, cpu");
      });
  add("cudart", "SPARSYNC_CUDART", "",
      "the CUDA runtime library the daemon loads for CUDA tensors and the NCCL transport "
      "(empty: libcudart.so.13, .so.12 or .so, preferring one already loaded)",
      [](const Setting&, const std::string& v, Config* c) {
        c->cudart = v;
        return Status::Ok();
      });
  add("local-reduce", "SPARSYNC_LOCAL_REDUCE", "auto",
      "how a node sums its workers' CUDA tensors: auto (with NCCL on the GPUs when each worker "
      "has a GPU of its own and NCCL loads, else on the host) or host",
      [](const Setting& st, const std::string& v, Config* c) {
        if (v != "auto" && v != "host") return Reject(st, v, "accepted values: auto, host");
        c->local_nccl = v == "auto";
        return Status::Ok();
      });
  add("libnccl", "SPARSYNC_LIBNCCL", "",
      "the NCCL library the NCCL transport and the local reduce across GPUs load (empty: "
      "libnccl.so.2; a file named here must load, or the daemon does not start)",
      [](const Setting&, const std::string& v, Config* c) {
        c->libnccl = v;
        return Status::Ok();
      });
  add("device-sparsify", "SPARSYNC_DEVICE_SPARSIFY", "auto",
      "where a node reduces its CUDA gradients: auto (top-k on the GPU that holds the node's "
      "sum, and with the NCCL transport dense float32 groups in that GPU's memory, when the CUDA "
      "sparsification library loads, else on the host) or host",
      [](const Setting& st, const std::string& v, Config* c) {
        if (v != "auto" && v != "host") return Reject(st, v, "accepted values: auto, host");
        c->device_sparsify = v == "auto";
        return Status::Ok();
      });
  add("sparsify-library", "SPARSYNC_SPARSIFY_LIBRARY", "",
      "the CUDA sparsification library (empty: libsparsync_sparsify_cuda.so beside the daemon's "
      "executable; a file named here must load, or the daemon does not start)",
      [](const Setting&, const std::string& v, Config* c) {
        c->sparsify_library = v;
        return Status::Ok();
      });
  add("timeout-s", "SPARSYNC_TIMEOUT_S", "300",
      "seconds before a missing peer or tensor fails the step on every node",
      [](const Setting& st, const std::string& v, Config* c) {
        return SetSeconds(st, v, &c->timeout_s);
      });
  add("stall-warn-s", "SPARSYNC_STALL_WARN_S", "60",
      "seconds before a missing tensor is reported with the nodes that lack it",
      [](const Setting& st, const std::string& v, Config* c) {
        return SetSeconds(st, v, &c->stall_warn_s);
      });
  add("cycle-ms", "SPARSYNC_CYCLE_MS", "1",
      "coordinator batching window: tensors ready within it are fused",
      [](const Setting& st, const std::string& v, Config* c) {
        auto n = ParseNumber(v);
        if (!n.ok() || *n < 0 || *n > 1000) return Reject(st, v, "expected 0 .. 1000");
        c->cycle_ms = *n;
        return Status::Ok();
      });
  add("timeline", "SPARSYNC_TIMELINE", "",
      "write a Chrome trace (Perfetto, chrome://tracing) of every tensor and merge group to this "
      "file; {node} in it stands for the node's rank (without it only node 0 writes one); "
      "empty: none",
      [](const Setting&, const std::string& v, Config* c) {
        c->timeline = v;
        return Status::Ok();
      });
  add("metrics-port", "SPARSYNC_METRICS_PORT", "0",
      "serve Prometheus metrics on http://ADDRESS:PORT/metrics (0: not served)",
      [](const Setting& st, const std::string& v, Config* c) {
        return SetInt(st, v, 0, 65535, &c->metrics_port);
      });
  add("metrics-address", "SPARSYNC_METRICS_ADDRESS", "",
      "the address the metrics are served on (0.0.0.0: every interface; empty: the listen "
      "address)",
      [](const Setting&, const std::string& v, Config* c) {
        c->metrics_address = v;
        return Status::Ok();
      });
  add("log-level", "SPARSYNC_LOG_LEVEL", "info", "trace, debug, info, warn, error or off",
      [](const Setting& st, const std::string& v, Config* c) {
        for (const char* level : {"trace", "debug", "info", "warn", "error", "off"}) {
          if (v == level) {
            c->log_level = v;
            return Status::Ok();
          }
        }
        return Reject(st, v, "accepted values: trace, debug, info, warn, error, off");
      });
  return s;
}

}  // namespace sparsync::config_internal
