// Throughput of the CPU sparsifiers on float32 gradients, with two baselines in the same binary:
// a streaming read (sum) of the buffer — the memory-bandwidth bound for any one-pass kernel —
// and std::nth_element by magnitude, the textbook exact top-k.
//
//   build-kernels/sparsify_bench --benchmark_min_time=0.2
//
// bytes_per_second counts the float32 input once (4 bytes per element) per iteration.

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/dgc_state.h"
#include "kernels/sparsifier.h"

namespace {

using sparsync::kernels::DenseView;
using sparsync::kernels::DgcState;
using sparsync::kernels::DType;
using sparsync::kernels::SparseView;
using sparsync::kernels::SparsifierOptions;
using sparsync::kernels::SparsifyContext;

// N(0, 1) gradient, generated once per size.
const std::vector<float>& Gradient(int64_t n) {
  static std::map<int64_t, std::vector<float>> cache;
  auto& x = cache[n];
  if (x.empty()) {
    std::mt19937_64 rng(42);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    x.resize(static_cast<size_t>(n));
    for (float& v : x) v = normal(rng);
  }
  return x;
}

void BM_Sparsify(benchmark::State& state, std::string name, int64_t n, double density) {
  const std::vector<float>& x = Gradient(n);
  SparsifierOptions options;
  options.density = density;
  options.warmup = false;
  auto made = sparsync::kernels::MakeSparsifier(name, options);
  if (!made.ok()) {
    state.SkipWithError(made.status().ToString().c_str());
    return;
  }
  auto sparsifier = std::move(made).value();
  if (!sparsifier->Prepare(n, DType::kFloat32).ok()) {
    state.SkipWithError("Prepare failed");
    return;
  }
  const int64_t cap = sparsifier->MaxSelected(n);
  std::vector<int32_t> indices(static_cast<size_t>(cap));
  std::vector<float> values(static_cast<size_t>(cap));
  DgcState dgc;
  if (name == "dgc") dgc.Reset(n);
  SparsifyContext ctx;
  ctx.dgc_state = &dgc;
  int64_t selected = 0;
  for (auto _ : state) {
    ++ctx.seed;
    SparseView out{indices.data(), values.data(), cap, 0};
    const auto status = sparsifier->Sparsify(DenseView{x.data(), n, DType::kFloat32}, &out, ctx);
    if (!status.ok()) {
      state.SkipWithError(status.ToString().c_str());
      return;
    }
    selected = out.k;
    benchmark::DoNotOptimize(values.data());
  }
  state.SetBytesProcessed(state.iterations() * n * static_cast<int64_t>(sizeof(float)));
  state.counters["k"] = static_cast<double>(selected);
}

void BM_StreamingSum(benchmark::State& state, int64_t n) {
  const std::vector<float>& x = Gradient(n);
  for (auto _ : state) {
    float lane[16] = {};
    for (int64_t i = 0; i + 16 <= n; i += 16) {
      for (int j = 0; j < 16; ++j) lane[j] += x[static_cast<size_t>(i + j)];
    }
    float s = 0;
    for (float v : lane) s += v;
    benchmark::DoNotOptimize(s);
  }
  state.SetBytesProcessed(state.iterations() * n * static_cast<int64_t>(sizeof(float)));
}

// Exact top-k by |x| with std::nth_element on a copy (the copy is excluded from the timing).
void BM_NthElement(benchmark::State& state, int64_t n, double density) {
  const std::vector<float>& x = Gradient(n);
  const auto k = static_cast<int64_t>(density * static_cast<double>(n));
  std::vector<float> work(x.size());
  for (auto _ : state) {
    state.PauseTiming();
    std::copy(x.begin(), x.end(), work.begin());
    state.ResumeTiming();
    std::nth_element(work.begin(), work.begin() + (k - 1), work.end(),
                     [](float a, float b) { return std::fabs(a) > std::fabs(b); });
    benchmark::DoNotOptimize(work.data());
  }
  state.SetBytesProcessed(state.iterations() * n * static_cast<int64_t>(sizeof(float)));
}

void RegisterAll() {
  const int64_t sizes[] = {1 << 20, 25 << 20};
  const double densities[] = {0.001, 0.01};
  for (int64_t n : sizes) {
    const std::string ns = n == (1 << 20) ? "1M" : "25M";
    benchmark::RegisterBenchmark(("StreamingSum/" + ns).c_str(), BM_StreamingSum, n)
        ->Unit(benchmark::kMillisecond);
    for (double d : densities) {
      char ds[16];
      std::snprintf(ds, sizeof ds, "%g", d);
      benchmark::RegisterBenchmark(("NthElement/" + ns + "/" + ds).c_str(), BM_NthElement, n, d)
          ->Unit(benchmark::kMillisecond);
      for (const char* name : {"topk", "randomk", "threshold", "gaussiank", "wangni", "dgc"}) {
        benchmark::RegisterBenchmark((std::string(name) + "/" + ns + "/" + ds).c_str(),
                                     BM_Sparsify, std::string(name), n, d)
            ->Unit(benchmark::kMillisecond);
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  RegisterAll();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
