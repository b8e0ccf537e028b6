// CPU Wangni sparsification (Wangni, Wang, Liu, Zhang, NeurIPS 2018); the algorithm and the
// sampling rule are those of reference/wangni.cc.
//
// Greedy mode without a probability array: every pass of the greedy algorithm maps p_i to
// min(c p_i, 1), and p_i starts as min(a |g_i|, 1), so after any number of passes
// p_i = min(lambda |g_i|, 1) with lambda = a * c_1 * c_2 * ... . A pass therefore needs only
// |I| = #{lambda |g_i| < 1} and sum_I p_i = lambda * sum_{I} |g_i|: one streaming reduction over g.
// The reference multiplies p_i pass by pass instead, so p_i may differ in the last bit of a
// double; the chosen set agrees unless a uniform draw falls within that bit of p_i.
// Variance-budget mode sorts a prepared copy of |g| (O(d log d); not the default mode).
// The Bernoulli draw for coordinate i is counter i of kWangniBernoulli under context.seed.

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/cpu_sparsifier.h"
#include "kernels/cpu/scan.h"
#include "kernels/random.h"

namespace sparsync::kernels::cpu {
namespace {

// Count and sum of |g_i| over {i : lambda |g_i| < 1}, in double with interleaved lanes.
void SumBelow(const float* g, int64_t n, double lambda, double* count, double* sum) {
  constexpr int kLanes = 8;
  double c[kLanes] = {}, s[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      const double a = std::fabs(static_cast<double>(g[i + j]));
      const bool in = lambda * a < 1.0;
      c[j] += in ? 1.0 : 0.0;
      s[j] += in ? a : 0.0;
    }
  }
  double cc = 0, ss = 0;
  for (int j = 0; j < kLanes; ++j) {
    cc += c[j];
    ss += s[j];
  }
  for (; i < n; ++i) {
    const double a = std::fabs(static_cast<double>(g[i]));
    if (lambda * a < 1.0) {
      cc += 1;
      ss += a;
    }
  }
  *count = cc;
  *sum = ss;
}

class Wangni final : public CpuSparsifier {
 public:
  explicit Wangni(const SparsifierOptions& o) : CpuSparsifier("wangni", o) {}
  int64_t MaxSelected(int64_t numel) const override { return numel; }

 protected:
  void PrepareScratch(int64_t max_numel) override {
    if (options().variance_budget > 0) sorted_.resize(static_cast<size_t>(max_numel));
  }

  Status Run(const float* g, int64_t n, SparseView* out,
             const SparsifyContext& context) override {
    const double l1 = SumAbsAsDouble(g, n);
    if (!std::isfinite(l1)) {
      const int64_t bad = FindNonFinite(g, n);
      return NonFiniteError(bad, g[bad]);
    }
    if (l1 == 0) return Status::Ok();
    const double lambda = options().variance_budget > 0 ? VarianceBudgetLambda(g, n)
                                                        : GreedyLambda(g, n, l1);
    int64_t k = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double a = std::fabs(static_cast<double>(g[i]));
      if (a == 0) continue;
      const double p = lambda * a;
      if (p >= 1.0) {
        out->indices[k] = static_cast<int32_t>(i);
        out->values[k] = g[i];
        ++k;
      } else if (RandomUnit(context.seed, RandomStream::kWangniBernoulli,
                            static_cast<uint64_t>(i)) < p) {
        out->indices[k] = static_cast<int32_t>(i);
        out->values[k] = static_cast<float>(static_cast<double>(g[i]) / p);
        ++k;
      }
    }
    out->k = k;
    return Status::Ok();
  }

 private:
  double GreedyLambda(const float* g, int64_t n, double l1) const {
    const double d = static_cast<double>(n);
    const double kappa = options().density;
    double lambda = kappa * d / l1;
    for (int pass = 0; pass < options().max_greedy_iterations; ++pass) {
      double in_count, in_abs;
      SumBelow(g, n, lambda, &in_count, &in_abs);
      const double in_sum = lambda * in_abs;
      if (in_sum == 0) break;
      const double c = (kappa * d - d + in_count) / in_sum;
      if (c <= 1.0) break;
      lambda *= c;
    }
    return lambda;
  }

  double VarianceBudgetLambda(const float* g, int64_t n) {
    float* a = sorted_.data();
    for (int64_t i = 0; i < n; ++i) a[i] = std::fabs(g[i]);
    std::sort(a, a + n, std::greater<float>());
    double s_tail = 0, q_tail = 0;
    for (int64_t i = 0; i < n; ++i) {
      s_tail += a[i];
      q_tail += static_cast<double>(a[i]) * a[i];
    }
    const double total_sq = q_tail, eps = options().variance_budget;
    int64_t k = 0;
    while (k < n && a[k] * s_tail > eps * total_sq + q_tail) {
      s_tail -= a[k];
      q_tail -= static_cast<double>(a[k]) * a[k];
      ++k;
    }
    const double denom = eps * total_sq + q_tail;
    if (k == n || s_tail <= 0 || denom <= 0) return std::numeric_limits<double>::infinity();
    return s_tail / denom;
  }

  std::vector<float> sorted_;
};

}  // namespace

std::unique_ptr<Sparsifier> MakeWangni(const SparsifierOptions& options) {
  return std::make_unique<Wangni>(options);
}

}  // namespace sparsync::kernels::cpu
