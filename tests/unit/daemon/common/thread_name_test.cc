#include "daemon/common/thread_name.h"

#include <gtest/gtest.h>
#include <pthread.h>

#include <string>
#include <thread>

namespace sparsync {
namespace {

std::string NameOfThisThread() {
  char name[16] = {};
  pthread_getname_np(pthread_self(), name, sizeof(name));
  return name;
}

// The name a new thread has after NameThisThread(name).
std::string NamedInANewThread(const std::string& name) {
  std::string inside;
  std::thread t([&] {
    NameThisThread(name);
    inside = NameOfThisThread();
  });
  t.join();
  return inside;
}

TEST(ThreadNameTest, NamesTheCallingThreadOnly) {
  const std::string before = NameOfThisThread();
  EXPECT_EQ(NamedInANewThread("ssd-test"), "ssd-test");
  EXPECT_EQ(NameOfThisThread(), before);
}

TEST(ThreadNameTest, CutsANameToTheKernelsFifteenCharacters) {
  EXPECT_EQ(NamedInANewThread("ssd-a-name-longer-than-fifteen"), "ssd-a-name-long");
}

}  // namespace
}  // namespace sparsync
