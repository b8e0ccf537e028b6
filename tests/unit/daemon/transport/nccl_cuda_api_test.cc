// NcclTransport over the real NcclApi (CudaNcclApi), which loads NCCL and the CUDA runtime at run
// time, here the fakes of both (tests/support/fake_nccl, tests/support/fake_cudart): the calls
// the API makes, the non-blocking communicator's states, one node and two nodes as threads, and
// how NCCL's and CUDA's errors reach the caller. The fakes check what they are given (buffers on
// the communicator's device, no call while one is in progress, matching collectives), and every
// test ends with nothing left open and no misuse.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "daemon/transport/nccl/create_nccl_transport.h"
#include "tests/unit/daemon/transport/memory_store.h"

namespace sparsync::transport {
namespace {

using namespace std::chrono_literals;

// The fakes' test hooks, from the same loaded libraries that the transport opens.
struct Fakes {
  size_t (*nccl_journal)(char*, size_t);
  size_t (*nccl_misuse)(char*, size_t);
  int (*live_comms)();
  void (*nccl_fail_next)(const char*, int);
  void (*set_enqueue_polls)(int);
  int (*cuda_live)(const char*);
  size_t (*cuda_misuse)(char*, size_t);
  void (*set_devices)(int);
  void (*cuda_fail_next)(const char*, int);
  int (*set_device)(int);
  int (*get_last_error)();
  int (*malloc)(void**, size_t);
  int (*free)(void*);
  int (*memcpy)(void*, const void*, size_t, int);

  static Fakes Load() {
    Fakes f{};
    void* nccl = dlopen(SPARSYNC_FAKE_NCCL, RTLD_NOW | RTLD_LOCAL);
    void* cuda = dlopen(SPARSYNC_FAKE_CUDART, RTLD_NOW | RTLD_LOCAL);
    EXPECT_NE(nccl, nullptr) << dlerror();
    EXPECT_NE(cuda, nullptr) << dlerror();
    auto bind = [](void* lib, auto* fn, const char* name) {
      *fn = reinterpret_cast<std::remove_reference_t<decltype(*fn)>>(dlsym(lib, name));
      EXPECT_NE(*fn, nullptr) << name;
    };
    bind(nccl, &f.nccl_journal, "sparsync_fake_nccl_journal");
    bind(nccl, &f.nccl_misuse, "sparsync_fake_nccl_misuse");
    bind(nccl, &f.live_comms, "sparsync_fake_nccl_live_comms");
    bind(nccl, &f.nccl_fail_next, "sparsync_fake_nccl_fail_next");
    bind(nccl, &f.set_enqueue_polls, "sparsync_fake_nccl_set_enqueue_polls");
    bind(cuda, &f.cuda_live, "sparsync_fake_cuda_live");
    bind(cuda, &f.cuda_misuse, "sparsync_fake_cuda_misuse");
    bind(cuda, &f.set_devices, "sparsync_fake_cuda_set_devices");
    bind(cuda, &f.cuda_fail_next, "sparsync_fake_cuda_fail_next");
    bind(cuda, &f.set_device, "cudaSetDevice");
    bind(cuda, &f.get_last_error, "cudaGetLastError");
    bind(cuda, &f.malloc, "cudaMalloc");
    bind(cuda, &f.free, "cudaFree");
    bind(cuda, &f.memcpy, "cudaMemcpy");
    return f;
  }

  static std::string Take(size_t (*fn)(char*, size_t)) {  // reading clears
    std::string s(1 << 16, '\0');
    s.resize(std::min(fn(s.data(), s.size()), s.size() - 1));
    return s;
  }
  std::string TakeJournal() const { return Take(nccl_journal); }
  std::string TakeNcclMisuse() const { return Take(nccl_misuse); }
  std::string TakeCudaMisuse() const { return Take(cuda_misuse); }
};

constexpr int kCudaMemcpyHostToDevice = 1;
constexpr int kCudaMemcpyDeviceToHost = 2;

// Whether `text` holds every one of `parts`, in this order.
::testing::AssertionResult InOrder(const std::string& text, const std::vector<std::string>& parts) {
  size_t at = 0;
  for (const std::string& part : parts) {
    const size_t found = text.find(part, at);
    if (found == std::string::npos) {
      return ::testing::AssertionFailure()
             << "'" << part << "' is not after offset " << at << " of:\n"
             << text;
    }
    at = found + part.size();
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult Has(const Status& st, StatusCode code, const std::string& text) {
  if (st.code() == code && st.message().find(text) != std::string::npos) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "wanted code " << static_cast<int>(code) << " with '"
                                       << text << "', got " << st.ToString();
}

class CudaNcclApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fakes_ = Fakes::Load();
    fakes_.TakeJournal();
    allocations_before_ = fakes_.cuda_live("allocations");
    streams_before_ = fakes_.cuda_live("streams");
  }

  void TearDown() override {
    EXPECT_EQ(fakes_.live_comms(), 0) << "a communicator was left open";
    EXPECT_EQ(fakes_.cuda_live("allocations"), allocations_before_) << "device memory leaked";
    EXPECT_EQ(fakes_.cuda_live("host_allocations"), 0) << "pinned memory leaked";
    EXPECT_EQ(fakes_.cuda_live("streams"), streams_before_) << "a stream leaked";
    EXPECT_EQ(fakes_.TakeNcclMisuse(), "") << "NCCL was misused";
    EXPECT_EQ(fakes_.TakeCudaMisuse(), "") << "the CUDA runtime was misused";
    fakes_.set_devices(4);
    fakes_.set_enqueue_polls(0);
  }

  // Node `rank` of `size`, on CUDA device `rank`.
  Result<std::unique_ptr<Transport>> Create(int rank, int size, RendezvousStore* store,
                                            std::chrono::milliseconds timeout = 10s) {
    return CreateNcclTransport(rank, size, store, timeout, /*device=*/rank, libraries_);
  }

  // Runs `node(rank, transport)` for nodes 0 and 1 of one job (each on the CUDA device of its
  // rank), each in a thread of its own; returns what each returned, or why its transport could
  // not be made. The transports are gone when it returns.
  std::array<Status, 2> TwoNodes(std::chrono::milliseconds timeout,
                                 const std::function<Status(int, Transport&)>& node) {
    MemoryStore store;
    std::array<Status, 2> out;
    auto run = [&](int rank) {
      auto created = Create(rank, 2, &store, timeout);
      out[rank] = created.ok() ? node(rank, **created) : created.status();
    };
    std::thread one(run, 1);
    run(0);
    one.join();
    return out;
  }

  Fakes fakes_{};
  NcclLibraries libraries_{SPARSYNC_FAKE_CUDART, SPARSYNC_FAKE_NCCL};
  int allocations_before_ = 0;
  int streams_before_ = 0;
};

TEST_F(CudaNcclApiTest, OneNodeRunsEveryCallThroughNcclAndTheCudaRuntime) {
  fakes_.set_enqueue_polls(2);  // every non-blocking call is "in progress" for two polls
  MemoryStore store;
  auto created = CreateNcclTransport(0, 1, &store, 10s, /*device=*/2, libraries_);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  Transport& t = **created;
  EXPECT_EQ(t.cuda_device(), 2);
  EXPECT_EQ(store.Peek("nccl/unique_id")->size(), 256u) << "128 bytes, hex-encoded";

  std::vector<float> f = {1.5f, -2.0f, 3.25f};
  ASSERT_TRUE(t.AllReduceSum(f.data(), f.size(), ElementType::kFloat32, 1).ok());
  EXPECT_EQ(f, (std::vector<float>{1.5f, -2.0f, 3.25f})) << "a sum over one node is the identity";
  std::vector<int64_t> i64 = {int64_t{1} << 50, -3};
  ASSERT_TRUE(t.AllReduceSum(i64.data(), i64.size(), ElementType::kInt64, 2).ok());
  EXPECT_EQ(i64, (std::vector<int64_t>{int64_t{1} << 50, -3}));
  const std::string mine = "sparsync";
  std::string all(mine.size(), '?');
  const std::vector<size_t> sizes = {mine.size()};
  ASSERT_TRUE(t.AllGatherV(mine.data(), mine.size(), all.data(), sizes, 3).ok());
  EXPECT_EQ(all, mine);
  std::string b = "broadcast";
  ASSERT_TRUE(t.Broadcast(b.data(), b.size(), 0, 4).ok());
  EXPECT_EQ(b, "broadcast");

  // The caller's device memory, on the transport's device.
  ASSERT_EQ(fakes_.set_device(2), 0);
  void* device = nullptr;
  ASSERT_EQ(fakes_.malloc(&device, 4 * sizeof(double)), 0);
  const std::vector<double> values = {0.5, 1.5, -2.5, 1e300};
  ASSERT_EQ(fakes_.memcpy(device, values.data(), 32, kCudaMemcpyHostToDevice), 0);
  ASSERT_TRUE(t.AllReduceSumOnDevice(device, values.size(), ElementType::kFloat64, 5).ok());
  std::vector<double> back(values.size());
  ASSERT_EQ(fakes_.memcpy(back.data(), device, 32, kCudaMemcpyDeviceToHost), 0);
  EXPECT_EQ(back, values);
  EXPECT_EQ(fakes_.free(device), 0);
  created->reset();  // finalises and destroys the communicator

  EXPECT_TRUE(InOrder(
      fakes_.TakeJournal(),
      {"rank=0 nranks=1 dev=2 blocking=0 name=sparsync", "allreduce clique=",
       "dev=2 count=3 dtype=7 op=0", "allreduce clique=", "count=2 dtype=4 op=0",
       "allgather clique=", "count=8 dtype=1", "broadcast clique=", "count=9 dtype=1 root=0",
       "allreduce clique=", "count=4 dtype=8 op=0", "finalize clique=", "destroy clique="}));
}

// The fake NCCL checks that it is given device memory of the communicator's device, as NCCL's
// kernels need: host memory, or another GPU's, fails the call.
TEST_F(CudaNcclApiTest, OnlyDeviceMemoryOfTheTransportsDeviceIsSummedOnTheDevice) {
  MemoryStore store;
  auto created = Create(0, 1, &store);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  std::vector<float> host(3, 1.0f);
  EXPECT_TRUE(Has((*created)->AllReduceSumOnDevice(host.data(), 3, ElementType::kFloat32, 1),
                  StatusCode::kInvalidArgument,
                  "invalid argument (ncclInvalidArgument): ncclAllReduce: clique="));
  EXPECT_NE(fakes_.TakeNcclMisuse().find("send buffer: 12 bytes that are not CUDA device memory"),
            std::string::npos);

  created = Create(0, 1, &store);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  ASSERT_EQ(fakes_.set_device(1), 0);
  void* other = nullptr;
  ASSERT_EQ(fakes_.malloc(&other, 12), 0);
  EXPECT_EQ((*created)->AllReduceSumOnDevice(other, 3, ElementType::kFloat32, 1).code(),
            StatusCode::kInvalidArgument);
  EXPECT_NE(fakes_.TakeNcclMisuse().find("is memory of CUDA device 1, but the communicator's rank "
                                         "is on device 0"),
            std::string::npos);
  EXPECT_EQ(fakes_.free(other), 0);
}

TEST_F(CudaNcclApiTest, TwoNodesAsThreadsSumGatherBroadcastAndExchange) {
  struct Outcome {
    std::vector<double> sum;
    std::string gathered, broadcast, received;
  };
  Outcome out[2];
  const auto st = TwoNodes(10s, [&](int rank, Transport& t) {
    Outcome& o = out[rank];
    o.sum = {1.0 + rank, 10.0 * rank, -0.25};
    SPARSYNC_RETURN_IF_ERROR(t.AllReduceSum(o.sum.data(), o.sum.size(), ElementType::kFloat64, 1));
    // Different sizes: a size exchange, then one allgather padded to the largest.
    const std::string mine = rank == 0 ? "abc" : "defgh";
    const std::vector<size_t> sizes = {3, 5};
    o.gathered.assign(8, '?');
    SPARSYNC_RETURN_IF_ERROR(t.AllGatherV(mine.data(), mine.size(), o.gathered.data(), sizes, 2));
    o.broadcast = rank == 1 ? "from node 1" : std::string(11, '?');
    SPARSYNC_RETURN_IF_ERROR(t.Broadcast(o.broadcast.data(), o.broadcast.size(), 1, 3));
    // A header exchange, then the payloads, as grouped sends and receives.
    const std::string send = rank == 0 ? "ping" : "pong!";
    o.received.assign(16, '?');
    size_t got = 0;
    Status sent = t.SendRecv(1 - rank, send.data(), send.size(), o.received.data(), 16, &got, 4);
    o.received.resize(got);
    return sent;
  });
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE("node " + std::to_string(rank));
    ASSERT_TRUE(st[rank].ok()) << st[rank].ToString();
    EXPECT_EQ(out[rank].sum, (std::vector<double>{3.0, 10.0, -0.5}));
    EXPECT_EQ(out[rank].gathered, "abcdefgh");
    EXPECT_EQ(out[rank].broadcast, "from node 1");
  }
  EXPECT_EQ(out[0].received, "pong!");
  EXPECT_EQ(out[1].received, "ping");
  const std::string journal = fakes_.TakeJournal();
  EXPECT_TRUE(
      InOrder(journal, {"rank=0 nranks=2 dev=0 blocking=0",
                        "allreduce clique=", "allgather clique=", "count=8 dtype=1",
                        "allgather clique=", "count=5 dtype=1", "broadcast clique=", "root=1"}));
  // The headers (byte count and capacity: 16 bytes) both ways, then 4 and 5 bytes of payload.
  EXPECT_TRUE(InOrder(journal, {"rank=0 peer=1 bytes=16", "rank=0 peer=1 bytes=4"}));
  EXPECT_TRUE(InOrder(journal, {"rank=1 peer=0 bytes=16", "rank=1 peer=0 bytes=5"}));
}

TEST_F(CudaNcclApiTest, NodesThatDisagreeOnACollectiveBothFail) {
  const auto st = TwoNodes(10s, [](int rank, Transport& t) {
    std::vector<float> v(3 + rank, 1.0f);  // 3 elements on node 0, 4 on node 1
    return t.AllReduceSum(v.data(), v.size(), ElementType::kFloat32, 7);
  });
  for (const Status& s : st) {
    EXPECT_TRUE(Has(s, StatusCode::kInvalidArgument, "invalid usage (ncclInvalidUsage)"));
  }
  EXPECT_NE(fakes_.TakeNcclMisuse().find("collective #0 is allreduce count="), std::string::npos);
}

TEST_F(CudaNcclApiTest, APeerThatAbortsIsARemoteErrorForTheOthers) {
  const auto st = TwoNodes(10s, [](int rank, Transport& t) {
    if (rank == 1) {
      std::this_thread::sleep_for(100ms);  // node 0 is waiting in its allreduce by now
      t.Abort(Aborted("node 1 is shutting down"));
      return Status::Ok();
    }
    float x = 1.0f;
    return t.AllReduceSum(&x, 1, ElementType::kFloat32, 1);
  });
  ASSERT_TRUE(st[1].ok()) << st[1].ToString();
  EXPECT_TRUE(Has(st[0], StatusCode::kUnavailable,
                  "remote process exited or there was a network error (ncclRemoteError)"));
  EXPECT_TRUE(Has(st[0], StatusCode::kUnavailable, "; a peer node failed or left"));
  EXPECT_TRUE(InOrder(fakes_.TakeJournal(), {"abort clique=", "abort clique="}));
  fakes_.TakeNcclMisuse();  // node 0 may have called on the failed communicator
}

TEST_F(CudaNcclApiTest, APeerThatNeverCallsMakesTheCallTimeOut) {
  const auto st = TwoNodes(300ms, [](int rank, Transport& t) {
    if (rank == 1) {
      std::this_thread::sleep_for(600ms);  // until node 0 has given up
      return Status::Ok();
    }
    float x = 1.0f;
    return t.AllReduceSum(&x, 1, ElementType::kFloat32, 9);
  });
  ASSERT_TRUE(st[1].ok()) << st[1].ToString();
  EXPECT_TRUE(Has(st[0], StatusCode::kDeadlineExceeded, "did not finish within 300 ms"));
  fakes_.TakeNcclMisuse();  // node 1 finalises a communicator that node 0 aborted
}

TEST_F(CudaNcclApiTest, NcclErrorsBecomeStatusCodesWithNcclsText) {
  MemoryStore store;
  fakes_.nccl_fail_next("ncclGetUniqueId", 2);  // ncclSystemError
  auto failed = Create(0, 1, &store);
  EXPECT_TRUE(Has(failed.status(), StatusCode::kUnavailable,
                  "making the NCCL unique id: ncclGetUniqueId: unhandled system error "
                  "(ncclSystemError): injected failure of ncclGetUniqueId; a network or system "
                  "call failed (check NCCL_SOCKET_IFNAME"));

  fakes_.nccl_fail_next("ncclCommInitRankConfig", 5);  // ncclInvalidUsage
  failed = Create(0, 1, &store);
  EXPECT_TRUE(Has(failed.status(), StatusCode::kInvalidArgument,
                  "ncclCommInitRankConfig: invalid usage (ncclInvalidUsage)"));

  struct Case {
    const char* call;
    int result;
    StatusCode code;
    const char* text;
  };
  const Case cases[] = {
      {"ncclAllReduce", 4, StatusCode::kInvalidArgument, "invalid argument (ncclInvalidArgument)"},
      {"ncclAllReduce", 1, StatusCode::kInternal, "unhandled cuda error (ncclUnhandledCudaError)"},
      {"ncclAllReduce", 3, StatusCode::kInternal, "internal error (ncclInternalError)"},
      {"ncclCommGetAsyncError", 6, StatusCode::kUnavailable,
       "NCCL communicator failed: remote process exited or there was a network error "
       "(ncclRemoteError)"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.call) + " fails with " + std::to_string(c.result));
    auto created = Create(0, 1, &store);
    ASSERT_TRUE(created.ok()) << created.status().ToString();
    fakes_.TakeJournal();
    fakes_.nccl_fail_next(c.call, c.result);
    float x = 1.0f;
    Status st = (*created)->AllReduceSum(&x, 1, ElementType::kFloat32, 1);
    EXPECT_TRUE(Has(st, c.code, c.text));
    EXPECT_TRUE(Has(st, c.code, "NCCL allreduce (tag 1, 4 bytes) on node 0 of 1"));
    EXPECT_EQ((*created)->AllReduceSum(&x, 1, ElementType::kFloat32, 2).code(), c.code)
        << "the failure is sticky";
    created->reset();
    EXPECT_NE(fakes_.TakeJournal().find("abort clique="), std::string::npos)
        << "a failed communicator is aborted, not finalised";
  }
}

TEST_F(CudaNcclApiTest, CudaErrorsBecomeStatusCodesWithTheRuntimesText) {
  MemoryStore store;
  auto created = Create(0, 1, &store);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  fakes_.cuda_fail_next("cudaMalloc", 2);  // cudaErrorMemoryAllocation
  float x = 1.0f;
  EXPECT_TRUE(Has((*created)->AllReduceSum(&x, 1, ElementType::kFloat32, 1),
                  StatusCode::kUnavailable,
                  "allocating a staging buffer: cudaMalloc on CUDA device 0: "
                  "cudaErrorMemoryAllocation (out of memory); the GPU is out of memory"));

  created = Create(0, 1, &store);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  fakes_.cuda_fail_next("cudaStreamQuery", 1);  // cudaErrorInvalidValue
  EXPECT_TRUE(Has((*created)->AllReduceSum(&x, 1, ElementType::kFloat32, 1), StatusCode::kInternal,
                  "cudaStreamQuery on CUDA device 0: cudaErrorInvalidValue (invalid argument)"));
}

TEST_F(CudaNcclApiTest, ALibraryThatDoesNotLoadIsNamed) {
  MemoryStore store;
  auto t = CreateNcclTransport(0, 1, &store, 1s, 0, {SPARSYNC_FAKE_CUDART, "/nonexistent/nccl.so"});
  EXPECT_TRUE(Has(t.status(), StatusCode::kUnavailable,
                  "NCCL transport (SPARSYNC_TRANSPORT=nccl) on node 0: "
                  "SPARSYNC_LIBNCCL=/nonexistent/nccl.so: cannot load NCCL"));

  t = CreateNcclTransport(0, 1, &store, 1s, 0, {"/nonexistent/cudart.so", SPARSYNC_FAKE_NCCL});
  EXPECT_TRUE(Has(t.status(), StatusCode::kUnavailable,
                  "SPARSYNC_CUDART=/nonexistent/cudart.so: no CUDA runtime could be loaded"));

  // A library that loads but is not NCCL.
  t = CreateNcclTransport(0, 1, &store, 1s, 0, {SPARSYNC_FAKE_CUDART, SPARSYNC_FAKE_CUDART});
  EXPECT_TRUE(
      Has(t.status(), StatusCode::kUnavailable, "is not a usable NCCL: it lacks ncclGetVersion"));
}

TEST_F(CudaNcclApiTest, WithoutACudaDeviceCreationSaysSo) {
  fakes_.set_devices(0);
  EXPECT_EQ(CudaDeviceCount(libraries_), 0);
  MemoryStore store;
  auto t = Create(0, 1, &store);
  EXPECT_TRUE(Has(t.status(), StatusCode::kUnavailable,
                  "no CUDA device (cudaGetDeviceCount of " SPARSYNC_FAKE_CUDART
                  "): cudaErrorNoDevice (no CUDA-capable device is detected); this machine has "
                  "no usable CUDA device"));
  EXPECT_EQ(fakes_.get_last_error(), 0) << "the failed probe's error was cleared";

  fakes_.set_devices(4);
  EXPECT_EQ(CudaDeviceCount(libraries_), 4);
  t = CreateNcclTransport(0, 1, &store, 1s, /*device=*/4, libraries_);
  EXPECT_TRUE(
      Has(t.status(), StatusCode::kInvalidArgument,
          "CUDA device 4 does not exist (this process sees 4; check CUDA_VISIBLE_DEVICES)"));
}

}  // namespace
}  // namespace sparsync::transport
