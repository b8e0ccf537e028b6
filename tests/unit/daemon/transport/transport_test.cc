// Both backends with ranks as threads: Gloo over real TCP on loopback (bootstrapped through an
// in-memory rendezvous store) and the in-process loopback backend.
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>

#include "daemon/transport/gloo/gloo_transport.h"
#include "daemon/transport/loopback/loopback_transport.h"

namespace sparsync::transport {
namespace {

class MemoryStore : public RendezvousStore {
 public:
  Status Set(const std::string& key, const std::string& value) override {
    {
      std::lock_guard lock(mu_);
      data_[key] = value;
    }
    cv_.notify_all();
    return Status::Ok();
  }
  Result<std::vector<std::string>> Get(const std::vector<std::string>& keys,
                                       std::chrono::milliseconds timeout) override {
    std::unique_lock lock(mu_);
    bool ok = cv_.wait_for(lock, timeout, [&] {
      for (const auto& k : keys)
        if (!data_.count(k)) return false;
      return true;
    });
    if (!ok) return DeadlineExceeded("keys missing");
    std::vector<std::string> out;
    for (const auto& k : keys) out.push_back(data_[k]);
    return out;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> data_;
};

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
      auto t = GlooTransport::Create(r, n, "127.0.0.1", &store, std::chrono::seconds(20));
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

INSTANTIATE_TEST_SUITE_P(
    Backends, TransportTest,
    ::testing::Combine(::testing::Values(Backend::kGloo, Backend::kLoopback),
                       ::testing::Values(2, 3, 4)),
    [](const auto& info) {
      return std::string(std::get<0>(info.param) == Backend::kGloo ? "Gloo" : "Loopback") +
             std::to_string(std::get<1>(info.param)) + "Ranks";
    });

}  // namespace
}  // namespace sparsync::transport
