// NodeAgent against a scripted coordinator (FakeLink: records every call, answers as told):
// reports batch while one is in flight and never block the caller, the schedule comes out in
// order without duplicates, plan announcements are taken out and groups checked against their
// plan, and a coordinator that cannot be reached becomes one fatal entry, never a hang.
// NodeAgentSlotTest: the agent is the one owner of slot -> name; it names every group tensor,
// also one whose slot is still on its way in a report's answer.
#include "daemon/negotiation/node_agent.h"

#include <gtest/gtest.h>

#include <thread>

#include "tests/unit/daemon/negotiation/test_util.h"

namespace sparsync::negotiation {
namespace {

using namespace std::chrono_literals;
using testing::Contains;
using testing::Meta;
using testing::SecondsSince;

constexpr int kRank = 1;

class FakeLink : public CoordinatorLink {
 public:
  struct ReportCall {
    std::vector<TensorMeta> new_tensors;
    std::vector<ReportedReady> ready;
    std::thread::id thread;
    RankNews ranks;
  };

  Status Join(const JoinInfo&, std::chrono::milliseconds) override { return Status::Ok(); }
  Status StoreSet(const std::string&, const std::string&) override { return Status::Ok(); }
  Result<std::vector<std::string>> StoreGet(const std::vector<std::string>&,
                                            std::chrono::milliseconds) override {
    return Unavailable("not scripted");
  }

  // Answers with the next scripted answer, else with fresh slots as the coordinator would.
  // While held, waits (up to 5 s) before answering.
  using CoordinatorLink::Report;
  Result<std::vector<uint32_t>> Report(int node, const std::vector<TensorMeta>& new_tensors,
                                       const std::vector<ReportedReady>& ready,
                                       const RankNews& ranks) override {
    std::unique_lock lock(mu_);
    EXPECT_EQ(node, kRank);
    reports_.push_back({new_tensors, ready, std::this_thread::get_id(), ranks});
    changed_.notify_all();
    changed_.wait_for(lock, 5s, [&] { return !hold_reports_; });
    if (!report_answers_.empty()) {
      auto answer = std::move(report_answers_.front());
      report_answers_.pop_front();
      return answer;
    }
    std::vector<uint32_t> slots;
    for (size_t i = 0; i < new_tensors.size(); ++i) slots.push_back(next_slot_++);
    return slots;
  }

  // The next scripted answer; none: waits a little (at most `wait`) and returns no entries.
  Result<std::vector<ScheduleEntry>> Poll(int node, uint64_t after_seq,
                                          std::chrono::milliseconds wait) override {
    std::unique_lock lock(mu_);
    EXPECT_EQ(node, kRank);
    poll_afters_.push_back(after_seq);
    if (!poll_error_.ok()) return poll_error_;
    changed_.wait_for(lock, std::min<std::chrono::milliseconds>(wait, 20ms),
                      [&] { return !poll_answers_.empty(); });
    if (poll_answers_.empty()) return std::vector<ScheduleEntry>{};
    auto answer = std::move(poll_answers_.front());
    poll_answers_.pop_front();
    return answer;
  }

  Status Fail(int node, const Status& error) override {
    std::lock_guard lock(mu_);
    fails_.push_back({node, error});
    return fail_answer_;
  }
  Status Leave(int node) override {
    std::lock_guard lock(mu_);
    leaves_.push_back(node);
    return Status::Ok();
  }

  // Script.
  void PushReportAnswer(Result<std::vector<uint32_t>> answer) {
    std::lock_guard lock(mu_);
    report_answers_.push_back(std::move(answer));
  }
  void PushPollAnswer(Result<std::vector<ScheduleEntry>> answer) {
    {
      std::lock_guard lock(mu_);
      poll_answers_.push_back(std::move(answer));
    }
    changed_.notify_all();
  }
  void FailEveryPoll(Status error) {
    std::lock_guard lock(mu_);
    poll_error_ = std::move(error);
  }
  void HoldReports(bool hold) {
    {
      std::lock_guard lock(mu_);
      hold_reports_ = hold;
    }
    changed_.notify_all();
  }
  void AnswerFailWith(Status st) {
    std::lock_guard lock(mu_);
    fail_answer_ = std::move(st);
  }

  // Records.
  bool WaitForReports(size_t n) {
    std::unique_lock lock(mu_);
    return changed_.wait_for(lock, 5s, [&] { return reports_.size() >= n; });
  }
  std::vector<ReportCall> reports() {
    std::lock_guard lock(mu_);
    return reports_;
  }
  std::vector<uint64_t> poll_afters() {
    std::lock_guard lock(mu_);
    return poll_afters_;
  }
  std::vector<std::pair<int, Status>> fails() {
    std::lock_guard lock(mu_);
    return fails_;
  }
  std::vector<int> leaves() {
    std::lock_guard lock(mu_);
    return leaves_;
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  std::deque<Result<std::vector<uint32_t>>> report_answers_;
  std::deque<Result<std::vector<ScheduleEntry>>> poll_answers_;
  Status poll_error_;
  Status fail_answer_;
  bool hold_reports_ = false;
  uint32_t next_slot_ = 1;
  std::vector<ReportCall> reports_;
  std::vector<uint64_t> poll_afters_;
  std::vector<std::pair<int, Status>> fails_;
  std::vector<int> leaves_;
};

ReadyTensor Ready(TensorMeta meta, std::vector<int64_t> dims = {}, int64_t ready_ns = 0) {
  ReadyTensor r;
  r.meta = std::move(meta);
  r.worker_dim0 = std::move(dims);
  r.ready_ns = ready_ns;
  return r;
}

ScheduleEntry Group(uint64_t seq, std::vector<uint32_t> slots, uint32_t plan_version = 0,
                    uint32_t group_index = 0) {
  ScheduleEntry e;
  e.seq = seq;
  for (uint32_t s : slots) e.group.push_back({s, {}, {}, nullptr});
  e.plan_version = plan_version;
  e.group_index = group_index;
  return e;
}

ScheduleEntry Plan(uint64_t seq, uint32_t version, std::vector<std::vector<uint32_t>> groups) {
  PlanInfo p;
  p.version = version;
  p.planner = "omgs";
  p.groups = std::move(groups);
  ScheduleEntry e;
  e.seq = seq;
  e.plan = std::make_shared<const PlanInfo>(std::move(p));
  return e;
}

// Calls Next until `n` entries came or `timeout` passed.
std::vector<ScheduleEntry> Collect(NodeAgent& agent, size_t n, std::chrono::milliseconds timeout) {
  std::vector<ScheduleEntry> out;
  auto start = std::chrono::steady_clock::now();
  while (out.size() < n && SecondsSince(start) < timeout.count() / 1000.0) {
    for (auto& e : agent.Next(50ms)) out.push_back(std::move(e));
  }
  return out;
}

std::vector<uint64_t> Seqs(const std::vector<ScheduleEntry>& entries) {
  std::vector<uint64_t> seqs;
  for (const auto& e : entries) seqs.push_back(e.seq);
  return seqs;
}

class NodeAgentTest : public ::testing::Test {
 protected:
  // The agent observes the node's failure, as daemon.cc wires it.
  NodeAgentTest() {
    failure_.Observe([this](const Status& e, JobFailure::Source s) {
      if (agent_) agent_->OnFailure(e, s);
    });
  }
  std::unique_ptr<NodeAgent> Make(bool direct, std::chrono::milliseconds give_up_after = 10s,
                                  std::chrono::milliseconds hold_limit =
                                      NodeAgent::kDefaultHoldLimit) {
    auto agent = std::make_unique<NodeAgent>(&link_, kRank, direct, &failure_, give_up_after,
                                             nullptr, hold_limit);
    agent_ = agent.get();
    agent->Start();
    return agent;
  }
  // Reports tensors t1 .. tn, which the fake coordinator gives slots 1 .. n: the schedule may
  // then name those slots (an entry that comes first waits for the answers).
  void Know(NodeAgent& agent, uint32_t n) {
    for (uint32_t i = 1; i <= n; ++i) agent.Report(Ready(Meta("t" + std::to_string(i), {1})));
  }
  // Names of the group tensors of the entries Next hands out for `entries` (a fatal entry: its
  // message).
  std::vector<std::string> Named(NodeAgent& agent, std::vector<ScheduleEntry> entries) {
    const size_t n = entries.size();
    link_.PushPollAnswer(std::move(entries));
    std::vector<std::string> names;
    for (const ScheduleEntry& e : Collect(agent, n, 5s)) {
      if (!e.fatal.ok()) names.push_back("fatal: " + e.fatal.message());
      for (const GroupTensor& t : e.group) names.push_back(t.name);
    }
    return names;
  }
  FakeLink link_;
  JobFailure failure_;
  NodeAgent* agent_ = nullptr;  // the one Make made last
};

// Rank news rides with the tensors, in the batch of its time; a rank that went and came back
// while a report was in flight is in neither list of the next (the coordinator applies returns
// before departures, so it would otherwise stay gone).
TEST_F(NodeAgentTest, RankNewsIsBatchedAndAReturnCancelsADepartureInTheSameBatch) {
  auto agent = Make(/*direct=*/false);
  link_.HoldReports(true);
  agent->ReportRank(RankEvent::kGone, 2);
  ASSERT_TRUE(link_.WaitForReports(1));
  agent->ReportRank(RankEvent::kJoined, 3);
  agent->ReportRank(RankEvent::kBack, 2);  // came back from the departure in flight
  agent->ReportRank(RankEvent::kGone, 3);
  agent->ReportRank(RankEvent::kGone, 2);
  agent->ReportRank(RankEvent::kBack, 2);  // ... and went and came back again
  link_.HoldReports(false);
  ASSERT_TRUE(link_.WaitForReports(2));
  agent->Stop();
  auto reports = link_.reports();
  ASSERT_EQ(reports.size(), 2u);
  EXPECT_EQ(reports[0].ranks.gone, std::vector<int32_t>{2});
  EXPECT_TRUE(reports[0].ranks.back.empty());
  const RankNews& next = reports[1].ranks;
  EXPECT_EQ(next.joined, std::vector<int32_t>{3});
  EXPECT_EQ(next.back, std::vector<int32_t>{2});
  EXPECT_EQ(next.gone, std::vector<int32_t>{3});
  EXPECT_TRUE(reports[1].ready.empty());
}

TEST_F(NodeAgentTest, ReportsQueueIntoOneBatchWhileOneIsInFlight) {
  auto agent = Make(/*direct=*/false);
  link_.HoldReports(true);
  agent->Report(Ready(Meta("a", {4})));
  ASSERT_TRUE(link_.WaitForReports(1));
  auto start = std::chrono::steady_clock::now();
  agent->Report(Ready(Meta("b", {2, 3}, CollectiveOp::kAllGather), {2, 5}, 1234));
  agent->Report(Ready(Meta("c", {1}), {}, 99));
  EXPECT_LT(SecondsSince(start), 1.0) << "Report blocked on the report in flight";
  link_.HoldReports(false);
  ASSERT_TRUE(link_.WaitForReports(2));
  agent->Stop();
  auto reports = link_.reports();
  ASSERT_EQ(reports.size(), 2u) << "b and c go together, after a";
  EXPECT_NE(reports[0].thread, std::this_thread::get_id());
  ASSERT_EQ(reports[0].new_tensors.size(), 1u);
  EXPECT_EQ(reports[0].new_tensors[0].name, "a");
  const auto& second = reports[1];
  ASSERT_EQ(second.new_tensors.size(), 2u);
  EXPECT_EQ(second.new_tensors[0], Meta("b", {2, 3}, CollectiveOp::kAllGather));
  EXPECT_EQ(second.new_tensors[1], Meta("c", {1}));
  ASSERT_EQ(second.ready.size(), 2u);
  EXPECT_EQ(second.ready[0].new_index, 0u);
  EXPECT_FALSE(second.ready[0].slot.has_value());
  EXPECT_EQ(second.ready[0].worker_dim0, (std::vector<int64_t>{2, 5}));
  EXPECT_EQ(second.ready[0].ready_ns, 1234);
  EXPECT_EQ(second.ready[1].new_index, 1u);
  EXPECT_EQ(second.ready[1].ready_ns, 99);
}

TEST_F(NodeAgentTest, DirectModeReportsOnTheCallersThread) {
  auto agent = Make(/*direct=*/true);
  agent->Report(Ready(Meta("a", {4})));
  auto reports = link_.reports();
  ASSERT_EQ(reports.size(), 1u) << "sent before Report returned";
  EXPECT_EQ(reports[0].thread, std::this_thread::get_id());
}

class NodeAgentModeTest : public NodeAgentTest, public ::testing::WithParamInterface<bool> {};

// Polls that overlap or repeat old entries: each seq is handed out once, in order, and the next
// poll asks for what comes after the highest one received.
TEST_P(NodeAgentModeTest, NextHandsEntriesInOrderAndDropsDuplicates) {
  auto agent = Make(GetParam());
  Know(*agent, 3);
  link_.PushPollAnswer(std::vector<ScheduleEntry>{Group(1, {1}), Group(2, {2, 3})});
  link_.PushPollAnswer(std::vector<ScheduleEntry>{Group(2, {2, 3}), Group(3, {1})});
  link_.PushPollAnswer(std::vector<ScheduleEntry>{Group(1, {1}), Group(4, {2, 3})});
  auto got = Collect(*agent, 4, 5s);
  EXPECT_EQ(Seqs(got), (std::vector<uint64_t>{1, 2, 3, 4}));
  EXPECT_EQ(testing::Describe(got[1]), "2:2,3");
  EXPECT_EQ(got[1].group[0].name, "t2") << "named by the agent";
  EXPECT_TRUE(agent->Next(60ms).empty()) << "nothing more";
  agent->Stop();
  std::vector<uint64_t> afters = link_.poll_afters();
  afters.erase(std::unique(afters.begin(), afters.end()), afters.end());
  EXPECT_EQ(afters, (std::vector<uint64_t>{0, 2, 3, 4}));
}

// The plan's dense choices (SPARSYNC_COMPRESS=auto) reach the executor with its groups: the
// agent marks each group of a plan as that plan says, the same on every node.
TEST_P(NodeAgentModeTest, GroupsCarryTheirPlansDenseChoice) {
  ScheduleEntry plan = Plan(1, 1, {{1, 2}, {3}});
  PlanInfo info = *plan.plan;
  info.dense = {false, true};
  plan.plan = std::make_shared<const PlanInfo>(std::move(info));
  link_.PushPollAnswer(std::vector<ScheduleEntry>{
      plan, Group(2, {1, 2}, 1, 0), Group(3, {3}, 1, 1), Group(4, {1, 2}),
      Plan(5, 2, {{1, 2, 3}}), Group(6, {1, 2, 3}, 2, 0)});
  auto agent = Make(GetParam());
  Know(*agent, 3);
  auto got = Collect(*agent, 4, 5s);
  ASSERT_EQ(Seqs(got), (std::vector<uint64_t>{2, 3, 4, 6}));
  std::vector<bool> dense;
  for (const auto& e : got) {
    EXPECT_TRUE(e.fatal.ok()) << testing::Describe(e);
    dense.push_back(e.dense);
  }
  EXPECT_EQ(dense, (std::vector<bool>{false, true, false, false}));
}

// Plan announcements are not handed out; a group that claims a plan must be that plan's group,
// else it becomes a fatal entry naming the entry, the group and the plan.
TEST_P(NodeAgentModeTest, PlansAreTakenOutAndGroupsCheckedAgainstThem) {
  link_.PushPollAnswer(std::vector<ScheduleEntry>{
      Plan(1, 1, {{1, 2}, {3}}), Group(2, {1, 2}, 1, 0), Group(3, {3}, 1, 1), Group(4, {5}),
      Group(5, {4}, 1, 1),  // the wrong slot
      Group(6, {1}, 1, 2),  // no such group
      Group(7, {3}, 2, 0),  // a plan never announced
      Plan(8, 2, {{3}, {1, 2}}), Group(9, {1, 2}, 2, 1),
      Group(10, {3, 4}, 2, 0),  // one slot too many
      Group(11, {1, 2}, 1, 0),  // the previous plan
  });
  auto agent = Make(GetParam());
  Know(*agent, 5);
  auto got = Collect(*agent, 9, 5s);
  ASSERT_EQ(Seqs(got), (std::vector<uint64_t>{2, 3, 4, 5, 6, 7, 9, 10, 11}));
  for (size_t i : {0, 1, 2, 6}) {
    EXPECT_TRUE(got[i].fatal.ok()) << testing::Describe(got[i]);
    EXPECT_FALSE(got[i].group.empty());
  }
  for (size_t i : {3, 4, 5, 7, 8}) {
    EXPECT_EQ(got[i].fatal.code(), StatusCode::kInternal) << testing::Describe(got[i]);
    EXPECT_TRUE(got[i].group.empty()) << "a mismatching group is not executed";
  }
  const std::string& msg = got[3].fatal.message();
  for (const char* part : {"schedule entry 5", "group 1 of plan v1", "node 1"}) {
    EXPECT_TRUE(Contains(msg, part)) << part << " in " << msg;
  }
  EXPECT_TRUE(Contains(got[5].fatal.message(), "plan v2")) << got[5].fatal.message();
}

// The timeline and the metrics hear of each plan as it reaches the executor, and each entry
// carries when this node received it.
TEST_P(NodeAgentModeTest, PlansReachTheObserverAndEntriesAreStamped) {
  class Plans : public observe::Observer {
   public:
    void OnGroup(const observe::GroupView&) override {}
    void OnPlan(const observe::PlanView& p) override {
      std::lock_guard lock(mu);
      seen.push_back(std::to_string(p.version) + " " + std::string(p.planner) + " " +
                     std::to_string(p.groups));
    }
    std::mutex mu;
    std::vector<std::string> seen;
  } plans;
  link_.PushPollAnswer(std::vector<ScheduleEntry>{Plan(1, 1, {{1, 2}, {3}}),
                                                  Group(2, {1, 2}, 1, 0)});
  const auto before = std::chrono::steady_clock::now();
  auto agent = std::make_unique<NodeAgent>(&link_, kRank, GetParam(), &failure_, 10s, &plans);
  agent_ = agent.get();
  agent->Start();
  Know(*agent, 3);
  auto got = Collect(*agent, 1, 5s);
  agent->Stop();
  ASSERT_EQ(Seqs(got), std::vector<uint64_t>{2});
  EXPECT_GE(got[0].received_ns, std::chrono::duration_cast<std::chrono::nanoseconds>(
                                    before.time_since_epoch()).count());
  std::lock_guard lock(plans.mu);
  EXPECT_EQ(plans.seen, std::vector<std::string>{"1 omgs 2"});
}

INSTANTIATE_TEST_SUITE_P(RemoteAndDirect, NodeAgentModeTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Direct" : "Remote"; });

// Polls that keep failing for longer than give_up_after become exactly one fatal entry, and the
// job's failure (the coordinator cannot be told: kUnreported).
TEST_F(NodeAgentTest, UnreachableCoordinatorBecomesOneFatalEntry) {
  link_.FailEveryPoll(Unavailable("polling the coordinator: connection refused"));
  auto start = std::chrono::steady_clock::now();
  auto agent = Make(/*direct=*/false, /*give_up_after=*/500ms);
  auto got = Collect(*agent, 1, 5s);
  const double took = SecondsSince(start);
  for (auto& e : Collect(*agent, 1, 600ms)) got.push_back(std::move(e));  // nothing more
  ASSERT_EQ(got.size(), 1u);
  EXPECT_GE(took, 0.5) << "gave up before give_up_after";
  EXPECT_EQ(failure_.status().message(), got[0].fatal.message());
  EXPECT_TRUE(link_.fails().empty()) << "a lost coordinator is not told";
  EXPECT_EQ(got[0].fatal.code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(got[0].fatal.message(), "lost the coordinator on node 0"));
  EXPECT_TRUE(Contains(got[0].fatal.message(), "connection refused")) << got[0].fatal.message();
  EXPECT_GE(link_.poll_afters().size(), 3u) << "kept retrying";
}

TEST_F(NodeAgentTest, FailuresShorterThanGiveUpAfterAreRiddenOut) {
  auto agent = Make(/*direct=*/false, /*give_up_after=*/2s);
  Know(*agent, 1);
  link_.PushPollAnswer(Unavailable("blip"));
  link_.PushPollAnswer(Unavailable("blip"));
  link_.PushPollAnswer(std::vector<ScheduleEntry>{Group(1, {1})});
  auto got = Collect(*agent, 1, 5s);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(got[0].fatal.ok()) << got[0].fatal.ToString();
  EXPECT_EQ(got[0].seq, 1u);
}

// Node 0's own shutdown is the coordinator's last entry: the agent stops polling there, so a
// server that goes a moment later (every daemon stops at the end of a job) is no failure here.
TEST_F(NodeAgentTest, PollingEndsWithTheCoordinatorsOwnShutdown) {
  auto agent = Make(/*direct=*/false, /*give_up_after=*/300ms);
  ScheduleEntry last;
  last.seq = 4;
  last.fatal = ShutdownReason(0);
  link_.PushPollAnswer(std::vector<ScheduleEntry>{last});
  auto got = Collect(*agent, 1, 5s);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(IsShutdownReason(got[0].fatal, 0)) << got[0].fatal.ToString();
  link_.FailEveryPoll(Unavailable("polling the coordinator: CANCELLED"));
  const size_t polls = link_.poll_afters().size();
  got = Collect(*agent, 1, 700ms);
  EXPECT_TRUE(got.empty()) << "nothing follows node 0's shutdown: " << got[0].fatal.ToString();
  EXPECT_EQ(link_.poll_afters().size(), polls) << "polled after node 0's shutdown";
  EXPECT_FALSE(failure_.failed()) << failure_.status().ToString();
  // Another node's shutdown is not the coordinator's: the agent goes on polling.
  auto other = Make(/*direct=*/false);
  last.fatal = ShutdownReason(2);
  link_.FailEveryPoll(Status::Ok());
  link_.PushPollAnswer(std::vector<ScheduleEntry>{last});
  ASSERT_EQ(Collect(*other, 1, 5s).size(), 1u);
  const size_t after_other = link_.poll_afters().size();
  std::this_thread::sleep_for(100ms);
  EXPECT_GT(link_.poll_afters().size(), after_other);
  other->Stop();
  agent->Stop();
}

// The node's failure goes to the coordinator once, the first one; when the coordinator cannot be
// told, a fatal entry ends the exchange here.
TEST_F(NodeAgentTest, FailThatCannotReachTheCoordinatorFailsLocally) {
  link_.AnswerFailWith(Unavailable("reporting a failure to the coordinator: connection refused"));
  auto agent = Make(/*direct=*/false);
  failure_.Fail(Mismatch("worker 2 posted 'w' with shape [3]"), JobFailure::Source::kLocal);
  failure_.Fail(Internal("a second failure"), JobFailure::Source::kLocal);
  auto got = Collect(*agent, 2, 300ms);
  ASSERT_EQ(got.size(), 1u) << "one fatal entry";
  EXPECT_EQ(got[0].fatal.code(), StatusCode::kMismatch);
  EXPECT_EQ(got[0].fatal.message(), "worker 2 posted 'w' with shape [3]");
  auto fails = link_.fails();
  ASSERT_EQ(fails.size(), 1u) << "the first failure is the job's";
  EXPECT_EQ(fails[0].first, kRank);
  EXPECT_EQ(fails[0].second.message(), "worker 2 posted 'w' with shape [3]");
}

// Failures the node did not find itself are not reported back.
TEST_F(NodeAgentTest, OnlyTheNodesOwnFailuresGoToTheCoordinator) {
  auto agent = Make(/*direct=*/false);
  for (auto source : {JobFailure::Source::kCoordinator, JobFailure::Source::kUnreported}) {
    agent->OnFailure(Aborted("not this node's news"), source);
  }
  EXPECT_TRUE(link_.fails().empty());
  EXPECT_TRUE(Collect(*agent, 1, 100ms).empty());
}

// A daemon that stops tells the coordinator why, so that every node fails its collectives with
// the stopping node's reason instead of a broken connection (issue 16, item 5).
TEST_F(NodeAgentTest, AShutdownIsReportedToTheCoordinator) {
  auto agent = Make(/*direct=*/false);
  failure_.Fail(Aborted("the daemon of node 1 is shutting down"), JobFailure::Source::kShutdown);
  auto fails = link_.fails();
  ASSERT_EQ(fails.size(), 1u);
  EXPECT_EQ(fails[0].first, kRank);
  EXPECT_EQ(fails[0].second.message(), "the daemon of node 1 is shutting down");
}

TEST_F(NodeAgentTest, FailThatReachesTheCoordinatorWaitsForItsEntry) {
  auto agent = Make(/*direct=*/false);
  failure_.Fail(Internal("worker died"), JobFailure::Source::kLocal);
  EXPECT_TRUE(Collect(*agent, 1, 150ms).empty()) << "the coordinator's fatal entry will come";
  ASSERT_EQ(link_.fails().size(), 1u);
  EXPECT_EQ(link_.fails()[0].second.code(), StatusCode::kInternal);
  agent->Leave();
  EXPECT_EQ(link_.leaves(), std::vector<int>{kRank});
}

// A refused report: ABORTED means the job already failed and the coordinator's fatal entry
// follows; anything else fails the job here.
TEST_F(NodeAgentTest, ARefusedReportFailsTheJobUnlessItAlreadyFailed) {
  auto agent = Make(/*direct=*/true);
  link_.PushReportAnswer(Aborted("the job failed"));
  agent->Report(Ready(Meta("a", {1})));
  EXPECT_TRUE(agent->Next(30ms).empty());
  EXPECT_FALSE(failure_.failed());
  link_.PushReportAnswer(InvalidArgument("unknown slot 9"));
  agent->Report(Ready(Meta("b", {1})));
  auto got = agent->Next(30ms);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].fatal.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(got[0].fatal.message(), "unknown slot 9");
  EXPECT_EQ(failure_.status().message(), "unknown slot 9");
}

TEST_F(NodeAgentTest, AnswerWithTheWrongNumberOfSlotsFailsTheJob) {
  auto agent = Make(/*direct=*/true);
  link_.PushReportAnswer(std::vector<uint32_t>{1, 2});
  agent->Report(Ready(Meta("a", {1})));
  auto got = agent->Next(30ms);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].fatal.code(), StatusCode::kInternal);
  EXPECT_TRUE(Contains(got[0].fatal.message(), "wrong number of slots"));
  EXPECT_EQ(Named(*agent, {Group(2, {1})}),
            std::vector<std::string>{"fatal: the schedule names slot 1 which node 1 never "
                                     "reported"})
      << "no slot learned from a malformed answer";
}

// Slots: the first report of a tensor carries its metadata, and the slot the coordinator answers
// names the tensor in the schedule; afterwards the agent sends the slot.
using NodeAgentSlotTest = NodeAgentTest;

TEST_F(NodeAgentSlotTest, FirstReportSendsMetadataAndTheAnsweredSlotNamesTheTensor) {
  auto agent = Make(/*direct=*/true);
  link_.PushReportAnswer(std::vector<uint32_t>{7});
  agent->Report(Ready(Meta("w", {4})));
  auto reports = link_.reports();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].new_tensors, std::vector<TensorMeta>{Meta("w", {4})});
  ASSERT_EQ(reports[0].ready.size(), 1u);
  EXPECT_EQ(reports[0].ready[0].new_index, 0u);
  EXPECT_EQ(Named(*agent, {Group(1, {7})}), std::vector<std::string>{"w"});
}

TEST_F(NodeAgentSlotTest, LaterReportsSendTheSlotInsteadOfMetadata) {
  auto agent = Make(/*direct=*/true);
  link_.PushReportAnswer(std::vector<uint32_t>{7});
  agent->Report(Ready(Meta("w", {4})));
  agent->Report(Ready(Meta("w", {4})));
  agent->Report(Ready(Meta("w", {4})));  // re-registered in between: still the same tensor
  auto reports = link_.reports();
  ASSERT_EQ(reports.size(), 3u);
  for (size_t i : {1, 2}) {
    EXPECT_TRUE(reports[i].new_tensors.empty()) << i;
    ASSERT_EQ(reports[i].ready.size(), 1u);
    EXPECT_EQ(reports[i].ready[0].slot, 7u) << i;
    EXPECT_FALSE(reports[i].ready[0].new_index.has_value());
  }
}

// The same name with another signature is another tensor to the coordinator.
TEST_F(NodeAgentSlotTest, ANewSignatureIsSentAsNewMetadata) {
  auto agent = Make(/*direct=*/true);
  link_.PushReportAnswer(std::vector<uint32_t>{7});
  link_.PushReportAnswer(std::vector<uint32_t>{8});
  agent->Report(Ready(Meta("w", {4})));
  agent->Report(Ready(Meta("w", {5})));
  auto reports = link_.reports();
  ASSERT_EQ(reports.size(), 2u);
  EXPECT_EQ(reports[1].new_tensors, std::vector<TensorMeta>{Meta("w", {5})});
  EXPECT_EQ(Named(*agent, {Group(1, {7}), Group(2, {8})}), (std::vector<std::string>{"w", "w"}));
}

// One batch with a known tensor and a new one: metadata only for the new one, its index counted
// among the new tensors alone.
TEST_F(NodeAgentSlotTest, ABatchSendsMetadataOnlyForNewTensors) {
  auto agent = Make(/*direct=*/false);
  link_.PushReportAnswer(std::vector<uint32_t>{3});
  agent->Report(Ready(Meta("known", {2})));
  ASSERT_TRUE(link_.WaitForReports(1));
  link_.HoldReports(true);
  agent->Report(Ready(Meta("other", {1})));  // in flight while the next two queue
  ASSERT_TRUE(link_.WaitForReports(2));
  agent->Report(Ready(Meta("known", {2})));
  agent->Report(Ready(Meta("new", {6})));
  link_.PushReportAnswer(std::vector<uint32_t>{4});
  link_.PushReportAnswer(std::vector<uint32_t>{5});
  link_.HoldReports(false);
  ASSERT_TRUE(link_.WaitForReports(3));
  EXPECT_EQ(Named(*agent, {Group(1, {3, 4, 5})}),
            (std::vector<std::string>{"known", "other", "new"}));
  agent->Stop();
  auto reports = link_.reports();
  ASSERT_EQ(reports.size(), 3u);
  const auto& batch = reports[2];
  EXPECT_EQ(batch.new_tensors, std::vector<TensorMeta>{Meta("new", {6})});
  ASSERT_EQ(batch.ready.size(), 2u);
  EXPECT_EQ(batch.ready[0].slot, 3u);
  EXPECT_EQ(batch.ready[1].new_index, 0u);
}

// The race the agent owns: the coordinator may schedule a slot before its answer to the report
// that names the tensor is back. The entry waits for that answer (no fixed wait), then is named.
TEST_P(NodeAgentModeTest, AnEntryWaitsForTheReportThatBringsItsSlot) {
  auto agent = Make(GetParam());
  link_.HoldReports(true);
  std::thread reporter([&] { agent->Report(Ready(Meta("late", {3}))); });  // direct mode blocks
  ASSERT_TRUE(link_.WaitForReports(1));
  link_.PushPollAnswer(std::vector<ScheduleEntry>{Group(1, {1})});  // slot 1: in the answer
  std::vector<ScheduleEntry> got;
  std::thread next([&] { got = Collect(*agent, 1, 5s); });
  std::this_thread::sleep_for(100ms);
  EXPECT_TRUE(got.empty()) << "named before its slot was known";
  link_.HoldReports(false);
  next.join();
  reporter.join();
  ASSERT_EQ(got.size(), 1u);
  ASSERT_TRUE(got[0].fatal.ok()) << got[0].fatal.ToString();
  ASSERT_EQ(got[0].group.size(), 1u);
  EXPECT_EQ(got[0].group[0].name, "late");
}

// Reports that follow the plan: t1 .. t5 have slots 1 .. 5 and the agent follows a plan whose
// group 0 is {1, 2, 3} and group 1 is {4}; t5 is outside it.
class NodeAgentHoldTest : public NodeAgentModeTest {
 protected:
  std::unique_ptr<NodeAgent> MakeWithPlan(std::chrono::milliseconds hold_limit) {
    auto agent = Make(GetParam(), 10s, hold_limit);
    Know(*agent, 5);
    Follow(*agent, Plan(1, 1, {{1, 2, 3}, {4}}), 2);
    known_ = link_.reports().size();
    return agent;
  }
  // Hands the agent `plan`; returns once the executor has passed it (the group after it came).
  void Follow(NodeAgent& agent, ScheduleEntry plan, uint64_t next_seq) {
    link_.PushPollAnswer(std::vector<ScheduleEntry>{std::move(plan), Group(next_seq, {5})});
    ASSERT_EQ(Collect(agent, 1, 5s).size(), 1u);
  }
  void Report(NodeAgent& agent, int tensor, int64_t ready_ns = 0) {
    agent.Report(Ready(Meta("t" + std::to_string(tensor), {1}), {}, ready_ns));
  }
  // The reports after those of Know, once they carry `n` tensors: each report's slots. (In
  // remote mode reports that queue while one is in flight go together.)
  std::vector<std::string> Sent(size_t n) {
    std::vector<std::string> out;
    auto start = std::chrono::steady_clock::now();
    while (SecondsSince(start) < 5) {
      out.clear();
      size_t tensors = 0;
      auto reports = link_.reports();
      for (size_t i = known_; i < reports.size(); ++i) {
        std::string slots;
        for (const ReportedReady& r : reports[i].ready) {
          slots += (slots.empty() ? "" : ",") + (r.slot ? std::to_string(*r.slot) : "new");
          ++tensors;
        }
        out.push_back(slots);
      }
      if (tensors >= n) break;
      std::this_thread::sleep_for(2ms);
    }
    return out;
  }
  std::string Joined(const std::vector<std::string>& reports) {
    std::string all;
    for (const std::string& r : reports) all += (all.empty() ? "" : ",") + r;
    return all;
  }
  size_t known_ = 0;
};

TEST_P(NodeAgentHoldTest, AGroupIsReportedOnceWhenItsLastTensorIsReady) {
  auto agent = MakeWithPlan(10s);
  Report(*agent, 1, 11);
  Report(*agent, 2, 12);
  Report(*agent, 4);  // a group of one: nothing to wait for
  Report(*agent, 5);  // outside the plan
  EXPECT_EQ(Joined(Sent(2)), "4,5");
  Report(*agent, 3, 13);
  EXPECT_EQ(Sent(5).back(), "1,2,3") << "one report";
  auto last = link_.reports().back().ready;
  EXPECT_EQ(last[0].ready_ns, 11) << "each tensor keeps its own ready time";
  EXPECT_EQ(last[2].ready_ns, 13);
  // The next round is held again.
  Report(*agent, 2);
  Report(*agent, 1);
  Report(*agent, 3);
  EXPECT_EQ(Sent(8).back(), "2,1,3");
  agent->Stop();
}

// A tensor that does not come: what is held goes after hold_limit, and the group's later
// members go one by one until it is complete; then the next round is held again.
TEST_P(NodeAgentHoldTest, WhatIsHeldTooLongGoesAndTheRestFollowAlone) {
  auto agent = MakeWithPlan(150ms);
  auto start = std::chrono::steady_clock::now();
  Report(*agent, 1);
  Report(*agent, 2);
  EXPECT_EQ(Sent(2), std::vector<std::string>{"1,2"});
  EXPECT_GE(SecondsSince(start), 0.15);
  EXPECT_LT(SecondsSince(start), 3.0);
  Report(*agent, 3);
  EXPECT_EQ(Sent(3).back(), "3") << "not held: its group was sent";
  Report(*agent, 1);
  Report(*agent, 2);
  Report(*agent, 3);
  EXPECT_EQ(Sent(6).back(), "1,2,3");
  agent->Stop();
}

// Rank news must follow the tensors reported before it: it takes what is held along, first.
TEST_P(NodeAgentHoldTest, RankNewsSendsWhatIsHeldFirst) {
  auto agent = MakeWithPlan(10s);
  Report(*agent, 1);
  agent->ReportRank(RankEvent::kJoined, 0);
  EXPECT_EQ(Sent(1), std::vector<std::string>{"1"});
  EXPECT_EQ(link_.reports().back().ranks.joined, std::vector<int32_t>{0});
  agent->Stop();
}

// A new plan sends what the previous one held, and holds by its own groups.
TEST_P(NodeAgentHoldTest, ANewPlanSendsWhatTheOldOneHeld) {
  auto agent = MakeWithPlan(10s);
  Report(*agent, 1);
  Report(*agent, 4);
  EXPECT_EQ(Sent(1), std::vector<std::string>{"4"});
  Follow(*agent, Plan(3, 2, {{1}, {2, 3, 4}}), 4);
  EXPECT_EQ(Sent(2).back(), "1");
  Report(*agent, 4);
  Report(*agent, 2);
  Report(*agent, 1);  // a group of one now
  EXPECT_EQ(Sent(3).back(), "1");
  Report(*agent, 3);
  EXPECT_EQ(Sent(6).back(), "4,2,3");
  agent->Stop();
}

// A tensor ready again before its group was complete: the round it started is not the plan's;
// what was held goes, and the tensor starts the next round.
TEST_P(NodeAgentHoldTest, ATensorReadyAgainSendsTheRoundBefore) {
  auto agent = MakeWithPlan(10s);
  Report(*agent, 1);
  Report(*agent, 1);
  EXPECT_EQ(Sent(1), std::vector<std::string>{"1"});
  Report(*agent, 2);
  Report(*agent, 3);
  EXPECT_EQ(Sent(4).back(), "1,2,3");
  agent->Stop();
}

INSTANTIATE_TEST_SUITE_P(RemoteAndDirect, NodeAgentHoldTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Direct" : "Remote"; });

// With no report in flight, a slot the agent never learned is the coordinator's error, at once.
TEST_F(NodeAgentSlotTest, ASlotNeverReportedIsAFatalEntry) {
  auto agent = Make(/*direct=*/false);
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(Named(*agent, {Group(4, {9})}),
            std::vector<std::string>{"fatal: the schedule names slot 9 which node 1 never "
                                     "reported"});
  EXPECT_LT(SecondsSince(start), 1.0);
}

}  // namespace
}  // namespace sparsync::negotiation
