#include "daemon/device/nccl_library.h"

#include <dlfcn.h>

#include "daemon/device/bind_symbol.h"

namespace sparsync::device {

std::shared_ptr<const NcclLibrary> LoadNccl(const std::string& explicit_path, std::string* error) {
  const std::string name = explicit_path.empty() ? "libnccl.so.2" : explicit_path;
  void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    *error = "cannot load NCCL (" + std::string(why ? why : name + ": not found") + ")";
    return nullptr;
  }
  auto lib = std::make_shared<NcclLibrary>();
  lib->library = name;
  std::string missing;
  bool ok = BindSymbol(handle, "ncclGetVersion", &lib->GetVersion, &missing) &&
            BindSymbol(handle, "ncclGetErrorString", &lib->GetErrorString, &missing) &&
            BindSymbol(handle, "ncclCommInitAll", &lib->CommInitAll, &missing) &&
            BindSymbol(handle, "ncclCommDestroy", &lib->CommDestroy, &missing) &&
            BindSymbol(handle, "ncclGroupStart", &lib->GroupStart, &missing) &&
            BindSymbol(handle, "ncclGroupEnd", &lib->GroupEnd, &missing) &&
            BindSymbol(handle, "ncclReduce", &lib->Reduce, &missing) &&
            BindSymbol(handle, "ncclBroadcast", &lib->Broadcast, &missing);
  if (!ok) {
    *error = name + " is not a usable NCCL: it lacks " + missing;
    return nullptr;
  }
  if (lib->GetVersion(&lib->version) != kNcclSuccess) lib->version = 0;
  return lib;
}

Status NcclStatus(const NcclLibrary& nccl, int result, const std::string& what) {
  if (result == kNcclSuccess) return Status::Ok();
  const char* text = nccl.GetErrorString(result);
  return Internal(what + ": " + (text ? text : "NCCL error") + " (" + std::to_string(result) +
                  ")");
}

}  // namespace sparsync::device
