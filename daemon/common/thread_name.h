// Names the calling thread, as `top -H`, `ps -L`, gdb and perf show it (Linux keeps 15
// characters; a longer name is cut). The daemon's threads are named "ssd-<role>", so an operator
// can tell stage A from stage B, and the emulated cluster (bench/cluster) can find a stage's
// thread in each daemon. Threads a library starts from a named thread inherit its name.
#pragma once

#include <string_view>

namespace sparsync {

void NameThisThread(std::string_view name);

}  // namespace sparsync
