// A plan change regroups the tensors: residuals belong to tensors, so nothing is lost across the
// switch. Nodes as threads over the loopback transport; three plans in a row, as the coordinator
// would switch them: {A,B}{C}, then {A}{B,C}, then {A,B,C}.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <thread>

#include "daemon/pipeline/sparse_reducer.h"
#include "daemon/transport/loopback/loopback_transport.h"

namespace sparsync::pipeline {
namespace {

const std::string kA = "a.weight", kB = "a.bias", kC = "b.weight";
const std::vector<std::pair<const std::string*, size_t>> kTensors = {{&kA, 3000}, {&kB, 1000},
                                                                     {&kC, 2000}};
constexpr int kNodes = 4;
constexpr int kStepsPerPlan = 4;
// Each plan: groups as lists of tensor indices, in backward order.
const std::vector<std::vector<std::vector<size_t>>> kPlans = {{{0, 1}, {2}}, {{0}, {1, 2}},
                                                              {{0, 1, 2}}};

std::vector<float> Gradient(int node, int step, size_t tensor) {
  std::mt19937 rng(static_cast<uint32_t>(100000 * node + 100 * step + tensor));
  std::student_t_distribution<float> heavy(2.0f);
  std::vector<float> g(kTensors[tensor].second);
  for (float& x : g) x = heavy(rng) * 0.01f;
  return g;
}

class RegroupTest : public ::testing::TestWithParam<Compressor> {};

TEST_P(RegroupTest, PlanChangesLoseNoMassAndKeepNodesIdentical) {
  Config config;
  config.compressor = GetParam();
  config.density = 0.02;
  config.seed = 3;
  ASSERT_TRUE(config.ErrorFeedback());
  auto hub = std::make_shared<transport::LoopbackHub>(kNodes);
  std::vector<std::unique_ptr<transport::LoopbackTransport>> transports;
  std::vector<std::unique_ptr<SparseReducer>> reducers(kNodes);
  for (int r = 0; r < kNodes; ++r) {
    transports.push_back(std::make_unique<transport::LoopbackTransport>(hub, r));
    auto created = SparseReducer::Create(config, r, kNodes, transports[r].get());
    ASSERT_TRUE(created.ok()) << created.status().ToString();
    reducers[r] = std::move(*created);
  }
  // results[node][tensor]: the sum over steps of the averaged update the node received.
  std::vector<std::vector<std::vector<double>>> received(kNodes);
  std::vector<Status> errors(kNodes);
  std::vector<std::thread> threads;
  for (int r = 0; r < kNodes; ++r) {
    received[r].resize(kTensors.size());
    for (size_t t = 0; t < kTensors.size(); ++t) received[r][t].assign(kTensors[t].second, 0.0);
    threads.emplace_back([&, r] {
      uint32_t tag = 0;
      int step = 0;
      for (const auto& plan : kPlans) {
        for (int s = 0; s < kStepsPerPlan; ++s, ++step) {
          for (size_t g = 0; g < plan.size(); ++g) {
            std::vector<GroupSlice> slices;
            std::vector<float> buffer;
            for (size_t t : plan[g]) {
              slices.push_back({kTensors[t].first, buffer.size(), kTensors[t].second});
              auto grad = Gradient(r, step, t);
              buffer.insert(buffer.end(), grad.begin(), grad.end());
            }
            Status st = reducers[r]->Reduce(slices, buffer, static_cast<uint64_t>(step),
                                            static_cast<uint32_t>(g), 1.0, &tag);
            if (!st.ok()) {
              errors[r] = st;
              hub->Abort(st);
              return;
            }
            for (size_t i = 0; i < slices.size(); ++i) {
              auto& sum = received[r][plan[g][i]];
              for (size_t j = 0; j < slices[i].count; ++j) sum[j] += buffer[slices[i].offset + j];
            }
          }
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kNodes; ++r) ASSERT_TRUE(errors[r].ok()) << errors[r].ToString();

  for (size_t t = 0; t < kTensors.size(); ++t) {
    const size_t n = kTensors[t].second;
    for (int r = 1; r < kNodes; ++r) {
      ASSERT_EQ(0, std::memcmp(received[r][t].data(), received[0][t].data(), n * sizeof(double)))
          << "node " << r << " tensor " << *kTensors[t].first;
    }
    // With divisor 1 a node receives the sum over nodes of what was sent; adding every node's
    // residual must give the sum of every gradient of every step.
    std::vector<double> gradients(n, 0.0), accounted = received[0][t];
    for (int r = 0; r < kNodes; ++r) {
      for (int step = 0; step < static_cast<int>(kPlans.size()) * kStepsPerPlan; ++step) {
        auto g = Gradient(r, step, t);
        for (size_t j = 0; j < n; ++j) gradients[j] += g[j];
      }
      auto residual = reducers[r]->state().Get(TensorState::Kind::kResidual, *kTensors[t].first);
      ASSERT_EQ(residual.size(), n);
      for (size_t j = 0; j < n; ++j) accounted[j] += residual[j];
    }
    double worst = 0;
    for (size_t j = 0; j < n; ++j) worst = std::max(worst, std::abs(accounted[j] - gradients[j]));
    EXPECT_LT(worst, 1e-4) << "tensor " << *kTensors[t].first << ": mass lost across plan changes";
  }
}

INSTANTIATE_TEST_SUITE_P(ErrorFeedbackCompressors, RegroupTest,
                         ::testing::Values(Compressor::kTopK, Compressor::kGTopK,
                                           Compressor::kThreshold, Compressor::kGaussianK,
                                           Compressor::kRandomK),
                         [](const ::testing::TestParamInfo<Compressor>& info) {
                           return std::string(CompressorName(info.param));
                         });

}  // namespace
}  // namespace sparsync::pipeline
