// Logging: spdlog with the node rank on every line.
#pragma once

#include <spdlog/spdlog.h>

#include <string>

namespace sparsync {

// Installs the default logger: "[time] [node N] [level] message" on stderr.
void InitLogging(int node_rank, const std::string& level);

}  // namespace sparsync
