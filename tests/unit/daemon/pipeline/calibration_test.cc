// Start-up calibration of the cost model with nodes as threads over the loopback transport: every
// node ends with the same model, and with a fake clock that only a fake network advances, the
// fitted exchange line is exactly the injected one.
#include "daemon/pipeline/calibration.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <thread>

#include "daemon/transport/loopback/loopback_transport.h"

namespace sparsync::pipeline {
namespace {

// A network whose every call costs alpha + beta * bytes on this node's fake clock (bytes: what
// the call moves through this node: the buffer of an allreduce, all of an allgatherv's output),
// counting only the bytes beyond `free_bytes` (a latency-bound start, as on a slow link).
class SlowNetwork : public transport::Transport {
 public:
  SlowNetwork(transport::Transport* inner, double alpha, double beta, size_t free_bytes = 0)
      : inner_(inner), alpha_(alpha), beta_(beta), free_bytes_(free_bytes) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  Status AllReduceSum(void* data, size_t count, transport::ElementType type,
                      uint32_t tag) override {
    Charge(count * transport::ElementSize(type));
    return inner_->AllReduceSum(data, count, type, tag);
  }
  Status AllGatherV(const void* send, size_t send_bytes, void* recv,
                    std::span<const size_t> recv_bytes, uint32_t tag) override {
    size_t total = 0;
    for (size_t b : recv_bytes) total += b;
    Charge(total);
    return inner_->AllGatherV(send, send_bytes, recv, recv_bytes, tag);
  }
  Status Broadcast(void* data, size_t bytes, int root, uint32_t tag) override {
    Charge(bytes);
    return inner_->Broadcast(data, bytes, root, tag);
  }
  Status SendRecv(int peer, const void* send, size_t send_bytes, void* recv, size_t recv_capacity,
                  size_t* recv_bytes, uint32_t tag) override {
    Charge(send_bytes);
    return inner_->SendRecv(peer, send, send_bytes, recv, recv_capacity, recv_bytes, tag);
  }
  void Abort(const Status& reason) override { inner_->Abort(reason); }

  double now() const { return now_; }

 private:
  void Charge(size_t bytes) {
    now_ += alpha_ + beta_ * static_cast<double>(bytes > free_bytes_ ? bytes - free_bytes_ : 0);
  }
  transport::Transport* inner_;
  const double alpha_, beta_;
  const size_t free_bytes_;
  double now_ = 1000.0;  // only this node's thread reads and advances it
};

struct Outcome {
  std::vector<Result<planning::CostModel>> models;
};

// Calibrates on `nodes` nodes; with `alpha` >= 0 through SlowNetwork and its fake clock.
Outcome Calibrate(int nodes, const Config& config, CalibrationOptions options, double alpha = -1,
                  double beta = 0, size_t free_bytes = 0) {
  auto hub = std::make_shared<transport::LoopbackHub>(nodes, std::chrono::seconds(30));
  Outcome out;
  out.models.assign(nodes, Result<planning::CostModel>(Internal("not run")));
  std::vector<std::thread> threads;
  for (int r = 0; r < nodes; ++r) {
    threads.emplace_back([&, r, options]() mutable {
      transport::LoopbackTransport loopback(hub, r);
      transport::Transport* t = &loopback;
      std::unique_ptr<SlowNetwork> slow;
      if (alpha >= 0) {
        slow = std::make_unique<SlowNetwork>(&loopback, alpha, beta, free_bytes);
        SlowNetwork* s = slow.get();
        options.clock = [s] { return s->now(); };
        t = s;
      }
      out.models[r] = CalibrateCostModel(config, World{r, nodes, 1}, t, options);
      if (!out.models[r].ok()) hub->Abort(out.models[r].status());
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

Config WithCompressor(Compressor c) {
  Config config;
  config.compressor = c;
  config.density = 1.0 / 64;
  config.index_coding = IndexCoding::kRaw32;  // payload bytes exactly linear in k
  return config;
}

CalibrationOptions Quick() {
  CalibrationOptions o;
  o.sizes = {1 << 12, 1 << 14, 1 << 16};
  o.warmup = 1;
  o.reps = 3;
  return o;
}

class CalibrationTest : public ::testing::TestWithParam<std::tuple<Compressor, int>> {};

TEST_P(CalibrationTest, EveryNodeGetsTheSameNonNegativeModel) {
  const auto [compressor, nodes] = GetParam();
  Outcome out = Calibrate(nodes, WithCompressor(compressor), Quick());
  for (int r = 0; r < nodes; ++r) {
    ASSERT_TRUE(out.models[r].ok()) << out.models[r].status().ToString();
    EXPECT_EQ(*out.models[r], *out.models[0]) << "node " << r << ": " << out.models[r]->ToString();
  }
  const planning::CostModel& m = *out.models[0];
  for (double c : {m.sparsify.fixed_s, m.sparsify.per_element_s, m.exchange.fixed_s,
                   m.exchange.per_element_s}) {
    EXPECT_TRUE(std::isfinite(c));
    EXPECT_GE(c, 0.0);
  }
  if (compressor == Compressor::kNone) {
    EXPECT_EQ(m.sparsify, planning::LinearCost{}) << "dense reduction has no sparsification";
  }
  EXPECT_GT(m.ExchangeTime(1 << 16), 0.0);
}

INSTANTIATE_TEST_SUITE_P(Compressors, CalibrationTest,
                         ::testing::Combine(::testing::Values(Compressor::kNone, Compressor::kTopK,
                                                              Compressor::kRandomK,
                                                              Compressor::kGTopK, Compressor::kDgc),
                                            ::testing::Values(1, 3, 4)),
                         [](const auto& info) {
                           return std::string(CompressorName(std::get<0>(info.param))) + "_" +
                                  std::to_string(std::get<1>(info.param)) + "nodes";
                         });

// compressor=none: one allreduce of x floats per exchange, so t_c(x) = alpha + 4 beta x.
TEST(CalibrationFitTest, DenseExchangeMatchesTheInjectedNetwork) {
  const double alpha = 2e-3, beta = 8e-9;  // 1 Gb/s
  Outcome out = Calibrate(3, WithCompressor(Compressor::kNone), Quick(), alpha, beta);
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(out.models[r].ok()) << out.models[r].status().ToString();
    EXPECT_EQ(*out.models[r], *out.models[0]);
  }
  const planning::CostModel& m = *out.models[0];
  EXPECT_NEAR(m.exchange.fixed_s, alpha, 1e-9);
  EXPECT_NEAR(m.exchange.per_element_s, 4 * beta, 1e-6 * 4 * beta);
  EXPECT_EQ(m.sparsify, planning::LinearCost{});
}

// top-k with raw indices and float32 values: two allgathers (size records, then P payloads of a
// fixed header plus 8 bytes per selected element, k = x / 64), so t_c grows by 8 P beta / 64 per
// element.
TEST(CalibrationFitTest, SparseExchangeGrowsWithTheSelection) {
  const int nodes = 3;
  const double alpha = 1e-3, beta = 8e-9;
  Outcome out = Calibrate(nodes, WithCompressor(Compressor::kTopK), Quick(), alpha, beta);
  for (int r = 0; r < nodes; ++r) {
    ASSERT_TRUE(out.models[r].ok()) << out.models[r].status().ToString();
    EXPECT_EQ(*out.models[r], *out.models[0]);
  }
  const planning::CostModel& m = *out.models[0];
  const double per_element = 8.0 * nodes * beta / 64;
  EXPECT_NEAR(m.exchange.per_element_s, per_element, 1e-6 * per_element);
  EXPECT_GE(m.exchange.fixed_s, 2 * alpha);         // two collectives per exchange
  EXPECT_LT(m.exchange.fixed_s, 2 * alpha + 1e-5);  // plus the size records and headers
  EXPECT_GT(m.ExchangeTime(1 << 20), m.ExchangeTime(1 << 12));
}

// Node 0's budget decides for everyone: with no budget, two sizes are measured and every node
// stops there together (otherwise the nodes' collectives would not match and this would fail).
TEST(CalibrationFitTest, BudgetStopsEveryNodeAtTheSameSize) {
  CalibrationOptions o = Quick();
  o.sizes = {1 << 10, 1 << 11, 1 << 12, 1 << 13, 1 << 14};
  o.budget_s = 0;
  const double alpha = 1e-3, beta = 8e-9;
  Outcome out = Calibrate(3, WithCompressor(Compressor::kNone), o, alpha, beta);
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(out.models[r].ok()) << out.models[r].status().ToString();
    EXPECT_EQ(*out.models[r], *out.models[0]);
  }
  // Two sizes still give the exact line.
  EXPECT_NEAR(out.models[0]->exchange.per_element_s, 4 * beta, 1e-6 * 4 * beta);
}

// A compressing job on a slow network (issue 15's dilated cluster): the sparse sizes spend the
// budget, and the two smallest dense sizes, latency-bound, would give a dense line that does not
// grow, which would send every group dense. The dense line has a budget of its own and reaches
// the sizes where bandwidth shows.
TEST(CalibrationFitTest, ACompressingJobsDenseLineHasABudgetOfItsOwn) {
  CalibrationOptions o = Quick();
  o.sizes = {1 << 10, 1 << 12, 1 << 14, 1 << 16};
  o.dense_too = true;
  o.budget_s = 0.05;  // the sparse sizes take ~30 ms each on this network
  const double alpha = 1e-3, beta = 8e-9;
  Outcome out = Calibrate(3, WithCompressor(Compressor::kTopK), o, alpha, beta, 16 << 10);
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(out.models[r].ok()) << out.models[r].status().ToString();
    EXPECT_EQ(*out.models[r], *out.models[0]);
  }
  const planning::CostModel& m = *out.models[0];
  ASSERT_TRUE(m.knows_dense()) << m.ToString();
  EXPECT_GT(m.dense_exchange.per_element_s, 0.0) << m.ToString();
  EXPECT_NEAR(m.dense_exchange.per_element_s, 4 * beta, 0.1 * 4 * beta) << m.ToString();
}

// A dense allreduce that does not grow with size is not a line to plan with.
TEST(CalibrationFitTest, AFlatDenseLineIsNotKnown) {
  CalibrationOptions o = Quick();
  o.dense_too = true;
  Outcome out = Calibrate(3, WithCompressor(Compressor::kTopK), o, 1e-3, 0.0);
  ASSERT_TRUE(out.models[0].ok()) << out.models[0].status().ToString();
  EXPECT_FALSE(out.models[0]->knows_dense()) << out.models[0]->ToString();
  EXPECT_EQ(*out.models[1], *out.models[0]);
}

// A selection that grows as x log2 x (SPARSYNC_EMULATE_SELECT_COST pads the real top-k to it,
// as the emulated cluster does to model a GPU) is fitted in that shape, on every node; the real
// clock times it. The pad is large beside the CPU's own work around the selection (under
// ThreadSanitizer, a pad of 2e-8 at 256 K elements came out 16 % higher).
TEST(CalibrationFitTest, ASortLikeSelectionIsFittedAsXLogX) {
  Config config = WithCompressor(Compressor::kTopK);
  config.emulated_select_cost = 1e-7;  // 1 ms at 1 K elements, 105 ms at 64 K
  CalibrationOptions o = Quick();
  o.sizes = {1 << 10, 1 << 12, 1 << 14, 1 << 16};
  Outcome out = Calibrate(2, config, o);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(out.models[r].ok()) << out.models[r].status().ToString();
    EXPECT_EQ(*out.models[r], *out.models[0]);
  }
  const planning::LinearCost& s = out.models[0]->sparsify;
  EXPECT_TRUE(s.x_log_x) << s.ToString();
  EXPECT_NEAR(s.per_element_s, 1e-7, 0.1 * 1e-7) << s.ToString();
}

TEST(CalibrationFitTest, SizesAreCapped) {
  CalibrationOptions o = Quick();
  o.sizes = {1 << 12, 1 << 30};
  o.max_dense_elements = 1 << 13;
  Outcome out = Calibrate(1, WithCompressor(Compressor::kNone), o, 1e-3, 1e-9);
  ASSERT_TRUE(out.models[0].ok()) << out.models[0].status().ToString();
  EXPECT_NEAR(out.models[0]->exchange.per_element_s, 4e-9, 1e-12);
}

}  // namespace
}  // namespace sparsync::pipeline
