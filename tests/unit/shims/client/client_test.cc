// The client library's C ABI (shims/client/include/sparsync/client.h) against the daemon's real
// intake server with a scripted handler (scripted_daemon.h), in one process.
#include "shims/client/include/sparsync/client.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tests/unit/shims/client/scripted_daemon.h"

namespace sparsync::client_test {
namespace {

using Clock = std::chrono::steady_clock;
using ::testing::HasSubstr;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

sparsync_tensor_spec Spec(const char* name, sparsync_op op, sparsync_dtype dtype, uint32_t ndim,
                          const int64_t* shape) {
  sparsync_tensor_spec spec{};
  spec.name = name;
  spec.op = op;
  spec.dtype = dtype;
  spec.reduce_op = SPARSYNC_REDUCE_SUM;
  spec.ndim = ndim;
  spec.shape = shape;
  return spec;
}

class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(daemon_.Start()); }
  void TearDown() override {
    sparsync_close(client_);
    daemon_.Stop();
  }

  sparsync_connect_options Options(const char* token = "t0k") {
    sparsync_connect_options o{};
    o.struct_size = sizeof(o);
    o.socket_path = daemon_.socket_path().c_str();
    o.job_token = token;
    o.timeout_s = 5.0;
    return o;
  }
  // Connects client_; a failure fails the test.
  void Connect() {
    sparsync_connect_options o = Options();
    char error[512] = "";
    ASSERT_EQ(sparsync_connect_with_options(&o, &client_, error, sizeof(error)), SPARSYNC_OK)
        << error;
    ASSERT_NE(client_, nullptr);
  }
  // Registers a host tensor of `n` floats (allreduce unless `op` says otherwise).
  uint32_t RegisterFloats(const char* name, int64_t n, float** data,
                          sparsync_op op = SPARSYNC_OP_ALLREDUCE) {
    shapes_.push_back(std::make_unique<int64_t>(n));
    sparsync_tensor_spec spec = Spec(name, op, SPARSYNC_FLOAT32, 1, shapes_.back().get());
    uint32_t id = 0;
    void* region = nullptr;
    uint64_t bytes = 0;
    EXPECT_EQ(sparsync_register_tensor(client_, &spec, &id, &region, &bytes), SPARSYNC_OK)
        << sparsync_last_error(client_);
    EXPECT_EQ(bytes, static_cast<uint64_t>(n) * sizeof(float));
    *data = static_cast<float*>(region);
    return id;
  }
  std::string LastError() { return sparsync_last_error(client_); }

  ScriptedDaemon daemon_;
  sparsync_client* client_ = nullptr;
  std::vector<std::unique_ptr<int64_t>> shapes_;
};

// Answers every READY at once: each float of the region becomes 2 * x + round.
void DoubleAndAnswer(const ScriptedDaemon::Ready& r) {
  auto* x = static_cast<float*>(r.region->data());
  for (size_t i = 0; i < r.region->size() / sizeof(float); ++i) {
    x[i] = 2 * x[i] + static_cast<float>(r.round);
  }
  ScriptedDaemon::SendDone(r, SPARSYNC_OK);
}

TEST_F(ClientTest, HandshakeHandsTheWorldToTheCaller) {
  daemon_.node_rank = 1;
  daemon_.num_nodes = 3;
  daemon_.local_size = 2;
  sparsync_connect_options o = Options();
  o.local_rank = 1;
  char error[512] = "";
  ASSERT_EQ(sparsync_connect_with_options(&o, &client_, error, sizeof(error)), SPARSYNC_OK)
      << error;
  sparsync_world w{};
  ASSERT_EQ(sparsync_get_world(client_, &w), SPARSYNC_OK);
  EXPECT_EQ(w.rank, 3u);  // node 1 * 2 workers per node + local rank 1
  EXPECT_EQ(w.size, 6u);
  EXPECT_EQ(w.local_rank, 1u);
  EXPECT_EQ(w.local_size, 2u);
  EXPECT_EQ(w.node_rank, 1u);
  EXPECT_EQ(w.num_nodes, 3u);
}

TEST_F(ClientTest, ThePositionalConnectIsTheSameHandshake) {
  char error[512] = "";
  ASSERT_EQ(sparsync_connect(daemon_.socket_path().c_str(), "t0k", 0, 5.0, &client_, error,
                             sizeof(error)),
            SPARSYNC_OK)
      << error;
  sparsync_world w{};
  ASSERT_EQ(sparsync_get_world(client_, &w), SPARSYNC_OK);
  EXPECT_EQ(w.size, 1u);
}

TEST_F(ClientTest, AWrongTokenIsRefusedWithTheDaemonsReason) {
  daemon_.refusal = "job token mismatch: this daemon serves job 'blue'";
  sparsync_connect_options o = Options("red");
  char error[512] = "";
  EXPECT_EQ(sparsync_connect_with_options(&o, &client_, error, sizeof(error)),
            SPARSYNC_ERR_PERMISSION);
  EXPECT_EQ(client_, nullptr);
  EXPECT_THAT(std::string(error), HasSubstr("job token mismatch: this daemon serves job 'blue'"));
  EXPECT_THAT(std::string(error), HasSubstr(daemon_.socket_path()));
}

TEST_F(ClientTest, NoDaemonWithinTheTimeoutNamesTheSocket) {
  const std::string missing = daemon_.socket_path() + ".absent";
  sparsync_connect_options o = Options();
  o.socket_path = missing.c_str();
  o.timeout_s = 0.5;
  char error[1024] = "";
  auto start = Clock::now();
  EXPECT_EQ(sparsync_connect_with_options(&o, &client_, error, sizeof(error)),
            SPARSYNC_ERR_UNAVAILABLE);
  double waited = SecondsSince(start);
  EXPECT_GE(waited, 0.45) << "it must keep retrying until the timeout";
  EXPECT_LT(waited, 3.0);
  EXPECT_EQ(client_, nullptr);
  EXPECT_THAT(std::string(error), HasSubstr("cannot reach sparsyncd at '" + missing + "'"));
  EXPECT_THAT(std::string(error), HasSubstr("retried for"));
}

TEST_F(ClientTest, ConnectWaitsForADaemonThatStartsLate) {
  daemon_.Stop();
  ScriptedDaemon late;
  std::thread starter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    late.Start();
  });
  sparsync_connect_options o = Options();
  o.socket_path = late.socket_path().c_str();
  char error[512] = "";
  EXPECT_EQ(sparsync_connect_with_options(&o, &client_, error, sizeof(error)), SPARSYNC_OK)
      << error;
  starter.join();
  sparsync_close(client_);
  client_ = nullptr;
}

TEST_F(ClientTest, OptionsOfAnotherHeaderVersionAreRefused) {
  sparsync_connect_options o = Options();
  o.struct_size = sizeof(o) + 8;
  char error[512] = "";
  EXPECT_EQ(sparsync_connect_with_options(&o, &client_, error, sizeof(error)),
            SPARSYNC_ERR_INVALID);
  EXPECT_EQ(client_, nullptr);
  EXPECT_THAT(std::string(error), HasSubstr("struct_size"));
  EXPECT_EQ(sparsync_connect_with_options(nullptr, &client_, error, sizeof(error)),
            SPARSYNC_ERR_INVALID);
}

TEST_F(ClientTest, RegisterPostWaitRoundTrip) {
  daemon_.SetOnReady(DoubleAndAnswer);
  Connect();
  float* x = nullptr;
  uint32_t id = RegisterFloats("layer.weight", 6, &x);
  ASSERT_NE(x, nullptr);
  auto regs = daemon_.registrations();
  ASSERT_EQ(regs.size(), 1u);
  EXPECT_EQ(std::string(regs[0].name, regs[0].name_len), "layer.weight");
  EXPECT_EQ(regs[0].dtype, SPARSYNC_FLOAT32);
  EXPECT_EQ(regs[0].ndim, 1);
  EXPECT_EQ(regs[0].shape[0], 6);
  for (int round = 1; round <= 3; ++round) {
    for (int i = 0; i < 6; ++i) x[i] = static_cast<float>(i);
    ASSERT_EQ(sparsync_post_ready(client_, id), SPARSYNC_OK) << LastError();
    ASSERT_EQ(sparsync_wait_done(client_, id, 10.0), SPARSYNC_OK) << LastError();
    for (int i = 0; i < 6; ++i) EXPECT_EQ(x[i], 2.0f * i + round) << "round " << round;
  }
}

TEST_F(ClientTest, WaitTimesOutWhenNoDoneComes) {
  Connect();
  float* x = nullptr;
  uint32_t id = RegisterFloats("never", 2, &x);
  ASSERT_EQ(sparsync_post_ready(client_, id), SPARSYNC_OK);
  auto start = Clock::now();
  EXPECT_EQ(sparsync_wait_done(client_, id, 0.3), SPARSYNC_ERR_TIMEOUT);
  EXPECT_GE(SecondsSince(start), 0.25);
  EXPECT_THAT(LastError(), HasSubstr("timed out after 0.3 s waiting for the result of tensor "
                                     "'never'"));
}

TEST_F(ClientTest, AllgatherResultArrivesInItsOwnRegion) {
  const int32_t gathered[5] = {10, 11, 20, 21, 22};
  daemon_.SetOnReady([&](const ScriptedDaemon::Ready& r) {
    auto region = intake::SharedRegion::Create("gathered", sizeof(gathered));
    ASSERT_TRUE(region.ok());
    std::memcpy((*region)->data(), gathered, sizeof(gathered));
    ScriptedDaemon::SendDone(r, SPARSYNC_OK, "", sizeof(gathered), 5, (*region)->fd());
  });
  Connect();
  int64_t shape[2] = {2, 1};
  sparsync_tensor_spec spec = Spec("gather.me", SPARSYNC_OP_ALLGATHER, SPARSYNC_INT32, 2, shape);
  uint32_t id;
  void* data;
  uint64_t bytes;
  ASSERT_EQ(sparsync_register_tensor(client_, &spec, &id, &data, &bytes), SPARSYNC_OK)
      << LastError();
  const void* result = nullptr;
  uint64_t result_bytes = 0;
  int64_t dim0 = 0;
  EXPECT_EQ(sparsync_allgather_result(client_, id, &result, &result_bytes, &dim0),
            SPARSYNC_ERR_INVALID)
      << "no result before the first round";
  ASSERT_EQ(sparsync_post_ready(client_, id), SPARSYNC_OK);
  ASSERT_EQ(sparsync_wait_done(client_, id, 10.0), SPARSYNC_OK) << LastError();
  ASSERT_EQ(sparsync_allgather_result(client_, id, &result, &result_bytes, &dim0), SPARSYNC_OK)
      << LastError();
  EXPECT_EQ(result_bytes, sizeof(gathered));
  EXPECT_EQ(dim0, 5);
  EXPECT_EQ(std::memcmp(result, gathered, sizeof(gathered)), 0);
  EXPECT_NE(result, data) << "the result is a region of its own";

  daemon_.SetOnReady(nullptr);  // the next round stays in flight: its result is not readable
  ASSERT_EQ(sparsync_post_ready(client_, id), SPARSYNC_OK);
  EXPECT_EQ(sparsync_allgather_result(client_, id, &result, &result_bytes, &dim0),
            SPARSYNC_ERR_INVALID);
  EXPECT_THAT(LastError(), HasSubstr("has no successful result"));
}

TEST_F(ClientTest, AnErrorDoneReachesTheCallerWithItsMessage) {
  daemon_.SetOnReady([](const ScriptedDaemon::Ready& r) {
    // Only the first round is answered: a failed job answers nothing more.
    if (r.round == 1) {
      ScriptedDaemon::SendDone(r, SPARSYNC_ERR_MISMATCH,
                               "tensor 'fc1.weight' has shape [4] on node 0 but [5] on node 1");
    }
  });
  Connect();
  float* x = nullptr;
  uint32_t id = RegisterFloats("fc1.weight", 4, &x, SPARSYNC_OP_GRADIENT);
  ASSERT_EQ(sparsync_post_ready(client_, id), SPARSYNC_OK);
  EXPECT_EQ(sparsync_wait_done(client_, id, 10.0), SPARSYNC_ERR_MISMATCH);
  EXPECT_EQ(LastError(), "tensor 'fc1.weight' has shape [4] on node 0 but [5] on node 1");
  // An error DONE means the job failed (the daemon fails every later collective with its first
  // error): a later round's wait ends with that first error, whatever its own DONE says.
  ASSERT_EQ(sparsync_post_ready(client_, id), SPARSYNC_OK);
  EXPECT_EQ(sparsync_wait_done(client_, id, 10.0), SPARSYNC_ERR_MISMATCH);
  EXPECT_EQ(LastError(), "tensor 'fc1.weight' has shape [4] on node 0 but [5] on node 1");
}

TEST_F(ClientTest, AnErrorDoneWithoutAMessageNamesItsStatus) {
  daemon_.SetOnReady([](const ScriptedDaemon::Ready& r) {
    ScriptedDaemon::SendDone(r, SPARSYNC_ERR_ABORTED);  // no message
  });
  Connect();
  float* x = nullptr;
  uint32_t id = RegisterFloats("fc1.weight", 4, &x, SPARSYNC_OP_GRADIENT);
  ASSERT_EQ(sparsync_post_ready(client_, id), SPARSYNC_OK);
  EXPECT_EQ(sparsync_wait_done(client_, id, 10.0), SPARSYNC_ERR_ABORTED);
  EXPECT_EQ(LastError(), "sparsyncd reported ABORTED");
}

// A DONE saying the daemon's deadline passed (a tensor missing on another node) is the job's
// failure, not this wait's timeout: callers that wait in slices (the Python and TensorFlow shims)
// retry on TIMEOUT, and would wait out their own limit and lose the daemon's message.
TEST_F(ClientTest, TheDaemonsTimeoutIsAnAbortNotThisWaitsTimeout) {
  const std::string why =
      "tensor 'fc2.weight' was posted on node(s) 0 but not on node(s) 1 within 10 s "
      "(SPARSYNC_TIMEOUT_S)";
  daemon_.SetOnReady([&](const ScriptedDaemon::Ready& r) {
    ScriptedDaemon::SendDone(r, SPARSYNC_ERR_TIMEOUT, why);
  });
  Connect();
  float* x = nullptr;
  uint32_t id = RegisterFloats("fc2.weight", 4, &x, SPARSYNC_OP_GRADIENT);
  ASSERT_EQ(sparsync_post_ready(client_, id), SPARSYNC_OK);
  EXPECT_EQ(sparsync_wait_done(client_, id, 10.0), SPARSYNC_ERR_ABORTED);
  EXPECT_EQ(LastError(), why);
  EXPECT_EQ(sparsync_wait_done(client_, id, 0.0), SPARSYNC_ERR_ABORTED) << "and it stays so";
}

TEST_F(ClientTest, AConnectionClosedMidWaitIsUnavailableAndNamesThePath) {
  Connect();
  float* x = nullptr;
  uint32_t id = RegisterFloats("orphan", 3, &x);
  ASSERT_EQ(sparsync_post_ready(client_, id), SPARSYNC_OK);
  std::thread closer([&] {
    auto readies = daemon_.WaitForReadies(1, std::chrono::seconds(10));
    ASSERT_EQ(readies.size(), 1u);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the worker is waiting now
    readies[0].session->Shutdown();
  });
  auto start = Clock::now();
  EXPECT_EQ(sparsync_wait_done(client_, id, 20.0), SPARSYNC_ERR_UNAVAILABLE);
  EXPECT_LT(SecondsSince(start), 5.0);
  closer.join();
  const std::string error = LastError();
  EXPECT_THAT(error, HasSubstr("connection to sparsyncd of node 0 at '" + daemon_.socket_path() +
                               "' lost"));
  EXPECT_THAT(error, HasSubstr("closed the connection"));
  EXPECT_THAT(error, HasSubstr("the daemon of node 0 died or was stopped"));
  EXPECT_EQ(sparsync_post_ready(client_, id), SPARSYNC_ERR_UNAVAILABLE) << "the failure sticks";
  EXPECT_EQ(LastError(), error);
}

TEST_F(ClientTest, ThreadsWaitingOnDifferentTensorsEachSeeTheirOwnDone) {
  constexpr int kTensors = 4;
  Connect();
  std::vector<uint32_t> ids(kTensors);
  std::vector<float*> data(kTensors);
  std::vector<std::string> names;
  for (int t = 0; t < kTensors; ++t) names.push_back("t" + std::to_string(t));
  for (int t = 0; t < kTensors; ++t) {
    ids[t] = RegisterFloats(names[t].c_str(), 8, &data[t]);
    ASSERT_EQ(sparsync_post_ready(client_, ids[t]), SPARSYNC_OK);
  }
  std::vector<std::atomic<bool>> answered(kTensors);
  std::vector<Clock::time_point> answered_at(kTensors), returned_at(kTensors);
  std::vector<sparsync_status> got(kTensors, SPARSYNC_ERR_INTERNAL);
  std::vector<char> early(kTensors, 0);  // not vector<bool>: one thread writes each element
  std::vector<std::thread> waiters;
  for (int t = 0; t < kTensors; ++t) {
    waiters.emplace_back([&, t] {
      got[t] = sparsync_wait_done(client_, ids[t], 20.0);
      returned_at[t] = Clock::now();
      early[t] = !answered[t].load();
    });
  }
  auto readies = daemon_.WaitForReadies(kTensors, std::chrono::seconds(10));
  ASSERT_EQ(readies.size(), static_cast<size_t>(kTensors));
  // Answer in reverse order, one at a time: whichever thread receives must hand each DONE to
  // the thread that waits for it.
  for (int i = kTensors - 1; i >= 0; --i) {
    const ScriptedDaemon::Ready& r = readies[i];
    auto* x = static_cast<float*>(r.region->data());
    for (int k = 0; k < 8; ++k) x[k] = 100.0f * static_cast<float>(r.tensor_id) + k;
    answered_at[i] = Clock::now();
    answered[i] = true;  // readies are in posting order: readies[i] is tensor ids[i]
    ScriptedDaemon::SendDone(r, SPARSYNC_OK);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  for (auto& w : waiters) w.join();
  for (int t = 0; t < kTensors; ++t) {
    ASSERT_EQ(readies[t].tensor_id, ids[t]);
    EXPECT_EQ(got[t], SPARSYNC_OK) << names[t];
    EXPECT_FALSE(early[t]) << names[t] << " returned before its DONE was sent";
    // Woken by whichever thread received its DONE, not by its own deadline.
    EXPECT_LT(std::chrono::duration<double>(returned_at[t] - answered_at[t]).count(), 2.0)
        << names[t];
    for (int k = 0; k < 8; ++k) EXPECT_EQ(data[t][k], 100.0f * static_cast<float>(ids[t]) + k);
  }
}

// sparsync_register_tensor_fd: the caller maps the buffer; its mapping is the daemon's memory
// (round trips land in it) and outlives the unregistration and the connection.
TEST_F(ClientTest, ACallerMappedBufferIsTheDaemonsAndOutlivesTheClient) {
  daemon_.SetOnReady(DoubleAndAnswer);
  Connect();
  const int64_t n = 5;
  sparsync_tensor_spec spec = Spec("mapped.by.caller", SPARSYNC_OP_ALLREDUCE, SPARSYNC_FLOAT32, 1,
                                   &n);
  uint32_t id = 0;
  int fd = -1;
  uint64_t bytes = 0;
  ASSERT_EQ(sparsync_register_tensor_fd(client_, &spec, &id, &fd, &bytes), SPARSYNC_OK)
      << LastError();
  ASSERT_GE(fd, 0);
  ASSERT_EQ(bytes, n * sizeof(float));
  void* mapped = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_NE(mapped, MAP_FAILED);
  close(fd);
  auto* x = static_cast<float*>(mapped);
  for (int i = 0; i < n; ++i) x[i] = static_cast<float>(i);
  ASSERT_EQ(sparsync_post_ready(client_, id), SPARSYNC_OK) << LastError();
  ASSERT_EQ(sparsync_wait_done(client_, id, 10.0), SPARSYNC_OK) << LastError();
  for (int i = 0; i < n; ++i) EXPECT_EQ(x[i], 2.0f * i + 1) << i;
  ASSERT_EQ(sparsync_unregister_tensor(client_, id), SPARSYNC_OK) << LastError();
  sparsync_close(client_);
  client_ = nullptr;
  daemon_.Stop();
  x[0] = 42.0f;  // still the caller's memory
  EXPECT_EQ(x[0], 42.0f);
  EXPECT_EQ(x[n - 1], 2.0f * (n - 1) + 1);
  EXPECT_EQ(munmap(mapped, bytes), 0);
  EXPECT_EQ(sparsync_register_tensor_fd(nullptr, &spec, &id, &fd, &bytes), SPARSYNC_ERR_INVALID);
}

TEST_F(ClientTest, UnregisterTellsTheDaemonAndForgetsTheTensor) {
  daemon_.SetOnReady(DoubleAndAnswer);
  Connect();
  float* x = nullptr;
  uint32_t id = RegisterFloats("temporary", 2, &x);
  ASSERT_EQ(sparsync_unregister_tensor(client_, id), SPARSYNC_OK) << LastError();
  EXPECT_EQ(sparsync_post_ready(client_, id), SPARSYNC_ERR_INVALID);
  EXPECT_THAT(LastError(),
              HasSubstr("post_ready: tensor id " + std::to_string(id) + " is not registered"));
  EXPECT_EQ(sparsync_unregister_tensor(client_, id), SPARSYNC_ERR_INVALID);
  // The UNREGISTER travels without a reply: a later round trip on the connection shows it
  // arrived before.
  float* y = nullptr;
  uint32_t other = RegisterFloats("kept", 2, &y);
  ASSERT_EQ(sparsync_post_ready(client_, other), SPARSYNC_OK);
  ASSERT_EQ(sparsync_wait_done(client_, other, 10.0), SPARSYNC_OK) << LastError();
  EXPECT_EQ(daemon_.unregistered(), std::vector<uint32_t>{id});
}

TEST_F(ClientTest, UnregisteringATensorReleasesItsWaiter) {
  Connect();
  float* x = nullptr;
  float* y = nullptr;
  uint32_t dropped = RegisterFloats("dropped", 2, &x);
  uint32_t other = RegisterFloats("other", 2, &y);
  ASSERT_EQ(sparsync_post_ready(client_, dropped), SPARSYNC_OK);
  ASSERT_EQ(sparsync_post_ready(client_, other), SPARSYNC_OK);
  sparsync_status got = SPARSYNC_OK;
  auto start = Clock::now();
  std::thread waiter([&] { got = sparsync_wait_done(client_, dropped, 20.0); });
  auto readies = daemon_.WaitForReadies(2, std::chrono::seconds(10));
  ASSERT_EQ(readies.size(), 2u);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the waiter is receiving
  ASSERT_EQ(sparsync_unregister_tensor(client_, dropped), SPARSYNC_OK);
  ScriptedDaemon::SendDone(readies[1], SPARSYNC_OK);  // wakes the receiving waiter
  waiter.join();
  EXPECT_LT(SecondsSince(start), 10.0);
  EXPECT_EQ(got, SPARSYNC_ERR_INVALID);
  EXPECT_THAT(LastError(), HasSubstr("'dropped' was unregistered while waiting"));
  // The dropped tensor's late DONE is ignored; the connection carries on.
  ScriptedDaemon::SendDone(readies[0], SPARSYNC_OK);
  EXPECT_EQ(sparsync_wait_done(client_, other, 10.0), SPARSYNC_OK) << LastError();
  daemon_.SetOnReady(DoubleAndAnswer);
  ASSERT_EQ(sparsync_post_ready(client_, other), SPARSYNC_OK);
  EXPECT_EQ(sparsync_wait_done(client_, other, 10.0), SPARSYNC_OK) << LastError();
}

TEST_F(ClientTest, BadArgumentsAreInvalidWithAReason) {
  Connect();
  int64_t shape[1] = {-3};
  sparsync_tensor_spec spec = Spec("neg", SPARSYNC_OP_ALLREDUCE, SPARSYNC_FLOAT32, 1, shape);
  uint32_t id;
  void* data;
  uint64_t bytes;
  EXPECT_EQ(sparsync_register_tensor(client_, &spec, &id, &data, &bytes), SPARSYNC_ERR_INVALID);
  EXPECT_THAT(LastError(), HasSubstr("tensor 'neg' has a negative dimension"));
  EXPECT_EQ(sparsync_register_tensor(client_, nullptr, &id, &data, &bytes), SPARSYNC_ERR_INVALID);
  EXPECT_THAT(LastError(), HasSubstr("null argument"));
  EXPECT_EQ(sparsync_post_ready(nullptr, 0), SPARSYNC_ERR_INVALID);
  EXPECT_STREQ(sparsync_last_error(nullptr), "sparsync: null client handle");
  EXPECT_TRUE(daemon_.registrations().empty()) << "nothing invalid reaches the daemon";
}

// The CUDA runtime comes from the connect options; SPARSYNC_CUDART in the environment is the
// shims' business and the library ignores it.
TEST_F(ClientTest, TheCudaRuntimeIsTheOneTheOptionsName) {
  setenv("SPARSYNC_CUDART", "/nonexistent/from-the-environment.so", 1);
  sparsync_connect_options o = Options();
  o.cuda_runtime = "/nonexistent/from-the-options.so";
  char error[512] = "";
  ASSERT_EQ(sparsync_connect_with_options(&o, &client_, error, sizeof(error)), SPARSYNC_OK)
      << error;
  int64_t shape[1] = {4};
  sparsync_tensor_spec spec = Spec("gpu.w", SPARSYNC_OP_GRADIENT, SPARSYNC_FLOAT32, 1, shape);
  uint32_t id;
  static float fake_device_memory[4];
  EXPECT_EQ(sparsync_register_cuda_tensor(client_, &spec, 0, fake_device_memory, &id),
            SPARSYNC_ERR_UNAVAILABLE);
  EXPECT_THAT(LastError(), HasSubstr("tensor 'gpu.w' is on CUDA device 0 but the sparsync "
                                     "client cannot use CUDA"));
  EXPECT_THAT(LastError(), HasSubstr("/nonexistent/from-the-options.so"));
  EXPECT_EQ(LastError().find("from-the-environment"), std::string::npos) << LastError();
  unsetenv("SPARSYNC_CUDART");
}

// The timeline's control: the path reaches the daemon, "" (or NULL) stops, and the daemon's
// refusal comes back with its reason and the path.
TEST_F(ClientTest, TimelineRequestsReachTheDaemonAndItsAnswerComesBack) {
  Connect();
  EXPECT_EQ(sparsync_timeline(client_, "/tmp/t-{node}.json", 5.0), SPARSYNC_OK) << LastError();
  EXPECT_EQ(sparsync_timeline(client_, nullptr, 5.0), SPARSYNC_OK) << LastError();
  EXPECT_EQ(daemon_.timelines(), (std::vector<std::string>{"/tmp/t-{node}.json", ""}));
  daemon_.timeline_answer = InvalidArgument("cannot create the timeline file");
  EXPECT_EQ(sparsync_timeline(client_, "/nope/t.json", 5.0), SPARSYNC_ERR_INVALID);
  EXPECT_NE(LastError().find("cannot create the timeline file"), std::string::npos)
      << LastError();
  EXPECT_NE(LastError().find("/nope/t.json"), std::string::npos) << LastError();
  const std::string too_long(SPARSYNC_MAX_PATH_BYTES + 1, 'x');
  EXPECT_EQ(sparsync_timeline(client_, too_long.c_str(), 5.0), SPARSYNC_ERR_INVALID);
  EXPECT_EQ(daemon_.timelines().size(), 3u) << "an invalid path was sent";
}

// hvd.join(): one JOIN however often the caller waits again after a timeout; the reply's rank,
// or its error with the daemon's message.
TEST_F(ClientTest, JoinWaitsAcrossTimeoutsForTheDaemonsAnswer) {
  Connect();
  // The intake thread records a JOIN soon after it is sent.
  auto joins_reach = [&](size_t n) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (daemon_.joins() < n && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return daemon_.joins();
  };
  int32_t last = -1;
  EXPECT_EQ(sparsync_join(client_, 0.05, &last), SPARSYNC_ERR_TIMEOUT);
  ASSERT_EQ(joins_reach(1), 1u);
  EXPECT_EQ(sparsync_join(client_, 0.05, &last), SPARSYNC_ERR_TIMEOUT);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(daemon_.joins(), 1u) << "a second JOIN was sent";
  daemon_.AnswerJoin(Status::Ok(), 3);
  EXPECT_EQ(sparsync_join(client_, 5.0, &last), SPARSYNC_OK) << LastError();
  EXPECT_EQ(last, 3);
  EXPECT_EQ(sparsync_join(client_, 0.05, &last), SPARSYNC_ERR_TIMEOUT);
  ASSERT_EQ(joins_reach(2), 2u) << "a new join after an answered one sends JOIN again";
  daemon_.AnswerJoin(Aborted("node 1 died"), -1);
  EXPECT_EQ(sparsync_join(client_, 5.0, &last), SPARSYNC_ERR_ABORTED);
  EXPECT_NE(LastError().find("node 1 died"), std::string::npos) << LastError();
  EXPECT_EQ(sparsync_join(client_, 1.0, nullptr), SPARSYNC_ERR_INVALID);
}

}  // namespace
}  // namespace sparsync::client_test
