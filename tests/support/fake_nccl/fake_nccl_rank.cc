// The fake NCCL's communicators of one rank per caller, for the NCCL transport: ncclGetUniqueId,
// ncclCommInitRankConfig with its ncclConfig_t, ncclCommFinalize, ncclSend and ncclRecv, and
// ncclGetLastError. fake_nccl.cc describes the model.
#include <algorithm>
#include <climits>
#include <cstring>
#include <string>

#include "tests/support/fake_nccl/fake_nccl_elements.h"
#include "tests/support/fake_nccl/fake_nccl_state.h"

namespace sparsync::fake_nccl {
namespace {

constexpr char kIdPrefix[] = "sparsync-fake-nccl-unique-id:";
constexpr unsigned kConfigMagic = 0xcafebeef;
constexpr int kUndefInt = INT_MIN;
constexpr unsigned kFirstConfigVersion = 21400;  // NCCL 2.14: ncclConfig_t and `blocking`

struct UniqueId {  // ncclUniqueId
  char internal[128];
};

// ncclConfig_t as far as the fake reads it (through commName), with NCCL_CONFIG_INITIALIZER's
// values; NCCL's later fields would follow.
struct Config {
  size_t size = sizeof(Config);
  unsigned magic = kConfigMagic;
  unsigned version = kVersion;
  int blocking = kUndefInt;
  int cga_cluster_size = kUndefInt;
  int min_ctas = kUndefInt;
  int max_ctas = kUndefInt;
  const char* net_name = nullptr;
  int split_share = kUndefInt;
  int traffic_class = kUndefInt;
  const char* comm_name = nullptr;
};

// As NCCL reads a caller's config: the caller's `size` bytes (at most the fake's) over the
// defaults, a magic that must match, and `blocking` ignored before 2.14.
int ReadConfig(State& s, const void* caller, Config* config) {
  if (caller == nullptr) return kSuccess;
  size_t size = 0;
  std::memcpy(&size, caller, sizeof(size));
  std::memcpy(static_cast<void*>(config), caller, std::min(size, sizeof(Config)));
  if (config->magic != kConfigMagic) {
    return Misuse(s, kInvalidArgument,
                  "ncclCommInitRankConfig: the config was not made by NCCL_CONFIG_INITIALIZER "
                  "(magic " +
                      std::to_string(config->magic) + ")");
  }
  if (config->version < kFirstConfigVersion) config->blocking = kUndefInt;
  if (config->blocking != kUndefInt && config->blocking != 0 && config->blocking != 1) {
    return Misuse(s, kInvalidArgument,
                  "ncclCommInitRankConfig: blocking " + std::to_string(config->blocking));
  }
  return kSuccess;
}

// The clique that unique id `key` names, made when its first rank joins.
int CliqueFor(State& s, const std::string& key, int nranks) {
  auto it = s.joining.find(key);
  if (it != s.joining.end()) return it->second;
  Clique q;
  q.by_rank = true;
  q.devices.assign(nranks, -1);
  q.live.assign(nranks, true);
  q.joined.assign(nranks, false);
  q.queued.resize(nranks);
  q.unique_id = key;
  const int id = s.next_clique++;
  s.cliques[id] = std::move(q);
  s.joining[key] = id;
  return id;
}

int InitRank(State& s, void** handle, int nranks, const UniqueId& id, int rank,
             const void* caller_config) {
  const std::string where = "ncclCommInitRankConfig: rank " + std::to_string(rank);
  Config config;
  if (int code = ReadConfig(s, caller_config, &config); code != kSuccess) return code;
  if (!handle) return Misuse(s, kInvalidArgument, where + ": null comm");
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    return Misuse(s, kInvalidArgument, where + " of " + std::to_string(nranks));
  }
  const std::string key(id.internal, sizeof(id.internal));
  if (key.compare(0, sizeof(kIdPrefix) - 1, kIdPrefix) != 0) {
    return Misuse(s, kInvalidArgument, where + ": not a unique id of ncclGetUniqueId");
  }
  if (s.retired.count(key)) {
    return Misuse(
        s, kInvalidUsage,
        where + ": the unique id belongs to a communicator that is gone; NCCL would hang");
  }
  const bool blocking = config.blocking != 0;  // NCCL's default is blocking
  if (blocking && nranks > 1) {
    return Misuse(s, kInvalidUsage,
                  where +
                      ": the fake joins ranks of more than one only non-blocking "
                      "(ncclConfig_t::blocking = 0)");
  }
  const int clique = CliqueFor(s, key, nranks);
  Clique& q = s.cliques.at(clique);
  if (static_cast<int>(q.devices.size()) != nranks) {
    return Misuse(s, kInvalidArgument,
                  where + " says " + std::to_string(nranks) + " ranks, an earlier rank said " +
                      std::to_string(q.devices.size()));
  }
  if (q.joined[rank]) return Misuse(s, kInvalidUsage, where + " joined twice");
  q.joined[rank] = true;
  q.devices[rank] = CurrentDevice(s);
  *handle = reinterpret_cast<void*>(s.next_handle += 0x40);
  Comm& comm = s.comms[*handle];
  comm = Comm{clique, rank, kSuccess, blocking};
  s.journal.push_back("init " + Name(comm) + " nranks=" + std::to_string(nranks) +
                      " dev=" + std::to_string(q.devices[rank]) +
                      " blocking=" + std::to_string(blocking ? 1 : 0) +
                      " name=" + (config.comm_name ? config.comm_name : "-"));
  return Accepted(s, comm);
}

// The checks every call on a rank communicator makes: known, not failed, not finalised, not
// busy.
int Usable(State& s, const char* name, const void* handle, Comm** out) {
  Comm* comm = Find(s, handle);
  if (!comm) return Misuse(s, kInvalidArgument, std::string(name) + ": unknown communicator");
  const std::string where = std::string(name) + ": " + Name(*comm);
  if (!s.cliques.at(comm->clique).by_rank) {
    return Misuse(s, kInvalidUsage, where + ": the fake takes it on rank communicators only");
  }
  if (comm->async_error != kSuccess) {
    return Misuse(s, comm->async_error,
                  where + " has async error " + std::to_string(comm->async_error) +
                      "; abort the communicator");
  }
  if (int code = CheckIdle(s, *comm, where); code != kSuccess) return code;
  *out = comm;
  return kSuccess;
}

int PointToPointCall(const char* name, bool send, const void* from, void* to, size_t count,
                     int dtype, int peer, const void* handle) {
  return Locked(name, [&](State& s) {
    Comm* comm = nullptr;
    if (int code = Usable(s, name, handle, &comm); code != kSuccess) return code;
    const Clique& q = s.cliques.at(comm->clique);
    const std::string where = std::string(name) + ": " + Name(*comm);
    if (dtype < 0 || dtype >= kDatatypes) {
      return Misuse(s, kInvalidArgument, where + " datatype " + std::to_string(dtype));
    }
    if (peer < 0 || peer >= static_cast<int>(q.devices.size())) {
      return Misuse(s, kInvalidArgument, where + " peer " + std::to_string(peer));
    }
    const size_t bytes = count * kDatatypeBytes[dtype];
    const void* buffer = send ? from : to;
    if (bytes > 0 && buffer == nullptr) return Misuse(s, kInvalidArgument, where + " null buffer");
    if (!OnDevice(s, buffer, bytes, q.devices[comm->rank], where + " buffer")) {
      return kInvalidArgument;
    }
    PointToPoint item{send, peer, from, to, bytes};
    Group& group = ThisThreadsGroup();
    if (group.depth > 0) {
      group.p2p[handle].push_back(item);
      return kSuccess;
    }
    return QueueGroup(s, handle, {item});  // outside a group: a group of its own
  });
}

}  // namespace
}  // namespace sparsync::fake_nccl

using namespace sparsync::fake_nccl;  // NOLINT: the C API below is this library's only face

#pragma GCC visibility push(default)
extern "C" {

// A fresh id: the prefix and a number, so that the ids of separate communicators never collide.
int ncclGetUniqueId(UniqueId* id) {
  return Locked("ncclGetUniqueId", [&](State& s) {
    if (!id) return Misuse(s, kInvalidArgument, "ncclGetUniqueId: null id");
    std::memset(id->internal, 0, sizeof(id->internal));
    const std::string text = kIdPrefix + std::to_string(s.next_unique_id++);
    std::memcpy(id->internal, text.data(), text.size());
    return kSuccess;
  });
}

// The rank joins the clique of `id` on the fake runtime's current device; non-blocking, it
// returns ncclInProgress until every rank has joined.
int ncclCommInitRankConfig(void** comm, int nranks, UniqueId id, int rank, void* config) {
  return Locked("ncclCommInitRankConfig",
                [&](State& s) { return InitRank(s, comm, nranks, id, rank, config); });
}

int ncclCommFinalize(void* handle) {
  return Locked("ncclCommFinalize", [&](State& s) {
    Comm* comm = nullptr;
    if (int code = Usable(s, "ncclCommFinalize", handle, &comm); code != kSuccess) return code;
    comm->finalized = true;
    s.journal.push_back("finalize " + Name(*comm));
    return Accepted(s, *comm);
  });
}

int ncclSend(const void* data, size_t count, int datatype, int peer, void* comm, void* stream) {
  return PointToPointCall("ncclSend", /*send=*/true, data, nullptr, count, datatype, peer, comm);
}

int ncclRecv(void* data, size_t count, int datatype, int peer, void* comm, void* stream) {
  return PointToPointCall("ncclRecv", /*send=*/false, nullptr, data, count, datatype, peer, comm);
}

const char* ncclGetLastError(void* comm) { return LastError(); }

}  // extern "C"
#pragma GCC visibility pop
