// The gRPC edge of the coordinator: serves CoordinatorCore to the other nodes. Handlers only
// translate and call the core.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "daemon/negotiation/coordinator_core.h"

namespace sparsync::negotiation {

class CoordinatorServer {
 public:
  explicit CoordinatorServer(CoordinatorCore* core);
  ~CoordinatorServer();
  // Binds `address` (host:port) and starts serving.
  Status Start(const std::string& address);
  void Stop();

 private:
  class Service;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace sparsync::negotiation
