#include "daemon/planning/planner.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

namespace sparsync::planning {
namespace {

using Starts = std::vector<size_t>;

PlanInput Input(std::vector<double> backward, std::vector<uint64_t> elements, LinearCost exchange,
                LinearCost sparsify = {}) {
  PlanInput in;
  for (size_t i = 0; i < backward.size(); ++i) in.layers.push_back({elements[i], backward[i]});
  in.cost.exchange = exchange;
  in.cost.sparsify = sparsify;
  return in;
}

TEST(LinearCostTest, FitsALineExactly) {
  LinearCost c = LinearCost::Fit({{1000, 0.002}, {2000, 0.003}, {4000, 0.005}});
  EXPECT_NEAR(c.fixed_s, 0.001, 1e-12);
  EXPECT_NEAR(c.per_element_s, 1e-6, 1e-15);
}

TEST(LinearCostTest, NeverNegative) {
  LinearCost decreasing = LinearCost::Fit({{1, 0.3}, {2, 0.2}, {3, 0.1}});
  EXPECT_EQ(decreasing.per_element_s, 0);
  EXPECT_NEAR(decreasing.fixed_s, 0.2, 1e-12);
  LinearCost through_below = LinearCost::Fit({{1, 0.0}, {2, 0.0}, {3, 1.0}});
  EXPECT_EQ(through_below.fixed_s, 0);
  EXPECT_GT(through_below.per_element_s, 0);
  EXPECT_EQ(LinearCost::Fit({}), LinearCost{});
  EXPECT_NEAR(LinearCost::Fit({{10, 1.0}, {10, 3.0}}).per_element_s, 0.2, 1e-12);
}

// A sort-based selection (a GPU's top-k; OMGS-SGD's fit is s * x log2 x) in its own shape.
TEST(LinearCostTest, FitsXLogXExactly) {
  auto t = [](double x) { return 1e-3 + 2e-9 * x * std::log2(x); };
  LinearCost c = LinearCost::Fit({{1024, t(1024)}, {4096, t(4096)}, {65536, t(65536)}}, nullptr,
                                 /*x_log_x=*/true);
  EXPECT_TRUE(c.x_log_x);
  EXPECT_NEAR(c.fixed_s, 1e-3, 1e-12);
  EXPECT_NEAR(c.per_element_s, 2e-9, 1e-18);
  EXPECT_NEAR(c.At(1 << 26), t(1 << 26), 1e-9);
  EXPECT_NE(c.ToString().find("log2"), std::string::npos) << c.ToString();
  EXPECT_NEAR(LinearCost::FitSlope({{1024, t(1024)}}, 1e-3, true).per_element_s, 2e-9, 1e-18);
}

// The calibration's points choose the selection's shape: x log2 x only where they curve, and a
// line where they do not (ties, two sizes, a noisy linear-time CPU top-k).
TEST(LinearCostTest, FitBetterShapeFollowsThePoints) {
  std::vector<std::pair<double, double>> curved, straight, noisy;
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> jitter(0.95, 1.05);
  for (int e = 12; e <= 22; e += 2) {
    const double x = std::ldexp(1.0, e);
    curved.emplace_back(x, 50e-6 + 2.19e-10 * x * e);
    straight.emplace_back(x, 20e-6 + 0.6e-9 * x);
    noisy.emplace_back(x, (20e-6 + 0.6e-9 * x) * jitter(rng));
  }
  const LinearCost c = LinearCost::FitBetterShape(curved);
  EXPECT_TRUE(c.x_log_x) << c.ToString();
  EXPECT_NEAR(c.per_element_s, 2.19e-10, 1e-15);
  // A line through those points, extrapolated to a 64 M-element group, is 10 % short of it.
  EXPECT_LT(LinearCost::Fit(curved).At(1 << 26), 0.9 * c.At(1 << 26));
  EXPECT_FALSE(LinearCost::FitBetterShape(straight).x_log_x);
  EXPECT_FALSE(LinearCost::FitBetterShape(noisy).x_log_x);
  EXPECT_FALSE(LinearCost::FitBetterShape({curved[0], curved[5]}).x_log_x);
  // Three sizes leave each shape one residual, too few to tell noise from a curve; four do.
  EXPECT_FALSE(LinearCost::FitBetterShape({curved[0], curved[2], curved[5]}).x_log_x);
  EXPECT_TRUE(LinearCost::FitBetterShape({curved[0], curved[2], curved[4], curved[5]}).x_log_x);
  EXPECT_EQ(LinearCost::FitBetterShape({}), LinearCost{});
}

// Two layers, no selection cost, one unit of start-up per exchange.
//   layerwise: ready 1 -> exchange [1, 2]; ready 3 -> exchange [3, 4]: 4
//   single:    ready 3 -> exchange [3, 4]: 4
TEST(SimulateTest, HandComputedTimelines) {
  PlanInput in = Input({1, 2}, {10, 10}, {1.0, 0.0});
  Timeline layerwise = Simulate(in, {0, 1});
  EXPECT_DOUBLE_EQ(layerwise.exchange_start[0], 1);
  EXPECT_DOUBLE_EQ(layerwise.exchange_end[0], 2);
  EXPECT_DOUBLE_EQ(layerwise.exchange_start[1], 3);
  EXPECT_DOUBLE_EQ(layerwise.iteration_s, 4);
  EXPECT_DOUBLE_EQ(Simulate(in, {0}).iteration_s, 4);
}

// The network queues: the second exchange waits for the first.
//   ready 0, 0.5; t_c = 2: [0, 2], [2, 4]
TEST(SimulateTest, ExchangesQueueOnOneNetwork) {
  Timeline t = Simulate(Input({0, 0.5}, {1, 1}, {2.0, 0.0}), {0, 1});
  EXPECT_DOUBLE_EQ(t.exchange_start[1], 2);
  EXPECT_DOUBLE_EQ(t.iteration_s, 4);
}

// Stage A holds one prepared group while B exchanges the one before, and takes the next group
// only once B has taken it (the executor's depth-1 pipeline). Everything ready at 0; t_s = 1 per
// element (1, 1, 4), t_c = 3:
//   A: g0 [0, 1], g1 [1, 2], then waits for B to take g1 at 4: g2 [4, 8]
//   B: g0 [1, 4], g1 [4, 7], g2 [8, 11]
// Without the wait, g2 would be selected over [2, 6] and the iteration end at 10.
TEST(SimulateTest, StageAWaitsForStageBToTakeThePreparedGroup) {
  Timeline t = Simulate(Input({0, 0, 0}, {1, 1, 4}, {3.0, 0.0}, {0.0, 1.0}), {0, 1, 2});
  EXPECT_DOUBLE_EQ(t.sparsify_end[1], 2);
  EXPECT_DOUBLE_EQ(t.sparsify_end[2], 8);
  EXPECT_DOUBLE_EQ(t.exchange_start[2], 8);
  EXPECT_DOUBLE_EQ(t.iteration_s, 11);
}

// Selection cost 1 per element; a blocking sparsifier delays the next layer's backward.
//   non-blocking: ready 1, 2; select [1, 2], [2, 3]; exchange (0.5) [2, 2.5], [3, 3.5]
//   blocking:     backward [0,1], select [1,2], backward [2,3], select [3,4]; exchange ends 4.5
TEST(SimulateTest, BlockingSparsificationDelaysBackward) {
  PlanInput in = Input({1, 1}, {1, 1}, {0.5, 0.0}, {0.0, 1.0});
  EXPECT_DOUBLE_EQ(Simulate(in, {0, 1}).iteration_s, 3.5);
  in.sparsify_blocks_backward = true;
  EXPECT_DOUBLE_EQ(Simulate(in, {0, 1}).iteration_s, 4.5);
}

// Expensive start-up, quick backward: merging everything wins.
TEST(PlannerTest, LatencyBoundProfileMergesEverything) {
  PlanInput in = Input({1, 0.1, 0.1}, {100, 100, 100}, {1.0, 1e-6});
  EXPECT_EQ(PlanOmgs(in).starts, Starts{0});
  EXPECT_EQ(PlanOptimal(in).starts, Starts{0});
  EXPECT_NEAR(PlanOptimal(in).predicted_s, 1.2 + 1.0 + 300e-6, 1e-12);
}

// Cheap start-up, long backward, slow transfer: every layer alone overlaps best.
TEST(PlannerTest, BandwidthBoundProfileStaysLayerwise) {
  PlanInput in = Input({1, 1, 1}, {1, 1, 1}, {0.01, 1.0});
  EXPECT_EQ(PlanOmgs(in).starts, (Starts{0, 1, 2}));
  EXPECT_EQ(PlanOptimal(in).starts, (Starts{0, 1, 2}));
  EXPECT_NEAR(PlanLayerwise(in).predicted_s, 4.03, 1e-12);
  EXPECT_NEAR(PlanSingle(in).predicted_s, 6.01, 1e-12);
}

// A small layer (a bias) between two big ones; the big ones stay apart.
//   layers: 1000 elements ready at 1, 1 element at 1.01, 1000 elements at 2.01; t_c = 0.1 + 1e-3 x
//   [0] [1] [2]:  exchanges [1, 2.1] [2.1, 2.201] [2.201, 3.301]
//   [0 1] [2]:    [1.01, 2.111] [2.111, 3.211]     <- greedy: merging saves a start-up now
//   [0] [1 2]:    [1, 2.1] [2.1, 3.201]            <- optimal: the bias rides with the next layer
TEST(PlannerTest, GreedyMergesForwardWhereTheOptimumMergesBackward) {
  PlanInput in = Input({1, 0.01, 1}, {1000, 1, 1000}, {0.1, 1e-3});
  EXPECT_EQ(PlanOmgs(in).starts, (Starts{0, 2}));
  EXPECT_NEAR(PlanOmgs(in).predicted_s, 3.211, 1e-9);
  EXPECT_EQ(PlanOptimal(in).starts, (Starts{0, 1}));
  EXPECT_NEAR(PlanOptimal(in).predicted_s, 3.201, 1e-9);
  EXPECT_NEAR(PlanLayerwise(in).predicted_s, 3.301, 1e-9);
}

TEST(PlannerTest, MergeClassesAreNeverMixed) {
  PlanInput in = Input({1, 0.1, 0.1, 0.1}, {10, 10, 10, 10}, {1.0, 0.0});
  in.merge_class = {1, 1, 2, 2};
  for (PlannerKind k : {PlannerKind::kOmgs, PlannerKind::kOptimal, PlannerKind::kSingle,
                        PlannerKind::kMgWfbp}) {
    EXPECT_EQ(MakePlan(k, in)->starts, (Starts{0, 2})) << PlannerName(k);
  }
  EXPECT_EQ(MakePlan(PlannerKind::kFixed, in, 1 << 20)->starts, (Starts{0, 2}));
}

TEST(PlannerTest, FixedFollowsTheBucketRule) {
  PlanInput in = Input({1, 1, 1, 1}, {1000, 1000, 3000, 10}, {1.0, 0.0});
  EXPECT_EQ(PlanFixed(in, 8000).starts, (Starts{0, 2, 3}));  // 4000+4000 | 12000 | 40
}

TEST(PlannerTest, MgWfbpMergesWhileTheNetworkIsBusy) {
  // Layer 0's allreduce takes 5; layers 1 and 2 are ready while it runs: merged.
  PlanInput in = Input({0, 1, 1}, {5000, 10, 10}, {0.001, 1e-3});
  EXPECT_EQ(PlanMgWfbp(in).starts, (Starts{0, 1}));
}

TEST(PlannerTest, RejectsEmptyInput) {
  EXPECT_FALSE(MakePlan(PlannerKind::kOmgs, PlanInput{}).ok());
  EXPECT_FALSE(MakePlan(PlannerKind::kFixed, Input({1}, {1}, {}), 0).ok());
}

TEST(PlanTest, Describe) {
  Plan p;
  p.starts = {0, 1, 4};
  EXPECT_EQ(p.Describe(6), "3 groups: [0] [1..3] [4..5]");
  EXPECT_EQ(p.GroupSizes(6), (std::vector<size_t>{1, 3, 2}));
}

// The published rule, transcribed in the paper's notation as an independent oracle: layers
// 0..L-1 in forward order, backward from L-1; p[l] the size of the group that ends at l; tb, ts,
// tc per layer; timeline recomputed after every merge (O(L^2)); the merge decision for every pair
// including the last two layers.
std::vector<size_t> PaperOmgs(const PlanInput& in) {
  const int L = static_cast<int>(in.layers.size());
  std::vector<double> p(L), tb(L);
  for (int l = 0; l < L; ++l) {  // forward index l is backward position L-1-l
    p[l] = static_cast<double>(in.layers[L - 1 - l].elements);
    tb[l] = in.layers[L - 1 - l].backward_s;
  }
  auto ts = [&](double x) { return x == 0 ? 0.0 : in.cost.sparsify.At(x); };
  auto tc = [&](double x) { return x == 0 ? 0.0 : in.cost.exchange.At(x); };
  std::vector<double> tau_b(L), tau_s(L), tau_c(L);
  auto timeline = [&] {
    tau_b[L - 1] = 0;
    tau_s[L - 1] = tb[L - 1];
    for (int l = L - 2; l >= 0; --l) {
      tau_b[l] = tau_s[l + 1] + ts(p[l + 1]);
      tau_s[l] = tau_b[l] + tb[l];
    }
    tau_c[L - 1] = tau_s[L - 1] + ts(p[L - 1]);
    for (int l = L - 2; l >= 0; --l) {
      tau_c[l] = std::max(tau_c[l + 1] + tc(p[l + 1]), tau_s[l] + ts(p[l]));
    }
  };
  for (int l = L - 1; l >= 1; --l) {
    timeline();
    double t_w = tb[l - 1] + ts(p[l] + p[l - 1]) - ts(p[l]) - ts(p[l - 1]) -
                 (tau_c[l] - (tau_s[l] + ts(p[l])));
    double t_save = tc(p[l]) + tc(p[l - 1]) - tc(p[l] + p[l - 1]);
    if (t_w < t_save) {
      p[l - 1] += p[l];
      p[l] = 0;
      tb[l - 1] += tb[l];
      tb[l] = 0;
    }
  }
  // Groups end (in backward order) where p > 0; back to backward positions and group starts.
  std::vector<size_t> starts;
  for (int l = L - 1; l >= 0; --l) {
    bool starts_group = l == L - 1 || p[l + 1] > 0;
    if (starts_group) starts.push_back(static_cast<size_t>(L - 1 - l));
  }
  return starts;
}

PlanInput RandomInput(std::mt19937& rng, int max_layers, bool blocking) {
  std::uniform_int_distribution<int> layers(1, max_layers);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::uniform_int_distribution<int> magnitude(0, 7);
  PlanInput in;
  int n = layers(rng);
  for (int i = 0; i < n; ++i) {
    uint64_t elements = 1 + static_cast<uint64_t>(unit(rng) * std::pow(10.0, magnitude(rng)));
    in.layers.push_back({elements, unit(rng) * 0.02});
  }
  in.cost.exchange = {unit(rng) * 0.01, unit(rng) * 1e-8};
  in.cost.sparsify = {unit(rng) * 1e-4, unit(rng) * 2e-9};
  in.sparsify_blocks_backward = blocking;
  return in;
}

TEST(PlannerPropertyTest, OmgsMatchesThePublishedRule) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 1000; ++trial) {
    PlanInput in = RandomInput(rng, 40, /*blocking=*/true);
    EXPECT_EQ(PlanOmgs(in).starts, PaperOmgs(in)) << "trial " << trial;
  }
}

TEST(PlannerPropertyTest, OptimalIsNeverWorseThanAnyOtherPlanner) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 1000; ++trial) {
    PlanInput in = RandomInput(rng, 60, trial % 2 == 0);
    double optimal = PlanOptimal(in).predicted_s;
    EXPECT_DOUBLE_EQ(optimal, Simulate(in, PlanOptimal(in).starts).iteration_s);
    for (const Plan& other : {PlanOmgs(in), PlanLayerwise(in), PlanSingle(in), PlanMgWfbp(in),
                              PlanFixed(in, 32768)}) {
      EXPECT_LE(optimal, other.predicted_s * (1 + 1e-12))
          << "trial " << trial << " vs " << PlannerName(other.planner);
    }
  }
}

// For up to 12 layers, every one of the 2^(L-1) partitions: the DP finds the minimum.
TEST(PlannerPropertyTest, OptimalMatchesExhaustiveSearch) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 300; ++trial) {
    PlanInput in = RandomInput(rng, 12, trial % 2 == 1);
    size_t n = in.layers.size();
    double best = std::numeric_limits<double>::infinity();
    for (uint32_t mask = 0; mask < (1u << (n - 1)); ++mask) {
      Starts starts{0};
      for (size_t i = 1; i < n; ++i) {
        if (mask & (1u << (i - 1))) starts.push_back(i);
      }
      best = std::min(best, Simulate(in, starts).iteration_s);
    }
    EXPECT_DOUBLE_EQ(PlanOptimal(in).predicted_s, best) << "trial " << trial;
  }
}

TEST(PlannerPropertyTest, EveryPlanIsAPartition) {
  std::mt19937 rng(9);
  for (int trial = 0; trial < 200; ++trial) {
    PlanInput in = RandomInput(rng, 80, false);
    for (PlannerKind k : {PlannerKind::kOmgs, PlannerKind::kOptimal, PlannerKind::kLayerwise,
                          PlannerKind::kSingle, PlannerKind::kMgWfbp}) {
      Plan p = *MakePlan(k, in);
      ASSERT_FALSE(p.starts.empty());
      EXPECT_EQ(p.starts.front(), 0u);
      for (size_t g = 1; g < p.starts.size(); ++g) EXPECT_LT(p.starts[g - 1], p.starts[g]);
      EXPECT_LT(p.starts.back(), in.layers.size());
    }
  }
}

// ---- Compress only where it pays (SPARSYNC_COMPRESS=auto) ----

// One layer of 1000 elements ready at 0. Sparse: t_s 1 + t_c 1 = 2. Dense: 0 + dense t_c.
PlanInput OneLayer(double dense_exchange_s, bool choose) {
  PlanInput in = Input({0}, {1000}, {1.0, 0.0}, {1.0, 0.0});
  in.cost.dense_exchange = {dense_exchange_s, 0.0};
  in.choose_dense = choose;
  return in;
}

TEST(CompressWherePaysTest, DenseWhenPredictedFasterAndOnlyThen) {
  Plan faster = PlanSingle(OneLayer(0.5, true));
  EXPECT_EQ(faster.dense, std::vector<bool>{true});
  EXPECT_DOUBLE_EQ(faster.predicted_s, 0.5);
  EXPECT_EQ(faster.Describe(1), "1 group: [0 dense]");

  Plan slower = PlanSingle(OneLayer(3.0, true));
  EXPECT_TRUE(slower.dense.empty()) << "dense predicted slower: stays sparse";
  EXPECT_DOUBLE_EQ(slower.predicted_s, 2.0);
  EXPECT_TRUE(PlanSingle(OneLayer(2.0, true)).dense.empty()) << "a tie stays sparse";
  EXPECT_TRUE(PlanSingle(OneLayer(0.5, false)).dense.empty()) << "SPARSYNC_COMPRESS=always";
  PlanInput unknown = OneLayer(0.5, true);
  unknown.cost.dense_exchange = {};
  EXPECT_TRUE(PlanSingle(unknown).dense.empty()) << "no dense cost known: never dense";
}

// A small tensor and a large one ready 0.5 ms later, each alone; sparse t_c = 1 ms, dense
// t_c = 0.1 ms + 1 ns/element. All sparse: [0, 1], [1, 2] ms. The small one dense: [0, 0.1],
// then the large one sparse [0.5, 1.5] (dense it would take 10.1 ms).
TEST(CompressWherePaysTest, ChoosesPerGroup) {
  PlanInput in = Input({0, 0.5e-3}, {100, 10'000'000}, {1e-3, 0.0});
  in.cost.dense_exchange = {1e-4, 1e-9};
  in.choose_dense = true;
  Plan p = PlanLayerwise(in);
  EXPECT_EQ(p.dense, (std::vector<bool>{true, false}));
  EXPECT_DOUBLE_EQ(p.predicted_s, 1.5e-3);
  EXPECT_DOUBLE_EQ(Simulate(in, p.starts).iteration_s, 2e-3);
}

// For up to 9 layers, every partition with every dense/sparse choice of its groups: the optimal
// planner finds the minimum, and ChooseDense the best choice for each partition.
TEST(CompressWherePaysTest, OptimalMatchesExhaustiveSearchOverGroupsAndModes) {
  std::mt19937 rng(17);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  int dense_chosen = 0;
  for (int trial = 0; trial < 200; ++trial) {
    PlanInput in = RandomInput(rng, 9, trial % 2 == 1);
    in.cost.dense_prepare = {unit(rng) * 1e-4, unit(rng) * 1e-9};
    in.cost.dense_exchange = {unit(rng) * 2e-3, unit(rng) * 4e-8};
    in.choose_dense = true;
    const size_t n = in.layers.size();
    double best = std::numeric_limits<double>::infinity();
    for (uint32_t mask = 0; mask < (1u << (n - 1)); ++mask) {
      Starts starts{0};
      for (size_t i = 1; i < n; ++i) {
        if (mask & (1u << (i - 1))) starts.push_back(i);
      }
      double best_modes = std::numeric_limits<double>::infinity();
      for (uint32_t modes = 0; modes < (1u << starts.size()); ++modes) {
        std::vector<bool> dense(starts.size());
        for (size_t g = 0; g < starts.size(); ++g) dense[g] = modes & (1u << g);
        best_modes = std::min(best_modes, Simulate(in, starts, dense).iteration_s);
      }
      EXPECT_DOUBLE_EQ(Simulate(in, starts, ChooseDense(in, starts)).iteration_s, best_modes)
          << "trial " << trial << " mask " << mask;
      best = std::min(best, best_modes);
    }
    Plan optimal = PlanOptimal(in);
    EXPECT_DOUBLE_EQ(optimal.predicted_s, best) << "trial " << trial;
    dense_chosen += !optimal.dense.empty();
  }
  EXPECT_GT(dense_chosen, 10) << "the random costs should make dense pay now and then";
}

}  // namespace
}  // namespace sparsync::planning
