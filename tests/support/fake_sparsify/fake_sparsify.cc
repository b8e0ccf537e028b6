// A fake of libsparsync_sparsify_cuda.so for CPU-only machines: the C interface of
// kernels/cuda/sparsify_plugin.h on the CPU kernels, loaded in place of the real library by tests.
// "Device" pointers are host pointers (the fake CUDA runtime, tests/support/fake_cudart, makes
// them in host memory); streams are ignored: every call does its work at once, and
// sparsync_sp_finish only reports the result of the workspace's last call.
//
// Same semantics as the real library, result for result:
//   top-k          a = residual + grad (float32); the k largest |a|, ties to the smaller index, by
//                  the project's CPU top-k (kernels::MakeSparsifier("topk")), indices ascending;
//                  residual = a with those coordinates zeroed. A non-finite a selects nothing,
//                  leaves a in residual, and finish reports SPARSYNC_SP_NONFINITE with the index
//                  of its first non-finite element.
//   scatter-add    dense = 0, then every payload's values added in payload order in float32,
//                  then divided by (float)divisor unless it is 1. Entries out of [0, numel) or
//                  not strictly above the entry before them are skipped; finish reports them as
//                  SPARSYNC_SP_INVALID_ARGUMENT.
//   float16 pack   out[j] = kernels/dtype.h FloatToHalf(values[j]) and residual[indices[j]] =
//                  values[j] - HalfToFloat(out[j]), entries out of [0, numel) skipped.
//   divide         data[i] /= (float)divisor in float32, nothing done for divisor 1.
//   arguments      checked by the code the real library uses (sparsify_plugin_support.h); a
//                  rejected call leaves the workspace's last result as it was.
// For tests it also counts the selections and scatter-adds it ran (sparsync_fake_sp_calls).
#include <atomic>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>

#include "kernels/cuda/sparsify_plugin.h"
#include "kernels/cuda/sparsify_plugin_support.h"
#include "kernels/dtype.h"
#include "kernels/sparsifier.h"

struct sparsync_sp_workspace {
  int64_t max_numel = 0;
  int64_t max_k = 0;
  // The CPU top-k for the last k asked for, prepared for max_numel.
  std::unique_ptr<sparsync::kernels::Sparsifier> topk;
  int64_t topk_k = 0;
  // The result of the last call, which finish reports.
  sparsync_sp_code code = SPARSYNC_SP_OK;
  std::string message;
  int64_t nonfinite_index = -1;
  int64_t count = 0;
};

namespace sparsync::kernels::cuda::plugin {
namespace {

std::atomic<int64_t> calls{0};

int Reject(sparsync_sp_error* error, const Status& status) {
  return SetError(error, SPARSYNC_SP_INVALID_ARGUMENT, status.message().c_str());
}

void Record(sparsync_sp_workspace& ws, sparsync_sp_code code, std::string message, int64_t count,
            int64_t nonfinite_index = -1) {
  ws.code = code;
  ws.message = std::move(message);
  ws.count = count;
  ws.nonfinite_index = nonfinite_index;
}

int WorkspaceCreate(int64_t max_numel, int64_t max_k, sparsync_sp_workspace** out,
                    sparsync_sp_error* error) {
  const Status args = CheckWorkspaceArgs(max_numel, max_k, out);
  if (!args.ok()) return Reject(error, args);
  auto ws = std::make_unique<sparsync_sp_workspace>();
  ws->max_numel = max_numel;
  ws->max_k = max_k;
  *out = ws.release();
  return SPARSYNC_SP_OK;
}

// The CPU top-k of ws for k, made (and its scratch allocated) when k changes.
Status PrepareTopK(sparsync_sp_workspace& ws, int64_t k) {
  if (ws.topk != nullptr && ws.topk_k == k) return Status::Ok();
  SparsifierOptions options;
  options.k = k;
  auto made = MakeSparsifier("topk", options);
  SPARSYNC_KERNELS_RETURN_IF_ERROR(made.status());
  ws.topk = std::move(made).value();
  ws.topk_k = 0;
  SPARSYNC_KERNELS_RETURN_IF_ERROR(ws.topk->Prepare(ws.max_numel, DType::kFloat32));
  ws.topk_k = k;
  return Status::Ok();
}

int TopKResidual(const float* grad, float* residual, int64_t numel, int64_t k, int32_t* indices,
                 float* values, int64_t capacity, sparsync_sp_workspace* ws,
                 sparsync_sp_error* error) {
  const Status args = CheckTopKResidualArgs(grad, residual, numel, k, indices, values, capacity,
                                            ws != nullptr, ws != nullptr ? ws->max_numel : 0);
  if (!args.ok()) return Reject(error, args);
  calls.fetch_add(1, std::memory_order_relaxed);
  int64_t first_nonfinite = -1;
  for (int64_t i = 0; i < numel; ++i) {
    residual[i] += grad[i];  // residual = a
    if (first_nonfinite < 0 && !std::isfinite(residual[i])) first_nonfinite = i;
  }
  if (first_nonfinite >= 0) {
    Record(*ws, SPARSYNC_SP_NONFINITE,
           NonFiniteError(first_nonfinite, residual[first_nonfinite]).message(), 0,
           first_nonfinite);
    return SPARSYNC_SP_OK;
  }
  SparseView out{indices, values, capacity, 0};
  Status selected = PrepareTopK(*ws, k);
  if (selected.ok()) {
    selected =
        ws->topk->Sparsify(DenseView{residual, numel, DType::kFloat32}, &out, SparsifyContext{});
  }
  if (!selected.ok()) {  // a broken invariant of the CPU kernels: arguments were checked
    Record(*ws, SPARSYNC_SP_INTERNAL, "fake sparsync_sp_topk_residual: " + selected.ToString(), 0);
    return SPARSYNC_SP_OK;
  }
  for (int64_t j = 0; j < out.k; ++j) residual[indices[j]] = 0.0f;
  Record(*ws, SPARSYNC_SP_OK, "", out.k);
  return SPARSYNC_SP_OK;
}

int ScatterAdd(const sparsync_sp_payload* payloads, int num_payloads, float* dense, int64_t numel,
               double divisor, sparsync_sp_workspace* ws, sparsync_sp_error* error) {
  const Status args = CheckScatterAddArgs(payloads, num_payloads, dense, numel, divisor,
                                          ws != nullptr, ws != nullptr ? ws->max_numel : 0);
  if (!args.ok()) return Reject(error, args);
  calls.fetch_add(1, std::memory_order_relaxed);
  for (int64_t i = 0; i < numel; ++i) dense[i] = 0.0f;
  int64_t invalid = 0;
  for (int p = 0; p < num_payloads; ++p) {
    const sparsync_sp_payload& payload = payloads[p];
    for (int64_t e = 0; e < payload.count; ++e) {
      const int64_t i = payload.indices[e];
      if (i < 0 || i >= numel || (e > 0 && payload.indices[e - 1] >= i)) {
        ++invalid;
        continue;
      }
      dense[i] += payload.values[e];
    }
  }
  if (divisor != 1.0) {
    const float d = static_cast<float>(divisor);
    for (int64_t i = 0; i < numel; ++i) dense[i] /= d;
  }
  if (invalid > 0) {
    Record(*ws, SPARSYNC_SP_INVALID_ARGUMENT,
           "fake ScatterAddAverage: " + std::to_string(invalid) +
               " payload entries have an index out of range or out of order; they were skipped",
           0);
  } else {
    Record(*ws, SPARSYNC_SP_OK, "", 0);
  }
  return SPARSYNC_SP_OK;
}

int PackFloat16(const float* values, const int32_t* indices, int64_t count, uint16_t* out,
                float* residual, int64_t numel, sparsync_sp_error* error) {
  const Status args = CheckPackArgs(values, indices, count, out, residual, numel);
  if (!args.ok()) return Reject(error, args);
  for (int64_t j = 0; j < count; ++j) {
    out[j] = FloatToHalf(values[j]);
    const int64_t i = indices[j];
    if (i >= 0 && i < numel) residual[i] = values[j] - HalfToFloat(out[j]);
  }
  return SPARSYNC_SP_OK;
}

int Divide(float* data, int64_t numel, double divisor, sparsync_sp_error* error) {
  const Status args = CheckDivideArgs(data, numel, divisor);
  if (!args.ok()) return Reject(error, args);
  if (divisor != 1.0) {
    const float d = static_cast<float>(divisor);
    for (int64_t i = 0; i < numel; ++i) data[i] /= d;
  }
  return SPARSYNC_SP_OK;
}

int FinishCall(sparsync_sp_workspace* ws, int64_t* count, sparsync_sp_error* error) {
  if (count != nullptr) *count = 0;
  if (ws == nullptr) {
    return SetError(error, SPARSYNC_SP_INVALID_ARGUMENT, "sparsync_sp_finish: null workspace");
  }
  if (ws->code != SPARSYNC_SP_OK) {
    return SetError(error, ws->code, ws->message.c_str(), ws->nonfinite_index);
  }
  if (count != nullptr) *count = ws->count;
  return SPARSYNC_SP_OK;
}

}  // namespace
}  // namespace sparsync::kernels::cuda::plugin

#define SPARSYNC_SP_EXPORT __attribute__((visibility("default")))
using sparsync::kernels::cuda::plugin::Guarded;
namespace fake = sparsync::kernels::cuda::plugin;

extern "C" {

SPARSYNC_SP_EXPORT int sparsync_sp_abi_version(void) { return SPARSYNC_SP_ABI_VERSION; }

SPARSYNC_SP_EXPORT int sparsync_sp_workspace_create(int64_t max_numel, int64_t max_k,
                                                    sparsync_sp_workspace** out,
                                                    sparsync_sp_error* error) {
  return Guarded("sparsync_sp_workspace_create", error,
                 [&] { return fake::WorkspaceCreate(max_numel, max_k, out, error); });
}

SPARSYNC_SP_EXPORT void sparsync_sp_workspace_destroy(sparsync_sp_workspace* workspace) {
  delete workspace;
}

SPARSYNC_SP_EXPORT int sparsync_sp_topk_residual(const float* grad, float* residual, int64_t numel,
                                                 int64_t k, int32_t* indices, float* values,
                                                 int64_t capacity, sparsync_sp_workspace* workspace,
                                                 void* stream, sparsync_sp_error* error) {
  return Guarded("sparsync_sp_topk_residual", error, [&] {
    return fake::TopKResidual(grad, residual, numel, k, indices, values, capacity, workspace,
                              error);
  });
}

SPARSYNC_SP_EXPORT int sparsync_sp_scatter_add_average(const sparsync_sp_payload* payloads,
                                                       int num_payloads, float* dense,
                                                       int64_t numel, double divisor,
                                                       sparsync_sp_workspace* workspace,
                                                       void* stream, sparsync_sp_error* error) {
  return Guarded("sparsync_sp_scatter_add_average", error, [&] {
    return fake::ScatterAdd(payloads, num_payloads, dense, numel, divisor, workspace, error);
  });
}

SPARSYNC_SP_EXPORT int sparsync_sp_pack_float16_residual(const float* values,
                                                         const int32_t* indices, int64_t count,
                                                         uint16_t* out, float* residual,
                                                         int64_t numel, void*,
                                                         sparsync_sp_error* error) {
  return Guarded("sparsync_sp_pack_float16_residual", error, [&] {
    return fake::PackFloat16(values, indices, count, out, residual, numel, error);
  });
}

SPARSYNC_SP_EXPORT int sparsync_sp_divide(float* data, int64_t numel, double divisor, void*,
                                          sparsync_sp_error* error) {
  return Guarded("sparsync_sp_divide", error,
                 [&] { return fake::Divide(data, numel, divisor, error); });
}

SPARSYNC_SP_EXPORT int sparsync_sp_finish(sparsync_sp_workspace* workspace, void* stream,
                                          int64_t* count, sparsync_sp_error* error) {
  return Guarded("sparsync_sp_finish", error,
                 [&] { return fake::FinishCall(workspace, count, error); });
}

// Not in sparsify_plugin.h: the number of selections and scatter-adds this library ran (calls it
// rejected are not counted), so that a test can tell that work went through the plugin.
SPARSYNC_SP_EXPORT int64_t sparsync_fake_sp_calls(void) {
  return fake::calls.load(std::memory_order_relaxed);
}

}  // extern "C"
