#include <gtest/gtest.h>

#include "kernels/sparsifier.h"

namespace sparsync::kernels {
namespace {

TEST(RegistryTest, EveryAdvertisedNameCanBeMade) {
  const auto names = SparsifierNames();
  ASSERT_EQ(names.size(), 12u);
  for (const std::string& name : names) {
    auto s = MakeSparsifier(name, SparsifierOptions{});
    ASSERT_TRUE(s.ok()) << name << ": " << s.status().ToString();
    EXPECT_EQ((*s)->name(), name);
  }
}

TEST(RegistryTest, UnknownNameListsAcceptedNames) {
  auto s = MakeSparsifier("top-k", SparsifierOptions{});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kNotFound);
  const std::string& msg = s.status().message();
  EXPECT_NE(msg.find("'top-k'"), std::string::npos);
  for (const char* n : {"topk", "randomk", "threshold", "gaussiank", "wangni", "dgc",
                        "reference:topk"}) {
    EXPECT_NE(msg.find(n), std::string::npos) << msg;
  }
}

TEST(RegistryTest, InvalidOptionsAreRejected) {
  SparsifierOptions o;
  o.density = 0;
  EXPECT_EQ(MakeSparsifier("topk", o).status().code(), StatusCode::kInvalidArgument);
  o.density = 1.5;
  EXPECT_EQ(MakeSparsifier("randomk", o).status().code(), StatusCode::kInvalidArgument);
  o = {};
  o.momentum = 1.0;
  auto bad = MakeSparsifier("dgc", o);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("momentum"), std::string::npos);
  o = {};
  o.variance_budget = -1;
  EXPECT_FALSE(MakeSparsifier("reference:wangni", o).ok());
}

}  // namespace
}  // namespace sparsync::kernels
