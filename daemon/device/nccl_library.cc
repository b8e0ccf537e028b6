#include "daemon/device/nccl_library.h"

#include <dlfcn.h>

#include <iterator>

#include "daemon/device/bind_symbol.h"

namespace sparsync::device {
namespace {

// ncclResult_t's names, by value.
constexpr const char* kResultNames[] = {
    "ncclSuccess",         "ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError",
    "ncclInvalidArgument", "ncclInvalidUsage",       "ncclRemoteError", "ncclInProgress"};

bool BindAll(void* handle, NcclLibrary* lib, std::string* missing) {
  return BindSymbol(handle, "ncclGetVersion", &lib->GetVersion, missing) &&
         BindSymbol(handle, "ncclGetErrorString", &lib->GetErrorString, missing) &&
         BindSymbol(handle, "ncclGetLastError", &lib->GetLastError, missing) &&
         BindSymbol(handle, "ncclGetUniqueId", &lib->GetUniqueId, missing) &&
         BindSymbol(handle, "ncclCommInitAll", &lib->CommInitAll, missing) &&
         BindSymbol(handle, "ncclCommInitRankConfig", &lib->CommInitRankConfig, missing) &&
         BindSymbol(handle, "ncclCommGetAsyncError", &lib->CommGetAsyncError, missing) &&
         BindSymbol(handle, "ncclCommFinalize", &lib->CommFinalize, missing) &&
         BindSymbol(handle, "ncclCommDestroy", &lib->CommDestroy, missing) &&
         BindSymbol(handle, "ncclCommAbort", &lib->CommAbort, missing) &&
         BindSymbol(handle, "ncclGroupStart", &lib->GroupStart, missing) &&
         BindSymbol(handle, "ncclGroupEnd", &lib->GroupEnd, missing) &&
         BindSymbol(handle, "ncclReduce", &lib->Reduce, missing) &&
         BindSymbol(handle, "ncclBroadcast", &lib->Broadcast, missing) &&
         BindSymbol(handle, "ncclAllReduce", &lib->AllReduce, missing) &&
         BindSymbol(handle, "ncclAllGather", &lib->AllGather, missing) &&
         BindSymbol(handle, "ncclSend", &lib->Send, missing) &&
         BindSymbol(handle, "ncclRecv", &lib->Recv, missing);
}

}  // namespace

NcclConfig NcclLibrary::DefaultConfig() const {
  NcclConfig config;
  config.version = static_cast<unsigned>(version);
  return config;
}

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
  if (!BindAll(handle, lib.get(), &missing)) {
    *error = name + " is not a usable NCCL: it lacks " + missing;
    return nullptr;
  }
  if (lib->GetVersion(&lib->version) != kNcclSuccess || lib->version < kNcclMinVersion) {
    *error = name + " is NCCL " + std::to_string(lib->version) +
             ", older than 2.14 (the first with non-blocking communicators)";
    return nullptr;
  }
  return lib;
}

Status NcclStatus(const NcclLibrary& nccl, int result, const std::string& what, NcclComm comm) {
  if (result == kNcclSuccess || result == kNcclInProgress) return Status::Ok();
  const char* text = nccl.GetErrorString(result);
  const bool named = result >= 0 && result < static_cast<int>(std::size(kResultNames));
  std::string message = what + ": " + (text ? text : "NCCL error") + " (" +
                        (named ? kResultNames[result] : "result " + std::to_string(result)) + ")";
  const char* last = nccl.GetLastError(comm);
  if (last != nullptr && last[0] != '\0') message += ": " + std::string(last);
  switch (result) {
    case kNcclRemoteError:
      return Unavailable(message + "; a peer node failed or left");
    case kNcclSystemError:
      return Unavailable(message +
                         "; a network or system call failed (check NCCL_SOCKET_IFNAME and that "
                         "the nodes can reach each other)");
    case kNcclInvalidArgument:
    case kNcclInvalidUsage:
      return InvalidArgument(message);
    default:
      return Internal(message);
  }
}

}  // namespace sparsync::device
