#pragma once
// What the two libraries behind sparsify_plugin.h share: the real one (sparsify_plugin.cc, on the
// CUDA kernels) and the CPU fake (tests/support/fake_sparsify). Both check their arguments here, so
// they reject the same calls with the same messages, and both write errors and catch exceptions at
// the C boundary the same way. Plain C++, no CUDA.

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <limits>
#include <string>

#include "kernels/cuda/sparsify_plugin.h"
#include "kernels/status.h"

namespace sparsync::kernels::cuda::plugin {

inline void ClearError(sparsync_sp_error* error) {
  if (error == nullptr) return;
  error->message[0] = '\0';
  error->index = -1;
}

// Writes `message` (truncated to fit) and `index` into *error when it is not null; returns `code`.
inline int SetError(sparsync_sp_error* error, sparsync_sp_code code, const char* message,
                    int64_t index = -1) {
  if (error != nullptr) {
    std::snprintf(error->message, sizeof(error->message), "%s", message);
    error->index = index;
  }
  return code;
}

// Runs `body` (which returns a sparsync_sp_code) with *error cleared first; an exception (only
// std::bad_alloc is expected) becomes SPARSYNC_SP_INTERNAL instead of crossing the C boundary.
template <class Body>
int Guarded(const char* who, sparsync_sp_error* error, Body&& body) noexcept {
  try {
    ClearError(error);
    return body();
  } catch (const std::exception& e) {
    char message[sizeof(sparsync_sp_error::message)];
    std::snprintf(message, sizeof(message), "%s: %s", who, e.what());
    return SetError(error, SPARSYNC_SP_INTERNAL, message);
  } catch (...) {
    char message[sizeof(sparsync_sp_error::message)];
    std::snprintf(message, sizeof(message), "%s: unknown exception", who);
    return SetError(error, SPARSYNC_SP_INTERNAL, message);
  }
}

// The argument checks of every call; a non-OK Status is SPARSYNC_SP_INVALID_ARGUMENT.

inline Status CheckWorkspaceArgs(int64_t max_numel, int64_t max_k, const void* out) {
  const std::string who = "sparsync_sp_workspace_create: ";
  if (out == nullptr) return InvalidArgumentError(who + "null output");
  if (max_numel < 0 || max_numel > std::numeric_limits<int32_t>::max()) {
    return InvalidArgumentError(who + "max_numel " + std::to_string(max_numel) +
                                " must be in [0, INT32_MAX]");
  }
  if (max_k < 0 || max_k > max_numel) {
    return InvalidArgumentError(who + "max_k " + std::to_string(max_k) + " must be in [0, " +
                                std::to_string(max_numel) + " = max_numel]");
  }
  return Status::Ok();
}

// max_numel: the workspace's (ignored when `has_workspace` is false).
inline Status CheckTopKResidualArgs(const float* grad, const float* residual, int64_t numel,
                                    int64_t k, const int32_t* indices, const float* values,
                                    int64_t capacity, bool has_workspace, int64_t max_numel) {
  const std::string who = "sparsync_sp_topk_residual: ";
  if (!has_workspace) return InvalidArgumentError(who + "null workspace");
  if (numel < 1 || numel > max_numel) {
    return InvalidArgumentError(who + "numel " + std::to_string(numel) +
                                " must be in [1, the workspace's max_numel " +
                                std::to_string(max_numel) + "]");
  }
  if (k < 1 || k > numel) {
    return InvalidArgumentError(who + "k " + std::to_string(k) + " must be in [1, numel " +
                                std::to_string(numel) + "]");
  }
  if (capacity < k) {
    return InvalidArgumentError(who + "output capacity " + std::to_string(capacity) +
                                " is below k " + std::to_string(k));
  }
  if (grad == nullptr || residual == nullptr || indices == nullptr || values == nullptr) {
    return InvalidArgumentError(who + "null grad, residual, indices or values");
  }
  return Status::Ok();
}

inline Status CheckScatterAddArgs(const sparsync_sp_payload* payloads, int num_payloads,
                                  const float* dense, int64_t numel, double divisor,
                                  bool has_workspace, int64_t max_numel) {
  const std::string who = "sparsync_sp_scatter_add_average: ";
  if (!has_workspace) return InvalidArgumentError(who + "null workspace");
  if (numel < 0 || numel > max_numel) {
    return InvalidArgumentError(who + "numel " + std::to_string(numel) +
                                " must be in [0, the workspace's max_numel " +
                                std::to_string(max_numel) + "]");
  }
  if (num_payloads < 0 || (num_payloads > 0 && payloads == nullptr)) {
    return InvalidArgumentError(who + "num_payloads " + std::to_string(num_payloads) +
                                " with payloads " + (payloads == nullptr ? "null" : "given"));
  }
  if (numel > 0 && dense == nullptr) return InvalidArgumentError(who + "null dense");
  if (!std::isfinite(divisor) || divisor == 0) {
    return InvalidArgumentError(who + "divisor " + std::to_string(divisor) +
                                " must be finite and non-zero");
  }
  for (int p = 0; p < num_payloads; ++p) {
    const sparsync_sp_payload& payload = payloads[p];
    if (payload.count < 0 || payload.count > numel) {
      return InvalidArgumentError(who + "payload " + std::to_string(p) + " has " +
                                  std::to_string(payload.count) + " entries for numel " +
                                  std::to_string(numel));
    }
    if (payload.count > 0 && (payload.indices == nullptr || payload.values == nullptr)) {
      return InvalidArgumentError(who + "payload " + std::to_string(p) + " has null buffers");
    }
  }
  return Status::Ok();
}

inline Status CheckPackArgs(const float* values, const int32_t* indices, int64_t count,
                           const uint16_t* out, const float* residual, int64_t numel) {
  const std::string who = "sparsync_sp_pack_float16_residual: ";
  if (count < 0 || numel < 0) {
    return InvalidArgumentError(who + "count " + std::to_string(count) + " and numel " +
                                std::to_string(numel) + " must not be negative");
  }
  if (count > 0 &&
      (values == nullptr || indices == nullptr || out == nullptr || residual == nullptr)) {
    return InvalidArgumentError(who + "null values, indices, out or residual");
  }
  return Status::Ok();
}

inline Status CheckDivideArgs(const float* data, int64_t numel, double divisor) {
  const std::string who = "sparsync_sp_divide: ";
  if (numel < 0) {
    return InvalidArgumentError(who + "numel " + std::to_string(numel) + " must not be negative");
  }
  if (!std::isfinite(divisor) || !(divisor > 0)) {
    return InvalidArgumentError(who + "divisor " + std::to_string(divisor) +
                                " must be finite and positive");
  }
  if (numel > 0 && data == nullptr) return InvalidArgumentError(who + "null data");
  return Status::Ok();
}

}  // namespace sparsync::kernels::cuda::plugin
