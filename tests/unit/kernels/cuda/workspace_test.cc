// Workspace creation and the CUDA error conversion. Two of these tests run on machines without a
// GPU as well: they check that a missing device or driver is a clean FAILED_PRECONDITION, not a
// crash, which is what the daemon relies on to fall back to the CPU kernels.

#include <gtest/gtest.h>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_status.h"
#include "tests/unit/kernels/cuda/cuda_test_util.h"

namespace sparsync::kernels::cuda {
namespace {

using testing::CudaTest;
using testing::HaveDevice;

TEST(CudaWorkspaceTest, RejectsBadLimitsBeforeTouchingTheDevice) {
  EXPECT_EQ(Workspace::Create({-1, 0}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Workspace::Create({int64_t{1} << 31, 0}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Workspace::Create({10, 11}).status().code(), StatusCode::kInvalidArgument);
}

TEST(CudaWorkspaceTest, WithoutADeviceCreateIsAFailedPrecondition) {
  if (HaveDevice()) GTEST_SKIP() << "a device is present";
  auto made = Workspace::Create({1000, 10});
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().code(), StatusCode::kFailedPrecondition) << made.status().ToString();
  EXPECT_NE(made.status().message().find("cuda"), std::string::npos);
}

TEST(CudaStatusTest, ConvertsErrorClasses) {
  EXPECT_TRUE(CudaStatus(cudaSuccess, "x").ok());
  EXPECT_EQ(CudaStatus(cudaErrorNoDevice, "x").code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(CudaStatus(cudaErrorInsufficientDriver, "x").code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(CudaStatus(cudaErrorNoKernelImageForDevice, "x").code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(CudaStatus(cudaErrorMemoryAllocation, "x").code(), StatusCode::kOutOfRange);
  EXPECT_EQ(CudaStatus(cudaErrorInvalidValue, "x").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CudaStatus(cudaErrorIllegalAddress, "x").code(), StatusCode::kInternal);
  const Status s = CudaStatus(cudaErrorMemoryAllocation, "cuda Workspace: candidates");
  EXPECT_NE(s.message().find("cuda Workspace: candidates: cudaErrorMemoryAllocation"),
            std::string::npos)
      << s.message();
}

TEST_F(CudaTest, WorkspaceOfZeroElementsWorks) {
  auto made = Workspace::Create({0, 0});
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  Workspace& ws = **made;
  EXPECT_NE(ws.device_count(), nullptr);
  ASSERT_TRUE(TopK(nullptr, 0, 0, {}, ws, stream_).ok());
  auto k = ws.Finish(stream_);
  ASSERT_TRUE(k.ok()) << k.status().ToString();
  EXPECT_EQ(*k, 0);
}

}  // namespace
}  // namespace sparsync::kernels::cuda
