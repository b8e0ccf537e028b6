// Helpers of the executor's tests (executor_test.cc, executor_observer_test.cc): nodes as threads
// over the loopback transport, workers as socket pairs into each node's tensor table, a transport
// that records its calls, and a mixed dense/sparse schedule run on every node.
#pragma once

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

namespace sparsync::pipeline::executor_testing {

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
inline float Value(int node, int local, size_t tensor, size_t i, uint64_t round) {
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

  // What Post() writes (null: Value).
  std::function<float(int node, int local, size_t tensor, size_t i, uint64_t round)> value;

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
          data[i] = value ? value(world_.node_rank, local, t, i, round)
                          : Value(world_.node_rank, local, t, i, round);
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
inline std::vector<ScheduleEntry> Schedule(const std::vector<std::vector<uint32_t>>& groups,
                                           uint64_t first_seq) {
  std::vector<ScheduleEntry> entries;
  for (const auto& g : groups) {
    ScheduleEntry e;
    e.seq = first_seq++;
    for (uint32_t t : g) e.group.push_back(GroupTensor{t + 1, {}, {}, nullptr});
    entries.push_back(std::move(e));
  }
  return entries;
}

inline Config SparseConfig() {
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
inline const std::vector<TensorSpec> kMixed = {
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
inline const std::vector<std::vector<uint32_t>> kMixedGroups = {{0}, {1, 2}, {3}, {4}, {5, 6}, {7}, {8}};

struct RunResult {
  std::vector<std::vector<float>> results;  // per node, per round concatenated
  std::vector<std::vector<std::string>> logs;
  std::vector<bool> one_thread;  // per node: every transport call on one thread, not stage A's
  std::vector<std::vector<int32_t>> statuses;
};

// Runs `rounds` rounds of kMixed on `nodes` nodes with `local_size` workers each, pipelined
// (Start) or one entry at a time (RunOnce on the test's thread). `value`: what the workers post
// (null: Value).
inline RunResult RunMixed(int nodes, int local_size, int rounds, bool pipelined,
                          decltype(Node::value) value = nullptr) {
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
    cluster.back()->value = value;
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

}  // namespace sparsync::pipeline::executor_testing
