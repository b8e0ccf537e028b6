// The fake NCCL's state and its engine (fake_nccl_engine.cc), shared by the two halves of its C
// API: fake_nccl.cc (ncclCommInitAll, groups and the collectives) and fake_nccl_rank.cc
// (ncclCommInitRankConfig, point-to-point and the non-blocking state, for the NCCL transport).
// Everything here runs under State::mu.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace sparsync::fake_nccl {

// Codes of ncclResult_t (nccl.h) that the fake returns itself; an injected failure may be any.
constexpr int kSuccess = 0;
constexpr int kInvalidArgument = 4;
constexpr int kInvalidUsage = 5;
constexpr int kRemoteError = 6;
constexpr int kInProgress = 7;

constexpr int kVersion = 22803;  // 2.28.3, as NCCL_VERSION_CODE spells it
constexpr int kDevices = 4;      // as many as the fake CUDA runtime reports

enum class Kind { kReduce, kBroadcast, kAllReduce, kAllGather, kGroup };

// One ncclSend or ncclRecv of a group.
struct PointToPoint {
  bool send = false;
  int peer = 0;
  const void* from = nullptr;  // send
  void* to = nullptr;          // recv
  size_t bytes = 0;
  bool done = false;
};

// One queued operation of a rank: a collective, or (kGroup) a group's sends and receives.
struct Call {
  Kind kind;
  const void* send;
  void* recv;
  size_t count;
  int dtype;
  int op;    // -1 for broadcast and allgather
  int root;  // -1 for allreduce and allgather
  void* stream;
  std::vector<PointToPoint> p2p;  // kGroup
};

struct Clique {
  std::vector<int> devices;              // by rank; -1 when unknown
  std::vector<bool> live;                // by rank: not yet destroyed or aborted
  std::vector<std::deque<Call>> queued;  // by rank: work waiting for the other ranks
  uint64_t executed = 0;                 // collectives run so far; numbers the next one
  // Made by ncclCommInitRankConfig: one rank per caller (thread), joining one by one through
  // `unique_id`; collectives run outside groups, sends and receives in them. Otherwise made
  // whole by ncclCommInitAll and driven from one thread, in groups.
  bool by_rank = false;
  std::vector<bool> joined;  // by_rank: the ranks that have called ncclCommInitRankConfig
  std::string unique_id;
};

struct Comm {
  int clique = 0;
  int rank = 0;
  int async_error = kSuccess;  // sticky once set
  bool blocking = true;
  bool finalized = false;
  int polls_left = 0;  // ncclCommGetAsyncError polls that still report ncclInProgress
};

struct State {
  std::mutex mu;
  std::map<const void*, Comm> comms;  // by handle: opaque, never dereferenced, never reused
  std::map<int, Clique> cliques;
  std::map<std::string, int> joining;    // unique id -> its clique, while that lives
  std::set<std::string> retired;         // unique ids of communicators that are gone
  std::map<std::string, int> fail_next;  // call name -> result to return once
  std::vector<std::string> journal;
  std::vector<std::string> misuse;
  int enqueue_polls = 0;  // sparsync_fake_nccl_set_enqueue_polls
  // The fake CUDA runtime's test hooks, once it is loaded (see OnDevice).
  int (*device_of)(const void* ptr, size_t bytes) = nullptr;
  int (*get_device)(int* device) = nullptr;
  int next_clique = 1;
  uint64_t next_unique_id = 1;
  uintptr_t next_handle = 0x5ca1ab1e0000;  // so a stale handle cannot alias a newer comm
};

State& S();

// The calling thread's open group: its nesting, the ncclCommInitAll cliques it queued
// collectives on, and the sends and receives it queued, by rank communicator.
struct Group {
  int depth = 0;
  std::set<int> cliques;
  std::map<const void*, std::vector<PointToPoint>> p2p;
};
Group& ThisThreadsGroup();

// Records `what` as misuse and as the calling thread's last error; returns `code`.
int Misuse(State& s, int code, std::string what);
// True, with *code set, when a failure was injected for `call`.
bool TakeInjected(State& s, const char* call, int* code);
// The calling thread's last error (ncclGetLastError): its last misuse or injected failure.
const char* LastError();

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

Comm* Find(State& s, const void* comm);
std::string Name(const Comm& c);
// Everything the ranks of a collective must agree on.
std::string Describe(const Call& c);

// kSuccess; ncclInProgress while `comm`'s rank has work queued, its clique is still joining, or
// an injected delay lasts; or its async error. Counts the delay down when `poll`.
int AsyncState(State& s, Comm& comm, bool poll);
// Misuse unless `comm` (a rank communicator) may take a new call: not finalised, and its last call
// no longer in progress. `where` names the call.
int CheckIdle(State& s, Comm& comm, const std::string& where);
// What a call that queued work on `comm` returns: kSuccess on a blocking comm, else its
// AsyncState. Starts the injected delay (enqueue_polls).
int Accepted(State& s, Comm& comm);

// Checks a collective's arguments and queues it on `handle`'s rank (runs it when it can).
int Enqueue(const char* name, const Call& call, const void* handle);
// Runs the queued work of rank-communicator clique `id` as far as it can go.
void Progress(State& s, int id, Clique& q, const char* caller);
// At the outermost ncclGroupEnd: matches and runs the groups of ncclCommInitAll cliques `ids`
// (all their ranks' work, or none; none when not `run`); false on a mismatch (recorded as
// misuse) or when not `run`.
bool RunGroups(State& s, const std::set<int>& ids, bool run);
// Appends a group's sends and receives to `handle`'s rank and runs what it can.
int QueueGroup(State& s, const void* handle, std::vector<PointToPoint> p2p);
// Forgets the comm of `handle`; its clique goes with its last comm.
void Retire(State& s, const void* handle);
// Fails every live comm of `q` with `code` (an async error) and drops its queued work.
void FailClique(State& s, Clique& q, int code);
// Whether [p, p + bytes) is memory of CUDA device `device` (any device when -1) of the fake CUDA
// runtime, when that is loaded in the process (else it cannot tell, and says yes). Records a
// misuse of `where` when not.
bool OnDevice(State& s, const void* p, size_t bytes, int device, const std::string& where);
// The fake CUDA runtime's current device of the calling thread; -1 when it is not loaded.
int CurrentDevice(State& s);

}  // namespace sparsync::fake_nccl
