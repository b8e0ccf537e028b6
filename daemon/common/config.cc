#include "daemon/common/config.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <optional>
#include <set>
#include <sstream>

#include "daemon/common/config_settings.h"

extern char** environ;

namespace sparsync {

using config_internal::Setting;
using config_internal::Settings;

bool Config::ErrorFeedback() const {
  if (error_feedback >= 0) return error_feedback == 1;
  return compressor != Compressor::kWangni && compressor != Compressor::kDgc &&
         compressor != Compressor::kNone;
}

std::chrono::milliseconds Config::timeout() const {
  return std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
}
std::chrono::milliseconds Config::stall_warn() const {
  return std::chrono::milliseconds(static_cast<int64_t>(stall_warn_s * 1000));
}
std::string Config::CoordinatorHost() const {
  return coordinator.substr(0, coordinator.rfind(':'));
}
int Config::CoordinatorPort() const {
  return std::atoi(coordinator.substr(coordinator.rfind(':') + 1).c_str());
}

bool Config::ChoosesDense() const {
  return !merge.compress_always && compressor != Compressor::kNone &&
         compressor != Compressor::kDgc;
}

std::string Config::Describe() const {
  std::ostringstream o;
  o << "node " << node_rank << "/" << num_nodes << ", " << local_size
    << " worker(s) per node, coordinator " << coordinator << ", listen " << listen
    << ", socket " << socket_path << ", compressor " << CompressorName(compressor);
  if (compressor != Compressor::kNone) {
    o << " (density " << density;
    if (density_warmup_steps > 0) o << " after a warm-up of " << density_warmup_steps << " steps";
    o << ", error feedback " << (ErrorFeedback() ? "on" : "off")
      << ", min " << min_compress_bytes << "B";
    if (emulated_select_cost > 0) {
      o << ", selection padded to " << emulated_select_cost << " s x n log2 n (emulation)";
    }
    o << ")";
  }
  o << ", merge ";
  for (size_t i = 0; i < merge.planners.size(); ++i) {
    o << (i ? "," : "") << merge.planners[i];
    if (merge.planners[i] == "fixed") o << ":" << merge.bucket_bytes << "B";
  }
  o << " (plan after " << merge.warmup_steps << " steps"
    << (compressor == Compressor::kNone ? ""
        : merge.compress_always         ? ", always compressed"
                                        : ", dense where faster")
    << ")"
    << ", transport " << (transport == TransportKind::kNccl ? "nccl" : "gloo") << ", timeout "
    << timeout_s << "s";
  if (!timeline.empty()) o << ", timeline " << timeline;
  if (metrics_port != 0) o << ", metrics on port " << metrics_port;
  if (from_slurm) o << " (node, coordinator and listen from Slurm where SPARSYNC_* is unset)";
  return o.str();
}

std::map<std::string, std::string> SparsyncEnvironment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; e && *e; ++e) {
    std::string kv(*e);
    auto eq = kv.find('=');
    if (eq == std::string::npos) continue;
    std::string key = kv.substr(0, eq);
    if (key.rfind("SPARSYNC_", 0) == 0 || key.rfind("SLURM_", 0) == 0 ||
        key == "SLURMD_NODENAME" || key == "XDG_RUNTIME_DIR") {
      env[key] = kv.substr(eq + 1);
    }
  }
  return env;
}

std::string DefaultSocketPath(const std::map<std::string, std::string>& env) {
  auto it = env.find("XDG_RUNTIME_DIR");
  if (it != env.end() && !it->second.empty()) return it->second + "/sparsync/sparsyncd.sock";
  return "/tmp/sparsync-" + std::to_string(getuid()) + "/sparsyncd.sock";
}

namespace {

// A daemon started by srun takes what SPARSYNC_* and the flags left unset from Slurm.
Status ApplySlurm(const std::map<std::string, std::string>& env,
                  const std::set<std::string>& set_explicitly, const HostnamesFn& hostnames,
                  Config* c) {
  SPARSYNC_ASSIGN_OR_RETURN(std::optional<SlurmStep> step, ReadSlurmStep(env));
  if (!step) return Status::Ok();
  auto unset = [&](const char* var) { return set_explicitly.count(var) == 0; };
  if (unset("SPARSYNC_NODE_RANK")) c->node_rank = step->node_rank;
  if (unset("SPARSYNC_NUM_NODES")) c->num_nodes = step->num_nodes;
  if (unset("SPARSYNC_LISTEN") && !step->node_name.empty()) c->listen = step->node_name;
  if (unset("SPARSYNC_COORDINATOR")) {
    SPARSYNC_ASSIGN_OR_RETURN(std::string host, SlurmCoordinatorHost(*step, hostnames));
    c->coordinator = host + ":" + std::to_string(step->coordinator_port);
  }
  c->from_slurm = true;
  return Status::Ok();
}

}  // namespace

ParsedConfig ParseConfig(int argc, const char* const* argv,
                         const std::map<std::string, std::string>& env,
                         const HostnamesFn& hostnames) {
  ParsedConfig out;
  std::vector<Setting> settings = Settings();
  CLI::App app{
      "sparsyncd: the sparsync gradient-reduction daemon, one per node.\n"
      "Each option can also be set by the environment variable shown; a flag wins over the "
      "variable, the variable over the default.",
      "sparsyncd"};
  app.get_formatter()->column_width(34);
  std::vector<std::string> flag_values(settings.size());
  std::string environment_only;
  for (size_t i = 0; i < settings.size(); ++i) {
    const Setting& s = settings[i];
    const std::string help = s.help + "\n[env " + s.env + ", default " + s.default_text + "]";
    CLI::Option* option = app.add_option("--" + s.flag, flag_values[i], help);
    if (!s.flag_refused.empty()) {
      option->group("");  // accepted only to be refused with its reason, so not listed
      environment_only += "\n  " + s.env + ": " + help;
    }
  }
  if (!environment_only.empty()) app.footer("Set in the environment only:" + environment_only);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    out.exit = true;
    out.exit_code = 0;
    out.message = app.help();
    return out;
  } catch (const CLI::ParseError& e) {
    out.exit = true;
    out.exit_code = 2;
    out.message = std::string("sparsyncd: ") + e.what() + "\nRun with --help for more information.";
    return out;
  }
  std::set<std::string> set_explicitly;  // by a flag or a SPARSYNC_* variable
  for (size_t i = 0; i < settings.size(); ++i) {
    const Setting& s = settings[i];
    std::string value;
    if (app.get_option("--" + s.flag)->count() > 0) {
      if (!s.flag_refused.empty()) {
        out.exit = true;
        out.exit_code = 2;
        out.message = "sparsyncd: invalid configuration: " + s.flag_refused;
        return out;
      }
      value = flag_values[i];
    } else if (auto it = env.find(s.env); it != env.end()) {
      value = it->second;
    } else {
      continue;
    }
    Status st = s.apply(value, &out.config);
    if (!st.ok()) {
      out.exit = true;
      out.exit_code = 2;
      out.message = "sparsyncd: invalid configuration: " + st.message();
      return out;
    }
    set_explicitly.insert(s.env);
  }
  Config& c = out.config;
  if (Status st = ApplySlurm(env, set_explicitly, hostnames, &c); !st.ok()) {
    out.exit = true;
    out.exit_code = 2;
    out.message = "sparsyncd: invalid configuration: " + st.message();
    return out;
  }
  if (c.socket_path.empty()) c.socket_path = DefaultSocketPath(env);
  const int tls_files = !c.tls.cert.empty() + !c.tls.key.empty() + !c.tls.ca.empty();
  if (tls_files != 0 && tls_files != 3) {
    out.exit = true;
    out.exit_code = 2;
    out.message = "sparsyncd: invalid configuration: TLS needs all three of SPARSYNC_TLS_CERT, "
                  "SPARSYNC_TLS_KEY and SPARSYNC_TLS_CA (--tls-cert, --tls-key, --tls-ca)";
    return out;
  }
  if (c.node_rank >= c.num_nodes) {
    out.exit = true;
    out.exit_code = 2;
    out.message = "sparsyncd: invalid configuration: SPARSYNC_NODE_RANK (--node-rank) = " +
                  std::to_string(c.node_rank) + " must be below SPARSYNC_NUM_NODES (--num-nodes) = " +
                  std::to_string(c.num_nodes);
  }
  return out;
}

}  // namespace sparsync
