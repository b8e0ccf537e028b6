// The sparse exchange with nodes as threads over the loopback transport.
#include "daemon/pipeline/sparse_reducer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <iomanip>
#include <iostream>
#include <random>
#include <thread>

#include "daemon/transport/loopback/loopback_transport.h"

namespace sparsync::pipeline {
namespace {

struct Case {
  Compressor compressor;
  int nodes;
  ValueDType value_dtype = ValueDType::kFloat32;
  sparsync::IndexCoding index = sparsync::IndexCoding::kDeltaVarint;
};

std::string Name(const ::testing::TestParamInfo<Case>& info) {
  std::string n = std::string(CompressorName(info.param.compressor)) + "_" +
                  std::to_string(info.param.nodes) + "nodes";
  if (info.param.value_dtype == ValueDType::kFloat16) n += "_fp16";
  if (info.param.index == sparsync::IndexCoding::kRaw32) n += "_raw";
  return n;
}

// Two tensors of one merge group: 3000 + 1000 elements.
const std::string kA = "layer.weight", kB = "layer.bias";
const std::vector<GroupSlice> kSlices = {{&kA, 0, 3000}, {&kB, 3000, 1000}};
constexpr size_t kNumel = 4000;
constexpr int kSteps = 12;

std::vector<float> Gradient(int node, int step) {
  std::mt19937 rng(1000 * node + step);
  std::student_t_distribution<float> heavy(2.0f);  // heavy tails, like real gradients
  std::vector<float> g(kNumel);
  for (float& x : g) x = heavy(rng) * 0.01f;
  return g;
}

class SparseReducerTest : public ::testing::TestWithParam<Case> {
 protected:
  // Runs kSteps on every node; returns each node's results (per step) and final reducers.
  void Run(std::vector<std::vector<std::vector<float>>>* results,
           std::vector<std::unique_ptr<SparseReducer>>* reducers, Config config) {
    const int n = GetParam().nodes;
    auto hub = std::make_shared<transport::LoopbackHub>(n);
    std::vector<std::unique_ptr<transport::LoopbackTransport>> transports;
    results->assign(n, {});
    reducers->resize(n);
    for (int r = 0; r < n; ++r) {
      transports.push_back(std::make_unique<transport::LoopbackTransport>(hub, r));
      auto created = SparseReducer::Create(config, r, n, transports[r].get());
      ASSERT_TRUE(created.ok()) << created.status().ToString();
      (*reducers)[r] = std::move(*created);
    }
    std::vector<std::thread> threads;
    std::vector<Status> errors(n);
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        uint32_t tag = 0;
        for (int step = 1; step <= kSteps; ++step) {
          std::vector<float> g = Gradient(r, step);
          Status st = (*reducers)[r]->Reduce(kSlices, g, step, 7, 1.0, &tag);
          if (!st.ok()) {
            errors[r] = st;
            hub->Abort(st);
            return;
          }
          (*results)[r].push_back(std::move(g));
        }
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < n; ++r) ASSERT_TRUE(errors[r].ok()) << errors[r].ToString();
  }

  Config MakeConfig() {
    Config c;
    c.compressor = GetParam().compressor;
    c.density = 0.01;
    c.value_dtype = GetParam().value_dtype;
    c.index_coding = GetParam().index;
    c.seed = 5;
    return c;
  }
};

TEST_P(SparseReducerTest, EveryNodeHoldsTheSameBits) {
  std::vector<std::vector<std::vector<float>>> results;
  std::vector<std::unique_ptr<SparseReducer>> reducers;
  Run(&results, &reducers, MakeConfig());
  for (size_t r = 1; r < results.size(); ++r) {
    for (int s = 0; s < kSteps; ++s) {
      ASSERT_EQ(0, std::memcmp(results[r][s].data(), results[0][s].data(), kNumel * sizeof(float)))
          << "node " << r << " step " << s;
    }
  }
  // Something was sent, and far less than dense.
  size_t nonzero = 0;
  for (float x : results[0].back()) nonzero += x != 0.0f;
  EXPECT_GT(nonzero, 0u);
  EXPECT_LT(nonzero, kNumel / 4);
}

// Error feedback loses nothing: over all nodes and steps, the summed results (what was sent) plus
// the final residuals equal the summed gradients.
TEST_P(SparseReducerTest, SentPlusResidualEqualsTheGradients) {
  Config config = MakeConfig();
  if (!config.ErrorFeedback()) GTEST_SKIP() << "no residuals for " << CompressorName(config.compressor);
  std::vector<std::vector<std::vector<float>>> results;
  std::vector<std::unique_ptr<SparseReducer>> reducers;
  Run(&results, &reducers, config);
  const int n = GetParam().nodes;
  std::vector<double> gradients(kNumel, 0.0), accounted(kNumel, 0.0);
  for (int r = 0; r < n; ++r) {
    for (int step = 1; step <= kSteps; ++step) {
      auto g = Gradient(r, step);
      for (size_t i = 0; i < kNumel; ++i) gradients[i] += g[i];
    }
    for (const auto& slice : kSlices) {
      auto residual = reducers[r]->state().Get(TensorState::Kind::kResidual, *slice.name);
      ASSERT_EQ(residual.size(), slice.count);
      for (size_t i = 0; i < slice.count; ++i) accounted[slice.offset + i] += residual[i];
    }
  }
  for (int s = 0; s < kSteps; ++s) {
    for (size_t i = 0; i < kNumel; ++i) accounted[i] += results[0][s][i];  // sum over nodes
  }
  double worst = 0;
  for (size_t i = 0; i < kNumel; ++i) worst = std::max(worst, std::abs(accounted[i] - gradients[i]));
  EXPECT_LT(worst, 1e-4) << "mass lost or invented by error feedback";
}

// The executor's pipeline prepares the next group before the current one is exchanged: the
// interleaving Prepare(x), Prepare(y), Exchange(x), Exchange(y) gives the same bits and the same
// residuals as Reduce(x), Reduce(y); so does the host sparse path's form, the local sum written
// into PreparedGroup::work (PrepareWork) and, when the reducer allows it, decoded over it.
TEST_P(SparseReducerTest, PreparingAheadMatchesOneGroupAtATime) {
  const int n = GetParam().nodes;
  const Config config = MakeConfig();
  const std::string kC = "head.weight";
  const std::vector<GroupSlice> other = {{&kC, 0, 2500}};
  // [0]: one group at a time, [1]: prepared ahead, [2]: ahead, in the work buffers, [3]: ahead,
  // in place (the host path's way for top-k with error feedback; the others as [2]). Per node,
  // per step: x's result then y's.
  constexpr int kModes = 4;
  std::vector<std::vector<std::vector<float>>> results(kModes,
                                                       std::vector<std::vector<float>>(n));
  std::vector<std::vector<std::unique_ptr<SparseReducer>>> reducers(kModes);
  for (int mode = 0; mode < kModes; ++mode) {
    auto hub = std::make_shared<transport::LoopbackHub>(n);
    std::vector<std::unique_ptr<transport::LoopbackTransport>> transports;
    for (int r = 0; r < n; ++r) {
      transports.push_back(std::make_unique<transport::LoopbackTransport>(hub, r));
      auto created = SparseReducer::Create(config, r, n, transports[r].get());
      ASSERT_TRUE(created.ok()) << created.status().ToString();
      reducers[mode].push_back(std::move(*created));
    }
    std::vector<Status> errors(n);
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r, mode] {
        SparseReducer& reducer = *reducers[mode][r];
        uint32_t tag = 0;
        PreparedGroup px, py;
        auto run = [&](int step) -> Status {
          // x is the sum of two workers' gradients (u + v), y one worker's.
          const std::vector<float> u = Gradient(r, step), v = Gradient(r + 50, step);
          std::vector<float> x(kNumel);
          for (size_t j = 0; j < kNumel; ++j) x[j] = u[j] + v[j];
          std::vector<float> y = Gradient(r + 100, step);
          y.resize(2500);
          if (mode == 0) {
            SPARSYNC_RETURN_IF_ERROR(reducer.Reduce(kSlices, x, step, 1, n, &tag));
            SPARSYNC_RETURN_IF_ERROR(reducer.Reduce(other, y, step, 2, n, &tag));
          } else if (mode == 3 && reducer.ReducesInPlace()) {
            // Each tensor in buffers of its own, as the workers' regions are: x's two tensors
            // from two workers (u and v), y from one.
            std::vector<float> ua(u.begin(), u.begin() + 3000), ub(u.begin() + 3000, u.end());
            std::vector<float> va(v.begin(), v.begin() + 3000), vb(v.begin() + 3000, v.end());
            const std::vector<std::span<float>> xa = {ua, va}, xb = {ub, vb}, yy = {y};
            const std::vector<LocalBuffers> sx = {xa, xb}, sy = {yy};
            SPARSYNC_RETURN_IF_ERROR(reducer.PrepareInPlace(kSlices, sx, step, 1, &px));
            SPARSYNC_RETURN_IF_ERROR(reducer.PrepareInPlace(other, sy, step, 2, &py));
            SPARSYNC_RETURN_IF_ERROR(reducer.ExchangeInPlace(kSlices, px, sx, n, &tag));
            SPARSYNC_RETURN_IF_ERROR(reducer.ExchangeInPlace(other, py, sy, n, &tag));
            EXPECT_TRUE(px.work.empty()) << "no group-sized buffer";
            EXPECT_EQ(ua, va) << "every worker's buffer holds the result";
            EXPECT_EQ(ub, vb);
            std::copy(ua.begin(), ua.end(), x.begin());
            std::copy(ub.begin(), ub.end(), x.begin() + 3000);
          } else if (mode >= 2) {
            px.work = x;
            py.work = y;
            SPARSYNC_RETURN_IF_ERROR(reducer.PrepareWork(kSlices, step, 1, &px));
            SPARSYNC_RETURN_IF_ERROR(reducer.PrepareWork(other, step, 2, &py));
            std::span<float> sx(x), sy(y);
            if (reducer.DecodesIntoWork()) sx = px.work, sy = py.work;
            SPARSYNC_RETURN_IF_ERROR(reducer.Exchange(kSlices, px, sx, n, &tag));
            SPARSYNC_RETURN_IF_ERROR(reducer.Exchange(other, py, sy, n, &tag));
            std::copy(sx.begin(), sx.end(), x.begin());
            std::copy(sy.begin(), sy.end(), y.begin());
          } else {
            SPARSYNC_RETURN_IF_ERROR(reducer.Prepare(kSlices, x, step, 1, &px));
            SPARSYNC_RETURN_IF_ERROR(reducer.Prepare(other, y, step, 2, &py));
            SPARSYNC_RETURN_IF_ERROR(reducer.Exchange(kSlices, px, x, n, &tag));
            SPARSYNC_RETURN_IF_ERROR(reducer.Exchange(other, py, y, n, &tag));
          }
          results[mode][r].insert(results[mode][r].end(), x.begin(), x.end());
          results[mode][r].insert(results[mode][r].end(), y.begin(), y.end());
          return Status::Ok();
        };
        for (int step = 1; step <= 4; ++step) {
          errors[r] = run(step);
          if (!errors[r].ok()) {
            hub->Abort(errors[r]);
            return;
          }
        }
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < n; ++r) ASSERT_TRUE(errors[r].ok()) << errors[r].ToString();
  }
  for (int mode = 1; mode < kModes; ++mode) {
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(results[0][r].size(), results[mode][r].size());
      EXPECT_EQ(0, std::memcmp(results[0][r].data(), results[mode][r].data(),
                               results[0][r].size() * sizeof(float)))
          << "node " << r << " mode " << mode;
      for (const std::string* name : {&kA, &kB, &kC}) {
        auto serial = reducers[0][r]->state().Get(TensorState::Kind::kResidual, *name);
        auto ahead = reducers[mode][r]->state().Get(TensorState::Kind::kResidual, *name);
        ASSERT_EQ(serial.size(), ahead.size()) << *name;
        for (size_t i = 0; i < serial.size(); ++i) {
          ASSERT_EQ(serial[i], ahead[i]) << *name << "[" << i << "] on node " << r << " mode "
                                         << mode;
        }
      }
    }
  }
}

TEST_P(SparseReducerTest, InPlaceOnlyForTopKWithErrorFeedback) {
  const Config config = MakeConfig();
  auto hub = std::make_shared<transport::LoopbackHub>(1);
  transport::LoopbackTransport t(hub, 0);
  auto reducer = SparseReducer::Create(config, 0, GetParam().nodes, &t);
  ASSERT_TRUE(reducer.ok());
  const bool allgather = config.compressor == Compressor::kTopK ||
                         (config.compressor == Compressor::kGTopK && GetParam().nodes == 3);
  EXPECT_EQ((*reducer)->ReducesInPlace(), allgather && config.ErrorFeedback());
}

INSTANTIATE_TEST_SUITE_P(
    Compressors, SparseReducerTest,
    ::testing::Values(Case{Compressor::kTopK, 1}, Case{Compressor::kTopK, 3},
                      Case{Compressor::kTopK, 4, ValueDType::kFloat16},
                      Case{Compressor::kTopK, 2, ValueDType::kFloat32, sparsync::IndexCoding::kRaw32},
                      Case{Compressor::kRandomK, 3}, Case{Compressor::kThreshold, 2},
                      Case{Compressor::kGaussianK, 3}, Case{Compressor::kWangni, 3},
                      Case{Compressor::kDgc, 2}, Case{Compressor::kGTopK, 4},
                      Case{Compressor::kGTopK, 3} /* falls back to allgather */),
    Name);

// Runs `steps` reductions of one gradient per node (node r's is grad(r, step)) on `nodes` threads
// over the loopback transport, averaging (divisor = nodes); returns node 0's result per step and
// leaves the reducers in *reducers.
std::vector<std::vector<float>> RunSteps(const Config& config, int nodes, int steps,
                                         const std::function<std::vector<float>(int, int)>& grad,
                                         std::vector<std::unique_ptr<SparseReducer>>* reducers) {
  auto hub = std::make_shared<transport::LoopbackHub>(nodes);
  std::vector<std::unique_ptr<transport::LoopbackTransport>> transports;
  reducers->resize(nodes);
  for (int r = 0; r < nodes; ++r) {
    transports.push_back(std::make_unique<transport::LoopbackTransport>(hub, r));
    auto created = SparseReducer::Create(config, r, nodes, transports[r].get());
    EXPECT_TRUE(created.ok()) << created.status().ToString();
    if (!created.ok()) return {};
    (*reducers)[r] = std::move(*created);
  }
  std::vector<std::vector<float>> results;
  std::vector<Status> errors(nodes);
  std::vector<std::thread> threads;
  for (int r = 0; r < nodes; ++r) {
    threads.emplace_back([&, r] {
      uint32_t tag = 0;
      for (int step = 1; step <= steps; ++step) {
        std::vector<float> g = grad(r, step);
        errors[r] = (*reducers)[r]->Reduce(kSlices, g, step, 7, nodes, &tag);
        if (!errors[r].ok()) {
          hub->Abort(errors[r]);
          return;
        }
        if (r == 0) results.push_back(std::move(g));
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < nodes; ++r) EXPECT_TRUE(errors[r].ok()) << errors[r].ToString();
  return results;
}

// Without error feedback, random-k sends x_i * d/k (docs/algorithms.md §7.3): the mean over steps
// of the averaged result approaches the nodes' mean gradient, as Wangni's does. 4 nodes, each
// with its own fixed heavy-tailed gradient, rho = 0.05, 300 steps (fresh indices every step).
// The relative error of the mean, ||mean - g|| / ||g||, is sqrt((d/k - 1) / T) = 0.25 in
// expectation for uniform sampling (it sends the same k coordinates of every node); the component
// along g is what bias would move: 1 when unbiased, rho = 0.05 for the unscaled form.
TEST(SparseReducerUnbiasedTest, MeanOverStepsApproachesTheMeanGradient) {
  constexpr int kNodes = 4, kTrials = 300;
  auto fixed = [](int node, int /*step*/) { return Gradient(node, 1); };
  std::vector<double> truth(kNumel, 0.0);
  for (int r = 0; r < kNodes; ++r) {
    const std::vector<float> g = Gradient(r, 1);
    for (size_t i = 0; i < kNumel; ++i) truth[i] += g[i] / kNodes;
  }
  double t2 = 0, t4 = 0;
  for (double v : truth) t2 += v * v, t4 += v * v * v * v;
  struct Measured {
    double along, relative_error;
  };
  auto measure = [&](Compressor compressor, int error_feedback) {
    Config c;
    c.compressor = compressor;
    c.density = 0.05;
    c.error_feedback = error_feedback;
    c.seed = 11;
    std::vector<std::unique_ptr<SparseReducer>> reducers;
    const auto results = RunSteps(c, kNodes, kTrials, fixed, &reducers);
    EXPECT_EQ(results.size(), static_cast<size_t>(kTrials));
    std::vector<double> mean(kNumel, 0.0);
    for (const auto& step : results) {
      for (size_t i = 0; i < kNumel; ++i) mean[i] += step[i] / kTrials;
    }
    double dot = 0, err2 = 0;
    for (size_t i = 0; i < kNumel; ++i) {
      dot += mean[i] * truth[i];
      err2 += (mean[i] - truth[i]) * (mean[i] - truth[i]);
    }
    return Measured{dot / t2, std::sqrt(err2 / t2)};
  };
  const double d_over_k = 4000.0 / 200.0;
  const Measured randomk = measure(Compressor::kRandomK, 0);
  // Along g: sd sqrt((d/k - 1) / T * sum g^4) / ||g||^2; allowed 4 sd, and never above 0.2.
  const double along_sd = std::sqrt((d_over_k - 1) / kTrials * t4) / t2;
  EXPECT_NEAR(randomk.along, 1.0, std::min(0.2, 4 * along_sd)) << "sd " << along_sd;
  const double expected = std::sqrt((d_over_k - 1) / kTrials);
  EXPECT_NEAR(randomk.relative_error, expected, 0.25 * expected);
  const Measured wangni = measure(Compressor::kWangni, -1);  // error feedback off by default
  EXPECT_NEAR(wangni.along, 1.0, 0.2);
  EXPECT_LE(wangni.relative_error, 0.2);
  // The unscaled form is the one with error feedback: its residual delivers the rest later.
  EXPECT_NEAR(measure(Compressor::kRandomK, 1).along, 1.0, 0.2)
      << "with error feedback the residual delivers what the unscaled values leave";
  std::cout << "relative error of the mean over " << kTrials << " steps: randomk " << std::fixed
            << std::setprecision(3) << randomk.relative_error << " (expected " << expected
            << "), along g " << randomk.along << "; wangni " << wangni.relative_error
            << ", along g " << wangni.along << "\n";
}

// With error feedback random-k sends the unscaled values, as before the unbiased form existed:
// each step's result is, at the k shared indices, the rank-order float32 sum of every node's
// g + residual, and each residual keeps the rest. An oracle rebuilds both from the support.
TEST(SparseReducerUnbiasedTest, WithErrorFeedbackRandomKSendsTheUnscaledSums) {
  constexpr int kNodes = 3, kSteps = 12;
  Config c;
  c.compressor = Compressor::kRandomK;
  c.density = 0.01;
  c.seed = 5;
  ASSERT_TRUE(c.ErrorFeedback());
  std::vector<std::unique_ptr<SparseReducer>> reducers;
  auto nodes_gradient = [](int node, int step) { return Gradient(node, step); };
  // RunSteps averages: the oracle divides as the reducer does.
  const auto results = RunSteps(c, kNodes, kSteps, nodes_gradient, &reducers);
  ASSERT_EQ(results.size(), static_cast<size_t>(kSteps));
  std::vector<std::vector<float>> residual(kNodes, std::vector<float>(kNumel, 0.0f));
  const size_t k = static_cast<size_t>(kernels::SelectedCount(kNumel, 0.01));
  for (int step = 1; step <= kSteps; ++step) {
    std::vector<std::vector<float>> a(kNodes);
    for (int r = 0; r < kNodes; ++r) {
      a[r] = Gradient(r, step);
      for (size_t i = 0; i < kNumel; ++i) a[r][i] += residual[r][i];
    }
    const std::vector<float>& got = results[step - 1];
    size_t sent = 0;
    for (size_t i = 0; i < kNumel; ++i) {
      if (got[i] == 0.0f) continue;
      ++sent;
      float sum = a[0][i];
      for (int r = 1; r < kNodes; ++r) sum += a[r][i];
      ASSERT_EQ(got[i], sum / static_cast<float>(kNodes)) << "step " << step << " index " << i;
      for (int r = 0; r < kNodes; ++r) a[r][i] = 0.0f;
    }
    ASSERT_EQ(sent, k) << "step " << step;
    residual = std::move(a);
  }
  for (int r = 0; r < kNodes; ++r) {
    for (const auto& slice : kSlices) {
      const auto kept = reducers[r]->state().Get(TensorState::Kind::kResidual, *slice.name);
      ASSERT_EQ(kept.size(), slice.count);
      for (size_t i = 0; i < slice.count; ++i) {
        ASSERT_EQ(kept[i], residual[r][slice.offset + i]) << *slice.name << "[" << i << "]";
      }
    }
  }
}

TEST(SparseReducerForgetTest, ATensorThatIsGoneLeavesNothingBehind) {
  for (Compressor compressor : {Compressor::kTopK, Compressor::kDgc}) {
    Config c;
    c.compressor = compressor;
    c.error_feedback = 1;
    auto hub = std::make_shared<transport::LoopbackHub>(1);
    transport::LoopbackTransport t(hub, 0);
    TensorState state;  // the node's store, which forgets for every reducer
    auto reducer = SparseReducer::Create(c, 0, 1, &t, &state);
    ASSERT_TRUE(reducer.ok());
    std::vector<float> g = Gradient(0, 1);
    uint32_t tag = 0;
    ASSERT_TRUE((*reducer)->Reduce(kSlices, g, 1, 1, 1.0, &tag).ok());
    const size_t kept = (*reducer)->state().bytes();
    ASSERT_GT(kept, 0u) << CompressorName(compressor);
    state.Forget(kA);
    // Only layer.bias's vectors (one per kind kept) are left.
    const size_t kinds = kept / (kNumel * sizeof(float));
    EXPECT_EQ((*reducer)->state().bytes(), kinds * 1000 * sizeof(float))
        << CompressorName(compressor);
    state.Forget(kB);
    EXPECT_EQ((*reducer)->state().bytes(), 0u) << CompressorName(compressor);
  }
}

// SPARSYNC_DENSITY_WARMUP_STEPS: a tensor's steps 0..W-1 take DGC's densities a quarter each,
// then the target; a registered density is the target and the floor; the reducers of the
// schedule share the node's state, so nothing kept in warm-up is lost when the density drops.
TEST(SparseReducersWarmupTest, DensityFollowsTheScheduleAndResidualsCarryOver) {
  Config c;
  c.compressor = Compressor::kTopK;
  c.density = 0.001;
  c.density_warmup_steps = 8;
  auto hub = std::make_shared<transport::LoopbackHub>(1);
  transport::LoopbackTransport t(hub, 0);
  SparseReducers reducers(c, 0, 1, &t);
  const int64_t expected[] = {25000, 25000, 6250, 6250, 1560, 1560, 400, 400, 100, 100};
  for (uint64_t step = 0; step < 10; ++step) {
    auto r = reducers.For(std::nullopt, 0, step);
    ASSERT_TRUE(r.ok() && *r != nullptr);
    EXPECT_EQ((*r)->SelectedCount(100000), expected[step]) << "step " << step;
  }
  auto registered = reducers.For(std::nullopt, 0.03125f, 6);  // 0.004 < 2^-5: the tensor's own
  ASSERT_TRUE(registered.ok());
  EXPECT_EQ((*registered)->SelectedCount(100000), 3125);
  auto none = reducers.For(Compressor::kNone, 0, 0);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, nullptr);

  // Two steps, one in warm-up (density 0.25: 1000 of 4000 sent) and one after (4 sent): what was
  // sent plus the residual is both gradients.
  std::vector<double> gradients(kNumel, 0.0), accounted(kNumel, 0.0);
  uint32_t tag = 0;
  const uint64_t steps[] = {0, 8};
  for (int i = 0; i < 2; ++i) {
    auto r = reducers.For(std::nullopt, 0, steps[i]);
    ASSERT_TRUE(r.ok());
    std::vector<float> g = Gradient(0, i + 1);
    for (size_t j = 0; j < kNumel; ++j) gradients[j] += g[j];
    ASSERT_TRUE((*r)->Reduce(kSlices, g, steps[i] + 1, 3, 1.0, &tag).ok());
    const auto sent = std::count_if(g.begin(), g.end(), [](float x) { return x != 0.0f; });
    EXPECT_EQ(sent, i == 0 ? 1000 : 4) << "step " << steps[i];
    for (size_t j = 0; j < kNumel; ++j) accounted[j] += g[j];
  }
  for (const auto& slice : kSlices) {
    auto residual = reducers.state().Get(TensorState::Kind::kResidual, *slice.name);
    ASSERT_EQ(residual.size(), slice.count);
    for (size_t j = 0; j < slice.count; ++j) accounted[slice.offset + j] += residual[j];
  }
  double worst = 0;
  for (size_t j = 0; j < kNumel; ++j) worst = std::max(worst, std::abs(accounted[j] - gradients[j]));
  EXPECT_LT(worst, 1e-5) << "the warm-up's residual was lost when the density dropped";
}

TEST(SparseReducerNonFiniteTest, ErrorNamesTheTensorAndNode) {
  Config c;
  c.compressor = Compressor::kTopK;
  auto hub = std::make_shared<transport::LoopbackHub>(1);
  transport::LoopbackTransport t(hub, 0);
  auto reducer = SparseReducer::Create(c, 0, 1, &t);
  ASSERT_TRUE(reducer.ok());
  std::vector<float> g(kNumel, 1.0f);
  g[3500] = NAN;
  uint32_t tag = 0;
  Status st = (*reducer)->Reduce(kSlices, g, 1, 1, 1.0, &tag);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("layer.bias"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("node 0"), std::string::npos) << st.message();
}

// SPARSYNC_EMULATE_SELECT_COST pads a selection to C * n * log2 n seconds and changes nothing
// else: the same selection, the same payload.
TEST(SparseReducerEmulatedCostTest, ASelectionLastsTheModelledTimeAndSelectsTheSame) {
  constexpr double kModelled = 0.25;  // seconds, far above what 4000 elements take
  auto prepare = [&](double cost, PreparedGroup* prepared) {
    Config c;
    c.compressor = Compressor::kTopK;
    c.density = 0.01;
    c.emulated_select_cost = cost;
    auto hub = std::make_shared<transport::LoopbackHub>(1);
    transport::LoopbackTransport t(hub, 0);
    auto reducer = SparseReducer::Create(c, 0, 1, &t);
    EXPECT_TRUE(reducer.ok());
    const std::vector<float> g = Gradient(0, 1);
    const auto start = std::chrono::steady_clock::now();
    Status st = (*reducer)->Prepare(kSlices, g, 1, 1, prepared);
    EXPECT_TRUE(st.ok()) << st.message();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  PreparedGroup plain, padded;
  const double n = static_cast<double>(kNumel);
  const double plain_s = prepare(0, &plain);
  const double padded_s = prepare(kModelled / (n * std::log2(n)), &padded);
  EXPECT_GE(padded_s, kModelled);
  EXPECT_LT(plain_s, kModelled);
  EXPECT_EQ(padded.indices, plain.indices);
  EXPECT_EQ(padded.values, plain.values);
  ASSERT_EQ(padded.payload_bytes, plain.payload_bytes);
  EXPECT_TRUE(std::equal(padded.payload.begin(), padded.payload.begin() + padded.payload_bytes,
                         plain.payload.begin()));
}

// The in-place reduction writes a residual outside the state's lock between OpenResidual and
// CloseResidual; a metrics scrape meanwhile must not read it (a data race), and counts it with
// what the last scrape that found it closed saw.
TEST(TensorStateTest, AnOpenResidualCountsInTheNormWithItsLastClosedValue) {
  TensorState state;
  bool fresh = false;
  std::span<float> r = state.OpenResidual(kA, 2, &fresh).value();
  EXPECT_TRUE(fresh);
  r[0] = 3.0f;
  EXPECT_EQ(state.HostResidualNorm(), 0.0) << "never seen closed";
  state.CloseResidual(kA);
  EXPECT_EQ(state.HostResidualNorm(), 3.0);
  r = state.OpenResidual(kA, 2, &fresh).value();
  EXPECT_FALSE(fresh);
  EXPECT_EQ(r[0], 3.0f) << "the same residual, kept";
  r[1] = 4.0f;
  EXPECT_EQ(state.HostResidualNorm(), 3.0);
  state.CloseResidual(kA);
  EXPECT_EQ(state.HostResidualNorm(), 5.0);
  EXPECT_TRUE(state.OpenResidual(kA, 3, &fresh).value()[0] == 0.0f && fresh)
      << "another size: a fresh residual";
  state.CloseResidual(kA);
}

class SparseReducerSkipTest : public ::testing::TestWithParam<bool> {};

TEST_P(SparseReducerSkipTest, SkipDropsTheGroupOnEveryNodeAndKeepsTheFiniteResiduals) {
  const bool in_place = GetParam();
  Config c;
  c.compressor = Compressor::kTopK;
  c.nonfinite = NonFinitePolicy::kSkip;
  auto hub = std::make_shared<transport::LoopbackHub>(2);
  std::vector<std::vector<float>> out(2);
  std::vector<std::unique_ptr<SparseReducer>> reducers(2);
  std::vector<std::unique_ptr<transport::LoopbackTransport>> ts;
  for (int r = 0; r < 2; ++r) {
    ts.push_back(std::make_unique<transport::LoopbackTransport>(hub, r));
    reducers[r] = SparseReducer::Create(c, r, 2, ts[r].get()).value();
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      std::vector<float> g(kNumel, 0.5f);
      if (r == 1) g[10] = INFINITY;
      uint32_t tag = 0;
      if (in_place) {
        PreparedGroup p;
        const std::vector<std::span<float>> a = {std::span(g).first(3000)},
                                            b = {std::span(g).subspan(3000)};
        const std::vector<LocalBuffers> inputs = {a, b};
        ASSERT_TRUE(reducers[r]->PrepareInPlace(kSlices, inputs, 1, 1, &p).ok());
        ASSERT_TRUE(reducers[r]->ExchangeInPlace(kSlices, p, inputs, 2.0, &tag).ok());
      } else {
        ASSERT_TRUE(reducers[r]->Reduce(kSlices, g, 1, 1, 2.0, &tag).ok());
      }
      out[r] = g;
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    for (float x : out[r]) ASSERT_EQ(x, 0.0f);
  }
  auto kept = reducers[0]->state().Get(TensorState::Kind::kResidual, kA);
  ASSERT_EQ(kept.size(), 3000u);
  EXPECT_EQ(kept[0], 0.5f) << "the finite node keeps its whole gradient for later";
  EXPECT_TRUE(reducers[1]->state().Get(TensorState::Kind::kResidual, kA).empty())
      << "the node whose group was not finite keeps nothing of it";
}

INSTANTIATE_TEST_SUITE_P(WorkBufferAndInPlace, SparseReducerSkipTest, ::testing::Bool());

}  // namespace
}  // namespace sparsync::pipeline
