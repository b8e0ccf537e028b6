#include "daemon/observe/metrics.h"

#include <gtest/gtest.h>

#include <set>
#include <sstream>

namespace sparsync::observe {
namespace {

// A transport that "sends" what the test says, to drive the byte counts.
class ScriptedTransport : public transport::Transport {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  Status AllReduceSum(void*, size_t, transport::ElementType, uint32_t) override {
    return Status::Ok();
  }
  Status AllGatherV(const void*, size_t, void*, std::span<const size_t>, uint32_t) override {
    return Status::Ok();
  }
  Status Broadcast(void*, size_t, int, uint32_t) override { return Status::Ok(); }
  Status SendRecv(int, const void*, size_t send_bytes, void*, size_t, size_t* recv_bytes,
                  uint32_t) override {
    *recv_bytes = received;
    return Status::Ok();
  }
  void Abort(const Status&) override {}
  size_t received = 0;
};

// The value of the sample `series` (name and labels as written) in an exposition, or -1.
double Value(const std::string& text, const std::string& series) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  }
  return -1;
}

struct Fixture {
  ScriptedTransport inner;
  CountingTransport counting{&inner};
  Metrics metrics{1, 2};
  std::string name = "w";
  TensorView tensor{&name, 0};

  Fixture() { metrics.CountBytesOf(&counting); }

  // One group whose exchange moves `sent` and `received` bytes, stage times in ms from `t0`.
  void Group(bool sparse, uint64_t step, int64_t t0_ms, size_t sent, size_t received,
             CollectiveOp op = CollectiveOp::kGradient) {
    const int64_t ms = 1000000, t0 = t0_ms * ms;
    tensor.ready_ns = t0;
    GroupView g;
    g.op = op;
    g.sparse = sparse;
    g.step = step;
    g.elements = 1000;
    g.dense_bytes = 4000;
    g.tensors = {&tensor, 1};
    g.received_ns = t0 + ms;
    g.prepare_begin_ns = t0 + 2 * ms;
    g.prepare_end_ns = t0 + 4 * ms;  // 2 ms
    g.exchange_begin_ns = t0 + 5 * ms;
    metrics.OnExchange(g);
    inner.received = received;
    size_t got = 0;
    ASSERT_TRUE(counting.SendRecv(1, nullptr, sent, nullptr, 0, &got, 0).ok());
    g.exchange_end_ns = t0 + 8 * ms;  // 3 ms
    g.deliver_end_ns = t0 + 10 * ms;
    metrics.OnGroup(g);
  }
};

TEST(MetricsTest, CountsGroupsBytesAndSavingsByEncoding) {
  Fixture f;
  f.Group(/*sparse=*/true, 1, 0, 300, 500);
  f.Group(/*sparse=*/false, 1, 20, 4000, 4000);
  f.Group(/*sparse=*/true, 2, 100, 200, 100);
  f.Group(false, 2, 120, 64, 64, CollectiveOp::kBroadcast);
  const std::string text = f.metrics.Render();
  EXPECT_EQ(Value(text, "sparsync_node_info{node=\"1\",num_nodes=\"2\"}"), 1);
  EXPECT_EQ(Value(text, "sparsync_groups_total{op=\"gradient\",encoding=\"sparse\"}"), 2);
  EXPECT_EQ(Value(text, "sparsync_groups_total{op=\"gradient\",encoding=\"dense\"}"), 1);
  EXPECT_EQ(Value(text, "sparsync_groups_total{op=\"broadcast\",encoding=\"dense\"}"), 1);
  EXPECT_EQ(Value(text, "sparsync_sent_bytes_total{encoding=\"sparse\"}"), 500);
  EXPECT_EQ(Value(text, "sparsync_received_bytes_total{encoding=\"sparse\"}"), 600);
  EXPECT_EQ(Value(text, "sparsync_sent_bytes_total{encoding=\"dense\"}"), 4064);
  EXPECT_EQ(Value(text, "sparsync_received_bytes_total{encoding=\"dense\"}"), 4064);
  // Each sparse group: 4000 dense bytes, 300 and 200 sent.
  EXPECT_EQ(Value(text, "sparsync_compression_saved_bytes_total"), 3700 + 3800);
  EXPECT_EQ(Value(text, "sparsync_steps_total"), 2);
  EXPECT_EQ(Value(text, "sparsync_sparsify_seconds_count"), 2);
  EXPECT_NEAR(Value(text, "sparsync_sparsify_seconds_sum"), 0.004, 1e-12);
  EXPECT_EQ(Value(text, "sparsync_sparsify_seconds_bucket{le=\"0.001\"}"), 0);
  EXPECT_EQ(Value(text, "sparsync_sparsify_seconds_bucket{le=\"0.0025\"}"), 2);
  EXPECT_EQ(Value(text, "sparsync_exchange_seconds_count{encoding=\"dense\"}"), 2);
  EXPECT_NEAR(Value(text, "sparsync_exchange_seconds_sum{encoding=\"sparse\"}"), 0.006, 1e-12);
  // No sources set: those metrics are left out rather than made up.
  EXPECT_EQ(text.find("sparsync_connected_workers"), std::string::npos);
  EXPECT_EQ(text.find("sparsync_residual_norm"), std::string::npos);
}

// The iteration time of a step runs from its first gradient ready to its last gradient group
// delivered; it is known once the next step's first group is done.
TEST(MetricsTest, MeasuresTheLastCompleteStepAndShowsThePlansPrediction) {
  Fixture f;
  f.metrics.OnPlan({3, 10, "omgs", 2, 0.025, ""});
  f.Group(true, 5, 1000, 1, 1);  // ready at 1000 ms
  f.Group(true, 5, 1030, 1, 1);  // delivered at 1040 ms
  std::string text = f.metrics.Render();
  EXPECT_EQ(Value(text, "sparsync_iteration_seconds"), 0) << "step 5 is not over yet";
  EXPECT_EQ(Value(text, "sparsync_plan_version"), 3);
  EXPECT_EQ(Value(text, "sparsync_plan_predicted_iteration_seconds"), 0.025);
  f.Group(true, 6, 1100, 1, 1);
  text = f.metrics.Render();
  EXPECT_NEAR(Value(text, "sparsync_iteration_seconds"), 0.040, 1e-12);
}

TEST(MetricsTest, ReadsItsSourcesAtTheScrapeAndCountsIncidents) {
  Fixture f;
  int workers = 2;
  f.metrics.SetSources({[&] { return workers; }, [] { return 1.5; }});
  f.metrics.OnIncident(Incident::kStall, "x");
  f.metrics.OnIncident(Incident::kStall, "y");
  f.metrics.OnIncident(Incident::kFailure, "z");
  f.metrics.OnIncident(Incident::kPlannerNote, "plan v1");
  std::string text = f.metrics.Render();
  EXPECT_EQ(Value(text, "sparsync_connected_workers"), 2);
  EXPECT_EQ(Value(text, "sparsync_residual_norm"), 1.5);
  EXPECT_EQ(Value(text, "sparsync_stalls_total"), 2);
  EXPECT_EQ(Value(text, "sparsync_failures_total"), 1);
  workers = 1;
  EXPECT_EQ(Value(f.metrics.Render(), "sparsync_connected_workers"), 1);
  // Every family is declared once, with HELP before TYPE before its samples.
  std::istringstream lines(text);
  std::set<std::string> declared;
  std::string last_help;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("# HELP ", 0) == 0) {
      last_help = line.substr(7, line.find(' ', 7) - 7);
      EXPECT_TRUE(declared.insert(last_help).second) << last_help;
    } else if (line.rfind("# TYPE ", 0) == 0) {
      EXPECT_EQ(line.substr(7, line.find(' ', 7) - 7), last_help);
    } else {
      EXPECT_EQ(line.rfind(last_help, 0), 0u) << line;
    }
  }
  EXPECT_GE(declared.size(), 15u);
}

}  // namespace
}  // namespace sparsync::observe
