// NcclLibrary: the NCCL functions the daemon uses, resolved at run time with dlopen/dlsym (the
// daemon's one binding of NCCL, like cuda_runtime.h for the CUDA runtime), and NcclStatus, the
// one conversion of NCCL's result codes into Status values. A CPU-only build and a machine
// without NCCL are unaffected: loading fails with a message, and the callers fall back (the local
// reduce sums on the host) or refuse to start (a library named in SPARSYNC_LIBNCCL).
//
// The types mirror nccl.h so that this header builds without NCCL; nccl_library_check.cc holds
// them against the real header wherever NCCL is installed. Tests load a fake NCCL with the same
// symbols (tests/support/fake_nccl/).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "daemon/common/status.h"
#include "daemon/common/tensor_meta.h"
#include "daemon/device/cuda_runtime.h"

namespace sparsync::device {

inline constexpr int kNcclSuccess = 0;  // ncclSuccess
inline constexpr int kNcclSum = 0;      // ncclSum

struct NcclLibrary {
  std::string library;  // the file the functions came from, for messages
  int version = 0;      // ncclGetVersion's, e.g. 22805
  int (*GetVersion)(int* version);
  const char* (*GetErrorString)(int result);
  int (*CommInitAll)(void** comms, int ndev, const int* devlist);
  int (*CommDestroy)(void* comm);
  int (*GroupStart)();
  int (*GroupEnd)();
  int (*Reduce)(const void* send, void* recv, size_t count, int datatype, int op, int root,
                void* comm, CudaStream stream);
  int (*Broadcast)(const void* send, void* recv, size_t count, int datatype, int root, void* comm,
                   CudaStream stream);
};

// Loads NCCL: `explicit_path` (SPARSYNC_LIBNCCL) when not empty, else libnccl.so.2. On failure
// returns null and sets *error to a message naming what was tried. The library stays loaded for
// the life of the process.
std::shared_ptr<const NcclLibrary> LoadNccl(const std::string& explicit_path, std::string* error);

// OK for ncclSuccess; otherwise "what: <NCCL's text> (code)" as kInternal.
Status NcclStatus(const NcclLibrary& nccl, int result, const std::string& what);

// The NCCL element type (ncclDataType_t) of `dtype`.
constexpr int NcclDataType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return 7;   // ncclFloat32
    case DType::kFloat64: return 8;   // ncclFloat64
    case DType::kFloat16: return 6;   // ncclFloat16
    case DType::kBFloat16: return 9;  // ncclBfloat16
    case DType::kInt32: return 2;     // ncclInt32
    case DType::kInt64: return 4;     // ncclInt64
    case DType::kUInt8: return 1;     // ncclUint8
  }
  return -1;
}

// Whether the local reduce takes tensors of `dtype`: those the host sums in their own type
// (float32, float64, int32, int64). Half types and uint8 stay on the host, which accumulates them
// in float32; NCCL would sum them in their own type (float16 overflows at 65504, uint8 wraps).
constexpr bool SummedOnDevice(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat64 || dtype == DType::kInt32 ||
         dtype == DType::kInt64;
}

}  // namespace sparsync::device
