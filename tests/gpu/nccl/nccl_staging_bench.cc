// nccl_staging_bench: what the NCCL transport's host staging costs, on a real GPU.
//
// The daemon's NcclTransport (made by CreateNcclTransport, the real CudaNcclApi underneath, which
// loads NCCL and the CUDA runtime at run time, as sparsyncd does) sums in two ways:
//   staged     AllReduceSum on pageable host memory (what the executor hands it today):
//              host -> pinned -> device -> ncclAllReduce -> device -> pinned -> host;
//   on device  AllReduceSumOnDevice on a cudaMalloc'd buffer: ncclAllReduce in place, nothing
//              staged.
// Both on a one-rank communicator (the GPU machine has one GPU, and NCCL refuses two ranks on one
// device): no network, so the difference between the two is the host staging alone.
//
// For each size: a warm-up call of each (it also grows the transport's staging buffers), then
// --iterations timed calls of each; every call returns only after the transport's stream has
// drained, so a steady_clock around the call is its whole cost. Reported: the median per call.
// Checked: a sum over one rank is the identity, so the host buffer after every staged call and
// the device buffer after the warm-up and after the timed calls must equal the input bit for bit.
//
//   nccl_staging_bench [--iterations N] [--sizes 1000000,25000000,100000000] [--device N]
//                      [--out FILE] [--cudart FILE] [--libnccl FILE]
//
// --cudart and --libnccl name the libraries to load (SPARSYNC_CUDART and SPARSYNC_LIBNCCL for the
// daemon); by default the CUDA toolkit's runtime and the NCCL that CMake found when it configured
// the benchmark (tests/gpu/nccl/CMakeLists.txt). The benchmark's own buffers go through the same
// runtime, so the process has one. Prints one line per size, and a JSON line per size to FILE
// (--out). Exit status: 0 passed; 1 a call or a check failed, or bad arguments; 2 no CUDA device
// (or no CUDA runtime that loads).
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "daemon/device/cuda_runtime.h"
#include "daemon/device/nccl_library.h"
#include "daemon/transport/nccl/create_nccl_transport.h"
#include "tests/unit/daemon/transport/memory_store.h"

#ifndef SPARSYNC_BENCH_CUDART
#define SPARSYNC_BENCH_CUDART ""  // the default search of LoadCudaRuntime
#endif
#ifndef SPARSYNC_BENCH_LIBNCCL
#define SPARSYNC_BENCH_LIBNCCL ""  // libnccl.so.2
#endif

namespace sparsync::transport {
namespace {

using Clock = std::chrono::steady_clock;
using device::CudaError;
using device::CudaRuntime;

struct Options {
  int iterations = 10;
  std::vector<size_t> sizes = {1000000, 25000000, 100000000};
  int device = 0;
  std::string out;
  NcclLibraries libraries{SPARSYNC_BENCH_CUDART, SPARSYNC_BENCH_LIBNCCL};
};

struct Timing {
  double median_ms = 0;
  double min_ms = 0;
  double mean_ms = 0;
};

int Fail(const std::string& why) {
  std::fprintf(stderr, "nccl_staging_bench: FAILED: %s\n", why.c_str());
  return 1;
}

bool ParseCount(const char* text, long min, long max, long* out) {
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || v < min || v > max) return false;
  *out = v;
  return true;
}

bool Parse(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    long n = 0;
    if (v == nullptr) return false;
    if (a == "--iterations" && ParseCount(v, 1, 100000, &n)) {
      o->iterations = static_cast<int>(n);
    } else if (a == "--device" && ParseCount(v, 0, 1024, &n)) {
      o->device = static_cast<int>(n);
    } else if (a == "--out") {
      o->out = v;
    } else if (a == "--cudart") {
      o->libraries.cudart = v;
    } else if (a == "--libnccl") {
      o->libraries.libnccl = v;
    } else if (a == "--sizes") {
      o->sizes.clear();
      std::string list = v;
      size_t start = 0;
      while (start <= list.size()) {
        const size_t comma = std::min(list.find(',', start), list.size());
        const std::string item = list.substr(start, comma - start);
        if (!ParseCount(item.c_str(), 1, 1L << 34, &n)) return false;
        o->sizes.push_back(static_cast<size_t>(n));
        start = comma + 1;
      }
    } else {
      return false;
    }
    ++i;
  }
  return true;
}

// "1M", "25M", "100M" for the usual sizes; the count otherwise.
std::string Label(size_t count) {
  if (count % 1000000 == 0) return std::to_string(count / 1000000) + "M";
  return std::to_string(count);
}

Timing Summarise(std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  Timing t;
  const size_t n = ms.size();
  t.median_ms = n % 2 == 1 ? ms[n / 2] : (ms[n / 2 - 1] + ms[n / 2]) / 2;
  t.min_ms = ms.front();
  for (double m : ms) t.mean_ms += m / n;
  return t;
}

double Millis(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// A copy on the legacy default stream, finished when it returns (from pageable memory the copy
// may return before the DMA lands, hence the synchronisation). The transport's stream does not
// wait for the default stream, so the caller's writes must be finished: its contract.
CudaError CopyAndWait(const CudaRuntime& rt, void* dst, const void* src, size_t bytes, int kind) {
  const CudaError err = rt.MemcpyAsync(dst, src, bytes, kind, nullptr);
  return err != device::kCudaSuccess ? err : rt.StreamSynchronize(nullptr);
}

// A device buffer of the caller's, freed on scope exit.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(const CudaRuntime& rt) : rt_(rt) {}
  ~DeviceBuffer() {
    if (ptr_ != nullptr) (void)rt_.Free(ptr_);
  }
  CudaError Allocate(size_t bytes) { return rt_.Malloc(&ptr_, bytes); }
  void* get() const { return ptr_; }

 private:
  const CudaRuntime& rt_;
  void* ptr_ = nullptr;
};

// Compares `bytes` of device memory with `expected` (on the host), bit for bit.
bool DeviceEquals(const CudaRuntime& rt, const void* device, const std::vector<float>& expected,
                  std::string* error) {
  std::vector<float> back(expected.size(), -1.0f);
  const CudaError err = CopyAndWait(rt, back.data(), device, expected.size() * sizeof(float),
                                    device::kCudaMemcpyDeviceToHost);
  if (err != device::kCudaSuccess) {
    *error = rt.Describe(err, "reading the device buffer back");
    return false;
  }
  if (std::memcmp(back.data(), expected.data(), expected.size() * sizeof(float)) != 0) {
    const auto diff = std::mismatch(back.begin(), back.end(), expected.begin());
    const size_t i = static_cast<size_t>(diff.first - back.begin());
    *error = "device element " + std::to_string(i) + " is " + std::to_string(back[i]) + ", not " +
             std::to_string(expected[i]);
    return false;
  }
  return true;
}

// Times one size; returns the process exit status (0 or 1).
int RunSize(const CudaRuntime& rt, Transport& t, const Options& o, size_t count, uint32_t* tag,
            FILE* out) {
  const size_t bytes = count * sizeof(float);
  const std::string label = Label(count) + " float32";
  // Values a one-rank sum must leave bit for bit: finite, no -0, not all equal.
  std::vector<float> input(count);
  for (size_t i = 0; i < count; ++i) input[i] = static_cast<float>(i % 1000) * 0.25f + 0.125f;
  std::vector<float> host = input;  // pageable, as the executor hands it

  DeviceBuffer device(rt);
  CudaError err = device.Allocate(bytes);
  if (err == device::kCudaSuccess) {
    err = CopyAndWait(rt, device.get(), input.data(), bytes, device::kCudaMemcpyHostToDevice);
  }
  if (err != device::kCudaSuccess) {
    return Fail(rt.Describe(err, label + ": preparing the device buffer"));
  }

  auto staged_call = [&]() -> int {
    Status st = t.AllReduceSum(host.data(), count, ElementType::kFloat32, (*tag)++);
    if (!st.ok()) return Fail(label + ": staged AllReduceSum: " + st.ToString());
    return 0;
  };
  auto device_call = [&]() -> int {
    Status st = t.AllReduceSumOnDevice(device.get(), count, ElementType::kFloat32, (*tag)++);
    if (!st.ok()) return Fail(label + ": AllReduceSumOnDevice: " + st.ToString());
    return 0;
  };
  auto host_unchanged = [&](const char* when) -> int {
    if (std::memcmp(host.data(), input.data(), bytes) == 0) return 0;
    const auto diff = std::mismatch(host.begin(), host.end(), input.begin());
    const size_t i = static_cast<size_t>(diff.first - host.begin());
    return Fail(label + ": staged AllReduceSum over one rank changed the data " + when +
                ": element " + std::to_string(i) + " is " + std::to_string(host[i]) + ", not " +
                std::to_string(input[i]));
  };
  std::string error;

  // Warm-up: the staging buffers grow to this size, NCCL sets up its kernels for it.
  if (staged_call() != 0 || host_unchanged("(warm-up)") != 0 || device_call() != 0) return 1;
  if (!DeviceEquals(rt, device.get(), input, &error)) {
    return Fail(label +
                ": AllReduceSumOnDevice over one rank changed the data (warm-up): " + error);
  }

  std::vector<double> staged_ms, device_ms;
  for (int i = 0; i < o.iterations; ++i) {
    const auto start = Clock::now();
    if (staged_call() != 0) return 1;
    staged_ms.push_back(Millis(Clock::now() - start));
    if (host_unchanged(("(iteration " + std::to_string(i) + ")").c_str()) != 0) return 1;
  }
  for (int i = 0; i < o.iterations; ++i) {
    const auto start = Clock::now();
    if (device_call() != 0) return 1;
    device_ms.push_back(Millis(Clock::now() - start));
  }
  if (!DeviceEquals(rt, device.get(), input, &error)) {
    return Fail(label + ": AllReduceSumOnDevice over one rank changed the data: " + error);
  }

  const Timing staged = Summarise(staged_ms);
  const Timing on_device = Summarise(device_ms);
  const double ratio = on_device.median_ms > 0 ? staged.median_ms / on_device.median_ms : 0;
  // The staging moves the payload twice each way: pageable <-> pinned (memcpy) and pinned <->
  // device (PCIe), so the extra time is spread over 2 * bytes of host-device traffic.
  const double extra_ms = staged.median_ms - on_device.median_ms;
  const double staging_gbps = extra_ms > 0 ? 2.0 * bytes / (extra_ms * 1e6) : 0;
  std::printf(
      "nccl_staging_bench: %s: staged %.3f ms, on device %.3f ms, staged/device %.1f "
      "(one rank: no network; the difference is the host staging)\n",
      label.c_str(), staged.median_ms, on_device.median_ms, ratio);
  std::fflush(stdout);
  if (out != nullptr) {
    std::fprintf(out,
                 "{\"bench\":\"nccl_staging\",\"elements\":%zu,\"dtype\":\"float32\",\"bytes\":%zu,"
                 "\"ranks\":1,\"iterations\":%d,\"staged_median_ms\":%.4f,\"staged_min_ms\":%.4f,"
                 "\"staged_mean_ms\":%.4f,\"device_median_ms\":%.4f,\"device_min_ms\":%.4f,"
                 "\"device_mean_ms\":%.4f,\"staged_over_device\":%.3f,\"staging_extra_ms\":%.4f,"
                 "\"staging_gb_per_s\":%.2f,\"verified\":true}\n",
                 count, bytes, o.iterations, staged.median_ms, staged.min_ms, staged.mean_ms,
                 on_device.median_ms, on_device.min_ms, on_device.mean_ms, ratio, extra_ms,
                 staging_gbps);
    std::fflush(out);
  }
  return 0;
}

int Main(const Options& o) {
  std::string error;
  auto rt = device::LoadCudaRuntime(o.libraries.cudart, &error);
  if (rt == nullptr) {
    std::fprintf(stderr, "no GPU: %s\n", error.c_str());
    return 2;
  }
  int devices = 0;
  const CudaError err = rt->GetDeviceCount(&devices);
  if (err != device::kCudaSuccess || devices <= o.device) {
    std::fprintf(stderr, "no GPU: CUDA device %d is not there (%s)\n", o.device,
                 err != device::kCudaSuccess
                     ? rt->Describe(err, "cudaGetDeviceCount of " + rt->library).c_str()
                     : (std::to_string(devices) + " devices").c_str());
    return 2;
  }
  if (rt->SetDevice(o.device) != device::kCudaSuccess) return Fail("cudaSetDevice");
  auto nccl = device::LoadNccl(o.libraries.libnccl, &error);
  if (nccl == nullptr) return Fail(error);
  const int v = nccl->version;
  std::printf(
      "nccl_staging_bench: CUDA device %d, NCCL %d.%d.%d (%s), CUDA runtime %s; median of %d "
      "calls per size\n",
      o.device, v / 10000, v / 100 % 100, v % 100, nccl->library.c_str(), rt->library.c_str(),
      o.iterations);

  std::unique_ptr<FILE, int (*)(FILE*)> out(nullptr, std::fclose);
  if (!o.out.empty()) {
    out.reset(std::fopen(o.out.c_str(), "w"));
    if (out == nullptr) return Fail("cannot write " + o.out + ": " + std::strerror(errno));
  }

  MemoryStore store;
  const auto start = Clock::now();
  auto created = CreateNcclTransport(/*rank=*/0, /*size=*/1, &store, std::chrono::seconds(60),
                                     o.device, o.libraries);
  if (!created.ok()) return Fail("creating the NCCL transport: " + created.status().ToString());
  std::printf("nccl_staging_bench: one-rank communicator ready in %.0f ms\n",
              Millis(Clock::now() - start));
  std::fflush(stdout);
  uint32_t tag = 1;
  for (size_t count : o.sizes) {
    if (RunSize(*rt, **created, o, count, &tag, out.get()) != 0) return 1;
  }
  return 0;
}

}  // namespace
}  // namespace sparsync::transport

int main(int argc, char** argv) {
  sparsync::transport::Options o;
  if (!sparsync::transport::Parse(argc, argv, &o)) {
    std::fprintf(stderr,
                 "usage: nccl_staging_bench [--iterations N] [--sizes N,N,...] [--device N] "
                 "[--out FILE] [--cudart FILE] [--libnccl FILE]\n");
    return 1;
  }
  return sparsync::transport::Main(o);
}
