// A fake NCCL for CPU-only machines: the single-process subset of libnccl's C API that the daemon
// uses to reduce one node's GPUs (ncclCommInitAll, ncclReduce / ncclBroadcast / ncclAllReduce
// inside ncclGroupStart / ncclGroupEnd), loaded through SPARSYNC_LIBNCCL in place of libnccl.so.2.
// Device buffers come from the fake CUDA runtime (tests/support/fake_cudart), which is host memory
// mapped in this process, so collectives read and write them directly and finish before returning.
//
//   communicators  ncclCommInitAll makes a "clique" of ndev ranks (devices 0..3, distinct);
//                  comms[i] is rank i on devlist[i].
//   collectives    queued on the clique and run once every rank has queued the same sequence:
//                  at the outermost ncclGroupEnd, or at once outside a group. Ranks are combined
//                  in rank order; every rank's inputs are read before any output is written, so
//                  in-place and aliased buffers are safe. Half types are computed in float and
//                  rounded to nearest even once, when stored. Avg is the sum divided by nranks.
//
// It is stricter than NCCL where a real run would hang or corrupt memory silently: a group that
// leaves a rank out of a collective, or whose ranks disagree on kind, count, datatype, op or root,
// fails with ncclInvalidUsage and none of its work runs; collectives on a clique with a destroyed
// rank, ncclCommDestroy while collectives are pending, ncclGroupEnd without ncclGroupStart, and
// unknown comms, datatypes, ops, roots or null buffers fail and are listed as misuse
// (sparsync_fake_nccl_misuse). Every executed collective, once per rank, is appended to a journal
// (sparsync_fake_nccl_journal); sparsync_fake_nccl_fail_next injects a failure into the next call
// of a given name. ncclCommGetAsyncError reports an injected async error until the comm is
// aborted, and collectives on such a comm are refused. Handles are never reused, so a destroyed
// comm stays unknown.
#include <algorithm>
#include <bit>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <iterator>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

// Codes of ncclResult_t (nccl.h) that the fake returns itself; an injected failure may be any.
constexpr int kSuccess = 0;
constexpr int kInvalidArgument = 4;
constexpr int kInvalidUsage = 5;
constexpr const char* kResultText[] = {"no error",
                                       "unhandled cuda error",
                                       "unhandled system error",
                                       "internal error",
                                       "invalid argument",
                                       "invalid usage",
                                       "remote process exited or there was a network error",
                                       "NCCL operation in progress"};

constexpr int kVersion = 22803;  // 2.28.3, as NCCL_VERSION_CODE spells it
constexpr int kDevices = 4;      // as many as the fake CUDA runtime reports
constexpr int kDatatypes = 10;   // ncclInt8 .. ncclBfloat16
constexpr size_t kDatatypeBytes[kDatatypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
enum Op { kSum = 0, kProd = 1, kMax = 2, kMin = 3, kAvg = 4, kOps = 5 };

enum class Kind { kReduce, kBroadcast, kAllReduce };

struct Call {
  Kind kind;
  const void* send;
  void* recv;
  size_t count;
  int dtype;
  int op;    // -1 for broadcast
  int root;  // -1 for allreduce
  void* stream;
};

struct Clique {
  std::vector<int> devices;              // by rank
  std::vector<bool> live;                // by rank: not yet destroyed or aborted
  std::vector<std::deque<Call>> queued;  // by rank: collectives waiting for the other ranks
  uint64_t executed = 0;                 // collectives run so far; numbers the next one
};

struct Comm {
  int clique = 0;
  int rank = 0;
  int async_error = kSuccess;  // sticky once injected
};

struct State {
  std::mutex mu;
  std::map<const void*, Comm> comms;  // by handle: opaque, never dereferenced, never reused
  std::map<int, Clique> cliques;
  std::map<std::string, int> fail_next;  // call name -> result to return once
  std::vector<std::string> journal;
  std::vector<std::string> misuse;
  int next_clique = 1;
  uintptr_t next_handle = 0x5ca1ab1e0000;  // so a stale handle cannot alias a newer comm
};

State& S() {
  static State* state = new State;  // never destroyed: threads may call at exit
  return *state;
}

// ncclGroupStart nesting, and the cliques that this thread's open group queued work on.
thread_local int group_depth = 0;
thread_local std::set<int> group_cliques;

int Misuse(State& s, int code, std::string what) {  // REQUIRES: s.mu held
  s.misuse.push_back(std::move(what));
  return code;
}

// True, with *code set, when a failure was injected for `call`. REQUIRES: s.mu held.
bool TakeInjected(State& s, const char* call, int* code) {
  auto it = s.fail_next.find(call);
  if (it == s.fail_next.end()) return false;
  *code = it->second;
  s.fail_next.erase(it);
  s.journal.push_back(std::string("fail ") + call);
  return true;
}

template <typename F>
auto WithState(F body) {
  State& s = S();
  std::lock_guard lock(s.mu);
  return body(s);
}

// Runs body(s) under the lock, unless a failure was injected for `call`.
template <typename F>
int Locked(const char* call, F body) {
  return WithState([&](State& s) {
    int code = kSuccess;
    return TakeInjected(s, call, &code) ? code : body(s);
  });
}

Comm* Find(State& s, const void* comm) {  // REQUIRES: s.mu held
  auto it = s.comms.find(comm);
  return it == s.comms.end() ? nullptr : &it->second;
}

std::string Name(const Comm& c) {
  return "clique=" + std::to_string(c.clique) + " rank=" + std::to_string(c.rank);
}

const char* KindName(Kind k) {
  return k == Kind::kReduce ? "reduce" : k == Kind::kBroadcast ? "broadcast" : "allreduce";
}

std::string Params(const Call& c) {
  std::string p = "count=" + std::to_string(c.count) + " dtype=" + std::to_string(c.dtype);
  if (c.kind != Kind::kBroadcast) p += " op=" + std::to_string(c.op);
  if (c.kind != Kind::kAllReduce) p += " root=" + std::to_string(c.root);
  return p;
}

// Everything the ranks of a collective must agree on.
std::string Describe(const Call& c) { return std::string(KindName(c.kind)) + " " + Params(c); }

// ---- Elements: stored types and the types they are combined in. ----

float HalfToFloat(uint16_t h) {
  int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  float v = exp == 31  ? (mant ? std::numeric_limits<float>::quiet_NaN() : HUGE_VALF)
            : exp == 0 ? std::ldexp(static_cast<float>(mant), -24)  // zero or subnormal
                       : std::ldexp(static_cast<float>(mant | 0x400), exp - 25);
  return h & 0x8000 ? -v : v;
}

uint16_t FloatToHalf(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f), a = x & 0x7fffffff;
  auto sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  if (a > 0x7f800000) return sign | 0x7e00;    // NaN: a quiet NaN
  if (a >= 0x477ff000) return sign | 0x7c00;   // 65520 and above round to infinity
  if (a < 0x38800000) {                        // below 2^-14: a subnormal half, in units of 2^-24
    float units = std::fabs(f) * 16777216.0f;  // exact: scaling by a power of two
    return sign | static_cast<uint16_t>(std::nearbyint(units));  // to nearest even
  }
  uint32_t h = (a >> 13) - ((127 - 15) << 10);  // rebias the exponent, keep 10 mantissa bits
  uint32_t dropped = a & 0x1fff;
  if (dropped > 0x1000 || (dropped == 0x1000 && (h & 1))) ++h;  // a carry may reach the exponent
  return sign | static_cast<uint16_t>(h);
}

float Bf16ToFloat(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

uint16_t FloatToBf16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((x >> 16) | 0x0040);  // quiet
  x += 0x7fff + ((x >> 16) & 1);  // to nearest even; an overflow carries into infinity
  return static_cast<uint16_t>(x >> 16);
}

template <typename A>
A Identity(A v) {
  return v;
}

// Elements stored as T, combined as A. Integers wrap around on overflow, as NCCL's do (through
// unsigned arithmetic, so without undefined behaviour); a NaN propagates through max and min.
template <typename T, typename A = T, A (*Widen)(T) = &Identity<T>, T (*Narrow)(A) = &Identity<T>>
struct Codec {
  using Acc = A;
  using Bits = typename std::conditional_t<std::is_integral_v<A>, std::make_unsigned<A>,
                                           std::type_identity<A>>::type;
  static Acc Load(const unsigned char* p, size_t i) {
    T v;
    std::memcpy(&v, p + i * sizeof(T), sizeof(T));
    return Widen(v);
  }
  static void Store(unsigned char* p, size_t i, Acc v) {
    T t = Narrow(v);
    std::memcpy(p + i * sizeof(T), &t, sizeof(T));
  }
  static Acc Add(Acc a, Acc b) { return Acc(Bits(a) + Bits(b)); }
  static Acc Mul(Acc a, Acc b) { return Acc(Bits(a) * Bits(b)); }
  static Acc Max(Acc a, Acc b) { return EitherNan(a, b) ? a + b : (a < b ? b : a); }
  static Acc Min(Acc a, Acc b) { return EitherNan(a, b) ? a + b : (b < a ? b : a); }
  static bool EitherNan(Acc a, Acc b) {
    if constexpr (std::is_floating_point_v<Acc>) return std::isnan(a) || std::isnan(b);
    return false;
  }
};

// out[i] = op over the ranks' in[r][i], combined in rank order.
template <typename C>
void Combine(const std::vector<const unsigned char*>& in, size_t count, int op,
             unsigned char* out) {
  using Acc = typename C::Acc;
  const int n = static_cast<int>(in.size());
  for (size_t i = 0; i < count; ++i) {
    Acc acc = C::Load(in[0], i);
    for (int r = 1; r < n; ++r) {
      Acc v = C::Load(in[r], i);
      acc = op == kProd  ? C::Mul(acc, v)
            : op == kMax ? C::Max(acc, v)
            : op == kMin ? C::Min(acc, v)
                         : C::Add(acc, v);  // kSum, kAvg
    }
    C::Store(out, i, op == kAvg ? Acc(acc / Acc(n)) : acc);
  }
}

using CombineFn = void (*)(const std::vector<const unsigned char*>&, size_t, int, unsigned char*);

// By ncclDataType_t; the half types are combined in float and rounded once, when stored.
constexpr CombineFn kCombine[kDatatypes] = {
    &Combine<Codec<int8_t>>,
    &Combine<Codec<uint8_t>>,
    &Combine<Codec<int32_t>>,
    &Combine<Codec<uint32_t>>,
    &Combine<Codec<int64_t>>,
    &Combine<Codec<uint64_t>>,
    &Combine<Codec<uint16_t, float, &HalfToFloat, &FloatToHalf>>,
    &Combine<Codec<float>>,
    &Combine<Codec<double>>,
    &Combine<Codec<uint16_t, float, &Bf16ToFloat, &FloatToBf16>>};

// ---- Matching and execution. REQUIRES: s.mu held throughout. ----

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
  std::vector<unsigned char> result(bytes);
  if (bytes && c.kind == Kind::kBroadcast) {
    std::memcpy(result.data(), calls[c.root].send, bytes);
  } else if (bytes) {
    std::vector<const unsigned char*> in;
    for (const Call& r : calls) in.push_back(static_cast<const unsigned char*>(r.send));
    kCombine[c.dtype](in, c.count, c.op, result.data());
  }
  for (size_t r = 0; r < calls.size(); ++r) {
    bool writes = c.kind != Kind::kReduce || static_cast<int>(r) == c.root;
    if (bytes && writes) std::memcpy(calls[r].recv, result.data(), bytes);
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
        s.misuse.push_back(where + std::to_string(r) + " did not join" + which + " (" +
                           Describe(want) + "); NCCL would hang");
        return false;
      }
      if (Describe(want) != Describe(q.queued[r][k])) {  // kind, count, dtype, op, root
        s.misuse.push_back(where + std::to_string(r) + which + " is " + Describe(q.queued[r][k]) +
                           " but rank " + std::to_string(first) + "'s is " + Describe(want));
        return false;
      }
    }
  }
  return true;
}

bool AnyQueued(const Clique& q) {
  return std::any_of(q.queued.begin(), q.queued.end(), [](const auto& v) { return !v.empty(); });
}

bool AllQueued(const Clique& q) {
  return std::none_of(q.queued.begin(), q.queued.end(), [](const auto& v) { return v.empty(); });
}

void DropQueued(Clique& q) {
  for (auto& queue : q.queued) queue.clear();
}

int Enqueue(const char* name, const Call& call, const void* handle) {
  return Locked(name, [&](State& s) {
    Comm* comm = Find(s, handle);
    if (!comm) return Misuse(s, kInvalidArgument, std::string(name) + ": unknown communicator");
    Clique& q = s.cliques.at(comm->clique);
    const int nranks = static_cast<int>(q.devices.size());
    const std::string where = std::string(name) + ": " + Name(*comm);
    if (comm->async_error != kSuccess) {
      return Misuse(s, comm->async_error,
                    where + " has async error " + std::to_string(comm->async_error) +
                        "; abort the communicator");
    }
    if (call.dtype < 0 || call.dtype >= kDatatypes)
      return Misuse(s, kInvalidArgument, where + " datatype " + std::to_string(call.dtype));
    if (call.kind != Kind::kBroadcast && (call.op < 0 || call.op >= kOps))
      return Misuse(s, kInvalidArgument, where + " op " + std::to_string(call.op));
    if (call.kind != Kind::kAllReduce && (call.root < 0 || call.root >= nranks))
      return Misuse(s, kInvalidArgument, where + " root " + std::to_string(call.root));
    if (call.count > std::numeric_limits<size_t>::max() / kDatatypeBytes[call.dtype])
      return Misuse(s, kInvalidArgument, where + " count " + std::to_string(call.count));
    const bool is_root = comm->rank == call.root;
    const bool reads = call.kind != Kind::kBroadcast || is_root;
    const bool writes = call.kind != Kind::kReduce || is_root;
    if (call.count > 0 && ((reads && !call.send) || (writes && !call.recv)))
      return Misuse(s, kInvalidArgument, where + " null buffer for " + Describe(call));
    auto dead = std::find(q.live.begin(), q.live.end(), false);
    if (dead != q.live.end()) {
      return Misuse(s, kInvalidUsage,
                    where + " " + Describe(call) + ": rank " +
                        std::to_string(dead - q.live.begin()) +
                        " is destroyed, so the collective could never complete");
    }
    q.queued[comm->rank].push_back(call);
    if (group_depth > 0) {
      group_cliques.insert(comm->clique);
      return kSuccess;
    }
    if (!Matches(s, comm->clique, q, /*whole=*/false, name)) {
      DropQueued(q);
      return kInvalidUsage;
    }
    while (AllQueued(q)) ExecuteHead(s, comm->clique, q);
    return kSuccess;
  });
}

// Forgets the comm of `handle`; its clique goes with its last rank.
void Retire(State& s, const void* handle) {
  const Comm comm = s.comms.at(handle);
  s.comms.erase(handle);
  Clique& q = s.cliques.at(comm.clique);
  q.live[comm.rank] = false;
  if (std::find(q.live.begin(), q.live.end(), true) == q.live.end()) s.cliques.erase(comm.clique);
}

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
    if (AnyQueued(s.cliques.at(comm->clique))) {
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
    DropQueued(s.cliques.at(comm->clique));  // pending collectives could never finish now
    s.journal.push_back("abort " + Name(*comm));
    Retire(s, handle);
    return kSuccess;
  });
}

int ncclCommGetAsyncError(void* handle, int* result) {
  State& s = S();
  std::lock_guard lock(s.mu);
  Comm* comm = Find(s, handle);
  if (!comm || !result) {
    return Misuse(s, kInvalidArgument,
                  "ncclCommGetAsyncError: unknown communicator or null result");
  }
  int code = kSuccess;
  if (TakeInjected(s, "ncclCommGetAsyncError", &code)) comm->async_error = code;
  *result = comm->async_error;
  return kSuccess;
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
    ++group_depth;
    return kSuccess;
  });
}

// Ends a group level; the outermost runs the group's collectives, all or (on a mismatch) none.
// An injected failure ends every level and drops the group's work, as a failed group in NCCL.
int ncclGroupEnd() {
  State& s = S();
  std::lock_guard lock(s.mu);
  int code = kSuccess;
  const bool injected = TakeInjected(s, "ncclGroupEnd", &code);
  if (group_depth == 0)
    return injected ? code : Misuse(s, kInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--group_depth > 0 && !injected) return kSuccess;
  group_depth = 0;
  const std::set<int> ids = std::exchange(group_cliques, {});
  bool ok = !injected;
  for (int id : ids) {
    auto it = s.cliques.find(id);
    if (ok && it != s.cliques.end())
      ok = Matches(s, id, it->second, /*whole=*/true, "ncclGroupEnd");
  }
  for (int id : ids) {
    auto it = s.cliques.find(id);
    if (it == s.cliques.end()) continue;
    if (!ok) DropQueued(it->second);
    while (AllQueued(it->second)) ExecuteHead(s, id, it->second);
  }
  return injected ? code : ok ? kSuccess : kInvalidUsage;
}

int ncclReduce(const void* send, void* recv, size_t count, int datatype, int op, int root,
               void* comm, void* stream) {
  return Enqueue("ncclReduce", Call{Kind::kReduce, send, recv, count, datatype, op, root, stream},
                 comm);
}

int ncclBroadcast(const void* send, void* recv, size_t count, int datatype, int root, void* comm,
                  void* stream) {
  return Enqueue("ncclBroadcast",
                 Call{Kind::kBroadcast, send, recv, count, datatype, -1, root, stream}, comm);
}

int ncclAllReduce(const void* send, void* recv, size_t count, int datatype, int op, void* comm,
                  void* stream) {
  return Enqueue("ncclAllReduce",
                 Call{Kind::kAllReduce, send, recv, count, datatype, op, -1, stream}, comm);
}

// ---- Test-only inspection. ----

// The journal since the last read, one line per executed collective per rank ("reduce clique=1
// rank=0 dev=0 count=100 dtype=7 op=0 root=0 stream=0x0"; broadcast has no op=, allreduce no
// root=), plus "init clique=1 ndev=2", "destroy clique=1 rank=0", "abort clique=1 rank=0" and
// "fail ncclReduce". Copies what fits, NUL-terminated, and clears it; returns its full length.
// A null buf only measures it.
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

}  // extern "C"
#pragma GCC visibility pop
