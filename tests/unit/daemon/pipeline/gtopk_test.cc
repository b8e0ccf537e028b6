// gTop-k with ranks as threads over the loopback transport: every node ends with the same bits,
// values are the exact sums of the inputs at the global indices, kept masks conserve mass, and
// brute-force global top-k is the oracle where gTop-k must match it.
#include "daemon/pipeline/gtopk.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <thread>

#include "daemon/transport/loopback/loopback_transport.h"

namespace sparsync::pipeline {
namespace {

struct Selection {
  std::vector<int32_t> indices;
  std::vector<float> values;
};

struct NodeResult {
  Status status;
  std::vector<int32_t> indices;
  std::vector<float> values;
  std::vector<uint8_t> kept;
  uint32_t tag = 0;
};

constexpr uint32_t kFirstTag = 40;

// Runs GlobalTopK on inputs.size() nodes, ranks as threads; per-node k (so a test can make them
// disagree).
std::vector<NodeResult> RunNodes(const std::vector<Selection>& inputs, int64_t numel,
                                 const std::vector<int64_t>& ks) {
  const int nodes = static_cast<int>(inputs.size());
  auto hub = std::make_shared<transport::LoopbackHub>(nodes, std::chrono::seconds(10));
  std::vector<NodeResult> out(nodes);
  std::vector<std::thread> threads;
  for (int r = 0; r < nodes; ++r) {
    threads.emplace_back([&, r] {
      transport::LoopbackTransport t(hub, r);
      out[r].tag = kFirstTag;
      out[r].status = GlobalTopK(&t, numel, ks[r], inputs[r].indices, inputs[r].values,
                                 &out[r].indices, &out[r].values, &out[r].kept, &out[r].tag);
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

std::vector<NodeResult> RunNodes(const std::vector<Selection>& inputs, int64_t numel, int64_t k) {
  return RunNodes(inputs, numel, std::vector<int64_t>(inputs.size(), k));
}

// Sum over nodes of their inputs, per index (doubles: exact for the integer-valued tests).
std::map<int32_t, double> SumOfInputs(const std::vector<Selection>& inputs) {
  std::map<int32_t, double> sum;
  for (const auto& in : inputs)
    for (size_t j = 0; j < in.indices.size(); ++j) sum[in.indices[j]] += in.values[j];
  return sum;
}

// Oracle: the k entries of the summed inputs with largest |value| (ties: smaller index).
std::vector<int32_t> BruteForceTopK(const std::vector<Selection>& inputs, int64_t k) {
  auto sum = SumOfInputs(inputs);
  std::vector<std::pair<int32_t, double>> all(sum.begin(), sum.end());
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) {
    return std::fabs(a.second) != std::fabs(b.second) ? std::fabs(a.second) > std::fabs(b.second)
                                                      : a.first < b.first;
  });
  if (static_cast<int64_t>(all.size()) > k) all.resize(k);
  std::vector<int32_t> out;
  for (const auto& [i, v] : all) out.push_back(i);
  std::sort(out.begin(), out.end());
  return out;
}

// `count` distinct indices of [0, numel) (at most numel), ascending, with values from `value`.
template <typename ValueFn>
Selection RandomSelection(std::mt19937* rng, int64_t numel, int64_t count, ValueFn value) {
  std::set<int32_t> chosen;
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(numel - 1));
  while (static_cast<int64_t>(chosen.size()) < std::min(count, numel)) chosen.insert(pick(*rng));
  Selection s;
  for (int32_t i : chosen) {
    s.indices.push_back(i);
    s.values.push_back(value(*rng));
  }
  return s;
}

// Integer values in [-20, 20] without 0: sums are exact in float, and |value| ties are common.
float SmallInteger(std::mt19937& rng) {
  int v = std::uniform_int_distribution<int>(-20, 19)(rng);
  return static_cast<float>(v >= 0 ? v + 1 : v);
}

int Log2(int nodes) {
  int rounds = 0;
  while ((1 << rounds) < nodes) ++rounds;
  return rounds;
}

void ExpectAllNodesIdentical(const std::vector<NodeResult>& results) {
  for (size_t r = 0; r < results.size(); ++r) {
    ASSERT_TRUE(results[r].status.ok()) << "node " << r << ": " << results[r].status.ToString();
    ASSERT_EQ(results[r].indices, results[0].indices) << "node " << r;
    ASSERT_EQ(results[r].values.size(), results[0].values.size()) << "node " << r;
    if (results[0].values.empty()) continue;  // memcmp must not see the null data() of empty
    EXPECT_EQ(0, std::memcmp(results[r].values.data(), results[0].values.data(),
                             results[0].values.size() * sizeof(float)))
        << "node " << r << " differs in its bits";
  }
}

struct Sweep {
  int nodes;
  int64_t numel;
  int64_t k;
};

class GlobalTopKTest : public ::testing::TestWithParam<Sweep> {};

// Random overlapping selections with integer values: exact sums, membership masks, exact mass
// conservation, and the global set size.
TEST_P(GlobalTopKTest, ExactSumsMembershipMasksAndMassConservation) {
  const auto [nodes, numel, k] = GetParam();
  for (int trial = 0; trial < 5; ++trial) {
    std::vector<Selection> inputs;
    for (int r = 0; r < nodes; ++r) {
      std::mt19937 rng(1000 * trial + r);
      int64_t count = std::uniform_int_distribution<int64_t>(0, k)(rng);
      inputs.push_back(RandomSelection(&rng, numel, count, SmallInteger));
    }
    auto results = RunNodes(inputs, numel, k);
    ExpectAllNodesIdentical(results);
    if (HasFatalFailure()) return;
    const auto& global = results[0];
    auto sum = SumOfInputs(inputs);
    EXPECT_EQ(static_cast<int64_t>(global.indices.size()),
              std::min<int64_t>(k, static_cast<int64_t>(sum.size())));
    EXPECT_TRUE(std::is_sorted(global.indices.begin(), global.indices.end()));
    EXPECT_EQ(std::adjacent_find(global.indices.begin(), global.indices.end()),
              global.indices.end());
    std::set<int32_t> global_set(global.indices.begin(), global.indices.end());
    for (size_t j = 0; j < global.indices.size(); ++j) {
      EXPECT_EQ(global.values[j], sum[global.indices[j]]) << "index " << global.indices[j];
    }
    double total_in = 0, total_out = 0, total_dropped = 0;
    for (float v : global.values) total_out += v;
    for (int r = 0; r < nodes; ++r) {
      EXPECT_EQ(results[r].tag, kFirstTag + Log2(nodes) + 1);
      ASSERT_EQ(results[r].kept.size(), inputs[r].indices.size());
      for (size_t j = 0; j < inputs[r].indices.size(); ++j) {
        EXPECT_EQ(results[r].kept[j], global_set.count(inputs[r].indices[j]))
            << "node " << r << " entry " << j;
        total_in += inputs[r].values[j];
        if (!results[r].kept[j]) total_dropped += inputs[r].values[j];
      }
    }
    EXPECT_EQ(total_in, total_out + total_dropped);
  }
}

// Random float values: rounding happens, every node still holds the same bits, and mass is
// conserved up to that rounding.
TEST_P(GlobalTopKTest, FloatValuesAreBitIdenticalAndConserveMass) {
  const auto [nodes, numel, k] = GetParam();
  std::vector<Selection> inputs;
  for (int r = 0; r < nodes; ++r) {
    std::mt19937 rng(77 + r);
    inputs.push_back(RandomSelection(&rng, numel, k, [](std::mt19937& g) {
      return std::normal_distribution<float>(0.0f, 1.0f)(g);
    }));
  }
  auto results = RunNodes(inputs, numel, k);
  ExpectAllNodesIdentical(results);
  if (HasFatalFailure()) return;
  double total_in = 0, total_out = 0, total_dropped = 0, magnitude = 0;
  for (float v : results[0].values) total_out += v;
  for (int r = 0; r < nodes; ++r) {
    for (size_t j = 0; j < inputs[r].values.size(); ++j) {
      total_in += inputs[r].values[j];
      magnitude += std::fabs(inputs[r].values[j]);
      if (!results[r].kept[j]) total_dropped += inputs[r].values[j];
    }
  }
  EXPECT_NEAR(total_in, total_out + total_dropped, 1e-5 * (1 + magnitude));
}

// Every node selected the same indices: nothing is dropped and the result is the brute-force
// global top-k of the summed selections.
TEST_P(GlobalTopKTest, CoincidingIndicesGiveTheBruteForceResult) {
  const auto [nodes, numel, k] = GetParam();
  std::mt19937 shared(5);
  Selection base = RandomSelection(&shared, numel, k, SmallInteger);
  std::vector<Selection> inputs;
  for (int r = 0; r < nodes; ++r) {
    std::mt19937 rng(900 + r);
    Selection s = base;
    for (float& v : s.values) v = SmallInteger(rng);
    inputs.push_back(s);
  }
  auto results = RunNodes(inputs, numel, k);
  ExpectAllNodesIdentical(results);
  if (HasFatalFailure()) return;
  EXPECT_EQ(results[0].indices, BruteForceTopK(inputs, k));
  auto sum = SumOfInputs(inputs);
  for (size_t j = 0; j < results[0].indices.size(); ++j) {
    EXPECT_EQ(results[0].values[j], sum[results[0].indices[j]]);
  }
  for (const auto& r : results) EXPECT_EQ(r.kept, std::vector<uint8_t>(base.indices.size(), 1));
}

// Disjoint selections never add, so merge-and-reselect is exact: gTop-k equals the brute-force
// global top-k of all entries, ties (equal |value|, smaller index wins) included.
TEST_P(GlobalTopKTest, DisjointIndicesGiveTheBruteForceResult) {
  const auto [nodes, numel, k] = GetParam();
  std::vector<Selection> inputs(nodes);
  std::mt19937 rng(11);
  for (int32_t i = 0; i < numel; ++i) {
    if (std::uniform_int_distribution<int>(0, 2)(rng) != 0) continue;  // leave gaps
    Selection& s = inputs[std::uniform_int_distribution<int>(0, nodes - 1)(rng)];
    if (static_cast<int64_t>(s.indices.size()) == k) continue;
    s.indices.push_back(i);
    s.values.push_back(SmallInteger(rng));
  }
  auto results = RunNodes(inputs, numel, k);
  ExpectAllNodesIdentical(results);
  if (HasFatalFailure()) return;
  EXPECT_EQ(results[0].indices, BruteForceTopK(inputs, k));
}

INSTANTIATE_TEST_SUITE_P(Nodes, GlobalTopKTest,
                         ::testing::Values(Sweep{1, 100, 8}, Sweep{2, 40, 8}, Sweep{2, 100000, 64},
                                           Sweep{4, 30, 8}, Sweep{4, 1000, 1},
                                           Sweep{4, 100000, 256}, Sweep{8, 64, 16},
                                           Sweep{8, 100000, 100}, Sweep{8, 50, 0}),
                         [](const auto& info) {
                           return std::to_string(info.param.nodes) + "Nodes" +
                                  std::to_string(info.param.numel) + "Numel" +
                                  std::to_string(info.param.k) + "K";
                         });

// Index 5 is dropped by nodes {0, 1} in round 0 (|2| beats |1| with k = 1) but wins the final
// round through nodes {2, 3}; its value must still include node 0's 1.0, and node 0's entry
// counts as delivered.
TEST(GlobalTopKCorrectionTest, AnIndexThatReentersCarriesEveryNodesContribution) {
  std::vector<Selection> inputs = {{{5}, {1.0f}}, {{7}, {2.0f}}, {{5}, {3.0f}}, {{9}, {0.5f}}};
  auto results = RunNodes(inputs, /*numel=*/10, /*k=*/1);
  ExpectAllNodesIdentical(results);
  if (HasFatalFailure()) return;
  EXPECT_EQ(results[0].indices, std::vector<int32_t>({5}));
  EXPECT_EQ(results[0].values, std::vector<float>({4.0f}));
  std::vector<std::vector<uint8_t>> expected_kept = {{1}, {0}, {1}, {0}};
  for (int r = 0; r < 4; ++r) EXPECT_EQ(results[r].kept, expected_kept[r]) << "node " << r;
}

TEST(GlobalTopKErrorTest, NonPowerOfTwoNodeCountsAreRefusedOnEveryNode) {
  for (int nodes : {3, 5, 6}) {
    EXPECT_FALSE(GlobalTopKSupports(nodes));
    std::vector<Selection> inputs(nodes, Selection{{1, 2}, {1.0f, 2.0f}});
    auto results = RunNodes(inputs, 10, 2);
    for (const auto& r : results) {
      EXPECT_EQ(r.status.code(), StatusCode::kInvalidArgument) << r.status.ToString();
      EXPECT_NE(r.status.message().find("power-of-two"), std::string::npos);
      EXPECT_EQ(r.tag, kFirstTag);
    }
  }
  for (int nodes : {1, 2, 4, 8, 1024}) EXPECT_TRUE(GlobalTopKSupports(nodes));
}

TEST(GlobalTopKErrorTest, MalformedInputIsRefused) {
  const std::vector<Selection> bad = {
      {{2, 1}, {1.0f, 1.0f}},           // not ascending
      {{1, 1}, {1.0f, 1.0f}},           // repeated
      {{10}, {1.0f}},                   // out of range
      {{1, 2, 3}, {1.0f, 1.0f, 1.0f}},  // more than k
      {{1, 2}, {1.0f}},                 // sizes differ
  };
  for (const auto& input : bad) {
    auto results = RunNodes({input}, /*numel=*/10, /*k=*/2);
    EXPECT_EQ(results[0].status.code(), StatusCode::kInvalidArgument)
        << results[0].status.ToString();
  }
}

TEST(GlobalTopKErrorTest, PeersWithDifferentKFailWithMismatch) {
  std::vector<Selection> inputs = {{{1}, {1.0f}}, {{1, 2, 3, 4}, {1.0f, 2.0f, 3.0f, 4.0f}}};
  auto results = RunNodes(inputs, /*numel=*/10, std::vector<int64_t>{1, 4});
  for (const auto& r : results) {
    EXPECT_EQ(r.status.code(), StatusCode::kMismatch) << r.status.ToString();
  }
}

}  // namespace
}  // namespace sparsync::pipeline
