// A fake NCCL for CPU-only machines: the subset of libnccl's C API that the daemon uses, loaded
// through SPARSYNC_LIBNCCL in place of libnccl.so.2. Device buffers come from the fake CUDA
// runtime (tests/support/fake_cudart), which is host memory of this process, so collectives read
// and write them directly and finish as soon as every rank has called them.
//
//   local reduce   ncclCommInitAll makes a "clique" of ndev ranks (devices 0..3, distinct);
//                  comms[i] is rank i on devlist[i]. Collectives (ncclReduce, ncclBroadcast,
//                  ncclAllReduce, ncclAllGather) are queued on the clique and run once every rank
//                  has queued the same sequence: at the outermost ncclGroupEnd, or at once
//                  outside a group.
//   transport      ncclGetUniqueId and ncclCommInitRankConfig (fake_nccl_rank.cc) make a clique
//                  one rank at a time, each rank in a thread of its own, joined by the unique id,
//                  on the fake runtime's current device. With more than one rank such a
//                  communicator must be non-blocking (ncclConfig_t::blocking = 0): calls return
//                  ncclInProgress while their work waits for the other ranks, and
//                  ncclCommGetAsyncError says ncclInProgress until it has run. Collectives run
//                  outside groups; ncclSend and ncclRecv in groups, the k-th send from a to b
//                  with the k-th receive on b from a. ncclCommAbort of one rank is
//                  ncclRemoteError for the others.
// Ranks are combined in rank order; every rank's inputs are read before any output is written,
// so in-place and aliased buffers are safe (fake_nccl_elements.h has the arithmetic).
//
// It is stricter than NCCL where a real run would hang or corrupt memory silently: a group that
// leaves a rank out of a collective, or whose ranks disagree on kind, count, datatype, op or root,
// fails with ncclInvalidUsage and none of its work runs (on a rank communicator every rank gets
// it as its async error); so do a send and a receive of different sizes. Collectives on a clique
// with a destroyed rank, ncclCommDestroy while collectives are pending, a call on a communicator
// whose last call is still in progress, ncclGroupEnd without ncclGroupStart, buffers that are not
// the fake runtime's device memory (of the communicator's device, for a rank communicator;
// checked when that runtime is loaded), and unknown comms, datatypes, ops, roots, configs or null
// buffers fail and are listed as misuse (sparsync_fake_nccl_misuse). Every executed collective,
// once per rank, is appended to a journal (sparsync_fake_nccl_journal);
// sparsync_fake_nccl_fail_next injects a failure into the next call of a given name.
// ncclCommGetAsyncError reports an injected async error until the comm is aborted, and
// collectives on such a comm are refused. ncclGetLastError is the calling thread's last misuse or
// injected failure. Handles are never reused, so a destroyed comm stays unknown.
#include <algorithm>
#include <cstring>
#include <iterator>
#include <string>
#include <utility>

#include "tests/support/fake_nccl/fake_nccl_state.h"

namespace sparsync::fake_nccl {
namespace {

constexpr const char* kResultText[] = {"no error",
                                       "unhandled cuda error",
                                       "unhandled system error",
                                       "internal error",
                                       "invalid argument",
                                       "invalid usage",
                                       "remote process exited or there was a network error",
                                       "NCCL operation in progress"};

// ncclCommCount, ncclCommUserRank and ncclCommCuDevice: *out = get(comm, its clique).
template <typename F>
int Query(const char* name, const void* handle, int* out, F get) {
  return Locked(name, [&](State& s) {
    Comm* comm = Find(s, handle);
    if (!comm || !out)
      return Misuse(s, kInvalidArgument, std::string(name) + ": unknown communicator or null out");
    *out = get(*comm, s.cliques.at(comm->clique));
    return kSuccess;
  });
}

size_t CopyOut(std::vector<std::string>& lines, char* buf, size_t len) {
  std::string all;
  for (const auto& l : lines) all += l + "\n";
  if (buf && len) {
    size_t n = std::min(all.size(), len - 1);
    std::memcpy(buf, all.data(), n);
    buf[n] = '\0';
  }
  if (buf) lines.clear();  // a size query (null buf) keeps the lines for the next call
  return all.size();
}

}  // namespace
}  // namespace sparsync::fake_nccl

using namespace sparsync::fake_nccl;  // NOLINT: the C API below is this library's only face

#pragma GCC visibility push(default)
extern "C" {

int ncclGetVersion(int* version) {
  if (!version) return kInvalidArgument;
  *version = kVersion;
  return kSuccess;
}

const char* ncclGetErrorString(int result) {
  bool known = result >= 0 && result < static_cast<int>(std::size(kResultText));
  return known ? kResultText[result] : "unknown result code";
}

int ncclCommInitAll(void** comms, int ndev, const int* devlist) {
  return Locked("ncclCommInitAll", [&](State& s) {
    if (!comms) return Misuse(s, kInvalidArgument, "ncclCommInitAll: null comms");
    if (ndev < 1 || ndev > kDevices)
      return Misuse(s, kInvalidArgument, "ncclCommInitAll: ndev " + std::to_string(ndev));
    Clique q;
    for (int i = 0; i < ndev; ++i) {
      int dev = devlist ? devlist[i] : i;
      if (dev < 0 || dev >= kDevices || std::count(q.devices.begin(), q.devices.end(), dev)) {
        return Misuse(s, kInvalidArgument,
                      "ncclCommInitAll: device " + std::to_string(dev) + " of rank " +
                          std::to_string(i) + " is out of range [0, 4) or repeated");
      }
      q.devices.push_back(dev);
    }
    q.live.assign(ndev, true);
    q.queued.resize(ndev);
    int id = s.next_clique++;
    s.cliques[id] = std::move(q);
    for (int i = 0; i < ndev; ++i) {
      comms[i] = reinterpret_cast<void*>(s.next_handle += 0x40);
      s.comms[comms[i]] = Comm{id, i, kSuccess};
    }
    s.journal.push_back("init clique=" + std::to_string(id) + " ndev=" + std::to_string(ndev));
    return kSuccess;
  });
}

int ncclCommDestroy(void* handle) {
  return Locked("ncclCommDestroy", [&](State& s) {
    Comm* comm = Find(s, handle);
    if (!comm) return Misuse(s, kInvalidArgument, "ncclCommDestroy: unknown communicator");
    const Clique& q = s.cliques.at(comm->clique);
    const bool pending = q.by_rank ? !q.queued[comm->rank].empty()
                                   : std::any_of(q.queued.begin(), q.queued.end(),
                                                 [](const auto& v) { return !v.empty(); });
    if (pending) {
      return Misuse(s, kInvalidUsage,
                    "ncclCommDestroy: " + Name(*comm) +
                        " while its clique has collectives pending (NCCL would hang); abort it");
    }
    s.journal.push_back("destroy " + Name(*comm));
    Retire(s, handle);
    return kSuccess;
  });
}

int ncclCommAbort(void* handle) {
  return Locked("ncclCommAbort", [&](State& s) {
    Comm* comm = Find(s, handle);
    if (!comm) return Misuse(s, kInvalidArgument, "ncclCommAbort: unknown communicator");
    Clique& q = s.cliques.at(comm->clique);
    if (q.by_rank) {  // the other ranks lose their connections to this one
      for (auto& [other, c] : s.comms) {
        if (other != handle && c.clique == comm->clique && c.async_error == kSuccess) {
          c.async_error = kRemoteError;
        }
      }
    }
    for (auto& queue : q.queued) queue.clear();  // pending work could never finish now
    s.journal.push_back("abort " + Name(*comm));
    Retire(s, handle);
    return kSuccess;
  });
}

int ncclCommGetAsyncError(void* handle, int* result) {
  return WithState([&](State& s) {
    Comm* comm = Find(s, handle);
    if (!comm || !result) {
      return Misuse(s, kInvalidArgument,
                    "ncclCommGetAsyncError: unknown communicator or null result");
    }
    int code = kSuccess;
    if (TakeInjected(s, "ncclCommGetAsyncError", &code)) comm->async_error = code;
    *result = AsyncState(s, *comm, /*poll=*/true);
    return kSuccess;
  });
}

int ncclCommCount(const void* comm, int* count) {
  return Query("ncclCommCount", comm, count,
               [](const Comm&, const Clique& q) { return static_cast<int>(q.devices.size()); });
}

int ncclCommUserRank(const void* comm, int* rank) {
  return Query("ncclCommUserRank", comm, rank, [](const Comm& c, const Clique&) { return c.rank; });
}

int ncclCommCuDevice(const void* comm, int* device) {
  return Query("ncclCommCuDevice", comm, device,
               [](const Comm& c, const Clique& q) { return q.devices[c.rank]; });
}

int ncclGroupStart() {
  return Locked("ncclGroupStart", [](State&) {
    ++ThisThreadsGroup().depth;
    return kSuccess;
  });
}

// Ends a group level; the outermost runs the group's collectives, all or (on a mismatch) none,
// and queues its sends and receives. An injected failure ends every level and drops the group's
// work, as a failed group in NCCL.
int ncclGroupEnd() {
  return WithState([&](State& s) {
    Group& group = ThisThreadsGroup();
    int code = kSuccess;
    const bool injected = TakeInjected(s, "ncclGroupEnd", &code);
    if (group.depth == 0)
      return injected ? code : Misuse(s, kInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    if (--group.depth > 0 && !injected) return kSuccess;
    group.depth = 0;
    const bool ran = RunGroups(s, std::exchange(group.cliques, {}), /*run=*/!injected);
    auto p2p = std::exchange(group.p2p, {});
    if (injected) return code;
    int result = ran ? kSuccess : kInvalidUsage;
    for (auto& [handle, items] : p2p) {
      const int queued = QueueGroup(s, handle, std::move(items));
      // The first failure, else ncclInProgress if any comm is still busy.
      if (result == kSuccess || (result == kInProgress && queued != kSuccess)) result = queued;
    }
    return result;
  });
}

int ncclReduce(const void* send, void* recv, size_t count, int datatype, int op, int root,
               void* comm, void* stream) {
  return Enqueue("ncclReduce",
                 Call{Kind::kReduce, send, recv, count, datatype, op, root, stream, {}}, comm);
}

int ncclBroadcast(const void* send, void* recv, size_t count, int datatype, int root, void* comm,
                  void* stream) {
  return Enqueue("ncclBroadcast",
                 Call{Kind::kBroadcast, send, recv, count, datatype, -1, root, stream, {}}, comm);
}

int ncclAllReduce(const void* send, void* recv, size_t count, int datatype, int op, void* comm,
                  void* stream) {
  return Enqueue("ncclAllReduce",
                 Call{Kind::kAllReduce, send, recv, count, datatype, op, -1, stream, {}}, comm);
}

int ncclAllGather(const void* send, void* recv, size_t send_count, int datatype, void* comm,
                  void* stream) {
  return Enqueue("ncclAllGather",
                 Call{Kind::kAllGather, send, recv, send_count, datatype, -1, -1, stream, {}},
                 comm);
}

// ---- Test-only inspection. ----

// The journal since the last read, one line per executed collective per rank ("reduce clique=1
// rank=0 dev=0 count=100 dtype=7 op=0 root=0 stream=0x0"; broadcast has no op=, allreduce no
// root=, allgather neither), plus "init clique=1 ndev=2", "init clique=2 rank=0 nranks=2 dev=0
// blocking=0 name=sparsync", "send clique=2 rank=0 peer=1 bytes=16", "finalize clique=2 rank=0",
// "destroy clique=1 rank=0", "abort clique=1 rank=0" and "fail ncclReduce". Copies what fits,
// NUL-terminated, and clears it; returns its full length. A null buf only measures it.
size_t sparsync_fake_nccl_journal(char* buf, size_t len) {
  return WithState([&](State& s) { return CopyOut(s.journal, buf, len); });
}

// Misuse since the last read, one a line, as the journal; returns its length (0: none).
size_t sparsync_fake_nccl_misuse(char* buf, size_t len) {
  return WithState([&](State& s) { return CopyOut(s.misuse, buf, len); });
}

// Communicators made and not yet destroyed or aborted.
int sparsync_fake_nccl_live_comms(void) {
  return WithState([&](State& s) { return static_cast<int>(s.comms.size()); });
}

// The next call named `call` ("ncclReduce", "ncclGroupEnd", ...) returns `result` without doing
// its work. For "ncclCommGetAsyncError" it succeeds and reports `result`, from then on, as that
// comm's async error. A later injection for the same name replaces an unused one.
void sparsync_fake_nccl_fail_next(const char* call, int result) {
  if (call) WithState([&](State& s) { return s.fail_next[call] = result; });
}

// From now on, the work of every call on a non-blocking communicator stays "in progress" for
// `polls` more ncclCommGetAsyncError calls after it could have run (0, the default: none).
void sparsync_fake_nccl_set_enqueue_polls(int polls) {
  WithState([&](State& s) { return s.enqueue_polls = std::max(polls, 0); });
}

}  // extern "C"
#pragma GCC visibility pop
