#include "daemon/device/sparsify_plugin.h"

#include <dlfcn.h>
#include <spdlog/spdlog.h>

#include <filesystem>

#include "daemon/device/bind_symbol.h"

namespace sparsync::device {
namespace {

constexpr char kDefaultLibrary[] = "libsparsync_sparsify_cuda.so";

std::string BesideExecutable(const char* file) {
  std::error_code ec;
  std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return file;
  return (exe.parent_path() / file).string();
}

std::shared_ptr<const SparsifyLibrary> LoadLibrary(const std::string& path, std::string* error) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    *error = "cannot load the CUDA sparsification library (" +
             std::string(why ? why : path + ": not found") + ")";
    return nullptr;
  }
  auto lib = std::make_shared<SparsifyLibrary>();
  lib->path = path;
  std::string missing;
  bool ok =
      BindSymbol(handle, "sparsync_sp_abi_version", &lib->AbiVersion, &missing) &&
      BindSymbol(handle, "sparsync_sp_workspace_create", &lib->WorkspaceCreate, &missing) &&
      BindSymbol(handle, "sparsync_sp_workspace_destroy", &lib->WorkspaceDestroy, &missing) &&
      BindSymbol(handle, "sparsync_sp_topk_residual", &lib->TopKResidual, &missing) &&
      BindSymbol(handle, "sparsync_sp_scatter_add_average", &lib->ScatterAddAverage, &missing) &&
      BindSymbol(handle, "sparsync_sp_pack_float16_residual", &lib->PackFloat16Residual,
                 &missing) &&
      BindSymbol(handle, "sparsync_sp_divide", &lib->Divide, &missing) &&
      BindSymbol(handle, "sparsync_sp_finish", &lib->Finish, &missing);
  if (!ok) {
    *error = path + " is not a CUDA sparsification library: it lacks " + missing;
    return nullptr;
  }
  if (int v = lib->AbiVersion(); v != SPARSYNC_SP_ABI_VERSION) {
    *error = path + " has interface version " + std::to_string(v) + ", this daemon needs " +
             std::to_string(SPARSYNC_SP_ABI_VERSION) + " (rebuild it with the daemon)";
    return nullptr;
  }
  return lib;
}

}  // namespace

Status PluginStatus(int code, const sparsync_sp_error& error, const std::string& what) {
  if (code == SPARSYNC_SP_OK) return Status::Ok();
  return Internal(what + ": " + error.message);
}

SparsifyPlugin::SparsifyPlugin(std::string library) : library_(std::move(library)) {}

bool SparsifyPlugin::LoadLocked(std::string* error) {
  if (lib_) return true;
  if (load_failed_) return false;
  const std::string path = library_.empty() ? BesideExecutable(kDefaultLibrary) : library_;
  lib_ = LoadLibrary(path, error);
  load_failed_ = lib_ == nullptr;
  return lib_ != nullptr;
}

Status SparsifyPlugin::LoadExplicit() {
  if (library_.empty()) return Status::Ok();
  std::lock_guard lock(mu_);
  std::string error;
  if (!LoadLocked(&error)) {
    return InvalidArgument("SPARSYNC_SPARSIFY_LIBRARY=" + library_ + ": " + error +
                           "; unset it to use the one beside the daemon, or set "
                           "SPARSYNC_DEVICE_SPARSIFY=host");
  }
  spdlog::info("device sparsification: using {}", lib_->path);
  return Status::Ok();
}

std::shared_ptr<const SparsifyLibrary> SparsifyPlugin::Library() {
  std::lock_guard lock(mu_);
  if (disabled_) return nullptr;
  if (lib_) return lib_;
  if (load_failed_) return nullptr;
  std::string error;
  if (!LoadLocked(&error)) {
    spdlog::info("{}: the node's CUDA gradients are sparsified on the host", error);
    return nullptr;
  }
  spdlog::info("device sparsification: using {}", lib_->path);
  return lib_;
}

void SparsifyPlugin::Disable(const std::string& why) {
  std::lock_guard lock(mu_);
  if (disabled_) return;
  disabled_ = true;
  spdlog::warn("{}: the node's CUDA gradients are sparsified on the host from now on", why);
}

}  // namespace sparsync::device
