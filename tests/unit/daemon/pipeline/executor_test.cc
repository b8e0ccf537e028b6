// The two-stage executor with nodes as threads over the loopback transport and workers as socket
// pairs into each node's tensor table: stage A of one entry overlaps stage B of the previous one,
// every node makes its transport calls in schedule order from one thread, results are the same bits
// on every node and the same as executing one entry at a time, and failures stay sticky.
#include <gtest/gtest.h>

#include "tests/unit/daemon/pipeline/executor_test_util.h"

namespace sparsync::pipeline {
namespace {

using namespace executor_testing;  // NOLINT: the helpers are this file's vocabulary

class ExecutorPipelineTest : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(ExecutorPipelineTest, SameBitsOnEveryNodeAndAsOneEntryAtATime) {
  const auto [nodes, local_size] = GetParam();
  RunResult piped = RunMixed(nodes, local_size, 3, /*pipelined=*/true);
  RunResult serial = RunMixed(nodes, local_size, 3, /*pipelined=*/false);
  for (int r = 0; r < nodes; ++r) {
    for (int32_t s : piped.statuses[r]) ASSERT_EQ(s, SPARSYNC_OK) << "node " << r;
    ASSERT_EQ(piped.results[r].size(), piped.results[0].size());
    ASSERT_FALSE(piped.results[r].empty());
    EXPECT_EQ(0, std::memcmp(piped.results[r].data(), piped.results[0].data(),
                             piped.results[0].size() * sizeof(float)))
        << "node " << r << " differs from node 0";
    ASSERT_EQ(serial.results[r].size(), piped.results[r].size());
    EXPECT_EQ(0, std::memcmp(piped.results[r].data(), serial.results[r].data(),
                             piped.results[r].size() * sizeof(float)))
        << "node " << r << ": pipelined and one-at-a-time results differ";
  }
}

// The host sparse path's in-place way (the residuals select, the result is decoded into the
// regions) sums a node's workers with the residual. Two workers that post halves of what one
// posts make the same node sums exactly, and the average over twice the workers is exactly half:
// one and two workers per node give the same bits, every other path included.
TEST(ExecutorInPlaceTest, OneWorkerPerNodeGivesWhatTwoWorkersPostingHalvesGive) {
  constexpr int kNodes = 3;
  auto whole = [](int node, int, size_t t, size_t i, uint64_t round) {
    return Value(node, 0, t, i, round);
  };
  auto half = [](int node, int, size_t t, size_t i, uint64_t round) {
    return Value(node, 0, t, i, round) / 2;
  };
  RunResult one = RunMixed(kNodes, 1, 3, /*pipelined=*/true, whole);
  RunResult two = RunMixed(kNodes, 2, 3, /*pipelined=*/true, half);
  for (int r = 0; r < kNodes; ++r) {
    for (int32_t s : one.statuses[r]) ASSERT_EQ(s, SPARSYNC_OK) << "node " << r;
    for (int32_t s : two.statuses[r]) ASSERT_EQ(s, SPARSYNC_OK) << "node " << r;
    // Worker 0's buffers of every round: two's results are laid out worker by worker.
    size_t round_size = 0;
    for (const TensorSpec& t : kMixed) round_size += static_cast<size_t>(t.numel);
    ASSERT_EQ(two.results[r].size(), 2 * one.results[r].size());
    for (size_t round = 0; round < 3; ++round) {
      for (size_t i = 0; i < round_size; ++i) {
        const float a = one.results[r][round * round_size + i];
        const float b = two.results[r][2 * round * round_size + i] * 2;
        ASSERT_EQ(0, std::memcmp(&a, &b, sizeof a))
            << "node " << r << " round " << round << " element " << i << ": " << a << " vs " << b;
      }
    }
  }
}

TEST_P(ExecutorPipelineTest, TransportCallsInScheduleOrderFromOneThread) {
  const auto [nodes, local_size] = GetParam();
  RunResult piped = RunMixed(nodes, local_size, 2, /*pipelined=*/true);
  const size_t entries = 2 * kMixedGroups.size();
  for (int r = 0; r < nodes; ++r) {
    EXPECT_EQ(piped.logs[r], piped.logs[0]) << "node " << r << " called the transport differently";
    EXPECT_TRUE(piped.one_thread[r]) << "node " << r << ": transport used off stage B's thread";
    // Entries start in schedule order, each with transport calls of its own.
    uint64_t expected = 1;
    for (const std::string& line : piped.logs[r]) {
      if (line.rfind("entry ", 0) == 0) {
        EXPECT_EQ(line, "entry " + std::to_string(expected)) << "node " << r;
        ++expected;
      }
    }
    EXPECT_EQ(expected, entries + 1);
  }
}

INSTANTIATE_TEST_SUITE_P(Nodes, ExecutorPipelineTest,
                         ::testing::Values(std::make_tuple(1, 1), std::make_tuple(3, 1),
                                           std::make_tuple(4, 1), std::make_tuple(3, 2)),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "nodes_" +
                                  std::to_string(std::get<1>(info.param)) + "workers";
                         });

// Stage A of entry n+1 must finish while entry n is being exchanged: every transport call of an
// entry (but the last) waits for the next entry's on_prepared. Executed one entry at a time this
// never happens and the wait gives up after `patience`.
bool OverlapObserved(int nodes, bool pipelined, std::chrono::milliseconds patience) {
  const std::vector<TensorSpec> specs = {{"a", 40000}, {"b", 40000}, {"c", 40000}, {"d", 40000}};
  const uint64_t last = specs.size();
  auto hub = std::make_shared<transport::LoopbackHub>(nodes, std::chrono::seconds(20));
  struct Stages {
    std::mutex mu;
    std::condition_variable cv;
    std::set<uint64_t> prepared;
    uint64_t exchanging = 0;
    bool missed = false;
  };
  std::vector<std::unique_ptr<Stages>> stages;
  std::vector<std::unique_ptr<transport::LoopbackTransport>> loopbacks;
  std::vector<std::unique_ptr<RecordingTransport>> recorders;
  std::vector<std::unique_ptr<Node>> cluster;
  for (int r = 0; r < nodes; ++r) {
    stages.push_back(std::make_unique<Stages>());
    Stages* s = stages.back().get();
    loopbacks.push_back(std::make_unique<transport::LoopbackTransport>(hub, r));
    recorders.push_back(std::make_unique<RecordingTransport>(loopbacks.back().get()));
    recorders.back()->before = [s, last, patience]() -> Status {
      std::unique_lock lock(s->mu);
      const uint64_t next = s->exchanging + 1;
      if (next > last) return Status::Ok();
      if (!s->cv.wait_for(lock, patience, [&] { return s->prepared.count(next) > 0; })) {
        s->missed = true;
        return DeadlineExceeded("entry " + std::to_string(next) +
                                " was not prepared during the "
                                "exchange of entry " +
                                std::to_string(next - 1));
      }
      return Status::Ok();
    };
    ExecutorOptions options;
    options.on_prepared = [s](uint64_t seq) {
      {
        std::lock_guard lock(s->mu);
        s->prepared.insert(seq);
      }
      s->cv.notify_all();
    };
    options.on_exchange = [s](uint64_t seq) {
      std::lock_guard lock(s->mu);
      s->exchanging = seq;
    };
    cluster.push_back(std::make_unique<Node>(World{r, nodes, 1}, specs, recorders.back().get(),
                                             SparseConfig(), options,
                                             [hub](const Status& st) { hub->Abort(st); }));
    if (pipelined) cluster.back()->executor().Start();
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < nodes; ++r) {
    threads.emplace_back([&, r] {
      cluster[r]->Post(1);
      cluster[r]->feed().Push(Schedule({{0}, {1}, {2}, {3}}, 1));
      if (!pipelined) cluster[r]->executor().RunOnce(std::chrono::milliseconds(0));
      cluster[r]->ReadDones(std::chrono::seconds(20));
    });
  }
  for (auto& t : threads) t.join();
  cluster.clear();
  bool overlapped = true;
  for (auto& s : stages) overlapped = overlapped && !s->missed && s->exchanging == last;
  return overlapped;
}

TEST(ExecutorOverlapTest, NextEntryIsPreparedWhileTheCurrentOneIsExchanged) {
  EXPECT_TRUE(OverlapObserved(1, /*pipelined=*/true, std::chrono::seconds(20)));
  EXPECT_TRUE(OverlapObserved(2, /*pipelined=*/true, std::chrono::seconds(20)));
}

TEST(ExecutorOverlapTest, OneEntryAtATimeDoesNotOverlap) {
  // The check above can fail: executed serially, the next entry is never prepared in time.
  EXPECT_FALSE(OverlapObserved(1, /*pipelined=*/false, std::chrono::milliseconds(200)));
}

// A stage-A error (a NaN under SPARSYNC_NONFINITE=error) on node 1 in entry 2: node 1 still
// completes entry 1 first (the error keeps its place in the schedule), then every later tensor
// fails on every node once the coordinator's fatal entry arrives; nothing hangs.
TEST(ExecutorFailureTest, StageAErrorFailsEverythingAfterItsPlace) {
  const int nodes = 2;
  const std::vector<TensorSpec> specs = {{"a", 40000}, {"b", 40000}, {"c", 40000}};
  auto hub = std::make_shared<transport::LoopbackHub>(nodes, std::chrono::seconds(20));
  std::vector<std::unique_ptr<transport::LoopbackTransport>> loopbacks;
  std::vector<std::unique_ptr<Node>> cluster;
  std::mutex mu;
  std::vector<Status> reported;
  // The coordinator's answer to a failure report: a fatal entry for every node.
  auto coordinator_fails = [&](const Status& st) {
    {
      std::lock_guard lock(mu);
      reported.push_back(st);
    }
    ScheduleEntry fatal;
    fatal.seq = 100;
    fatal.fatal = Aborted("job failed: " + st.message());
    for (auto& node : cluster) node->feed().Push({fatal});
  };
  for (int r = 0; r < nodes; ++r) {
    loopbacks.push_back(std::make_unique<transport::LoopbackTransport>(hub, r));
    cluster.push_back(std::make_unique<Node>(World{r, nodes, 1}, specs, loopbacks.back().get(),
                                             SparseConfig(), ExecutorOptions{}, coordinator_fails));
  }
  for (auto& node : cluster) node->executor().Start();
  std::vector<std::vector<sparsync_done>> dones(nodes);
  std::vector<std::thread> threads;
  for (int r = 0; r < nodes; ++r) {
    threads.emplace_back([&, r] {
      cluster[r]->Post(1, /*poison=*/r == 1 ? 1 : -1);
      cluster[r]->feed().Push(Schedule({{0}, {1}, {2}}, 1));
      dones[r] = cluster[r]->ReadDones(std::chrono::seconds(20));
    });
  }
  for (auto& t : threads) t.join();
  for (auto& node : cluster) node->executor().Stop();
  EXPECT_EQ(dones[1][0].status, SPARSYNC_OK)
      << "entry 1 precedes the error: " << dones[1][0].message;
  for (int r = 0; r < nodes; ++r) {
    for (size_t t = 1; t < specs.size(); ++t) {
      EXPECT_NE(dones[r][t].status, SPARSYNC_OK) << "node " << r << " tensor " << t;
      EXPECT_NE(dones[r][t].status, -1) << "node " << r << " tensor " << t << ": no DONE";
    }
  }
  EXPECT_NE(std::string(dones[1][1].message).find("non-finite"), std::string::npos)
      << dones[1][1].message;
  std::lock_guard lock(mu);
  ASSERT_FALSE(reported.empty());
  EXPECT_NE(reported.front().message().find("'b'"), std::string::npos)
      << reported.front().message();
}

// A fatal entry while stage B is blocked in a collective (node 1 never shows up): the transport
// is aborted at once, so the blocked call returns and the workers hear the fatal reason, not a
// transport timeout.
TEST(ExecutorFailureTest, FatalEntryAbortsABlockedExchange) {
  const std::vector<TensorSpec> specs = {{"a", 40000}, {"b", 64}};
  auto hub = std::make_shared<transport::LoopbackHub>(2, std::chrono::seconds(20));
  transport::LoopbackTransport loopback(hub, 0);
  std::atomic<int> failures{0};
  std::mutex mu;
  std::condition_variable cv;
  bool exchanging = false;
  ExecutorOptions options;
  options.on_exchange = [&](uint64_t) {
    {
      std::lock_guard lock(mu);
      exchanging = true;
    }
    cv.notify_all();
  };
  Node node(World{0, 2, 1}, specs, &loopback, SparseConfig(), options,
            [&](const Status&) { ++failures; });
  node.executor().Start();
  node.Post(1);
  node.feed().Push(Schedule({{0}, {1}}, 1));
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(20), [&] { return exchanging; }));
  }
  ScheduleEntry fatal;
  fatal.seq = 3;
  fatal.fatal = Aborted("node 1 died");
  node.feed().Push({fatal});
  auto dones = node.ReadDones(std::chrono::seconds(10));
  for (const auto& d : dones) {
    EXPECT_NE(d.status, SPARSYNC_OK);
    EXPECT_NE(d.status, -1) << "no DONE";
    EXPECT_NE(std::string(d.message).find("node 1 died"), std::string::npos) << d.message;
  }
  node.executor().Stop();
  EXPECT_EQ(failures.load(), 0) << "a fatal entry is the coordinator's news, not this node's";
}

// The planner's live costs: one report per reduced gradient group, none for other collectives;
// t_s counts from when the group's tensors were ready here, so the wait for the schedule (here
// 50 ms) is part of it.

}  // namespace
}  // namespace sparsync::pipeline
