// The daemon's end of the CUDA IPC intake: the worker handler, the tensor table and the device
// intake (CUDA tensors, the local reduce) against the fake CUDA runtime (tests/support/
// fake_cudart) and the fake NCCL, with this test playing the worker in the same process.
#include "daemon/device/device_intake.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "daemon/intake/done.h"
#include "daemon/pipeline/delivery.h"
#include "daemon/pipeline/tensor_table.h"
#include "tests/unit/daemon/device/cuda_test_fixture.h"

namespace sparsync::device {
namespace {

using pipeline::GroupMember;
using test::CudaStagingTest;
using test::FakeCuda;
using test::DeviceTensor;
using test::kGuard;

TEST_F(CudaStagingTest, DataFlowsDeviceToStagingToDeviceInOrder) {
  DeviceTensor* t = NewTensor("fc.weight", 16, 256, 1024, 5);
  fake_.TakeJournal();
  ASSERT_EQ(Register(t).status, SPARSYNC_OK);
  // The staging is page-locked once, at registration.
  EXPECT_NE(fake_.TakeJournal().find("pin 64\n"), std::string::npos);
  EXPECT_EQ(fake_.Live("pinned"), 1);
  const std::vector<unsigned char> before = DeviceBytes(t);
  for (uint64_t round = 1; round <= 2; ++round) {
    ASSERT_EQ(fake_.EventRecord(t->ready, nullptr), 0);  // the shim wrote the buffer
    fake_.TakeJournal();
    ASSERT_TRUE(Ready(t, round).ok());
    ASSERT_EQ(WaitNotices(round), round);
    // The daemon's stream waited for the ready event before it copied, and the copy is complete.
    EXPECT_EQ(fake_.TakeJournal(), "wait " + Id(t->ready) + "\nD2H 64\nsync\n");
    std::vector<GroupMember> members = Resolve("fc.weight", 7);
    ASSERT_EQ(members.size(), 1u);
    ASSERT_EQ(members[0].parts.size(), 1u);
    const pipeline::WorkerPart& part = members[0].parts[0];
    ASSERT_NE(part.cuda, nullptr);
    float* staging = static_cast<float*>(part.region->data());
    for (size_t i = 0; i < 16; ++i) {
      ASSERT_EQ(staging[i], static_cast<float>(i) * 0.5f * static_cast<float>(round)) << i;
      staging[i] *= 2;  // the "reduced" result, doubled each round
    }
    pipeline::DeliverFromHost(members[0]);
    // The result went back to the device before the done event was recorded.
    EXPECT_EQ(fake_.TakeJournal(), "H2D 64\nrecord " + Id(t->done) + "\n");
    EXPECT_EQ(fake_.EventRecords(t->done), round);
    sparsync_done done = ReceiveDone();
    EXPECT_EQ(done.status, SPARSYNC_OK);
    EXPECT_EQ(done.round, round);
    std::vector<unsigned char> after = DeviceBytes(t);
    for (size_t b = 0; b < after.size(); ++b) {
      if (b >= 256 && b < 256 + 64) continue;
      ASSERT_EQ(after[b], before[b]) << "byte " << b << " outside the tensor changed";
    }
    for (size_t i = 0; i < 16; ++i) {
      float v;
      std::memcpy(&v, after.data() + 256 + i * 4, 4);
      ASSERT_EQ(v, static_cast<float>(i) * static_cast<float>(round)) << i;
    }
    table_->Finish(members);
  }
}

TEST_F(CudaStagingTest, AnErrorDoneLeavesTheDeviceBufferAlone) {
  DeviceTensor* t = NewTensor("w", 4, 0, 16, 1);
  ASSERT_EQ(Register(t).status, SPARSYNC_OK);
  ASSERT_EQ(fake_.EventRecord(t->ready, nullptr), 0);
  ASSERT_TRUE(Ready(t, 1).ok());
  ASSERT_EQ(WaitNotices(1), 1u);
  std::vector<GroupMember> members = Resolve("w", 1);
  ASSERT_EQ(members.size(), 1u);
  fake_.TakeJournal();
  const pipeline::WorkerPart& part = members[0].parts[0];
  ASSERT_TRUE(
      intake::SendDone(*part.session, part.tensor_id, part.round, Aborted("node 3 left")).ok());
  EXPECT_EQ(fake_.TakeJournal(), "");
  EXPECT_EQ(fake_.EventRecords(t->done), 0u);
  sparsync_done done = ReceiveDone();
  EXPECT_EQ(done.status, SPARSYNC_ERR_ABORTED);
  EXPECT_STREQ(done.message, "node 3 left");
}

TEST_F(CudaStagingTest, UnregisterAndDisconnectCloseTheWorkersHandles) {
  DeviceTensor* a = NewTensor("a", 8, 0, 64, 1);
  DeviceTensor* b = NewTensor("b", 8, 64, 256, 2);
  const int events = fake_.Live("events");
  ASSERT_EQ(Register(a).status, SPARSYNC_OK);
  ASSERT_EQ(Register(b).status, SPARSYNC_OK);
  EXPECT_EQ(fake_.Live("ipc_memory"), 2);
  // Per tensor: the daemon's copy of the ready event, its done event, and our opened done event.
  EXPECT_EQ(fake_.Live("events"), events + 2 * 3);

  sparsync_unregister_msg un{};
  un.tensor_id = 1;
  ASSERT_TRUE(table_->OnUnregister(session_, un).ok());
  EXPECT_EQ(fake_.Live("ipc_memory"), 1);
  EXPECT_EQ(fake_.Live("events"), events + 3 + 1);
  // No worker holds "a" any more: the reducers hear of it (and only once).
  EXPECT_EQ(table_->TakeReleased(), std::vector<std::string>{"a"});
  EXPECT_TRUE(table_->TakeReleased().empty());

  table_->OnDisconnect(session_, Unavailable("the worker was killed"));
  EXPECT_EQ(fake_.Live("ipc_memory"), 0);
  EXPECT_EQ(fake_.Live("events"), events + 2);  // only the done events this test opened
  EXPECT_EQ(table_->TakeReleased(), std::vector<std::string>{"b"});
}

TEST_F(CudaStagingTest, ATensorInFlightKeepsItsHandlesUntilTheGroupLetsGo) {
  DeviceTensor* t = NewTensor("g", 4, 0, 16, 1);
  ASSERT_EQ(Register(t).status, SPARSYNC_OK);
  ASSERT_EQ(fake_.EventRecord(t->ready, nullptr), 0);
  ASSERT_TRUE(Ready(t, 1).ok());
  ASSERT_EQ(WaitNotices(1), 1u);
  std::vector<GroupMember> members = Resolve("g", 1);
  table_->OnDisconnect(session_, Unavailable("the worker was killed"));
  EXPECT_EQ(fake_.Live("ipc_memory"), 1) << "closed while the executor may still copy";
  members.clear();
  EXPECT_EQ(fake_.Live("ipc_memory"), 0);
}

TEST_F(CudaStagingTest, WithoutARuntimeRegistrationFailsClearly) {
  std::unique_ptr<test::NodeIntake> table = MakeTable("/nonexistent/libcudart.so.13");
  DeviceTensor* t = NewTensor("fc.bias", 4, 0, 16, 1);
  sparsync_register_reply reply = Register(t, table.get());
  EXPECT_EQ(reply.status, SPARSYNC_ERR_UNAVAILABLE);
  std::string message = reply.message;
  EXPECT_NE(message.find("tensor 'fc.bias' is on CUDA device 1 but the daemon cannot take CUDA "
                         "tensors"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("/nonexistent/libcudart.so.13"), std::string::npos) << message;
  EXPECT_NE(message.find("SPARSYNC_CUDART"), std::string::npos) << message;
}

TEST_F(CudaStagingTest, AnUnknownMemoryHandleIsRefusedWithTheCudaError) {
  DeviceTensor* t = NewTensor("x", 4, 0, 16, 1);
  std::memset(t->msg.cuda_memory, 0x5a, sizeof(t->msg.cuda_memory));
  sparsync_register_reply reply = Register(t);
  EXPECT_EQ(reply.status, SPARSYNC_ERR_INTERNAL);
  std::string message = reply.message;
  EXPECT_NE(message.find("cudaIpcOpenMemHandle of the worker's buffer for tensor 'x' on CUDA "
                         "device 1: cudaErrorInvalidResourceHandle"),
            std::string::npos)
      << message;
}

TEST_F(CudaStagingTest, ATensorPastTheEndOfItsAllocationIsRefused) {
  DeviceTensor* t = NewTensor("x", 16, 1024 - 32, 1024, 1);
  sparsync_register_reply reply = Register(t);
  EXPECT_EQ(reply.status, SPARSYNC_ERR_INVALID);
  EXPECT_NE(std::string(reply.message).find("does not fit the exported CUDA allocation of 1024"),
            std::string::npos)
      << reply.message;
  EXPECT_EQ(fake_.Live("ipc_memory"), 0);
}

TEST_F(CudaStagingTest, ACudaErrorAtReadyFailsTheJobWithTheCudaMessage) {
  DeviceTensor* t = NewTensor("conv1.weight", 4, 0, 16, 1);
  ASSERT_EQ(Register(t).status, SPARSYNC_OK);
  // The shim never recorded its ready event: the fake refuses the wait (CUDA would race).
  ASSERT_TRUE(Ready(t, 1).ok());
  ASSERT_EQ(WaitFailures(1), 1u);
  EXPECT_TRUE(notices_.empty());
  const std::string& why = failures_[0].message();
  EXPECT_NE(why.find("waiting for the worker's ready event for tensor 'conv1.weight' on CUDA "
                     "device 1: cudaErrorInvalidResourceHandle"),
            std::string::npos)
      << why;
  sparsync_done done = ReceiveDone();
  EXPECT_EQ(done.status, SPARSYNC_ERR_ABORTED);
  EXPECT_NE(std::string(done.message).find("cudaErrorInvalidResourceHandle"), std::string::npos);
  EXPECT_NE(fake_.TakeMisuse().find("never recorded"), std::string::npos);
}

// ---- The local reduce: two workers of one node, each on a GPU of its own. ----

// The fake NCCL's test API (tests/support/fake_nccl).
struct FakeNccl {
  size_t (*Journal)(char*, size_t);
  size_t (*Misuse)(char*, size_t);
  int (*LiveComms)();
  void (*FailNext)(const char*, int);

  static FakeNccl Load() {
    void* lib = dlopen(SPARSYNC_FAKE_NCCL, RTLD_NOW | RTLD_LOCAL);
    EXPECT_NE(lib, nullptr) << dlerror();
    FakeNccl f{};
    auto bind = [lib](auto* fn, const char* name) { test::BindFake(lib, fn, name); };
    bind(&f.Journal, "sparsync_fake_nccl_journal");
    bind(&f.Misuse, "sparsync_fake_nccl_misuse");
    bind(&f.LiveComms, "sparsync_fake_nccl_live_comms");
    bind(&f.FailNext, "sparsync_fake_nccl_fail_next");
    return f;
  }
  std::string TakeJournal() const { return FakeCuda::Take(Journal); }
  std::string TakeMisuse() const { return FakeCuda::Take(Misuse); }
};

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

class LocalReduceTest : public CudaStagingTest {
 protected:
  void SetUp() override {
    CudaStagingTest::SetUp();
    nccl_ = FakeNccl::Load();
    nccl_.TakeJournal();
    nccl_.TakeMisuse();
  }

  void TearDown() override {
    CudaStagingTest::TearDown();
    if (second_fd_ >= 0) close(second_fd_);
    EXPECT_EQ(nccl_.LiveComms(), 0) << "the daemon left NCCL communicators behind";
    EXPECT_EQ(nccl_.TakeMisuse(), "") << "the daemon misused NCCL";
  }

  // A table for two local workers (session_ is local rank 0, second_ local rank 1).
  void UseTwoWorkers(const std::string& libnccl, bool local_nccl = true) {
    table_ = MakeTable(SPARSYNC_FAKE_CUDART, 2, libnccl, local_nccl);
    int fds[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds), 0);
    second_ = std::make_shared<intake::WorkerSession>(fds[0]);
    second_fd_ = fds[1];
    sparsync_hello hello{};
    hello.local_rank = 1;
    sparsync_hello_reply reply{};
    table_->OnHello(second_, hello, &reply);
    ASSERT_EQ(reply.status, SPARSYNC_OK);
  }

  // The same tensor from both workers, on `device0` and `device1`; both posted for round 1.
  std::pair<DeviceTensor*, DeviceTensor*> PostBoth(int device0, int device1,
                                                   uint32_t dtype = SPARSYNC_FLOAT32,  // wire
                                                   const std::string& name = "fc.weight",
                                                   uint32_t id = 3) {
    DeviceTensor* a = NewTensor(name, 16, 256, 1024, id, device0);
    DeviceTensor* b = NewTensor(name, 16, 0, 64, id, device1);
    a->msg.dtype = b->msg.dtype = dtype;
    EXPECT_EQ(Register(a).status, SPARSYNC_OK);
    EXPECT_EQ(Register(b, nullptr, second_).status, SPARSYNC_OK);
    EXPECT_EQ(fake_.EventRecord(a->ready, nullptr), 0);
    EXPECT_EQ(fake_.EventRecord(b->ready, nullptr), 0);
    fake_.TakeJournal();
    EXPECT_TRUE(Ready(a, 1).ok());
    EXPECT_TRUE(Ready(b, 1, second_).ok());
    return {a, b};
  }

  static float Value(const std::vector<unsigned char>& bytes, size_t offset, size_t i) {
    float v;
    std::memcpy(&v, bytes.data() + offset + i * 4, 4);
    return v;
  }

  FakeNccl nccl_{};
  std::shared_ptr<intake::WorkerSession> second_;
  int second_fd_ = -1;
};

TEST_F(LocalReduceTest, TwoGpusAreSummedWithNcclAndOnlyTheSumCrossesToTheHost) {
  UseTwoWorkers(SPARSYNC_FAKE_NCCL);
  auto [a, b] = PostBoth(0, 2);
  ASSERT_EQ(WaitNotices(1), 1u);
  // Both streams waited for their worker; the sum alone was copied to the host.
  std::string cuda = fake_.TakeJournal();
  EXPECT_EQ(Count(cuda, "wait " + Id(a->ready) + "\n"), 1u) << cuda;
  EXPECT_EQ(Count(cuda, "wait " + Id(b->ready) + "\n"), 1u) << cuda;
  EXPECT_EQ(Count(cuda, "D2H"), 1u) << cuda;
  std::string nccl = nccl_.TakeJournal();
  EXPECT_EQ(Count(nccl, "init "), 1u) << nccl;
  EXPECT_EQ(Count(nccl, "reduce "), 2u) << nccl;

  std::vector<GroupMember> members = Resolve("fc.weight", 4);
  ASSERT_EQ(members.size(), 1u);
  ASSERT_NE(members[0].clique, nullptr);
  EXPECT_EQ(members[0].num_inputs(), 1u);
  EXPECT_EQ(members[0].clique->devices(), (std::vector<int>{0, 2}));
  float* sum = static_cast<float*>(members[0].parts[0].region->data());
  for (size_t i = 0; i < 16; ++i) {
    ASSERT_EQ(sum[i], static_cast<float>(i)) << i;  // 0.5 i from each worker
    sum[i] = 3.0f * static_cast<float>(i);           // the node's "result"
  }
  fake_.TakeJournal();
  pipeline::DeliverFromHost(members[0]);
  cuda = fake_.TakeJournal();
  EXPECT_EQ(Count(cuda, "H2D"), 1u) << cuda;
  EXPECT_EQ(Count(cuda, "record " + Id(a->done)), 1u) << cuda;
  EXPECT_EQ(Count(cuda, "record " + Id(b->done)), 1u) << cuda;
  EXPECT_EQ(Count(nccl_.TakeJournal(), "broadcast "), 2u);
  EXPECT_EQ(ReceiveDone().status, SPARSYNC_OK);
  EXPECT_EQ(ReceiveDone(second_fd_).status, SPARSYNC_OK);
  std::vector<unsigned char> da = DeviceBytes(a), db = DeviceBytes(b);
  for (size_t i = 0; i < 16; ++i) {
    EXPECT_EQ(Value(da, 256, i), 3.0f * static_cast<float>(i)) << i;
    EXPECT_EQ(Value(db, 0, i), 3.0f * static_cast<float>(i)) << i;
  }
  for (size_t at = 0; at < 256; ++at) ASSERT_EQ(da[at], kGuard) << "byte " << at;
  for (size_t at = 256 + 64; at < da.size(); ++at) ASSERT_EQ(da[at], kGuard) << "byte " << at;
  table_->Finish(members);
  members.clear();
  table_.reset();  // the communicators go with the device intake
}

TEST_F(LocalReduceTest, TwoWorkersOnOneGpuAreSummedOnTheHost) {
  UseTwoWorkers(SPARSYNC_FAKE_NCCL);
  PostBoth(1, 1);
  ASSERT_EQ(WaitNotices(1), 1u);
  EXPECT_EQ(Count(fake_.TakeJournal(), "D2H 64"), 2u);
  EXPECT_EQ(nccl_.TakeJournal(), "");
  std::vector<GroupMember> members = Resolve("fc.weight", 4);
  ASSERT_EQ(members.size(), 1u);
  EXPECT_EQ(members[0].clique, nullptr);
  EXPECT_EQ(members[0].num_inputs(), 2u);
}

TEST_F(LocalReduceTest, HalfPrecisionAndBytesAreSummedOnTheHostInFloat32) {
  UseTwoWorkers(SPARSYNC_FAKE_NCCL);
  const uint32_t dtypes[] = {SPARSYNC_FLOAT16, SPARSYNC_BFLOAT16, SPARSYNC_UINT8};
  for (uint32_t i = 0; i < 3; ++i) {
    const std::string name = "t" + std::to_string(i);
    PostBoth(0, 1, dtypes[i], name, 10 + i);
    ASSERT_EQ(WaitNotices(i + 1), i + 1);
    std::vector<GroupMember> members = Resolve(name, 20 + i);
    ASSERT_EQ(members.size(), 1u);
    EXPECT_EQ(members[0].clique, nullptr) << "dtype " << dtypes[i];
  }
  EXPECT_EQ(nccl_.TakeJournal(), "");
}

TEST_F(LocalReduceTest, LocalReduceHostKeepsNcclOut) {
  UseTwoWorkers(SPARSYNC_FAKE_NCCL, /*local_nccl=*/false);
  PostBoth(0, 1);
  ASSERT_EQ(WaitNotices(1), 1u);
  EXPECT_EQ(nccl_.TakeJournal(), "");
  std::vector<GroupMember> members = Resolve("fc.weight", 4);
  ASSERT_EQ(members.size(), 1u);
  EXPECT_EQ(members[0].clique, nullptr);
}

TEST_F(LocalReduceTest, CommunicatorsThatCannotBeMadeLeaveTheSumToTheHost) {
  UseTwoWorkers(SPARSYNC_FAKE_NCCL);
  nccl_.FailNext("ncclCommInitAll", 2);  // ncclSystemError
  PostBoth(0, 1);
  ASSERT_EQ(WaitNotices(1), 1u);
  EXPECT_TRUE(failures_.empty());
  std::vector<GroupMember> members = Resolve("fc.weight", 4);
  ASSERT_EQ(members.size(), 1u);
  EXPECT_EQ(members[0].clique, nullptr);
  for (const pipeline::WorkerPart& part : members[0].parts) {
    const float* staged = static_cast<const float*>(part.region->data());
    for (size_t i = 0; i < 16; ++i) ASSERT_EQ(staged[i], 0.5f * static_cast<float>(i)) << i;
  }
}

TEST_F(LocalReduceTest, ANcclErrorInTheReduceFailsTheJobWithItsMessage) {
  UseTwoWorkers(SPARSYNC_FAKE_NCCL);
  nccl_.FailNext("ncclReduce", 1);  // ncclUnhandledCudaError
  PostBoth(0, 1);
  ASSERT_EQ(WaitFailures(1), 1u);
  const std::string why = failures_[0].message();
  EXPECT_NE(why.find("ncclReduce of tensor 'fc.weight' across CUDA devices 0,1"),
            std::string::npos)
      << why;
  EXPECT_EQ(ReceiveDone().status, SPARSYNC_ERR_ABORTED);
  EXPECT_EQ(ReceiveDone(second_fd_).status, SPARSYNC_ERR_ABORTED);
  nccl_.TakeMisuse();  // the fake also reports the rank missing from the group
}

TEST_F(LocalReduceTest, AnExplicitLibncclThatDoesNotLoadStopsTheDaemon) {
  UseTwoWorkers("/nonexistent/libnccl.so.2");
  Status st = table_->LoadExplicitLibraries();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("SPARSYNC_LIBNCCL=/nonexistent/libnccl.so.2"), std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("SPARSYNC_LOCAL_REDUCE=host"), std::string::npos) << st.message();
  EXPECT_TRUE(MakeTable(SPARSYNC_FAKE_CUDART, 2, "/nonexistent/libnccl.so.2", false)
                  ->LoadExplicitLibraries()
                  .ok());
}

// ---- The run-time loaders of the CUDA runtime and NCCL. ----

// cuMemGetAddressRange through either entry point, on an allocation of `lib`'s own.
void ExpectAddressRange(const std::string& lib) {
  std::string error;
  std::shared_ptr<const CudaRuntime> rt = LoadCudaRuntime(lib, &error);
  ASSERT_NE(rt, nullptr) << error;
  ASSERT_NE(rt->MemGetAddressRange, nullptr) << lib;
  void* handle = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  ASSERT_NE(handle, nullptr);
  auto malloc_fn = reinterpret_cast<int (*)(void**, size_t)>(dlsym(handle, "cudaMalloc"));
  auto free_fn = reinterpret_cast<int (*)(void*)>(dlsym(handle, "cudaFree"));
  ASSERT_NE(malloc_fn, nullptr);
  void* alloc = nullptr;
  ASSERT_EQ(malloc_fn(&alloc, 4096), 0);
  unsigned long long base = 0;
  size_t size = 0;
  EXPECT_EQ(rt->MemGetAddressRange(&base, &size, reinterpret_cast<uintptr_t>(alloc) + 100), 0);
  EXPECT_EQ(base, reinterpret_cast<uintptr_t>(alloc));
  EXPECT_EQ(size, 4096u);
  EXPECT_EQ(free_fn(alloc), 0);
}

TEST(CudaRuntimeLoaderTest, FindsTheAddressRangeThroughEitherDriverEntryPoint) {
  ExpectAddressRange(SPARSYNC_FAKE_CUDART);        // cudaGetDriverEntryPointByVersion (12.5+)
  ExpectAddressRange(SPARSYNC_FAKE_CUDART_PLAIN);  // cudaGetDriverEntryPoint (12.0-12.4)
}

TEST(CudaRuntimeLoaderTest, ALibraryThatIsNoCudaRuntimeIsRefusedByName) {
  std::string error;
  EXPECT_EQ(LoadCudaRuntime(SPARSYNC_FAKE_NCCL, &error), nullptr);
  EXPECT_NE(error.find("is not a usable CUDA runtime: it lacks cudaSetDevice"), std::string::npos)
      << error;
}

TEST(LocalNcclLoaderTest, ALibraryThatIsNoNcclIsRefusedByName) {
  LocalNccl local(SPARSYNC_FAKE_CUDART, /*enabled=*/true);
  Status st = local.LoadExplicit();
  EXPECT_NE(st.message().find("is not a usable NCCL: it lacks ncclGetVersion"), std::string::npos)
      << st.message();
  EXPECT_TRUE(LocalNccl(SPARSYNC_FAKE_NCCL, true).LoadExplicit().ok());
  EXPECT_TRUE(LocalNccl("", true).LoadExplicit().ok());  // libnccl.so.2 is looked for when needed
}

}  // namespace
}  // namespace sparsync::device
