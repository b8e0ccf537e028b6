#include "daemon/common/thread_name.h"

#include <pthread.h>

#include <string>

namespace sparsync {

void NameThisThread(std::string_view name) {
  constexpr size_t kMax = 15;  // the kernel's limit, without the terminating NUL
  const std::string cut(name.substr(0, kMax));
  pthread_setname_np(pthread_self(), cut.c_str());  // fails only for a name over the limit
}

}  // namespace sparsync
