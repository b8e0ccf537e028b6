// NcclLibrary: the NCCL functions the daemon uses, resolved at run time with dlopen/dlsym (the
// daemon's one binding of NCCL, like cuda_runtime.h for the CUDA runtime), and NcclStatus, the
// one conversion of NCCL's result codes into Status values. Two parts of the daemon use it: the
// local reduce across a node's GPUs (device_clique.h: ncclCommInitAll, ncclReduce,
// ncclBroadcast) and the NCCL transport between nodes (daemon/transport/nccl/cuda_nccl_api.cc:
// one non-blocking communicator per node). A CPU-only build and a machine without NCCL are
// unaffected: loading fails with a message, and the callers fall back (the local reduce sums on
// the host) or refuse to start (SPARSYNC_TRANSPORT=nccl, a library named in SPARSYNC_LIBNCCL).
//
// The types mirror nccl.h so that this header builds without NCCL; nccl_library_check.cc holds
// them against the real header wherever NCCL is installed. Tests load a fake NCCL with the same
// symbols (tests/support/fake_nccl/).
#pragma once

#include <climits>
#include <cstddef>
#include <memory>
#include <string>

#include "daemon/common/status.h"
#include "daemon/common/tensor_meta.h"
#include "daemon/device/cuda_runtime.h"

namespace sparsync::device {

using NcclComm = void*;  // ncclComm_t

// ncclResult_t.
inline constexpr int kNcclSuccess = 0;
inline constexpr int kNcclUnhandledCudaError = 1;
inline constexpr int kNcclSystemError = 2;
inline constexpr int kNcclInternalError = 3;
inline constexpr int kNcclInvalidArgument = 4;
inline constexpr int kNcclInvalidUsage = 5;
inline constexpr int kNcclRemoteError = 6;
inline constexpr int kNcclInProgress = 7;

inline constexpr int kNcclSum = 0;  // ncclSum

// NCCL_VERSION(2, 14, 0): the first NCCL with ncclConfig_t, ncclCommInitRankConfig and
// non-blocking communicators; LoadNccl refuses older ones.
inline constexpr int kNcclMinVersion = 21400;

struct NcclUniqueId {  // ncclUniqueId: opaque bytes, passed by value
  char internal[128];
};

inline constexpr unsigned kNcclConfigMagic = 0xcafebeef;  // NCCL_CONFIG_INITIALIZER's magic
inline constexpr int kNcclConfigUndefInt = INT_MIN;       // NCCL_CONFIG_UNDEF_INT: NCCL decides

// ncclConfig_t's leading fields, up to commName (the last one the daemon sets), with the values
// of NCCL_CONFIG_INITIALIZER. Why a prefix is a valid config for every NCCL since 2.14: NCCL only
// ever appends fields to the struct, and ncclCommInitRankConfig copies min(size, its own
// sizeof(ncclConfig_t)) bytes of the caller's struct over its defaults, refuses a wrong magic,
// and resets to their defaults the fields that are newer than the caller's `version`. So a newer
// NCCL gives the fields past commName their defaults, and an older one, whose struct ends sooner
// (2.18's ends at splitShare), ignores those it lacks. `version` is the loaded library's own, as
// NCCL_CONFIG_INITIALIZER would write it in a program built against that library, so NCCL reads
// every field set here (below 2.14 it would ignore `blocking`).
struct NcclConfig {
  size_t size = sizeof(NcclConfig);
  unsigned magic = kNcclConfigMagic;
  unsigned version = 0;
  int blocking = kNcclConfigUndefInt;  // 0: calls may return ncclInProgress instead of waiting
  int cga_cluster_size = kNcclConfigUndefInt;
  int min_ctas = kNcclConfigUndefInt;
  int max_ctas = kNcclConfigUndefInt;
  const char* net_name = nullptr;
  int split_share = kNcclConfigUndefInt;
  int traffic_class = kNcclConfigUndefInt;
  const char* comm_name = nullptr;  // shown in NCCL's logs and error messages
};

struct NcclLibrary {
  std::string library;  // the file the functions came from, for messages
  int version = 0;      // ncclGetVersion's, e.g. 22809

  int (*GetVersion)(int* version);
  const char* (*GetErrorString)(int result);
  // The text of the last NCCL error in this process (NCCL ignores `comm`).
  const char* (*GetLastError)(NcclComm comm);
  int (*GetUniqueId)(NcclUniqueId* id);
  // The local reduce: one blocking communicator per device of this process.
  int (*CommInitAll)(NcclComm* comms, int ndev, const int* devlist);
  // The transport: this process's rank of a communicator spanning nodes, on the current device.
  int (*CommInitRankConfig)(NcclComm* comm, int nranks, NcclUniqueId id, int rank,
                            NcclConfig* config);
  // kNcclInProgress while a non-blocking call is still being enqueued; sticky once failed.
  int (*CommGetAsyncError)(NcclComm comm, int* result);
  int (*CommFinalize)(NcclComm comm);
  int (*CommDestroy)(NcclComm comm);
  int (*CommAbort)(NcclComm comm);
  int (*GroupStart)();
  int (*GroupEnd)();
  int (*Reduce)(const void* send, void* recv, size_t count, int datatype, int op, int root,
                NcclComm comm, CudaStream stream);
  int (*Broadcast)(const void* send, void* recv, size_t count, int datatype, int root,
                   NcclComm comm, CudaStream stream);
  int (*AllReduce)(const void* send, void* recv, size_t count, int datatype, int op, NcclComm comm,
                   CudaStream stream);
  int (*AllGather)(const void* send, void* recv, size_t send_count, int datatype, NcclComm comm,
                   CudaStream stream);
  int (*Send)(const void* data, size_t count, int datatype, int peer, NcclComm comm,
              CudaStream stream);
  int (*Recv)(void* data, size_t count, int datatype, int peer, NcclComm comm, CudaStream stream);

  // NCCL_CONFIG_INITIALIZER for this library (see NcclConfig).
  NcclConfig DefaultConfig() const;
};

// Loads NCCL: `explicit_path` (SPARSYNC_LIBNCCL) when not empty, else libnccl.so.2, and binds
// every function above (a library that lacks one, or is older than 2.14, is refused). On failure
// returns null and sets *error to a message naming what was tried. The library stays loaded for
// the life of the process, so the local reduce and the transport share one NCCL.
std::shared_ptr<const NcclLibrary> LoadNccl(const std::string& explicit_path, std::string* error);

// OK for ncclSuccess and for ncclInProgress (a non-blocking communicator accepted the call and is
// still enqueuing it: the caller follows it with CommGetAsyncError; a blocking communicator never
// returns it). Otherwise "what: <NCCL's text> (ncclXxx)", NCCL's last error message when there is
// one, and a code that says whether another try elsewhere could help: kUnavailable with a hint for
// ncclRemoteError (a peer failed or left) and ncclSystemError (the network or a system call),
// kInvalidArgument for ncclInvalidArgument and ncclInvalidUsage, kInternal for the rest.
Status NcclStatus(const NcclLibrary& nccl, int result, const std::string& what,
                  NcclComm comm = nullptr);

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
