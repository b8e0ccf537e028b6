// cuda_ipc_check: one worker and one daemon end of the CUDA IPC intake, in two processes, on a
// real GPU (or, in CI, on the fake runtime of tests/support/fake_cudart). The worker half is the
// client library's CudaBuffer, the daemon half the daemon's CudaStaging, the same code as in
// sparsyncd and libsparsync_client; only the control socket's messages are stand-ins.
//
//   worker: cudaMalloc, a tensor at an offset in it (as PyTorch's caching allocator places
//           tensors), exports it, then each round writes values on its stream, records the ready
//           event, says READY, waits for DONE, makes its stream wait on the done event and reads
//           the buffer back;
//   daemon: opens the handles (Attach, which also page-locks the staging), each round copies the
//           tensor to the staging (CopyToHost), checks it, doubles it, copies it back
//           (CopyToDevice) and says DONE.
//
// Every value is checked on both sides, and the bytes around the tensor must stay untouched.
// Prints the staging copies' bandwidth (the last round's; pinned unless the log says otherwise).
//
//   cuda_ipc_check [--cudart PATH] [--device N] [--elements N] [--rounds N]
//
// Exit status: 0 passed; 1 a check failed; 2 bad arguments or setup; 3 no CUDA device.
#include <dlfcn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "daemon/device/cuda_tensor.h"
#include "daemon/intake/shared_region.h"
#include "daemon/device/cuda_runtime.h"
#include "proto/intake/wire.h"
#include "shims/client/cuda_buffer.h"

namespace sparsync {
namespace {

struct Options {
  std::string cudart;
  int device = 0;
  size_t elements = 25u << 20;  // 100 MiB of float32
  int rounds = 3;
};

constexpr size_t kOffset = 512;  // the tensor's place in its allocation
constexpr unsigned char kGuard = 0x5a;

// The worker's extra runtime calls, which the intake's CudaRuntime does not carry.
struct WorkerCalls {
  int (*Malloc)(void**, size_t);
  int (*Free)(void*);
  int (*GetDeviceCount)(int*);
};

bool Bind(const device::CudaRuntime& rt, WorkerCalls* calls, std::string* error) {
  void* lib = dlopen(rt.library.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (lib == nullptr) {
    *error = "cannot reopen " + rt.library;
    return false;
  }
  calls->Malloc = reinterpret_cast<int (*)(void**, size_t)>(dlsym(lib, "cudaMalloc"));
  calls->Free = reinterpret_cast<int (*)(void*)>(dlsym(lib, "cudaFree"));
  calls->GetDeviceCount = reinterpret_cast<int (*)(int*)>(dlsym(lib, "cudaGetDeviceCount"));
  if (!calls->Malloc || !calls->Free || !calls->GetDeviceCount) {
    *error = rt.library + " lacks cudaMalloc, cudaFree or cudaGetDeviceCount";
    return false;
  }
  return true;
}

float Value(size_t i, int round) { return static_cast<float>(i % 1000) * 0.25f + round; }

// One message of fixed size over the socket pair.
template <typename T>
bool Send(int fd, const T& m) {
  return send(fd, &m, sizeof(m), 0) == static_cast<ssize_t>(sizeof(m));
}
template <typename T>
bool Receive(int fd, T* m) {
  return recv(fd, m, sizeof(*m), 0) == static_cast<ssize_t>(sizeof(*m));
}

struct Round {
  int32_t round = 0;
  int32_t ok = 1;
};

int Fail(const char* side, const std::string& why) {
  std::fprintf(stderr, "cuda_ipc_check: %s: %s\n", side, why.c_str());
  return 1;
}

int Worker(const Options& o, int fd) {
  std::string error;
  auto rt = device::LoadCudaRuntime(o.cudart, &error);
  WorkerCalls calls{};
  if (!rt || !Bind(*rt, &calls, &error)) return Fail("worker", error);
  int devices = 0;
  if (calls.GetDeviceCount(&devices) != device::kCudaSuccess || devices <= o.device) {
    std::printf("NO GPU: CUDA device %d is not there (%d devices)\n", o.device, devices);
    return 3;
  }
  const size_t bytes = o.elements * sizeof(float);
  const size_t alloc_bytes = bytes + 2 * kOffset;
  if (rt->SetDevice(o.device) != device::kCudaSuccess) return Fail("worker", "cudaSetDevice");
  void* alloc = nullptr;
  if (calls.Malloc(&alloc, alloc_bytes) != device::kCudaSuccess) return Fail("worker", "cudaMalloc");
  char* data = static_cast<char*>(alloc) + kOffset;
  device::CudaStream stream = nullptr;
  if (rt->StreamCreateWithFlags(&stream, device::kCudaStreamNonBlocking) != device::kCudaSuccess) {
    return Fail("worker", "cudaStreamCreateWithFlags");
  }
  std::vector<unsigned char> whole(alloc_bytes, kGuard);
  sparsync_register_msg msg{};
  auto buffer = client::CudaBuffer::Export(rt, o.device, data, bytes, &msg, &error);
  if (!buffer) return Fail("worker", error);
  if (!Send(fd, msg)) return Fail("worker", "send REGISTER");
  uint8_t done[SPARSYNC_CUDA_IPC_HANDLE_BYTES];
  if (recv(fd, done, sizeof(done), 0) != static_cast<ssize_t>(sizeof(done))) {
    return Fail("worker", "no REGISTER_REPLY");
  }
  if (!buffer->OpenDone(done, &error)) return Fail("worker", error);
  for (int r = 1; r <= o.rounds; ++r) {
    float* values = reinterpret_cast<float*>(whole.data() + kOffset);
    for (size_t i = 0; i < o.elements; ++i) values[i] = Value(i, r);
    if (rt->MemcpyAsync(alloc, whole.data(), alloc_bytes, device::kCudaMemcpyHostToDevice,
                        stream) != device::kCudaSuccess) {
      return Fail("worker", "writing the buffer");
    }
    if (!buffer->RecordReady(stream, &error)) return Fail("worker", error);
    if (!Send(fd, Round{r, 1})) return Fail("worker", "send READY");
    Round reply;
    if (!Receive(fd, &reply) || reply.round != r) return Fail("worker", "no DONE");
    if (!reply.ok) return Fail("worker", "the daemon failed round " + std::to_string(r));
    if (!buffer->StreamWaitDone(stream, &error)) return Fail("worker", error);
    std::vector<unsigned char> back(alloc_bytes);
    if (rt->MemcpyAsync(back.data(), alloc, alloc_bytes, device::kCudaMemcpyDeviceToHost,
                        stream) != device::kCudaSuccess ||
        rt->StreamSynchronize(stream) != device::kCudaSuccess) {
      return Fail("worker", "reading the buffer back");
    }
    const float* result = reinterpret_cast<const float*>(back.data() + kOffset);
    for (size_t i = 0; i < o.elements; ++i) {
      if (result[i] != 2 * Value(i, r)) {
        return Fail("worker", "round " + std::to_string(r) + ": element " + std::to_string(i) +
                                  " is " + std::to_string(result[i]) + ", not " +
                                  std::to_string(2 * Value(i, r)));
      }
    }
    for (size_t b = 0; b < kOffset; ++b) {
      if (back[b] != kGuard || back[kOffset + bytes + b] != kGuard) {
        return Fail("worker", "a byte next to the tensor was written");
      }
    }
  }
  buffer.reset();
  (void)rt->StreamDestroy(stream);
  (void)calls.Free(alloc);
  return 0;
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

int Daemon(const Options& o, int fd) {
  sparsync_register_msg msg{};
  if (!Receive(fd, &msg)) return Fail("daemon", "no REGISTER (the worker failed first?)");
  const size_t bytes = o.elements * sizeof(float);
  auto region = intake::SharedRegion::Create("check", bytes);
  if (!region.ok()) return Fail("daemon", region.status().message());
  device::CudaStaging staging(o.cudart);
  uint8_t done[SPARSYNC_CUDA_IPC_HANDLE_BYTES];
  auto tensor = staging.Attach(msg, *region, bytes, done);
  if (!tensor.ok()) return Fail("daemon", tensor.status().message());
  if (send(fd, done, sizeof(done), 0) != static_cast<ssize_t>(sizeof(done))) {
    return Fail("daemon", "send REGISTER_REPLY");
  }
  double to_host_s = 0, to_device_s = 0;
  for (int r = 1; r <= o.rounds; ++r) {
    Round ready;
    if (!Receive(fd, &ready) || ready.round != r) return Fail("daemon", "no READY");
    auto start = std::chrono::steady_clock::now();
    Status st = (*tensor)->CopyToHost();
    to_host_s = Seconds(start);
    if (!st.ok()) return Fail("daemon", st.message());
    float* staged = static_cast<float*>((*region)->data());
    for (size_t i = 0; i < o.elements; ++i) {
      if (staged[i] != Value(i, r)) {
        (void)Send(fd, Round{r, 0});
        return Fail("daemon", "round " + std::to_string(r) + ": staged element " +
                                  std::to_string(i) + " is " + std::to_string(staged[i]));
      }
      staged[i] *= 2;
    }
    start = std::chrono::steady_clock::now();
    st = (*tensor)->CopyToDevice();
    if (st.ok()) st = (*tensor)->Synchronize();  // for the timing only; sparsyncd does not wait
    to_device_s = Seconds(start);
    if (!st.ok()) return Fail("daemon", st.message());
    if (!Send(fd, Round{r, 1})) return Fail("daemon", "send DONE");
  }
  const double gb = static_cast<double>(bytes) / 1e9;
  std::printf("cuda_ipc_check: %d rounds of %zu float32 on CUDA device %d passed; staging %s; "
              "device->host %.2f GB/s, host->device %.2f GB/s (last round)\n",
              o.rounds, o.elements, o.device, (*tensor)->pinned() ? "page-locked" : "pageable",
              gb / to_host_s, gb / to_device_s);
  return 0;
}

bool Parse(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (v == nullptr) return false;
    if (a == "--cudart") {
      o->cudart = v;
    } else if (a == "--device") {
      o->device = std::atoi(v);
    } else if (a == "--elements") {
      o->elements = std::strtoull(v, nullptr, 10);
    } else if (a == "--rounds") {
      o->rounds = std::atoi(v);
    } else {
      return false;
    }
    ++i;
  }
  return o->elements > 0 && o->rounds > 0 && o->device >= 0;
}

}  // namespace
}  // namespace sparsync

int main(int argc, char** argv) {
  sparsync::Options o;
  if (!sparsync::Parse(argc, argv, &o)) {
    std::fprintf(stderr,
                 "usage: cuda_ipc_check [--cudart PATH] [--device N] [--elements N] "
                 "[--rounds N]\n");
    return 2;
  }
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) != 0) return 2;
  // Fork before either side touches CUDA: a CUDA context does not survive fork.
  pid_t worker = fork();
  if (worker < 0) return 2;
  if (worker == 0) {
    close(fds[0]);
    int rc = sparsync::Worker(o, fds[1]);
    std::fflush(nullptr);
    _exit(rc);
  }
  close(fds[1]);
  int rc = sparsync::Daemon(o, fds[0]);
  close(fds[0]);  // a worker waiting on us sees the socket close
  int status = 0;
  waitpid(worker, &status, 0);
  int worker_rc = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
  if (worker_rc == 3) return 3;  // no GPU: the daemon half's complaint is only its consequence
  return rc != 0 ? rc : worker_rc;
}
