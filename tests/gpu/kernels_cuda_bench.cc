// kernels_cuda_bench: times every CUDA kernel of kernels/cuda/ with CUDA events and prints one
// JSON object per line (read by tests/gpu/torch_baseline.py, which adds the torch timings and
// prints the table). A plain program: Google Benchmark is not on the GPU machine.
//
//   kernels_cuda_bench [--sizes 1000000,25000000,100000000] [--densities 0.001,0.01]
//                      [--iterations 20]
//
// Records:
//   {"record":"device", "name", "sm_count", "copy_bytes", "copy_ms", "copy_gbps"}: the
//     device-to-device cudaMemcpy rate counting bytes read plus bytes written (a copy of
//     max(largest size, 2^26) floats, median).
//   {"record":"kernel", "kernel", "n", "density", "k", "selected", "ms", "ms_min", "bytes",
//    "bound_ms", "ratio", "fast_path"}: ms is the median over iterations of the GPU time
//     between events around one call; bytes is the minimum memory traffic the call needs (reads
//     plus writes of its inputs, state and outputs, listed per kernel below); bound_ms =
//     bytes / copy rate; ratio = ms / bound_ms.
// Data: float32 from a fixed-seed normal generator. Exit status 2 without a usable device.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_kernels.h"

namespace sparsync::kernels::cuda {
namespace {

#define BENCH_CHECK(expr)                                         \
  do {                                                            \
    const cudaError_t bench_error_ = (expr);                      \
    if (bench_error_ != cudaSuccess) {                            \
      std::fprintf(stderr, "kernels_cuda_bench: %s: %s\n", #expr, \
                   cudaGetErrorString(bench_error_));             \
      std::exit(1);                                               \
    }                                                             \
  } while (0)

void CheckStatus(const Status& status, const char* what) {
  if (!status.ok()) {
    std::fprintf(stderr, "kernels_cuda_bench: %s: %s\n", what, status.ToString().c_str());
    std::exit(1);
  }
}

template <typename T>
T* DeviceAlloc(int64_t count) {
  void* p = nullptr;
  BENCH_CHECK(cudaMalloc(&p, static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(T)));
  return static_cast<T*>(p);
}

std::vector<double> ParseList(const char* text) {
  std::vector<double> values;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) values.push_back(std::atof(item.c_str()));
  return values;
}

// Normal(0, 1) floats from xorshift64* and Box-Muller: fast enough for 1e8 values.
std::vector<float> NormalData(int64_t n, uint64_t seed) {
  std::vector<float> x(static_cast<size_t>(n));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  auto next = [&s]() {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return (s * 0x2545F4914F6CDD1Dull >> 11) * 0x1.0p-53;
  };
  for (int64_t i = 0; i < n; i += 2) {
    const double u1 = std::max(next(), 1e-300), u2 = next();
    const double r = std::sqrt(-2.0 * std::log(u1));
    x[static_cast<size_t>(i)] = static_cast<float>(r * std::cos(6.283185307179586 * u2));
    if (i + 1 < n)
      x[static_cast<size_t>(i + 1)] = static_cast<float>(r * std::sin(6.283185307179586 * u2));
  }
  return x;
}

struct Timing {
  double median_ms = 0;
  double min_ms = 0;
};

// Times `run` (which enqueues on `stream`) `iterations` times after two warm-ups; `reset`, if
// given, runs untimed before each call (e.g. restoring a residual).
Timing Time(cudaStream_t stream, int iterations, const std::function<void()>& run,
            const std::function<void()>& reset = nullptr) {
  cudaEvent_t start, stop;
  BENCH_CHECK(cudaEventCreate(&start));
  BENCH_CHECK(cudaEventCreate(&stop));
  std::vector<double> ms;
  for (int it = -2; it < iterations; ++it) {
    if (reset) reset();
    BENCH_CHECK(cudaEventRecord(start, stream));
    run();
    BENCH_CHECK(cudaEventRecord(stop, stream));
    BENCH_CHECK(cudaEventSynchronize(stop));
    float elapsed = 0;
    BENCH_CHECK(cudaEventElapsedTime(&elapsed, start, stop));
    if (it >= 0) ms.push_back(elapsed);
  }
  BENCH_CHECK(cudaEventDestroy(start));
  BENCH_CHECK(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], ms.front()};
}

struct Context {
  cudaStream_t stream;
  int iterations;
  double copy_bytes_per_ms;
};

void Report(const Context& c, const char* kernel, int64_t n, double density, int64_t k,
            int64_t selected, const Timing& t, double bytes, bool fast_path) {
  const double bound = bytes / c.copy_bytes_per_ms;
  std::printf(
      "{\"record\":\"kernel\",\"kernel\":\"%s\",\"n\":%lld,\"density\":%g,\"k\":%lld,"
      "\"selected\":%lld,\"ms\":%.5f,\"ms_min\":%.5f,\"bytes\":%.0f,\"bound_ms\":%.5f,"
      "\"ratio\":%.3f,\"fast_path\":%s}\n",
      kernel, static_cast<long long>(n), density, static_cast<long long>(k),
      static_cast<long long>(selected), t.median_ms, t.min_ms, bytes, bound, t.median_ms / bound,
      fast_path ? "true" : "false");
  std::fflush(stdout);
}

int64_t MustFinish(Workspace& ws, cudaStream_t stream, const char* what) {
  auto k = ws.Finish(stream);
  CheckStatus(k.status(), what);
  return *k;
}

int Main(int argc, char** argv) {
  std::vector<double> sizes = {1e6, 25e6, 100e6};
  std::vector<double> densities = {0.001, 0.01};
  int iterations = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--sizes"))
      sizes = ParseList(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--densities"))
      densities = ParseList(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--iterations"))
      iterations = std::atoi(argv[i + 1]);
  }
  int devices = 0;
  const cudaError_t probe = cudaGetDeviceCount(&devices);
  if (probe != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "kernels_cuda_bench: no usable CUDA device (%s)\n",
                 probe != cudaSuccess ? cudaGetErrorString(probe) : "device count 0");
    return 2;
  }
  const int64_t max_n = static_cast<int64_t>(*std::max_element(sizes.begin(), sizes.end()));
  const double max_density = *std::max_element(densities.begin(), densities.end());
  const int64_t max_k = std::max<int64_t>(1, static_cast<int64_t>(max_density * max_n));

  cudaDeviceProp prop;
  BENCH_CHECK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t stream;
  BENCH_CHECK(cudaStreamCreate(&stream));

  // Inputs and state for the largest size; smaller sizes use prefixes.
  const std::vector<float> host_x = NormalData(max_n, 1);
  float* x = DeviceAlloc<float>(max_n);
  float* g = DeviceAlloc<float>(max_n);
  float* r = DeviceAlloc<float>(max_n);
  float* u = DeviceAlloc<float>(max_n);
  float* v = DeviceAlloc<float>(max_n);
  float* dense = DeviceAlloc<float>(max_n);
  BENCH_CHECK(cudaMemcpy(x, host_x.data(), max_n * sizeof(float), cudaMemcpyHostToDevice));
  const std::vector<float> host_g = NormalData(max_n, 2);
  BENCH_CHECK(cudaMemcpy(g, host_g.data(), max_n * sizeof(float), cudaMemcpyHostToDevice));
  int32_t* out_indices = DeviceAlloc<int32_t>(max_n);
  float* out_values = DeviceAlloc<float>(max_n);
  uint16_t* halves = DeviceAlloc<uint16_t>(max_k);
  const DeviceSparse out{out_indices, out_values, max_n};

  auto made = Workspace::Create({max_n, max_k});
  CheckStatus(made.status(), "Workspace::Create");
  Workspace& ws = **made;

  // Device-to-device copy rate (read + write), the memory-bandwidth reference: at least 256 MB,
  // far beyond the L2 cache.
  const int64_t copy_n = std::max<int64_t>(max_n, int64_t{1} << 26);
  float* copy_from = DeviceAlloc<float>(copy_n);
  float* copy_to = DeviceAlloc<float>(copy_n);
  BENCH_CHECK(cudaMemset(copy_from, 0, copy_n * sizeof(float)));
  const Timing copy = Time(stream, iterations, [&] {
    BENCH_CHECK(cudaMemcpyAsync(copy_to, copy_from, copy_n * sizeof(float),
                                cudaMemcpyDeviceToDevice, stream));
  });
  BENCH_CHECK(cudaFree(copy_from));
  BENCH_CHECK(cudaFree(copy_to));
  const double copy_bytes = 2.0 * copy_n * sizeof(float);
  const Context c{stream, iterations, copy_bytes / copy.median_ms};
  std::printf(
      "{\"record\":\"device\",\"name\":\"%s\",\"sm_count\":%d,\"copy_bytes\":%.0f,"
      "\"copy_ms\":%.5f,\"copy_gbps\":%.1f}\n",
      prop.name, prop.multiProcessorCount, copy_bytes, copy.median_ms, c.copy_bytes_per_ms / 1e6);
  std::fflush(stdout);

  for (double size : sizes) {
    const auto n = static_cast<int64_t>(size);
    for (double density : densities) {
      const int64_t k = SelectedCount(n, density);
      SparsifierOptions o;
      o.density = density;
      const double kv = 8.0 * k;  // output pairs
      Timing t;

      t = Time(stream, iterations, [&] { CheckStatus(TopK(x, n, k, out, ws, stream), "TopK"); });
      int64_t sel = MustFinish(ws, stream, "TopK");
      Report(c, "topk", n, density, k, sel, t, 4.0 * n + kv, ws.last_used_candidates());

      t = Time(
          stream, iterations,
          [&] { CheckStatus(TopKWithResidual(g, r, n, k, out, ws, stream), "TopKWithResidual"); },
          [&] {
            BENCH_CHECK(cudaMemcpyAsync(r, x, n * sizeof(float), cudaMemcpyDeviceToDevice, stream));
          });
      sel = MustFinish(ws, stream, "TopKWithResidual");
      Report(c, "topk_residual", n, density, k, sel, t, 12.0 * n + kv, ws.last_used_candidates());

      t = Time(stream, iterations,
               [&] { CheckStatus(RandomK(x, n, k, 42, out, ws, stream), "RandomK"); });
      sel = MustFinish(ws, stream, "RandomK");
      Report(c, "randomk", n, density, k, sel, t, 4.0 * n + kv, false);

      t = Time(stream, iterations,
               [&] { CheckStatus(Threshold(x, n, o, 42, out, ws, stream), "Threshold"); });
      sel = MustFinish(ws, stream, "Threshold");
      Report(c, "threshold", n, density, k, sel, t, 4.0 * n + 8.0 * sel, ws.last_used_candidates());

      t = Time(stream, iterations,
               [&] { CheckStatus(GaussianK(x, n, o, out, ws, stream), "GaussianK"); });
      sel = MustFinish(ws, stream, "GaussianK");
      Report(c, "gaussiank", n, density, k, sel, t, 4.0 * n + 8.0 * sel, false);

      t = Time(stream, iterations,
               [&] { CheckStatus(Wangni(x, n, o, 42, out, ws, stream), "Wangni"); });
      sel = MustFinish(ws, stream, "Wangni");
      Report(c, "wangni", n, density, k, sel, t, 4.0 * n + 8.0 * sel, false);

      SparsifierOptions dgc = o;
      dgc.warmup = false;
      t = Time(
          stream, iterations,
          [&] {
            CheckStatus(Dgc(g, n, dgc, 10, {u, v}, out, ws, stream), "Dgc");
          },
          [&] {
            BENCH_CHECK(cudaMemsetAsync(u, 0, n * sizeof(float), stream));
            BENCH_CHECK(cudaMemcpyAsync(v, x, n * sizeof(float), cudaMemcpyDeviceToDevice, stream));
          });
      sel = MustFinish(ws, stream, "Dgc");
      Report(c, "dgc", n, density, k, sel, t, 20.0 * n + kv, ws.last_used_candidates());

      // Pack the k values of the last top-k selection.
      CheckStatus(TopK(x, n, k, out, ws, stream), "TopK");
      MustFinish(ws, stream, "TopK");
      t = Time(stream, iterations,
               [&] { CheckStatus(PackFloat16(out_values, k, halves, stream), "PackFloat16"); });
      Report(c, "pack_fp16", n, density, k, k, t, 6.0 * k, false);

      // Scatter-add + average of 16 payloads of k entries (float32), disjoint-ish index sets.
      constexpr int kPayloads = 16;
      std::vector<int32_t*> payload_indices;
      std::vector<DevicePayload> payloads;
      const int64_t step = std::max<int64_t>(1, n / k);
      for (int p = 0; p < kPayloads; ++p) {
        std::vector<int32_t> idx(static_cast<size_t>(k));
        for (int64_t j = 0; j < k; ++j) {
          idx[static_cast<size_t>(j)] =
              static_cast<int32_t>(std::min<int64_t>(n - 1, j * step + (p * 131) % step));
        }
        int32_t* d = DeviceAlloc<int32_t>(k);
        BENCH_CHECK(cudaMemcpy(d, idx.data(), k * sizeof(int32_t), cudaMemcpyHostToDevice));
        payload_indices.push_back(d);
        payloads.push_back({d, x, k, PayloadValues::kFloat32});
      }
      t = Time(stream, iterations, [&] {
        CheckStatus(ScatterAddAverage(payloads, dense, n, kPayloads, ws, stream),
                    "ScatterAddAverage");
      });
      MustFinish(ws, stream, "ScatterAddAverage");
      Report(c, "scatter_add_16", n, density, k, k * kPayloads, t, 4.0 * n + 16.0 * kv, false);
      for (int32_t* d : payload_indices) BENCH_CHECK(cudaFree(d));
    }
  }
  return 0;
}

}  // namespace
}  // namespace sparsync::kernels::cuda

int main(int argc, char** argv) { return sparsync::kernels::cuda::Main(argc, argv); }
