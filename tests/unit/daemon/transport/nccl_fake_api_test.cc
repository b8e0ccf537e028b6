// The fake NCCL itself (nccl_fake_api.h): its strictness is what lets the NCCL transport's tests
// fail, so it is tested too: misuse during a non-blocking enqueue, mismatched collectives, and
// memory a collective may not touch.
#include "tests/unit/daemon/transport/nccl_fake_api.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace sparsync::transport {
namespace {

bool Contains(const Status& st, const std::string& text) {
  return st.message().find(text) != std::string::npos;
}

TEST(FakeNcclWorldTest, AStreamCallDuringANonBlockingEnqueueIsAUsageError) {
  auto world = FakeNcclWorld::Create(1);
  world->SetEnqueuePolls(3);
  auto api = world->NewApi();
  auto id = api->NewUniqueId();
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(api->InitComm(*id, 0, 1).ok());
  auto device = api->AllocDevice(64);
  auto host = api->AllocPinnedHost(64);
  ASSERT_TRUE(device.ok() && host.ok());
  ASSERT_TRUE(api->AllReduceSum(*device, *device, 4, ElementType::kFloat32).ok());
  // Not waiting for CommState() == kReady before the copy is the bug the fake must catch.
  Status st = api->CopyDeviceToHost(*host, *device, 16);
  EXPECT_FALSE(st.ok());
  EXPECT_TRUE(Contains(st, "in progress")) << st.ToString();
  EXPECT_FALSE(api->CommState().ok());
}

TEST(FakeNcclWorldTest, DifferentCollectivesOnTwoNodesAreAnAsyncError) {
  auto world = FakeNcclWorld::Create(2);
  std::vector<std::unique_ptr<NcclApi>> apis;
  std::string id(128, 'i');
  std::vector<void*> buffers;
  for (int r = 0; r < 2; ++r) {
    apis.push_back(world->NewApi());
    ASSERT_TRUE(apis[r]->InitComm(id, r, 2).ok());
    auto device = apis[r]->AllocDevice(64);
    ASSERT_TRUE(device.ok());
    buffers.push_back(*device);
  }
  ASSERT_TRUE(apis[0]->AllReduceSum(buffers[0], buffers[0], 4, ElementType::kFloat32).ok());
  ASSERT_TRUE(apis[1]->Broadcast(buffers[1], buffers[1], 16, 0).ok());
  for (int r = 0; r < 2; ++r) {
    auto state = apis[r]->CommState();
    ASSERT_FALSE(state.ok());
    EXPECT_TRUE(Contains(state.status(), "collective #0")) << state.status().ToString();
  }
}

TEST(FakeNcclWorldTest, HostMemoryInACollectiveIsRejected) {
  auto world = FakeNcclWorld::Create(1);
  auto api = world->NewApi();
  ASSERT_TRUE(api->InitComm(std::string(128, 'i'), 0, 1).ok());
  auto host = api->AllocPinnedHost(64);
  ASSERT_TRUE(host.ok());
  EXPECT_FALSE(api->AllReduceSum(*host, *host, 4, ElementType::kFloat32).ok());
  float pageable[4] = {};
  auto device = api->AllocDevice(64);
  ASSERT_TRUE(device.ok());
  EXPECT_FALSE(api->CopyDeviceToHost(pageable, *device, sizeof(pageable)).ok());
}

TEST(FakeNcclWorldTest, CallerDeviceMemoryIsDeviceMemoryOfItsOwnNodeOnly) {
  auto world = FakeNcclWorld::Create(2);
  std::vector<std::unique_ptr<NcclApi>> apis;
  for (int r = 0; r < 2; ++r) {
    apis.push_back(world->NewApi());
    ASSERT_TRUE(apis[r]->InitComm(std::string(128, 'i'), r, 2).ok());
  }
  void* mine = world->AllocCallerDevice(0, 64);
  float host[16] = {};
  EXPECT_FALSE(apis[1]->AllReduceSum(mine, mine, 16, ElementType::kFloat32).ok())
      << "another node's GPU";
  EXPECT_FALSE(apis[0]->AllReduceSum(host, host, 16, ElementType::kFloat32).ok());
  EXPECT_FALSE(apis[0]->AllReduceSum(mine, mine, 17, ElementType::kFloat32).ok()) << "past its end";
  EXPECT_TRUE(apis[0]->AllReduceSum(mine, mine, 16, ElementType::kFloat32).ok());
  EXPECT_EQ(world->collectives_issued(0), 1u);
  EXPECT_EQ(world->device_allocations(0), 0);
}

}  // namespace
}  // namespace sparsync::transport
