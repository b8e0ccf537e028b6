// Conversions between the negotiation vocabulary and the generated protobuf types, and between
// Status and grpc::Status. The only place besides the service and link that sees gRPC types.
#pragma once

#include <grpcpp/grpcpp.h>

#include "daemon/negotiation/types.h"
#include "sparsync/v1/coordinator.pb.h"

namespace sparsync::negotiation {

grpc::Status ToGrpc(const Status& status);
Status FromGrpc(const grpc::Status& status, const std::string& what);

void ToProto(const TensorMeta& in, v1::TensorMeta* out);
// Fails for a wire number the protocol does not define (a node of another build, or not ours).
Result<TensorMeta> FromProto(const v1::TensorMeta& in);
void ToProto(const ScheduleEntry& in, v1::ScheduleEntry* out);
ScheduleEntry FromProto(const v1::ScheduleEntry& in);

}  // namespace sparsync::negotiation
