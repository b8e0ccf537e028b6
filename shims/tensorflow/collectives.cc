#include "shims/tensorflow/collectives.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <utility>

namespace sparsync::tensorflow_shim {
namespace {

// A waiting thread looks up at least this often: the thread receiving for the session is not
// woken by an unregistration (the client library's leader/follower wait), so Close would wait
// for the daemon's answer or the whole timeout otherwise.
constexpr double kWaitSliceS = 0.25;

constexpr char kNotInitialized[] =
    "sparsync has not been initialized; use hvd.init() (sparsync.tensorflow)";

Outcome Error(sparsync_status status, std::string message) {
  return Outcome{status, std::move(message)};
}

std::string ShutDownWhile(const std::string& name) {
  return "sparsync was shut down (hvd.shutdown()) while tensor '" + name + "' was in flight";
}

}  // namespace

std::string DigestHex(const std::string& text) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  char hex[17];
  snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

bool TensorKey::operator==(const TensorKey& o) const {
  return name == o.name && op == o.op && dtype == o.dtype && reduce_op == o.reduce_op &&
         root_rank == o.root_rank && shape == o.shape && compressor == o.compressor &&
         density == o.density;
}

uint64_t TensorKey::bytes() const {
  uint64_t n = sparsync_dtype_size(dtype);
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

Outcome Collectives::Connect(const ConnectSettings& settings, sparsync_world* world) {
  std::lock_guard<std::mutex> lock(mu_);
  if (client_ != nullptr) return Error(SPARSYNC_ERR_INVALID, "sparsync is already initialized");
  sparsync_connect_options options{};
  options.struct_size = sizeof(options);
  options.local_rank = settings.local_rank;
  options.socket_path = settings.socket_path.c_str();
  // No SPARSYNC_JOB_TOKEN: the client library reads the token the daemon left beside its socket.
  options.job_token = settings.job_token.empty() ? nullptr : settings.job_token.c_str();
  options.timeout_s = settings.connect_timeout_s;
  options.cuda_runtime = settings.cuda_runtime.c_str();
  char error[1024] = "";
  sparsync_client* client = nullptr;
  sparsync_status s = sparsync_connect_with_options(&options, &client, error, sizeof(error));
  if (s != SPARSYNC_OK) return Error(s, error);
  s = sparsync_get_world(client, world);
  if (s != SPARSYNC_OK) {
    Outcome failed = Error(s, sparsync_last_error(client));
    sparsync_close(client);
    return failed;
  }
  client_ = client;
  settings_ = settings;
  closing_ = false;
  pool_ = std::make_unique<CompletionPool>();
  return Outcome{};
}

bool Collectives::connected() const {
  std::lock_guard<std::mutex> lock(mu_);
  return client_ != nullptr && !closing_;
}

Outcome Collectives::Failure(sparsync_client* client, sparsync_status status,
                             const std::function<sparsync_status()>& again) {
  std::lock_guard<std::mutex> lock(error_mu_);
  if (again) {
    sparsync_status repeated = again();
    if (repeated != SPARSYNC_OK) status = repeated;
  }
  return Error(status, sparsync_last_error(client));
}

void Collectives::Enqueue(Request request) {
  EntryPtr entry;
  bool must_register = false, had_old = false;
  uint32_t old_id = 0;
  Outcome refused;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(request.tensor.name);
    if (client_ == nullptr || closing_) {
      refused = Error(SPARSYNC_ERR_INVALID, kNotInitialized);
    } else if (it != entries_.end() && it->second->in_flight) {
      refused = Error(SPARSYNC_ERR_INVALID,
                      "a collective on tensor '" + request.tensor.name +
                          "' is already in flight on this worker; give collectives that run at "
                          "the same time distinct names");
    } else if (it != entries_.end() && it->second->registered &&
               it->second->key == request.tensor) {
      entry = it->second;
    } else {
      if (it != entries_.end() && it->second->registered) {
        had_old = true;
        old_id = it->second->id;
      }
      entry = std::make_shared<Entry>();
      entry->key = request.tensor;
      entry->daemon_name = DaemonName(request.tensor);
      entries_[request.tensor.name] = entry;
      must_register = true;
    }
    if (entry) {
      entry->in_flight = true;
      ++busy_;
    }
  }
  // `done` may run the next kernels inline, which enqueue again: never under mu_.
  if (!entry) return request.done(refused);
  // busy_ > 0 keeps Close from stopping the pool, so Submit cannot fail here.
  if (must_register) {  // registering waits for the daemon's reply: not on this thread
    (void)pool_->Submit([this, entry, had_old, old_id, r = std::move(request)]() mutable {
      RegisterAndPost(entry, had_old, old_id, std::move(r));
    });
  } else if (Post(entry, &request)) {
    (void)pool_->Submit(
        [this, entry, r = std::move(request)]() mutable { Complete(entry, std::move(r)); });
  }
  EndRegionUse();
}

Outcome Collectives::Timeline(const std::string& path, double timeout_s) {
  sparsync_client* client;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (client_ == nullptr || closing_) return Error(SPARSYNC_ERR_INVALID, kNotInitialized);
    client = client_;
    ++busy_;  // Close frees the handle only once nobody uses it
  }
  sparsync_status s;
  Outcome outcome;
  {
    std::lock_guard<std::mutex> lock(error_mu_);
    s = sparsync_timeline(client, path.c_str(), timeout_s);
    if (s != SPARSYNC_OK) outcome = Error(s, sparsync_last_error(client));
  }
  EndRegionUse();
  return outcome;
}

bool Collectives::BeginRegionUse() {
  std::lock_guard<std::mutex> lock(mu_);
  if (closing_) return false;
  ++busy_;
  return true;
}

void Collectives::EndRegionUse() {
  std::lock_guard<std::mutex> lock(mu_);
  if (--busy_ == 0) idle_cv_.notify_all();
}

std::string Collectives::DaemonName(const TensorKey& key) {
  const TensorKey& first = first_keys_.try_emplace(key.name, key).first->second;
  if (first == key) return key.name;
  // FNV-1a over the spec's fields, as text so that it does not depend on padding.
  std::string spec = std::to_string(key.op) + "/" + std::to_string(key.dtype) + "/" +
                     std::to_string(key.reduce_op) + "/" + std::to_string(key.root_rank) + "/" +
                     std::to_string(key.compressor) + "/" + std::to_string(key.density) + "/";
  for (int64_t d : key.shape) spec += std::to_string(d) + ",";
  std::string longer = key.name + "#" + DigestHex(spec);
  return longer.size() <= SPARSYNC_MAX_NAME_BYTES ? longer : key.name;
}

void Collectives::RegisterAndPost(const EntryPtr& entry, bool had_old, uint32_t old_id,
                                  Request request) {
  sparsync_client* client;
  {
    std::lock_guard<std::mutex> lock(mu_);
    client = client_;
  }
  if (had_old) (void)sparsync_unregister_tensor(client, old_id);  // fails only once broken
  const TensorKey& key = entry->key;
  sparsync_tensor_spec spec{};
  spec.name = entry->daemon_name.c_str();
  spec.op = key.op;
  spec.dtype = key.dtype;
  spec.reduce_op = key.reduce_op;
  spec.root_rank = key.root_rank;
  spec.ndim = static_cast<uint32_t>(key.shape.size());
  spec.shape = key.shape.data();
  spec.compressor = key.compressor;
  spec.density = key.density;
  uint32_t id = 0;
  void* data = nullptr;
  uint64_t bytes = 0;
  sparsync_status s;
  Outcome failed;
  {
    std::lock_guard<std::mutex> lock(error_mu_);
    s = sparsync_register_tensor(client, &spec, &id, &data, &bytes);
    if (s != SPARSYNC_OK) failed = Error(s, sparsync_last_error(client));
  }
  if (s == SPARSYNC_OK && bytes < key.bytes()) {
    (void)sparsync_unregister_tensor(client, id);
    s = SPARSYNC_ERR_INTERNAL;
    failed = Error(s, "sparsyncd mapped " + std::to_string(bytes) + " bytes for tensor '" +
                          key.name + "', which needs " + std::to_string(key.bytes()));
  }
  if (s != SPARSYNC_OK) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      entries_.erase(key.name);  // the next request registers again
    }
    return Finish(entry, &request, failed);
  }
  bool closing;
  {
    std::lock_guard<std::mutex> lock(mu_);
    entry->id = id;
    entry->data = data;
    entry->bytes = bytes;
    entry->registered = true;  // from now on Close unregisters it
    closing = closing_;
    if (!closing) ++busy_;
  }
  if (closing) {
    (void)sparsync_unregister_tensor(client, id);
    return Finish(entry, &request, Error(SPARSYNC_ERR_ABORTED, ShutDownWhile(key.name)));
  }
  bool posted = Post(entry, &request);
  EndRegionUse();
  if (posted) Complete(entry, std::move(request));
}

bool Collectives::Post(const EntryPtr& entry, Request* request) {
  sparsync_client* client;
  {
    std::lock_guard<std::mutex> lock(mu_);
    client = client_;
  }
  const uint64_t bytes = entry->key.bytes();
  if (bytes > 0) memcpy(entry->data, request->input, bytes);
  sparsync_status s = sparsync_post_ready(client, entry->id);
  if (s == SPARSYNC_OK) return true;
  Finish(entry, request, Failure(client, s));
  return false;
}

sparsync_status Collectives::WaitInSlices(sparsync_client* client, uint32_t id, double timeout_s) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    double left = timeout_s - waited;
    sparsync_status s = sparsync_wait_done(client, id, std::max(0.0, std::min(kWaitSliceS, left)));
    if (s != SPARSYNC_ERR_TIMEOUT || left <= kWaitSliceS || !connected()) return s;
  }
}

void Collectives::Complete(const EntryPtr& entry, Request request) {
  sparsync_client* client;
  double timeout_s;
  std::string hint;
  {
    std::lock_guard<std::mutex> lock(mu_);
    client = client_;
    timeout_s = settings_.wait_timeout_s;
    hint = settings_.timeout_hint;
  }
  const uint32_t id = entry->id;
  const TensorKey& key = entry->key;
  sparsync_status s = WaitInSlices(client, id, timeout_s);
  if (s != SPARSYNC_OK) {
    Outcome failed = Failure(client, s, [&] { return sparsync_wait_done(client, id, 0.0); });
    if (!connected()) {
      failed = Error(SPARSYNC_ERR_ABORTED, ShutDownWhile(key.name));
    } else if (failed.status == SPARSYNC_ERR_TIMEOUT) {
      failed.message += " (" + hint + ")";
    }
    return Finish(entry, &request, failed);
  }
  if (!BeginRegionUse()) {
    return Finish(entry, &request, Error(SPARSYNC_ERR_ABORTED, ShutDownWhile(key.name)));
  }
  Outcome outcome = CopyResult(client, *entry, &request);
  EndRegionUse();
  Finish(entry, &request, outcome);
}

Outcome Collectives::CopyResult(sparsync_client* client, const Entry& entry, Request* request) {
  if (entry.key.op != SPARSYNC_OP_ALLGATHER) {
    if (entry.key.bytes() > 0) memcpy(request->output, entry.data, entry.key.bytes());
    return Outcome{};
  }
  const void* data = nullptr;
  uint64_t bytes = 0;
  int64_t dim0 = 0;
  sparsync_status s = sparsync_allgather_result(client, entry.id, &data, &bytes, &dim0);
  if (s != SPARSYNC_OK) return Failure(client, s);
  std::string error;
  void* out = request->allocate(dim0, bytes, &error);
  if (out == nullptr) return Error(SPARSYNC_ERR_INTERNAL, error);
  if (bytes > 0) memcpy(out, data, bytes);
  return Outcome{};
}

void Collectives::Finish(const EntryPtr& entry, Request* request, const Outcome& outcome) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    entry->in_flight = false;
  }
  request->done(outcome);
}

void Collectives::Close() {
  sparsync_client* client;
  std::unique_ptr<CompletionPool> pool;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (client_ == nullptr || closing_) return;
    closing_ = true;
    client = client_;
    idle_cv_.wait(lock, [this] { return busy_ == 0; });  // no region is being read or written
    // Unregistering wakes each wait on the tensor; a registration still on its way sees
    // closing_ and undoes itself (RegisterAndPost).
    for (auto& [name, entry] : entries_) {
      if (entry->registered) (void)sparsync_unregister_tensor(client, entry->id);
      entry->registered = false;
    }
    pool = std::move(pool_);
  }
  pool->Stop();  // every task has answered its request
  sparsync_close(client);
  std::lock_guard<std::mutex> lock(mu_);
  entries_.clear();
  first_keys_.clear();
  client_ = nullptr;
  closing_ = false;
}

}  // namespace sparsync::tensorflow_shim
