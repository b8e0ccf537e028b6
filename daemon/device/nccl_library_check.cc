// Holds nccl_library.h's mirror of NCCL's types and constants against the real nccl.h. Compiled
// only where NCCL's header is found; it produces no code.
#include <nccl.h>

#include "daemon/device/nccl_library.h"

namespace sparsync::device {
namespace {

static_assert(kNcclSuccess == ncclSuccess && kNcclSum == ncclSum);
static_assert(sizeof(ncclComm_t) == sizeof(void*) && sizeof(ncclResult_t) == sizeof(int));
static_assert(sizeof(ncclDataType_t) == sizeof(int) && sizeof(ncclRedOp_t) == sizeof(int));
static_assert(NcclDataType(DType::kFloat32) == ncclFloat32);
static_assert(NcclDataType(DType::kFloat64) == ncclFloat64);
static_assert(NcclDataType(DType::kFloat16) == ncclFloat16);
static_assert(NcclDataType(DType::kBFloat16) == ncclBfloat16);
static_assert(NcclDataType(DType::kInt32) == ncclInt32);
static_assert(NcclDataType(DType::kInt64) == ncclInt64);
static_assert(NcclDataType(DType::kUInt8) == ncclUint8);

}  // namespace
}  // namespace sparsync::device
