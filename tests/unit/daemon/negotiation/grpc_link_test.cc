// The gRPC edge end to end (grpc_service.h, grpc_link.h): an in-process CoordinatorServer on a
// free loopback port with a real CoordinatorCore behind it, and GrpcCoordinatorLink clients as
// the other nodes (threads), node 0 calling the core directly as the daemon does. Every call gives
// the same results as the direct link; a wrong job token is refused; every client call ends by
// its deadline when the server is not there or does not answer.
#include "daemon/negotiation/grpc_link.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <functional>
#include <thread>

#include "daemon/negotiation/grpc_service.h"
#include "tests/unit/daemon/negotiation/test_util.h"

namespace sparsync::negotiation {
namespace {

using namespace std::chrono_literals;
using testing::Contains;
using testing::Describe;
using testing::Meta;
using testing::NewRef;
using testing::SecondsSince;
using testing::SlotRef;

constexpr char kToken[] = "grpc-edge-token";
constexpr int kNodes = 3, kLocalSize = 2;

// Binds a loopback TCP socket to port 0 and returns it; -1 on failure. `port` is the one chosen.
int BindLoopback(int* port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  *port = ntohs(addr.sin_port);
  return fd;
}

// A loopback address that was free a moment ago: nothing listens there.
std::string FreeLoopbackAddress() {
  int port = 0;
  int fd = BindLoopback(&port);
  EXPECT_GE(fd, 0);
  close(fd);
  return "127.0.0.1:" + std::to_string(port);
}

// Listens on a loopback port and never accepts: the kernel completes each connection, then
// nothing answers, so a call waits for its deadline.
class SilentServer {
 public:
  SilentServer() {
    int port = 0;
    fd_ = BindLoopback(&port);
    EXPECT_EQ(listen(fd_, 64), 0);
    address_ = "127.0.0.1:" + std::to_string(port);
  }
  ~SilentServer() { close(fd_); }
  const std::string& address() const { return address_; }

 private:
  int fd_;
  std::string address_;
};

JoinInfo Info(int rank, const std::string& token = kToken) {
  return testing::Joiner(rank, kNodes, kLocalSize, token, kProtocolVersion);
}

class GrpcEdgeTest : public ::testing::Test {
 protected:
  // A core for kNodes nodes, served on a free loopback port (retried if another process took it
  // between probing and binding).
  void Serve(CoordinatorCore** core) {
    CoordinatorOptions o;
    o.num_nodes = kNodes;
    o.cycle = 0ms;
    o.merge.warmup_steps = 1000;
    core_ = std::make_unique<CoordinatorCore>(o, kLocalSize, kToken);
    core_->Start();
    for (int attempt = 0; attempt < 5 && !server_; ++attempt) {
      auto server = std::make_unique<CoordinatorServer>(core_.get());
      std::string address = FreeLoopbackAddress();
      if (server->Start(address).ok()) {
        server_ = std::move(server);
        address_ = address;
      }
    }
    ASSERT_NE(server_, nullptr) << "no free loopback port";
    *core = core_.get();
  }
  std::unique_ptr<GrpcCoordinatorLink> Link(const std::string& token = kToken) {
    return std::make_unique<GrpcCoordinatorLink>(address_, token, 5s);
  }
  void TearDown() override {
    if (core_) core_->Stop();  // wakes handlers blocked in the core, so the server can stop
    server_.reset();
    core_.reset();
  }

  std::unique_ptr<CoordinatorCore> core_;
  std::unique_ptr<CoordinatorServer> server_;
  std::string address_;
};

// What a scripted job saw: each call's code and payload (the same over any link), and its error
// message (over gRPC prefixed with what was being done).
struct Transcript {
  std::vector<std::string> lines;
  std::vector<std::string> messages;
  void Add(const std::string& what, const Status& st, const std::string& payload = "") {
    lines.push_back(what + ": code " + std::to_string(static_cast<int>(st.code())) + " " + payload);
    messages.push_back(st.message());
  }
  void Add(const std::string& what, const Result<std::vector<ScheduleEntry>>& r) {
    std::string payload;
    if (r.ok()) {
      for (const auto& line : Describe(*r)) payload += line + "; ";
    }
    Add(what, r.status(), payload);
  }
  template <typename T>
  void AddValues(const std::string& what, const Result<std::vector<T>>& r) {
    std::string payload;
    if (r.ok()) {
      for (const auto& v : *r) payload += "[" + ::testing::PrintToString(v) + "]";
    }
    Add(what, r.status(), payload);
  }
};

// Join, the rendezvous store, two rounds of reports and polls (metadata, then slots; an
// ALLGATHER's dimensions), refused reports, an empty poll, a failure from node 2 and a leave.
Transcript RunScript(const std::vector<CoordinatorLink*>& links) {
  Transcript t;
  std::vector<Status> joined(kNodes);
  std::vector<std::thread> joiners;
  for (int n = 0; n < kNodes; ++n) {
    joiners.emplace_back([&, n] { joined[n] = links[n]->Join(Info(n), 10s); });
  }
  for (auto& j : joiners) j.join();
  for (int n = 0; n < kNodes; ++n) t.Add("join " + std::to_string(n), joined[n]);

  const std::string binary("tcp\0//10.0.0.2\xfe", 15);
  t.Add("set 1", links[1]->StoreSet("gloo/1", "tcp://10.0.0.1"));
  t.Add("set 2", links[2]->StoreSet("gloo/2", binary));
  t.AddValues("get 0", links[0]->StoreGet({"gloo/1", "gloo/2"}, 1s));
  t.AddValues("get 1", links[1]->StoreGet({"gloo/2", "gloo/1"}, 1s));
  t.AddValues("get missing", links[2]->StoreGet({"gloo/1", "gloo/3"}, 50ms));

  const TensorMeta a = Meta("A", {3, 5}), b = Meta("B", {7}, CollectiveOp::kAllReduce),
                   g = Meta("G", {2, 4}, CollectiveOp::kAllGather);
  t.AddValues("report 0", links[0]->Report(0, {a, b, g},
                                           {NewRef(0, {}, 11), NewRef(1), NewRef(2, {1, 2}, 12)}));
  t.AddValues("report 1b", links[1]->Report(1, {b}, {NewRef(0)}));
  t.AddValues("report 1ag", links[1]->Report(1, {a, g}, {NewRef(1, {3, 4}), NewRef(0, {}, 5)}));
  t.AddValues("report 2",
              links[2]->Report(2, {g, a, b}, {NewRef(2), NewRef(0, {5, 6}), NewRef(1)}));
  uint64_t after = 0;
  for (int n = 0; n < kNodes; ++n) {
    auto r = links[n]->Poll(n, 0, 1s);
    t.Add("poll " + std::to_string(n), r);
    if (r.ok() && !r->empty()) after = r->back().seq;
  }
  // Round 2 by slot (A=1, B=2, G=3 when the script runs as meant).
  t.AddValues("report 0 again", links[0]->Report(0, {}, {SlotRef(3, {7, 8}), SlotRef(1)}));
  t.AddValues("report 1 again", links[1]->Report(1, {}, {SlotRef(1), SlotRef(3, {9, 9})}));
  t.AddValues("report 2 again", links[2]->Report(2, {}, {SlotRef(1), SlotRef(3, {0, 1})}));
  for (int n = 0; n < kNodes; ++n) {
    t.Add("poll again " + std::to_string(n), links[n]->Poll(n, after, 1s));
  }
  t.AddValues("unknown slot", links[1]->Report(1, {}, {SlotRef(99)}));
  t.AddValues("no name", links[1]->Report(1, {Meta("", {1})}, {NewRef(0)}));
  t.Add("poll nothing", links[2]->Poll(2, after + 2, 50ms));
  t.Add("fail 2", links[2]->Fail(2, Mismatch("worker 1 of node 2 posted 'A' as float16")));
  for (int n = 0; n < kNodes; ++n) {
    t.Add("poll fatal " + std::to_string(n), links[n]->Poll(n, after + 2, 1s));
  }
  t.AddValues("report after failure", links[1]->Report(1, {}, {SlotRef(2)}));
  t.Add("leave 1", links[1]->Leave(1));
  return t;
}

TEST_F(GrpcEdgeTest, EveryCallGivesWhatTheDirectLinkGives) {
  CoordinatorOptions o;
  o.num_nodes = kNodes;
  o.cycle = 0ms;
  o.merge.warmup_steps = 1000;
  CoordinatorCore direct_core(o, kLocalSize, kToken);
  const Transcript direct = RunScript({&direct_core, &direct_core, &direct_core});

  CoordinatorCore* core = nullptr;
  ASSERT_NO_FATAL_FAILURE(Serve(&core));
  auto node1 = Link(), node2 = Link();
  const Transcript remote = RunScript({core, node1.get(), node2.get()});

  ASSERT_EQ(remote.lines.size(), direct.lines.size());
  for (size_t i = 0; i < direct.lines.size(); ++i) {
    EXPECT_EQ(remote.lines[i], direct.lines[i]);
    EXPECT_TRUE(Contains(remote.messages[i], direct.messages[i]))
        << direct.lines[i] << ": " << remote.messages[i] << " vs " << direct.messages[i];
  }
  // The script did what it meant to: spot checks of the direct transcript.
  auto line = [&](const std::string& prefix) {
    for (const auto& l : direct.lines) {
      if (l.rfind(prefix + ":", 0) == 0) return l;
    }
    return std::string("missing");
  };
  EXPECT_EQ(line("join 2"), "join 2: code 0 ");
  EXPECT_EQ(line("get 1"), "get 1: code 0 [" +
                               ::testing::PrintToString(std::string("tcp\0//10.0.0.2\xfe", 15)) +
                               "][\"tcp://10.0.0.1\"]");
  EXPECT_EQ(line("get missing"), "get missing: code 3 ");
  EXPECT_EQ(line("report 2"), "report 2: code 0 [3][1][2]");
  // In the order node 2, the last to report, listed them ready: B, G, A.
  EXPECT_EQ(line("poll 1"), "poll 1: code 0 1:2; 2:3[1 2 3 4 5 6]; 3:1; ");
  EXPECT_EQ(line("poll again 2"), "poll again 2: code 0 4:1; 5:3[7 8 9 9 0 1]; ");
  EXPECT_EQ(line("unknown slot"), "unknown slot: code 1 ");
  EXPECT_EQ(line("poll nothing"), "poll nothing: code 0 ");
  EXPECT_TRUE(Contains(line("poll fatal 1"), "6:fatal MISMATCH: worker 1 of node 2 posted 'A'"));
  EXPECT_EQ(line("report after failure"), "report after failure: code 5 ");
}

// Nodes as threads, two of them over gRPC long polls: one schedule, identical everywhere.
TEST_F(GrpcEdgeTest, ConcurrentNodesSeeOneSchedule) {
  CoordinatorCore* core = nullptr;
  ASSERT_NO_FATAL_FAILURE(Serve(&core));
  auto node1 = Link(), node2 = Link();
  const std::vector<TensorMeta> tensors = {Meta("w1", {16, 8}), Meta("b1", {16}),
                                           Meta("step", {1}, CollectiveOp::kBroadcast),
                                           Meta("ids", {4}, CollectiveOp::kAllGather)};
  auto seen = testing::RunRounds({core, node1.get(), node2.get()}, tensors, 6);
  testing::ExpectOneSchedule(seen, tensors, 6);
}

TEST_F(GrpcEdgeTest, AWrongJobTokenIsRefusedEverywhere) {
  CoordinatorCore* core = nullptr;
  ASSERT_NO_FATAL_FAILURE(Serve(&core));
  auto intruder = Link("not-the-token");
  Status join = intruder->Join(Info(1, "not-the-token"), 5s);
  EXPECT_EQ(join.code(), StatusCode::kPermissionDenied);
  EXPECT_TRUE(Contains(join.message(), "node 1 presented a wrong SPARSYNC_JOB_TOKEN"))
      << join.message();
  EXPECT_TRUE(Contains(join.message(), address_)) << join.message();
  const std::vector<std::pair<std::string, Status>> calls = {
      {"StoreSet", intruder->StoreSet("gloo/1", "evil")},
      {"StoreGet", intruder->StoreGet({"gloo/1"}, 10ms).status()},
      {"Report", intruder->Report(1, {Meta("w", {1})}, {NewRef(0)}).status()},
      {"Poll", intruder->Poll(1, 0, 10ms).status()},
      {"Fail", intruder->Fail(1, Internal("evil"))},
      {"Leave", intruder->Leave(1)},
  };
  for (const auto& [name, st] : calls) {
    EXPECT_EQ(st.code(), StatusCode::kPermissionDenied) << name << ": " << st.ToString();
    EXPECT_TRUE(Contains(st.message(), "wrong SPARSYNC_JOB_TOKEN")) << name << ": " << st.message();
  }
  // Nothing the intruder sent took effect.
  EXPECT_EQ(core->StoreGet({"gloo/1"}, 0ms).status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(core->Poll(0, 0, 0ms).value().empty()) << "the refused Fail or Leave failed the job";
  EXPECT_TRUE(core->Report(0, {Meta("w", {1})}, {NewRef(0)}).ok());
  // The right token still works on the same server.
  EXPECT_TRUE(Link()->StoreSet("gloo/1", "good").ok());
}

struct TimedCall {
  std::string name;
  double deadline_s;  // what the link promises
  std::function<Status()> call;
};

// Runs every call on its own thread; each must fail, and within its deadline plus `slack_s`.
// Returns each call's status and how long it took.
std::vector<std::pair<Status, double>> RunTimed(const std::vector<TimedCall>& calls,
                                                double slack_s) {
  std::vector<std::pair<Status, double>> out(calls.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < calls.size(); ++i) {
    threads.emplace_back([&, i] {
      auto start = std::chrono::steady_clock::now();
      out[i].first = calls[i].call();
      out[i].second = SecondsSince(start);
    });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_FALSE(out[i].first.ok()) << calls[i].name;
    EXPECT_LT(out[i].second, calls[i].deadline_s + slack_s) << calls[i].name;
  }
  return out;
}

std::vector<TimedCall> EveryCall(GrpcCoordinatorLink& link) {
  return {
      {"Join", 0.5, [&] { return link.Join(Info(1), 500ms); }},
      {"StoreSet", 0.3, [&] { return link.StoreSet("k", "v"); }},
      {"StoreGet", 0.4, [&] { return link.StoreGet({"k"}, 100ms).status(); }},
      {"Report", 0.3, [&] { return link.Report(1, {Meta("w", {1})}, {NewRef(0)}).status(); }},
      {"Poll", 0.4, [&] { return link.Poll(1, 0, 100ms).status(); }},
      {"Fail", 0.3, [&] { return link.Fail(1, Internal("x")); }},
      {"Leave", 2.0, [&] { return link.Leave(1); }},  // a fixed 2 s deadline (grpc_link.cc)
  };
}

// Nothing listens at the address: every call fails, none outlives its deadline, and each error
// names the address.
TEST(GrpcLinkDeadlineTest, NoServerFailsEveryCallWithinItsDeadline) {
  const std::string address = FreeLoopbackAddress();
  GrpcCoordinatorLink link(address, kToken, 300ms);
  auto calls = EveryCall(link);
  auto results = RunTimed(calls, 1.5);
  EXPECT_EQ(results[0].first.code(), StatusCode::kDeadlineExceeded) << results[0].first.ToString();
  EXPECT_GE(results[0].second, 0.45) << "Join waits for node 0 until its deadline";
  for (size_t i = 0; i < calls.size(); ++i) {
    const Status& st = results[i].first;
    EXPECT_TRUE(st.code() == StatusCode::kUnavailable || st.code() == StatusCode::kDeadlineExceeded)
        << calls[i].name << ": " << st.ToString();
    EXPECT_TRUE(Contains(st.message(), address)) << calls[i].name << ": " << st.message();
  }
}

// The call waits for the channel (wait_for_ready), so when node 0 is not there it ends in
// DEADLINE_EXCEEDED: the message still names SPARSYNC_COORDINATOR and asks whether node 0 runs
// (it used to be gRPC's bare "Deadline Exceeded").
TEST(GrpcLinkDeadlineTest, JoinWithNoServerSaysWhatToCheck) {
  const std::string address = FreeLoopbackAddress();
  GrpcCoordinatorLink link(address, kToken, 300ms);
  Status join = link.Join(Info(1), 500ms);
  EXPECT_EQ(join.code(), StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(Contains(join.message(), "SPARSYNC_COORDINATOR")) << join.message();
  EXPECT_TRUE(Contains(join.message(), "is node 0 running")) << join.message();
}

// A server that accepts connections and never answers: every call ends at its own deadline with
// DEADLINE_EXCEEDED, not later.
TEST(GrpcLinkDeadlineTest, SilentServerEndsEveryCallAtItsDeadline) {
  SilentServer silent;
  GrpcCoordinatorLink link(silent.address(), kToken, 300ms);
  auto calls = EveryCall(link);
  auto results = RunTimed(calls, 1.5);
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(results[i].first.code(), StatusCode::kDeadlineExceeded)
        << calls[i].name << ": " << results[i].first.ToString();
    EXPECT_GE(results[i].second, 0.9 * calls[i].deadline_s) << calls[i].name;
  }
  EXPECT_TRUE(Contains(results[0].first.message(), silent.address()));
}

// When the coordinator accepts but does not answer, every call's error names the address, so the
// node's fatal error ("lost the coordinator on node 0: ...") says which address it tried.
TEST(GrpcLinkDeadlineTest, SilentServerErrorsNameTheAddress) {
  SilentServer silent;
  GrpcCoordinatorLink link(silent.address(), kToken, 300ms);
  auto calls = EveryCall(link);
  calls.pop_back();  // Leave: 2 s
  auto results = RunTimed(calls, 1.5);
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_TRUE(Contains(results[i].first.message(), silent.address()))
        << calls[i].name << ": " << results[i].first.message();
  }
}

// A stopping daemon waits out no deadline: Cancel ends every call in flight at once and refuses
// the later ones (issue 16, D9).
TEST(GrpcLinkDeadlineTest, CancelEndsEveryCallAtOnce) {
  SilentServer silent;
  GrpcCoordinatorLink link(silent.address(), kToken, 20s);
  std::vector<std::function<Status()>> calls = {
      [&] { return link.Join(Info(1), 30s); },
      [&] { return link.StoreGet({"k"}, 30s).status(); },
      [&] { return link.Report(1, {Meta("w", {1})}, {NewRef(0)}).status(); },
      [&] { return link.Poll(1, 0, 5s).status(); },
  };
  std::vector<Status> got(calls.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < calls.size(); ++i) {
    threads.emplace_back([&, i] { got[i] = calls[i](); });
  }
  std::this_thread::sleep_for(300ms);
  const auto cancelled = std::chrono::steady_clock::now();
  link.Cancel();
  for (auto& t : threads) t.join();
  EXPECT_LT(SecondsSince(cancelled), 1.0);
  for (const Status& st : got) EXPECT_FALSE(st.ok());
  Status later = link.StoreSet("k", "v");
  EXPECT_EQ(later.code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(later.message(), "shutting down")) << later.message();
}

}  // namespace
}  // namespace sparsync::negotiation
