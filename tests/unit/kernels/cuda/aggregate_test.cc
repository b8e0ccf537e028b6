// CUDA float16 packing, scatter-add + average and the dense division: bit-identical to the host
// definitions (kernels/dtype.h FloatToHalf; the CPU pipeline's add-in-rank-order then divide).

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/dtype.h"
#include "tests/unit/kernels/cuda/cuda_test_util.h"

namespace sparsync::kernels::cuda {
namespace {

using kernels::testing::SameBits;
using testing::CudaParamTest;
using testing::CudaTest;
using testing::DeviceArray;
using testing::MustCreate;

// Values that exercise every float16 rounding case: normal, subnormal, ties, overflow, zeros.
std::vector<float> HalfTestValues(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<uint32_t> bits;
  std::normal_distribution<float> normal;
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    switch (i % 6) {
      case 0:
        v[i] = normal(rng);
        break;
      case 1:
        v[i] = normal(rng) * 1e-6f;
        break;  // half subnormals
      case 2:
        v[i] = normal(rng) * 4e4f;
        break;   // near and past the half maximum
      case 3: {  // exact ties between two halves
        const uint32_t h = 0x3C00u + static_cast<uint32_t>(rng() % 1000);
        v[i] =
            (HalfToFloat(static_cast<uint16_t>(h)) + HalfToFloat(static_cast<uint16_t>(h + 1))) / 2;
        break;
      }
      case 4: {  // any finite float
        float f;
        do {
          const uint32_t b = bits(rng);
          std::memcpy(&f, &b, sizeof f);
        } while (!std::isfinite(f));
        v[i] = f;
        break;
      }
      default:
        v[i] = (rng() % 2) ? 0.0f : -0.0f;
        break;
    }
  }
  v[0] = std::numeric_limits<float>::infinity();
  return v;
}

TEST_F(CudaTest, PackFloat16MatchesFloatToHalf) {
  const std::vector<float> v = HalfTestValues(100003, 1);
  DeviceArray<float> dv(v);
  DeviceArray<uint16_t> dh(v.size());
  ASSERT_TRUE(PackFloat16(dv.get(), static_cast<int64_t>(v.size()), dh.get(), stream_).ok());
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  const std::vector<uint16_t> h = dh.Download();
  for (size_t i = 0; i < v.size(); ++i) {
    ASSERT_EQ(h[i], FloatToHalf(v[i])) << "value " << v[i] << " at " << i;
  }
}

TEST_F(CudaTest, PackFloat16WithResidualKeepsWhatHalfLoses) {
  const int64_t n = 50000;
  std::vector<int32_t> indices;
  for (int32_t i = 3; i < n; i += 7) indices.push_back(i);
  const std::vector<float> v = HalfTestValues(indices.size(), 2);
  std::vector<float> residual(static_cast<size_t>(n), 0.0f);
  residual[5] = 42.0f;  // not sent: untouched
  DeviceArray<float> dv(v), dr(residual);
  DeviceArray<int32_t> di(indices);
  DeviceArray<uint16_t> dh(v.size());
  ASSERT_TRUE(PackFloat16WithResidual(dv.get(), di.get(), static_cast<int64_t>(v.size()), dh.get(),
                                      dr.get(), n, stream_)
                  .ok());
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  const std::vector<float> got = dr.Download();
  for (size_t j = 0; j < indices.size(); ++j) {
    residual[static_cast<size_t>(indices[j])] = v[j] - HalfToFloat(FloatToHalf(v[j]));
  }
  for (size_t i = 0; i < got.size(); ++i) ASSERT_TRUE(SameBits(got[i], residual[i])) << i;
}

// The host's float32 averaging (x / float(divisor), nothing done for divisor 1), on values of
// every rounding case, subnormals in and out and infinities; a NaN stays a NaN.
TEST_F(CudaTest, DivideIsTheHostFloat32Division) {
  std::vector<float> v = HalfTestValues(100003, 3);
  v[1] = std::numeric_limits<float>::quiet_NaN();
  v[2] = -std::numeric_limits<float>::infinity();
  v[3] = std::numeric_limits<float>::denorm_min();
  for (double divisor : {3.0, 7.0, 0.1, 1.0}) {
    SCOPED_TRACE("divisor " + std::to_string(divisor));
    DeviceArray<float> dv(v);
    ASSERT_TRUE(Divide(dv.get(), static_cast<int64_t>(v.size()), divisor, stream_).ok());
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    const std::vector<float> got = dv.Download();
    const float d = static_cast<float>(divisor);
    for (size_t i = 0; i < v.size(); ++i) {
      const float want = divisor == 1.0 ? v[i] : v[i] / d;  // divisor 1: every bit kept
      if (std::isnan(want) && divisor != 1.0) {
        ASSERT_TRUE(std::isnan(got[i])) << i;
      } else {
        ASSERT_TRUE(SameBits(got[i], want))
            << "element " << i << ": " << v[i] << " / " << d << " = " << got[i] << ", not " << want;
      }
    }
  }
  // Nothing to do, and the argument checks.
  DeviceArray<float> dv(v);
  EXPECT_TRUE(Divide(nullptr, 0, 3.0, stream_).ok());
  EXPECT_EQ(Divide(dv.get(), -1, 3.0, stream_).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Divide(dv.get(), 5, 0.0, stream_).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Divide(dv.get(), 5, std::nan(""), stream_).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Divide(dv.get(), 5, HUGE_VAL, stream_).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Divide(nullptr, 5, 3.0, stream_).code(), StatusCode::kInvalidArgument);
}

struct HostPayload {
  std::vector<int32_t> indices;
  std::vector<float> values;     // as float32
  std::vector<uint16_t> halves;  // float16 bits, when half
  bool half = false;
};

HostPayload RandomPayload(int64_t n, double density, bool half, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::bernoulli_distribution keep(density);
  std::normal_distribution<float> normal;
  HostPayload p;
  p.half = half;
  for (int64_t i = 0; i < n; ++i) {
    if (!keep(rng)) continue;
    p.indices.push_back(static_cast<int32_t>(i));
    const float v = normal(rng);
    if (half) {
      p.halves.push_back(FloatToHalf(v));
      p.values.push_back(HalfToFloat(p.halves.back()));
    } else {
      p.values.push_back(v);
    }
  }
  return p;
}

using ScatterParam = std::tuple<int64_t, int, int>;  // numel, payloads, value mode

class ScatterSweep : public CudaParamTest<ScatterParam> {};

std::string ScatterName(const ::testing::TestParamInfo<ScatterParam>& info) {
  const char* modes[] = {"f32", "f16", "mixed"};
  return "n" + std::to_string(std::get<0>(info.param)) + "_p" +
         std::to_string(std::get<1>(info.param)) + "_" + modes[std::get<2>(info.param)];
}

// dense = (payload 0 + payload 1 + ... in order) / float(divisor), as the CPU pipeline computes it.
TEST_P(ScatterSweep, EqualsRankOrderSumThenDivide) {
  const auto [n, count, value_mode] = GetParam();  // value_mode: 0 float32, 1 float16, 2 mixed
  std::vector<HostPayload> host;
  for (int p = 0; p < count; ++p) {
    const bool half = value_mode == 1 || (value_mode == 2 && p % 2 == 1);
    host.push_back(RandomPayload(n, p % 3 == 0 ? 0.3 : 0.01, half, 1000 + p));
  }
  std::vector<std::unique_ptr<DeviceArray<int32_t>>> d_indices;
  std::vector<std::unique_ptr<DeviceArray<float>>> d_floats;
  std::vector<std::unique_ptr<DeviceArray<uint16_t>>> d_halves;
  std::vector<DevicePayload> payloads;
  for (const HostPayload& p : host) {
    d_indices.push_back(std::make_unique<DeviceArray<int32_t>>(p.indices));
    DevicePayload payload;
    payload.indices = d_indices.back()->get();
    payload.count = static_cast<int64_t>(p.indices.size());
    if (p.half) {
      d_halves.push_back(std::make_unique<DeviceArray<uint16_t>>(p.halves));
      payload.values = d_halves.back()->get();
      payload.value_type = PayloadValues::kFloat16;
    } else {
      d_floats.push_back(std::make_unique<DeviceArray<float>>(p.values));
      payload.values = d_floats.back()->get();
    }
    payloads.push_back(payload);
  }
  auto ws = MustCreate(n, 0);
  ASSERT_NE(ws, nullptr);
  for (double divisor : {1.0, static_cast<double>(std::max(count, 1)), 3.0}) {
    std::vector<float> want(static_cast<size_t>(n), 0.0f);
    for (const HostPayload& p : host) {
      for (size_t j = 0; j < p.indices.size(); ++j)
        want[static_cast<size_t>(p.indices[j])] += p.values[j];
    }
    if (divisor != 1.0) {
      for (float& v : want) v /= static_cast<float>(divisor);
    }
    DeviceArray<float> dense(std::vector<float>(static_cast<size_t>(n), 123.0f));  // overwritten
    ASSERT_TRUE(ScatterAddAverage(payloads, dense.get(), n, divisor, *ws, stream_).ok());
    auto finished = ws->Finish(stream_);
    ASSERT_TRUE(finished.ok()) << finished.status().ToString();
    const std::vector<float> got = dense.Download();
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_TRUE(SameBits(got[i], want[i])) << "element " << i << ": " << got[i] << " vs "
                                             << want[i] << " (divisor " << divisor << ")";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sweep, ScatterSweep,
                         ::testing::Combine(::testing::Values<int64_t>(1, 1000, 8192, 100003),
                                            ::testing::Values(0, 1, 3, 16, 40),
                                            ::testing::Values(0, 1, 2)),
                         ScatterName);

TEST_F(CudaTest, ScatterAddReportsInvalidPayloadsWithoutWritingOutOfBounds) {
  const int64_t n = 20000;
  auto ws = MustCreate(n, 0);
  ASSERT_NE(ws, nullptr);
  DeviceArray<float> dense(static_cast<size_t>(n));
  const std::vector<std::vector<int32_t>> bad = {
      {5, 3, 9},          // out of order
      {1, 2, 2},          // repeated
      {0, 19999, 20000},  // past the end
      {-1, 4},            // negative
  };
  for (const auto& indices : bad) {
    DeviceArray<int32_t> di(indices);
    DeviceArray<float> dv(std::vector<float>(indices.size(), 1.0f));
    const DevicePayload payload{di.get(), dv.get(), static_cast<int64_t>(indices.size()),
                                PayloadValues::kFloat32};
    ASSERT_TRUE(ScatterAddAverage({&payload, 1}, dense.get(), n, 2.0, *ws, stream_).ok());
    auto finished = ws->Finish(stream_);
    EXPECT_EQ(finished.status().code(), StatusCode::kInvalidArgument);
  }
  // Argument checks.
  EXPECT_EQ(ScatterAddAverage({}, dense.get(), n, 0.0, *ws, stream_).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ScatterAddAverage({}, dense.get(), n + 1, 1.0, *ws, stream_).code(),
            StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace sparsync::kernels::cuda
