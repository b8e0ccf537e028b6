#pragma once
// Helpers of the CUDA kernel tests: skipping without a device, device arrays, and running one
// selection call into a host-side testing::Selection for comparison with the reference oracles.
//
// Every test that needs a GPU derives from CudaTest / CudaParamTest, whose SetUp skips
// (GTEST_SKIP) when cudaGetDeviceCount fails (no driver: the runtime is linked statically, so
// the binary starts without libcuda) or finds no device.

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_kernels.h"
#include "tests/unit/kernels/test_util.h"

namespace sparsync::kernels::cuda::testing {

using kernels::testing::Selection;

// Empty when a device is usable; otherwise why not.
inline std::string NoDeviceReason() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    return std::string("cudaGetDeviceCount: ") + cudaGetErrorName(error) + " (" +
           cudaGetErrorString(error) + ")";
  }
  if (count == 0) return "no CUDA device";
  return "";
}

inline bool HaveDevice() {
  static const bool have = NoDeviceReason().empty();
  return have;
}

#define SPARSYNC_SKIP_WITHOUT_GPU()                                         \
  do {                                                                      \
    if (!::sparsync::kernels::cuda::testing::HaveDevice()) {                \
      GTEST_SKIP() << "needs a CUDA device: "                               \
                   << ::sparsync::kernels::cuda::testing::NoDeviceReason(); \
    }                                                                       \
  } while (0)

template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t n) : size_(n) {
    void* raw = nullptr;
    const cudaError_t error = cudaMalloc(&raw, std::max<size_t>(n, 1) * sizeof(T));
    EXPECT_EQ(error, cudaSuccess) << cudaGetErrorString(error);
    data_ = static_cast<T*>(raw);
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) { Upload(host); }
  ~DeviceArray() {
    if (data_ != nullptr) cudaFree(data_);
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() const { return data_; }
  size_t size() const { return size_; }

  void Upload(const std::vector<T>& host) {
    ASSERT_LE(host.size(), size_);
    if (host.empty()) return;
    ASSERT_EQ(cudaMemcpy(data_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  std::vector<T> Download(size_t count) const {
    std::vector<T> host(count);
    if (count > 0) {
      EXPECT_EQ(cudaMemcpy(host.data(), data_, count * sizeof(T), cudaMemcpyDeviceToHost),
                cudaSuccess);
    }
    return host;
  }
  std::vector<T> Download() const { return Download(size_); }

 private:
  size_t size_;
  T* data_ = nullptr;
};

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SPARSYNC_SKIP_WITHOUT_GPU();
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  cudaStream_t stream_ = nullptr;
};

template <typename Param>
class CudaParamTest : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    SPARSYNC_SKIP_WITHOUT_GPU();
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  cudaStream_t stream_ = nullptr;
};

inline std::unique_ptr<Workspace> MustCreate(int64_t max_numel, int64_t max_k) {
  auto made = Workspace::Create({max_numel, max_k});
  EXPECT_TRUE(made.ok()) << made.status().ToString();
  return made.ok() ? std::move(made).value() : nullptr;
}

// Runs call(out) with an output of `capacity` pairs, then Finish; the selection as the host sees
// it (status: the call's, else Finish's).
template <class Call>
Selection RunSelection(Workspace& ws, int64_t capacity, cudaStream_t stream, Call call) {
  DeviceArray<int32_t> indices(static_cast<size_t>(capacity));
  DeviceArray<float> values(static_cast<size_t>(capacity));
  Selection result;
  result.status = call(DeviceSparse{indices.get(), values.get(), capacity});
  if (!result.status.ok()) return result;
  auto k = ws.Finish(stream);
  if (!k.ok()) {
    result.status = k.status();
    return result;
  }
  result.indices = indices.Download(static_cast<size_t>(*k));
  result.values = values.Download(static_cast<size_t>(*k));
  return result;
}

}  // namespace sparsync::kernels::cuda::testing
