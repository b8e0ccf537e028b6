// JobFailure's shutdown reason: how a daemon's stop is told apart from a failure, for any node.
#include "daemon/common/job_failure.h"

#include <gtest/gtest.h>

namespace sparsync {
namespace {

TEST(ShutdownReasonTest, IsRecognisedForItsNodeAndForAnyNode) {
  EXPECT_TRUE(IsShutdownReason(ShutdownReason(3), 3));
  EXPECT_FALSE(IsShutdownReason(ShutdownReason(3), 2));
  EXPECT_TRUE(IsShutdownReason(ShutdownReason(3)));
  EXPECT_TRUE(IsShutdownReason(ShutdownReason(12)));
}

TEST(ShutdownReasonTest, OtherErrorsAreNotIt) {
  EXPECT_FALSE(IsShutdownReason(Status::Ok()));
  EXPECT_FALSE(IsShutdownReason(Internal("the daemon of node 1 is shutting down")));  // code
  EXPECT_FALSE(IsShutdownReason(Aborted("the daemon of node  is shutting down")));
  EXPECT_FALSE(IsShutdownReason(Aborted("the daemon of node x is shutting down")));
  EXPECT_FALSE(IsShutdownReason(Aborted("the daemon of node 1 is shutting down: tensor 'a'")));
  EXPECT_FALSE(IsShutdownReason(Aborted("Gloo allreduce on node 0 failed")));
}

}  // namespace
}  // namespace sparsync
