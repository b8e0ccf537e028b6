// BindSymbol: one dlsym of a library the daemon or the client loads at run time (the CUDA
// runtime, NCCL), typed, with the first missing symbol named for the error message.
#pragma once

#include <dlfcn.h>

#include <string>

namespace sparsync::device {

// Binds `*fn` to `symbol` of `handle`; false (and the symbol in *missing) when the library lacks
// it.
template <typename F>
bool BindSymbol(void* handle, const char* symbol, F* fn, std::string* missing) {
  *fn = reinterpret_cast<F>(dlsym(handle, symbol));
  if (*fn == nullptr) *missing = symbol;
  return *fn != nullptr;
}

}  // namespace sparsync::device
