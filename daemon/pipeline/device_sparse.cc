#include "daemon/pipeline/device_sparse.h"

#include <dlfcn.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <climits>
#include <filesystem>

#include "proto/intake/bind_symbol.h"

namespace sparsync::pipeline {

using intake::CudaRuntime;
using intake::CudaTensor;

struct SparsifyLibrary {
  std::string path;
  int (*AbiVersion)();
  int (*WorkspaceCreate)(int64_t, int64_t, sparsync_sp_workspace**, sparsync_sp_error*);
  void (*WorkspaceDestroy)(sparsync_sp_workspace*);
  int (*TopKResidual)(const float*, float*, int64_t, int64_t, int32_t*, float*, int64_t,
                      sparsync_sp_workspace*, void*, sparsync_sp_error*);
  int (*ScatterAddAverage)(const sparsync_sp_payload*, int, float*, int64_t, double,
                           sparsync_sp_workspace*, void*, sparsync_sp_error*);
  int (*PackFloat16Residual)(const float*, const int32_t*, int64_t, uint16_t*, float*, int64_t,
                             void*, sparsync_sp_error*);
  int (*Divide)(float*, int64_t, double, void*, sparsync_sp_error*);
  int (*Finish)(sparsync_sp_workspace*, void*, int64_t*, sparsync_sp_error*);
};

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
  using intake::BindSymbol;
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

// The library's result as a Status; `what` names the call.
Status FromLibrary(int code, const sparsync_sp_error& error, const std::string& what) {
  if (code == SPARSYNC_SP_OK) return Status::Ok();
  return Internal(what + ": " + error.message);
}

Status Cuda(const CudaRuntime& rt, intake::CudaError e, const std::string& what, int device) {
  if (e == intake::kCudaSuccess) return Status::Ok();
  return Internal(rt.Describe(e, what + " on CUDA device " + std::to_string(device)));
}

template <typename T>
Status Grow(const CudaRuntime& rt, int device, T** buffer, size_t count, const char* what) {
  if (*buffer != nullptr) (void)rt.Free(*buffer);
  *buffer = nullptr;
  void* p = nullptr;
  SPARSYNC_RETURN_IF_ERROR(
      Cuda(rt, rt.Malloc(&p, count * sizeof(T)), std::string("cudaMalloc of ") + what, device));
  *buffer = static_cast<T*>(p);
  return Status::Ok();
}

// The group's size: its slices' elements.
size_t Elements(std::span<const GroupSlice> slices) {
  size_t n = 0;
  for (const GroupSlice& s : slices) n += s.count;
  return n;
}

// Adds the device residual `data` of `name` to `host` and frees it. Blocks for the copy.
Status Download(const std::string& name, const std::shared_ptr<const CudaRuntime>& rt, int device,
                float* data, size_t count, std::vector<float>* host) {
  std::vector<float> v(count);
  SPARSYNC_RETURN_IF_ERROR(Cuda(*rt, rt->SetDevice(device), "cudaSetDevice", device));
  Status st = Cuda(*rt,
                   rt->MemcpyAsync(v.data(), data, count * sizeof(float),
                                   intake::kCudaMemcpyDeviceToHost, nullptr),
                   "copying the residual of '" + name + "' to the host", device);
  if (st.ok()) st = Cuda(*rt, rt->StreamSynchronize(nullptr), "cudaStreamSynchronize", device);
  (void)rt->Free(data);
  SPARSYNC_RETURN_IF_ERROR(st);
  if (host->size() != count) host->assign(count, 0.0f);
  for (size_t i = 0; i < count; ++i) (*host)[i] += v[i];
  return Status::Ok();
}

}  // namespace

DeviceSparse::Scratch::~Scratch() { Clear(); }

void DeviceSparse::Scratch::Clear() {
  if (rt) {
    (void)rt->SetDevice(device);
    if (workspace != nullptr) lib->WorkspaceDestroy(workspace);
    for (void* p :
         {static_cast<void*>(group), static_cast<void*>(residual), static_cast<void*>(indices),
          static_cast<void*>(values), static_cast<void*>(halves)}) {
      if (p != nullptr) (void)rt->Free(p);
    }
  }
  lib = nullptr;
  rt = nullptr;
  device = -1;
  workspace = nullptr;
  workspace_numel = workspace_k = 0;
  group = residual = values = nullptr;
  indices = nullptr;
  halves = nullptr;
  group_capacity = residual_capacity = pairs_capacity = halves_capacity = 0;
}

DeviceSparse::DeviceSparse(std::string library) : library_(std::move(library)) {}

DeviceSparse::~DeviceSparse() {
  for (auto& [name, r] : residuals_) {
    if (r.rt->SetDevice(r.device) == intake::kCudaSuccess) (void)r.rt->Free(r.data);
  }
}

bool DeviceSparse::LoadLocked(std::string* error) {
  if (lib_) return true;
  if (load_failed_) return false;
  const std::string path = library_.empty() ? BesideExecutable(kDefaultLibrary) : library_;
  lib_ = LoadLibrary(path, error);
  load_failed_ = lib_ == nullptr;
  return lib_ != nullptr;
}

Status DeviceSparse::LoadExplicit() {
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

bool DeviceSparse::Available() {
  std::lock_guard lock(mu_);
  if (disabled_) return false;
  if (lib_) return true;
  if (load_failed_) return false;
  std::string error;
  if (!LoadLocked(&error)) {
    spdlog::info("{}: the node's CUDA gradients are sparsified on the host", error);
    return false;
  }
  spdlog::info("device sparsification: using {}", lib_->path);
  return true;
}

void DeviceSparse::Disable(const std::string& why) {
  std::lock_guard lock(mu_);
  if (disabled_) return;
  disabled_ = true;
  spdlog::warn("{}: the node's CUDA gradients are sparsified on the host from now on", why);
}

bool DeviceSparse::Takes(std::span<const GroupMember> members) {
  int device = -1;
  for (const GroupMember& m : members) {
    if (!m.on_device || m.parts.empty() || !m.parts[0].cuda) return false;
    if (device >= 0 && m.parts[0].cuda->device() != device) return false;
    device = m.parts[0].cuda->device();
  }
  return device >= 0;
}

DeviceSparse::Residual DeviceSparse::Release(const std::string& name) {
  std::lock_guard lock(mu_);
  auto it = residuals_.find(name);
  if (it == residuals_.end()) return {};
  Residual r = it->second;
  residuals_.erase(it);
  return r;
}

void DeviceSparse::Forget(const std::string& name) {
  const Residual r = Release(name);
  if (r.data != nullptr && r.rt->SetDevice(r.device) == intake::kCudaSuccess) {
    (void)r.rt->Free(r.data);
  }
}

size_t DeviceSparse::residual_bytes() const {
  std::lock_guard lock(mu_);
  size_t total = 0;
  for (const auto& [name, r] : residuals_) total += r.count * sizeof(float);
  return total;
}

Status DeviceSparse::MoveResidualsToHost(std::span<const GroupSlice> slices,
                                         SparseReducer* sparse) {
  for (const GroupSlice& s : slices) {
    const Residual r = Release(*s.name);
    if (r.data == nullptr) continue;
    std::vector<float> host;
    SPARSYNC_RETURN_IF_ERROR(Download(*s.name, r.rt, r.device, r.data, r.count, &host));
    sparse->AddResidual(*s.name, host);
  }
  return Status::Ok();
}

std::shared_ptr<const SparsifyLibrary> DeviceSparse::Library() const {
  std::lock_guard lock(mu_);
  return disabled_ ? nullptr : lib_;
}

Status DeviceSparse::Bind(Scratch* scratch, const std::shared_ptr<const SparsifyLibrary>& lib,
                          const std::shared_ptr<const CudaRuntime>& rt, int device, size_t n) {
  if (scratch->device != device || scratch->lib != lib) {
    scratch->Clear();
    scratch->lib = lib;
    scratch->rt = rt;
    scratch->device = device;
  }
  if (scratch->group_capacity < n) {
    scratch->group_capacity = 0;
    SPARSYNC_RETURN_IF_ERROR(Grow(*rt, device, &scratch->group, n, "the group buffer"));
    scratch->group_capacity = n;
  }
  return Status::Ok();
}

Result<float*> DeviceSparse::ResidualOn(const std::string& name, size_t count, int device,
                                        const std::shared_ptr<const CudaRuntime>& rt, void* stream,
                                        SparseReducer* sparse,
                                        std::vector<std::vector<float>>* uploads) {
  Residual r;
  {
    std::lock_guard lock(mu_);
    auto it = residuals_.find(name);
    if (it != residuals_.end()) {
      if (it->second.device == device && it->second.count == count) return it->second.data;
      r = it->second;  // on another GPU (or of another size): it comes along through the host
      residuals_.erase(it);
    }
  }
  std::vector<float> host = sparse->TakeResidual(name);
  if (r.data != nullptr) {
    SPARSYNC_RETURN_IF_ERROR(Download(name, r.rt, r.device, r.data, r.count, &host));
    SPARSYNC_RETURN_IF_ERROR(Cuda(*rt, rt->SetDevice(device), "cudaSetDevice", device));
  }
  if (host.size() != count) return static_cast<float*>(nullptr);
  // Kept in the map at once, so that a step this residual does not finish cannot lose it.
  float* data = nullptr;
  SPARSYNC_RETURN_IF_ERROR(Grow(*rt, device, &data, count, "a residual"));
  {
    std::lock_guard lock(mu_);
    residuals_[name] = Residual{rt, device, data, count};
  }
  uploads->push_back(std::move(host));
  SPARSYNC_RETURN_IF_ERROR(Cuda(*rt,
                                rt->MemcpyAsync(data, uploads->back().data(), count * sizeof(float),
                                                intake::kCudaMemcpyHostToDevice, stream),
                                "copying the residual of '" + name + "' to the device", device));
  return data;
}

Status DeviceSparse::Select(std::span<GroupMember> members, std::span<const GroupSlice> slices,
                            SparseReducer* sparse, Scratch* scratch, PreparedGroup* prepared,
                            bool* fall_back) {
  *fall_back = false;
  const std::shared_ptr<const SparsifyLibrary> lib = Library();
  const size_t n = Elements(slices);
  if (!lib || n == 0 || n > static_cast<size_t>(INT32_MAX)) {
    *fall_back = true;
    return Status::Ok();
  }
  CudaTensor& first = *members[0].parts[0].cuda;
  const std::shared_ptr<const CudaRuntime> rt_ptr = first.runtime();
  const CudaRuntime& rt = *rt_ptr;
  const int device = first.device();
  void* stream = first.stream();
  const int64_t k = std::max<int64_t>(1, std::min<int64_t>(sparse->SelectedCount(n), n));
  SPARSYNC_RETURN_IF_ERROR(Cuda(rt, rt.SetDevice(device), "cudaSetDevice", device));

  // The slot's buffers, on this device and large enough. A failure here leaves the device path.
  Status reserved = [&]() -> Status {
    SPARSYNC_RETURN_IF_ERROR(Bind(scratch, lib, rt_ptr, device, n));
    if (scratch->residual_capacity < n) {
      scratch->residual_capacity = 0;
      SPARSYNC_RETURN_IF_ERROR(Grow(rt, device, &scratch->residual, n, "the residual buffer"));
      scratch->residual_capacity = n;
    }
    if (scratch->pairs_capacity < static_cast<size_t>(k)) {
      SPARSYNC_RETURN_IF_ERROR(Grow(rt, device, &scratch->indices, k, "the selection"));
      SPARSYNC_RETURN_IF_ERROR(Grow(rt, device, &scratch->values, k, "the selection"));
      scratch->pairs_capacity = k;
    }
    if (sparse->SendsFloat16() && scratch->halves_capacity < static_cast<size_t>(k)) {
      SPARSYNC_RETURN_IF_ERROR(Grow(rt, device, &scratch->halves, k, "the float16 values"));
      scratch->halves_capacity = k;
    }
    if (scratch->workspace_numel < static_cast<int64_t>(n) || scratch->workspace_k < k) {
      if (scratch->workspace != nullptr) lib->WorkspaceDestroy(scratch->workspace);
      scratch->workspace = nullptr;
      sparsync_sp_error error{};
      SPARSYNC_RETURN_IF_ERROR(FromLibrary(
          lib->WorkspaceCreate(static_cast<int64_t>(n), k, &scratch->workspace, &error), error,
          "making a sparsification workspace on CUDA device " + std::to_string(device)));
      scratch->workspace_numel = static_cast<int64_t>(n);
      scratch->workspace_k = k;
    }
    return Status::Ok();
  }();
  if (!reserved.ok()) {
    Disable(reserved.message());
    *fall_back = true;
    return Status::Ok();
  }

  // Each tensor's sum and residual into the group buffers. Host copies stay alive until the
  // stream is synchronised below.
  std::vector<std::vector<float>> uploads;
  for (size_t i = 0; i < members.size(); ++i) {
    const GroupSlice& s = slices[i];
    CudaTensor& t = *members[i].parts[0].cuda;
    if (!members[i].clique) SPARSYNC_RETURN_IF_ERROR(t.EnqueueWaitReady());
    const size_t bytes = s.count * sizeof(float);
    SPARSYNC_RETURN_IF_ERROR(t.Check(rt.MemcpyAsync(scratch->group + s.offset, t.data(), bytes,
                                                    intake::kCudaMemcpyDeviceToDevice, stream),
                                     "copying the tensor into the device group buffer"));
    SPARSYNC_ASSIGN_OR_RETURN(
        float* residual, ResidualOn(*s.name, s.count, device, rt_ptr, stream, sparse, &uploads));
    float* dst = scratch->residual + s.offset;
    if (residual != nullptr) {
      SPARSYNC_RETURN_IF_ERROR(
          t.Check(rt.MemcpyAsync(dst, residual, bytes, intake::kCudaMemcpyDeviceToDevice, stream),
                  "copying the residual into the device group buffer"));
    } else {
      SPARSYNC_RETURN_IF_ERROR(
          t.Check(rt.MemsetAsync(dst, 0, bytes, stream), "clearing the residual"));
    }
  }

  sparsync_sp_error error{};
  SPARSYNC_RETURN_IF_ERROR(FromLibrary(
      lib->TopKResidual(scratch->group, scratch->residual, static_cast<int64_t>(n), k,
                        scratch->indices, scratch->values, k, scratch->workspace, stream, &error),
      error, "top-k on CUDA device " + std::to_string(device)));
  int64_t count = 0;
  const int code = lib->Finish(scratch->workspace, stream, &count, &error);
  int64_t bad = -1;
  float bad_value = 0;
  prepared->finite = code != SPARSYNC_SP_NONFINITE;
  if (!prepared->finite) {
    bad = error.index;
    if (bad < 0 || static_cast<size_t>(bad) >= n)
      return Internal("top-k: " + std::string(error.message));
    // The node's sum at that element, for the message (the residual buffer is unspecified now).
    SPARSYNC_RETURN_IF_ERROR(Cuda(rt,
                                  rt.MemcpyAsync(&bad_value, scratch->group + bad, sizeof(float),
                                                 intake::kCudaMemcpyDeviceToHost, stream),
                                  "reading a non-finite value", device));
    count = 0;
  } else {
    SPARSYNC_RETURN_IF_ERROR(
        FromLibrary(code, error, "top-k on CUDA device " + std::to_string(device)));
    if (count < 0 || count > k)
      return Internal("top-k selected " + std::to_string(count) + " of " + std::to_string(k));
  }
  if (count > 0 && sparse->SendsFloat16()) {
    // The peers get the values as float16: what that rounding drops stays in the residual (the
    // host encodes the same halves from the float32 values below).
    SPARSYNC_RETURN_IF_ERROR(FromLibrary(
        lib->PackFloat16Residual(scratch->values, scratch->indices, count, scratch->halves,
                                 scratch->residual, static_cast<int64_t>(n), stream, &error),
        error, "float16 packing on CUDA device " + std::to_string(device)));
  }
  prepared->indices.resize(static_cast<size_t>(count));
  prepared->values.resize(static_cast<size_t>(count));
  if (count > 0) {
    SPARSYNC_RETURN_IF_ERROR(
        Cuda(rt,
             rt.MemcpyAsync(prepared->indices.data(), scratch->indices, count * sizeof(int32_t),
                            intake::kCudaMemcpyDeviceToHost, stream),
             "copying the selection to the host", device));
    SPARSYNC_RETURN_IF_ERROR(
        Cuda(rt,
             rt.MemcpyAsync(prepared->values.data(), scratch->values, count * sizeof(float),
                            intake::kCudaMemcpyDeviceToHost, stream),
             "copying the selection to the host", device));
  }
  SPARSYNC_RETURN_IF_ERROR(
      Cuda(rt, rt.StreamSynchronize(stream), "copying the selection to the host", device));
  if (prepared->finite && !announced_.exchange(true)) {
    spdlog::info(
        "top-k on CUDA device {} for the group of '{}' ({} elements): only the {} "
        "selected pairs are copied to the host",
        device, *slices[0].name, n, count);
  }
  return sparse->PrepareSelected(slices, static_cast<int64_t>(n), bad, bad_value, prepared);
}

Status DeviceSparse::Finish(std::span<GroupMember> members, std::span<const GroupSlice> slices,
                            SparseReducer* sparse, Scratch* scratch, PreparedGroup& prepared,
                            double divisor, uint32_t* tag) {
  const size_t n = Elements(slices);
  bool skip = false;
  std::vector<DecodedSparse> payloads;
  SPARSYNC_RETURN_IF_ERROR(
      sparse->ExchangeSelected(prepared, static_cast<int64_t>(n), tag, &skip, &payloads));

  const CudaRuntime& rt = *scratch->rt;
  const int device = scratch->device;
  const SparsifyLibrary& lib = *scratch->lib;
  void* stream = members[0].parts[0].cuda->stream();
  SPARSYNC_RETURN_IF_ERROR(Cuda(rt, rt.SetDevice(device), "cudaSetDevice", device));

  // The average of every node's pairs, into the group buffer.
  if (skip) {
    SPARSYNC_RETURN_IF_ERROR(Cuda(rt, rt.MemsetAsync(scratch->group, 0, n * sizeof(float), stream),
                                  "clearing the group buffer", device));
  } else {
    size_t pairs = 0;
    for (const DecodedSparse& p : payloads) pairs += p.indices.size();
    if (scratch->pairs_capacity < pairs) {
      SPARSYNC_RETURN_IF_ERROR(Grow(rt, device, &scratch->indices, pairs, "the gathered pairs"));
      SPARSYNC_RETURN_IF_ERROR(Grow(rt, device, &scratch->values, pairs, "the gathered pairs"));
      scratch->pairs_capacity = pairs;
    }
    std::vector<sparsync_sp_payload> views;
    size_t at = 0;
    for (const DecodedSparse& p : payloads) {
      const size_t c = p.indices.size();
      if (c > 0) {
        SPARSYNC_RETURN_IF_ERROR(
            Cuda(rt,
                 rt.MemcpyAsync(scratch->indices + at, p.indices.data(), c * sizeof(int32_t),
                                intake::kCudaMemcpyHostToDevice, stream),
                 "copying the gathered pairs to the device", device));
        SPARSYNC_RETURN_IF_ERROR(
            Cuda(rt,
                 rt.MemcpyAsync(scratch->values + at, p.values.data(), c * sizeof(float),
                                intake::kCudaMemcpyHostToDevice, stream),
                 "copying the gathered pairs to the device", device));
      }
      views.push_back({scratch->indices + at, scratch->values + at, static_cast<int64_t>(c)});
      at += c;
    }
    sparsync_sp_error error{};
    SPARSYNC_RETURN_IF_ERROR(FromLibrary(
        lib.ScatterAddAverage(views.data(), static_cast<int>(views.size()), scratch->group,
                              static_cast<int64_t>(n), divisor, scratch->workspace, stream, &error),
        error, "scatter-add on CUDA device " + std::to_string(device)));
    int64_t unused = 0;
    SPARSYNC_RETURN_IF_ERROR(FromLibrary(lib.Finish(scratch->workspace, stream, &unused, &error),
                                         error,
                                         "scatter-add on CUDA device " + std::to_string(device)));
  }

  // Each tensor's result into local rank 0's buffer (DeliverResult takes it from there).
  for (size_t i = 0; i < members.size(); ++i) {
    CudaTensor& t = *members[i].parts[0].cuda;
    SPARSYNC_RETURN_IF_ERROR(t.Check(
        rt.MemcpyAsync(t.data(), scratch->group + slices[i].offset, slices[i].count * sizeof(float),
                       intake::kCudaMemcpyDeviceToDevice, stream),
        "copying the result into the worker's buffer"));
    members[i].result_on_device = true;
  }

  // The residuals. Skipped step: a finite node keeps everything it would have sent (the
  // selected values go back where top-k zeroed them); a node that saw NaN/Inf keeps its old one.
  std::vector<float> restored;
  const float* source = scratch->residual;
  int kind = intake::kCudaMemcpyDeviceToDevice;
  if (skip && prepared.finite) {
    restored.resize(n);
    SPARSYNC_RETURN_IF_ERROR(
        Cuda(rt,
             rt.MemcpyAsync(restored.data(), scratch->residual, n * sizeof(float),
                            intake::kCudaMemcpyDeviceToHost, stream),
             "copying the residual to the host", device));
    SPARSYNC_RETURN_IF_ERROR(
        Cuda(rt, rt.StreamSynchronize(stream), "cudaStreamSynchronize", device));
    for (size_t j = 0; j < prepared.indices.size(); ++j) {
      restored[prepared.indices[j]] = prepared.values[j];
    }
    source = restored.data();
    kind = intake::kCudaMemcpyHostToDevice;
  }
  if (!skip || prepared.finite) {
    for (const GroupSlice& s : slices) {
      float* data = nullptr;
      {
        std::lock_guard lock(mu_);
        auto it = residuals_.find(*s.name);
        if (it != residuals_.end()) data = it->second.data;
      }
      if (data == nullptr) {
        SPARSYNC_RETURN_IF_ERROR(Grow(rt, device, &data, s.count, "a residual"));
        std::lock_guard lock(mu_);
        residuals_[*s.name] = Residual{scratch->rt, device, data, s.count};
      }
      SPARSYNC_RETURN_IF_ERROR(
          Cuda(rt, rt.MemcpyAsync(data, source + s.offset, s.count * sizeof(float), kind, stream),
               "keeping the residual of '" + *s.name + "'", device));
    }
  }
  // Nothing on the host may go while the device still reads it.
  return Cuda(rt, rt.StreamSynchronize(stream), "cudaStreamSynchronize", device);
}

// ---- Dense groups ----

bool DeviceSparse::TakesDense(std::span<const GroupMember> members,
                              const transport::Transport& transport) {
  if (transport.cuda_device() < 0 || !Takes(members)) return false;
  for (const GroupMember& m : members) {
    if (m.meta.dtype != SPARSYNC_FLOAT32) return false;
  }
  return members[0].parts[0].cuda->device() == transport.cuda_device();
}

Status DeviceSparse::PrepareDense(std::span<GroupMember> members,
                                  std::span<const GroupSlice> slices, Scratch* scratch,
                                  bool* fall_back) {
  *fall_back = false;
  const std::shared_ptr<const SparsifyLibrary> lib = Library();
  const size_t n = Elements(slices);
  if (!lib || n == 0) {
    *fall_back = true;
    return Status::Ok();
  }
  CudaTensor& first = *members[0].parts[0].cuda;
  const CudaRuntime& rt = first.rt();
  const int device = first.device();
  void* stream = first.stream();
  SPARSYNC_RETURN_IF_ERROR(Cuda(rt, rt.SetDevice(device), "cudaSetDevice", device));
  // A lone tensor is reduced in its own buffer; a group side by side in the slot's.
  const bool fused = members.size() > 1;
  if (Status st = Bind(scratch, lib, first.runtime(), device, fused ? n : 0); !st.ok()) {
    Disable(st.message());
    *fall_back = true;
    return Status::Ok();
  }
  for (size_t i = 0; i < members.size(); ++i) {
    CudaTensor& t = *members[i].parts[0].cuda;
    if (!members[i].clique) SPARSYNC_RETURN_IF_ERROR(t.EnqueueWaitReady());
    if (!fused) continue;
    SPARSYNC_RETURN_IF_ERROR(
        t.Check(rt.MemcpyAsync(scratch->group + slices[i].offset, t.data(),
                               slices[i].count * sizeof(float), intake::kCudaMemcpyDeviceToDevice,
                               stream),
                "copying the tensor into the device group buffer"));
  }
  // The transport works on a stream of its own: the group must be complete before it starts.
  SPARSYNC_RETURN_IF_ERROR(
      Cuda(rt, rt.StreamSynchronize(stream), "gathering the group on the device", device));
  if (!announced_dense_.exchange(true)) {
    spdlog::info(
        "dense groups stay on CUDA device {}: the transport reduces them in device memory "
        "(first: '{}', {} elements)",
        device, *slices[0].name, n);
  }
  return Status::Ok();
}

Status DeviceSparse::FinishDense(std::span<GroupMember> members,
                                 std::span<const GroupSlice> slices, Scratch* scratch,
                                 transport::Transport* transport, double divisor, uint32_t* tag) {
  const size_t n = Elements(slices);
  CudaTensor& first = *members[0].parts[0].cuda;
  const bool fused = members.size() > 1;
  float* data = fused ? scratch->group : static_cast<float*>(first.data());
  SPARSYNC_RETURN_IF_ERROR(
      transport->AllReduceSumOnDevice(data, n, transport::ElementType::kFloat32, (*tag)++));

  const CudaRuntime& rt = first.rt();
  const int device = first.device();
  void* stream = first.stream();
  SPARSYNC_RETURN_IF_ERROR(Cuda(rt, rt.SetDevice(device), "cudaSetDevice", device));
  if (divisor != 1.0) {
    sparsync_sp_error error{};
    SPARSYNC_RETURN_IF_ERROR(
        FromLibrary(scratch->lib->Divide(data, static_cast<int64_t>(n), divisor, stream, &error),
                    error, "averaging on CUDA device " + std::to_string(device)));
  }
  for (size_t i = 0; i < members.size(); ++i) {
    CudaTensor& t = *members[i].parts[0].cuda;
    if (fused) {
      SPARSYNC_RETURN_IF_ERROR(t.Check(
          rt.MemcpyAsync(t.data(), scratch->group + slices[i].offset,
                         slices[i].count * sizeof(float), intake::kCudaMemcpyDeviceToDevice,
                         stream),
          "copying the result into the worker's buffer"));
    }
    // DeliverResult orders the done events (and the broadcast to the other GPUs) after these.
    members[i].result_on_device = true;
  }
  return Status::Ok();
}

}  // namespace sparsync::pipeline
