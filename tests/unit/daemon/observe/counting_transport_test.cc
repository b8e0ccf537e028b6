#include "daemon/observe/counting_transport.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "daemon/transport/loopback/loopback_transport.h"

namespace sparsync::observe {
namespace {

// Two nodes as threads: each collective's payload is counted as this node sees it, the results
// pass through unchanged, and a failed call counts nothing.
TEST(CountingTransportTest, CountsEachCollectivesPayloadAsTheNodeSeesIt) {
  auto hub = std::make_shared<transport::LoopbackHub>(2, std::chrono::seconds(10));
  std::vector<std::unique_ptr<transport::LoopbackTransport>> inner;
  std::vector<std::unique_ptr<CountingTransport>> counted;
  for (int r = 0; r < 2; ++r) {
    inner.push_back(std::make_unique<transport::LoopbackTransport>(hub, r));
    counted.push_back(std::make_unique<CountingTransport>(inner.back().get()));
  }
  std::vector<float> sums(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      CountingTransport& t = *counted[r];
      std::vector<float> data(100, 1.0f + r);
      ASSERT_TRUE(t.AllReduceSum(data.data(), data.size(), transport::ElementType::kFloat32, 1).ok());
      sums[r] = data[0];
      // Node 0 sends 10 bytes, node 1 sends 30.
      const size_t mine = r == 0 ? 10 : 30;
      std::vector<char> send(mine, 'a' + r), recv(40);
      const size_t sizes[2] = {10, 30};
      ASSERT_TRUE(t.AllGatherV(send.data(), mine, recv.data(), sizes, 2).ok());
      std::vector<char> b(64);
      ASSERT_TRUE(t.Broadcast(b.data(), b.size(), /*root=*/1, 3).ok());
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(sums[0], 3.0f);
  EXPECT_EQ(sums[1], 3.0f);
  // allreduce 400 + 400; allgather: own part sent, the other's received; broadcast: root sends.
  EXPECT_EQ(counted[0]->sent_bytes(), 400u + 10u);
  EXPECT_EQ(counted[0]->received_bytes(), 400u + 30u + 64u);
  EXPECT_EQ(counted[1]->sent_bytes(), 400u + 30u + 64u);
  EXPECT_EQ(counted[1]->received_bytes(), 400u + 10u);

  counted[0]->Abort(Aborted("test"));
  float x = 1;
  EXPECT_FALSE(counted[0]->AllReduceSum(&x, 1, transport::ElementType::kFloat32, 4).ok());
  EXPECT_EQ(counted[0]->sent_bytes(), 410u) << "a failed call counted";
  EXPECT_EQ(counted[0]->rank(), 0);
  EXPECT_EQ(counted[0]->size(), 2);
}

}  // namespace
}  // namespace sparsync::observe
