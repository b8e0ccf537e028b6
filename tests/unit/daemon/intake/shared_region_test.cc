// Shared regions and the budget that bounds what the workers of a node may register (issue 16,
// D10: one worker with the token registered 1 TiB regions until the daemon's address space ran
// out).
#include "daemon/intake/shared_region.h"

#include <gtest/gtest.h>
#include <unistd.h>

namespace sparsync::intake {
namespace {

const uint64_t kPage = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));

TEST(RegionBudgetTest, RegionsHoldTheirMappedBytesUntilTheyGo) {
  auto budget = std::make_shared<RegionBudget>(4 * kPage);
  auto a = SharedRegion::Create("a", 1, budget);  // one byte maps a page
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(budget->used(), kPage);
  auto b = SharedRegion::Create("b", 3 * kPage, budget);
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_EQ(budget->used(), 4 * kPage);
  auto c = SharedRegion::Create("c", 1, budget);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("tensor 'c'"), std::string::npos) << c.status().message();
  EXPECT_NE(c.status().message().find("SPARSYNC_MAX_REGISTERED_BYTES"), std::string::npos);
  b = Status(Internal("dropped"));  // the region goes, its bytes come back
  EXPECT_EQ(budget->used(), kPage);
  EXPECT_TRUE(SharedRegion::Create("c", 1, budget).ok());
}

TEST(RegionBudgetTest, ATebibyteIsRefusedWithoutMappingIt) {
  auto budget = std::make_shared<RegionBudget>(0);  // the machine's memory
  EXPECT_GT(budget->limit(), 0u);
  for (int i = 0; i < 200; ++i) {  // before the fix the 128th mmap failed
    auto huge = SharedRegion::Create("huge", size_t{1} << 40, budget);
    ASSERT_FALSE(huge.ok());
    EXPECT_EQ(huge.status().code(), StatusCode::kUnavailable);
  }
  EXPECT_EQ(budget->used(), 0u);
}

TEST(RegionBudgetTest, WithoutABudgetNothingIsCounted) {
  auto region = SharedRegion::Create("free", 100);
  ASSERT_TRUE(region.ok());
  EXPECT_EQ((*region)->size(), 100u);
}

}  // namespace
}  // namespace sparsync::intake
