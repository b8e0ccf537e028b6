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

TEST(ThreadNameTest, NamesTheCallingThreadOnly) {
  const std::string before = NameOfThisThread();
  std::string inside;
  std::thread t([&] {
    NameThisThread("ssd-test");
    inside = NameOfThisThread();
  });
  t.join();
  EXPECT_EQ(inside, "ssd-test");
  EXPECT_EQ(NameOfThisThread(), before);
}

TEST(ThreadNameTest, CutsANameToTheKernelsFifteenCharacters) {
  std::string inside;
  std::thread t([&] {
    NameThisThread("ssd-a-name-longer-than-fifteen");
    inside = NameOfThisThread();
  });
  t.join();
  EXPECT_EQ(inside, "ssd-a-name-long");
}

}  // namespace
}  // namespace sparsync
