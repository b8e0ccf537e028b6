// Holds nccl_library.h's mirror of NCCL's types and constants against the real nccl.h. Compiled
// only where NCCL's header is found; it produces no code.
#include <nccl.h>

#include <cstddef>

#include "daemon/device/nccl_library.h"

namespace sparsync::device {
namespace {

static_assert(kNcclSuccess == ncclSuccess && kNcclUnhandledCudaError == ncclUnhandledCudaError &&
              kNcclSystemError == ncclSystemError && kNcclInternalError == ncclInternalError &&
              kNcclInvalidArgument == ncclInvalidArgument &&
              kNcclInvalidUsage == ncclInvalidUsage && kNcclRemoteError == ncclRemoteError &&
              kNcclInProgress == ncclInProgress);
static_assert(kNcclSum == ncclSum);
static_assert(sizeof(ncclComm_t) == sizeof(NcclComm) && sizeof(ncclResult_t) == sizeof(int));
static_assert(sizeof(ncclDataType_t) == sizeof(int) && sizeof(ncclRedOp_t) == sizeof(int));
static_assert(NcclDataType(DType::kFloat32) == ncclFloat32);
static_assert(NcclDataType(DType::kFloat64) == ncclFloat64);
static_assert(NcclDataType(DType::kFloat16) == ncclFloat16);
static_assert(NcclDataType(DType::kBFloat16) == ncclBfloat16);
static_assert(NcclDataType(DType::kInt32) == ncclInt32);
static_assert(NcclDataType(DType::kInt64) == ncclInt64);
static_assert(NcclDataType(DType::kUInt8) == ncclUint8);
static_assert(kNcclMinVersion == NCCL_VERSION(2, 14, 0));

// The unique id: the same bytes, passed by value the same way.
static_assert(sizeof(NcclUniqueId) == sizeof(ncclUniqueId) &&
              alignof(NcclUniqueId) == alignof(ncclUniqueId) &&
              sizeof(NcclUniqueId::internal) == NCCL_UNIQUE_ID_BYTES);

// The config: a prefix of ncclConfig_t, field by field, with NCCL_CONFIG_INITIALIZER's values.
#define SPARSYNC_SAME_FIELD(ours, theirs)                                       \
  static_assert(offsetof(NcclConfig, ours) == offsetof(ncclConfig_t, theirs) && \
                sizeof(NcclConfig::ours) == sizeof(ncclConfig_t::theirs))
SPARSYNC_SAME_FIELD(size, size);
SPARSYNC_SAME_FIELD(magic, magic);
SPARSYNC_SAME_FIELD(version, version);
SPARSYNC_SAME_FIELD(blocking, blocking);
SPARSYNC_SAME_FIELD(cga_cluster_size, cgaClusterSize);
SPARSYNC_SAME_FIELD(min_ctas, minCTAs);
SPARSYNC_SAME_FIELD(max_ctas, maxCTAs);
SPARSYNC_SAME_FIELD(net_name, netName);
SPARSYNC_SAME_FIELD(split_share, splitShare);
SPARSYNC_SAME_FIELD(traffic_class, trafficClass);
SPARSYNC_SAME_FIELD(comm_name, commName);
#undef SPARSYNC_SAME_FIELD
static_assert(sizeof(NcclConfig) <= sizeof(ncclConfig_t) &&
              alignof(NcclConfig) == alignof(ncclConfig_t));
static_assert(kNcclConfigUndefInt == NCCL_CONFIG_UNDEF_INT);

constexpr ncclConfig_t kInitializer = NCCL_CONFIG_INITIALIZER;
constexpr NcclConfig kOurs{};
static_assert(kOurs.size == sizeof(NcclConfig) && kInitializer.size == sizeof(ncclConfig_t));
static_assert(kOurs.magic == kInitializer.magic);
static_assert(kOurs.blocking == kInitializer.blocking &&
              kOurs.cga_cluster_size == kInitializer.cgaClusterSize &&
              kOurs.min_ctas == kInitializer.minCTAs && kOurs.max_ctas == kInitializer.maxCTAs &&
              kOurs.net_name == kInitializer.netName &&
              kOurs.split_share == kInitializer.splitShare &&
              kOurs.traffic_class == kInitializer.trafficClass &&
              kOurs.comm_name == kInitializer.commName);

}  // namespace
}  // namespace sparsync::device
