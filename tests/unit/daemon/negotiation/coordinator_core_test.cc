// CoordinatorCore, the thread-safe and blocking coordinator, with nodes as threads calling it
// directly (node 0's CoordinatorLink): joins and the error each misconfigured node gets, one
// schedule seen identically by every node, failures reaching every poller, liveness, the
// rendezvous store, Stop waking every waiter, and measured group costs re-making the plan.
// coordinator_state_test.cc steps the state machine underneath without threads.
#include "daemon/negotiation/coordinator_core.h"

#include <gtest/gtest.h>

#include <thread>

#include "daemon/negotiation/startup_heartbeat.h"
#include "tests/unit/daemon/negotiation/test_util.h"

namespace sparsync::negotiation {
namespace {

using namespace std::chrono_literals;
using testing::Contains;
using testing::HasFatal;
using testing::Meta;
using testing::NewRef;
using testing::SecondsSince;
using testing::SlotRef;

constexpr char kToken[] = "s3cret-token";

CoordinatorOptions Options(int nodes) {
  CoordinatorOptions o;
  o.num_nodes = nodes;
  o.cycle = 0ms;                // schedule each batch at once
  o.merge.warmup_steps = 1000;  // no merge plan (planning: the last test)
  return o;
}

JoinInfo Info(int rank, int nodes, int local_size = 2) {
  return testing::Joiner(rank, nodes, local_size, kToken, kProtocolVersion);
}

// Every rank of `infos` joins on its own thread; their statuses in the same order.
std::vector<Status> JoinAll(CoordinatorCore& core, const std::vector<JoinInfo>& infos,
                            std::chrono::milliseconds timeout) {
  std::vector<Status> out(infos.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < infos.size(); ++i) {
    threads.emplace_back([&, i] { out[i] = core.Join(infos[i], timeout); });
  }
  for (auto& t : threads) t.join();
  return out;
}

TEST(CoordinatorCoreTest, JoinReturnsOnceEveryNodeJoined) {
  CoordinatorCore core(Options(3), 2, kToken);
  auto statuses = JoinAll(core, {Info(0, 3), Info(1, 3), Info(2, 3)}, 10s);
  for (const Status& st : statuses) EXPECT_TRUE(st.ok()) << st.ToString();
  // Joining again (a retried RPC) is harmless.
  EXPECT_TRUE(core.Join(Info(1, 3), 10ms).ok());
}

TEST(CoordinatorCoreTest, JoinTimesOutNamingTheMissingNodes) {
  CoordinatorCore core(Options(4), 2, kToken);
  auto start = std::chrono::steady_clock::now();
  auto statuses = JoinAll(core, {Info(0, 4), Info(2, 4)}, 100ms);
  EXPECT_GE(SecondsSince(start), 0.09);
  for (const Status& st : statuses) {
    EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded);
    EXPECT_TRUE(Contains(st.message(), "node(s) 1,3 did not join")) << st.message();
  }
}

// Each setting that must agree across nodes is refused with the node, both values and the
// variable to fix; a refused node does not count as joined.
TEST(CoordinatorCoreTest, MismatchedJoinsAreRefusedWithTheSettingToFix) {
  CoordinatorCore core(Options(2), /*local_size=*/4, kToken);
  struct Case {
    JoinInfo info;
    StatusCode code;
    std::vector<std::string> parts;
  };
  JoinInfo old_version = Info(1, 2, 4);
  old_version.protocol_version = kProtocolVersion + 1;
  JoinInfo other_token = Info(1, 2, 4);
  other_token.job_token = "s3cret-tokeN";  // same length: compared in full, not by size
  JoinInfo short_token = Info(1, 2, 4);
  short_token.job_token = "s3cret";
  JoinInfo no_token = Info(1, 2, 4);
  no_token.job_token.clear();
  const std::vector<Case> cases = {
      {old_version,
       StatusCode::kPermissionDenied,
       {"node 1", "protocol " + std::to_string(kProtocolVersion + 1), "same sparsync version"}},
      {other_token, StatusCode::kPermissionDenied, {"node 1", "wrong SPARSYNC_JOB_TOKEN"}},
      {short_token, StatusCode::kPermissionDenied, {"wrong SPARSYNC_JOB_TOKEN"}},
      {no_token, StatusCode::kPermissionDenied, {"wrong SPARSYNC_JOB_TOKEN"}},
      {Info(1, 3, 4),
       StatusCode::kInvalidArgument,
       {"node 1", "SPARSYNC_NUM_NODES=3", "node 0 has 2"}},
      {Info(1, 2, 8),
       StatusCode::kInvalidArgument,
       {"node 1", "SPARSYNC_LOCAL_SIZE=8", "node 0 has 4"}},
      {Info(2, 2, 4), StatusCode::kInvalidArgument, {"node rank 2 out of range"}},
      {Info(-1, 2, 4), StatusCode::kInvalidArgument, {"node rank -1 out of range"}},
  };
  for (const Case& c : cases) {
    Status st = core.Join(c.info, 10s);  // refused at once, not after the timeout
    EXPECT_EQ(st.code(), c.code) << st.ToString();
    for (const auto& part : c.parts) EXPECT_TRUE(Contains(st.message(), part)) << st.message();
  }
  Status alone = core.Join(Info(0, 2, 4), 20ms);
  EXPECT_EQ(alone.code(), StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(Contains(alone.message(), "node(s) 1 did not join")) << alone.message();
}

TEST(CoordinatorCoreTest, TokenIsComparedInFull) {
  CoordinatorCore core(Options(1), 1, kToken);
  EXPECT_TRUE(core.TokenMatches(kToken));
  for (const char* wrong : {"", "s3cret-toke", "s3cret-token!", "S3cret-token", "x3cret-token"}) {
    EXPECT_FALSE(core.TokenMatches(wrong)) << wrong;
  }
}

// Three nodes report the same tensors in different orders for several rounds, each polling for
// the round's entries before the next: one schedule, identical on every node.
TEST(CoordinatorCoreTest, EveryNodeSeesTheSameOrderedSchedule) {
  constexpr int kRounds = 5;
  CoordinatorCore core(Options(3), 2, kToken);
  core.Start();
  const std::vector<TensorMeta> tensors = {Meta("fc.weight", {8, 4}), Meta("fc.bias", {8}),
                                           Meta("loss", {1}, CollectiveOp::kAllReduce),
                                           Meta("emb", {3, 2}, CollectiveOp::kAllGather)};
  auto seen = testing::RunRounds({&core, &core, &core}, tensors, kRounds);
  testing::ExpectOneSchedule(seen, tensors, kRounds);
}

// A tensor reported with different shapes: one fatal entry, naming the tensor, both shapes and
// both nodes, reaches pollers that were already waiting; later reports are refused.
TEST(CoordinatorCoreTest, ShapeMismatchIsOneFatalEntryForEveryNode) {
  CoordinatorCore core(Options(2), 2, kToken);
  std::vector<std::vector<ScheduleEntry>> got(2);
  std::vector<double> waited(2);
  std::vector<std::thread> pollers;
  for (int n = 0; n < 2; ++n) {
    pollers.emplace_back([&, n] {
      auto start = std::chrono::steady_clock::now();
      got[n] = core.Poll(n, 0, 10s).value();
      waited[n] = SecondsSince(start);
    });
  }
  std::this_thread::sleep_for(20ms);  // let the pollers block (the test holds either way)
  ASSERT_TRUE(core.Report(0, {Meta("fc1.weight", {512, 784})}, {NewRef(0)}).ok());
  ASSERT_TRUE(core.Report(1, {Meta("fc1.weight", {512, 780})}, {NewRef(0)}).ok());
  for (auto& t : pollers) t.join();
  for (int n = 0; n < 2; ++n) {
    EXPECT_LT(waited[n], 5.0) << "node " << n << " was not woken";
    ASSERT_EQ(got[n].size(), 1u) << "node " << n;
    const Status& fatal = got[n][0].fatal;
    EXPECT_EQ(fatal.code(), StatusCode::kMismatch);
    for (const char* part : {"'fc1.weight'", "[512,784]", "[512,780]", "node(s) 0", "node 1"}) {
      EXPECT_TRUE(Contains(fatal.message(), part)) << part << " in " << fatal.message();
    }
    EXPECT_TRUE(got[n][0].group.empty());
  }
  auto later = core.Report(0, {}, {SlotRef(1)});
  EXPECT_EQ(later.status().code(), StatusCode::kAborted);
  EXPECT_TRUE(Contains(later.status().message(), "fc1.weight"));
}

// A report refused for its joins changes nothing: its tensors get no slot and nothing of it
// reaches the schedule (found by tests/fuzz's coordinator target, which saw slots the node was
// never told scheduled after a report with a rank of another node).
TEST(CoordinatorCoreTest, AReportWithABadJoinIsRefusedWhole) {
  CoordinatorCore core(Options(1), /*local_size=*/2, kToken);
  for (const std::vector<int32_t>& joins : {std::vector<int32_t>{2}, {1, 1}, {0, 5}}) {
    RankNews news;
    news.joined = joins;
    auto refused = core.Report(0, {Meta("fc.weight", {8})}, {NewRef(0)}, news);
    EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument) << joins.size();
  }
  RankNews elsewhere;
  elsewhere.gone = {2};  // node 1's
  EXPECT_FALSE(core.Report(0, {Meta("fc.weight", {8})}, {NewRef(0)}, elsewhere).ok());
  EXPECT_TRUE(core.Poll(0, 0, 0ms).value().empty());
  // The same tensor reported well is the first one the coordinator registers.
  auto slots = core.Report(0, {Meta("fc.weight", {8})}, {NewRef(0)}, {});
  ASSERT_TRUE(slots.ok());
  EXPECT_EQ(slots.value(), std::vector<uint32_t>{1});
  EXPECT_EQ(core.Poll(0, 0, 0ms).value().size(), 1u);
}

// One node's Fail reaches every waiting poller; the first failure wins and the schedule ends
// with exactly one fatal entry whatever follows (another Fail, a Leave).
TEST(CoordinatorCoreTest, FailFromOneNodeReachesEveryPollerOnce) {
  constexpr int kNodes = 3;
  CoordinatorCore core(Options(kNodes), 2, kToken);
  std::vector<std::vector<ScheduleEntry>> got(kNodes);
  std::vector<double> waited(kNodes);
  std::vector<std::thread> pollers;
  for (int n = 0; n < kNodes; ++n) {
    pollers.emplace_back([&, n] {
      auto start = std::chrono::steady_clock::now();
      got[n] = core.Poll(n, 0, 10s).value();
      waited[n] = SecondsSince(start);
    });
  }
  std::this_thread::sleep_for(20ms);
  EXPECT_TRUE(core.Fail(1, Internal("worker 3 of node 1 died (exit code 9)")).ok());
  for (auto& t : pollers) t.join();
  for (int n = 0; n < kNodes; ++n) {
    EXPECT_LT(waited[n], 5.0) << "node " << n << " was not woken";
    ASSERT_EQ(got[n].size(), 1u);
    EXPECT_EQ(got[n][0].fatal.code(), StatusCode::kInternal);
    EXPECT_EQ(got[n][0].fatal.message(), "worker 3 of node 1 died (exit code 9)");
  }
  EXPECT_TRUE(core.Fail(2, Unavailable("a later, secondary failure")).ok());
  EXPECT_TRUE(core.Leave(0).ok());
  auto all = core.Poll(2, 0, 0ms).value();
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].fatal.message(), "worker 3 of node 1 died (exit code 9)");
  // The fatal entry is kept even once every node has polled past it.
  for (int n = 0; n < kNodes; ++n) (void)core.Poll(n, all[0].seq, 0ms);
  EXPECT_EQ(core.Poll(0, 0, 0ms).value().size(), 1u);
}

TEST(CoordinatorCoreTest, LeavingNodeFailsTheJobNamingIt) {
  CoordinatorCore core(Options(2), 2, kToken);
  EXPECT_TRUE(core.Leave(1).ok());
  auto got = core.Poll(0, 0, 1s).value();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].fatal.code(), StatusCode::kAborted);
  EXPECT_TRUE(Contains(got[0].fatal.message(), "node 1 shut down")) << got[0].fatal.message();
}

// Two nodes and a 300 ms liveness window.
CoordinatorOptions LivenessOptions() {
  CoordinatorOptions o = Options(2);
  o.node_liveness = 300ms;
  return o;
}

void StartAndJoinTwo(CoordinatorCore& core) {
  core.Start();
  for (const Status& st : JoinAll(core, {Info(0, 2), Info(1, 2)}, 5s)) {
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
}

// Node 0 hears one fatal entry naming silent node 1, at least `min_s` after `silent` (when
// node 1's last poll may have been) and well before a second window would explain it.
void ExpectNodeOneFailedAsSilent(CoordinatorCore& core,
                                 std::chrono::steady_clock::time_point silent, double min_s) {
  auto got = testing::PollUntil(core, 0, 0, HasFatal);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_GE(SecondsSince(silent), min_s);
  EXPECT_LT(SecondsSince(silent), 5.0);
  EXPECT_EQ(got[0].fatal.code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(got[0].fatal.message(), "node 1 has not contacted the coordinator"))
      << got[0].fatal.message();
}

// While node 1 polls, the job lives; once it stops for longer than the liveness window, the
// timer fails the job naming it.
TEST(CoordinatorCoreTest, NodeSilentPastLivenessWindowFailsTheJobNamingIt) {
  CoordinatorCore core(LivenessOptions(), 2, kToken);
  ASSERT_NO_FATAL_FAILURE(StartAndJoinTwo(core));
  auto start = std::chrono::steady_clock::now();
  while (SecondsSince(start) < 0.6) {  // two windows, node 1 polling every 20 ms
    ASSERT_TRUE(core.Poll(1, 0, 20ms).value().empty());
    ASSERT_TRUE(core.Poll(0, 0, 0ms).value().empty()) << "failed while node 1 was polling";
  }
  ExpectNodeOneFailedAsSilent(core, std::chrono::steady_clock::now(), 0.29);
}

// A node busy in a start-up step longer than the liveness window (calibration over a slow link)
// stays alive while its StartupHeartbeat polls for it; once the heartbeat is gone and nothing
// polls, the window fails the job as before.
TEST(CoordinatorCoreTest, StartupHeartbeatKeepsABusyStartingNodeAlive) {
  CoordinatorCore core(LivenessOptions(), 2, kToken);
  ASSERT_NO_FATAL_FAILURE(StartAndJoinTwo(core));
  {
    StartupHeartbeat heartbeat(&core, 1, 75ms);
    std::this_thread::sleep_for(900ms);  // three windows without a poll of node 1's own
    ASSERT_TRUE(core.Poll(0, 0, 0ms).value().empty()) << "failed while the heartbeat polled";
  }
  ExpectNodeOneFailedAsSilent(core, std::chrono::steady_clock::now(), 0.2);
}

// With a batching cycle, the timer thread flushes a batch that no later report triggers.
TEST(CoordinatorCoreTest, TimerFlushesADueBatch) {
  CoordinatorOptions o = Options(1);
  o.cycle = 30ms;
  CoordinatorCore core(o, 1, kToken);
  core.Start();
  ASSERT_TRUE(core.Report(0, {Meta("w", {4})}, {NewRef(0)}).ok());
  EXPECT_TRUE(core.Poll(0, 0, 0ms).value().empty()) << "held for the cycle";
  auto start = std::chrono::steady_clock::now();
  auto got = core.Poll(0, 0, 5s).value();
  EXPECT_LT(SecondsSince(start), 2.0);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(testing::Describe(got[0]), "1:1");
}

TEST(CoordinatorCoreTest, StoreGetWaitsForEveryKeyUpToItsTimeout) {
  CoordinatorCore core(Options(2), 2, kToken);
  const std::string binary("a\0b\xff", 4);
  ASSERT_TRUE(core.StoreSet("rank0", binary).ok());
  auto one = core.StoreGet({"rank0"}, 0ms);
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_EQ(*one, std::vector<std::string>{binary});

  auto start = std::chrono::steady_clock::now();
  auto missing = core.StoreGet({"rank0", "rank1"}, 60ms);
  EXPECT_GE(SecondsSince(start), 0.055);
  EXPECT_EQ(missing.status().code(), StatusCode::kDeadlineExceeded);

  Result<std::vector<std::string>> waited = Internal("not run");
  double took = 0;
  std::thread getter([&] {
    auto t = std::chrono::steady_clock::now();
    waited = core.StoreGet({"rank1", "rank0"}, 10s);
    took = SecondsSince(t);
  });
  std::this_thread::sleep_for(20ms);
  ASSERT_TRUE(core.StoreSet("rank1", "second").ok());
  getter.join();
  ASSERT_TRUE(waited.ok()) << waited.status().ToString();
  EXPECT_LT(took, 5.0) << "StoreSet did not wake the waiter";
  EXPECT_EQ(*waited, (std::vector<std::string>{"second", binary})) << "in the order of the keys";
  ASSERT_TRUE(core.StoreSet("rank1", "replaced").ok());
  EXPECT_EQ(core.StoreGet({"rank1"}, 0ms).value(), std::vector<std::string>{"replaced"});
}

// Stop wakes a waiting Join, StoreGet and Poll with UNAVAILABLE instead of letting them time out.
TEST(CoordinatorCoreTest, StopWakesEveryWaiter) {
  CoordinatorCore core(Options(2), 2, kToken);
  core.Start();
  Status join, get, poll;
  std::vector<std::thread> waiters;
  auto start = std::chrono::steady_clock::now();
  waiters.emplace_back([&] { join = core.Join(Info(0, 2), 10s); });
  waiters.emplace_back([&] { get = core.StoreGet({"never"}, 10s).status(); });
  waiters.emplace_back([&] { poll = core.Poll(0, 0, 10s).status(); });
  std::this_thread::sleep_for(30ms);
  core.Stop();
  for (auto& t : waiters) t.join();
  EXPECT_LT(SecondsSince(start), 5.0);
  for (const Status* st : {&join, &get, &poll}) {
    EXPECT_EQ(st->code(), StatusCode::kUnavailable) << st->ToString();
    EXPECT_TRUE(Contains(st->message(), "shutting down")) << st->message();
  }
  core.Stop();  // idempotent
}

// Node 0's measured group costs (RecordGroupCost) reach the merge scheduler behind the core: as
// calibrated they change nothing; once every exchange costs 20 ms the plan is re-made, and the
// new plan is announced in the schedule before the groups that follow it. Three gradients A, B,
// C ready 10 ms apart on both nodes (each node's own clock), planned layer by layer.
TEST(CoordinatorCoreTest, MeasuredGroupCostsReMakeThePlan) {
  CoordinatorOptions o = Options(2);
  // optimal: when the measured start-up cost grows, merging all three pays; a planner whose
  // grouping cannot change (layerwise) would hold its plan (plans that hold still).
  o.merge.planners = {"optimal"};
  o.merge.warmup_steps = 2;
  CoordinatorCore core(o, 2, kToken);
  planning::CostModel calibrated;
  calibrated.exchange = {1e-3, 0};
  core.SetCostModel(calibrated);
  const std::vector<TensorMeta> grads = {Meta("A", {1000}), Meta("B", {10}), Meta("C", {1000})};
  int64_t clock_ns = 5'000'000'000;
  uint64_t after = 0;
  std::vector<PlanInfo> plans;
  auto step = [&](int index) {
    for (uint32_t i = 0; i < grads.size(); ++i) {
      for (int n = 0; n < 2; ++n) {
        int64_t t = clock_ns + i * 10'000'000 + n * 123'456'789;
        auto r = index == 0 ? core.Report(n, {grads[i]}, {NewRef(0, {}, t)})
                            : core.Report(n, {}, {SlotRef(i + 1, {}, t)});
        ASSERT_TRUE(r.ok()) << r.status().ToString();
      }
    }
    clock_ns += 1'000'000'000;
    for (int n = 0; n < 2; ++n) {
      auto entries = core.Poll(n, after, 0ms).value();
      if (n == 1) continue;
      for (const auto& e : entries) {
        ASSERT_TRUE(e.fatal.ok()) << e.fatal.ToString();
        if (e.plan) plans.push_back(*e.plan);
        if (e.plan_version) {
          ASSERT_FALSE(plans.empty()) << testing::Describe(e);
          EXPECT_EQ(e.plan_version, plans.back().version) << testing::Describe(e);
        }
        after = e.seq;
      }
    }
  };
  int steps = 0;
  for (; steps < 3; ++steps) step(steps);
  ASSERT_EQ(plans.size(), 1u) << "two measured steps after the first";
  const double first_prediction = plans[0].predicted_s;
  for (int i = 0; i < 3; ++i, ++steps) {
    for (uint64_t x : {1000u, 10u, 1000u}) core.RecordGroupCost(x, /*sparse=*/true, 0, 1e-3);
    step(steps);
  }
  EXPECT_EQ(plans.size(), 1u) << "costs as calibrated: no new plan";
  for (int i = 0; i < 12; ++i, ++steps) {
    for (uint64_t x : {1000u, 10u, 1000u}) core.RecordGroupCost(x, true, 0, 20e-3);
    step(steps);
  }
  ASSERT_GE(plans.size(), 2u) << "measured costs did not re-make the plan";
  EXPECT_GT(plans.back().version, plans[0].version);
  EXPECT_LT(plans.back().groups.size(), 3u) << "at 20 ms a group, merging pays";
  EXPECT_GT(plans.back().predicted_s, first_prediction + 0.01);
}

}  // namespace
}  // namespace sparsync::negotiation
