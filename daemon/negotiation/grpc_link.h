// GrpcCoordinatorLink: a non-zero node's connection to the coordinator on node 0.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "daemon/negotiation/coordinator_link.h"
#include "sparsync/v1/coordinator.grpc.pb.h"


namespace sparsync::negotiation {

class GrpcCoordinatorLink : public CoordinatorLink {
 public:
  // `rpc_timeout`: deadline of the short calls (everything but Join, StoreGet and Poll, whose
  // deadline follows their own wait). `credentials`: insecure or TLS (grpc_tls.h).
  GrpcCoordinatorLink(const std::string& address, std::string job_token,
                      std::chrono::milliseconds rpc_timeout,
                      std::shared_ptr<grpc::ChannelCredentials> credentials =
                          grpc::InsecureChannelCredentials());
  ~GrpcCoordinatorLink() override;

  Status Join(const JoinInfo& info, std::chrono::milliseconds timeout) override;
  Status StoreSet(const std::string& key, const std::string& value) override;
  Result<std::vector<std::string>> StoreGet(const std::vector<std::string>& keys,
                                            std::chrono::milliseconds timeout) override;
  using CoordinatorLink::Report;
  Result<std::vector<uint32_t>> Report(int node, const std::vector<TensorMeta>& new_tensors,
                                       const std::vector<ReportedReady>& ready,
                                       const RankNews& ranks) override;
  Result<std::vector<ScheduleEntry>> Poll(int node, uint64_t after_seq,
                                          std::chrono::milliseconds wait) override;
  Status Fail(int node, const Status& error) override;
  Status Leave(int node) override;
  void Cancel() override;

 private:
  class Call;  // one RPC in flight, registered so that Cancel can end it
  void SetDeadline(grpc::ClientContext* ctx, std::chrono::milliseconds d) const;
  // FromGrpc with "`doing` at <address>"; once joined, a lost connection names this node and
  // node 0 ("node 2 lost the coordinator (node 0 at <address>) ...").
  Status Check(const grpc::Status& status, const char* doing) const;

  std::string address_;
  std::string job_token_;
  std::atomic<int> node_rank_{-1};  // this node, once joined
  std::chrono::milliseconds rpc_timeout_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  std::mutex calls_mu_;
  std::condition_variable cancelled_cv_;      // Join's back-off ends early on Cancel
  std::set<grpc::ClientContext*> calls_;      // guarded by calls_mu_
  bool cancelled_ = false;                    // guarded by calls_mu_
};

}  // namespace sparsync::negotiation
