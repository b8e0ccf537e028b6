// The credentials of the coordinator's gRPC channel: insecure by default, or mutual TLS with
// gRPC's own SSL credentials when SPARSYNC_TLS_CERT, _KEY and _CA name PEM files (issue 16, D2).
// With TLS every node presents a certificate the job's authority signed and checks the other
// side's: the coordinator refuses a node without one, and a node refuses a coordinator whose
// certificate does not name the host of SPARSYNC_COORDINATOR.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>

#include "daemon/common/config.h"
#include "daemon/common/status.h"

namespace sparsync::negotiation {

// The PEM files of `tls`, read and checked: the key must be ours and of mode 0600.
struct TlsMaterial {
  std::string cert, key, ca;
};
Result<TlsMaterial> LoadTls(const Config::Tls& tls);

// Insecure credentials when `tls` is empty.
Result<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(const Config::Tls& tls);
Result<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(const Config::Tls& tls);

}  // namespace sparsync::negotiation
