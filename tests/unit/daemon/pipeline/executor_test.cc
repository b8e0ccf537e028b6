// The two-stage executor with nodes as threads over the loopback transport and workers as socket
// pairs into each node's tensor table: stage A of one entry overlaps stage B of the previous one,
// every node makes its transport calls in schedule order from one thread, results are the same bits
// on every node and the same as executing one entry at a time, and failures stay sticky.
#include "daemon/pipeline/executor.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <set>
#include <thread>

#include "daemon/intake/codec.h"
#include "daemon/intake/session.h"
#include "daemon/intake/worker_handler.h"
#include "daemon/pipeline/host_paths.h"
#include "daemon/transport/loopback/loopback_transport.h"

namespace sparsync::pipeline {
namespace {

using negotiation::GroupTensor;
using negotiation::ScheduleEntry;

struct TensorSpec {
  std::string name;
  int64_t numel;
  uint32_t op = SPARSYNC_OP_GRADIENT;                 // wire numbers: what a worker sends
  uint32_t compressor = SPARSYNC_COMPRESSOR_DEFAULT;
};

// The schedule as the node's negotiation agent hands it to the executor: slot t + 1 is tensor t,
// named as the agent names it.
class Feed {
 public:
  explicit Feed(const std::vector<TensorSpec>& specs) : specs_(specs) {}
  void Push(std::vector<ScheduleEntry> entries) {
    {
      std::lock_guard lock(mu_);
      for (auto& e : entries) {
        for (GroupTensor& t : e.group) {
          if (t.slot >= 1 && t.slot <= specs_.size()) t.name = specs_[t.slot - 1].name;
        }
        pending_.push_back(std::move(e));
      }
    }
    cv_.notify_all();
  }
  std::vector<ScheduleEntry> Next(std::chrono::milliseconds wait) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, wait, [&] { return !pending_.empty(); });
    std::vector<ScheduleEntry> out(pending_.begin(), pending_.end());
    pending_.clear();
    return out;
  }

 private:
  const std::vector<TensorSpec> specs_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<ScheduleEntry> pending_;
};

// Passes every call to `inner` and logs it with the calling thread; `before` may hold a call.
class RecordingTransport : public transport::Transport {
 public:
  explicit RecordingTransport(transport::Transport* inner) : inner_(inner) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  Status AllReduceSum(void* data, size_t count, transport::ElementType type,
                      uint32_t tag) override {
    SPARSYNC_RETURN_IF_ERROR(Enter("allreduce", tag));
    return inner_->AllReduceSum(data, count, type, tag);
  }
  Status AllGatherV(const void* send, size_t send_bytes, void* recv,
                    std::span<const size_t> recv_bytes, uint32_t tag) override {
    SPARSYNC_RETURN_IF_ERROR(Enter("allgatherv", tag));
    return inner_->AllGatherV(send, send_bytes, recv, recv_bytes, tag);
  }
  Status Broadcast(void* data, size_t bytes, int root, uint32_t tag) override {
    SPARSYNC_RETURN_IF_ERROR(Enter("broadcast", tag));
    return inner_->Broadcast(data, bytes, root, tag);
  }
  Status SendRecv(int peer, const void* send, size_t send_bytes, void* recv, size_t recv_capacity,
                  size_t* recv_bytes, uint32_t tag) override {
    SPARSYNC_RETURN_IF_ERROR(Enter("sendrecv", tag));
    return inner_->SendRecv(peer, send, send_bytes, recv, recv_capacity, recv_bytes, tag);
  }
  void Abort(const Status& reason) override { inner_->Abort(reason); }

  void Mark(const std::string& what) {
    std::lock_guard lock(mu_);
    log_.push_back(what);
  }
  std::vector<std::string> log() {
    std::lock_guard lock(mu_);
    return log_;
  }
  std::set<std::thread::id> threads() {
    std::lock_guard lock(mu_);
    return threads_;
  }
  std::function<Status()> before;

 private:
  Status Enter(const char* what, uint32_t tag) {
    {
      std::lock_guard lock(mu_);
      log_.push_back(std::string(what) + " " + std::to_string(tag));
      threads_.insert(std::this_thread::get_id());
    }
    return before ? before() : Status::Ok();
  }
  transport::Transport* inner_;
  std::mutex mu_;
  std::vector<std::string> log_;
  std::set<std::thread::id> threads_;
};

// Deterministic test values in [-1, 1).
float Value(int node, int local, size_t tensor, size_t i, uint64_t round) {
  uint64_t x = (static_cast<uint64_t>(node) << 56) ^ (static_cast<uint64_t>(local) << 48) ^
               (static_cast<uint64_t>(tensor) << 40) ^ (round << 32) ^ i;
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  return static_cast<float>(static_cast<double>(x >> 40) / static_cast<double>(1ull << 23) - 1.0);
}

// One node: its tensor table, local workers connected through socket pairs, and its executor.
class Node {
 public:
  Node(World world, const std::vector<TensorSpec>& specs, transport::Transport* transport,
       const Config& config, ExecutorOptions options, std::function<void(const Status&)> on_fail)
      : world_(world), specs_(specs), feed_(specs) {
    // As the daemon wires them: the handler answers every pending tensor of a failed job, and
    // `on_fail` hears what this node found (the coordinator's news comes as a fatal entry).
    table_ = std::make_unique<TensorTable>(world, &failure_);
    handler_ = std::make_unique<intake::WorkerHandler>(world, "token", &failure_, table_.get(),
                                                       nullptr, [](negotiation::ReadyTensor) {});
    failure_.Observe([this](const Status& e, JobFailure::Source s) { handler_->OnFailure(e, s); });
    failure_.Observe([on_fail](const Status& e, JobFailure::Source s) {
      if (s == JobFailure::Source::kLocal) on_fail(e);
    });
    for (int local = 0; local < world.local_size; ++local) {
      int fds[2];
      EXPECT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, fds), 0);
      sessions_.push_back(std::make_shared<intake::WorkerSession>(fds[0]));
      worker_fds_.push_back(fds[1]);
      sparsync_hello hello{};
      hello.local_rank = static_cast<uint32_t>(local);
      hello.pid = 1000 + local;
      hello.token_len = 5;
      std::memcpy(hello.job_token, "token", 5);
      sparsync_hello_reply reply{};
      handler_->OnHello(sessions_.back(), hello, &reply);
      EXPECT_EQ(reply.status, SPARSYNC_OK) << reply.message;
      regions_.emplace_back();
      for (size_t t = 0; t < specs.size(); ++t) {
        sparsync_register_msg msg{};
        msg.tensor_id = static_cast<uint32_t>(t);
        msg.op = static_cast<uint8_t>(specs[t].op);
        msg.dtype = SPARSYNC_FLOAT32;
        msg.reduce_op = SPARSYNC_REDUCE_AVERAGE;
        msg.ndim = 1;
        msg.shape[0] = specs[t].numel;
        msg.compressor = static_cast<uint8_t>(specs[t].compressor);
        msg.name_len = static_cast<uint32_t>(specs[t].name.size());
        std::memcpy(msg.name, specs[t].name.data(), specs[t].name.size());
        sparsync_register_reply reg{};
        std::shared_ptr<intake::SharedRegion> region;
        handler_->OnRegister(sessions_.back(), msg, &reg, &region);
        EXPECT_EQ(reg.status, SPARSYNC_OK) << reg.message;
        regions_.back().push_back(region);
      }
    }
    sparse_ = std::make_unique<SparseReducers>(config, world.node_rank, world.num_nodes, transport);
    executor_ = std::make_unique<Executor>(
        world, table_.get(), transport,
        [this](std::chrono::milliseconds w) { return feed_.Next(w); }, &failure_, sparse_.get(),
        HostPaths(world, transport), std::move(options));
  }
  ~Node() {
    executor_->Stop();
    executor_.reset();
    for (int fd : worker_fds_) close(fd);
  }

  Executor& executor() { return *executor_; }
  Feed& feed() { return feed_; }
  TensorState& state() { return sparse_->state(); }

  // Writes round `round` of every tensor of every local worker and posts READY. `poison`: the
  // tensor whose first element is made NaN (-1: none).
  void Post(uint64_t round, int poison = -1) {
    for (int local = 0; local < world_.local_size; ++local) {
      for (size_t t = 0; t < specs_.size(); ++t) {
        float* data = static_cast<float*>(regions_[local][t]->data());
        for (size_t i = 0; i < static_cast<size_t>(specs_[t].numel); ++i) {
          data[i] = Value(world_.node_rank, local, t, i, round);
        }
        if (static_cast<int>(t) == poison) data[0] = NAN;
        sparsync_ready ready{};
        ready.tensor_id = static_cast<uint32_t>(t);
        ready.round = round;
        EXPECT_TRUE(handler_->OnReady(sessions_[local], ready).ok());
      }
    }
  }

  // One DONE per tensor and local worker, by tensor id (worker 0's; every worker's must agree).
  // Status -1 for a DONE that did not come within `deadline`.
  std::vector<sparsync_done> ReadDones(std::chrono::milliseconds deadline) {
    std::vector<sparsync_done> by_tensor(specs_.size());
    for (auto& d : by_tensor) d.status = -1;
    for (int local = 0; local < world_.local_size; ++local) {
      for (size_t n = 0; n < specs_.size(); ++n) {
        pollfd p{worker_fds_[local], POLLIN, 0};
        if (poll(&p, 1, static_cast<int>(deadline.count())) != 1) return by_tensor;
        sparsync_done done{};
        if (recv(worker_fds_[local], &done, sizeof(done), 0) != sizeof(done)) return by_tensor;
        if (done.tensor_id < by_tensor.size() && local == 0) by_tensor[done.tensor_id] = done;
      }
    }
    return by_tensor;
  }

  // Every local worker's buffers, concatenated.
  std::vector<float> Results() const {
    std::vector<float> out;
    for (int local = 0; local < world_.local_size; ++local) {
      for (size_t t = 0; t < specs_.size(); ++t) {
        const float* data = static_cast<const float*>(regions_[local][t]->data());
        out.insert(out.end(), data, data + specs_[t].numel);
      }
    }
    return out;
  }

 private:
  const World world_;
  const std::vector<TensorSpec> specs_;
  JobFailure failure_;
  std::unique_ptr<TensorTable> table_;
  std::unique_ptr<intake::WorkerHandler> handler_;
  std::unique_ptr<SparseReducers> sparse_;
  std::vector<std::shared_ptr<intake::WorkerSession>> sessions_;
  std::vector<int> worker_fds_;
  std::vector<std::vector<std::shared_ptr<intake::SharedRegion>>> regions_;
  Feed feed_;
  std::unique_ptr<Executor> executor_;
};

// Entries of one round: groups of tensor indices, seq numbers from `first_seq`.
std::vector<ScheduleEntry> Schedule(const std::vector<std::vector<uint32_t>>& groups,
                                    uint64_t first_seq) {
  std::vector<ScheduleEntry> entries;
  for (const auto& g : groups) {
    ScheduleEntry e;
    e.seq = first_seq++;
    for (uint32_t t : g) e.group.push_back(GroupTensor{t + 1, {}, {}});
    entries.push_back(std::move(e));
  }
  return entries;
}

Config SparseConfig() {
  Config c;
  c.compressor = Compressor::kTopK;
  c.density = 0.01;
  c.min_compress_bytes = 16 << 10;
  c.seed = 3;
  return c;
}

// A mix of every path: sparse top-k, dense fused, gTop-k (pairwise rounds on 4 nodes, the
// allgather fallback on 3), an explicit in-place allreduce, a fused sparse group, random-k (a
// shared-seed value allreduce) and a dense fused group of small gradients.
const std::vector<TensorSpec> kMixed = {
    {"fc.weight", 20000},
    {"fc.bias", 64},
    {"bn.weight", 100},
    {"conv2.weight", 30000, SPARSYNC_OP_GRADIENT, SPARSYNC_COMPRESSOR_GTOPK},
    {"loss.scale", 500, SPARSYNC_OP_ALLREDUCE},
    {"conv1.weight", 8000},
    {"conv1.bias", 8000},
    {"embed.weight", 20000, SPARSYNC_OP_GRADIENT, SPARSYNC_COMPRESSOR_RANDOMK},
    {"head.bias", 10, SPARSYNC_OP_GRADIENT, SPARSYNC_COMPRESSOR_NONE},
};
const std::vector<std::vector<uint32_t>> kMixedGroups = {{0}, {1, 2}, {3}, {4}, {5, 6}, {7}, {8}};

struct RunResult {
  std::vector<std::vector<float>> results;  // per node, per round concatenated
  std::vector<std::vector<std::string>> logs;
  std::vector<bool> one_thread;  // per node: every transport call on one thread, not stage A's
  std::vector<std::vector<int32_t>> statuses;
};

// Runs `rounds` rounds of kMixed on `nodes` nodes with `local_size` workers each, pipelined
// (Start) or one entry at a time (RunOnce on the test's thread).
RunResult RunMixed(int nodes, int local_size, int rounds, bool pipelined) {
  auto hub = std::make_shared<transport::LoopbackHub>(nodes, std::chrono::seconds(20));
  std::vector<std::unique_ptr<transport::LoopbackTransport>> loopbacks;
  std::vector<std::unique_ptr<RecordingTransport>> recorders;
  std::vector<std::unique_ptr<Node>> cluster;
  std::vector<std::thread::id> stage_a(nodes);
  std::mutex mu;
  for (int r = 0; r < nodes; ++r) {
    loopbacks.push_back(std::make_unique<transport::LoopbackTransport>(hub, r));
    recorders.push_back(std::make_unique<RecordingTransport>(loopbacks.back().get()));
  }
  for (int r = 0; r < nodes; ++r) {
    ExecutorOptions options;
    RecordingTransport* rec = recorders[r].get();
    options.on_exchange = [rec](uint64_t seq) { rec->Mark("entry " + std::to_string(seq)); };
    options.on_prepared = [&stage_a, &mu, r](uint64_t) {
      std::lock_guard lock(mu);
      stage_a[r] = std::this_thread::get_id();
    };
    cluster.push_back(std::make_unique<Node>(World{r, nodes, local_size}, kMixed, rec,
                                             SparseConfig(), options,
                                             [hub](const Status& s) { hub->Abort(s); }));
    if (pipelined) cluster.back()->executor().Start();
  }
  RunResult out;
  out.results.resize(nodes);
  out.statuses.resize(nodes);
  std::vector<std::thread> threads;
  for (int r = 0; r < nodes; ++r) {
    threads.emplace_back([&, r] {
      Node& node = *cluster[r];
      for (int round = 1; round <= rounds; ++round) {
        node.Post(static_cast<uint64_t>(round));
        node.feed().Push(Schedule(kMixedGroups, 1 + (round - 1) * kMixedGroups.size()));
        if (!pipelined) node.executor().RunOnce(std::chrono::milliseconds(0));
        for (const auto& d : node.ReadDones(std::chrono::seconds(20))) {
          out.statuses[r].push_back(d.status);
        }
        auto res = node.Results();
        out.results[r].insert(out.results[r].end(), res.begin(), res.end());
      }
    });
  }
  for (auto& t : threads) t.join();
  cluster.clear();  // stops the executors
  for (int r = 0; r < nodes; ++r) {
    out.logs.push_back(recorders[r]->log());
    auto used = recorders[r]->threads();
    out.one_thread.push_back(used.size() == 1 && (!pipelined || !used.count(stage_a[r])));
  }
  return out;
}

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
TEST(ExecutorTest, ReportsWhatEachGradientGroupCost) {
  const std::vector<TensorSpec> specs = {
      {"a", 6000}, {"b", 2000}, {"scale", 100, SPARSYNC_OP_ALLREDUCE}, {"c", 10}};
  auto hub = std::make_shared<transport::LoopbackHub>(1);
  transport::LoopbackTransport loopback(hub, 0);
  std::mutex mu;
  std::vector<GroupCost> costs;
  ExecutorOptions options;
  options.on_group_cost = [&](const GroupCost& c) {
    std::lock_guard lock(mu);
    costs.push_back(c);
  };
  Node node(World{0, 1, 1}, specs, &loopback, SparseConfig(), options,
            [](const Status& st) { ADD_FAILURE() << st.ToString(); });
  node.executor().Start();
  node.Post(1);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  auto entries = Schedule({{0, 1}, {2}, {3}}, 1);
  for (auto& e : entries) e.plan_version = 7;
  node.feed().Push(entries);
  for (const auto& d : node.ReadDones(std::chrono::seconds(10))) {
    EXPECT_EQ(d.status, SPARSYNC_OK) << d.message;
  }
  node.executor().Stop();
  std::lock_guard lock(mu);
  ASSERT_EQ(costs.size(), 2u);
  EXPECT_EQ(costs[0].elements, 8000u);
  EXPECT_TRUE(costs[0].sparse);
  EXPECT_EQ(costs[0].plan_version, 7u);
  EXPECT_GE(costs[0].sparsify_s, 0.045);
  EXPECT_GT(costs[0].exchange_s, 0.0);
  EXPECT_EQ(costs[1].elements, 10u);
  EXPECT_FALSE(costs[1].sparse) << "below min_compress_bytes: dense";
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
