// Reference Wangni sparsification: unbiased, variance-optimal probabilities.
//
// Wangni, Wang, Liu, Zhang, "Gradient Sparsification for Communication-Efficient Distributed
// Optimization", NeurIPS 2018 (arXiv 1710.09854). Keep coordinate i with probability p_i and send
// g_i / p_i: E[Q(g)] = g, E||Q(g)||^2 = sum g_i^2 / p_i, E nnz = sum p_i. The optimum has the
// form p_i = min(lambda |g_i|, 1).
//
// Greedy algorithm (Algorithm 2 of the paper) for an expected density kappa:
//   p_i = min(kappa d |g_i| / sum|g|, 1); then repeat up to max_passes:
//   I = {i : p_i < 1}; c = (kappa d - d + |I|) / sum_{I} p_i; stop if c <= 1; p_i = min(c p_i, 1).
// Closed form (variance budget eps, §3 of the paper): sort |g| descending, take the smallest k with
//   |g_(k+1)| sum_{i>k}|g_(i)| <= eps ||g||^2 + sum_{i>k} g_(i)^2,
//   lambda = sum_{i>k}|g_(i)| / (eps ||g||^2 + sum_{i>k} g_(i)^2), p_i = min(lambda |g_i|, 1)
// (this gives p = 1 exactly on the top k, and sum g^2/p = (1 + eps)||g||^2).
// Sampling: Z_i = [u_i < p_i] with u_i from counter i of the kWangniBernoulli stream under
// context.seed; coordinates with p_i = 1 are always sent, p_i = 0 never.

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "kernels/random.h"
#include "kernels/reference/reference.h"
#include "kernels/reference/reference_sparsifier.h"

namespace sparsync::kernels::reference {

std::vector<double> WangniGreedyProbabilities(const std::vector<float>& g, double kappa,
                                              int max_passes, int* passes) {
  const double d = static_cast<double>(g.size());
  std::vector<double> p(g.size(), 0.0);
  double l1 = 0;
  for (float v : g) l1 += std::fabs(static_cast<double>(v));
  if (passes) *passes = 0;
  if (l1 == 0) return p;
  for (size_t i = 0; i < g.size(); ++i) {
    p[i] = std::min(kappa * d * std::fabs(static_cast<double>(g[i])) / l1, 1.0);
  }
  for (int pass = 0; pass < max_passes; ++pass) {
    double in_count = 0, in_sum = 0;
    for (double pi : p) {
      if (pi < 1.0) {
        in_count += 1;
        in_sum += pi;
      }
    }
    if (in_sum == 0) break;
    const double c = (kappa * d - d + in_count) / in_sum;
    if (c <= 1.0) break;
    for (double& pi : p) {
      if (pi < 1.0) pi = std::min(c * pi, 1.0);
    }
    if (passes) *passes = pass + 1;
  }
  return p;
}

std::vector<double> WangniVarianceBudgetProbabilities(const std::vector<float>& g, double eps) {
  std::vector<double> a;
  for (float v : g) a.push_back(std::fabs(static_cast<double>(v)));
  std::sort(a.begin(), a.end(), std::greater<double>());
  double s_tail = 0, q_tail = 0;
  for (double v : a) {
    s_tail += v;
    q_tail += v * v;
  }
  const double total_sq = q_tail;
  // Walk k = 0, 1, ...: tails exclude the top k.
  size_t k = 0;
  while (k < a.size() && a[k] * s_tail > eps * total_sq + q_tail) {
    s_tail -= a[k];
    q_tail -= a[k] * a[k];
    ++k;
  }
  const double denom = eps * total_sq + q_tail;
  const double lambda = (k == a.size() || s_tail <= 0 || denom <= 0)
                            ? std::numeric_limits<double>::infinity()
                            : s_tail / denom;
  std::vector<double> p(g.size());
  for (size_t i = 0; i < g.size(); ++i) {
    const double m = std::fabs(static_cast<double>(g[i]));
    p[i] = m == 0 ? 0.0 : std::min(lambda * m, 1.0);
  }
  return p;
}

namespace {

class Wangni final : public ReferenceSparsifier {
 public:
  explicit Wangni(const SparsifierOptions& o) : ReferenceSparsifier("reference:wangni", o) {}
  int64_t MaxSelected(int64_t numel) const override { return numel; }

 protected:
  Status Select(const std::vector<float>& g, SparseView* out,
                const SparsifyContext& context) override {
    const std::vector<double> p =
        options().variance_budget > 0
            ? WangniVarianceBudgetProbabilities(g, options().variance_budget)
            : WangniGreedyProbabilities(g, options().density, options().max_greedy_iterations);
    int64_t k = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      bool keep = p[i] >= 1.0;
      if (!keep && p[i] > 0.0) {
        keep = RandomUnit(context.seed, RandomStream::kWangniBernoulli, i) < p[i];
      }
      if (!keep) continue;
      out->indices[k] = static_cast<int32_t>(i);
      out->values[k] = p[i] >= 1.0 ? g[i] : static_cast<float>(static_cast<double>(g[i]) / p[i]);
      ++k;
    }
    out->k = k;
    return Status::Ok();
  }
};

}  // namespace

std::unique_ptr<Sparsifier> MakeWangni(const SparsifierOptions& options) {
  return std::make_unique<Wangni>(options);
}

}  // namespace sparsync::kernels::reference
