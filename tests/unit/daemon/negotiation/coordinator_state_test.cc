#include "daemon/negotiation/coordinator_state.h"

#include <gtest/gtest.h>

#include "proto/intake/wire.h"

namespace sparsync::negotiation {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

TensorMeta Grad(const std::string& name, std::vector<int64_t> shape,
                DType dtype = DType::kFloat32) {
  TensorMeta m;
  m.name = name;
  m.op = CollectiveOp::kGradient;
  m.dtype = dtype;
  m.shape = std::move(shape);
  return m;
}

ReportedReady New(uint32_t index) {
  ReportedReady r;
  r.new_index = index;
  return r;
}
ReportedReady Slot(uint32_t slot) {
  ReportedReady r;
  r.slot = slot;
  return r;
}

class CoordinatorStateTest : public ::testing::Test {
 protected:
  CoordinatorState Make(int nodes, uint64_t bucket = 1 << 20, milliseconds cycle = milliseconds(0)) {
    CoordinatorOptions o;
    o.num_nodes = nodes;
    o.bucket_bytes = bucket;
    o.cycle = cycle;
    o.stall_warn = seconds(5);
    o.timeout = seconds(20);
    o.node_liveness = seconds(10);
    o.merge.warmup_steps = 1000;  // planning is tested in merge_scheduler_test.cc
    return CoordinatorState(o);
  }
  Clock::time_point t0 = Clock::now();
};

TEST_F(CoordinatorStateTest, ScheduleWaitsForEveryNode) {
  CoordinatorState s = Make(3);
  auto slots = s.Report(0, {Grad("w", {4})}, {New(0)}, t0);
  ASSERT_TRUE(slots.ok());
  ASSERT_EQ(slots->size(), 1u);
  EXPECT_TRUE(s.EntriesAfter(0).empty());
  ASSERT_TRUE(s.Report(2, {Grad("w", {4})}, {New(0)}, t0).ok());
  EXPECT_TRUE(s.EntriesAfter(0).empty());
  auto last = s.Report(1, {Grad("w", {4})}, {New(0)}, t0);
  ASSERT_TRUE(last.ok());
  EXPECT_EQ(last->front(), slots->front()) << "same signature, same slot on every node";
  auto entries = s.EntriesAfter(0);
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].seq, 1u);
  ASSERT_EQ(entries[0].group.size(), 1u);
  EXPECT_EQ(entries[0].group[0].slot, slots->front());
}

TEST_F(CoordinatorStateTest, SteadyStateReportsOnlySlots) {
  CoordinatorState s = Make(2);
  uint32_t slot = s.Report(0, {Grad("w", {4})}, {New(0)}, t0)->front();
  ASSERT_TRUE(s.Report(1, {Grad("w", {4})}, {New(0)}, t0).ok());
  // Second round: no metadata at all.
  ASSERT_TRUE(s.Report(0, {}, {Slot(slot)}, t0).ok());
  ASSERT_TRUE(s.Report(1, {}, {Slot(slot)}, t0).ok());
  auto entries = s.EntriesAfter(0);
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[1].group[0].slot, slot);
  EXPECT_EQ(entries[1].seq, 2u);
}

TEST_F(CoordinatorStateTest, RejectsMalformedReportsWithoutChangingState) {
  CoordinatorState s = Make(2);
  EXPECT_FALSE(s.Report(0, {}, {Slot(42)}, t0).ok());
  EXPECT_FALSE(s.Report(0, {}, {New(0)}, t0).ok());
  EXPECT_FALSE(s.Report(5, {}, {}, t0).ok());
  ReportedReady both;
  both.slot = 1;
  both.new_index = 0;
  EXPECT_FALSE(s.Report(0, {Grad("w", {1})}, {both}, t0).ok());
  // A nameless tensor after a good one: the good one is not registered either (found by the
  // coordinator fuzz target: its slot 1 was scheduled although no report had handed it out).
  EXPECT_FALSE(s.Report(0, {Grad("w", {1}), Grad("", {1})}, {}, t0).ok());
  EXPECT_FALSE(s.Report(0, {}, {Slot(1)}, t0).ok());
  EXPECT_FALSE(s.failed());
}

TEST_F(CoordinatorStateTest, GradientsWithinACycleAreFusedExplicitOpsAreNot) {
  CoordinatorState s = Make(1, /*bucket=*/100, milliseconds(5));
  // 3 gradients of 40 bytes become ready within one cycle: buckets of 2 + 1.
  ASSERT_TRUE(s.Report(0, {Grad("a", {10}), Grad("b", {10}), Grad("c", {10})},
                       {New(0), New(1), New(2)}, t0)
                  .ok());
  EXPECT_TRUE(s.EntriesAfter(0).empty()) << "held for the cycle";
  s.Tick(t0 + milliseconds(6));
  auto entries = s.EntriesAfter(0);
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0].group.size(), 2u);
  EXPECT_EQ(entries[1].group.size(), 1u);
  // An explicit allreduce is scheduled at once.
  TensorMeta ar = Grad("x", {3});
  ar.op = CollectiveOp::kAllReduce;
  ASSERT_TRUE(s.Report(0, {ar}, {New(0)}, t0 + milliseconds(7)).ok());
  EXPECT_EQ(s.EntriesAfter(0).size(), 3u);
}

TEST_F(CoordinatorStateTest, DtypesAreNeverFusedTogether) {
  CoordinatorState s = Make(1, 1 << 20, milliseconds(5));
  ASSERT_TRUE(s.Report(0, {Grad("a", {10}), Grad("b", {10}, DType::kFloat64), Grad("c", {10})},
                       {New(0), New(1), New(2)}, t0)
                  .ok());
  s.Tick(t0 + milliseconds(5));
  auto entries = s.EntriesAfter(0);
  ASSERT_EQ(entries.size(), 3u);
}

TEST_F(CoordinatorStateTest, ShapeMismatchFailsEveryNodeNamingTensorValuesAndNodes) {
  CoordinatorState s = Make(3);
  ASSERT_TRUE(s.Report(0, {Grad("fc1.weight", {512, 784})}, {New(0)}, t0).ok());
  ASSERT_TRUE(s.Report(1, {Grad("fc1.weight", {512, 784})}, {New(0)}, t0).ok());
  ASSERT_TRUE(s.Report(2, {Grad("fc1.weight", {512, 780})}, {New(0)}, t0).ok());
  ASSERT_TRUE(s.failed());
  auto entries = s.EntriesAfter(0);
  ASSERT_EQ(entries.size(), 1u);
  const std::string& msg = entries[0].fatal.message();
  EXPECT_EQ(entries[0].fatal.code(), StatusCode::kMismatch);
  EXPECT_NE(msg.find("fc1.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[512,784]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[512,780]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("node(s) 0,1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("node 2"), std::string::npos) << msg;
  // Sticky: later reports are refused with the same error.
  auto later = s.Report(0, {}, {}, t0);
  EXPECT_EQ(later.status().code(), StatusCode::kAborted);
}

TEST_F(CoordinatorStateTest, DtypeMismatchIsNamedToo) {
  CoordinatorState s = Make(2);
  ASSERT_TRUE(s.Report(0, {Grad("b", {3})}, {New(0)}, t0).ok());
  ASSERT_TRUE(s.Report(1, {Grad("b", {3}, DType::kFloat16)}, {New(0)}, t0).ok());
  ASSERT_TRUE(s.failed());
  EXPECT_NE(s.fatal().message().find("float16"), std::string::npos);
}

TEST_F(CoordinatorStateTest, AllgatherMayDifferInTheFirstDimension) {
  CoordinatorState s = Make(2);
  TensorMeta a = Grad("g", {3, 2});
  a.op = CollectiveOp::kAllGather;
  TensorMeta b = a;
  b.shape = {5, 2};
  ReportedReady ra = New(0);
  ra.worker_dim0 = {3};
  ReportedReady rb = New(0);
  rb.worker_dim0 = {5};
  ASSERT_TRUE(s.Report(0, {a}, {ra}, t0).ok());
  ASSERT_TRUE(s.Report(1, {b}, {rb}, t0).ok());
  ASSERT_FALSE(s.failed()) << s.fatal().message();
  auto entries = s.EntriesAfter(0);
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].group[0].worker_dim0, (std::vector<int64_t>{3, 5}));
}

TEST_F(CoordinatorStateTest, StallWarnsThenTimesOutNamingTheMissingNodes) {
  CoordinatorState s = Make(3);
  ASSERT_TRUE(s.Report(0, {Grad("w", {1})}, {New(0)}, t0).ok());
  ASSERT_TRUE(s.Report(2, {Grad("w", {1})}, {New(0)}, t0).ok());
  EXPECT_TRUE(s.Tick(t0 + seconds(4)).empty());
  auto warnings = s.Tick(t0 + seconds(6));
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("node(s) 1 have not posted"), std::string::npos) << warnings[0];
  EXPECT_TRUE(s.Tick(t0 + seconds(7)).empty()) << "warned once";
  ASSERT_EQ(*s.NextDeadline(), t0 + seconds(20));
  s.Tick(t0 + seconds(21));
  ASSERT_TRUE(s.failed());
  EXPECT_EQ(s.fatal().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(s.fatal().message().find("not on node(s) 1"), std::string::npos);
}

TEST_F(CoordinatorStateTest, SilentNodeFailsTheJob) {
  CoordinatorState s = Make(2);
  s.Polled(1, 0, t0);
  s.Tick(t0 + seconds(5));
  EXPECT_FALSE(s.failed());
  s.Tick(t0 + seconds(11));
  ASSERT_TRUE(s.failed());
  EXPECT_NE(s.fatal().message().find("node 1"), std::string::npos);
}

// A lost node is named with the address it joined from (issue 16, D4).
TEST_F(CoordinatorStateTest, ALostNodeIsNamedWithItsAddress) {
  CoordinatorState s = Make(3);
  s.SetAddress(2, "10.0.0.3");
  s.Polled(1, 0, t0);
  s.Polled(2, 0, t0);
  s.Polled(1, 0, t0 + seconds(9));
  s.Tick(t0 + seconds(11));
  ASSERT_TRUE(s.failed());
  EXPECT_NE(s.fatal().message().find("node 2 (10.0.0.3) has not contacted the coordinator"),
            std::string::npos)
      << s.fatal().message();
}

TEST_F(CoordinatorStateTest, LeavingNodeFailsTheJob) {
  CoordinatorState s = Make(2);
  s.Leave(1);
  ASSERT_TRUE(s.failed());
  EXPECT_NE(s.fatal().message().find("node 1"), std::string::npos);
}

TEST_F(CoordinatorStateTest, EntriesEveryNodeReceivedAreTrimmed) {
  CoordinatorState s = Make(2);
  uint32_t slot = s.Report(0, {Grad("w", {1})}, {New(0)}, t0)->front();
  ASSERT_TRUE(s.Report(1, {Grad("w", {1})}, {New(0)}, t0).ok());
  for (int round = 0; round < 10; ++round) {
    ASSERT_TRUE(s.Report(0, {}, {Slot(slot)}, t0).ok());
    ASSERT_TRUE(s.Report(1, {}, {Slot(slot)}, t0).ok());
  }
  EXPECT_EQ(s.retained_entries(), 11u);
  s.Polled(0, 11, t0);
  EXPECT_EQ(s.retained_entries(), 11u) << "node 1 has not received them yet";
  s.Polled(1, 8, t0);
  EXPECT_EQ(s.retained_entries(), 3u);
  EXPECT_EQ(s.EntriesAfter(8).size(), 3u);
}

TEST_F(CoordinatorStateTest, ReportingTwiceInOneRoundIsAnError) {
  CoordinatorState s = Make(2);
  uint32_t slot = s.Report(0, {Grad("w", {1})}, {New(0)}, t0)->front();
  ASSERT_TRUE(s.Report(0, {}, {Slot(slot)}, t0).ok());
  EXPECT_TRUE(s.failed());
}


// ---- Process sets ----

TensorMeta InSet(const std::string& name, CollectiveOp op, std::vector<int32_t> members) {
  TensorMeta m;
  m.name = name;
  m.op = op;
  m.shape = {3};
  m.members = std::move(members);
  return m;
}

// The job failed with a message that holds `phrase`.
void ExpectFailedWith(const CoordinatorState& s, const std::string& phrase) {
  ASSERT_TRUE(s.failed());
  EXPECT_NE(s.fatal().message().find(phrase), std::string::npos) << s.fatal().message();
}

CoordinatorState MakeWithWorkers(int nodes, int local_size) {
  CoordinatorOptions o;
  o.num_nodes = nodes;
  o.local_size = local_size;
  o.cycle = milliseconds(0);
  o.stall_warn = seconds(5);
  o.timeout = seconds(20);
  return CoordinatorState(o);
}

// Ranks 1 and 4 of 3 nodes x 2 workers live on nodes 0 and 2: the tensor is scheduled once those
// two report it, node 1 never does, and the entry carries the metadata node 1 never saw.
TEST(CoordinatorProcessSetTest, WaitsForTheMembersNodesOnlyAndSendsTheMetadata) {
  CoordinatorState s = MakeWithWorkers(3, 2);
  const TensorMeta m = InSet("ps1/sum", CollectiveOp::kAllReduce, {1, 4});
  const auto t0 = Clock::now();
  ASSERT_TRUE(s.Report(0, {m}, {New(0)}, t0).ok());
  EXPECT_TRUE(s.EntriesAfter(0).empty());
  ASSERT_TRUE(s.Report(2, {m}, {New(0)}, t0).ok());
  auto entries = s.EntriesAfter(0);
  ASSERT_EQ(entries.size(), 1u);
  ASSERT_EQ(entries[0].group.size(), 1u);
  ASSERT_NE(entries[0].group[0].meta, nullptr);
  EXPECT_EQ(*entries[0].group[0].meta, m);
}

TEST(CoordinatorProcessSetTest, AllGatherSizesAreTheMembersInRankOrder) {
  CoordinatorState s = MakeWithWorkers(2, 2);
  const TensorMeta m = InSet("ps1/g", CollectiveOp::kAllGather, {0, 1, 3});
  const auto t0 = Clock::now();
  ReportedReady node1 = New(0);
  node1.worker_dim0 = {7};
  ReportedReady node0 = New(0);
  node0.worker_dim0 = {2, 5};
  ASSERT_TRUE(s.Report(1, {m}, {node1}, t0).ok());
  ASSERT_TRUE(s.Report(0, {m}, {node0}, t0).ok());
  auto entries = s.EntriesAfter(0);
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].group[0].worker_dim0, (std::vector<int64_t>{2, 5, 7}));
}

// A set's tensors are not fused with the job's or with each other: each node's share differs.
TEST(CoordinatorProcessSetTest, SetTensorsTravelAlone) {
  CoordinatorState s = MakeWithWorkers(2, 1);
  const TensorMeta a = InSet("ps1/a", CollectiveOp::kAllReduce, {0, 1});
  const TensorMeta b = InSet("ps1/b", CollectiveOp::kAllReduce, {0, 1});
  TensorMeta global = a;
  global.name = "c";
  global.members.clear();
  const auto t0 = Clock::now();
  for (int node : {0, 1}) {
    ASSERT_TRUE(s.Report(node, {a, b, global}, {New(0), New(1), New(2)}, t0).ok());
  }
  auto entries = s.EntriesAfter(0);
  ASSERT_EQ(entries.size(), 3u);
  for (const auto& e : entries) EXPECT_EQ(e.group.size(), 1u);
}

TEST(CoordinatorProcessSetTest, RefusesReportsFromOutsideTheSetAndRanksPastTheJob) {
  CoordinatorState s = MakeWithWorkers(3, 2);
  const auto t0 = Clock::now();
  auto outside = s.Report(1, {InSet("ps1/x", CollectiveOp::kAllReduce, {0, 5})}, {New(0)}, t0);
  ASSERT_FALSE(outside.ok());
  EXPECT_NE(outside.status().message().find("no rank on it"), std::string::npos);
  auto past = s.Report(0, {InSet("ps1/y", CollectiveOp::kAllReduce, {0, 6})}, {New(0)}, t0);
  ASSERT_FALSE(past.ok());
  EXPECT_NE(past.status().message().find("job of 6 workers"), std::string::npos);
  EXPECT_FALSE(s.failed()) << "a malformed report is refused, not the job's end";
  // A known slot reported later by a node outside its set is refused too.
  uint32_t slot =
      s.Report(0, {InSet("ps1/z", CollectiveOp::kAllReduce, {0, 5})}, {New(0)}, t0)->front();
  EXPECT_FALSE(s.Report(1, {}, {Slot(slot)}, t0).ok());
}

// The stall names the members' nodes that did not post, never a node outside the set.
TEST(CoordinatorProcessSetTest, TimeoutNamesOnlyTheMembersNodes) {
  CoordinatorState s = MakeWithWorkers(4, 1);
  const auto t0 = Clock::now();
  ASSERT_TRUE(s.Report(0, {InSet("ps1/late", CollectiveOp::kAllReduce, {0, 2})}, {New(0)}, t0).ok());
  for (int n = 1; n < 4; ++n) s.Polled(n, 0, t0 + seconds(21));
  s.Tick(t0 + seconds(21));
  ExpectFailedWith(s, "posted on node(s) 0 but not on node(s) 2 within");
}


// ---- Grouped collectives ----

TensorMeta InGroup(const std::string& name, uint64_t key, uint32_t size) {
  TensorMeta m;
  m.name = name;
  m.op = CollectiveOp::kAllReduce;
  m.shape = {4};
  m.group = key;
  m.group_size = size;
  return m;
}

// A group's tensors are scheduled as one: none before the last is ready on every node, then all
// in one fused entry.
TEST(CoordinatorGroupTest, NoTensorOfAGroupIsScheduledBeforeAllAreReady) {
  CoordinatorState s = MakeWithWorkers(2, 1);
  const auto t0 = Clock::now();
  const TensorMeta a = InGroup("g.0", 77, 2), b = InGroup("g.1", 77, 2);
  for (int node : {0, 1}) ASSERT_TRUE(s.Report(node, {a}, {New(0)}, t0).ok());
  s.Tick(t0 + milliseconds(50));
  EXPECT_TRUE(s.EntriesAfter(0).empty()) << "the group's first tensor went ahead alone";
  ASSERT_TRUE(s.Report(0, {b}, {New(0)}, t0).ok());
  EXPECT_TRUE(s.EntriesAfter(0).empty());
  ASSERT_TRUE(s.Report(1, {b}, {New(0)}, t0).ok());
  auto entries = s.EntriesAfter(0);
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].group.size(), 2u) << "fused: same op, dtype and reduce op";
  // The next round of the group is held again.
  ASSERT_TRUE(s.Report(0, {}, {Slot(entries[0].group[0].slot)}, t0).ok());
  ASSERT_TRUE(s.Report(1, {}, {Slot(entries[0].group[0].slot)}, t0).ok());
  EXPECT_EQ(s.EntriesAfter(0).size(), 1u);
}

TEST(CoordinatorGroupTest, AGroupThatNeverCompletesTimesOutNamingIt) {
  CoordinatorState s = MakeWithWorkers(1, 1);
  const auto t0 = Clock::now();
  ASSERT_TRUE(s.Report(0, {InGroup("g.0", 5, 3)}, {New(0)}, t0).ok());
  s.Tick(t0 + seconds(21));
  ExpectFailedWith(s, "'g.0' is one of a group of 3 of which only 1");
}

TEST(CoordinatorGroupTest, AMalformedGroupFromAnotherNodeIsRefused) {
  CoordinatorState s = MakeWithWorkers(2, 1);
  const auto t0 = Clock::now();
  EXPECT_FALSE(s.Report(1, {InGroup("g.0", 5, 1)}, {New(0)}, t0).ok());
  EXPECT_FALSE(s.Report(1, {InGroup("g.0", 0, 2)}, {New(0)}, t0).ok());
  TensorMeta grad = InGroup("g.0", 5, 2);
  grad.op = CollectiveOp::kGradient;
  EXPECT_FALSE(s.Report(1, {grad}, {New(0)}, t0).ok());
  EXPECT_FALSE(s.failed());
}


// ---- hvd.join() ----

TensorMeta Explicit(const std::string& name, CollectiveOp op = CollectiveOp::kAllReduce) {
  TensorMeta m;
  m.name = name;
  m.op = op;
  m.shape = {2};
  return m;
}

// A tensor no longer waits for a node whose every rank joined; the entry carries its metadata.
TEST(CoordinatorJoinTest, AJoinedNodeIsNotWaitedFor) {
  CoordinatorState s = MakeWithWorkers(2, 2);
  const auto t0 = Clock::now();
  ASSERT_TRUE(s.Report(0, {Explicit("x")}, {New(0)}, t0).ok());
  ASSERT_TRUE(s.Joined(1, 2, t0).ok());
  EXPECT_TRUE(s.EntriesAfter(0).empty()) << "rank 3 of node 1 has not joined";
  ASSERT_TRUE(s.Joined(1, 3, t0).ok());
  auto entries = s.EntriesAfter(0);
  ASSERT_EQ(entries.size(), 1u);
  ASSERT_NE(entries[0].group[0].meta, nullptr);
  // A new tensor is scheduled at once from node 0 alone.
  ASSERT_TRUE(s.Report(0, {Explicit("y")}, {New(0)}, t0).ok());
  EXPECT_EQ(s.EntriesAfter(0).size(), 2u);
}

TEST(CoordinatorJoinTest, TheLastJoinEndsTheJoinNamingItsRank) {
  CoordinatorState s = MakeWithWorkers(2, 1);
  const auto t0 = Clock::now();
  ASSERT_TRUE(s.Joined(1, 1, t0).ok());
  ASSERT_TRUE(s.Joined(0, 0, t0).ok());
  auto entries = s.EntriesAfter(0);
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].join_last_rank, 0);
  EXPECT_TRUE(entries[0].group.empty());
  // Both take part again.
  ASSERT_TRUE(s.Report(0, {Explicit("z")}, {New(0)}, t0).ok());
  EXPECT_EQ(s.EntriesAfter(0).size(), 1u);
  ASSERT_TRUE(s.Report(1, {Explicit("z")}, {New(0)}, t0).ok());
  EXPECT_EQ(s.EntriesAfter(0).size(), 2u);
}

TEST(CoordinatorJoinTest, AnAllGatherGetsNoRowsFromAJoinedNode) {
  CoordinatorState s = MakeWithWorkers(2, 1);
  const auto t0 = Clock::now();
  ASSERT_TRUE(s.Joined(0, 0, t0).ok());
  ReportedReady r = New(0);
  r.worker_dim0 = {3};
  ASSERT_TRUE(s.Report(1, {Explicit("g", CollectiveOp::kAllGather)}, {r}, t0).ok());
  auto entries = s.EntriesAfter(0);
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].group[0].worker_dim0, (std::vector<int64_t>{0, 3}));
}

TEST(CoordinatorJoinTest, ABroadcastFromAJoinedRankFailsTheJob) {
  CoordinatorState s = MakeWithWorkers(2, 1);
  const auto t0 = Clock::now();
  ASSERT_TRUE(s.Joined(0, 0, t0).ok());
  TensorMeta b = Explicit("b", CollectiveOp::kBroadcast);
  b.root_rank = 0;
  ASSERT_TRUE(s.Report(1, {b}, {New(0)}, t0).ok());
  ExpectFailedWith(s, "which has called join()");
}

// A rank whose worker left, and has not come back within the grace period (5 s), fails the job
// for the first tensor that needs it (pending or reported later), naming the tensor and the
// rank, instead of at SPARSYNC_TIMEOUT_S (20 s here).
TEST(CoordinatorGoneTest, ATensorHeldByARankGoneForTheGracePeriodFailsTheJob) {
  CoordinatorState s = MakeWithWorkers(2, 2);
  const auto t0 = Clock::now();
  ASSERT_TRUE(s.Report(0, {Explicit("x")}, {New(0)}, t0).ok());
  ASSERT_TRUE(s.Gone(1, 3, t0 + seconds(1)).ok());
  EXPECT_EQ(s.NextDeadline(), t0 + seconds(5)) << "the stall warning comes first";
  s.Tick(t0 + seconds(5));
  EXPECT_EQ(s.NextDeadline(), t0 + seconds(6)) << "the end of rank 3's grace";
  s.Tick(t0 + milliseconds(5999));
  EXPECT_FALSE(s.failed());
  s.Tick(t0 + seconds(6));
  ExpectFailedWith(s, "tensor 'x' was posted on node(s) 0 but rank 3 on node 1 has left the job "
                      "without posting it");
  EXPECT_EQ(s.fatal().code(), StatusCode::kMismatch);
}

TEST(CoordinatorGoneTest, ATensorReportedAfterTheGracePeriodFailsTheJobAtOnce) {
  CoordinatorState s = MakeWithWorkers(2, 1);
  const auto t0 = Clock::now();
  // Both made "x"; rank 1 then ends, and rank 0 makes one more.
  ASSERT_TRUE(s.Report(0, {Explicit("x")}, {New(0)}, t0).ok());
  ASSERT_TRUE(s.Report(1, {Explicit("x")}, {New(0)}, t0).ok());
  ASSERT_TRUE(s.Gone(1, 1, t0).ok());
  EXPECT_FALSE(s.failed()) << "nothing needs rank 1 yet";
  EXPECT_FALSE(s.NextDeadline().has_value()) << "nothing waits for the grace period's end";
  ASSERT_TRUE(s.Report(0, {}, {Slot(1)}, t0 + seconds(7)).ok());
  ExpectFailedWith(s, "rank 1 on node 1 has left the job without posting it");
}

// A worker that shuts down and initialises again within the grace period holds nothing up.
TEST(CoordinatorGoneTest, ARankBackWithinTheGracePeriodTakesPartAgain) {
  CoordinatorState s = MakeWithWorkers(2, 1);
  const auto t0 = Clock::now();
  ASSERT_TRUE(s.Gone(1, 1, t0).ok());
  ASSERT_TRUE(s.Report(0, {Explicit("x")}, {New(0)}, t0).ok());
  ASSERT_TRUE(s.Back(1, 1).ok());
  s.Tick(t0 + seconds(6));
  EXPECT_FALSE(s.failed()) << s.fatal().message();
  ASSERT_TRUE(s.Report(1, {Explicit("x")}, {New(0)}, t0 + seconds(6)).ok());
  EXPECT_EQ(s.EntriesAfter(0).size(), 1u);
}

// What does not need the gone rank goes on: a process set without it, a tensor its node
// reported before it left.
TEST(CoordinatorGoneTest, OnlyTensorsThatNeedTheGoneRankFail) {
  CoordinatorState s = MakeWithWorkers(2, 2);
  const auto t0 = Clock::now();
  ASSERT_TRUE(s.Report(1, {Explicit("before")}, {New(0)}, t0).ok());
  ASSERT_TRUE(s.Gone(1, 3, t0).ok());
  const auto later = t0 + seconds(6);
  ASSERT_TRUE(s.Report(0, {Explicit("before")}, {New(0)}, later).ok());
  ASSERT_TRUE(s.Report(0, {InSet("set", CollectiveOp::kAllReduce, {0, 2})}, {New(0)}, later).ok());
  s.Tick(later);
  EXPECT_FALSE(s.failed()) << s.fatal().message();
  EXPECT_EQ(s.EntriesAfter(0).size(), 1u) << "'before'; 'set' waits for rank 2 on node 1";
  EXPECT_FALSE(s.Gone(0, 3, t0).ok()) << "rank 3 is not node 0's";
}

// Daemons may serve one run after another: once every rank has left, the next run's workers
// connect in any order and a tensor the first of them posts waits for the others.
TEST(CoordinatorGoneTest, WhenEveryRankHasLeftTheNextRunStartsAfresh) {
  CoordinatorState s = MakeWithWorkers(2, 1);
  const auto t0 = Clock::now();
  ASSERT_TRUE(s.Gone(1, 1, t0).ok());
  ASSERT_TRUE(s.Gone(0, 0, t0).ok());
  ASSERT_TRUE(s.Back(0, 0).ok());
  const auto next_run = t0 + seconds(6);
  ASSERT_TRUE(s.Report(0, {Explicit("x")}, {New(0)}, next_run).ok());
  s.Tick(next_run);
  EXPECT_FALSE(s.failed()) << s.fatal().message();
  ASSERT_TRUE(s.Report(1, {Explicit("x")}, {New(0)}, next_run).ok());
  EXPECT_EQ(s.EntriesAfter(0).size(), 1u);
}

TEST(CoordinatorGoneTest, LeavingWhileOthersWaitInJoinFailsTheJob) {
  CoordinatorState s = MakeWithWorkers(2, 1);
  const auto t0 = Clock::now();
  ASSERT_TRUE(s.Joined(0, 0, t0).ok());
  ASSERT_TRUE(s.Gone(1, 1, t0).ok());
  s.Tick(t0 + seconds(5));
  ExpectFailedWith(s, "rank 1 on node 1 has left the job while rank(s) 0 wait in join()");
  // ... and joining after it left.
  CoordinatorState later = MakeWithWorkers(3, 1);
  ASSERT_TRUE(later.Gone(2, 2, t0).ok());
  ASSERT_TRUE(later.Joined(1, 1, t0 + seconds(5)).ok());
  ExpectFailedWith(later, "rank 2 on node 2 has left the job while rank(s) 1 wait in join()");
}

TEST(CoordinatorJoinTest, ARankJoinsOnlyFromItsNodeAndOnce) {
  CoordinatorState s = MakeWithWorkers(2, 2);
  const auto t0 = Clock::now();
  EXPECT_FALSE(s.Joined(0, 2, t0).ok());
  ASSERT_TRUE(s.Joined(0, 1, t0).ok());
  EXPECT_FALSE(s.Joined(0, 1, t0).ok());
  EXPECT_FALSE(s.failed());
}

}  // namespace
}  // namespace sparsync::negotiation
