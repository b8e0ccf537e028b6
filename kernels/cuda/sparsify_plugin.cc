// libsparsync_sparsify_cuda.so: the C interface of sparsify_plugin.h over the device API
// (cuda_kernels.h). Arguments are checked here first (sparsify_plugin_support.h), so a failure the
// kernels report when enqueueing can only be a CUDA error; Finish's result is told apart by what
// the workspace's last call was (see FinishCode).

#include "kernels/cuda/sparsify_plugin.h"

#include <cuda_runtime_api.h>

#include <memory>
#include <utility>
#include <vector>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/sparsify_plugin_support.h"

struct sparsync_sp_workspace {
  enum class Call { kNone, kSelection, kScatterAdd };

  std::unique_ptr<sparsync::kernels::cuda::Workspace> kernels;
  Call last = Call::kNone;  // the last call enqueued, which Finish reads
};

namespace sparsync::kernels::cuda {
namespace {

using Call = sparsync_sp_workspace::Call;

cudaStream_t Stream(void* stream) { return static_cast<cudaStream_t>(stream); }

int Fail(sparsync_sp_error* error, sparsync_sp_code code, const Status& status,
         int64_t index = -1) {
  return plugin::SetError(error, code, status.message().c_str(), index);
}

// A failed Finish: the non-finite element (the workspace kept its index), an invalid payload entry
// (INVALID_ARGUMENT after a scatter-add), or else a CUDA error. Top-k never overflows its output
// here (k <= capacity is checked), so OUT_OF_RANGE after a selection is the CUDA out-of-memory
// error. One case is ambiguous: a cudaErrorInvalidValue while reading a scatter-add's result back
// reads as an invalid payload entry (its message names the CUDA error).
sparsync_sp_code FinishCode(const sparsync_sp_workspace& ws, const Status& status) {
  if (ws.kernels->last_nonfinite_index() >= 0) return SPARSYNC_SP_NONFINITE;
  if (ws.last == Call::kScatterAdd && status.code() == StatusCode::kInvalidArgument) {
    return SPARSYNC_SP_INVALID_ARGUMENT;
  }
  return SPARSYNC_SP_CUDA;
}

int WorkspaceCreate(int64_t max_numel, int64_t max_k, sparsync_sp_workspace** out,
                    sparsync_sp_error* error) {
  const Status args = plugin::CheckWorkspaceArgs(max_numel, max_k, out);
  if (!args.ok()) return Fail(error, SPARSYNC_SP_INVALID_ARGUMENT, args);
  *out = nullptr;
  auto created = Workspace::Create(WorkspaceLimits{max_numel, max_k});
  if (!created.ok()) return Fail(error, SPARSYNC_SP_CUDA, created.status());
  auto workspace = std::make_unique<sparsync_sp_workspace>();
  workspace->kernels = std::move(created).value();
  *out = workspace.release();
  return SPARSYNC_SP_OK;
}

int TopKResidual(const float* grad, float* residual, int64_t numel, int64_t k, int32_t* indices,
                 float* values, int64_t capacity, sparsync_sp_workspace* workspace, void* stream,
                 sparsync_sp_error* error) {
  const Status args = plugin::CheckTopKResidualArgs(
      grad, residual, numel, k, indices, values, capacity, workspace != nullptr,
      workspace != nullptr ? workspace->kernels->limits().max_numel : 0);
  if (!args.ok()) return Fail(error, SPARSYNC_SP_INVALID_ARGUMENT, args);
  workspace->last = Call::kSelection;
  const Status launched =
      TopKWithResidual(grad, residual, numel, k, DeviceSparse{indices, values, capacity},
                       *workspace->kernels, Stream(stream));
  return launched.ok() ? SPARSYNC_SP_OK : Fail(error, SPARSYNC_SP_CUDA, launched);
}

int ScatterAdd(const sparsync_sp_payload* payloads, int num_payloads, float* dense, int64_t numel,
               double divisor, sparsync_sp_workspace* workspace, void* stream,
               sparsync_sp_error* error) {
  const Status args = plugin::CheckScatterAddArgs(
      payloads, num_payloads, dense, numel, divisor, workspace != nullptr,
      workspace != nullptr ? workspace->kernels->limits().max_numel : 0);
  if (!args.ok()) return Fail(error, SPARSYNC_SP_INVALID_ARGUMENT, args);
  std::vector<DevicePayload> device(static_cast<size_t>(num_payloads));
  for (int p = 0; p < num_payloads; ++p) {
    device[static_cast<size_t>(p)] = DevicePayload{payloads[p].indices, payloads[p].values,
                                                   payloads[p].count, PayloadValues::kFloat32};
  }
  workspace->last = Call::kScatterAdd;
  const Status launched =
      ScatterAddAverage(device, dense, numel, divisor, *workspace->kernels, Stream(stream));
  return launched.ok() ? SPARSYNC_SP_OK : Fail(error, SPARSYNC_SP_CUDA, launched);
}

int PackHalves(const float* values, const int32_t* indices, int64_t count, uint16_t* out,
                float* residual, int64_t numel, void* stream, sparsync_sp_error* error) {
  const Status args = plugin::CheckPackArgs(values, indices, count, out, residual, numel);
  if (!args.ok()) return Fail(error, SPARSYNC_SP_INVALID_ARGUMENT, args);
  const Status launched =
      PackFloat16WithResidual(values, indices, count, out, residual, numel, Stream(stream));
  return launched.ok() ? SPARSYNC_SP_OK : Fail(error, SPARSYNC_SP_CUDA, launched);
}

int DivideDense(float* data, int64_t numel, double divisor, void* stream,
                sparsync_sp_error* error) {
  const Status args = plugin::CheckDivideArgs(data, numel, divisor);
  if (!args.ok()) return Fail(error, SPARSYNC_SP_INVALID_ARGUMENT, args);
  const Status launched = Divide(data, numel, divisor, Stream(stream));
  return launched.ok() ? SPARSYNC_SP_OK : Fail(error, SPARSYNC_SP_CUDA, launched);
}

int FinishCall(sparsync_sp_workspace* workspace, void* stream, int64_t* count,
               sparsync_sp_error* error) {
  if (count != nullptr) *count = 0;
  if (workspace == nullptr) {
    return plugin::SetError(error, SPARSYNC_SP_INVALID_ARGUMENT,
                            "sparsync_sp_finish: null workspace");
  }
  if (workspace->last == Call::kNone) {  // nothing to read back yet
    const Status synced = CudaStatus(cudaStreamSynchronize(Stream(stream)),
                                     "sparsync_sp_finish: waiting for the stream");
    return synced.ok() ? SPARSYNC_SP_OK : Fail(error, SPARSYNC_SP_CUDA, synced);
  }
  const Result<int64_t> result = workspace->kernels->Finish(Stream(stream));
  if (!result.ok()) {
    return Fail(error, FinishCode(*workspace, result.status()), result.status(),
                workspace->kernels->last_nonfinite_index());
  }
  if (count != nullptr) *count = *result;
  return SPARSYNC_SP_OK;
}

}  // namespace
}  // namespace sparsync::kernels::cuda

// The exported symbols: everything else in the library is hidden (sparsify_plugin.map).
#define SPARSYNC_SP_EXPORT __attribute__((visibility("default")))
using sparsync::kernels::cuda::plugin::Guarded;

extern "C" {

SPARSYNC_SP_EXPORT int sparsync_sp_abi_version(void) { return SPARSYNC_SP_ABI_VERSION; }

SPARSYNC_SP_EXPORT int sparsync_sp_workspace_create(int64_t max_numel, int64_t max_k,
                                                    sparsync_sp_workspace** out,
                                                    sparsync_sp_error* error) {
  return Guarded("sparsync_sp_workspace_create", error, [&] {
    return sparsync::kernels::cuda::WorkspaceCreate(max_numel, max_k, out, error);
  });
}

SPARSYNC_SP_EXPORT void sparsync_sp_workspace_destroy(sparsync_sp_workspace* workspace) {
  delete workspace;  // ~Workspace frees the device scratch and throws nothing
}

SPARSYNC_SP_EXPORT int sparsync_sp_topk_residual(const float* grad, float* residual, int64_t numel,
                                                 int64_t k, int32_t* indices, float* values,
                                                 int64_t capacity, sparsync_sp_workspace* workspace,
                                                 void* stream, sparsync_sp_error* error) {
  return Guarded("sparsync_sp_topk_residual", error, [&] {
    return sparsync::kernels::cuda::TopKResidual(grad, residual, numel, k, indices, values,
                                                 capacity, workspace, stream, error);
  });
}

SPARSYNC_SP_EXPORT int sparsync_sp_scatter_add_average(const sparsync_sp_payload* payloads,
                                                       int num_payloads, float* dense,
                                                       int64_t numel, double divisor,
                                                       sparsync_sp_workspace* workspace,
                                                       void* stream, sparsync_sp_error* error) {
  return Guarded("sparsync_sp_scatter_add_average", error, [&] {
    return sparsync::kernels::cuda::ScatterAdd(payloads, num_payloads, dense, numel, divisor,
                                               workspace, stream, error);
  });
}

SPARSYNC_SP_EXPORT int sparsync_sp_pack_float16_residual(const float* values,
                                                         const int32_t* indices, int64_t count,
                                                         uint16_t* out, float* residual,
                                                         int64_t numel, void* stream,
                                                         sparsync_sp_error* error) {
  return Guarded("sparsync_sp_pack_float16_residual", error, [&] {
    return sparsync::kernels::cuda::PackHalves(values, indices, count, out, residual, numel,
                                                stream, error);
  });
}

SPARSYNC_SP_EXPORT int sparsync_sp_divide(float* data, int64_t numel, double divisor, void* stream,
                                          sparsync_sp_error* error) {
  return Guarded("sparsync_sp_divide", error, [&] {
    return sparsync::kernels::cuda::DivideDense(data, numel, divisor, stream, error);
  });
}

SPARSYNC_SP_EXPORT int sparsync_sp_finish(sparsync_sp_workspace* workspace, void* stream,
                                          int64_t* count, sparsync_sp_error* error) {
  return Guarded("sparsync_sp_finish", error, [&] {
    return sparsync::kernels::cuda::FinishCall(workspace, stream, count, error);
  });
}

}  // extern "C"
