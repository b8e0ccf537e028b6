// The fake NCCL's engine: argument checks, matching the ranks' queued work, and running it on the
// fake CUDA runtime's memory (host memory of this process). fake_nccl.cc describes the model.
#include <dlfcn.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <limits>

#include "tests/support/fake_nccl/fake_nccl_elements.h"
#include "tests/support/fake_nccl/fake_nccl_state.h"

namespace sparsync::fake_nccl {
namespace {

thread_local Group this_threads_group;
thread_local std::string last_error;

const char* KindName(Kind k) {
  switch (k) {
    case Kind::kReduce:
      return "reduce";
    case Kind::kBroadcast:
      return "broadcast";
    case Kind::kAllReduce:
      return "allreduce";
    case Kind::kAllGather:
      return "allgather";
    case Kind::kGroup:
      return "group";
  }
  return "?";
}

bool HasOp(Kind k) { return k == Kind::kReduce || k == Kind::kAllReduce; }
bool HasRoot(Kind k) { return k == Kind::kReduce || k == Kind::kBroadcast; }

std::string Params(const Call& c) {
  std::string p = "count=" + std::to_string(c.count) + " dtype=" + std::to_string(c.dtype);
  if (HasOp(c.kind)) p += " op=" + std::to_string(c.op);
  if (HasRoot(c.kind)) p += " root=" + std::to_string(c.root);
  return p;
}

bool AllQueued(const Clique& q) {
  return std::none_of(q.queued.begin(), q.queued.end(), [](const auto& v) { return v.empty(); });
}

bool AllJoined(const Clique& q) {
  return std::all_of(q.joined.begin(), q.joined.end(), [](bool j) { return j; });
}

bool IsGroup(const std::deque<Call>& queue) {
  return !queue.empty() && queue.front().kind == Kind::kGroup;
}

void DropQueued(Clique& q) {
  for (auto& queue : q.queued) queue.clear();
}

// Runs the first queued collective of every rank of clique `id`: every read into a temporary,
// then every write. REQUIRES: every rank has one, and they match.
void ExecuteHead(State& s, int id, Clique& q) {
  std::vector<Call> calls;
  for (auto& queue : q.queued) {
    calls.push_back(queue.front());
    queue.pop_front();
  }
  const Call& c = calls[0];
  const size_t bytes = c.count * kDatatypeBytes[c.dtype];
  const size_t out_bytes = c.kind == Kind::kAllGather ? bytes * calls.size() : bytes;
  std::vector<unsigned char> result(out_bytes);
  if (bytes && c.kind == Kind::kBroadcast) {
    std::memcpy(result.data(), calls[c.root].send, bytes);
  } else if (bytes && c.kind == Kind::kAllGather) {
    for (size_t r = 0; r < calls.size(); ++r) {
      std::memcpy(result.data() + r * bytes, calls[r].send, bytes);
    }
  } else if (bytes) {
    std::vector<const unsigned char*> in;
    for (const Call& r : calls) in.push_back(static_cast<const unsigned char*>(r.send));
    kCombine[c.dtype](in, c.count, c.op, result.data());
  }
  for (size_t r = 0; r < calls.size(); ++r) {
    bool writes = c.kind != Kind::kReduce || static_cast<int>(r) == c.root;
    if (bytes && writes) std::memcpy(calls[r].recv, result.data(), out_bytes);
    char stream[32];
    std::snprintf(stream, sizeof stream, "0x%" PRIxPTR,
                  reinterpret_cast<uintptr_t>(calls[r].stream));
    s.journal.push_back(std::string(KindName(c.kind)) + " clique=" + std::to_string(id) +
                        " rank=" + std::to_string(r) + " dev=" + std::to_string(q.devices[r]) +
                        " " + Params(calls[r]) + " stream=" + stream);
  }
  ++q.executed;
}

// Whether every rank of clique `id` queued the same collectives: all of them when `whole`, else
// as far as every rank has got. The first difference is recorded as misuse of `caller`.
bool Matches(State& s, int id, const Clique& q, bool whole, const char* caller) {
  size_t longest = 0, shortest = std::numeric_limits<size_t>::max();
  for (const auto& queue : q.queued) {
    longest = std::max(longest, queue.size());
    shortest = std::min(shortest, queue.size());
  }
  const std::string where = std::string(caller) + ": clique=" + std::to_string(id) + " rank=";
  for (size_t k = 0; k < (whole ? longest : shortest); ++k) {
    const std::string which = " collective #" + std::to_string(q.executed + k);
    size_t first = 0;
    while (q.queued[first].size() <= k) ++first;  // some rank has collective k
    const Call& want = q.queued[first][k];
    for (size_t r = 0; r < q.queued.size(); ++r) {
      if (q.queued[r].size() <= k) {
        Misuse(s, kInvalidUsage,
               where + std::to_string(r) + " did not join" + which + " (" + Describe(want) +
                   "); NCCL would hang");
        return false;
      }
      if (Describe(want) != Describe(q.queued[r][k])) {  // kind, count, dtype, op, root
        Misuse(s, kInvalidUsage,
               where + std::to_string(r) + which + " is " + Describe(q.queued[r][k]) +
                   " but rank " + std::to_string(first) + "'s is " + Describe(want));
        return false;
      }
    }
  }
  return true;
}

// Pairs the sends and receives of the groups at the heads of the ranks' queues: the k-th send
// from a to b with the k-th receive on b from a, which must have the same size. Copies the bytes
// of each pair and pops a group once all of its sends and receives are done. Sets *failed (and
// fails the clique) on a size mismatch.
bool MatchPointToPoint(State& s, int id, Clique& q, const char* caller, bool* failed) {
  bool moved = false;
  const int n = static_cast<int>(q.queued.size());
  for (int r = 0; r < n; ++r) {
    if (!IsGroup(q.queued[r])) continue;
    for (PointToPoint& out : q.queued[r].front().p2p) {
      const int p = out.peer;
      if (!out.send || out.done || !IsGroup(q.queued[p])) continue;
      auto& theirs = q.queued[p].front().p2p;
      auto in = std::find_if(theirs.begin(), theirs.end(), [&](const PointToPoint& x) {
        return !x.send && !x.done && x.peer == r;
      });
      if (in == theirs.end()) continue;
      const std::string pair = "clique=" + std::to_string(id) + " rank=" + std::to_string(r) +
                               " peer=" + std::to_string(p);
      if (in->bytes != out.bytes) {
        Misuse(s, kInvalidUsage,
               std::string(caller) + ": " + pair + ": a send of " + std::to_string(out.bytes) +
                   " bytes meets a receive of " + std::to_string(in->bytes) + "; NCCL would hang");
        FailClique(s, q, kInvalidUsage);
        *failed = true;
        return moved;
      }
      if (out.bytes) std::memmove(in->to, out.from, out.bytes);
      out.done = in->done = true;
      moved = true;
      s.journal.push_back("send " + pair + " bytes=" + std::to_string(out.bytes));
    }
  }
  for (auto& queue : q.queued) {
    if (IsGroup(queue) && std::all_of(queue.front().p2p.begin(), queue.front().p2p.end(),
                                      [](const PointToPoint& x) { return x.done; })) {
      queue.pop_front();
      moved = true;
    }
  }
  return moved;
}

void BindCudart(State& s) {
  if (s.device_of != nullptr) return;
  // By soname: finds the fake runtime if (and only if) the process has loaded it.
  void* cudart = dlopen("libsparsync_fake_cudart.so", RTLD_NOW | RTLD_NOLOAD);
  if (cudart == nullptr) return;
  s.device_of =
      reinterpret_cast<int (*)(const void*, size_t)>(dlsym(cudart, "sparsync_fake_cuda_device_of"));
  s.get_device = reinterpret_cast<int (*)(int*)>(dlsym(cudart, "cudaGetDevice"));
}

}  // namespace

State& S() {
  static State* state = new State;  // never destroyed: threads may call at exit
  return *state;
}

Group& ThisThreadsGroup() { return this_threads_group; }

int Misuse(State& s, int code, std::string what) {
  last_error = what;
  s.misuse.push_back(std::move(what));
  return code;
}

bool TakeInjected(State& s, const char* call, int* code) {
  auto it = s.fail_next.find(call);
  if (it == s.fail_next.end()) return false;
  *code = it->second;
  s.fail_next.erase(it);
  s.journal.push_back(std::string("fail ") + call);
  last_error = std::string("injected failure of ") + call;
  return true;
}

const char* LastError() { return last_error.c_str(); }

Comm* Find(State& s, const void* comm) {
  auto it = s.comms.find(comm);
  return it == s.comms.end() ? nullptr : &it->second;
}

std::string Name(const Comm& c) {
  return "clique=" + std::to_string(c.clique) + " rank=" + std::to_string(c.rank);
}

std::string Describe(const Call& c) { return std::string(KindName(c.kind)) + " " + Params(c); }

int AsyncState(State& s, Comm& comm, bool poll) {
  if (comm.async_error != kSuccess) return comm.async_error;
  const Clique& q = s.cliques.at(comm.clique);
  bool busy = (q.by_rank && !AllJoined(q)) || !q.queued[comm.rank].empty();
  if (!busy && comm.polls_left > 0) {
    if (poll) --comm.polls_left;
    busy = true;
  }
  return busy ? kInProgress : kSuccess;
}

int CheckIdle(State& s, Comm& comm, const std::string& where) {
  if (comm.finalized) return Misuse(s, kInvalidUsage, where + " after ncclCommFinalize");
  if (AsyncState(s, comm, /*poll=*/false) == kInProgress) {
    return Misuse(s, kInvalidUsage,
                  where +
                      ": the previous call is still in progress (wait until "
                      "ncclCommGetAsyncError no longer returns ncclInProgress)");
  }
  return kSuccess;
}

int Accepted(State& s, Comm& comm) {
  if (comm.blocking) return kSuccess;
  comm.polls_left = s.enqueue_polls;
  return AsyncState(s, comm, /*poll=*/false);
}

int Enqueue(const char* name, const Call& call, const void* handle) {
  return Locked(name, [&](State& s) {
    Comm* comm = Find(s, handle);
    if (!comm) return Misuse(s, kInvalidArgument, std::string(name) + ": unknown communicator");
    const int id = comm->clique;
    Clique& q = s.cliques.at(id);
    const int nranks = static_cast<int>(q.devices.size());
    const std::string where = std::string(name) + ": " + Name(*comm);
    if (comm->async_error != kSuccess) {
      return Misuse(s, comm->async_error,
                    where + " has async error " + std::to_string(comm->async_error) +
                        "; abort the communicator");
    }
    if (call.dtype < 0 || call.dtype >= kDatatypes)
      return Misuse(s, kInvalidArgument, where + " datatype " + std::to_string(call.dtype));
    if (HasOp(call.kind) && (call.op < 0 || call.op >= kOps))
      return Misuse(s, kInvalidArgument, where + " op " + std::to_string(call.op));
    if (HasRoot(call.kind) && (call.root < 0 || call.root >= nranks))
      return Misuse(s, kInvalidArgument, where + " root " + std::to_string(call.root));
    if (call.count > std::numeric_limits<size_t>::max() / kDatatypeBytes[call.dtype] / nranks)
      return Misuse(s, kInvalidArgument, where + " count " + std::to_string(call.count));
    const bool is_root = comm->rank == call.root;
    const bool reads = call.kind != Kind::kBroadcast || is_root;
    const bool writes = call.kind != Kind::kReduce || is_root;
    if (call.count > 0 && ((reads && !call.send) || (writes && !call.recv)))
      return Misuse(s, kInvalidArgument, where + " null buffer for " + Describe(call));
    const size_t bytes = call.count * kDatatypeBytes[call.dtype];
    const size_t out_bytes = call.kind == Kind::kAllGather ? bytes * nranks : bytes;
    // Whose memory: on a rank communicator, its device's (read from the runtime when it joined);
    // on an ncclCommInitAll clique, any device's (the callers' tests need not allocate on the
    // devices they name).
    const int device = q.by_rank ? q.devices[comm->rank] : -1;
    if ((reads && !OnDevice(s, call.send, bytes, device, where + " send buffer")) ||
        (writes && !OnDevice(s, call.recv, out_bytes, device, where + " receive buffer"))) {
      return kInvalidArgument;
    }
    auto dead = std::find(q.live.begin(), q.live.end(), false);
    if (dead != q.live.end()) {
      return Misuse(s, kInvalidUsage,
                    where + " " + Describe(call) + ": rank " +
                        std::to_string(dead - q.live.begin()) +
                        " is destroyed, so the collective could never complete");
    }
    Group& group = ThisThreadsGroup();
    if (q.by_rank) {
      if (group.depth > 0) {
        return Misuse(s, kInvalidUsage,
                      where +
                          ": the fake runs the collectives of a rank communicator outside "
                          "groups only");
      }
      if (int code = CheckIdle(s, *comm, where); code != kSuccess) return code;
      q.queued[comm->rank].push_back(call);
      Progress(s, id, q, name);
      return comm->async_error != kSuccess ? comm->async_error : Accepted(s, *comm);
    }
    q.queued[comm->rank].push_back(call);
    if (group.depth > 0) {
      group.cliques.insert(id);
      return kSuccess;
    }
    if (!Matches(s, id, q, /*whole=*/false, name)) {
      DropQueued(q);
      return kInvalidUsage;
    }
    while (AllQueued(q)) ExecuteHead(s, id, q);
    return kSuccess;
  });
}

void Progress(State& s, int id, Clique& q, const char* caller) {
  if (!AllJoined(q)) return;
  for (bool moved = true; moved;) {
    moved = false;
    if (AllQueued(q) && std::none_of(q.queued.begin(), q.queued.end(), IsGroup)) {
      if (!Matches(s, id, q, /*whole=*/false, caller)) {
        FailClique(s, q, kInvalidUsage);
        return;
      }
      ExecuteHead(s, id, q);
      moved = true;
    }
    bool failed = false;
    moved = MatchPointToPoint(s, id, q, caller, &failed) || moved;
    if (failed) return;
  }
}

bool RunGroups(State& s, const std::set<int>& ids, bool run) {
  bool ok = run;
  for (int id : ids) {
    auto it = s.cliques.find(id);
    if (ok && it != s.cliques.end()) {
      ok = Matches(s, id, it->second, /*whole=*/true, "ncclGroupEnd");
    }
  }
  for (int id : ids) {
    auto it = s.cliques.find(id);
    if (it == s.cliques.end()) continue;
    if (!ok) DropQueued(it->second);
    while (AllQueued(it->second)) ExecuteHead(s, id, it->second);
  }
  return ok;
}

int QueueGroup(State& s, const void* handle, std::vector<PointToPoint> p2p) {
  Comm* comm = Find(s, handle);
  if (!comm) {
    return Misuse(s, kInvalidArgument, "ncclGroupEnd: a communicator of the group is gone");
  }
  if (comm->async_error != kSuccess) return comm->async_error;
  Clique& q = s.cliques.at(comm->clique);
  q.queued[comm->rank].push_back(
      Call{Kind::kGroup, nullptr, nullptr, 0, 0, -1, -1, nullptr, std::move(p2p)});
  Progress(s, comm->clique, q, "ncclGroupEnd");
  return comm->async_error != kSuccess ? comm->async_error : Accepted(s, *comm);
}

void Retire(State& s, const void* handle) {
  const Comm comm = s.comms.at(handle);
  s.comms.erase(handle);
  Clique& q = s.cliques.at(comm.clique);
  q.live[comm.rank] = false;
  const bool last = std::none_of(s.comms.begin(), s.comms.end(),
                                 [&](const auto& c) { return c.second.clique == comm.clique; });
  if (!last) return;
  if (q.by_rank) {
    s.joining.erase(q.unique_id);
    s.retired.insert(q.unique_id);
  }
  s.cliques.erase(comm.clique);
}

void FailClique(State& s, Clique& q, int code) {
  for (auto& [handle, comm] : s.comms) {
    if (&s.cliques.at(comm.clique) == &q && comm.async_error == kSuccess) comm.async_error = code;
  }
  DropQueued(q);
}

bool OnDevice(State& s, const void* p, size_t bytes, int device, const std::string& where) {
  BindCudart(s);
  if (bytes == 0 || s.device_of == nullptr) return true;
  const int holder = s.device_of(p, bytes);
  if (holder < 0) {
    Misuse(s, kInvalidArgument,
           where + ": " + std::to_string(bytes) + " bytes that are not CUDA device memory");
    return false;
  }
  if (device >= 0 && holder != device) {
    Misuse(s, kInvalidArgument,
           where + " is memory of CUDA device " + std::to_string(holder) +
               ", but the communicator's rank is on device " + std::to_string(device));
    return false;
  }
  return true;
}

int CurrentDevice(State& s) {
  BindCudart(s);
  int device = -1;
  if (s.get_device == nullptr || s.get_device(&device) != kSuccess) return -1;
  return device;
}

}  // namespace sparsync::fake_nccl
