// SparsifyPlugin: the CUDA sparsification library (kernels/cuda/sparsify_plugin.h) that the
// device reduce paths run their kernels through, loaded at the first use (SPARSYNC_SPARSIFY_
// LIBRARY, else libsparsync_sparsify_cuda.so beside the daemon's executable), like the CUDA
// runtime and NCCL, so a CPU-only build or machine is unaffected. It must use the same CUDA
// runtime as the intake (SPARSYNC_CUDART). If it does not load, or a device workspace cannot be
// made, the log says why once and the node's CUDA gradients take the host paths from then on.
//
// Thread-safety: every method is thread-safe.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "daemon/common/status.h"
#include "kernels/cuda/sparsify_plugin.h"

namespace sparsync::device {

// The library's functions (sparsify_plugin.h has their contracts).
struct SparsifyLibrary {
  std::string path;
  int (*AbiVersion)();
  int (*WorkspaceCreate)(int64_t, int64_t, sparsync_sp_workspace**, sparsync_sp_error*);
  void (*WorkspaceDestroy)(sparsync_sp_workspace*);
  int (*TopKResidual)(const float*, float*, int64_t, int64_t, int32_t*, float*, int64_t,
                      sparsync_sp_workspace*, void*, sparsync_sp_error*);
  int (*ScatterAddAverage)(const sparsync_sp_payload*, int, float*, int64_t, double,
                           sparsync_sp_workspace*, void*, sparsync_sp_error*);
  int (*PackFloat16Residual)(const float*, const int32_t*, int64_t, uint16_t*, float*, int64_t,
                             void*, sparsync_sp_error*);
  int (*Divide)(float*, int64_t, double, void*, sparsync_sp_error*);
  int (*Finish)(sparsync_sp_workspace*, void*, int64_t*, sparsync_sp_error*);
};

// The library's result as a Status; `what` names the call.
Status PluginStatus(int code, const sparsync_sp_error& error, const std::string& what);

class SparsifyPlugin {
 public:
  // `library`: SPARSYNC_SPARSIFY_LIBRARY (empty: beside the executable).
  explicit SparsifyPlugin(std::string library);

  // When a library is named: loads it now, so that a wrong setting stops the daemon at start.
  Status LoadExplicit();
  // The library, loading it at the first call; null when it does not load or was disabled.
  std::shared_ptr<const SparsifyLibrary> Library();
  bool Available() { return Library() != nullptr; }
  // The device paths are off from now on (a workspace could not be made): says why, once.
  void Disable(const std::string& why);
  // True the first time it is called with `what`, for one-time log lines.
  bool FirstTime(int what) { return !announced_[what].exchange(true); }

 private:
  bool LoadLocked(std::string* error);  // REQUIRES: mu_ held

  const std::string library_;
  std::mutex mu_;
  std::shared_ptr<const SparsifyLibrary> lib_;
  bool load_failed_ = false;
  bool disabled_ = false;
  std::atomic<bool> announced_[2] = {false, false};
};

}  // namespace sparsync::device
