// Both backends with ranks as threads: Gloo over real TCP on loopback (bootstrapped through an
// in-memory rendezvous store) and the in-process loopback backend.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <random>
#include <thread>

#include "daemon/transport/gloo/gloo_transport.h"
#include "daemon/transport/loopback/loopback_transport.h"
#include "tests/unit/daemon/transport/memory_store.h"

namespace sparsync::transport {
namespace {

enum class Backend { kGloo, kLoopback };

// Builds `n` connected transports, one per rank.
std::vector<std::unique_ptr<Transport>> Cluster(Backend backend, int n) {
  std::vector<std::unique_ptr<Transport>> out(n);
  if (backend == Backend::kLoopback) {
    auto hub = std::make_shared<LoopbackHub>(n);
    for (int r = 0; r < n; ++r) out[r] = std::make_unique<LoopbackTransport>(hub, r);
    return out;
  }
  MemoryStore store;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      // A loopback address of its own per node, none of them 127.0.0.1 (the source of every
      // connection on loopback), so that no error names the wrong node.
      const std::string listen = "127.0.0." + std::to_string(r + 2);
      auto t = GlooTransport::Create(r, n, listen, &store, std::chrono::seconds(20));
      ASSERT_TRUE(t.ok()) << t.status().ToString();
      out[r] = std::move(*t);
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

template <typename Fn>
void OnEachRank(std::vector<std::unique_ptr<Transport>>& cluster, Fn fn) {
  std::vector<std::thread> threads;
  for (size_t r = 0; r < cluster.size(); ++r) {
    threads.emplace_back([&, r] { fn(static_cast<int>(r), *cluster[r]); });
  }
  for (auto& t : threads) t.join();
}

class TransportTest : public ::testing::TestWithParam<std::tuple<Backend, int>> {};

TEST_P(TransportTest, AllReduceSumIsExactAndBitIdentical) {
  auto [backend, n] = GetParam();
  auto cluster = Cluster(backend, n);
  for (size_t count : {size_t{1}, size_t{7}, size_t{1000}, size_t{300001}}) {
    std::vector<std::vector<float>> data(n, std::vector<float>(count));
    std::vector<double> expected(count, 0.0);
    for (int r = 0; r < n; ++r) {
      std::mt19937 rng(r * 31 + count);
      std::uniform_real_distribution<float> u(-1, 1);
      for (size_t i = 0; i < count; ++i) {
        data[r][i] = u(rng);
        expected[i] += data[r][i];
      }
    }
    OnEachRank(cluster, [&](int r, Transport& t) {
      ASSERT_TRUE(t.AllReduceSum(data[r].data(), count, ElementType::kFloat32, 1).ok());
    });
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(0, std::memcmp(data[r].data(), data[0].data(), count * sizeof(float)))
          << "rank " << r << " differs in its bits";
    }
    for (size_t i = 0; i < count; ++i) ASSERT_NEAR(data[0][i], expected[i], 1e-5);
  }
  // Integers are exact.
  std::vector<std::vector<int64_t>> ints(n, std::vector<int64_t>(5));
  for (int r = 0; r < n; ++r) std::iota(ints[r].begin(), ints[r].end(), int64_t{r} << 40);
  OnEachRank(cluster, [&](int r, Transport& t) {
    ASSERT_TRUE(t.AllReduceSum(ints[r].data(), 5, ElementType::kInt64, 2).ok());
  });
  int64_t base = 0;
  for (int r = 0; r < n; ++r) base += int64_t{r} << 40;
  for (int i = 0; i < 5; ++i) EXPECT_EQ(ints[0][i], base + int64_t{n} * i);
}

TEST_P(TransportTest, AllGatherVConcatenatesInRankOrder) {
  auto [backend, n] = GetParam();
  auto cluster = Cluster(backend, n);
  std::vector<size_t> sizes(n);
  for (int r = 0; r < n; ++r) sizes[r] = r == 1 ? 0 : 3 + 5 * r;  // one rank sends nothing
  size_t total = std::accumulate(sizes.begin(), sizes.end(), size_t{0});
  std::vector<std::vector<char>> out(n, std::vector<char>(total));
  OnEachRank(cluster, [&](int r, Transport& t) {
    std::vector<char> mine(sizes[r], static_cast<char>('a' + r));
    ASSERT_TRUE(t.AllGatherV(mine.data(), mine.size(), out[r].data(), sizes, 3).ok());
  });
  std::string expected;
  for (int r = 0; r < n; ++r) expected += std::string(sizes[r], static_cast<char>('a' + r));
  for (int r = 0; r < n; ++r) EXPECT_EQ(std::string(out[r].begin(), out[r].end()), expected);
}

TEST_P(TransportTest, BroadcastCopiesTheRootsBytes) {
  auto [backend, n] = GetParam();
  auto cluster = Cluster(backend, n);
  const int root = n - 1;
  std::vector<std::vector<char>> data(n);
  for (int r = 0; r < n; ++r) data[r].assign(1001, static_cast<char>(r));
  OnEachRank(cluster, [&](int r, Transport& t) {
    ASSERT_TRUE(t.Broadcast(data[r].data(), data[r].size(), root, 4).ok());
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(data[r], std::vector<char>(1001, static_cast<char>(root)));
}

TEST_P(TransportTest, AbortFailsLaterCalls) {
  auto [backend, n] = GetParam();
  auto cluster = Cluster(backend, n);
  cluster[0]->Abort(Aborted("stop here"));
  float x = 1;
  Status st = cluster[0]->AllReduceSum(&x, 1, ElementType::kFloat32, 5);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("stop here"), std::string::npos);
}

// The bytes node `from` sends to node `to` in SendRecvTest: every direction a different size,
// node 0 sends nothing to the last node, node 1 sends ~50 KB to node 0.
std::vector<char> PairBytes(int n, int from, int to) {
  size_t size = (from == 0 && to == n - 1) ? 0 : 1 + 50000 * from + 7 * to;
  std::vector<char> out(size);
  for (size_t i = 0; i < size; ++i) out[i] = static_cast<char>(from * 31 + to * 7 + i);
  return out;
}

TEST_P(TransportTest, SendRecvExchangesDifferentSizesBetweenEveryPair) {
  auto [backend, n] = GetParam();
  auto cluster = Cluster(backend, n);
  const size_t capacity = 1 + 50000 * (n - 1) + 7 * (n - 1);
  for (int pass = 0; pass < 2; ++pass) {  // the same tag again: messages stay in order
    OnEachRank(cluster, [&](int r, Transport& t) {
      // Peers in ascending order on every node (itself included): deadlock-free.
      for (int peer = 0; peer < n; ++peer) {
        std::vector<char> mine = PairBytes(n, r, peer);
        std::vector<char> got(capacity, 'x');
        size_t got_bytes = 12345;
        Status st =
            t.SendRecv(peer, mine.data(), mine.size(), got.data(), got.size(), &got_bytes, 6);
        ASSERT_TRUE(st.ok()) << st.ToString();
        got.resize(got_bytes);
        EXPECT_EQ(got, PairBytes(n, peer, r)) << "node " << r << " from node " << peer;
      }
    });
  }
}

TEST_P(TransportTest, SendRecvOfNothingAndCapacityErrorsOnBothSides) {
  auto [backend, n] = GetParam();
  auto cluster = Cluster(backend, n);
  OnEachRank(cluster, [&](int r, Transport& t) {
    if (r > 1) return;
    const int peer = 1 - r;
    size_t got_bytes = 99;
    // Both send nothing into no buffer at all.
    Status st = t.SendRecv(peer, nullptr, 0, nullptr, 0, &got_bytes, 7);
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(got_bytes, 0u);
    // Node 0 sends 100 bytes where node 1 has room for 50: both sides fail, nothing moves.
    std::vector<char> mine(r == 0 ? 100 : 10, static_cast<char>('a' + r));
    std::vector<char> got(r == 0 ? 100 : 50, 'x');
    st = t.SendRecv(peer, mine.data(), mine.size(), got.data(), got.size(), &got_bytes, 8);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.code(), StatusCode::kMismatch) << st.ToString();
    EXPECT_NE(st.message().find("100 bytes into a capacity of 50"), std::string::npos)
        << st.ToString();
    EXPECT_EQ(got_bytes, 0u);
    EXPECT_EQ(got, std::vector<char>(got.size(), 'x'));
    // The pair is still usable.
    got.assign(100, 'x');
    st = t.SendRecv(peer, mine.data(), mine.size(), got.data(), got.size(), &got_bytes, 9);
    ASSERT_TRUE(st.ok()) << st.ToString();
    got.resize(got_bytes);
    EXPECT_EQ(got, std::vector<char>(r == 0 ? 10 : 100, static_cast<char>('a' + peer)));
  });
  size_t got_bytes = 0;
  Status st = cluster[0]->SendRecv(n, nullptr, 0, nullptr, 0, &got_bytes, 10);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
}

TEST_P(TransportTest, HostOnlyBackendsRefuseDeviceMemory) {
  auto [backend, n] = GetParam();
  auto cluster = Cluster(backend, n);
  OnEachRank(cluster, [&](int r, Transport& t) {
    EXPECT_EQ(t.cuda_device(), -1);
    float x = 1;
    Status st = t.AllReduceSumOnDevice(&x, 1, ElementType::kFloat32, 11);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
    EXPECT_NE(st.message().find("host memory only"), std::string::npos) << st.ToString();
    EXPECT_EQ(x, 1.0f);
    // Refused without communicating: the ranks stay in step.
    ASSERT_TRUE(t.AllReduceSum(&x, 1, ElementType::kFloat32, 12).ok());
    EXPECT_EQ(x, static_cast<float>(n));
  });
}

INSTANTIATE_TEST_SUITE_P(
    Backends, TransportTest,
    ::testing::Combine(::testing::Values(Backend::kGloo, Backend::kLoopback),
                       ::testing::Values(2, 3, 4)),
    [](const auto& info) {
      return std::string(std::get<0>(info.param) == Backend::kGloo ? "Gloo" : "Loopback") +
             std::to_string(std::get<1>(info.param)) + "Ranks";
    });

// Gloo's failures (issue 16, D4, D9). A node whose daemon goes away closes its connections: the
// collectives of its peers fail at once, naming it, instead of waiting for the timeout.
using Clock = std::chrono::steady_clock;
double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

TEST(GlooFailureTest, ALostNodeIsNamedByThePeersWaitingForIt) {
  auto cluster = Cluster(Backend::kGloo, 3);
  std::vector<Status> got(3);
  const auto start = Clock::now();
  OnEachRank(cluster, [&](int r, Transport& t) {
    if (r == 2) {  // stands for a daemon that died: its connections close
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      t.Abort(Aborted("gone"));
      return;
    }
    std::vector<float> x(100000, 1.0f);
    got[r] = t.AllReduceSum(x.data(), x.size(), ElementType::kFloat32, 1);
  });
  EXPECT_LT(SecondsSince(start), 6.0) << "the timeout is 20 s: the failure must not wait for it";
  // Every survivor fails at once, naming itself. Which node it blames is checked where nodes
  // have addresses of their own (tests/faults, network namespaces) and through the daemons,
  // whose verdict names the lost node (test_failures.py): on loopback every connection a peer
  // opened comes from 127.0.0.1, which names no node here.
  for (int r = 0; r < 2; ++r) {
    ASSERT_FALSE(got[r].ok()) << r;
    EXPECT_NE(got[r].message().find("node " + std::to_string(r)), std::string::npos)
        << "names the node that saw it: " << got[r].message();
  }
}

// Without a verdict, a node that sees a broken connection waits a moment for the job's reason
// (kVerdictGrace), and reports that reason when it comes: the error users read is the job's.
TEST(GlooFailureTest, ABrokenConnectionReportsTheJobsReasonWhenItComes) {
  auto cluster = Cluster(Backend::kGloo, 2);
  Status got;
  std::thread waiting([&] {
    std::vector<float> x(100000, 1.0f);
    got = cluster[0]->AllReduceSum(x.data(), x.size(), ElementType::kFloat32, 1);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  cluster[1]->Abort(Aborted("gone"));  // node 1 never joined the collective; its end closes
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  cluster[0]->Abort(Aborted("tensor 'w' differs across nodes"));  // the verdict, within 1 s
  waiting.join();
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.message(), "tensor 'w' differs across nodes");
}

// A node's own Abort ends its collective blocked on a peer that never joins, with the reason,
// instead of leaving it to the Gloo timeout (20 s here).
TEST(GlooFailureTest, AbortEndsThisNodesOwnWaitingCollective) {
  auto cluster = Cluster(Backend::kGloo, 2);
  Status got;
  const auto start = Clock::now();
  std::thread waiting([&] {
    std::vector<float> x(1000, 1.0f);
    got = cluster[0]->AllReduceSum(x.data(), x.size(), ElementType::kFloat32, 1);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  cluster[0]->Abort(Aborted("the job failed on node 0"));
  waiting.join();
  EXPECT_LT(SecondsSince(start), 5.0) << "waited for the Gloo timeout";
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.message(), "the job failed on node 0");
}

// Both nodes wait in collectives the other is not in (different tags) and both abort, as every
// node does when the job's verdict reaches it: neither is left waiting for the other's close.
TEST(GlooFailureTest, TwoNodesThatAbortTogetherBothEndTheirCollectives) {
  auto cluster = Cluster(Backend::kGloo, 2);
  std::vector<Status> got(2);
  const auto start = Clock::now();
  OnEachRank(cluster, [&](int r, Transport& t) {
    std::thread abort_soon([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      t.Abort(Aborted("verdict"));
    });
    std::vector<float> x(1000, 1.0f);
    got[r] = t.AllReduceSum(x.data(), x.size(), ElementType::kFloat32, 10 + r);
    abort_soon.join();
  });
  EXPECT_LT(SecondsSince(start), 5.0) << "waited for the Gloo timeout";
  for (int r = 0; r < 2; ++r) {
    ASSERT_FALSE(got[r].ok()) << r;
    EXPECT_EQ(got[r].message(), "verdict") << r;
  }
}

// Gloo's errors name the far pair's own address; each node knows which node's pair that is, so
// the error can name the node even where every node listens on the same host. Best effort: in
// about one run in three here (25 of 80), node 0's error names a port that is none of the pairs'
// (Debian's Gloo 0.0~git20220518) and is reported unnamed after the unnamed wait (in the daemon
// the coordinator's verdict names the lost node then); node 1's named node 2 in 80 of 80 on an
// idle machine, but once in a full ctest run beside a build neither was named. What must hold:
// both survivors end well before the Gloo timeout, and every error that names a node names node
// 2 (both survivors wait on it in the ring); and in one of three tries at least one does.
// Returns how many of the two survivors named node 2.
int SurvivorsNamingTheLostPeer() {
  MemoryStore store;
  std::vector<std::unique_ptr<GlooTransport>> cluster(3);
  {
    std::vector<std::thread> threads;
    for (int r = 0; r < 3; ++r) {
      threads.emplace_back([&, r] {
        auto t = GlooTransport::Create(r, 3, "127.0.0.1", &store, std::chrono::seconds(20),
                                       std::chrono::seconds(2));
        ASSERT_TRUE(t.ok()) << t.status().ToString();
        cluster[r] = std::move(*t);
      });
    }
    for (auto& t : threads) t.join();
  }
  for (const auto& t : cluster) {
    if (!t) return 0;  // failed above
  }
  std::vector<Status> got(3);
  const auto start = Clock::now();
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      if (r == 2) {  // stands for a daemon that died: its connections end
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        cluster[2]->Abort(Aborted("gone"));
        return;
      }
      std::vector<float> x(100000, 1.0f);
      got[r] = cluster[r]->AllReduceSum(x.data(), x.size(), ElementType::kFloat32, 1);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_LT(SecondsSince(start), 10.0) << "waited for the Gloo timeout";
  int named_2 = 0;
  for (int r = 0; r < 2; ++r) {
    EXPECT_FALSE(got[r].ok()) << r;
    const std::string& m = got[r].message();
    if (m.find("the connection to node") == std::string::npos) continue;  // unnamed
    EXPECT_NE(m.find("the connection to node 2"), std::string::npos) << m;
    ++named_2;
  }
  return named_2;
}

TEST(GlooFailureTest, APeerSharingTheHostIsNamedByItsPair) {
  int named_2 = 0;
  for (int attempt = 0; attempt < 3 && named_2 == 0 && !HasFailure(); ++attempt) {
    named_2 = SurvivorsNamingTheLostPeer();
  }
  EXPECT_GE(named_2, 1);
}

}  // namespace
}  // namespace sparsync::transport
