// The NCCL backend's entry point, CreateNcclTransport, against the real NCCL and CUDA runtime,
// which it loads at run time (the default search: libcudart.so.13 or .12, libnccl.so.2).
// Labelled `gpu` in ctest. NCCL refuses two ranks on one GPU, so the device tests are a one-node
// communicator running every call, on host memory and on the caller's device memory
// (AllReduceSumOnDevice); the multi-node logic is covered on CPU by nccl_transport_test. Without
// a device the device tests skip, and the tests here check instead that the real libraries bind
// and that creating the transport fails with a clear error rather than crashing.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>
#include <vector>

#include "daemon/device/cuda_runtime.h"
#include "daemon/device/nccl_library.h"
#include "daemon/transport/nccl/create_nccl_transport.h"
#include "daemon/transport/nccl/cuda_nccl_api.h"
#include "tests/unit/daemon/transport/memory_store.h"

namespace sparsync::transport {
namespace {

using namespace std::chrono_literals;

// Waits up to 60 s for the stream of `cuda` to drain.
Status Drain(NcclApi& cuda) {
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (true) {
    auto idle = cuda.StreamIdle();
    if (!idle.ok()) return idle.status();
    if (*idle) return Status::Ok();
    if (std::chrono::steady_clock::now() >= deadline) {
      return DeadlineExceeded("a CUDA copy did not finish within 60 s");
    }
    cuda.Pause(100us);
  }
}

const NcclLibraries kDefaults;  // the libraries' default search

// Wherever they are installed, the real libraries have every function of the bindings.
TEST(NcclGpuTest, TheRealLibrariesBindEveryFunction) {
  std::string error;
  auto rt = device::LoadCudaRuntime("", &error);
  if (rt == nullptr) GTEST_SKIP() << error;
  auto nccl = device::LoadNccl("", &error);
  if (nccl == nullptr) GTEST_SKIP() << error;
  EXPECT_GE(nccl->version, device::kNcclMinVersion) << nccl->library;
  EXPECT_EQ(nccl->DefaultConfig().version, static_cast<unsigned>(nccl->version));
  const Status st = device::NcclStatus(*nccl, device::kNcclRemoteError, "x");
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find("(ncclRemoteError)"), std::string::npos) << st.ToString();
}

TEST(NcclGpuTest, WithoutAGpuCreationFailsClearly) {
  if (CudaDeviceCount(kDefaults) > 0) GTEST_SKIP() << "a CUDA device is present";
  MemoryStore store;
  auto t = CreateNcclTransport(0, 1, &store, 5s, /*device=*/0, kDefaults);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kUnavailable) << t.status().ToString();
  const std::string& why = t.status().message();
  EXPECT_TRUE(why.find("no CUDA device") != std::string::npos ||
              why.find("no CUDA runtime could be loaded") != std::string::npos)
      << why;
}

TEST(NcclGpuTest, ANonexistentDeviceIsRejected) {
  const int devices = CudaDeviceCount(kDefaults);
  if (devices == 0) GTEST_SKIP() << "no CUDA device";
  MemoryStore store;
  auto t = CreateNcclTransport(0, 1, &store, 5s, /*device=*/devices, kDefaults);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument) << t.status().ToString();
}

TEST(NcclGpuTest, OneNodeCommunicatorRunsEveryCall) {
  if (CudaDeviceCount(kDefaults) == 0) GTEST_SKIP() << "no CUDA device";
  MemoryStore store;
  auto created = CreateNcclTransport(0, 1, &store, 60s, /*device=*/0, kDefaults);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  Transport& t = **created;
  ASSERT_TRUE(store.Peek("nccl/unique_id").has_value());
  EXPECT_EQ(store.Peek("nccl/unique_id")->size(), 256u) << "128 bytes, hex-encoded";

  // Large enough to need several NCCL chunks and a staging buffer regrowth.
  for (size_t count : {size_t{1}, size_t{1000}, size_t{3000001}}) {
    std::vector<float> f(count);
    std::iota(f.begin(), f.end(), 0.5f);
    const std::vector<float> before = f;
    Status st = t.AllReduceSum(f.data(), f.size(), ElementType::kFloat32, 1);
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(f, before) << "a sum over one node is the identity";
  }
  std::vector<int64_t> i64 = {int64_t{1} << 50, -3, 7};
  ASSERT_TRUE(t.AllReduceSum(i64.data(), i64.size(), ElementType::kInt64, 2).ok());
  EXPECT_EQ(i64, (std::vector<int64_t>{int64_t{1} << 50, -3, 7}));

  std::vector<char> mine(777);
  std::iota(mine.begin(), mine.end(), 0);
  std::vector<char> all(777, 'x');
  const std::vector<size_t> sizes = {777};
  Status st = t.AllGatherV(mine.data(), mine.size(), all.data(), sizes, 3);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(all, mine);

  std::vector<char> b(4096, 'r');
  st = t.Broadcast(b.data(), b.size(), 0, 4);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(b, std::vector<char>(4096, 'r'));

  std::vector<char> got(16, 'x');
  size_t got_bytes = 0;
  st = t.SendRecv(0, mine.data(), 16, got.data(), got.size(), &got_bytes, 5);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(got_bytes, 16u);

  t.Abort(Aborted("test over"));
  float x = 1;
  EXPECT_EQ(t.AllReduceSum(&x, 1, ElementType::kFloat32, 6).code(), StatusCode::kAborted);
}

TEST(NcclGpuTest, AllReduceSumOnDeviceSumsInPlaceInCudaMemory) {
  if (CudaDeviceCount(kDefaults) == 0) GTEST_SKIP() << "no CUDA device";
  MemoryStore store;
  auto created = CreateNcclTransport(0, 1, &store, 60s, /*device=*/0, kDefaults);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  Transport& t = **created;
  EXPECT_EQ(t.cuda_device(), 0);

  // The caller's side: a cudaMalloc'd buffer, written and read back with copies on a stream of
  // its own, through the backend's CUDA seam (so this file needs no CUDA headers).
  auto made = CreateCudaNcclApi(0, kDefaults);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  NcclApi& cuda = **made;
  constexpr size_t kLargest = 3000001;
  auto device = cuda.AllocDevice(kLargest * sizeof(float));
  ASSERT_TRUE(device.ok()) << device.status().ToString();
  auto pinned = cuda.AllocPinnedHost(kLargest * sizeof(float));
  ASSERT_TRUE(pinned.ok()) << pinned.status().ToString();
  float* host = static_cast<float*>(*pinned);

  uint32_t tag = 1;
  for (size_t count : {size_t{1}, size_t{1000}, kLargest}) {
    const size_t bytes = count * sizeof(float);
    std::vector<float> values(count);
    std::iota(values.begin(), values.end(), 0.5f);
    std::memcpy(host, values.data(), bytes);
    ASSERT_TRUE(cuda.CopyHostToDevice(*device, host, bytes).ok());
    ASSERT_TRUE(Drain(cuda).ok());  // the caller's writes are finished before the call
    Status st = t.AllReduceSumOnDevice(*device, count, ElementType::kFloat32, tag++);
    ASSERT_TRUE(st.ok()) << st.ToString();
    std::fill(host, host + count, -1.0f);
    ASSERT_TRUE(cuda.CopyDeviceToHost(host, *device, bytes).ok());
    ASSERT_TRUE(Drain(cuda).ok());
    EXPECT_EQ(std::vector<float>(host, host + count), values)
        << "a sum over one node is the identity";
  }

  // A host call between device calls, and int64 in the same buffer.
  double d = 2.5;
  ASSERT_TRUE(t.AllReduceSum(&d, 1, ElementType::kFloat64, tag++).ok());
  EXPECT_EQ(d, 2.5);
  const std::vector<int64_t> i64 = {int64_t{1} << 50, -3, 7};
  std::memcpy(host, i64.data(), i64.size() * sizeof(int64_t));
  ASSERT_TRUE(cuda.CopyHostToDevice(*device, host, i64.size() * sizeof(int64_t)).ok());
  ASSERT_TRUE(Drain(cuda).ok());
  Status st = t.AllReduceSumOnDevice(*device, i64.size(), ElementType::kInt64, tag++);
  ASSERT_TRUE(st.ok()) << st.ToString();
  std::vector<int64_t> back(i64.size());
  ASSERT_TRUE(cuda.CopyDeviceToHost(host, *device, i64.size() * sizeof(int64_t)).ok());
  ASSERT_TRUE(Drain(cuda).ok());
  std::memcpy(back.data(), host, back.size() * sizeof(int64_t));
  EXPECT_EQ(back, i64);

  t.Abort(Aborted("test over"));
  EXPECT_EQ(t.AllReduceSumOnDevice(*device, 1, ElementType::kFloat32, tag).code(),
            StatusCode::kAborted);
  cuda.FreeDevice(*device);
  cuda.FreePinnedHost(*pinned);
}

TEST(NcclGpuTest, DestroyingAHealthyTransportFinalisesCleanly) {
  if (CudaDeviceCount(kDefaults) == 0) GTEST_SKIP() << "no CUDA device";
  for (int round = 0; round < 2; ++round) {  // a second communicator after the first is gone
    MemoryStore store;
    auto created = CreateNcclTransport(0, 1, &store, 60s, /*device=*/0, kDefaults);
    ASSERT_TRUE(created.ok()) << created.status().ToString();
    double d = 2.5;
    ASSERT_TRUE((*created)->AllReduceSum(&d, 1, ElementType::kFloat64, 1).ok());
    EXPECT_EQ(d, 2.5);
  }
}

}  // namespace
}  // namespace sparsync::transport
