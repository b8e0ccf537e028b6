// libFuzzer target: the configuration parser (daemon/common/config.h), flags and environment.
// The input is split at NUL bytes: the first piece's first byte is how many pieces after it are
// command-line arguments (at most 24), the rest are NAME=VALUE environment entries. Parsing ends
// in a configuration or in a message with an exit code, never a crash; a configuration it accepts
// describes itself, and its values are in their documented ranges.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "daemon/common/config.h"

namespace {

void Require(bool condition) {
  if (!condition) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> pieces(1);
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == '\0') {
      pieces.emplace_back();
    } else {
      pieces.back().push_back(static_cast<char>(data[i]));
    }
  }
  const size_t nargs = pieces[0].empty() ? 0 : static_cast<uint8_t>(pieces[0][0]) % 25;
  std::vector<const char*> argv{"sparsyncd"};
  size_t i = 1;
  for (; i < pieces.size() && argv.size() <= nargs; ++i) argv.push_back(pieces[i].c_str());
  std::map<std::string, std::string> env;
  for (; i < pieces.size(); ++i) {
    const size_t eq = pieces[i].find('=');
    if (eq != std::string::npos) env[pieces[i].substr(0, eq)] = pieces[i].substr(eq + 1);
  }
  sparsync::ParsedConfig parsed =
      sparsync::ParseConfig(static_cast<int>(argv.size()), argv.data(), env);
  if (parsed.exit) {
    Require(!parsed.message.empty());
    Require(parsed.exit_code == 0 || parsed.exit_code == 2);
    return 0;
  }
  const sparsync::Config& c = parsed.config;
  Require(c.node_rank >= 0 && c.node_rank < c.num_nodes);
  Require(c.local_size >= 1 && c.local_size <= 1024);
  Require(c.density > 0 && c.density <= 1);
  Require(c.timeout_s > 0 && c.stall_warn_s > 0);
  Require(c.cycle_ms >= 0 && c.cycle_ms <= 1000);
  Require(!c.socket_path.empty());
  Require(c.job_token.size() <= 64);
  Require(!c.merge.planners.empty());
  Require(c.tls.cert.empty() == c.tls.key.empty() && c.tls.key.empty() == c.tls.ca.empty());
  Require(!c.Describe().empty());
  return 0;
}
