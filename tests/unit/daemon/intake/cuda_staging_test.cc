// The daemon's end of the CUDA IPC intake: TensorTable + CudaStaging against the fake CUDA
// runtime (tests/support/fake_cudart), with this test playing the worker in the same process.
#include "daemon/intake/cuda_staging.h"

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <mutex>
#include <vector>

#include "daemon/pipeline/device_sparse.h"
#include "daemon/pipeline/tensor_table.h"
#include "daemon/transport/loopback/loopback_transport.h"

namespace sparsync::intake {
namespace {

using pipeline::GroupMember;
using pipeline::TensorTable;

// The fake runtime's C API, as the worker side of these tests calls it.
struct FakeCuda {
  int (*Malloc)(void**, size_t);
  int (*Free)(void*);
  int (*Memcpy)(void*, const void*, size_t, int);
  int (*IpcGetMemHandle)(CudaIpcHandle*, void*);
  int (*EventCreateWithFlags)(CudaEvent*, unsigned);
  int (*EventDestroy)(CudaEvent);
  int (*IpcGetEventHandle)(CudaIpcHandle*, CudaEvent);
  int (*IpcOpenEventHandle)(CudaEvent*, CudaIpcHandle);
  int (*EventRecord)(CudaEvent, CudaStream);
  int (*Live)(const char*);
  size_t (*Journal)(char*, size_t);
  size_t (*Misuse)(char*, size_t);
  uint64_t (*EventRecords)(CudaEvent);
  uint64_t (*EventId)(CudaEvent);

  static FakeCuda Load() {
    void* lib = dlopen(SPARSYNC_FAKE_CUDART, RTLD_NOW | RTLD_LOCAL);
    EXPECT_NE(lib, nullptr) << dlerror();
    FakeCuda f{};
    auto bind = [&](auto* fn, const char* name) {
      *fn = reinterpret_cast<std::remove_reference_t<decltype(*fn)>>(dlsym(lib, name));
      EXPECT_NE(*fn, nullptr) << name;
    };
    bind(&f.Malloc, "cudaMalloc");
    bind(&f.Free, "cudaFree");
    bind(&f.Memcpy, "cudaMemcpy");
    bind(&f.IpcGetMemHandle, "cudaIpcGetMemHandle");
    bind(&f.EventCreateWithFlags, "cudaEventCreateWithFlags");
    bind(&f.EventDestroy, "cudaEventDestroy");
    bind(&f.IpcGetEventHandle, "cudaIpcGetEventHandle");
    bind(&f.IpcOpenEventHandle, "cudaIpcOpenEventHandle");
    bind(&f.EventRecord, "cudaEventRecord");
    bind(&f.Live, "sparsync_fake_cuda_live");
    bind(&f.Journal, "sparsync_fake_cuda_journal");
    bind(&f.Misuse, "sparsync_fake_cuda_misuse");
    bind(&f.EventRecords, "sparsync_fake_cuda_event_records");
    bind(&f.EventId, "sparsync_fake_cuda_event_id");
    return f;
  }
  static std::string Take(size_t (*fn)(char*, size_t)) {  // reading clears: one call
    std::string s(1 << 16, '\0');
    s.resize(std::min(fn(s.data(), s.size()), s.size() - 1));
    return s;
  }
  std::string TakeJournal() const { return Take(Journal); }
  std::string TakeMisuse() const { return Take(Misuse); }
};

// A tensor of `numel` floats at `offset` in a device allocation of `alloc_bytes`, exported as a
// shim would export it; the rest of the allocation holds a guard pattern.
struct DeviceTensor {
  void* alloc = nullptr;
  size_t alloc_bytes = 0;
  size_t offset = 0;
  size_t numel = 0;
  CudaEvent ready = nullptr;
  CudaEvent done = nullptr;  // the daemon's, once opened
  sparsync_register_msg msg{};
};

constexpr unsigned char kGuard = 0xAB;

class CudaStagingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fake_ = FakeCuda::Load();
    int fds[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds), 0);
    session_ = std::make_shared<WorkerSession>(fds[0]);
    worker_fd_ = fds[1];
    table_ = MakeTable(SPARSYNC_FAKE_CUDART);
    events_before_ = fake_.Live("events");
  }

  void TearDown() override {
    table_.reset();
    EXPECT_EQ(fake_.Live("pinned"), 0) << "the daemon left its staging page-locked";
    for (DeviceTensor* t : tensors_) {
      if (t->done) {
        EXPECT_EQ(fake_.EventDestroy(t->done), 0);
      }
      EXPECT_EQ(fake_.EventDestroy(t->ready), 0);
      EXPECT_EQ(fake_.Free(t->alloc), 0);
    }
    close(worker_fd_);
    EXPECT_EQ(fake_.Live("ipc_memory"), 0) << "the daemon left CUDA IPC memory open";
    EXPECT_EQ(fake_.Live("events"), events_before_) << "an event was leaked";
    EXPECT_EQ(fake_.TakeMisuse(), "") << "the daemon misused the CUDA runtime";
  }

  std::unique_ptr<TensorTable> MakeTable(const std::string& cudart, int local_size = 1,
                                         const std::string& libnccl = "",
                                         bool local_nccl = true) {
    // Notices and failures come from the table's staging thread.
    auto table = std::make_unique<TensorTable>(
        pipeline::World{0, 1, local_size}, "",
        [this](pipeline::ReadyNotice n) {
          std::lock_guard lock(mu_);
          notices_.push_back(n);
          changed_.notify_all();
        },
        [this](const Status& s) {
          std::lock_guard lock(mu_);
          failures_.push_back(s);
          changed_.notify_all();
        },
        pipeline::CudaOptions{cudart, local_nccl, libnccl, nullptr});
    sparsync_hello hello{};
    sparsync_hello_reply reply{};
    table->OnHello(session_, hello, &reply);
    EXPECT_EQ(reply.status, SPARSYNC_OK);
    return table;
  }

  // Allocates, fills (guard pattern, then values i * 0.5) and exports a tensor.
  DeviceTensor* NewTensor(const std::string& name, size_t numel, size_t offset, size_t alloc_bytes,
                          uint32_t id, int device = 1) {
    auto* t = new DeviceTensor;
    owned_.emplace_back(t);
    tensors_.push_back(t);
    t->alloc_bytes = alloc_bytes;
    t->offset = offset;
    t->numel = numel;
    EXPECT_EQ(fake_.Malloc(&t->alloc, alloc_bytes), 0);
    std::vector<unsigned char> init(alloc_bytes, kGuard);
    for (size_t i = 0; i < numel && offset + (i + 1) * 4 <= alloc_bytes; ++i) {
      float v = static_cast<float>(i) * 0.5f;
      std::memcpy(init.data() + offset + i * 4, &v, 4);
    }
    EXPECT_EQ(fake_.Memcpy(t->alloc, init.data(), alloc_bytes, kCudaMemcpyHostToDevice), 0);
    EXPECT_EQ(
        fake_.EventCreateWithFlags(&t->ready, kCudaEventInterprocess | kCudaEventDisableTiming), 0);
    sparsync_register_msg& m = t->msg;
    FillHeader(&m.header, SPARSYNC_MSG_REGISTER, sizeof(m));
    m.tensor_id = id;
    m.op = SPARSYNC_OP_GRADIENT;
    m.dtype = SPARSYNC_FLOAT32;
    m.ndim = 1;
    m.shape[0] = static_cast<int64_t>(numel);
    m.name_len = static_cast<uint32_t>(name.size());
    std::memcpy(m.name, name.data(), name.size());
    m.memory = SPARSYNC_MEMORY_CUDA;
    m.cuda_device = static_cast<uint32_t>(device);
    m.cuda_offset = offset;
    CudaIpcHandle h;
    EXPECT_EQ(fake_.IpcGetMemHandle(&h, t->alloc), 0);
    std::memcpy(m.cuda_memory, &h, sizeof(h));
    EXPECT_EQ(fake_.IpcGetEventHandle(&h, t->ready), 0);
    std::memcpy(m.cuda_ready_event, &h, sizeof(h));
    return t;
  }

  sparsync_register_reply Register(DeviceTensor* t, TensorTable* table = nullptr,
                                   const std::shared_ptr<WorkerSession>& session = nullptr) {
    sparsync_register_reply reply{};
    std::shared_ptr<SharedRegion> region;
    (table ? table : table_.get())->OnRegister(session ? session : session_, t->msg, &reply, &region);
    if (reply.status == SPARSYNC_OK) {
      EXPECT_NE(region, nullptr);
      CudaIpcHandle h;
      std::memcpy(&h, reply.cuda_done_event, sizeof(h));
      EXPECT_EQ(fake_.IpcOpenEventHandle(&t->done, h), 0);
    } else {
      EXPECT_EQ(region, nullptr);
    }
    return reply;
  }

  Status Ready(DeviceTensor* t, uint64_t round,
               const std::shared_ptr<WorkerSession>& session = nullptr) {
    sparsync_ready r{};
    FillHeader(&r.header, SPARSYNC_MSG_READY, sizeof(r));
    r.tensor_id = t->msg.tensor_id;
    r.round = round;
    return table_->OnReady(session ? session : session_, r);
  }

  std::vector<GroupMember> Resolve(const std::string& name, uint32_t slot) {
    table_->BindSlot(name, slot);
    negotiation::ScheduleEntry entry;
    entry.group.push_back({slot, {}});
    auto members = table_->Resolve(entry, std::chrono::milliseconds(1000));
    EXPECT_TRUE(members.ok()) << members.status().ToString();
    return members.ok() ? *members : std::vector<GroupMember>{};
  }

  sparsync_done ReceiveDone(int fd = -1) {
    if (fd < 0) fd = worker_fd_;
    sparsync_done done{};
    pollfd p{fd, POLLIN, 0};
    EXPECT_EQ(poll(&p, 1, 5000), 1) << "no DONE arrived";
    EXPECT_EQ(recv(fd, &done, sizeof(done), 0), static_cast<ssize_t>(sizeof(done)));
    return done;
  }

  std::vector<unsigned char> DeviceBytes(const DeviceTensor* t) {
    std::vector<unsigned char> out(t->alloc_bytes);
    EXPECT_EQ(fake_.Memcpy(out.data(), t->alloc, t->alloc_bytes, kCudaMemcpyDeviceToHost), 0);
    return out;
  }

  std::string Id(CudaEvent e) { return "E" + std::to_string(fake_.EventId(e)); }

  // Waits up to 5 s for `n` notices, or failures; returns how many there are.
  size_t WaitNotices(size_t n) {
    std::unique_lock lock(mu_);
    changed_.wait_for(lock, std::chrono::seconds(5), [&] { return notices_.size() >= n; });
    return notices_.size();
  }
  size_t WaitFailures(size_t n) {
    std::unique_lock lock(mu_);
    changed_.wait_for(lock, std::chrono::seconds(5), [&] { return failures_.size() >= n; });
    return failures_.size();
  }

  FakeCuda fake_{};
  std::shared_ptr<WorkerSession> session_;
  int worker_fd_ = -1;
  std::unique_ptr<TensorTable> table_;
  std::mutex mu_;
  std::condition_variable changed_;
  std::vector<pipeline::ReadyNotice> notices_;  // GUARDED_BY(mu_)
  std::vector<Status> failures_;                // GUARDED_BY(mu_)
  std::vector<std::unique_ptr<DeviceTensor>> owned_;
  std::vector<DeviceTensor*> tensors_;
  int events_before_ = 0;
};

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
    ASSERT_TRUE(pipeline::SendDone(part, Status::Ok()).ok());
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
  ASSERT_TRUE(pipeline::SendDone(members[0].parts[0], Aborted("node 3 left")).ok());
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

  table_->OnDisconnect(session_, Unavailable("the worker was killed"));
  EXPECT_EQ(fake_.Live("ipc_memory"), 0);
  EXPECT_EQ(fake_.Live("events"), events + 2);  // only the done events this test opened
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
  std::unique_ptr<TensorTable> table = MakeTable("/nonexistent/libcudart.so.13");
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
    auto bind = [&](auto* fn, const char* name) {
      *fn = reinterpret_cast<std::remove_reference_t<decltype(*fn)>>(dlsym(lib, name));
      EXPECT_NE(*fn, nullptr) << name;
    };
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
    second_ = std::make_shared<WorkerSession>(fds[0]);
    second_fd_ = fds[1];
    sparsync_hello hello{};
    hello.local_rank = 1;
    sparsync_hello_reply reply{};
    table_->OnHello(second_, hello, &reply);
    ASSERT_EQ(reply.status, SPARSYNC_OK);
  }

  // The same tensor from both workers, on `device0` and `device1`; both posted for round 1.
  std::pair<DeviceTensor*, DeviceTensor*> PostBoth(int device0, int device1,
                                                   uint32_t dtype = SPARSYNC_FLOAT32,
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
  std::shared_ptr<WorkerSession> second_;
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
  pipeline::DeliverResult(members[0]);
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
  table_.reset();  // the communicators go with the table
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
// ---- Top-k on the device (pipeline/device_sparse.h), with the fake sparsification library ----

class DeviceSparseTest : public CudaStagingTest {
 protected:
  void SetUp() override {
    CudaStagingTest::SetUp();
    allocations_before_ = fake_.Live("allocations");
    pipeline::CudaOptions cuda{SPARSYNC_FAKE_CUDART, true, "", nullptr};
    cuda.keep_on_device = [](const negotiation::TensorMeta&) { return true; };
    table_ = std::make_unique<TensorTable>(
        pipeline::World{0, 1, 1}, "",
        [this](pipeline::ReadyNotice n) {
          std::lock_guard lock(mu_);
          notices_.push_back(n);
          changed_.notify_all();
        },
        [](const Status&) {}, std::move(cuda));
    sparsync_hello hello{};
    sparsync_hello_reply reply{};
    table_->OnHello(session_, hello, &reply);
    device_ = std::make_unique<pipeline::DeviceSparse>(SPARSYNC_FAKE_SPARSIFY);
    ASSERT_TRUE(device_->LoadExplicit().ok());
    reducer_ = MakeReducer(NonFinitePolicy::kError);
  }

  void TearDown() override {
    scratch_.Clear();
    device_.reset();
    EXPECT_EQ(fake_.Live("allocations"), allocations_before_ + static_cast<int>(tensors_.size()))
        << "the device path leaked device memory";
    CudaStagingTest::TearDown();
  }

  std::unique_ptr<pipeline::SparseReducer> MakeReducer(
      NonFinitePolicy nonfinite, ValueDType values = ValueDType::kFloat32) {
    Config config;
    config.compressor = Compressor::kTopK;
    config.density = 0.01;
    config.nonfinite = nonfinite;
    config.value_dtype = values;
    auto r = pipeline::SparseReducer::Create(config, 0, 1, &transport_);
    EXPECT_TRUE(r.ok());
    return r.ok() ? std::move(*r) : nullptr;
  }

  // A round of `t` up to Resolve, with the worker's buffer holding `values`.
  std::vector<GroupMember> Round(DeviceTensor* t, uint64_t round, const std::vector<float>& values) {
    EXPECT_EQ(fake_.Memcpy(static_cast<char*>(t->alloc) + t->offset, values.data(),
                           values.size() * 4, kCudaMemcpyHostToDevice),
              0);
    EXPECT_EQ(fake_.EventRecord(t->ready, nullptr), 0);
    EXPECT_TRUE(Ready(t, round).ok());
    EXPECT_EQ(WaitNotices(round), round);
    return Resolve(std::string(t->msg.name, t->msg.name_len), 7);
  }

  std::vector<float> TensorValues(const DeviceTensor* t) {
    std::vector<unsigned char> bytes = DeviceBytes(t);
    std::vector<float> v(t->numel);
    std::memcpy(v.data(), bytes.data() + t->offset, t->numel * 4);
    return v;
  }

  static std::vector<float> Ramp(size_t n) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i) * 0.5f;
    return v;
  }

  transport::LoopbackTransport transport_{std::make_shared<transport::LoopbackHub>(1), 0};
  std::unique_ptr<pipeline::DeviceSparse> device_;
  std::unique_ptr<pipeline::SparseReducer> reducer_;
  pipeline::DeviceSparse::Scratch scratch_;
  pipeline::PreparedGroup prepared_;
  int allocations_before_ = 0;
};

TEST_F(DeviceSparseTest, OnlyTheSelectedPairsCrossToTheHost) {
  DeviceTensor* t = NewTensor("fc.weight", 1000, 256, 8192, 5);
  ASSERT_EQ(Register(t).status, SPARSYNC_OK);
  fake_.TakeJournal();
  std::vector<GroupMember> members = Round(t, 1, Ramp(1000));
  ASSERT_EQ(members.size(), 1u);
  EXPECT_TRUE(members[0].on_device);
  std::string journal = fake_.TakeJournal();
  EXPECT_EQ(journal.find("D2H"), std::string::npos) << "the sum was staged: " << journal;

  const std::string name = "fc.weight";
  std::vector<pipeline::GroupSlice> slices{{&name, 0, 1000}};
  bool fall_back = true;
  Status st = device_->Select(members, slices, reducer_.get(), &scratch_, &prepared_, &fall_back);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_FALSE(fall_back);
  ASSERT_EQ(prepared_.indices.size(), 10u);  // density 0.01
  for (int j = 0; j < 10; ++j) EXPECT_EQ(prepared_.indices[j], 990 + j);
  journal = fake_.TakeJournal();
  EXPECT_NE(journal.find("wait " + Id(t->ready) + "\nD2D 4000\nmemset 4000\n"), std::string::npos)
      << journal;
  EXPECT_NE(journal.find("D2H 40\nD2H 40\nsync\n"), std::string::npos) << journal;
  EXPECT_EQ(journal.find("D2H 4000"), std::string::npos) << journal;

  uint32_t tag = 0;
  st = device_->Finish(members, slices, reducer_.get(), &scratch_, prepared_, 1.0, &tag);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(members[0].result_on_device);
  pipeline::DeliverResult(members[0]);
  EXPECT_EQ(ReceiveDone().status, SPARSYNC_OK);
  journal = fake_.TakeJournal();
  EXPECT_EQ(journal.find("H2D 4000"), std::string::npos) << journal;
  EXPECT_NE(journal.find("record " + Id(t->done)), std::string::npos) << journal;
  const std::vector<float> result = TensorValues(t);
  for (size_t i = 0; i < 1000; ++i) {
    ASSERT_EQ(result[i], i >= 990 ? static_cast<float>(i) * 0.5f : 0.0f) << i;
  }
  std::vector<unsigned char> bytes = DeviceBytes(t);
  for (size_t b = 0; b < 256; ++b) ASSERT_EQ(bytes[b], kGuard) << b;
  for (size_t b = 256 + 4000; b < bytes.size(); ++b) ASSERT_EQ(bytes[b], kGuard) << b;
  // What was not sent stays on the device, as the residual.
  EXPECT_EQ(device_->residual_bytes(), 4000u);
  EXPECT_TRUE(reducer_->state().Get(pipeline::TensorState::Kind::kResidual, name).empty());
  table_->Finish(members);
}

TEST_F(DeviceSparseTest, ResidualsFollowATensorToTheHostAndBack) {
  DeviceTensor* t = NewTensor("fc.weight", 1000, 0, 4096, 5);
  ASSERT_EQ(Register(t).status, SPARSYNC_OK);
  const std::string name = "fc.weight";
  std::vector<pipeline::GroupSlice> slices{{&name, 0, 1000}};
  bool fall_back = true;
  uint32_t tag = 0;
  std::vector<GroupMember> members = Round(t, 1, Ramp(1000));
  ASSERT_TRUE(device_->Select(members, slices, reducer_.get(), &scratch_, &prepared_, &fall_back).ok());
  ASSERT_TRUE(device_->Finish(members, slices, reducer_.get(), &scratch_, prepared_, 1.0, &tag).ok());
  pipeline::DeliverResult(members[0]);
  ReceiveDone();
  table_->Finish(members);

  // Its group goes through the host: the residual goes along, exactly.
  ASSERT_TRUE(device_->MoveResidualsToHost(slices, reducer_.get()).ok());
  EXPECT_EQ(device_->residual_bytes(), 0u);
  std::span<const float> host = reducer_->state().Get(pipeline::TensorState::Kind::kResidual, name);
  ASSERT_EQ(host.size(), 1000u);
  for (size_t i = 0; i < 1000; ++i) {
    ASSERT_EQ(host[i], i >= 990 ? 0.0f : static_cast<float>(i) * 0.5f) << i;
  }

  // And back: the next selection on the device adds it (top-k of 2 * ramp below 990).
  members = Round(t, 2, Ramp(1000));
  fake_.TakeJournal();
  ASSERT_TRUE(device_->Select(members, slices, reducer_.get(), &scratch_, &prepared_, &fall_back).ok());
  EXPECT_NE(fake_.TakeJournal().find("H2D 4000"), std::string::npos);
  EXPECT_TRUE(reducer_->state().Get(pipeline::TensorState::Kind::kResidual, name).empty());
  ASSERT_EQ(prepared_.indices.size(), 10u);
  for (int j = 0; j < 10; ++j) {
    EXPECT_EQ(prepared_.indices[j], 980 + j);
    EXPECT_EQ(prepared_.values[j], static_cast<float>(980 + j));
  }
  ASSERT_TRUE(device_->Finish(members, slices, reducer_.get(), &scratch_, prepared_, 1.0, &tag).ok());
  pipeline::DeliverResult(members[0]);
  ReceiveDone();
  table_->Finish(members);
}

TEST_F(DeviceSparseTest, Float16ValuesLeaveTheirRoundingInTheResidualAsOnTheHost) {
  DeviceTensor* t = NewTensor("fc.weight", 1000, 0, 4096, 5);
  ASSERT_EQ(Register(t).status, SPARSYNC_OK);
  const std::string name = "fc.weight";
  std::vector<pipeline::GroupSlice> slices{{&name, 0, 1000}};
  std::vector<float> grad(1000);
  for (size_t i = 0; i < grad.size(); ++i) grad[i] = static_cast<float>(i) * 0.37f + 0.001f;
  auto halves = MakeReducer(NonFinitePolicy::kError, ValueDType::kFloat16);
  bool fall_back = true;
  uint32_t tag = 0;
  std::vector<GroupMember> members = Round(t, 1, grad);
  ASSERT_TRUE(device_->Select(members, slices, halves.get(), &scratch_, &prepared_, &fall_back).ok());
  ASSERT_FALSE(fall_back);
  ASSERT_TRUE(device_->Finish(members, slices, halves.get(), &scratch_, prepared_, 1.0, &tag).ok());
  const std::vector<float> on_device = TensorValues(t);
  ASSERT_TRUE(device_->MoveResidualsToHost(slices, halves.get()).ok());
  pipeline::DeliverResult(members[0]);
  ReceiveDone();
  table_->Finish(members);

  // The same step on the host, from scratch.
  auto host = MakeReducer(NonFinitePolicy::kError, ValueDType::kFloat16);
  std::vector<float> group = grad;
  ASSERT_TRUE(host->Reduce(slices, group, 1, 7, 1.0, &tag).ok());
  for (size_t i = 0; i < 1000; ++i) ASSERT_TRUE(on_device[i] == group[i]) << i;
  std::span<const float> expected = host->state().Get(pipeline::TensorState::Kind::kResidual, name);
  std::span<const float> kept = halves->state().Get(pipeline::TensorState::Kind::kResidual, name);
  ASSERT_EQ(kept.size(), expected.size());
  int rounded = 0;
  for (size_t i = 0; i < kept.size(); ++i) {
    ASSERT_EQ(std::memcmp(&kept[i], &expected[i], sizeof(float)), 0) << i;
    rounded += i >= 990 && kept[i] != 0.0f;
  }
  EXPECT_GT(rounded, 0) << "no selected value was rounded: the test checks nothing";
}

TEST_F(DeviceSparseTest, ANonFiniteGradientFollowsThePolicy) {
  DeviceTensor* t = NewTensor("fc.weight", 1000, 0, 4096, 5);
  ASSERT_EQ(Register(t).status, SPARSYNC_OK);
  const std::string name = "fc.weight";
  std::vector<pipeline::GroupSlice> slices{{&name, 0, 1000}};
  std::vector<float> grad = Ramp(1000);
  grad[321] = std::numeric_limits<float>::quiet_NaN();
  bool fall_back = true;
  std::vector<GroupMember> members = Round(t, 1, grad);
  Status st = device_->Select(members, slices, reducer_.get(), &scratch_, &prepared_, &fall_back);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("tensor 'fc.weight' holds a non-finite gradient (nan)"),
            std::string::npos)
      << st.ToString();

  // SPARSYNC_NONFINITE=skip: the step's update is zero and the residual the tensor had (here
  // one it brings from the host) is kept as it was.
  auto skipping = MakeReducer(NonFinitePolicy::kSkip);
  const std::vector<float> before = Ramp(1000);
  skipping->AddResidual(name, before);
  st = device_->Select(members, slices, skipping.get(), &scratch_, &prepared_, &fall_back);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_FALSE(prepared_.finite);
  uint32_t tag = 0;
  ASSERT_TRUE(device_->Finish(members, slices, skipping.get(), &scratch_, prepared_, 1.0, &tag).ok());
  for (float v : TensorValues(t)) ASSERT_EQ(v, 0.0f);
  EXPECT_EQ(device_->residual_bytes(), 4000u);
  ASSERT_TRUE(device_->MoveResidualsToHost(slices, skipping.get()).ok());
  std::span<const float> kept = skipping->state().Get(pipeline::TensorState::Kind::kResidual, name);
  ASSERT_EQ(kept.size(), 1000u);
  for (size_t i = 0; i < 1000; ++i) ASSERT_EQ(kept[i], before[i]) << i;
  pipeline::DeliverResult(members[0]);
  ReceiveDone();
  table_->Finish(members);
}

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
}  // namespace sparsync::intake
