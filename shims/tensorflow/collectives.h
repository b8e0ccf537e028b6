// Collectives: a worker's connection to its node's sparsyncd as TensorFlow's kernels use it.
// Framework-neutral (no TensorFlow header): a kernel describes its tensor in a Request, and
// Enqueue answers it through Request::done, exactly once.
//
// Each tensor name keeps its registration (a shared region) while its spec is unchanged; a new
// spec under the same name re-registers it. The daemon knows a name by the name itself for the
// first spec it was registered with and by `name#<digest of the spec>` for any later one
// (DaemonName): two workers of a node re-register at their own pace, and one name with two specs
// at once on a node would be refused as a mismatch that fails the job.
//
// A request whose tensor is registered is copied into the region and posted on the caller's
// thread (a datagram to the local daemon; nothing is waited for); one that must first register
// (the first step, a new shape) is registered, copied and posted on a pool thread, since
// registering waits for the daemon's reply. The wait for DONE and the copy of the result always
// run on a pool thread (completion_pool.h).
//
// Threading: every method may be called from any thread. Close fails what is in flight (every
// `done` is called) before it returns.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "shims/client/include/sparsync/client.h"
#include "shims/tensorflow/completion_pool.h"

namespace sparsync::tensorflow_shim {

// What a collective ended with: a sparsync_status code and a message a user can act on.
struct Outcome {
  sparsync_status status = SPARSYNC_OK;
  std::string message;
  bool ok() const { return status == SPARSYNC_OK; }
};

struct ConnectSettings {
  std::string socket_path;          // SPARSYNC_SOCKET
  std::string job_token;            // SPARSYNC_JOB_TOKEN; "": the daemon's SPARSYNC_SOCKET.token
  uint32_t local_rank = 0;          // SPARSYNC_LOCAL_RANK
  double connect_timeout_s = 10.0;  // SPARSYNC_CONNECT_TIMEOUT_S
  // How long a collective waits for its DONE: the daemon's SPARSYNC_TIMEOUT_S plus a grace, so
  // that the daemon's own message is the one users see. `timeout_hint` names it in the error.
  double wait_timeout_s = 305.0;
  std::string timeout_hint = "SPARSYNC_TIMEOUT_S";
  std::string cuda_runtime;  // SPARSYNC_CUDART
};

// A 64-bit digest of `text` as 16 hex digits (FNV-1a): the same in every process, for names.
std::string DigestHex(const std::string& text);

// The tensor a sparsyncd's registration describes, as a value that can be compared.
struct TensorKey {
  std::string name;
  sparsync_op op = SPARSYNC_OP_ALLREDUCE;
  sparsync_dtype dtype = SPARSYNC_FLOAT32;
  sparsync_reduce_op reduce_op = SPARSYNC_REDUCE_SUM;
  int32_t root_rank = 0;
  std::vector<int64_t> shape;
  sparsync_compressor compressor = SPARSYNC_COMPRESSOR_DEFAULT;
  float density = 0.0f;

  bool operator==(const TensorKey& o) const;
  bool operator!=(const TensorKey& o) const { return !(*this == o); }
  uint64_t bytes() const;  // of one worker's tensor
};

struct Request {
  TensorKey tensor;
  const void* input = nullptr;  // tensor.bytes() bytes, valid until `done`
  // ALLREDUCE, GRADIENT, BROADCAST: tensor.bytes() bytes the result is written to.
  void* output = nullptr;
  // ALLGATHER: called on a pool thread once the result is known; returns where to write its
  // `bytes` (dim0 rows), or null with *error set.
  std::function<void*(int64_t dim0, uint64_t bytes, std::string* error)> allocate;
  // Called once, on the caller's or a pool thread, after the result was written (or not).
  std::function<void(const Outcome&)> done;
};

class Collectives {
 public:
  Collectives() = default;
  ~Collectives() { Close(); }
  Collectives(const Collectives&) = delete;
  Collectives& operator=(const Collectives&) = delete;

  // Connects to the daemon and fills *world. INVALID when already connected.
  Outcome Connect(const ConnectSettings& settings, sparsync_world* world);
  bool connected() const;
  // Answers every request (before Close: with the daemon's result; after: with an error).
  void Enqueue(Request request);
  // Starts the daemon's timeline into `path` (a file on the daemon's machine), or stops it
  // (""), waiting up to `timeout_s` for its answer. INVALID when not connected.
  Outcome Timeline(const std::string& path, double timeout_s);
  // Fails the collectives in flight, waits for their `done`, releases every region and says
  // goodbye to the daemon. Connect may be called again afterwards. Not from a `done` callback.
  void Close();

 private:
  struct Entry {
    TensorKey key;
    std::string daemon_name;  // what the daemon knows it by (DaemonName)
    uint32_t id = 0;
    void* data = nullptr;  // the shared region
    uint64_t bytes = 0;
    bool registered = false;
    bool in_flight = false;
  };
  using EntryPtr = std::shared_ptr<Entry>;

  // The name the daemon knows `key` by: key.name for the first spec registered under it,
  // key.name + "#" + a digest of the spec for any other (the same on every rank, since every rank
  // calls a name with the same specs in the same order). REQUIRES: mu_ held.
  std::string DaemonName(const TensorKey& key);
  // Registers `entry` (unregistering `old_id` first when `had_old`), then posts `request`.
  void RegisterAndPost(const EntryPtr& entry, bool had_old, uint32_t old_id, Request request);
  // A region may be used until EndRegionUse; false once Close has begun.
  bool BeginRegionUse();
  void EndRegionUse();
  // Copies the input into the region and posts it; on failure answers `request`.
  // REQUIRES: BeginRegionUse() held.
  bool Post(const EntryPtr& entry, Request* request);
  // sparsync_wait_done for up to `timeout_s`, in slices, returning early once Close has begun.
  sparsync_status WaitInSlices(sparsync_client* client, uint32_t id, double timeout_s);
  // On a pool thread: waits for DONE, copies the result, answers `request`.
  void Complete(const EntryPtr& entry, Request request);
  // The result of a successful round into the request's output. REQUIRES: BeginRegionUse().
  Outcome CopyResult(sparsync_client* client, const Entry& entry, Request* request);
  // Clears the entry's in-flight mark, then calls request.done (in that order, so that the next
  // step's post of the same tensor, which `done` may start, finds it free).
  void Finish(const EntryPtr& entry, Request* request, const Outcome& outcome);
  // The message of `status`, the last failure on the handle; `again` repeats the failed call so
  // that the message read is its own even when another thread's call failed meanwhile.
  Outcome Failure(sparsync_client* client, sparsync_status status,
                  const std::function<sparsync_status()>& again = {});

  mutable std::mutex mu_;  // guards every field below, not the client's calls
  sparsync_client* client_ = nullptr;
  ConnectSettings settings_;
  std::map<std::string, EntryPtr> entries_;  // by tensor name
  std::map<std::string, TensorKey> first_keys_;  // by tensor name: its first spec (DaemonName)
  std::unique_ptr<CompletionPool> pool_;
  bool closing_ = false;  // Close has begun: no new request, registrations are undone
  // Threads reading or writing a region outside mu_; Close unregisters (unmaps) only at 0.
  int busy_ = 0;
  std::condition_variable idle_cv_;
  std::mutex error_mu_;  // a failed call and the reading of its message, together
};

}  // namespace sparsync::tensorflow_shim
