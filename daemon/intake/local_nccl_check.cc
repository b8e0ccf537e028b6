// Holds local_nccl's mirror of NCCL's types and constants against the real nccl.h. Compiled only
// where NCCL's header is found; it produces no code.
#include <nccl.h>

#include "daemon/intake/local_nccl.h"

namespace sparsync::intake {
namespace {

static_assert(kNcclSuccess == ncclSuccess && kNcclSum == ncclSum);
static_assert(sizeof(ncclComm_t) == sizeof(void*) && sizeof(ncclResult_t) == sizeof(int));
static_assert(sizeof(ncclDataType_t) == sizeof(int) && sizeof(ncclRedOp_t) == sizeof(int));
static_assert(NcclDataType(SPARSYNC_FLOAT32) == ncclFloat32);
static_assert(NcclDataType(SPARSYNC_FLOAT64) == ncclFloat64);
static_assert(NcclDataType(SPARSYNC_FLOAT16) == ncclFloat16);
static_assert(NcclDataType(SPARSYNC_BFLOAT16) == ncclBfloat16);
static_assert(NcclDataType(SPARSYNC_INT32) == ncclInt32);
static_assert(NcclDataType(SPARSYNC_INT64) == ncclInt64);
static_assert(NcclDataType(SPARSYNC_UINT8) == ncclUint8);

}  // namespace
}  // namespace sparsync::intake
