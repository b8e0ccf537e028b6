// The C interface of kernels/cuda/sparsify_plugin.h, on whichever library implements it: the
// library is dlopen'ed from SPARSYNC_TEST_SPARSIFY_PLUGIN. ctest runs this on the CPU fake
// (tests/support/fake_sparsify), with host memory as "device" memory and no stream; with
// SPARSYNC_TEST_SPARSIFY_DEVICE=1 (the real libsparsync_sparsify_cuda.so,
// tests/gpu/device_check.sh) the buffers are cudaMalloc'd through the CUDA runtime the plugin
// itself loaded, on a stream of that runtime, and every test skips when there is no device. Results
// are checked against host computations: the reference top-k (kernels/reference) and the
// add-in-order-then-divide definition of scatter-add-average and the host's float32 division,
// bit for bit.

#include "kernels/cuda/sparsify_plugin.h"

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <link.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/reference/reference.h"
#include "tests/unit/kernels/test_util.h"

namespace sparsync::kernels {
namespace {

using testing::DataKind;
using testing::MakeData;
using testing::SameBits;

constexpr int kCudaMemcpyDefault = 4;  // cudaMemcpyKind

// The entry points of the CUDA runtime that the test needs (cudaError_t as int, streams as void*).
struct CudaRuntime {
  int (*get_device_count)(int*) = nullptr;
  int (*malloc_device)(void**, size_t) = nullptr;
  int (*free_device)(void*) = nullptr;
  int (*copy)(void*, const void*, size_t, int) = nullptr;
  int (*stream_create)(void**) = nullptr;
  int (*stream_synchronize)(void*) = nullptr;
};

// The library under test and how to reach its memory; loaded once per process, never unloaded.
struct Library {
  std::string error;  // why it could not be loaded; empty when it was
  decltype(&sparsync_sp_abi_version) abi_version = nullptr;
  decltype(&sparsync_sp_workspace_create) workspace_create = nullptr;
  decltype(&sparsync_sp_workspace_destroy) workspace_destroy = nullptr;
  decltype(&sparsync_sp_topk_residual) topk_residual = nullptr;
  decltype(&sparsync_sp_scatter_add_average) scatter_add_average = nullptr;
  decltype(&sparsync_sp_pack_float16_residual) pack_float16_residual = nullptr;
  decltype(&sparsync_sp_divide) divide = nullptr;
  decltype(&sparsync_sp_finish) finish = nullptr;
  int64_t (*fake_calls)() = nullptr;  // only in the fake
  bool device = false;                // buffers in device memory through `cuda`
  CudaRuntime cuda;
  bool has_gpu = false;
  void* stream = nullptr;
};

template <class F>
bool Resolve(void* handle, const char* name, F* out, std::string* error) {
  *out = reinterpret_cast<F>(dlsym(handle, name));
  if (*out == nullptr && error->empty()) *error = std::string("no symbol ") + name;
  return *out != nullptr;
}

// The CUDA runtime the plugin loaded (libcudart.so.<major> by its SONAME), so that the test's
// allocations and stream belong to the same runtime instance as the plugin's.
void* OpenLoadedCudart() {
  std::string path;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        auto* found = static_cast<std::string*>(data);
        if (info->dlpi_name != nullptr &&
            std::strstr(info->dlpi_name, "/libcudart.so") != nullptr) {
          *found = info->dlpi_name;
          return 1;
        }
        return 0;
      },
      &path);
  return dlopen(path.empty() ? "libcudart.so" : path.c_str(), RTLD_NOW | RTLD_LOCAL);
}

Library Load() {
  Library lib;
  const char* path = std::getenv("SPARSYNC_TEST_SPARSIFY_PLUGIN");
  if (path == nullptr || *path == '\0') {
    lib.error =
        "SPARSYNC_TEST_SPARSIFY_PLUGIN is not set (ctest sets it to "
        "the library's path)";
    return lib;
  }
  void* handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    lib.error = std::string("dlopen: ") + dlerror();
    return lib;
  }
  std::string& e = lib.error;
  Resolve(handle, "sparsync_sp_abi_version", &lib.abi_version, &e);
  Resolve(handle, "sparsync_sp_workspace_create", &lib.workspace_create, &e);
  Resolve(handle, "sparsync_sp_workspace_destroy", &lib.workspace_destroy, &e);
  Resolve(handle, "sparsync_sp_topk_residual", &lib.topk_residual, &e);
  Resolve(handle, "sparsync_sp_scatter_add_average", &lib.scatter_add_average, &e);
  Resolve(handle, "sparsync_sp_pack_float16_residual", &lib.pack_float16_residual, &e);
  Resolve(handle, "sparsync_sp_divide", &lib.divide, &e);
  Resolve(handle, "sparsync_sp_finish", &lib.finish, &e);
  lib.fake_calls = reinterpret_cast<int64_t (*)()>(dlsym(handle, "sparsync_fake_sp_calls"));
  const char* device = std::getenv("SPARSYNC_TEST_SPARSIFY_DEVICE");
  lib.device = device != nullptr && std::strcmp(device, "1") == 0;
  if (!lib.device || !e.empty()) return lib;
  void* cudart = OpenLoadedCudart();
  if (cudart == nullptr) {
    e = std::string("dlopen of the CUDA runtime: ") + dlerror();
    return lib;
  }
  CudaRuntime& c = lib.cuda;
  Resolve(cudart, "cudaGetDeviceCount", &c.get_device_count, &e);
  Resolve(cudart, "cudaMalloc", &c.malloc_device, &e);
  Resolve(cudart, "cudaFree", &c.free_device, &e);
  Resolve(cudart, "cudaMemcpy", &c.copy, &e);
  Resolve(cudart, "cudaStreamCreate", &c.stream_create, &e);
  Resolve(cudart, "cudaStreamSynchronize", &c.stream_synchronize, &e);
  if (!e.empty()) return lib;
  int count = 0;
  lib.has_gpu = c.get_device_count(&count) == 0 && count > 0;
  if (lib.has_gpu && c.stream_create(&lib.stream) != 0) e = "cudaStreamCreate failed";
  return lib;
}

const Library& TheLibrary() {
  static const Library lib = Load();
  return lib;
}

// n elements of T in the library's memory.
template <class T>
class Buffer {
 public:
  Buffer(const Library& lib, size_t n) : lib_(lib), n_(n) {
    const size_t bytes = std::max<size_t>(n, 1) * sizeof(T);
    if (lib.device) {
      void* p = nullptr;
      EXPECT_EQ(lib.cuda.malloc_device(&p, bytes), 0) << "cudaMalloc of " << bytes << " bytes";
      data_ = static_cast<T*>(p);
    } else {
      data_ = static_cast<T*>(std::malloc(bytes));
    }
  }
  Buffer(const Library& lib, const std::vector<T>& values) : Buffer(lib, values.size()) {
    Upload(values);
  }
  ~Buffer() {
    if (lib_.device) {
      lib_.cuda.free_device(data_);
    } else {
      std::free(data_);
    }
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  T* get() const { return data_; }
  void Upload(const std::vector<T>& values) {
    ASSERT_EQ(values.size(), n_);
    Copy(data_, values.data(), n_ * sizeof(T));
  }
  std::vector<T> Download() const {
    std::vector<T> values(n_);
    Copy(values.data(), data_, n_ * sizeof(T));
    return values;
  }

 private:
  void Copy(void* dst, const void* src, size_t bytes) const {
    if (bytes == 0) return;
    if (lib_.device) {
      EXPECT_EQ(lib_.cuda.copy(dst, src, bytes, kCudaMemcpyDefault), 0) << "cudaMemcpy";
    } else {
      std::memcpy(dst, src, bytes);
    }
  }

  const Library& lib_;
  size_t n_;
  T* data_ = nullptr;
};

class SparsifyPluginTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(lib().error.empty()) << lib().error;
    if (lib().device && !lib().has_gpu) GTEST_SKIP() << "no CUDA device";
  }
  void TearDown() override {
    if (workspace_ != nullptr) lib().workspace_destroy(workspace_);
  }

  static const Library& lib() { return TheLibrary(); }
  void* stream() const { return lib().stream; }

  sparsync_sp_workspace* Workspace(int64_t max_numel, int64_t max_k) {
    if (workspace_ != nullptr) lib().workspace_destroy(workspace_);
    workspace_ = nullptr;
    sparsync_sp_error error{};
    EXPECT_EQ(lib().workspace_create(max_numel, max_k, &workspace_, &error), SPARSYNC_SP_OK)
        << error.message;
    return workspace_;
  }

  // Finish on the test's workspace: the code, *count, and the error.
  int Finish(int64_t* count, sparsync_sp_error* error) {
    return lib().finish(workspace_, stream(), count, error);
  }

  sparsync_sp_workspace* workspace_ = nullptr;
};

// One top-k-with-residual step on the host: a = residual + grad, the reference top-k of a, and
// residual = a with the selected coordinates zeroed.
struct HostStep {
  std::vector<int32_t> indices;
  std::vector<float> values;
  std::vector<float> residual;
};

HostStep ReferenceStep(const std::vector<float>& grad, const std::vector<float>& residual,
                       int64_t k) {
  HostStep step;
  step.residual.resize(grad.size());
  for (size_t i = 0; i < grad.size(); ++i) step.residual[i] = residual[i] + grad[i];
  step.indices = reference::TopKIndices(step.residual, k);
  for (int32_t i : step.indices) {
    step.values.push_back(step.residual[static_cast<size_t>(i)]);
    step.residual[static_cast<size_t>(i)] = 0.0f;
  }
  return step;
}

void ExpectSameFloats(const std::vector<float>& actual, const std::vector<float>& expected,
                      const char* what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t i = 0; i < actual.size(); ++i) {
    ASSERT_TRUE(SameBits(actual[i], expected[i]))
        << what << "[" << i << "] = " << actual[i] << ", expected " << expected[i];
  }
}

TEST_F(SparsifyPluginTest, AbiVersion) { EXPECT_EQ(lib().abi_version(), SPARSYNC_SP_ABI_VERSION); }

// (numel, k, data kind): one tile and several, few and many ties, k up to numel.
class TopKResidualTest
    : public SparsifyPluginTest,
      public ::testing::WithParamInterface<std::tuple<int64_t, int64_t, DataKind>> {};

TEST_P(TopKResidualTest, TwoStepsMatchTheReferenceAndKeepTheResidual) {
  const auto [numel, k, kind] = GetParam();
  auto* ws = Workspace(numel, k);
  ASSERT_NE(ws, nullptr);
  std::vector<float> host_residual = MakeData(kind, numel, 7);  // a residual left by earlier steps
  Buffer<float> residual(lib(), host_residual);
  Buffer<int32_t> indices(lib(), static_cast<size_t>(k));
  Buffer<float> values(lib(), static_cast<size_t>(k));
  const int64_t calls_before = lib().fake_calls != nullptr ? lib().fake_calls() : 0;
  for (uint64_t step = 0; step < 2; ++step) {  // the second step adds to the first's residual
    SCOPED_TRACE("step " + std::to_string(step));
    const std::vector<float> host_grad = MakeData(kind, numel, 100 + step);
    Buffer<float> grad(lib(), host_grad);
    sparsync_sp_error error{};
    ASSERT_EQ(lib().topk_residual(grad.get(), residual.get(), numel, k, indices.get(), values.get(),
                                  k, ws, stream(), &error),
              SPARSYNC_SP_OK)
        << error.message;
    int64_t count = -1;
    ASSERT_EQ(Finish(&count, &error), SPARSYNC_SP_OK) << error.message;
    EXPECT_EQ(error.index, -1);
    const HostStep expected = ReferenceStep(host_grad, host_residual, k);
    ASSERT_EQ(count, k);
    EXPECT_EQ(indices.Download(), expected.indices);
    ExpectSameFloats(values.Download(), expected.values, "values");
    ExpectSameFloats(residual.Download(), expected.residual, "residual");
    host_residual = expected.residual;
  }
  if (lib().fake_calls != nullptr) {
    EXPECT_EQ(lib().fake_calls() - calls_before, 2);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Sizes, TopKResidualTest,
    ::testing::Values(std::make_tuple(int64_t{37}, int64_t{5}, DataKind::kNormal),
                      std::make_tuple(int64_t{37}, int64_t{37}, DataKind::kTies),
                      std::make_tuple(int64_t{20000}, int64_t{3000}, DataKind::kTies),
                      std::make_tuple(int64_t{20000}, int64_t{20}, DataKind::kSignedZeros),
                      std::make_tuple(int64_t{100000}, int64_t{1000}, DataKind::kNormal),
                      std::make_tuple(int64_t{100000}, int64_t{100}, DataKind::kHeavyTailed)),
    [](const auto& info) {
      return "n" + std::to_string(std::get<0>(info.param)) + "_k" +
             std::to_string(std::get<1>(info.param)) + "_" +
             testing::DataKindName(std::get<2>(info.param));
    });

TEST_F(SparsifyPluginTest, NonFiniteInputSelectsNothingAndNamesTheFirstElement) {
  constexpr int64_t kNumel = 20000;
  constexpr int64_t kK = 50;
  auto* ws = Workspace(kNumel, kK);
  ASSERT_NE(ws, nullptr);
  std::vector<float> host_grad = MakeData(DataKind::kNormal, kNumel, 3);
  const std::vector<float> host_residual = MakeData(DataKind::kNormal, kNumel, 4);
  host_grad[15000] = std::numeric_limits<float>::infinity();
  host_grad[9001] = std::numeric_limits<float>::quiet_NaN();
  Buffer<float> grad(lib(), host_grad);
  Buffer<float> residual(lib(), host_residual);
  Buffer<int32_t> indices(lib(), kK);
  Buffer<float> values(lib(), kK);
  sparsync_sp_error error{};
  ASSERT_EQ(lib().topk_residual(grad.get(), residual.get(), kNumel, kK, indices.get(), values.get(),
                                kK, ws, stream(), &error),
            SPARSYNC_SP_OK)
      << error.message;
  int64_t count = -1;
  ASSERT_EQ(Finish(&count, &error), SPARSYNC_SP_NONFINITE);
  EXPECT_EQ(error.index, 9001);
  EXPECT_NE(std::string(error.message).find("9001"), std::string::npos) << error.message;
  EXPECT_EQ(count, 0);
  // The residual is unspecified now (sparsify_plugin.h): the caller discards it.

  // The workspace stays usable: a finite step afterwards succeeds.
  host_grad[15000] = 1.0f;
  host_grad[9001] = 1.0f;
  grad.Upload(host_grad);
  residual.Upload(host_residual);
  ASSERT_EQ(lib().topk_residual(grad.get(), residual.get(), kNumel, kK, indices.get(), values.get(),
                                kK, ws, stream(), &error),
            SPARSYNC_SP_OK)
      << error.message;
  ASSERT_EQ(Finish(&count, &error), SPARSYNC_SP_OK) << error.message;
  EXPECT_EQ(count, kK);
  EXPECT_EQ(error.index, -1);
}

// Payloads with overlapping, strictly ascending indices, random float32 values.
std::vector<std::vector<int32_t>> PayloadIndices(int num_payloads, int64_t numel, int64_t count,
                                                 uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int32_t>> all;
  for (int p = 0; p < num_payloads; ++p) {
    std::vector<int32_t> chosen =
        reference::TopKIndices(MakeData(DataKind::kNormal, numel, rng()), count);
    all.push_back(chosen);
  }
  return all;
}

// (number of payloads, divisor): beyond 32 payloads the CUDA kernel works in several launches.
class ScatterAddAverageTest : public SparsifyPluginTest,
                              public ::testing::WithParamInterface<std::tuple<int, double>> {};

TEST_P(ScatterAddAverageTest, MatchesTheHostDefinitionBitForBit) {
  const auto [num_payloads, divisor] = GetParam();
  constexpr int64_t kNumel = 50000;
  constexpr int64_t kCount = 2000;
  auto* ws = Workspace(kNumel, kCount);
  ASSERT_NE(ws, nullptr);
  const auto indices = PayloadIndices(num_payloads, kNumel, kCount, 11);
  std::vector<std::unique_ptr<Buffer<int32_t>>> index_buffers;
  std::vector<std::unique_ptr<Buffer<float>>> value_buffers;
  std::vector<sparsync_sp_payload> payloads;
  std::vector<float> expected(kNumel, 0.0f);
  for (int p = 0; p < num_payloads; ++p) {
    const std::vector<float> values = MakeData(DataKind::kHeavyTailed, kCount, 50 + p);
    for (int64_t e = 0; e < kCount; ++e) expected[indices[p][e]] += values[e];
    index_buffers.push_back(std::make_unique<Buffer<int32_t>>(lib(), indices[p]));
    value_buffers.push_back(std::make_unique<Buffer<float>>(lib(), values));
    payloads.push_back({index_buffers.back()->get(), value_buffers.back()->get(), kCount});
  }
  if (divisor != 1.0) {
    for (float& x : expected) x /= static_cast<float>(divisor);
  }
  Buffer<float> dense(lib(), std::vector<float>(kNumel, 7.0f));  // overwritten, not added to
  sparsync_sp_error error{};
  ASSERT_EQ(lib().scatter_add_average(payloads.data(), num_payloads, dense.get(), kNumel, divisor,
                                      ws, stream(), &error),
            SPARSYNC_SP_OK)
      << error.message;
  int64_t count = -1;
  ASSERT_EQ(Finish(&count, &error), SPARSYNC_SP_OK) << error.message;
  EXPECT_EQ(count, 0);
  ExpectSameFloats(dense.Download(), expected, "dense");
}

INSTANTIATE_TEST_SUITE_P(Payloads, ScatterAddAverageTest,
                         ::testing::Values(std::make_tuple(3, 1.0), std::make_tuple(3, 4.0),
                                           std::make_tuple(3, 3.0), std::make_tuple(40, 40.0)),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "_payloads_divisor_" +
                                  std::to_string(static_cast<int>(std::get<1>(info.param)));
                         });

TEST_F(SparsifyPluginTest, InvalidPayloadEntriesAreReportedAndNeverWrittenOutOfBounds) {
  constexpr int64_t kNumel = 10000;
  constexpr int64_t kGuard = 64;
  auto* ws = Workspace(kNumel, 16);
  ASSERT_NE(ws, nullptr);
  const std::vector<std::vector<int32_t>> cases = {
      {1, 5, 9999, 10000},  // out of range (just past the end)
      {1, 7, 7, 20},        // repeated index
      {3, 2, 40},           // descending
      {-1, 4},              // negative
  };
  for (const std::vector<int32_t>& bad : cases) {
    SCOPED_TRACE(::testing::PrintToString(bad));
    const auto count = static_cast<int64_t>(bad.size());
    Buffer<int32_t> indices(lib(), bad);
    Buffer<float> values(lib(), std::vector<float>(bad.size(), 1.0f));
    // The dense tensor sits inside a larger allocation whose guard elements must stay untouched.
    Buffer<float> storage(lib(), std::vector<float>(kNumel + 2 * kGuard, -5.0f));
    const sparsync_sp_payload payload{indices.get(), values.get(), count};
    sparsync_sp_error error{};
    ASSERT_EQ(lib().scatter_add_average(&payload, 1, storage.get() + kGuard, kNumel, 2.0, ws,
                                        stream(), &error),
              SPARSYNC_SP_OK)
        << error.message;
    int64_t finished = -1;
    EXPECT_EQ(Finish(&finished, &error), SPARSYNC_SP_INVALID_ARGUMENT);
    EXPECT_NE(error.message[0], '\0');
    EXPECT_EQ(error.index, -1);
    const std::vector<float> all = storage.Download();
    for (int64_t g = 0; g < kGuard; ++g) {
      ASSERT_EQ(all[g], -5.0f) << "guard before, " << g;
      ASSERT_EQ(all[kGuard + kNumel + g], -5.0f) << "guard after, " << g;
    }
  }
}

TEST_F(SparsifyPluginTest, Float16PackingPutsTheRoundingBackIntoTheResidual) {
  constexpr int64_t kNumel = 3000;
  ASSERT_NE(Workspace(kNumel, 8), nullptr);  // only for Finish, which waits for the stream
  // Values float16 holds exactly, ones it rounds (to even, up and down), tiny and large ones.
  const std::vector<float> host_values = {0.5f,    -2.0f,   1.0f / 3.0f, 1.00048828125f,
                                          3.14159f, -1e-6f, 6.0e4f,      -123.456f};
  const std::vector<int32_t> host_indices = {3, 10, 11, 400, 401, 2000, 2998, 2999};
  const auto count = static_cast<int64_t>(host_values.size());
  std::vector<float> host_residual(kNumel, 7.0f);
  for (int32_t i : host_indices) host_residual[i] = 0.0f;  // where top-k selected
  Buffer<float> values(lib(), host_values);
  Buffer<int32_t> indices(lib(), host_indices);
  Buffer<uint16_t> out(lib(), std::vector<uint16_t>(count, 0));
  Buffer<float> residual(lib(), host_residual);
  sparsync_sp_error error{};
  ASSERT_EQ(lib().pack_float16_residual(values.get(), indices.get(), count, out.get(),
                                        residual.get(), kNumel, stream(), &error),
            SPARSYNC_SP_OK)
      << error.message;
  int64_t unused = -1;
  ASSERT_EQ(Finish(&unused, &error), SPARSYNC_SP_OK) << error.message;
  const std::vector<uint16_t> halves = out.Download();
  const std::vector<float> kept = residual.Download();
  for (int64_t j = 0; j < count; ++j) {
    EXPECT_EQ(halves[j], FloatToHalf(host_values[j])) << j;
    const float dropped = host_values[j] - HalfToFloat(FloatToHalf(host_values[j]));
    host_residual[host_indices[j]] = dropped;
  }
  for (int64_t i = 0; i < kNumel; ++i) ASSERT_TRUE(SameBits(kept[i], host_residual[i])) << i;
  EXPECT_NE(host_residual[11], 0.0f);  // 1/3 is not a float16: something was put back

  // An index outside [0, numel) is skipped, the rest still packed.
  Buffer<int32_t> outside(lib(), std::vector<int32_t>{5, kNumel});
  ASSERT_EQ(lib().pack_float16_residual(values.get(), outside.get(), 2, out.get(), residual.get(),
                                        kNumel, stream(), &error),
            SPARSYNC_SP_OK)
      << error.message;
  ASSERT_EQ(Finish(&unused, &error), SPARSYNC_SP_OK) << error.message;
  EXPECT_TRUE(SameBits(residual.Download()[5], 0.0f));  // 0.5 is exact in float16
  ASSERT_EQ(lib().pack_float16_residual(nullptr, indices.get(), 1, out.get(), residual.get(),
                                        kNumel, stream(), &error),
            SPARSYNC_SP_INVALID_ARGUMENT);
  EXPECT_NE(std::string(error.message).find("null"), std::string::npos) << error.message;
}

float FromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Values whose quotients round (1/3 of most floats is not a float), both signs, signed zeros,
// subnormals (in and out), the largest and smallest normals, infinities and a NaN with a payload,
// then more of the given kind, `numel` in all.
std::vector<float> DivideInput(int64_t numel, DataKind kind) {
  constexpr float kMax = std::numeric_limits<float>::max();
  constexpr float kMin = std::numeric_limits<float>::min();
  constexpr float kInf = std::numeric_limits<float>::infinity();
  std::vector<float> v = {1.0f, -1.0f, 2.0f, -7.0f, 0.1f, 10.0f, 3.0f, 123456.789f, -0.33333334f};
  v.insert(v.end(), {0.0f, -0.0f});
  v.insert(v.end(), {1e-40f, -1e-44f, kMin, -kMin * 1.5f, -3.3e-38f});  // subnormal quotients
  v.insert(v.end(), {1e30f, kMax, -kMax, kInf, -kInf, FromBits(0x7FC01234u)});
  const std::vector<float> more = MakeData(kind, numel - static_cast<int64_t>(v.size()), 5);
  v.insert(v.end(), more.begin(), more.end());
  return v;
}

// (numel, divisor, data kind): one block and many (the kernel strides over the grid), an integral
// divisor, and one that float32 does not hold (the division is by its float32 rounding).
class DivideTest : public SparsifyPluginTest,
                   public ::testing::WithParamInterface<std::tuple<int64_t, double, DataKind>> {};

TEST_P(DivideTest, MatchesTheHostFloat32DivisionBitForBit) {
  const auto [numel, divisor, kind] = GetParam();
  constexpr int64_t kGuard = 64;
  ASSERT_NE(Workspace(1, 0), nullptr);  // only for Finish, which waits for the stream
  const std::vector<float> input = DivideInput(numel, kind);
  // The tensor sits inside a larger allocation whose guard elements must stay untouched.
  std::vector<float> storage(static_cast<size_t>(numel + 2 * kGuard), -5.0f);
  std::copy(input.begin(), input.end(), storage.begin() + kGuard);
  Buffer<float> data(lib(), storage);
  sparsync_sp_error error{};
  ASSERT_EQ(lib().divide(data.get() + kGuard, numel, divisor, stream(), &error), SPARSYNC_SP_OK)
      << error.message;
  int64_t unused = -1;
  ASSERT_EQ(Finish(&unused, &error), SPARSYNC_SP_OK) << error.message;
  const std::vector<float> got = data.Download();
  const float d = static_cast<float>(divisor);
  int64_t rounded = 0;
  for (int64_t i = 0; i < numel; ++i) {
    const float x = input[i];
    const float want = x / d;
    const float actual = got[kGuard + i];
    if (std::isnan(want)) {  // a GPU may give another NaN
      ASSERT_TRUE(std::isnan(actual)) << i << ": " << x << " / " << d << " = " << actual;
      continue;
    }
    ASSERT_TRUE(SameBits(actual, want))
        << i << ": " << x << " / " << d << " = " << actual << ", expected " << want;
    if (static_cast<double>(want) * d != static_cast<double>(x)) ++rounded;
  }
  EXPECT_GT(rounded, numel / 4) << "too few quotients that need rounding";
  for (int64_t g = 0; g < kGuard; ++g) {
    ASSERT_EQ(got[g], -5.0f) << "guard before, " << g;
    ASSERT_EQ(got[kGuard + numel + g], -5.0f) << "guard after, " << g;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Sizes, DivideTest,
    ::testing::Values(std::make_tuple(int64_t{37}, 3.0, DataKind::kNormal),
                      std::make_tuple(int64_t{100003}, 3.0, DataKind::kHeavyTailed),
                      std::make_tuple(int64_t{100003}, 3.0, DataKind::kDenormals),
                      std::make_tuple(int64_t{5000}, 0.1, DataKind::kNormal)),
    [](const auto& info) {
      char divisor[32];
      std::snprintf(divisor, sizeof divisor, "%g", std::get<1>(info.param));
      std::replace(divisor, divisor + std::strlen(divisor), '.', '_');
      return "n" + std::to_string(std::get<0>(info.param)) + "_divisor_" + divisor + "_" +
             testing::DataKindName(std::get<2>(info.param));
    });

TEST_F(SparsifyPluginTest, DivideByOneLeavesEveryBitAndNoElementsIsANoOp) {
  ASSERT_NE(Workspace(1, 0), nullptr);  // only for Finish, which waits for the stream
  std::vector<float> input = DivideInput(1000, DataKind::kSignedZeros);
  input.push_back(FromBits(0x7F800001u));  // a signalling NaN, which a division would quiet
  input.push_back(FromBits(0xFFC00DEFu));  // a negative quiet NaN with a payload
  Buffer<float> data(lib(), input);
  const auto n = static_cast<int64_t>(input.size());
  sparsync_sp_error error{};
  ASSERT_EQ(lib().divide(data.get(), n, 1.0, stream(), &error), SPARSYNC_SP_OK) << error.message;
  ASSERT_EQ(lib().divide(nullptr, 0, 3.0, stream(), &error), SPARSYNC_SP_OK) << error.message;
  ASSERT_EQ(lib().divide(data.get(), 0, 3.0, stream(), &error), SPARSYNC_SP_OK) << error.message;
  int64_t unused = -1;
  ASSERT_EQ(Finish(&unused, &error), SPARSYNC_SP_OK) << error.message;
  const std::vector<float> got = data.Download();
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_TRUE(SameBits(got[i], input[i])) << i << ": " << got[i] << " for " << input[i];
  }
}

TEST_F(SparsifyPluginTest, DivideRejectsBadArgumentsWithAMessage) {
  ASSERT_NE(Workspace(1, 0), nullptr);  // only for Finish, which waits for the stream
  const std::vector<float> input = {6.0f, -9.0f, 1.5f};
  Buffer<float> data(lib(), input);
  const double kNan = std::numeric_limits<double>::quiet_NaN();
  const double kInf = std::numeric_limits<double>::infinity();
  const std::vector<std::tuple<float*, int64_t, double>> bad = {
      {data.get(), -1, 3.0},   // negative numel
      {data.get(), 3, 0.0},    // zero divisor
      {data.get(), 3, -0.0},   // negative zero
      {data.get(), 3, -2.0},   // negative
      {data.get(), 3, kNan},   // NaN
      {data.get(), 3, kInf},   // infinite
      {data.get(), 3, -kInf},  // negative infinite
      {data.get(), 0, 0.0},    // a bad divisor is rejected even with no elements
      {nullptr, 3, 3.0},       // null data with elements
  };
  for (const auto& [ptr, numel, divisor] : bad) {
    SCOPED_TRACE("numel " + std::to_string(numel) + " divisor " + std::to_string(divisor) +
                 (ptr == nullptr ? " null data" : ""));
    sparsync_sp_error error{};
    error.index = 12;
    EXPECT_EQ(lib().divide(ptr, numel, divisor, stream(), &error), SPARSYNC_SP_INVALID_ARGUMENT);
    EXPECT_NE(std::string(error.message).find("sparsync_sp_divide"), std::string::npos)
        << error.message;
    EXPECT_EQ(error.index, -1);
  }
  EXPECT_EQ(lib().divide(nullptr, 3, 3.0, stream(), nullptr), SPARSYNC_SP_INVALID_ARGUMENT)
      << "error may be null";
  int64_t unused = -1;
  sparsync_sp_error error{};
  ASSERT_EQ(Finish(&unused, &error), SPARSYNC_SP_OK) << error.message;
  const std::vector<float> got = data.Download();  // no rejected call wrote
  for (size_t i = 0; i < input.size(); ++i) EXPECT_TRUE(SameBits(got[i], input[i])) << i;
}

TEST_F(SparsifyPluginTest, BadArgumentsAreRejectedWithAMessage) {
  constexpr int64_t kNumel = 100;
  constexpr int64_t kK = 10;
  sparsync_sp_error error{};
  sparsync_sp_workspace* none = nullptr;
  EXPECT_EQ(lib().workspace_create(-1, 0, &none, &error), SPARSYNC_SP_INVALID_ARGUMENT);
  EXPECT_NE(error.message[0], '\0');
  EXPECT_EQ(lib().workspace_create(int64_t{1} << 31, 0, &none, &error),
            SPARSYNC_SP_INVALID_ARGUMENT);
  EXPECT_EQ(lib().workspace_create(10, 11, &none, &error), SPARSYNC_SP_INVALID_ARGUMENT);
  EXPECT_EQ(lib().workspace_create(10, 1, nullptr, &error), SPARSYNC_SP_INVALID_ARGUMENT);
  EXPECT_EQ(none, nullptr);
  lib().workspace_destroy(nullptr);

  auto* ws = Workspace(kNumel, kK);
  ASSERT_NE(ws, nullptr);
  int64_t count = -1;
  EXPECT_EQ(Finish(&count, &error), SPARSYNC_SP_OK) << "nothing to finish yet";
  EXPECT_EQ(count, 0);
  Buffer<float> grad(lib(), std::vector<float>(kNumel + 1, 1.0f));
  Buffer<float> residual(lib(), std::vector<float>(kNumel + 1, 0.0f));
  Buffer<int32_t> indices(lib(), kNumel + 1);
  Buffer<float> values(lib(), kNumel + 1);
  const auto topk = [&](int64_t numel, int64_t k, int64_t capacity, sparsync_sp_workspace* w,
                        sparsync_sp_error* e) {
    return lib().topk_residual(grad.get(), residual.get(), numel, k, indices.get(), values.get(),
                               capacity, w, stream(), e);
  };
  const std::vector<std::tuple<int64_t, int64_t, int64_t>> bad_topk = {
      {kNumel, 0, kK},           // k = 0
      {kNumel, kNumel + 1, kK},  // k > numel
      {kNumel, kK, kK - 1},      // capacity < k
      {0, 1, kK},                // empty tensor
      {kNumel + 1, kK, kK},      // beyond the workspace's max_numel
  };
  for (const auto& [numel, k, capacity] : bad_topk) {
    error = sparsync_sp_error{};
    EXPECT_EQ(topk(numel, k, capacity, ws, &error), SPARSYNC_SP_INVALID_ARGUMENT)
        << "numel " << numel << " k " << k << " capacity " << capacity;
    EXPECT_NE(error.message[0], '\0');
  }
  EXPECT_EQ(topk(kNumel, kK, kK, nullptr, &error), SPARSYNC_SP_INVALID_ARGUMENT);
  EXPECT_EQ(topk(kNumel, kK, kK, ws, nullptr), SPARSYNC_SP_OK) << "error may be null";
  EXPECT_EQ(Finish(&count, nullptr), SPARSYNC_SP_OK);
  EXPECT_EQ(count, kK);
  EXPECT_EQ(lib().topk_residual(nullptr, residual.get(), kNumel, kK, indices.get(), values.get(),
                                kK, ws, stream(), &error),
            SPARSYNC_SP_INVALID_ARGUMENT);

  Buffer<float> dense(lib(), kNumel);
  Buffer<int32_t> payload_indices(lib(), std::vector<int32_t>{1, 2});
  Buffer<float> payload_values(lib(), std::vector<float>{1.0f, 2.0f});
  const sparsync_sp_payload payload{payload_indices.get(), payload_values.get(), 2};
  const sparsync_sp_payload too_long{payload_indices.get(), payload_values.get(), kNumel + 1};
  const sparsync_sp_payload null_buffers{nullptr, payload_values.get(), 2};
  const auto scatter = [&](const sparsync_sp_payload* p, int num, int64_t numel, double divisor) {
    error = sparsync_sp_error{};
    const int code =
        lib().scatter_add_average(p, num, dense.get(), numel, divisor, ws, stream(), &error);
    if (code != SPARSYNC_SP_OK) {
      EXPECT_NE(error.message[0], '\0');
    }
    return code;
  };
  EXPECT_EQ(scatter(&payload, 1, kNumel, 0.0), SPARSYNC_SP_INVALID_ARGUMENT);
  EXPECT_EQ(scatter(&payload, 1, kNumel, std::nan("")), SPARSYNC_SP_INVALID_ARGUMENT);
  EXPECT_EQ(scatter(&payload, 1, kNumel, HUGE_VAL), SPARSYNC_SP_INVALID_ARGUMENT);
  EXPECT_EQ(scatter(&payload, -1, kNumel, 1.0), SPARSYNC_SP_INVALID_ARGUMENT);
  EXPECT_EQ(scatter(nullptr, 1, kNumel, 1.0), SPARSYNC_SP_INVALID_ARGUMENT);
  EXPECT_EQ(scatter(&payload, 1, kNumel + 1, 1.0), SPARSYNC_SP_INVALID_ARGUMENT);
  EXPECT_EQ(scatter(&too_long, 1, kNumel, 1.0), SPARSYNC_SP_INVALID_ARGUMENT);
  EXPECT_EQ(scatter(&null_buffers, 1, kNumel, 1.0), SPARSYNC_SP_INVALID_ARGUMENT);
  EXPECT_EQ(scatter(&payload, 1, kNumel, 2.0), SPARSYNC_SP_OK) << error.message;
  EXPECT_EQ(Finish(&count, &error), SPARSYNC_SP_OK) << error.message;
  EXPECT_EQ(count, 0);
  EXPECT_EQ(lib().finish(nullptr, stream(), &count, &error), SPARSYNC_SP_INVALID_ARGUMENT);
}

}  // namespace
}  // namespace sparsync::kernels
