// The worker's side of the CUDA IPC intake tests: the fake CUDA runtime's C API
// (tests/support/fake_cudart), device tensors exported as a shim exports them, and the fixture
// that runs the daemon's intake side (job failure, tensor table, device intake, worker handler,
// wired as daemon.cc wires them) against them in the same process. Shared by
// device_intake_test.cc and device_paths_test.cc (one executable, device_test).
#pragma once

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <mutex>
#include <vector>

#include "daemon/common/job_failure.h"
#include "daemon/device/cuda_tensor.h"
#include "daemon/device/device_intake.h"
#include "daemon/intake/codec.h"
#include "daemon/intake/worker_handler.h"
#include "daemon/pipeline/tensor_table.h"

namespace sparsync::device::test {

using intake::SharedRegion;
using intake::WorkerSession;
using pipeline::GroupMember;

// The daemon's intake side of one node, wired as daemon.cc wires it; `on_failure` hears the job's
// failure after the handler has answered the pending collectives.
struct NodeIntake {
  NodeIntake(pipeline::World world, DeviceIntakeOptions options,
             intake::WorkerHandler::ReportFn report, std::function<void(const Status&)> on_failure)
      : table(world, &failure),
        device(std::move(options)),
        handler(world, "", &failure, &table, &device, std::move(report)) {
    failure.Observe([this](const Status& e, JobFailure::Source s) { handler.OnFailure(e, s); });
    failure.Observe([f = std::move(on_failure)](const Status& e, JobFailure::Source) { f(e); });
  }
  Status LoadExplicitLibraries() { return device.LoadExplicitLibraries(); }
  void OnHello(const std::shared_ptr<WorkerSession>& s, const sparsync_hello& m,
               sparsync_hello_reply* r) {
    handler.OnHello(s, m, r);
  }
  void OnRegister(const std::shared_ptr<WorkerSession>& s, const sparsync_register_msg& m,
                  sparsync_register_reply* r, std::shared_ptr<SharedRegion>* region) {
    handler.OnRegister(s, m, r, region);
  }
  Status OnReady(const std::shared_ptr<WorkerSession>& s, const sparsync_ready& m) {
    return handler.OnReady(s, m);
  }
  Status OnUnregister(const std::shared_ptr<WorkerSession>& s, const sparsync_unregister_msg& m) {
    return handler.OnUnregister(s, m);
  }
  void OnDisconnect(const std::shared_ptr<WorkerSession>& s, const Status& reason) {
    handler.OnDisconnect(s, reason);
  }
  std::vector<std::string> TakeReleased() { return table.TakeReleased(); }
  std::vector<const GroupMember*> Finish(const std::vector<GroupMember>& members) {
    return table.Finish(members);
  }

  JobFailure failure;
  pipeline::TensorTable table;
  DeviceIntake device;
  intake::WorkerHandler handler;
};

// Points `*fn` at `name` in the dlopened `lib`; a missing symbol fails the test.
template <typename Fn>
void BindFake(void* lib, Fn* fn, const char* name) {
  *fn = reinterpret_cast<Fn>(dlsym(lib, name));
  EXPECT_NE(*fn, nullptr) << name;
}

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
    auto bind = [lib](auto* fn, const char* name) { BindFake(lib, fn, name); };
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

  std::unique_ptr<NodeIntake> MakeTable(
      const std::string& cudart, int local_size = 1, const std::string& libnccl = "",
      bool local_nccl = true, std::function<bool(const TensorMeta&)> keep_on_device = nullptr) {
    // Notices and failures come from the staging thread.
    auto table = std::make_unique<NodeIntake>(
        pipeline::World{0, 1, local_size},
        DeviceIntakeOptions{cudart, local_nccl, libnccl, std::move(keep_on_device)},
        [this](negotiation::ReadyTensor n) {
          std::lock_guard lock(mu_);
          notices_.push_back(n);
          changed_.notify_all();
        },
        [this](const Status& s) {
          std::lock_guard lock(mu_);
          failures_.push_back(s);
          changed_.notify_all();
        });
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
    intake::FillHeader(&m.header, SPARSYNC_MSG_REGISTER, sizeof(m));
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

  sparsync_register_reply Register(DeviceTensor* t, NodeIntake* table = nullptr,
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
    intake::FillHeader(&r.header, SPARSYNC_MSG_READY, sizeof(r));
    r.tensor_id = t->msg.tensor_id;
    r.round = round;
    return table_->OnReady(session ? session : session_, r);
  }

  // The members of an entry naming `name` in `slot`, as the negotiation agent hands it over.
  std::vector<GroupMember> Resolve(const std::string& name, uint32_t slot) {
    negotiation::ScheduleEntry entry;
    entry.group.push_back({slot, {}, name, nullptr});
    auto members = table_->table.Resolve(entry);
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
  std::unique_ptr<NodeIntake> table_;
  std::mutex mu_;
  std::condition_variable changed_;
  std::vector<negotiation::ReadyTensor> notices_;  // GUARDED_BY(mu_)
  std::vector<Status> failures_;                // GUARDED_BY(mu_)
  std::vector<std::unique_ptr<DeviceTensor>> owned_;
  std::vector<DeviceTensor*> tensors_;
  int events_before_ = 0;
};

}  // namespace sparsync::device::test
