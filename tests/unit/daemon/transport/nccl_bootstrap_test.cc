// NcclTransport's bootstrap through the rendezvous store, when it goes wrong: no unique id, a
// node that never joins, a malformed id, a rank outside the job, and one store key per
// communicator. Nodes as threads over FakeNcclWorld (nccl_fake_api.h).
#include "daemon/transport/nccl/nccl_transport.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "tests/unit/daemon/transport/memory_store.h"
#include "tests/unit/daemon/transport/nccl_fake_api.h"

namespace sparsync::transport {
namespace {

using namespace std::chrono_literals;

bool Contains(const Status& st, const std::string& text) {
  return st.message().find(text) != std::string::npos;
}

TEST(NcclBootstrapTest, NoUniqueIdFromNodeZeroTimesOut) {
  auto world = FakeNcclWorld::Create(2);
  MemoryStore store;
  NcclTransportOptions options;
  options.timeout = 200ms;
  auto t = NcclTransport::Create(world->NewApi(), 1, 2, &store, options);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kDeadlineExceeded) << t.status().ToString();
  EXPECT_TRUE(Contains(t.status(), "node 0's NCCL unique id under 'nccl/unique_id'"))
      << t.status().ToString();
}

TEST(NcclBootstrapTest, ANodeThatNeverJoinsFailsTheOthersInitialisation) {
  auto world = FakeNcclWorld::Create(3);
  MemoryStore store;
  NcclTransportOptions options;
  options.timeout = 300ms;
  std::vector<Status> results(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {  // node 2 never starts
    threads.emplace_back([&, r] {
      results[r] = NcclTransport::Create(world->NewApi(), r, 3, &store, options).status();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].code(), StatusCode::kDeadlineExceeded) << results[r].ToString();
    EXPECT_TRUE(Contains(results[r], "initialising the communicator")) << results[r].ToString();
    EXPECT_EQ(world->abort_calls(r), 1) << "node " << r;
  }
}

TEST(NcclBootstrapTest, AMalformedUniqueIdIsRejected) {
  auto world = FakeNcclWorld::Create(2);
  MemoryStore store;
  ASSERT_TRUE(store.Set("nccl/unique_id", "not hex!").ok());
  NcclTransportOptions options;
  options.timeout = 1s;
  auto t = NcclTransport::Create(world->NewApi(), 1, 2, &store, options);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument) << t.status().ToString();
  EXPECT_TRUE(Contains(t.status(), "malformed")) << t.status().ToString();
}

TEST(NcclBootstrapTest, ANodeOutsideTheJobIsRejected) {
  auto world = FakeNcclWorld::Create(2);
  MemoryStore store;
  auto t = NcclTransport::Create(world->NewApi(), 2, 2, &store, NcclTransportOptions{});
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument) << t.status().ToString();
}

TEST(NcclBootstrapTest, EachCommunicatorUsesItsOwnStoreKey) {
  auto world = FakeNcclWorld::Create(1);
  MemoryStore store;
  NcclTransportOptions options;
  options.store_key = "nccl/job7/comm2";
  auto t = NcclTransport::Create(world->NewApi(), 0, 1, &store, options);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_TRUE(store.Peek("nccl/job7/comm2").has_value());
  EXPECT_FALSE(store.Peek("nccl/unique_id").has_value());
}

}  // namespace
}  // namespace sparsync::transport
