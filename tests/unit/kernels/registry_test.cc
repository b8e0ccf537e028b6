// The sparsifier registry (kernels/registry.cc, declared in sparsifier.h): which names it
// accepts, that each name makes the algorithm it names (fast CPU and reference oracle paired),
// that options reach the sparsifier and are checked for the right names, and the errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <set>

#include "kernels/dgc_state.h"
#include "kernels/sparsifier.h"
#include "tests/unit/kernels/test_util.h"

namespace sparsync::kernels {
namespace {

using testing::Apply;
using testing::MustMake;

const std::vector<std::string> kBase = {"topk",      "randomk", "threshold",
                                        "gaussiank", "wangni",  "dgc"};

// -n/2 .. n/2, shuffled: distinct magnitudes but for the sign, so top-k has one answer.
std::vector<float> Ramp(int64_t n) {
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] = static_cast<float>(i - n / 2) + 0.25f;
  std::mt19937_64 rng(5);
  std::shuffle(x.begin(), x.end(), rng);
  return x;
}

TEST(RegistryTest, AcceptsTheSixAlgorithmsAndTheirReferenceOracles) {
  std::vector<std::string> expected = kBase;
  for (const auto& b : kBase) expected.push_back("reference:" + b);
  EXPECT_EQ(SparsifierNames(), expected);
}

TEST(RegistryTest, EachNameMakesASparsifierReportingThatName) {
  for (const std::string& name : SparsifierNames()) {
    auto s = MakeSparsifier(name, SparsifierOptions{});
    ASSERT_TRUE(s.ok()) << name << ": " << s.status().ToString();
    EXPECT_EQ((*s)->name(), name);
    // Two makes give two independent instances (each owns its scratch).
    auto again = MakeSparsifier(name, SparsifierOptions{});
    ASSERT_TRUE(again.ok());
    EXPECT_NE(again->get(), s->get());
  }
}

// The fast implementation and the oracle behind one base name are the same algorithm: on the same
// input and seeds they select the same coordinates (values may differ in the last bits: Wangni).
TEST(RegistryTest, EachFastSparsifierIsPairedWithItsOwnOracle) {
  const std::vector<float> x = testing::MakeData(testing::DataKind::kHeavyTailed, 4000, 11);
  SparsifierOptions o;
  o.density = 0.01;
  o.warmup = false;
  for (const std::string& base : kBase) {
    SCOPED_TRACE(base);
    SparsifyContext ctx;
    ctx.seed = 77;
    ctx.shared_seed = 78;
    DgcState fast_state, ref_state;
    fast_state.Reset(static_cast<int64_t>(x.size()));
    ref_state.Reset(static_cast<int64_t>(x.size()));
    ctx.dgc_state = &fast_state;
    auto fast = Apply(*MustMake(base, o), x, ctx);
    ctx.dgc_state = &ref_state;
    auto ref = Apply(*MustMake("reference:" + base, o), x, ctx);
    ASSERT_TRUE(fast.status.ok()) << fast.status.ToString();
    ASSERT_TRUE(ref.status.ok()) << ref.status.ToString();
    EXPECT_FALSE(fast.indices.empty());
    EXPECT_EQ(fast.indices, ref.indices);
  }
}

// What the names promise, told apart on one input: topk sends the k largest magnitudes, threshold
// (fixed tau) everything above tau, randomk k coordinates that move with the seed.
TEST(RegistryTest, NamesMakeTheAlgorithmTheyName) {
  const std::vector<float> x = Ramp(1000);
  for (const std::string prefix : {"", "reference:"}) {
    SCOPED_TRACE(prefix);
    SparsifierOptions o;
    o.k = 10;
    auto top = Apply(*MustMake(prefix + "topk", o), x);
    ASSERT_TRUE(top.status.ok());
    std::set<float> magnitudes;
    for (float v : top.values) magnitudes.insert(std::fabs(v));
    ASSERT_EQ(magnitudes.size(), 10u);
    EXPECT_EQ(*magnitudes.begin(), 495.25f) << "|x| of the 10th largest of -499.75 .. 499.25";

    SparsifierOptions t;
    t.threshold = 490.0;
    auto above = Apply(*MustMake(prefix + "threshold", t), x);
    ASSERT_TRUE(above.status.ok());
    EXPECT_EQ(above.indices.size(), 20u) << "|x| > 490: 490.25 .. 499.25 and -490.75 .. -499.75";
    for (float v : above.values) EXPECT_GT(std::fabs(v), 490.0f);

    SparsifyContext seed_a, seed_b;
    seed_a.seed = 1;
    seed_b.seed = 2;
    auto random_a = Apply(*MustMake(prefix + "randomk", o), x, seed_a);
    auto random_b = Apply(*MustMake(prefix + "randomk", o), x, seed_b);
    ASSERT_TRUE(random_a.status.ok() && random_b.status.ok());
    EXPECT_EQ(random_a.indices.size(), 10u);
    EXPECT_NE(random_a.indices, random_b.indices) << "random-k ignores its seed";
    EXPECT_NE(random_a.indices, top.indices) << "random-k picked exactly the top 10";
  }
}

// The registry hands options through: k overrides density, and density sets k.
TEST(RegistryTest, OptionsReachTheSparsifier) {
  const std::vector<float> x = Ramp(2000);
  for (const std::string name : {"topk", "randomk", "reference:topk"}) {
    SparsifierOptions o;
    o.density = 0.01;
    EXPECT_EQ(Apply(*MustMake(name, o), x).indices.size(), 20u) << name;
    o.k = 7;
    EXPECT_EQ(Apply(*MustMake(name, o), x).indices.size(), 7u) << name;
    EXPECT_GE(MustMake(name, o)->MaxSelected(2000), 7);
  }
}

TEST(RegistryTest, UnknownNamesAreRefusedListingEveryAcceptedName) {
  std::string all;
  for (const auto& n : SparsifierNames()) all += (all.empty() ? "" : ", ") + n;
  for (const char* name : {"top-k", "TopK", " topk", "topk ", "", "reference:", "reference:top-k",
                           "reference:reference:topk", "cpu:topk", "reference"}) {
    SparsifierOptions bad;
    bad.density = -1;  // an unknown name is reported as such, whatever the options
    auto s = MakeSparsifier(name, bad);
    ASSERT_FALSE(s.ok()) << "'" << name << "' was accepted";
    EXPECT_EQ(s.status().code(), StatusCode::kNotFound) << name;
    EXPECT_EQ(s.status().message(),
              "unknown sparsifier '" + std::string(name) + "'; accepted names: " + all);
  }
}

// Options every sparsifier uses are checked for each of the twelve names; an option of one
// algorithm is checked for that algorithm (and its oracle) only. Each error names the sparsifier
// and the option.
TEST(RegistryTest, OptionsAreCheckedForTheNamesThatUseThem) {
  struct Bad {
    std::string option;
    std::function<void(SparsifierOptions&)> set;
    std::set<std::string> checked_by;  // base names; empty: every one
  };
  const std::vector<Bad> bad = {
      {"density", [](auto& o) { o.density = 0; }, {}},
      {"density", [](auto& o) { o.density = 1.5; }, {}},
      {"density", [](auto& o) { o.density = NAN; }, {}},
      {"k", [](auto& o) { o.k = -1; }, {}},
      {"threshold", [](auto& o) { o.threshold = INFINITY; }, {"threshold"}},
      {"sample_fraction", [](auto& o) { o.sample_fraction = 0; }, {"threshold"}},
      {"min_sample_size", [](auto& o) { o.min_sample_size = 0; }, {"threshold"}},
      {"variance_budget", [](auto& o) { o.variance_budget = -1; }, {"wangni"}},
      {"max_greedy_iterations", [](auto& o) { o.max_greedy_iterations = -1; }, {"wangni"}},
      {"momentum", [](auto& o) { o.momentum = 1.0; }, {"dgc"}},
      {"clip_norm", [](auto& o) { o.clip_norm = -2; }, {"dgc"}},
  };
  for (const Bad& b : bad) {
    SparsifierOptions o;
    b.set(o);
    for (const std::string& base : kBase) {
      for (const std::string& name : {base, "reference:" + base}) {
        auto s = MakeSparsifier(name, o);
        if (!b.checked_by.empty() && !b.checked_by.count(base)) {
          EXPECT_TRUE(s.ok()) << name << " checked " << b.option << ": " << s.status().ToString();
          continue;
        }
        ASSERT_FALSE(s.ok()) << name << " accepted a bad " << b.option;
        EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << name;
        const std::string& msg = s.status().message();
        EXPECT_EQ(msg.rfind("sparsifier '" + base + "': " + b.option, 0), 0u) << msg;
      }
    }
  }
  // The edges that are allowed.
  SparsifierOptions edge;
  edge.density = 1.0;
  edge.momentum = 0.0;
  edge.variance_budget = 0.0;
  edge.max_greedy_iterations = 0;
  for (const std::string& name : SparsifierNames()) {
    EXPECT_TRUE(MakeSparsifier(name, edge).ok()) << name;
  }
}

}  // namespace
}  // namespace sparsync::kernels
