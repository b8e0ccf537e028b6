#include "daemon/common/logging.h"

#include <spdlog/sinks/stdout_sinks.h>

namespace sparsync {

void InitLogging(int node_rank, const std::string& level) {
  auto logger = spdlog::stderr_logger_mt("sparsyncd");
  logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [node " + std::to_string(node_rank) + "] [%l] %v");
  logger->set_level(spdlog::level::from_str(level));
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
}

}  // namespace sparsync
