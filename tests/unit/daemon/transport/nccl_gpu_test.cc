// The NCCL backend's entry point, CreateNcclTransport, against real NCCL and CUDA. Labelled `gpu`
// in ctest. NCCL refuses two ranks on one GPU, so the device test is a one-node communicator
// running every call; the multi-node logic is covered on CPU by nccl_transport_test. Without a
// device (or in a build without NCCL) the device test skips, and the tests here check instead
// that creating the transport fails with a clear error rather than crashing.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "daemon/transport/nccl/create_nccl_transport.h"
#include "tests/unit/daemon/transport/memory_store.h"

namespace sparsync::transport {
namespace {

using namespace std::chrono_literals;

TEST(NcclGpuTest, WithoutNcclOrAGpuCreationFailsClearly) {
  if (NcclUsableDevices() > 0) GTEST_SKIP() << "a CUDA device is present";
  MemoryStore store;
  auto t = CreateNcclTransport(0, 1, &store, 5s, /*device=*/0);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kUnavailable) << t.status().ToString();
  if (!NcclTransportBuilt()) {
    EXPECT_NE(t.status().message().find("built without NCCL"), std::string::npos)
        << t.status().ToString();
  }
}

TEST(NcclGpuTest, ANonexistentDeviceIsRejected) {
  if (!NcclTransportBuilt() || NcclUsableDevices() == 0) GTEST_SKIP() << "no CUDA device";
  MemoryStore store;
  auto t = CreateNcclTransport(0, 1, &store, 5s, /*device=*/NcclUsableDevices());
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument) << t.status().ToString();
}

TEST(NcclGpuTest, OneNodeCommunicatorRunsEveryCall) {
  if (!NcclTransportBuilt()) GTEST_SKIP() << "built without NCCL";
  if (NcclUsableDevices() == 0) GTEST_SKIP() << "no CUDA device";
  MemoryStore store;
  auto created = CreateNcclTransport(0, 1, &store, 60s, /*device=*/0);
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

TEST(NcclGpuTest, DestroyingAHealthyTransportFinalisesCleanly) {
  if (!NcclTransportBuilt()) GTEST_SKIP() << "built without NCCL";
  if (NcclUsableDevices() == 0) GTEST_SKIP() << "no CUDA device";
  for (int round = 0; round < 2; ++round) {  // a second communicator after the first is gone
    MemoryStore store;
    auto created = CreateNcclTransport(0, 1, &store, 60s, /*device=*/0);
    ASSERT_TRUE(created.ok()) << created.status().ToString();
    double d = 2.5;
    ASSERT_TRUE((*created)->AllReduceSum(&d, 1, ElementType::kFloat64, 1).ok());
    EXPECT_EQ(d, 2.5);
  }
}

}  // namespace
}  // namespace sparsync::transport
