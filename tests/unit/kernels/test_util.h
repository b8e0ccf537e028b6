#pragma once
// Helpers shared by the kernels tests: data generators and a one-call Sparsify wrapper.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/sparsifier.h"

namespace sparsync::kernels::testing {

enum class DataKind { kNormal, kHeavyTailed, kTies, kSignedZeros, kDenormals };

inline const char* DataKindName(DataKind kind) {
  switch (kind) {
    case DataKind::kNormal: return "normal";
    case DataKind::kHeavyTailed: return "heavytailed";
    case DataKind::kTies: return "ties";
    case DataKind::kSignedZeros: return "signedzeros";
    case DataKind::kDenormals: return "denormals";
  }
  return "?";
}

inline std::vector<float> MakeData(DataKind kind, int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::student_t_distribution<float> student(1.5f);
  std::uniform_int_distribution<int> level(-3, 3);
  std::uniform_int_distribution<int> coin(0, 9);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) {
    switch (kind) {
      case DataKind::kNormal: v = normal(rng); break;
      case DataKind::kHeavyTailed: v = student(rng); break;
      case DataKind::kTies: v = 0.5f * static_cast<float>(level(rng)); break;
      case DataKind::kSignedZeros:  // mostly +-0 with a few values
        v = coin(rng) == 0 ? normal(rng) : (coin(rng) < 5 ? 0.0f : -0.0f);
        break;
      case DataKind::kDenormals:  // subnormal magnitudes only, both signs, some ties
        v = std::numeric_limits<float>::denorm_min() *
            static_cast<float>(static_cast<int>(rng() % 1000) - 500);
        break;
    }
  }
  return x;
}

struct Selection {
  Status status;
  std::vector<int32_t> indices;
  std::vector<float> values;
};

inline std::unique_ptr<Sparsifier> MustMake(const std::string& name,
                                            const SparsifierOptions& options) {
  auto made = MakeSparsifier(name, options);
  EXPECT_TRUE(made.ok()) << made.status().ToString();
  return made.ok() ? std::move(made).value() : nullptr;
}

// Prepares for x.size() elements of `dtype` and sparsifies raw data of that dtype.
inline Selection ApplyRaw(Sparsifier& s, const void* data, int64_t n, DType dtype,
                        const SparsifyContext& context = {}) {
  Selection result;
  result.status = s.Prepare(n, dtype);
  if (!result.status.ok()) return result;
  const int64_t cap = s.MaxSelected(n);
  result.indices.assign(static_cast<size_t>(cap), -1);
  result.values.assign(static_cast<size_t>(cap), 0.0f);
  SparseView out{result.indices.data(), result.values.data(), cap, -1};
  result.status = s.Sparsify(DenseView{data, n, dtype}, &out, context);
  result.indices.resize(static_cast<size_t>(std::max<int64_t>(out.k, 0)));
  result.values.resize(static_cast<size_t>(std::max<int64_t>(out.k, 0)));
  return result;
}

inline Selection Apply(Sparsifier& s, const std::vector<float>& x,
                     const SparsifyContext& context = {}) {
  return ApplyRaw(s, x.data(), static_cast<int64_t>(x.size()), DType::kFloat32, context);
}

inline bool SameBits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Same indices and bit-identical values.
inline void ExpectSameSelection(const Selection& a, const Selection& b) {
  ASSERT_TRUE(a.status.ok()) << a.status.ToString();
  ASSERT_TRUE(b.status.ok()) << b.status.ToString();
  ASSERT_EQ(a.indices.size(), b.indices.size());
  for (size_t j = 0; j < a.indices.size(); ++j) {
    ASSERT_EQ(a.indices[j], b.indices[j]) << "at position " << j;
    ASSERT_TRUE(SameBits(a.values[j], b.values[j]))
        << "at position " << j << ": " << a.values[j] << " vs " << b.values[j];
  }
}

inline void ExpectStrictlyAscending(const std::vector<int32_t>& indices) {
  for (size_t j = 1; j < indices.size(); ++j) {
    ASSERT_LT(indices[j - 1], indices[j]) << "at position " << j;
  }
}

}  // namespace sparsync::kernels::testing
