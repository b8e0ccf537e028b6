#include "daemon/observe/timeline.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

namespace sparsync::observe {
namespace {

using nlohmann::json;

int64_t Now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

json Load(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return json::parse(s.str());  // throws (fails the test) on anything but valid JSON
}

// The events named `name` (and of phase `ph`, if given).
std::vector<json> Named(const json& trace, const std::string& name, const std::string& ph = "") {
  std::vector<json> out;
  for (const json& e : trace) {
    if (e.value("name", "") == name && (ph.empty() || e.value("ph", "") == ph)) out.push_back(e);
  }
  return out;
}

class TimelineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/timeline-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // One sparse group of two tensors whose stages start at `t0` (+ 1, 2, ... ms).
  struct Group {
    std::string a = "fc.weight", b = "fc.bias";
    TensorView tensors[2];
    StepView steps[6];
    GroupView view;
  };
  static void Fill(Group* g, int64_t t0, uint64_t seq) {
    const int64_t ms = 1000000;
    g->tensors[0] = {&g->a, t0};
    g->tensors[1] = {&g->b, t0 + ms / 2};
    GroupView& v = g->view;
    v.seq = seq;
    v.op = CollectiveOp::kGradient;
    v.path = "host sparse";
    v.sparse = true;
    v.step = 3;
    v.plan_version = 2;
    v.elements = 1234;
    v.tensors = g->tensors;
    v.received_ns = t0 + 2 * ms;
    v.prepare_begin_ns = t0 + 3 * ms;
    v.prepare_end_ns = t0 + 5 * ms;
    v.exchange_begin_ns = t0 + 6 * ms;
    v.exchange_end_ns = t0 + 9 * ms;
    v.deliver_end_ns = t0 + 10 * ms;
    // Stage A: local reduce 1 ms, sparsify 0.5 ms, pack 0.5 ms; stage B: transfer 2 ms, unpack
    // 0.5 ms, write-back 0.5 ms.
    const char* names[] = {"local reduce", "sparsify", "pack", "transfer", "unpack", "write-back"};
    const int64_t ends[] = {4 * ms, 4 * ms + ms / 2, 5 * ms, 8 * ms, 8 * ms + ms / 2, 9 * ms};
    for (int i = 0; i < 6; ++i) g->steps[i] = {names[i], t0 + ends[i]};
    v.steps = g->steps;
  }
  std::string dir_;
};

// Every stage of a group lands on its row with its duration, each tensor's waits on the
// tensor's row, one after the other; the rows are named.
TEST_F(TimelineTest, RecordsEveryStageOfAGroupOnItsRow) {
  Timeline timeline(1, 2);
  ASSERT_TRUE(timeline.Start(dir_ + "/t-{node}.json").ok());
  EXPECT_EQ(timeline.path(), dir_ + "/t-1.json");
  Group g;
  Fill(&g, Now(), 17);
  timeline.OnGroup(g.view);
  timeline.OnPlan({4, 30, "omgs", 5, 0.0125, "cost \"model\"\nline 2"});
  timeline.OnIncident(Incident::kStall, "tensor 'x' missing on node 1");
  timeline.Stop();
  EXPECT_EQ(timeline.path(), "");
  const json trace = Load(dir_ + "/t-1.json");

  auto rows = Named(trace, "thread_name", "M");
  std::map<std::string, int> row_of;
  for (const json& r : rows) row_of[r["args"]["name"]] = r["tid"];
  ASSERT_TRUE(row_of.count("tensor fc.weight") && row_of.count("tensor fc.bias")) << trace.dump();
  EXPECT_EQ(row_of["stage A: prepare"], 2);
  EXPECT_EQ(row_of["stage B: exchange, deliver"], 3);
  EXPECT_EQ(Named(trace, "process_name")[0]["args"]["name"], "sparsyncd node 1");

  auto negotiate = Named(trace, "negotiate", "X");
  auto queue = Named(trace, "queue", "X");
  ASSERT_EQ(negotiate.size(), 2u);
  ASSERT_EQ(queue.size(), 2u);
  for (const json& e : negotiate) EXPECT_EQ(e["pid"], 1);
  // fc.weight: ready at t0, the schedule at t0 + 2 ms, stage A at t0 + 3 ms.
  const json& n0 = negotiate[0]["tid"] == row_of["tensor fc.weight"] ? negotiate[0] : negotiate[1];
  const json& q0 = queue[0]["tid"] == row_of["tensor fc.weight"] ? queue[0] : queue[1];
  EXPECT_NEAR(n0["dur"].get<double>(), 2000.0, 1e-6);
  EXPECT_NEAR(q0["dur"].get<double>(), 1000.0, 1e-6);
  EXPECT_NEAR(n0["ts"].get<double>() + 2000.0, q0["ts"].get<double>(), 0.01);

  auto prepare = Named(trace, "prepare", "X");
  ASSERT_EQ(prepare.size(), 1u);
  EXPECT_EQ(prepare[0]["tid"], 2);
  EXPECT_NEAR(prepare[0]["dur"].get<double>(), 2000.0, 1e-6);
  EXPECT_EQ(prepare[0]["args"]["seq"], 17);
  EXPECT_EQ(prepare[0]["args"]["path"], "host sparse");
  EXPECT_EQ(prepare[0]["args"]["sparse"], true);
  EXPECT_EQ(prepare[0]["args"]["tensors"], 2);
  EXPECT_EQ(prepare[0]["args"]["step"], 3);
  auto exchange = Named(trace, "exchange", "X");
  auto deliver = Named(trace, "deliver", "X");
  ASSERT_EQ(exchange.size(), 1u);
  ASSERT_EQ(deliver.size(), 1u);
  EXPECT_EQ(exchange[0]["tid"], 3);
  EXPECT_NEAR(exchange[0]["dur"].get<double>(), 3000.0, 1e-6);
  EXPECT_NEAR(deliver[0]["dur"].get<double>(), 1000.0, 1e-6);
  EXPECT_NEAR(exchange[0]["ts"].get<double>() - prepare[0]["ts"].get<double>(), 3000.0, 0.01);

  // The path's sub-steps, nested in their stage: each from the previous one's end.
  const std::pair<const char*, std::pair<double, double>> steps[] = {
      {"local reduce", {0, 1000}}, {"sparsify", {1000, 500}}, {"pack", {1500, 500}},
      {"transfer", {3000, 2000}},  {"unpack", {5000, 500}},   {"write-back", {5500, 500}}};
  for (const auto& [name, at] : steps) {
    auto e = Named(trace, name, "X");
    ASSERT_EQ(e.size(), 1u) << name;
    EXPECT_EQ(e[0]["tid"], at.first < 3000 ? 2 : 3) << name;
    EXPECT_NEAR(e[0]["ts"].get<double>() - prepare[0]["ts"].get<double>(), at.first, 0.01) << name;
    EXPECT_NEAR(e[0]["dur"].get<double>(), at.second, 1e-6) << name;
    EXPECT_EQ(e[0]["args"]["seq"], 17) << name;
  }

  auto plan = Named(trace, "plan v4 (omgs)", "i");
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(plan[0]["args"]["summary"], "cost \"model\"\nline 2");
  EXPECT_EQ(plan[0]["args"]["effective_step"], 30);
  EXPECT_EQ(Named(trace, "stall", "i").at(0)["args"]["detail"], "tensor 'x' missing on node 1");
  // Wall-clock microseconds: within a minute of now.
  const double now_us = std::chrono::duration_cast<std::chrono::microseconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count();
  EXPECT_NEAR(prepare[0]["ts"].get<double>(), now_us, 60e6);
}

// A file without {node} is node 0's alone: another node records nothing and creates no file.
TEST_F(TimelineTest, WithoutNodeInThePathOnlyNodeZeroRecords) {
  Timeline node1(1, 2);
  ASSERT_TRUE(node1.Start(dir_ + "/one.json").ok());
  EXPECT_EQ(node1.path(), "");
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/one.json"));
  Timeline node0(0, 2);
  ASSERT_TRUE(node0.Start(dir_ + "/one.json").ok());
  EXPECT_EQ(node0.path(), dir_ + "/one.json");
  Timeline alone(0, 1);  // a single node writes the file it is given, {node} or not
  ASSERT_TRUE(alone.Start(dir_ + "/alone.json").ok());
  EXPECT_EQ(alone.path(), dir_ + "/alone.json");
}

// Starting the file being written keeps what it holds; another file closes the first, valid.
TEST_F(TimelineTest, RestartingKeepsOrClosesTheFile) {
  Timeline timeline(0, 1);
  const std::string first = dir_ + "/a.json", second = dir_ + "/b.json";
  ASSERT_TRUE(timeline.Start(first).ok());
  Group g;
  Fill(&g, Now(), 1);
  timeline.OnGroup(g.view);
  ASSERT_TRUE(timeline.Start(first).ok());  // every worker of a node may ask
  ASSERT_TRUE(timeline.Start(second).ok());
  EXPECT_EQ(Named(Load(first), "prepare").size(), 1u);
  Fill(&g, Now(), 2);
  timeline.OnGroup(g.view);
  timeline.Stop();
  timeline.Stop();  // idempotent
  const json b = Load(second);
  ASSERT_EQ(Named(b, "prepare").size(), 1u);
  EXPECT_EQ(Named(b, "prepare")[0]["args"]["seq"], 2);
  // The new file names its rows again.
  EXPECT_EQ(Named(b, "thread_name").size(), 5u);
  // Not recording: nothing is kept.
  timeline.OnGroup(g.view);
  EXPECT_EQ(Named(Load(second), "prepare").size(), 1u);
}

// While recording, the file is valid JSON after each write (once a second): a daemon killed
// mid-job leaves a file the viewers open.
TEST_F(TimelineTest, TheFileIsValidWhileRecording) {
  Timeline timeline(0, 1);
  const std::string path = dir_ + "/live.json";
  ASSERT_TRUE(timeline.Start(path).ok());
  Group g;
  Fill(&g, Now(), 5);
  timeline.OnGroup(g.view);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  size_t seen = 0;
  while (seen == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    seen = Named(Load(path), "prepare").size();  // valid at every read
  }
  EXPECT_EQ(seen, 1u);
  timeline.Stop();
}

// Tensor names come from workers: quotes, backslashes and invalid UTF-8 still give valid JSON.
TEST_F(TimelineTest, AnyTensorNameGivesValidJson) {
  Timeline timeline(0, 1);
  const std::string path = dir_ + "/names.json";
  ASSERT_TRUE(timeline.Start(path).ok());
  Group g;
  Fill(&g, Now(), 1);
  g.a = "la\"yer\\1\n";
  g.b = std::string("bad \xff\xfe utf8");
  timeline.OnGroup(g.view);
  timeline.OnIncident(Incident::kFailure, "node 1: \"boom\"\t\x01");
  timeline.Stop();
  const json trace = Load(path);
  bool found = false;
  for (const json& r : Named(trace, "thread_name")) found |= r["args"]["name"] == "tensor la\"yer\\1\n";
  EXPECT_TRUE(found);
  EXPECT_EQ(Named(trace, "job failed").at(0)["args"]["detail"], "node 1: \"boom\"\t\x01");
}

TEST_F(TimelineTest, AFileThatCannotBeCreatedIsAnError) {
  Timeline timeline(0, 1);
  Status st = timeline.Start(dir_ + "/missing/dir/t.json");
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("missing/dir/t.json"), std::string::npos) << st.message();
  EXPECT_FALSE(timeline.Start("").ok());
}

}  // namespace
}  // namespace sparsync::observe
