// The TensorFlow kernels' framework-neutral part (shims/tensorflow/collectives.h and
// completion_pool.h) against the daemon's real intake server with a scripted handler, in one
// process: requests are posted without waiting, completed on pool threads in whatever order the
// daemon answers, and every `done` is called exactly once, also on failure and on Close.
#include "shims/tensorflow/collectives.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "daemon/intake/shared_region.h"
#include "tests/unit/shims/client/scripted_daemon.h"

namespace sparsync::tensorflow_shim {
namespace {

using client_test::ScriptedDaemon;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

// A request's end as the test sees it: the outcome, once.
struct Answer {
  std::promise<Outcome> promise;
  std::future<Outcome> future = promise.get_future();
  std::atomic<int> calls{0};
};

// One float32 tensor of a request with its own input and output buffers.
struct Floats {
  Floats() = default;
  explicit Floats(std::vector<float> in) : input(std::move(in)) {}
  std::vector<float> input, output;
  std::shared_ptr<Answer> answer = std::make_shared<Answer>();
};

Request FloatRequest(const std::string& name, Floats* f, sparsync_op op = SPARSYNC_OP_ALLREDUCE) {
  Request r;
  r.tensor.name = name;
  r.tensor.op = op;
  r.tensor.dtype = SPARSYNC_FLOAT32;
  r.tensor.shape = {static_cast<int64_t>(f->input.size())};
  f->output.assign(f->input.size(), -1.0f);
  r.input = f->input.data();
  r.output = f->output.data();
  auto answer = f->answer;
  r.done = [answer](const Outcome& o) {
    if (answer->calls++ == 0) answer->promise.set_value(o);
  };
  return r;
}

// Answers a READY: each float becomes 10 * x.
void TimesTen(const ScriptedDaemon::Ready& r) {
  auto* x = static_cast<float*>(r.region->data());
  for (size_t i = 0; i < r.region->size() / sizeof(float); ++i) x[i] *= 10;
  ScriptedDaemon::SendDone(r, SPARSYNC_OK);
}

class CollectivesTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(daemon_.Start()); }
  void TearDown() override {
    collectives_.Close();
    daemon_.Stop();
  }
  void Connect() {
    ConnectSettings s;
    s.socket_path = daemon_.socket_path();
    s.job_token = "t0k";
    s.connect_timeout_s = 5;
    s.wait_timeout_s = 20;
    s.timeout_hint = "SPARSYNC_TIMEOUT_S=15 plus 5 s";
    sparsync_world w{};
    Outcome o = collectives_.Connect(s, &w);
    ASSERT_TRUE(o.ok()) << o.message;
    EXPECT_EQ(w.size, 1u);
  }
  static Outcome Wait(Floats& f) {
    EXPECT_EQ(f.answer->future.wait_for(10s), std::future_status::ready);
    return f.answer->future.get();
  }

  ScriptedDaemon daemon_;
  Collectives collectives_;
};

TEST_F(CollectivesTest, BeforeConnectEveryRequestIsRefusedNamingInit) {
  Floats f({1, 2});
  collectives_.Enqueue(FloatRequest("x", &f));
  Outcome o = Wait(f);
  EXPECT_EQ(o.status, SPARSYNC_ERR_INVALID);
  EXPECT_THAT(o.message, HasSubstr("hvd.init()"));
}

TEST_F(CollectivesTest, TheResultLandsInTheOutputAndTheRegistrationIsReused) {
  Connect();
  daemon_.SetOnReady(TimesTen);
  for (int step = 0; step < 3; ++step) {
    Floats f({1, 2, 3});
    collectives_.Enqueue(FloatRequest("x", &f));
    Outcome o = Wait(f);
    ASSERT_TRUE(o.ok()) << o.message;
    EXPECT_EQ(f.output, (std::vector<float>{10, 20, 30}));
    EXPECT_EQ(f.answer->calls.load(), 1);
  }
  EXPECT_EQ(daemon_.registrations().size(), 1u);  // one region for all three steps
}

TEST_F(CollectivesTest, ANewShapeUnderTheSameNameRegistersAgain) {
  Connect();
  daemon_.SetOnReady(TimesTen);
  Floats a({1, 2}), b({1, 2, 3, 4});
  collectives_.Enqueue(FloatRequest("x", &a));
  ASSERT_TRUE(Wait(a).ok());
  collectives_.Enqueue(FloatRequest("x", &b));
  ASSERT_TRUE(Wait(b).ok());
  EXPECT_EQ(b.output, (std::vector<float>{10, 20, 30, 40}));
  auto regs = daemon_.registrations();
  ASSERT_EQ(regs.size(), 2u);
  EXPECT_EQ(regs[1].shape[0], 4);
  EXPECT_THAT(daemon_.unregistered(), ::testing::ElementsAre(regs[0].tensor_id));
  // The first spec keeps the name; the later one is known by a name of its own, so that another
  // worker of the node still holding the first spec is no mismatch. Back to the first spec, the
  // first name again.
  EXPECT_STREQ(regs[0].name, "x");
  EXPECT_THAT(std::string(regs[1].name), ::testing::MatchesRegex("x#[0-9a-f]{16}"));
  Floats c({5, 6});
  collectives_.Enqueue(FloatRequest("x", &c));
  ASSERT_TRUE(Wait(c).ok());
  EXPECT_EQ(c.output, (std::vector<float>{50, 60}));
  regs = daemon_.registrations();
  ASSERT_EQ(regs.size(), 3u);
  EXPECT_STREQ(regs[2].name, "x");
}

TEST_F(CollectivesTest, EnqueueReturnsWhileTheDaemonHasNotAnswered) {
  Connect();
  Floats warm({1});
  daemon_.SetOnReady(TimesTen);
  collectives_.Enqueue(FloatRequest("x", &warm));
  ASSERT_TRUE(Wait(warm).ok());
  daemon_.SetOnReady(nullptr);  // READYs are recorded, not answered
  Floats f({5});
  auto start = std::chrono::steady_clock::now();
  collectives_.Enqueue(FloatRequest("x", &f));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1s);
  auto readies = daemon_.WaitForReadies(2, 5s);  // the warm-up's and this one
  ASSERT_EQ(readies.size(), 2u);
  EXPECT_EQ(f.answer->future.wait_for(200ms), std::future_status::timeout);
  TimesTen(readies[1]);
  ASSERT_TRUE(Wait(f).ok());
  EXPECT_EQ(f.output, std::vector<float>{50});
}

TEST_F(CollectivesTest, ASecondRequestOfATensorInFlightFailsNamingIt) {
  Connect();
  Floats first({1}), second({2});
  collectives_.Enqueue(FloatRequest("w", &first));
  ASSERT_EQ(daemon_.WaitForReadies(1, 5s).size(), 1u);
  collectives_.Enqueue(FloatRequest("w", &second));
  Outcome o = Wait(second);
  EXPECT_EQ(o.status, SPARSYNC_ERR_INVALID);
  EXPECT_THAT(o.message, HasSubstr("'w' is already in flight"));
  TimesTen(daemon_.WaitForReadies(1, 5s)[0]);
  EXPECT_TRUE(Wait(first).ok());
}

TEST_F(CollectivesTest, CompletionsInAnyOrderAllArrive) {
  Connect();
  constexpr int kTensors = 40;
  std::vector<Floats> fs(kTensors);
  for (int i = 0; i < kTensors; ++i) {
    fs[i].input = {static_cast<float>(i)};
    collectives_.Enqueue(FloatRequest("t" + std::to_string(i), &fs[i]));
  }
  auto readies = daemon_.WaitForReadies(kTensors, 10s);
  ASSERT_EQ(readies.size(), static_cast<size_t>(kTensors));
  // The daemon answers the last posted first: no request waits behind an earlier one.
  for (int i = kTensors - 1; i >= 0; --i) {
    TimesTen(readies[i]);
    const std::string name = readies[i].name;
    int index = std::stoi(name.substr(1));
    Outcome o = Wait(fs[index]);
    ASSERT_TRUE(o.ok()) << name << ": " << o.message;
    EXPECT_EQ(fs[index].output, std::vector<float>{10.0f * index});
  }
}

TEST_F(CollectivesTest, TheDaemonsErrorReachesDoneWithItsCode) {
  Connect();
  daemon_.SetOnReady([](const ScriptedDaemon::Ready& r) {
    ScriptedDaemon::SendDone(r, SPARSYNC_ERR_MISMATCH,
                             "tensor 'x' has shape [2] on node 0 but [3] on node 1");
  });
  Floats f({1, 2});
  collectives_.Enqueue(FloatRequest("x", &f));
  Outcome o = Wait(f);
  EXPECT_EQ(o.status, SPARSYNC_ERR_MISMATCH);
  EXPECT_THAT(o.message, HasSubstr("[3] on node 1"));
}

TEST_F(CollectivesTest, CloseAnswersWhatIsInFlightAndLaterRequestsAreRefused) {
  Connect();
  Floats f({1});
  collectives_.Enqueue(FloatRequest("x", &f));
  ASSERT_EQ(daemon_.WaitForReadies(1, 5s).size(), 1u);  // never answered
  auto start = std::chrono::steady_clock::now();
  collectives_.Close();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  Outcome o = Wait(f);
  EXPECT_EQ(o.status, SPARSYNC_ERR_ABORTED);
  EXPECT_THAT(o.message, HasSubstr("shut down"));
  EXPECT_THAT(o.message, HasSubstr("'x'"));
  Floats later({1});
  collectives_.Enqueue(FloatRequest("x", &later));
  EXPECT_EQ(Wait(later).status, SPARSYNC_ERR_INVALID);
}

TEST_F(CollectivesTest, AllgatherAsksForItsOutputOnceTheRowsAreKnown) {
  Connect();
  Floats f({1, 2, 3, 4});
  Request r = FloatRequest("g", &f, SPARSYNC_OP_ALLGATHER);
  r.tensor.shape = {2, 2};
  std::vector<float> gathered;
  int64_t rows = -1;
  r.allocate = [&](int64_t dim0, uint64_t bytes, std::string*) -> void* {
    rows = dim0;
    gathered.assign(bytes / sizeof(float), 0);
    return gathered.data();
  };
  collectives_.Enqueue(std::move(r));
  auto readies = daemon_.WaitForReadies(1, 5s);
  ASSERT_EQ(readies.size(), 1u);
  // The result travels in a region of its own: rows of two ranks, 2 + 1.
  std::vector<float> result = {1, 2, 3, 4, 7, 8};
  char name[] = "/sparsync-gather-test";
  auto region = intake::SharedRegion::Create(name, result.size() * sizeof(float));
  ASSERT_TRUE(region.ok());
  memcpy((*region)->data(), result.data(), result.size() * sizeof(float));
  ScriptedDaemon::SendDone(readies[0], SPARSYNC_OK, "", result.size() * sizeof(float), 3,
                           (*region)->fd());
  ASSERT_TRUE(Wait(f).ok());
  EXPECT_EQ(rows, 3);
  EXPECT_EQ(gathered, result);
}

TEST(CompletionPoolTest, GrowsToTheTasksThatWaitAndRunsQueuedOnesAtStop) {
  CompletionPool pool(8);
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  std::atomic<int> ran{0};
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(pool.Submit([&] {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return release; });
      ++ran;
    }));
  }
  EXPECT_EQ(pool.threads(), 8u);             // eight blocked tasks, eight threads
  ASSERT_TRUE(pool.Submit([&] { ++ran; }));  // past the cap: queued
  EXPECT_EQ(pool.threads(), 8u);
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
  }
  cv.notify_all();
  pool.Stop();
  EXPECT_EQ(ran.load(), 9);
  EXPECT_FALSE(pool.Submit([] {}));
}

TEST(CompletionPoolTest, AnIdleThreadIsReused) {
  CompletionPool pool;
  for (int i = 0; i < 20; ++i) {
    std::promise<void> done;
    ASSERT_TRUE(pool.Submit([&] { done.set_value(); }));
    done.get_future().wait();
    // The thread may not be back in its wait yet (on a loaded machine it can take a while):
    // give it time, so that one or two threads serve all twenty, never twenty.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_LE(pool.threads(), 2u);
}

}  // namespace
}  // namespace sparsync::tensorflow_shim
