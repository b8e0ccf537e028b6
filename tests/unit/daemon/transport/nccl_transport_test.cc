// NcclTransport's multi-node logic without a GPU: nodes as threads over FakeNcclWorld
// (nccl_fake_api.h), bootstrapped through an in-memory rendezvous store. Covers results, call
// order, the size exchange of AllGatherV, staging reuse, the device path (AllReduceSumOnDevice on
// the caller's device memory, without staging or copies), and that a dead peer, an async error or
// an Abort() ends a call with an error naming it instead of hanging. Swept over 1-4 nodes, with
// non-blocking NCCL calls that enter the stream at once or only after a few polls.
#include "daemon/transport/nccl/nccl_transport.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <ostream>
#include <random>
#include <thread>

#include "tests/unit/daemon/transport/nccl_fake_api.h"
#include "tests/unit/daemon/transport/memory_store.h"

namespace sparsync::transport {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

bool Contains(const Status& st, const std::string& text) {
  return st.message().find(text) != std::string::npos;
}

std::string Hex(const std::string& bytes) {
  std::string out;
  char buf[3];
  for (unsigned char c : bytes) {
    std::snprintf(buf, sizeof(buf), "%02x", c);
    out += buf;
  }
  return out;
}

// `nodes` NcclTransports over one fake world, bootstrapped concurrently like real daemons, each
// on CUDA device `device`.
struct Cluster {
  Cluster(int n, int enqueue_polls, std::chrono::milliseconds timeout = 20s, int device = 0)
      : world(FakeNcclWorld::Create(n)), nodes(n) {
    world->SetEnqueuePolls(enqueue_polls);
    NcclTransportOptions options;
    options.timeout = timeout;
    options.device = device;
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        auto t = NcclTransport::Create(world->NewApi(), r, n, &store, options);
        ASSERT_TRUE(t.ok()) << t.status().ToString();
        nodes[r] = std::move(t).value();
      });
    }
    for (auto& t : threads) t.join();
  }

  template <typename Fn>
  void OnEachNode(Fn fn) {
    std::vector<std::thread> threads;
    for (size_t r = 0; r < nodes.size(); ++r) {
      threads.emplace_back([&, r] { fn(static_cast<int>(r), *nodes[r]); });
    }
    for (auto& t : threads) t.join();
  }

  int size() const { return static_cast<int>(nodes.size()); }

  std::shared_ptr<FakeNcclWorld> world;
  MemoryStore store;
  std::vector<std::unique_ptr<NcclTransport>> nodes;
};

// Node `rank`'s gradient sum already on its GPU: `values` in device memory the caller owns.
template <typename T>
T* OnDevice(FakeNcclWorld& world, int rank, const std::vector<T>& values) {
  void* data = world.AllocCallerDevice(rank, values.size() * sizeof(T));
  if (!values.empty()) std::memcpy(data, values.data(), values.size() * sizeof(T));
  return static_cast<T*>(data);
}

// Element-wise sum over nodes in rank order, as NCCL (and the fake) adds.
template <typename T>
std::vector<T> RankOrderSum(const std::vector<std::vector<T>>& parts) {
  std::vector<T> out = parts[0];
  for (size_t r = 1; r < parts.size(); ++r) {
    for (size_t i = 0; i < out.size(); ++i) out[i] += parts[r][i];
  }
  return out;
}

struct Param {
  int nodes;
  int enqueue_polls;  // CommState() polls before a non-blocking NCCL call is in the stream
};

void PrintTo(const Param& p, std::ostream* os) {
  *os << p.nodes << " nodes, " << p.enqueue_polls << " polls per enqueue";
}

class NcclTransportTest : public ::testing::TestWithParam<Param> {
 protected:
  int n() const { return GetParam().nodes; }
  Cluster MakeCluster(std::chrono::milliseconds timeout = 20s) {
    return Cluster(n(), GetParam().enqueue_polls, timeout);
  }
};

TEST_P(NcclTransportTest, BootstrapGivesEveryNodeTheSameUniqueId) {
  Cluster c = MakeCluster();
  ASSERT_EQ(c.nodes.size(), static_cast<size_t>(n()));
  EXPECT_EQ(c.world->unique_ids_issued(), 1) << "only node 0 makes a unique id";
  const std::vector<std::string> ids = c.world->init_ids();
  ASSERT_EQ(ids[0].size(), 128u);
  for (int r = 0; r < n(); ++r) EXPECT_EQ(ids[r], ids[0]) << "node " << r;
  // Published hex-encoded (the id contains zero bytes and is not UTF-8).
  EXPECT_EQ(c.store.Peek("nccl/unique_id"), Hex(ids[0]));
  for (int r = 0; r < n(); ++r) {
    EXPECT_EQ(c.nodes[r]->rank(), r);
    EXPECT_EQ(c.nodes[r]->size(), n());
  }
}

TEST_P(NcclTransportTest, AllReduceSumIsTheRankOrderSumOnEveryNode) {
  Cluster c = MakeCluster();
  uint32_t tag = 0;
  for (size_t count : {size_t{1}, size_t{7}, size_t{1000}, size_t{70001}}) {
    std::vector<std::vector<float>> data(n(), std::vector<float>(count));
    for (int r = 0; r < n(); ++r) {
      std::mt19937 rng(r * 31 + count);
      std::uniform_real_distribution<float> u(-1, 1);
      for (auto& x : data[r]) x = u(rng);
    }
    std::vector<float> expected = data[0];
    for (int r = 1; r < n(); ++r) {
      for (size_t i = 0; i < count; ++i) expected[i] += data[r][i];
    }
    c.OnEachNode([&](int r, Transport& t) {
      Status st = t.AllReduceSum(data[r].data(), count, ElementType::kFloat32, tag);
      ASSERT_TRUE(st.ok()) << st.ToString();
    });
    ++tag;
    for (int r = 0; r < n(); ++r) {
      ASSERT_EQ(0, std::memcmp(data[r].data(), expected.data(), count * sizeof(float)))
          << "node " << r << ", " << count << " elements";
    }
  }
  // The other element types, with values where a lost bit would show.
  std::vector<std::vector<int64_t>> i64(n(), std::vector<int64_t>(5));
  std::vector<std::vector<int32_t>> i32(n(), std::vector<int32_t>(3));
  std::vector<std::vector<double>> f64(n(), std::vector<double>(4));
  for (int r = 0; r < n(); ++r) {
    std::iota(i64[r].begin(), i64[r].end(), int64_t{r + 1} << 40);
    std::iota(i32[r].begin(), i32[r].end(), -1000 * r);
    std::iota(f64[r].begin(), f64[r].end(), 0.25 + r);
  }
  c.OnEachNode([&](int r, Transport& t) {
    ASSERT_TRUE(t.AllReduceSum(i64[r].data(), 5, ElementType::kInt64, 100).ok());
    ASSERT_TRUE(t.AllReduceSum(i32[r].data(), 3, ElementType::kInt32, 101).ok());
    ASSERT_TRUE(t.AllReduceSum(f64[r].data(), 4, ElementType::kFloat64, 102).ok());
  });
  int64_t base64 = 0;
  int32_t base32 = 0;
  double base_f = 0;
  for (int r = 0; r < n(); ++r) {
    base64 += int64_t{r + 1} << 40;
    base32 += -1000 * r;
    base_f += 0.25 + r;
  }
  for (int r = 0; r < n(); ++r) {
    for (int i = 0; i < 5; ++i) EXPECT_EQ(i64[r][i], base64 + int64_t{n()} * i);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(i32[r][i], base32 + n() * i);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(f64[r][i], base_f + n() * i);
  }
}

// What node r sends in an AllGatherV test: its size from `size_of`, bytes that name the node.
std::vector<char> GatherPayload(int r, size_t bytes) {
  std::vector<char> out(bytes);
  for (size_t i = 0; i < bytes; ++i) out[i] = static_cast<char>('a' + r + 3 * i);
  return out;
}

TEST_P(NcclTransportTest, AllGatherVConcatenatesDifferingSizesInRankOrder) {
  Cluster c = MakeCluster();
  struct Case {
    const char* name;
    std::function<size_t(int)> size_of;
  };
  const int last = n() - 1;
  const std::vector<Case> cases = {
      {"varying, node 1 empty", [](int r) -> size_t { return r == 1 ? 0 : 3 + 5 * r; }},
      {"all empty", [](int) -> size_t { return 0; }},
      {"all equal", [](int) -> size_t { return 16; }},
      {"only the last node", [last](int r) -> size_t { return r == last ? 100 : 0; }},
  };
  uint32_t tag = 0;
  for (const Case& k : cases) {
    std::vector<size_t> sizes(n());
    for (int r = 0; r < n(); ++r) sizes[r] = k.size_of(r);
    const size_t total = std::accumulate(sizes.begin(), sizes.end(), size_t{0});
    const size_t largest = *std::max_element(sizes.begin(), sizes.end());
    const bool uniform =
        std::all_of(sizes.begin(), sizes.end(), [&](size_t s) { return s == sizes[0]; });
    std::vector<std::vector<char>> out(n(), std::vector<char>(total, 'x'));
    const size_t logged_before = c.world->executed(0).size();
    c.OnEachNode([&](int r, Transport& t) {
      std::vector<char> mine = GatherPayload(r, sizes[r]);
      Status st = t.AllGatherV(mine.data(), mine.size(), out[r].data(), sizes, tag);
      ASSERT_TRUE(st.ok()) << k.name << ": " << st.ToString();
    });
    ++tag;
    std::vector<char> expected;
    for (int r = 0; r < n(); ++r) {
      std::vector<char> part = GatherPayload(r, sizes[r]);
      expected.insert(expected.end(), part.begin(), part.end());
    }
    for (int r = 0; r < n(); ++r) EXPECT_EQ(out[r], expected) << k.name << ", node " << r;

    // The protocol: equal sizes are one allgather; differing sizes a size exchange (one uint64
    // per node) and one allgather padded to the largest; nothing at all for zero bytes.
    const std::vector<std::string> log = c.world->executed(0);
    const std::vector<std::string> added(log.begin() + logged_before, log.end());
    std::vector<std::string> want;
    if (!uniform) want.push_back("allgather 8");
    if (largest > 0) want.push_back("allgather " + std::to_string(largest));
    EXPECT_EQ(added, want) << k.name;
  }
}

TEST_P(NcclTransportTest, AllGatherVWithAWrongExpectationFailsThatNodeOnlyAndStaysInStep) {
  if (n() < 2) GTEST_SKIP() << "needs two nodes";
  Cluster c = MakeCluster();
  std::vector<size_t> truth(n());
  for (int r = 0; r < n(); ++r) truth[r] = 4 + r;
  const int last = n() - 1;
  std::vector<Status> results(n());
  std::vector<std::vector<char>> out(n(), std::vector<char>(1000, 'x'));
  c.OnEachNode([&](int r, Transport& t) {
    std::vector<size_t> expected = truth;
    if (r == 0) expected[last] += 1;  // node 0 is out of step about the last node's size
    std::vector<char> mine = GatherPayload(r, truth[r]);
    results[r] = t.AllGatherV(mine.data(), mine.size(), out[r].data(), expected, 1);
  });
  EXPECT_EQ(results[0].code(), StatusCode::kMismatch) << results[0].ToString();
  EXPECT_TRUE(Contains(results[0], "node " + std::to_string(last) + " sent " +
                                       std::to_string(truth[last]) +
                                       " bytes but this node "
                                       "expected " +
                                       std::to_string(truth[last] + 1)))
      << results[0].ToString();
  EXPECT_EQ(out[0], std::vector<char>(1000, 'x')) << "nothing is written on a mismatch";
  for (int r = 1; r < n(); ++r) EXPECT_TRUE(results[r].ok()) << results[r].ToString();
  // Every node issued the same collectives, so the communicator is still usable everywhere.
  c.OnEachNode([&](int r, Transport& t) {
    int32_t x = 1;
    Status st = t.AllReduceSum(&x, 1, ElementType::kInt32, 2);
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(x, n());
  });
}

TEST_P(NcclTransportTest, BroadcastCopiesTheRootsBytesFromEveryRoot) {
  Cluster c = MakeCluster();
  for (int root = 0; root < n(); ++root) {
    std::vector<std::vector<char>> data(n());
    for (int r = 0; r < n(); ++r) data[r].assign(1001, static_cast<char>(r + 7 * root));
    c.OnEachNode([&](int r, Transport& t) {
      Status st = t.Broadcast(data[r].data(), data[r].size(), root, 10 + root);
      ASSERT_TRUE(st.ok()) << st.ToString();
    });
    for (int r = 0; r < n(); ++r) {
      EXPECT_EQ(data[r], std::vector<char>(1001, static_cast<char>(root + 7 * root)))
          << "root " << root << ", node " << r;
    }
  }
  char byte = 0;
  Status st = c.nodes[0]->Broadcast(&byte, 1, n(), 99);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
}

// The bytes node `from` sends to node `to`: every direction a different size, node 0 sends
// nothing to the last node.
std::vector<char> PairBytes(int n, int from, int to) {
  const size_t size = (from == 0 && to == n - 1) ? 0 : 1 + 5000 * from + 7 * to;
  std::vector<char> out(size);
  for (size_t i = 0; i < size; ++i) out[i] = static_cast<char>(from * 31 + to * 7 + i);
  return out;
}

TEST_P(NcclTransportTest, SendRecvExchangesDifferentSizesBetweenEveryPair) {
  Cluster c = MakeCluster();
  const size_t capacity = 1 + 5000 * (n() - 1) + 7 * (n() - 1);
  for (int pass = 0; pass < 2; ++pass) {
    c.OnEachNode([&](int r, Transport& t) {
      // Peers in ascending order on every node (itself included): deadlock-free.
      for (int peer = 0; peer < n(); ++peer) {
        std::vector<char> mine = PairBytes(n(), r, peer);
        std::vector<char> got(capacity, 'x');
        size_t got_bytes = 12345;
        Status st =
            t.SendRecv(peer, mine.data(), mine.size(), got.data(), got.size(), &got_bytes, 6);
        ASSERT_TRUE(st.ok()) << st.ToString();
        got.resize(got_bytes);
        EXPECT_EQ(got, PairBytes(n(), peer, r)) << "node " << r << " from node " << peer;
      }
    });
  }
}

TEST_P(NcclTransportTest, SendRecvOfNothingAndCapacityErrorsOnBothSides) {
  if (n() < 2) GTEST_SKIP() << "needs two nodes";
  Cluster c = MakeCluster();
  c.OnEachNode([&](int r, Transport& t) {
    if (r > 1) return;
    const int peer = 1 - r;
    size_t got_bytes = 99;
    Status st = t.SendRecv(peer, nullptr, 0, nullptr, 0, &got_bytes, 7);
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(got_bytes, 0u);
    // Node 0 sends 100 bytes where node 1 has room for 50: both sides fail, nothing moves.
    std::vector<char> mine(r == 0 ? 100 : 10, static_cast<char>('a' + r));
    std::vector<char> got(r == 0 ? 100 : 50, 'x');
    st = t.SendRecv(peer, mine.data(), mine.size(), got.data(), got.size(), &got_bytes, 8);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.code(), StatusCode::kMismatch) << st.ToString();
    EXPECT_TRUE(Contains(st, "100 bytes into a capacity of 50")) << st.ToString();
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
  Status st = c.nodes[0]->SendRecv(n(), nullptr, 0, nullptr, 0, &got_bytes, 10);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
}

TEST_P(NcclTransportTest, CallsReachNcclInCallOrder) {
  Cluster c = MakeCluster();
  const int root = n() - 1;
  c.OnEachNode([&](int r, Transport& t) {
    std::vector<int64_t> a(3, r);
    ASSERT_TRUE(t.AllReduceSum(a.data(), 3, ElementType::kInt64, 1).ok());
    EXPECT_EQ(a, std::vector<int64_t>(3, int64_t{n()} * (n() - 1) / 2));
    std::vector<char> b(10, static_cast<char>(r));
    ASSERT_TRUE(t.Broadcast(b.data(), b.size(), root, 2).ok());
    EXPECT_EQ(b, std::vector<char>(10, static_cast<char>(root)));
    std::vector<size_t> sizes(n());
    for (int q = 0; q < n(); ++q) sizes[q] = q + 1;
    std::vector<char> mine(r + 1, static_cast<char>('a' + r));
    std::vector<char> all(n() * (n() + 1) / 2);
    ASSERT_TRUE(t.AllGatherV(mine.data(), mine.size(), all.data(), sizes, 3).ok());
    EXPECT_EQ(all[all.size() - 1], static_cast<char>('a' + n() - 1));
    const int partner = r ^ 1;
    if (partner < n()) {
      std::vector<char> to(5 + r, static_cast<char>(r));
      std::vector<char> from(64);
      size_t from_bytes = 0;
      ASSERT_TRUE(
          t.SendRecv(partner, to.data(), to.size(), from.data(), from.size(), &from_bytes, 4).ok());
      EXPECT_EQ(from_bytes, static_cast<size_t>(5 + partner));
    }
    std::vector<float> d(5, 0.5f);
    ASSERT_TRUE(t.AllReduceSum(d.data(), 5, ElementType::kFloat32, 5).ok());
    EXPECT_EQ(d, std::vector<float>(5, 0.5f * n()));
  });
  for (int r = 0; r < n(); ++r) {
    std::vector<std::string> want = {"allreduce int64 x3",
                                     "broadcast 10 from " + std::to_string(root)};
    if (n() > 1) want.push_back("allgather 8");
    want.push_back("allgather " + std::to_string(n()));
    const int partner = r ^ 1;
    if (partner < n()) {
      const std::string p = std::to_string(partner);
      want.push_back("group send 16 to " + p + ", recv 16 from " + p);
      want.push_back("group send " + std::to_string(5 + r) + " to " + p + ", recv " +
                     std::to_string(5 + partner) + " from " + p);
    }
    want.push_back("allreduce float32 x5");
    EXPECT_EQ(c.world->executed(r), want) << "node " << r;
  }
}

TEST_P(NcclTransportTest, ZeroByteCallsSkipNccl) {
  Cluster c = MakeCluster();
  c.OnEachNode([&](int r, Transport& t) {
    float f = 1;
    ASSERT_TRUE(t.AllReduceSum(&f, 0, ElementType::kFloat32, 1).ok());
    ASSERT_TRUE(t.Broadcast(&f, 0, 0, 2).ok());
    std::vector<size_t> zeros(n(), 0);
    ASSERT_TRUE(t.AllGatherV(nullptr, 0, nullptr, zeros, 3).ok());
    ASSERT_TRUE(t.AllReduceSumOnDevice(nullptr, 0, ElementType::kFloat32, 4).ok());
    EXPECT_EQ(f, 1.0f);
  });
  for (int r = 0; r < n(); ++r) EXPECT_TRUE(c.world->executed(r).empty()) << "node " << r;
}

TEST_P(NcclTransportTest, StagingBuffersAreReused) {
  Cluster c = MakeCluster();
  std::vector<float> big(1000, 1.0f);
  c.OnEachNode([&](int r, Transport& t) {
    std::vector<float> mine = big;
    ASSERT_TRUE(t.AllReduceSum(mine.data(), mine.size(), ElementType::kFloat32, 0).ok());
  });
  std::vector<int> after_first(n());
  for (int r = 0; r < n(); ++r) after_first[r] = c.world->device_allocations(r);
  c.OnEachNode([&](int r, Transport& t) {
    for (uint32_t i = 1; i <= 20; ++i) {
      std::vector<float> mine(1 + 50 * i, 1.0f);
      ASSERT_TRUE(t.AllReduceSum(mine.data(), mine.size(), ElementType::kFloat32, i).ok());
      ASSERT_TRUE(t.Broadcast(mine.data(), mine.size() * sizeof(float), 0, 100 + i).ok());
    }
  });
  for (int r = 0; r < n(); ++r) {
    EXPECT_EQ(c.world->device_allocations(r), after_first[r]) << "node " << r;
  }
}

TEST_P(NcclTransportTest, AMissingNodeMakesTheOthersTimeOutAndAbort) {
  if (n() < 2) GTEST_SKIP() << "needs two nodes";
  Cluster c = MakeCluster(500ms);
  const int absent = n() - 1;
  std::vector<Status> results(n());
  std::vector<Clock::duration> took(n());
  c.OnEachNode([&](int r, Transport& t) {
    if (r == absent) return;  // a dead peer: never calls
    float x = 1;
    const auto start = Clock::now();
    results[r] = t.AllReduceSum(&x, 1, ElementType::kFloat32, 11);
    took[r] = Clock::now() - start;
  });
  for (int r = 0; r < absent; ++r) {
    EXPECT_EQ(results[r].code(), StatusCode::kDeadlineExceeded) << results[r].ToString();
    EXPECT_TRUE(
        Contains(results[r], "NCCL allreduce (tag 11, 4 bytes) on node " + std::to_string(r)))
        << results[r].ToString();
    EXPECT_TRUE(Contains(results[r], "500 ms")) << results[r].ToString();
    EXPECT_GE(took[r], 500ms);
    EXPECT_LT(took[r], 10s);
    EXPECT_EQ(c.world->abort_calls(r), 1) << "node " << r;
    // Sticky: the next call fails at once with the first error, without another abort.
    float y = 1;
    Status again = c.nodes[r]->Broadcast(&y, sizeof(y), 0, 12);
    EXPECT_EQ(again.code(), StatusCode::kDeadlineExceeded);
    EXPECT_TRUE(Contains(again, "allreduce (tag 11")) << again.ToString();
    EXPECT_EQ(c.world->abort_calls(r), 1);
  }
  EXPECT_EQ(c.world->abort_calls(absent), 0);
}

TEST_P(NcclTransportTest, AMissingPeerInSendRecvTimesOut) {
  if (n() < 2) GTEST_SKIP() << "needs two nodes";
  Cluster c = MakeCluster(300ms);
  char out[4] = {1, 2, 3, 4};
  char in[4];
  size_t got = 0;
  Status st = c.nodes[0]->SendRecv(1, out, 4, in, 4, &got, 21);
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded) << st.ToString();
  EXPECT_TRUE(Contains(st, "sendrecv with node 1 (tag 21")) << st.ToString();
  EXPECT_EQ(got, 0u);
  EXPECT_EQ(c.world->abort_calls(0), 1);
}

TEST_P(NcclTransportTest, AnAsyncErrorIsSurfacedNamingTheCall) {
  Cluster c = MakeCluster();
  for (int r = 0; r < n(); ++r) c.world->InjectAsyncError(r, "remote error: a peer vanished");
  std::vector<Status> results(n());
  const auto start = Clock::now();
  c.OnEachNode([&](int r, Transport& t) {
    char b[8] = {};
    results[r] = t.Broadcast(b, sizeof(b), 0, 31);
  });
  EXPECT_LT(Clock::now() - start, 10s) << "an async error must not wait for the timeout";
  for (int r = 0; r < n(); ++r) {
    EXPECT_EQ(results[r].code(), StatusCode::kUnavailable) << results[r].ToString();
    EXPECT_TRUE(Contains(results[r], "NCCL broadcast (tag 31")) << results[r].ToString();
    EXPECT_TRUE(Contains(results[r], "a peer vanished")) << results[r].ToString();
    EXPECT_EQ(c.world->abort_calls(r), 1);
  }
}

TEST_P(NcclTransportTest, AnAsyncErrorDuringAWaitEndsIt) {
  if (n() < 2) GTEST_SKIP() << "needs a peer that does not come";
  Cluster c = MakeCluster(60s);
  Status result;
  const auto start = Clock::now();
  std::thread caller([&] {
    float x = 1;
    result = c.nodes[0]->AllReduceSum(&x, 1, ElementType::kFloat32, 41);
  });
  std::this_thread::sleep_for(50ms);  // let the call start waiting
  c.world->InjectAsyncError(0, "remote error: connection reset by node 1");
  caller.join();
  EXPECT_LT(Clock::now() - start, 10s);
  EXPECT_EQ(result.code(), StatusCode::kUnavailable) << result.ToString();
  EXPECT_TRUE(Contains(result, "allreduce (tag 41")) << result.ToString();
  EXPECT_TRUE(Contains(result, "connection reset by node 1")) << result.ToString();
  EXPECT_EQ(c.world->abort_calls(0), 1);
}

TEST_P(NcclTransportTest, AbortFromAnotherThreadEndsABlockedCall) {
  if (n() < 2) GTEST_SKIP() << "needs a peer that does not come";
  Cluster c = MakeCluster(60s);
  Status result;
  const auto start = Clock::now();
  std::thread caller([&] {
    std::vector<size_t> sizes(n(), 4);
    char mine[4] = {};
    std::vector<char> all(4 * n());
    result = c.nodes[0]->AllGatherV(mine, 4, all.data(), sizes, 51);
  });
  std::this_thread::sleep_for(50ms);
  c.nodes[0]->Abort(Aborted("the daemon is shutting down"));
  caller.join();
  EXPECT_LT(Clock::now() - start, 10s);
  EXPECT_EQ(result.code(), StatusCode::kAborted) << result.ToString();
  EXPECT_TRUE(Contains(result, "the daemon is shutting down")) << result.ToString();
  EXPECT_TRUE(Contains(result, "allgatherv (tag 51")) << result.ToString();
  EXPECT_EQ(c.world->abort_calls(0), 1);
  c.nodes[0]->Abort(Aborted("again"));  // idempotent
  EXPECT_EQ(c.world->abort_calls(0), 1);
  float x = 1;
  Status later = c.nodes[0]->AllReduceSum(&x, 1, ElementType::kFloat32, 52);
  EXPECT_TRUE(Contains(later, "the daemon is shutting down")) << later.ToString();
}

TEST_P(NcclTransportTest, AbortWhileIdleAbortsAtOnceAndFailsLaterCalls) {
  Cluster c = MakeCluster();
  c.nodes[0]->Abort(Aborted("stop here"));
  EXPECT_EQ(c.world->abort_calls(0), 1);
  float x = 1;
  Status st = c.nodes[0]->AllReduceSum(&x, 1, ElementType::kFloat32, 5);
  EXPECT_EQ(st.code(), StatusCode::kAborted);
  EXPECT_TRUE(Contains(st, "stop here")) << st.ToString();
  c.nodes[0].reset();  // an aborted communicator is not finalised
  EXPECT_FALSE(c.world->finalized(0));
}

TEST_P(NcclTransportTest, DestructionFinalisesTheCommunicator) {
  Cluster c = MakeCluster();
  c.OnEachNode([&](int r, Transport& t) {
    int32_t x = r;
    ASSERT_TRUE(t.AllReduceSum(&x, 1, ElementType::kInt32, 1).ok());
  });
  c.nodes.clear();
  for (int r = 0; r < n(); ++r) {
    EXPECT_TRUE(c.world->finalized(r)) << "node " << r;
    EXPECT_TRUE(c.world->destroyed(r)) << "node " << r;
    EXPECT_EQ(c.world->abort_calls(r), 0);
  }
}

// --- AllReduceSumOnDevice: the caller's device memory, no staging. ---

TEST_P(NcclTransportTest, AllReduceSumOnDeviceSumsInPlaceWithoutStagingOrCopies) {
  Cluster c = MakeCluster();
  for (int r = 0; r < n(); ++r) EXPECT_EQ(c.nodes[r]->cuda_device(), 0);
  std::vector<std::string> want;
  uint32_t tag = 0;
  for (size_t count : {size_t{1}, size_t{7}, size_t{70001}}) {
    std::vector<std::vector<float>> data(n(), std::vector<float>(count));
    for (int r = 0; r < n(); ++r) {
      std::mt19937 rng(r * 31 + count);
      std::uniform_real_distribution<float> u(-1, 1);
      for (auto& x : data[r]) x = u(rng);
    }
    const std::vector<float> expected = RankOrderSum(data);
    std::vector<float*> device(n());
    for (int r = 0; r < n(); ++r) device[r] = OnDevice(*c.world, r, data[r]);
    c.OnEachNode([&](int r, Transport& t) {
      Status st = t.AllReduceSumOnDevice(device[r], count, ElementType::kFloat32, tag);
      ASSERT_TRUE(st.ok()) << st.ToString();
    });
    ++tag;
    for (int r = 0; r < n(); ++r) {
      ASSERT_EQ(0, std::memcmp(device[r], expected.data(), count * sizeof(float)))
          << "node " << r << ", " << count << " elements";
    }
    want.push_back("allreduce float32 x" + std::to_string(count));
  }
  // The 8-byte types, with values where a lost bit would show.
  std::vector<std::vector<int64_t>> i64(n(), std::vector<int64_t>(5));
  std::vector<std::vector<double>> f64(n(), std::vector<double>(4));
  for (int r = 0; r < n(); ++r) {
    std::iota(i64[r].begin(), i64[r].end(), (int64_t{r + 1} << 40) - 3);
    std::iota(f64[r].begin(), f64[r].end(), 0.1 + r / 3.0);
  }
  std::vector<int64_t*> i64_device(n());
  std::vector<double*> f64_device(n());
  for (int r = 0; r < n(); ++r) {
    i64_device[r] = OnDevice(*c.world, r, i64[r]);
    f64_device[r] = OnDevice(*c.world, r, f64[r]);
  }
  c.OnEachNode([&](int r, Transport& t) {
    Status st = t.AllReduceSumOnDevice(i64_device[r], 5, ElementType::kInt64, 100);
    ASSERT_TRUE(st.ok()) << st.ToString();
    st = t.AllReduceSumOnDevice(f64_device[r], 4, ElementType::kFloat64, 101);
    ASSERT_TRUE(st.ok()) << st.ToString();
  });
  want.push_back("allreduce int64 x5");
  want.push_back("allreduce float64 x4");
  for (int r = 0; r < n(); ++r) {
    EXPECT_EQ(std::vector<int64_t>(i64_device[r], i64_device[r] + 5), RankOrderSum(i64))
        << "node " << r;
    const std::vector<double> f64_sum = RankOrderSum(f64);
    EXPECT_EQ(0, std::memcmp(f64_device[r], f64_sum.data(), 4 * sizeof(double))) << "node " << r;
    EXPECT_EQ(c.world->executed(r), want) << "node " << r;
    EXPECT_EQ(c.world->copies(r), 0) << "node " << r << ": no host<->device copy";
    EXPECT_EQ(c.world->device_allocations(r), 0) << "node " << r << ": no staging buffer";
  }
}

TEST_P(NcclTransportTest, AllReduceSumOnDeviceKeepsCallOrderWithHostCalls) {
  Cluster c = MakeCluster();
  std::vector<int64_t*> ints(n());
  std::vector<double*> doubles(n());
  for (int r = 0; r < n(); ++r) {
    ints[r] = OnDevice(*c.world, r, std::vector<int64_t>(4, r + 1));
    doubles[r] = OnDevice(*c.world, r, std::vector<double>(2, 0.5 * r));
  }
  std::vector<size_t> sizes(n());
  for (int q = 0; q < n(); ++q) sizes[q] = q + 1;
  std::vector<char> gathered;
  for (int q = 0; q < n(); ++q) gathered.insert(gathered.end(), q + 1, static_cast<char>('a' + q));
  c.OnEachNode([&](int r, Transport& t) {
    std::vector<float> host(3, 1.0f);
    ASSERT_TRUE(t.AllReduceSum(host.data(), 3, ElementType::kFloat32, 1).ok());
    EXPECT_EQ(host, std::vector<float>(3, static_cast<float>(n())));
    Status st = t.AllReduceSumOnDevice(ints[r], 4, ElementType::kInt64, 2);
    ASSERT_TRUE(st.ok()) << st.ToString();
    std::vector<char> mine(r + 1, static_cast<char>('a' + r));
    std::vector<char> all(gathered.size());
    ASSERT_TRUE(t.AllGatherV(mine.data(), mine.size(), all.data(), sizes, 3).ok());
    EXPECT_EQ(all, gathered);
    st = t.AllReduceSumOnDevice(doubles[r], 2, ElementType::kFloat64, 4);
    ASSERT_TRUE(st.ok()) << st.ToString();
    std::vector<int32_t> last(2, r);
    ASSERT_TRUE(t.AllReduceSum(last.data(), 2, ElementType::kInt32, 5).ok());
    EXPECT_EQ(last, std::vector<int32_t>(2, n() * (n() - 1) / 2));
  });
  double halves = 0;
  for (int r = 0; r < n(); ++r) halves += 0.5 * r;
  for (int r = 0; r < n(); ++r) {
    EXPECT_EQ(std::vector<int64_t>(ints[r], ints[r] + 4),
              std::vector<int64_t>(4, int64_t{n()} * (n() + 1) / 2))
        << "node " << r;
    EXPECT_EQ(std::vector<double>(doubles[r], doubles[r] + 2), std::vector<double>(2, halves))
        << "node " << r;
    std::vector<std::string> want = {"allreduce float32 x3", "allreduce int64 x4"};
    if (n() > 1) want.push_back("allgather 8");
    want.push_back("allgather " + std::to_string(n()));
    want.push_back("allreduce float64 x2");
    want.push_back("allreduce int32 x2");
    EXPECT_EQ(c.world->executed(r), want) << "node " << r;
  }
}

TEST_P(NcclTransportTest, AMissingNodeMakesAnOnDeviceAllReduceTimeOut) {
  if (n() < 2) GTEST_SKIP() << "needs two nodes";
  Cluster c = MakeCluster(500ms);
  const int absent = n() - 1;
  std::vector<float*> device(n());
  for (int r = 0; r < n(); ++r) device[r] = OnDevice(*c.world, r, std::vector<float>{1.0f});
  std::vector<Status> results(n());
  std::vector<Clock::duration> took(n());
  c.OnEachNode([&](int r, Transport& t) {
    if (r == absent) return;  // a dead peer: never calls
    const auto start = Clock::now();
    results[r] = t.AllReduceSumOnDevice(device[r], 1, ElementType::kFloat32, 11);
    took[r] = Clock::now() - start;
  });
  for (int r = 0; r < absent; ++r) {
    EXPECT_EQ(results[r].code(), StatusCode::kDeadlineExceeded) << results[r].ToString();
    EXPECT_TRUE(Contains(results[r], "NCCL allreduce in device memory (tag 11, 4 bytes) on node " +
                                         std::to_string(r)))
        << results[r].ToString();
    EXPECT_TRUE(Contains(results[r], "500 ms")) << results[r].ToString();
    EXPECT_GE(took[r], 500ms);
    EXPECT_LT(took[r], 10s);
    EXPECT_EQ(c.world->abort_calls(r), 1) << "node " << r;
    // Sticky, on both paths: later calls fail at once with the first error, without another abort.
    Status again = c.nodes[r]->AllReduceSumOnDevice(device[r], 1, ElementType::kFloat32, 12);
    EXPECT_EQ(again.code(), StatusCode::kDeadlineExceeded) << again.ToString();
    EXPECT_TRUE(Contains(again, "allreduce in device memory (tag 11")) << again.ToString();
    float x = 1;
    again = c.nodes[r]->AllReduceSum(&x, 1, ElementType::kFloat32, 13);
    EXPECT_EQ(again.code(), StatusCode::kDeadlineExceeded) << again.ToString();
    EXPECT_TRUE(Contains(again, "allreduce in device memory (tag 11")) << again.ToString();
    EXPECT_EQ(c.world->abort_calls(r), 1);
    EXPECT_TRUE(c.world->executed(r).empty()) << "node " << r;
  }
  EXPECT_EQ(c.world->abort_calls(absent), 0);
}

TEST_P(NcclTransportTest, AbortFromAnotherThreadEndsABlockedOnDeviceAllReduce) {
  if (n() < 2) GTEST_SKIP() << "needs a peer that does not come";
  Cluster c = MakeCluster(60s);
  float* device = OnDevice(*c.world, 0, std::vector<float>(8, 1.0f));
  Status result;
  const auto start = Clock::now();
  std::thread caller(
      [&] { result = c.nodes[0]->AllReduceSumOnDevice(device, 8, ElementType::kFloat32, 51); });
  // Abort once the collective is with NCCL, so that it stops a call in progress.
  while (c.world->collectives_issued(0) == 0 && Clock::now() - start < 10s) {
    std::this_thread::sleep_for(1ms);
  }
  c.nodes[0]->Abort(Aborted("the daemon is shutting down"));
  caller.join();
  EXPECT_LT(Clock::now() - start, 10s);
  EXPECT_EQ(result.code(), StatusCode::kAborted) << result.ToString();
  EXPECT_TRUE(Contains(result, "the daemon is shutting down")) << result.ToString();
  EXPECT_TRUE(Contains(result, "allreduce in device memory (tag 51")) << result.ToString();
  EXPECT_EQ(c.world->abort_calls(0), 1);
  Status later = c.nodes[0]->AllReduceSumOnDevice(device, 8, ElementType::kFloat32, 52);
  EXPECT_EQ(later.code(), StatusCode::kAborted) << later.ToString();
  EXPECT_TRUE(Contains(later, "the daemon is shutting down")) << later.ToString();
  EXPECT_EQ(c.world->abort_calls(0), 1);
}

INSTANTIATE_TEST_SUITE_P(Nodes, NcclTransportTest,
                         ::testing::Values(Param{1, 0}, Param{2, 0}, Param{3, 0}, Param{4, 0},
                                           Param{1, 3}, Param{2, 3}, Param{3, 3}, Param{4, 3}),
                         [](const auto& info) {
                           return std::to_string(info.param.nodes) + "Nodes" +
                                  (info.param.enqueue_polls > 0 ? "SlowEnqueue" : "");
                         });

// --- A transport that does not know its CUDA device. ---

TEST(NcclDeviceMemoryTest, WithoutItsCudaDeviceTheTransportRefusesDeviceMemory) {
  EXPECT_EQ(NcclTransportOptions{}.device, -1) << "unknown unless the factory says";
  Cluster c(2, /*enqueue_polls=*/0, 20s, /*device=*/-1);
  std::vector<float*> device(2);
  for (int r = 0; r < 2; ++r) device[r] = OnDevice(*c.world, r, std::vector<float>(4, 1.0f));
  c.OnEachNode([&](int r, Transport& t) {
    EXPECT_EQ(t.cuda_device(), -1);
    Status st = t.AllReduceSumOnDevice(device[r], 4, ElementType::kFloat32, 7);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
    EXPECT_TRUE(Contains(st, "NcclTransportOptions::device is -1")) << st.ToString();
    st = t.AllReduceSumOnDevice(nullptr, 0, ElementType::kFloat32, 8);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
    // Refused before NCCL: not sticky, and the nodes stay in step.
    std::vector<float> host(4, 1.0f);
    st = t.AllReduceSum(host.data(), 4, ElementType::kFloat32, 9);
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(host, std::vector<float>(4, 2.0f));
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(std::vector<float>(device[r], device[r] + 4), std::vector<float>(4, 1.0f));
    EXPECT_EQ(c.world->executed(r), std::vector<std::string>{"allreduce float32 x4"});
    EXPECT_EQ(c.world->abort_calls(r), 0);
  }
}

}  // namespace
}  // namespace sparsync::transport
