#include "daemon/common/logging.h"

#include <gtest/gtest.h>

#include <thread>

namespace sparsync {
namespace {

// The first message goes through; repeats within the interval are held back and counted, and the
// next one after it says how many were.
TEST(LogLimiterTest, LetsOneThroughPerIntervalAndCountsTheRest) {
  LogLimiter limiter(std::chrono::milliseconds(200));
  uint64_t held = 99;
  EXPECT_TRUE(limiter.Allow(&held));
  EXPECT_EQ(held, 0u);
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(limiter.Allow(&held));
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  EXPECT_TRUE(limiter.Allow(&held));
  EXPECT_EQ(held, 5u);
  EXPECT_FALSE(limiter.Allow(&held));
}

}  // namespace
}  // namespace sparsync
