// The gRPC edge of the coordinator: serves CoordinatorCore to the other nodes. Handlers only
// translate and call the core.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>

#include "daemon/negotiation/coordinator_core.h"
#include "sparsync/v1/coordinator.pb.h"

namespace sparsync::negotiation {

// What each RPC does with its request, apart from the server: the token check, the translation
// and the call into the core. The service calls these; so does the fuzzer (tests/fuzz), which
// drives the coordinator's state machine through them with arbitrary requests from several nodes.
class CoordinatorHandlers {
 public:
  // `max_wait`: the longest a Poll or StoreGet may wait (the fuzzer gives 0).
  CoordinatorHandlers(CoordinatorCore* core, std::chrono::milliseconds max_wait);

  // `wait`: how long Join may wait for the other nodes; `peer`: the caller's address as gRPC
  // reports it ("ipv4:10.0.0.2:41234"), kept to name the node in errors.
  grpc::Status Join(const v1::JoinRequest& req, std::chrono::milliseconds wait,
                    const std::string& peer);
  grpc::Status StoreSet(const v1::StoreSetRequest& req);
  grpc::Status StoreGet(const v1::StoreGetRequest& req, v1::StoreGetResponse* resp);
  grpc::Status Report(const v1::ReportRequest& req, v1::ReportResponse* resp);
  grpc::Status Poll(const v1::PollRequest& req, v1::PollResponse* resp);
  grpc::Status Fail(const v1::FailRequest& req);
  grpc::Status Leave(const v1::LeaveRequest& req);

 private:
  CoordinatorCore* const core_;
  const std::chrono::milliseconds max_wait_;
};

// The host part of a gRPC peer string: "ipv4:10.0.0.2:41234" -> "10.0.0.2", "ipv6:[::1]:5" ->
// "::1"; "" when it has none.
std::string PeerHost(const std::string& peer);

class CoordinatorServer {
 public:
  // `credentials`: insecure or TLS (grpc_tls.h).
  CoordinatorServer(CoordinatorCore* core, std::shared_ptr<grpc::ServerCredentials> credentials =
                                               grpc::InsecureServerCredentials());
  ~CoordinatorServer();
  // Binds `address` (host:port; port 0: any free one) and starts serving the `nodes` of the job
  // (each holds a long Poll and sometimes a Report: the server keeps a thread for each).
  Status Start(const std::string& address, int nodes = 1);
  void Stop();
  int port() const { return port_; }  // the port bound by Start

 private:
  class Service;
  std::unique_ptr<Service> service_;
  std::shared_ptr<grpc::ServerCredentials> credentials_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace sparsync::negotiation
