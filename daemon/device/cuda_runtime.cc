#include "daemon/device/cuda_runtime.h"

#include <dlfcn.h>

#include <vector>

#include "daemon/device/bind_symbol.h"

namespace sparsync::device {
namespace {

// cudaGetDriverEntryPointByVersion (CUDA >= 12.5) and cudaGetDriverEntryPoint (12.0 .. 12.x).
using EntryPointByVersionFn = CudaError (*)(const char* symbol, void** fn, unsigned version,
                                            unsigned long long flags, int* query_result);
using EntryPointFn = CudaError (*)(const char* symbol, void** fn, unsigned long long flags,
                                   int* query_result);

// The driver's cuMemGetAddressRange, through the runtime (libcuda itself is never opened here).
void BindAddressRange(void* handle, CudaRuntime* rt) {
  void* fn = nullptr;
  int query = 0;
  constexpr unsigned kDriverAbi = 12000;  // cuMemGetAddressRange_v2, as in CUDA 12.0
  if (auto by_version = reinterpret_cast<EntryPointByVersionFn>(
          dlsym(handle, "cudaGetDriverEntryPointByVersion"))) {
    if (by_version("cuMemGetAddressRange", &fn, kDriverAbi, kCudaEnableDefault, &query) !=
            kCudaSuccess ||
        query != 0) {
      fn = nullptr;
    }
  } else if (auto plain =
                 reinterpret_cast<EntryPointFn>(dlsym(handle, "cudaGetDriverEntryPoint"))) {
    if (plain("cuMemGetAddressRange", &fn, kCudaEnableDefault, &query) != kCudaSuccess ||
        query != 0) {
      fn = nullptr;
    }
  }
  rt->MemGetAddressRange = reinterpret_cast<decltype(rt->MemGetAddressRange)>(fn);
}

std::shared_ptr<const CudaRuntime> FromHandle(void* handle, const std::string& library,
                                              std::string* error) {
  auto rt = std::make_shared<CudaRuntime>();
  rt->library = library;
  std::string missing;
  bool ok = BindSymbol(handle, "cudaSetDevice", &rt->SetDevice, &missing) &&
            BindSymbol(handle, "cudaGetDeviceCount", &rt->GetDeviceCount, &missing) &&
            BindSymbol(handle, "cudaGetDevice", &rt->GetDevice, &missing) &&
            BindSymbol(handle, "cudaGetLastError", &rt->GetLastError, &missing) &&
            BindSymbol(handle, "cudaIpcGetMemHandle", &rt->IpcGetMemHandle, &missing) &&
            BindSymbol(handle, "cudaIpcOpenMemHandle", &rt->IpcOpenMemHandle, &missing) &&
            BindSymbol(handle, "cudaIpcCloseMemHandle", &rt->IpcCloseMemHandle, &missing) &&
            BindSymbol(handle, "cudaEventCreateWithFlags", &rt->EventCreateWithFlags, &missing) &&
            BindSymbol(handle, "cudaEventDestroy", &rt->EventDestroy, &missing) &&
            BindSymbol(handle, "cudaIpcGetEventHandle", &rt->IpcGetEventHandle, &missing) &&
            BindSymbol(handle, "cudaIpcOpenEventHandle", &rt->IpcOpenEventHandle, &missing) &&
            BindSymbol(handle, "cudaEventRecord", &rt->EventRecord, &missing) &&
            BindSymbol(handle, "cudaEventSynchronize", &rt->EventSynchronize, &missing) &&
            BindSymbol(handle, "cudaStreamCreateWithFlags", &rt->StreamCreateWithFlags, &missing) &&
            BindSymbol(handle, "cudaStreamDestroy", &rt->StreamDestroy, &missing) &&
            BindSymbol(handle, "cudaStreamWaitEvent", &rt->StreamWaitEvent, &missing) &&
            BindSymbol(handle, "cudaStreamSynchronize", &rt->StreamSynchronize, &missing) &&
            BindSymbol(handle, "cudaStreamQuery", &rt->StreamQuery, &missing) &&
            BindSymbol(handle, "cudaMemcpyAsync", &rt->MemcpyAsync, &missing) &&
            BindSymbol(handle, "cudaMalloc", &rt->Malloc, &missing) &&
            BindSymbol(handle, "cudaFree", &rt->Free, &missing) &&
            BindSymbol(handle, "cudaMemsetAsync", &rt->MemsetAsync, &missing) &&
            BindSymbol(handle, "cudaHostRegister", &rt->HostRegister, &missing) &&
            BindSymbol(handle, "cudaHostUnregister", &rt->HostUnregister, &missing) &&
            BindSymbol(handle, "cudaMallocHost", &rt->MallocHost, &missing) &&
            BindSymbol(handle, "cudaFreeHost", &rt->FreeHost, &missing) &&
            BindSymbol(handle, "cudaGetErrorName", &rt->GetErrorName, &missing) &&
            BindSymbol(handle, "cudaGetErrorString", &rt->GetErrorString, &missing);
  if (!ok) {
    *error = library + " is not a usable CUDA runtime: it lacks " + missing;
    return nullptr;
  }
  BindAddressRange(handle, rt.get());
  return rt;
}

}  // namespace

std::string CudaRuntime::Describe(CudaError error, const std::string& what) const {
  const char* name = GetErrorName ? GetErrorName(error) : nullptr;
  const char* text = GetErrorString ? GetErrorString(error) : nullptr;
  return what + ": " + (name ? name : "CUDA error " + std::to_string(error)) + " (" +
         (text ? text : "no description") + ")";
}

std::shared_ptr<const CudaRuntime> LoadCudaRuntime(const std::string& explicit_path,
                                                   std::string* error) {
  std::vector<std::string> names;
  if (!explicit_path.empty()) {
    names.push_back(explicit_path);
  } else {
    names = {"libcudart.so.13", "libcudart.so.12", "libcudart.so"};
  }
  // A runtime already in the process first (RTLD_NOLOAD loads nothing): PyTorch's, for one.
  for (const std::string& name : names) {
    if (void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD)) {
      return FromHandle(handle, name, error);
    }
  }
  std::string tried;
  for (const std::string& name : names) {
    if (void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      return FromHandle(handle, name, error);
    }
    const char* why = dlerror();
    tried += (tried.empty() ? "" : "; ") + std::string(why ? why : name + ": not found");
  }
  *error = "no CUDA runtime could be loaded (" + tried + ")" +
           (explicit_path.empty() ? "; install CUDA 12 or 13, or point SPARSYNC_CUDART at "
                                    "libcudart.so"
                                  : "; SPARSYNC_CUDART names a file that cannot be loaded");
  return nullptr;
}

}  // namespace sparsync::device
