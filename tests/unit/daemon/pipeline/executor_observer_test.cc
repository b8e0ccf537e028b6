// The executor's reports: what each gradient group cost, what the observer hears of every entry,
// plan announcements skipped, a dense group's residuals flushed into the exchange.
#include <gtest/gtest.h>

#include "tests/unit/daemon/pipeline/executor_test_util.h"

namespace sparsync::pipeline {
namespace {

using namespace executor_testing;  // NOLINT: the helpers are this file's vocabulary

// One round of `entries` on a one-node job, `wait` after its tensors are posted and before the
// entries arrive: the group costs the executor reported, in order.
std::vector<GroupCost> GroupCostsOf(const std::vector<TensorSpec>& specs, ExecutorOptions options,
                                    const std::vector<ScheduleEntry>& entries,
                                    std::chrono::milliseconds wait = {}) {
  auto hub = std::make_shared<transport::LoopbackHub>(1);
  transport::LoopbackTransport loopback(hub, 0);
  std::mutex mu;
  std::vector<GroupCost> costs;
  options.on_group_cost = [&](const GroupCost& c) {
    std::lock_guard lock(mu);
    costs.push_back(c);
  };
  Node node(World{0, 1, 1}, specs, &loopback, SparseConfig(), options,
            [](const Status& st) { ADD_FAILURE() << st.ToString(); });
  node.executor().Start();
  node.Post(1);
  std::this_thread::sleep_for(wait);
  node.feed().Push(entries);
  for (const auto& d : node.ReadDones(std::chrono::seconds(10))) {
    EXPECT_EQ(d.status, SPARSYNC_OK) << d.message;
  }
  node.executor().Stop();
  std::lock_guard lock(mu);
  return costs;
}

TEST(ExecutorTest, ReportsWhatEachGradientGroupCost) {
  const std::vector<TensorSpec> specs = {
      {"a", 6000}, {"b", 2000}, {"scale", 100, SPARSYNC_OP_ALLREDUCE}, {"c", 10}};
  auto entries = Schedule({{0, 1}, {2}, {3}}, 1);
  for (auto& e : entries) e.plan_version = 7;
  // 50 ms between the tensors being ready and the entries arriving: the wait for the other
  // nodes, which is not stage A's work, so it is not in sparsify_s.
  const std::vector<GroupCost> costs =
      GroupCostsOf(specs, ExecutorOptions(), entries, std::chrono::milliseconds(50));
  ASSERT_EQ(costs.size(), 2u);
  EXPECT_EQ(costs[0].elements, 8000u);
  EXPECT_TRUE(costs[0].sparse);
  EXPECT_EQ(costs[0].plan_version, 7u);
  EXPECT_LT(costs[0].sparsify_s, 0.045) << "the 50 ms before the entry arrived counted";
  EXPECT_GT(costs[0].exchange_s, 0.0);
  EXPECT_EQ(costs[1].elements, 10u);
  EXPECT_FALSE(costs[1].sparse) << "below min_compress_bytes: dense";
}

// Stage B behind: the third group waits for a slot while the first is still in its exchange
// (slowed by 100 ms here). That wait is not stage A's work, so no group's sparsify_s has it.
TEST(ExecutorTest, AGroupsCostLeavesOutTheWaitForAFreeSlot) {
  ExecutorOptions options;
  options.on_exchange = [](uint64_t seq) {
    if (seq == 1) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  };
  const std::vector<GroupCost> costs = GroupCostsOf(
      {{"a", 6000}, {"b", 6000}, {"c", 6000}}, options, Schedule({{0}, {1}, {2}}, 1));
  ASSERT_EQ(costs.size(), 3u);
  for (const GroupCost& c : costs) EXPECT_LT(c.sparsify_s, 0.05) << c.elements;
}

// The observer (the timeline, the metrics) hears of every entry on stage B: before its exchange
// and when it is done, with its tensors, its path and the times of its stages in order; the
// entry's receipt time comes from the agent.
TEST(ExecutorTest, TellsTheObserverAboutEveryEntry) {
  struct Seen {
    observe::GroupView view;
    std::vector<std::string> names;
    std::vector<int64_t> ready;
  };
  class Recorder : public observe::Observer {
   public:
    void OnExchange(const observe::GroupView& g) override { Keep(g, &exchanges); }
    void OnGroup(const observe::GroupView& g) override { Keep(g, &groups); }
    void Keep(const observe::GroupView& g, std::vector<Seen>* to) {
      Seen s{g, {}, {}};
      for (const auto& t : g.tensors) {
        s.names.push_back(*t.name);
        s.ready.push_back(t.ready_ns);
      }
      s.view.tensors = {};
      std::lock_guard lock(mu);
      to->push_back(std::move(s));
    }
    std::mutex mu;
    std::vector<Seen> exchanges, groups;
  } recorder;
  const std::vector<TensorSpec> specs = {{"a", 6000}, {"b", 2000}, {"c", 10}};
  auto hub = std::make_shared<transport::LoopbackHub>(1);
  transport::LoopbackTransport loopback(hub, 0);
  ExecutorOptions options;
  options.observer = &recorder;
  Node node(World{0, 1, 1}, specs, &loopback, SparseConfig(), options,
            [](const Status& st) { ADD_FAILURE() << st.ToString(); });
  node.executor().Start();
  node.Post(1);
  auto entries = Schedule({{0, 1}, {2}}, 1);
  const int64_t received = std::chrono::duration_cast<std::chrono::nanoseconds>(
                               std::chrono::steady_clock::now().time_since_epoch())
                               .count();
  for (auto& e : entries) e.received_ns = received;
  node.feed().Push(entries);
  for (const auto& d : node.ReadDones(std::chrono::seconds(10))) {
    EXPECT_EQ(d.status, SPARSYNC_OK) << d.message;
  }
  node.executor().Stop();
  std::lock_guard lock(recorder.mu);
  ASSERT_EQ(recorder.exchanges.size(), 2u);
  ASSERT_EQ(recorder.groups.size(), 2u);
  const Seen& sparse = recorder.groups[0];
  EXPECT_EQ(sparse.view.seq, 1u);
  EXPECT_EQ(sparse.names, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(sparse.view.sparse);
  EXPECT_EQ(sparse.view.op, CollectiveOp::kGradient);
  EXPECT_EQ(sparse.view.elements, 8000u);
  EXPECT_EQ(sparse.view.dense_bytes, 32000u);
  EXPECT_EQ(sparse.view.step, 1u);
  EXPECT_STREQ(sparse.view.path, "host sparse");
  EXPECT_TRUE(sparse.view.ok);
  EXPECT_EQ(sparse.view.received_ns, received);
  for (int64_t r : sparse.ready) EXPECT_GT(r, 0);
  const observe::GroupView& v = sparse.view;
  EXPECT_LE(v.prepare_begin_ns, v.prepare_end_ns);
  EXPECT_LE(v.prepare_end_ns, v.exchange_begin_ns);
  EXPECT_LE(v.exchange_begin_ns, v.exchange_end_ns);
  EXPECT_LE(v.exchange_end_ns, v.deliver_end_ns);
  EXPECT_GT(v.prepare_begin_ns, 0);
  // Before the exchange the later stages have not run.
  EXPECT_EQ(recorder.exchanges[0].view.exchange_end_ns, 0);
  EXPECT_EQ(recorder.exchanges[0].view.deliver_end_ns, 0);
  EXPECT_FALSE(recorder.groups[1].view.sparse) << "below min_compress_bytes: dense";
  EXPECT_EQ(recorder.groups[1].names, std::vector<std::string>{"c"});
}

// A plan announcement (a plan, no group) is for the node agent only: the executor prepares and
// exchanges nothing for it and sends no DONE, and the groups around it, in the same batch or
// not, run as if it were not there. Both with the two stages' threads and one entry at a time.
TEST(ExecutorTest, PlanAnnouncementsAreSkipped) {
  for (bool pipelined : {true, false}) {
    SCOPED_TRACE(pipelined ? "pipelined" : "one entry at a time");
    const std::vector<TensorSpec> specs = {{"a", 1000}, {"b", 300}};
    auto hub = std::make_shared<transport::LoopbackHub>(1);
    transport::LoopbackTransport loopback(hub, 0);
    RecordingTransport recorder(&loopback);
    std::mutex mu;
    std::vector<uint64_t> prepared;
    ExecutorOptions options;
    options.on_prepared = [&](uint64_t seq) {
      std::lock_guard lock(mu);
      prepared.push_back(seq);
    };
    options.on_exchange = [&](uint64_t seq) { recorder.Mark("entry " + std::to_string(seq)); };
    Node node(World{0, 1, 1}, specs, &recorder, SparseConfig(), options,
              [](const Status& st) { ADD_FAILURE() << st.ToString(); });
    if (pipelined) node.executor().Start();
    auto plan = [](uint64_t seq, uint32_t version) {
      negotiation::PlanInfo info;
      info.version = version;
      info.planner = "layerwise";
      info.groups = {{1}, {2}};
      ScheduleEntry e;
      e.seq = seq;
      e.plan = std::make_shared<const negotiation::PlanInfo>(std::move(info));
      return e;
    };
    node.Post(1);
    node.feed().Push({plan(1, 1)});
    if (!pipelined) node.executor().RunOnce(std::chrono::milliseconds(0));
    auto dones = node.ReadDones(std::chrono::milliseconds(100));
    EXPECT_EQ(dones[0].status, -1) << "a DONE for the announcement";
    EXPECT_TRUE(recorder.log().empty()) << "the announcement was exchanged";
    {
      std::lock_guard lock(mu);
      EXPECT_TRUE(prepared.empty()) << "the announcement was prepared";
    }
    // Its groups, with the next plan's announcement between them in one batch.
    auto groups = Schedule({{0}, {1}}, 2);
    for (uint32_t i = 0; i < 2; ++i) {
      groups[i].plan_version = 1;
      groups[i].group_index = i;
    }
    groups[1].seq = 4;
    node.feed().Push({groups[0], plan(3, 2), groups[1]});
    if (!pipelined) node.executor().RunOnce(std::chrono::milliseconds(0));
    dones = node.ReadDones(std::chrono::seconds(10));
    for (size_t t = 0; t < specs.size(); ++t) {
      EXPECT_EQ(dones[t].status, SPARSYNC_OK) << specs[t].name << ": " << dones[t].message;
    }
    EXPECT_EQ(recorder.log(), (std::vector<std::string>{"entry 2", "allreduce 0", "entry 4",
                                                        "allreduce 1"}));
    {
      std::lock_guard lock(mu);
      EXPECT_EQ(prepared, (std::vector<uint64_t>{2, 4}));
    }
    // One node, one worker, average: each result is the worker's own input.
    std::vector<float> expected;
    for (size_t t = 0; t < specs.size(); ++t) {
      for (size_t i = 0; i < static_cast<size_t>(specs[t].numel); ++i) {
        expected.push_back(Value(0, 0, t, i, 1));
      }
    }
    EXPECT_EQ(node.Results(), expected);
    node.executor().Stop();
    node.executor().Stop();  // idempotent
  }
}

// SPARSYNC_COMPRESS=auto: a group the plan sends dense (ScheduleEntry::dense) carries its
// tensors' residuals: what top-k held back goes out with the dense exchange, and the residual
// is then zero, so nothing is lost and nothing is sent twice. Both host dense paths: a fused
// group (host dense) and one tensor of one worker (in place).
TEST(ExecutorTest, ADenseGroupFlushesItsResidualsIntoTheExchange) {
  const std::vector<TensorSpec> specs = {{"a", 6000}, {"b", 2000}, {"c", 8000}};
  auto hub = std::make_shared<transport::LoopbackHub>(1);
  transport::LoopbackTransport loopback(hub, 0);
  Node node(World{0, 1, 1}, specs, &loopback, SparseConfig(), ExecutorOptions{},
            [](const Status& st) { ADD_FAILURE() << st.ToString(); });
  node.executor().Start();
  auto run_round = [&](uint64_t round, bool dense) {
    node.Post(round);
    auto entries = Schedule({{0, 1}, {2}}, 1 + 2 * (round - 1));
    for (auto& e : entries) e.dense = dense;
    node.feed().Push(entries);
    for (const auto& d : node.ReadDones(std::chrono::seconds(10))) {
      EXPECT_EQ(d.status, SPARSYNC_OK) << d.message;
    }
  };
  // Round 1 sparse: each tensor keeps a residual (what was not among the top 1 %).
  run_round(1, /*dense=*/false);
  std::vector<float> residual;
  for (const TensorSpec& t : specs) {
    auto r = node.state().Get(TensorState::Kind::kResidual, t.name);
    ASSERT_EQ(r.size(), static_cast<size_t>(t.numel)) << t.name;
    residual.insert(residual.end(), r.begin(), r.end());
  }
  ASSERT_TRUE(std::any_of(residual.begin(), residual.end(), [](float x) { return x != 0; }));
  // Round 2 dense: the result is the gradient plus the residual, and the residual is gone.
  run_round(2, /*dense=*/true);
  std::vector<float> expected;
  size_t at = 0;
  for (size_t t = 0; t < specs.size(); ++t) {
    for (size_t i = 0; i < static_cast<size_t>(specs[t].numel); ++i) {
      expected.push_back(Value(0, 0, t, i, 2) + residual[at++]);
    }
  }
  EXPECT_EQ(node.Results(), expected);
  for (const TensorSpec& t : specs) {
    EXPECT_TRUE(node.state().Get(TensorState::Kind::kResidual, t.name).empty()) << t.name;
  }
  // Round 3 dense again: the gradient alone, nothing sent twice.
  run_round(3, /*dense=*/true);
  expected.clear();
  for (size_t t = 0; t < specs.size(); ++t) {
    for (size_t i = 0; i < static_cast<size_t>(specs[t].numel); ++i) {
      expected.push_back(Value(0, 0, t, i, 3));
    }
  }
  EXPECT_EQ(node.Results(), expected);
  node.executor().Stop();
}

}  // namespace
}  // namespace sparsync::pipeline
