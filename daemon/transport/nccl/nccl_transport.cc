// NcclTransport: bootstrap, staging, the Transport calls over NCCL, and the deadline/abort
// discipline described in nccl_transport.h. No CUDA or NCCL types here: everything goes through
// NcclApi, so this file is tested on CPU against a fake.
#include "daemon/transport/nccl/nccl_transport.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace sparsync::transport {
namespace {

constexpr std::chrono::microseconds kFirstPause{1};
constexpr std::chrono::microseconds kLongestPause{1000};
constexpr size_t kMinStagingBytes = 4096;

std::string HexEncode(const std::string& bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 0xf]);
  }
  return out;
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

Result<std::string> HexDecode(const std::string& hex) {
  if (hex.empty() || hex.size() % 2 != 0) {
    return InvalidArgument("expected an even, non-zero number of hex digits, got " +
                           std::to_string(hex.size()) + " characters");
  }
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    const int hi = HexDigit(hex[2 * i]);
    const int lo = HexDigit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return InvalidArgument("not a hex string");
    out[i] = static_cast<char>(hi * 16 + lo);
  }
  return out;
}

std::string Millis(std::chrono::milliseconds ms) { return std::to_string(ms.count()) + " ms"; }

}  // namespace

// Brackets one Transport call: EnterCall on construction, LeaveCall on destruction.
class NcclTransport::CallScope {
 public:
  explicit CallScope(NcclTransport* transport)
      : transport_(transport), status_(transport->EnterCall()) {}
  ~CallScope() {
    if (status_.ok()) transport_->LeaveCall();
  }
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;
  const Status& status() const { return status_; }

 private:
  NcclTransport* transport_;
  Status status_;
};

Result<std::unique_ptr<NcclTransport>> NcclTransport::Create(std::unique_ptr<NcclApi> api, int rank,
                                                             int size, RendezvousStore* store,
                                                             const NcclTransportOptions& options) {
  if (api == nullptr || store == nullptr) {
    return InvalidArgument("NCCL transport: no NCCL API or no rendezvous store");
  }
  if (size < 1 || rank < 0 || rank >= size) {
    return InvalidArgument("NCCL transport: node " + std::to_string(rank) + " of " +
                           std::to_string(size) + " does not exist");
  }
  const std::string where =
      "NCCL bootstrap of node " + std::to_string(rank) + " of " + std::to_string(size);
  const std::string key = "'" + options.store_key + "'";
  std::string unique_id;
  if (rank == 0) {
    auto made = api->NewUniqueId();
    if (!made.ok()) return made.status().WithContext(where + ": making the NCCL unique id");
    unique_id = std::move(made).value();
    SPARSYNC_RETURN_IF_ERROR(store->Set(options.store_key, HexEncode(unique_id))
                                 .WithContext(where + ": publishing the unique id under " + key));
  } else {
    auto got = store->Get({options.store_key}, options.timeout);
    if (!got.ok()) {
      return got.status().WithContext(where + ": waiting " + Millis(options.timeout) +
                                      " for node 0's NCCL unique id under " + key);
    }
    auto decoded = HexDecode(got->front());
    if (!decoded.ok()) {
      return decoded.status().WithContext(where + ": the NCCL unique id under " + key +
                                          " is malformed");
    }
    unique_id = std::move(decoded).value();
  }

  std::unique_ptr<NcclTransport> transport(new NcclTransport(std::move(api), rank, size, options));
  const std::string what = where + ": initialising the communicator";
  const auto deadline = Clock::now() + options.timeout;
  SPARSYNC_RETURN_IF_ERROR(
      transport->Enqueue(what, transport->api_->InitComm(unique_id, rank, size)));
  // A node that never joins shows here as the deadline passing (Await aborts the communicator).
  SPARSYNC_RETURN_IF_ERROR(transport->Await(what, deadline, /*drain=*/false));
  return transport;
}

NcclTransport::NcclTransport(std::unique_ptr<NcclApi> api, int rank, int size,
                             const NcclTransportOptions& options)
    : api_(std::move(api)), rank_(rank), size_(size), options_(options) {}

NcclTransport::~NcclTransport() {
  bool finalize;
  {
    std::lock_guard lock(mu_);
    finalize = !comm_aborted_;
  }
  if (finalize) {
    // Every call drained its stream before returning, so finalising has nothing left to flush.
    const std::string what = "NCCL transport of node " + std::to_string(rank_) + ": finalising";
    const auto deadline = Clock::now() + options_.timeout;
    Status st = api_->FinalizeComm();
    if (!st.ok()) {
      (void)Fail(what, st);
    } else if (Await(what, deadline, /*drain=*/false).ok()) {
      api_->DestroyComm();
    }
  }
  Release(&data_);
  Release(&control_);
}

Status NcclTransport::EnterCall() {
  std::lock_guard lock(mu_);
  if (!sticky_.ok()) return sticky_;
  in_call_ = true;
  return Status::Ok();
}

void NcclTransport::LeaveCall() {
  std::lock_guard lock(mu_);
  in_call_ = false;
  if (abort_requested_.load() && !comm_aborted_) {
    api_->AbortComm();
    comm_aborted_ = true;
  }
}

void NcclTransport::Abort(const Status& reason) {
  std::lock_guard lock(mu_);
  if (sticky_.ok()) sticky_ = reason.ok() ? Aborted("NCCL transport aborted") : reason;
  abort_requested_.store(true);
  // A thread inside a call owns the API until it leaves; it sees abort_requested_ within one
  // poll (<= 1 ms) and aborts the communicator itself.
  if (!in_call_ && !comm_aborted_) {
    api_->AbortComm();
    comm_aborted_ = true;
  }
}

Status NcclTransport::Fail(const std::string& what, const Status& cause) {
  std::lock_guard lock(mu_);
  Status result;
  if (sticky_.ok()) {
    sticky_ = cause.WithContext(what);
    result = sticky_;
  } else {
    result = sticky_.WithContext(what);  // e.g. Abort()'s reason, reported by the call it stopped
  }
  if (!comm_aborted_) {
    api_->AbortComm();
    comm_aborted_ = true;
  }
  return result;
}

Status NcclTransport::Enqueue(const std::string& what, const Status& st) {
  if (st.ok()) return st;
  return Fail(what, st);
}

std::string NcclTransport::Describe(const char* op, uint32_t tag, size_t bytes) const {
  return std::string("NCCL ") + op + " (tag " + std::to_string(tag) + ", " + std::to_string(bytes) +
         " bytes) on node " + std::to_string(rank_) + " of " + std::to_string(size_);
}

Status NcclTransport::Await(const std::string& what, Clock::time_point deadline, bool drain) {
  // Bounded polling (see the header): 1 us, 2 us, ... up to 1 ms between polls.
  std::chrono::microseconds pause = kFirstPause;
  while (true) {
    if (abort_requested_.load()) return Fail(what, Aborted("NCCL transport aborted"));
    auto state = api_->CommState();
    if (!state.ok()) return Fail(what, state.status());
    if (*state == NcclCommState::kReady) {
      if (!drain) return Status::Ok();
      auto idle = api_->StreamIdle();
      if (!idle.ok()) return Fail(what, idle.status());
      if (*idle) return Status::Ok();
    }
    if (Clock::now() >= deadline) {
      return Fail(what, DeadlineExceeded(
                            "did not finish within " + Millis(options_.timeout) +
                            " (SPARSYNC_TIMEOUT_S): a peer is dead, stuck, or calling "
                            "collectives in a different order; the NCCL communicator was aborted"));
    }
    api_->Pause(pause);
    pause = std::min(pause * 2, kLongestPause);
  }
}

// REQUIRES: the stream is idle (buffers are only replaced between calls' NCCL work).
Status NcclTransport::Reserve(Staging* staging, size_t bytes, const std::string& what) {
  if (bytes <= staging->capacity) return Status::Ok();
  Release(staging);
  const size_t capacity = std::max({bytes, 2 * staging->capacity, kMinStagingBytes});
  auto device = api_->AllocDevice(capacity);
  if (!device.ok()) return Fail(what, device.status().WithContext("allocating a staging buffer"));
  auto host = api_->AllocPinnedHost(capacity);
  if (!host.ok()) {
    api_->FreeDevice(*device);
    return Fail(what, host.status().WithContext("allocating a pinned staging buffer"));
  }
  staging->device = *device;
  staging->host = static_cast<char*>(*host);
  staging->capacity = capacity;
  return Status::Ok();
}

void NcclTransport::Release(Staging* staging) {
  api_->FreeDevice(staging->device);
  api_->FreePinnedHost(staging->host);
  *staging = Staging{};
}

Status NcclTransport::AllReduceSum(void* data, size_t count, ElementType type, uint32_t tag) {
  const size_t bytes = count * ElementSize(type);
  const std::string what = Describe("allreduce", tag, bytes);
  CallScope call(this);
  SPARSYNC_RETURN_IF_ERROR(call.status());
  if (bytes == 0) return Status::Ok();  // every node has the same count: all skip
  const auto deadline = Clock::now() + options_.timeout;
  SPARSYNC_RETURN_IF_ERROR(Reserve(&data_, bytes, what));
  std::memcpy(data_.host, data, bytes);
  SPARSYNC_RETURN_IF_ERROR(Enqueue(what, api_->CopyHostToDevice(data_.device, data_.host, bytes)));
  SPARSYNC_RETURN_IF_ERROR(
      Enqueue(what, api_->AllReduceSum(data_.device, data_.device, count, type)));
  // A non-blocking collective may still be on its way into the stream: a copy enqueued now
  // could overtake it.
  SPARSYNC_RETURN_IF_ERROR(Await(what, deadline, /*drain=*/false));
  SPARSYNC_RETURN_IF_ERROR(Enqueue(what, api_->CopyDeviceToHost(data_.host, data_.device, bytes)));
  SPARSYNC_RETURN_IF_ERROR(Await(what, deadline, /*drain=*/true));
  std::memcpy(data, data_.host, bytes);
  return Status::Ok();
}

// The device path: the collective runs in place on the caller's buffer, so nothing is staged or
// copied; the same deadline, abort and sticky-error discipline as the host path.
Status NcclTransport::AllReduceSumOnDevice(void* device_data, size_t count, ElementType type,
                                           uint32_t tag) {
  const size_t bytes = count * ElementSize(type);
  const std::string what = Describe("allreduce in device memory", tag, bytes);
  if (options_.device < 0) {
    return InvalidArgument(what +
                           ": this NCCL transport was made without its CUDA device "
                           "(NcclTransportOptions::device is -1), so it takes host memory only");
  }
  CallScope call(this);
  SPARSYNC_RETURN_IF_ERROR(call.status());
  if (bytes == 0) return Status::Ok();  // as AllReduceSum: every node has the same count, all skip
  const auto deadline = Clock::now() + options_.timeout;
  SPARSYNC_RETURN_IF_ERROR(
      Enqueue(what, api_->AllReduceSum(device_data, device_data, count, type)));
  // Drained, not only enqueued: the sum is in place when the call returns.
  return Await(what, deadline, /*drain=*/true);
}

Status NcclTransport::GatherChunks(const std::string& what, Clock::time_point deadline,
                                   Staging* staging, size_t chunk, size_t own_bytes) {
  char* device = static_cast<char*>(staging->device);
  const size_t offset = static_cast<size_t>(rank_) * chunk;
  if (own_bytes > 0) {
    SPARSYNC_RETURN_IF_ERROR(
        Enqueue(what, api_->CopyHostToDevice(device + offset, staging->host + offset, own_bytes)));
  }
  // In place: this node's chunk already sits at its slot of the receive buffer.
  SPARSYNC_RETURN_IF_ERROR(Enqueue(what, api_->AllGather(device + offset, device, chunk)));
  SPARSYNC_RETURN_IF_ERROR(Await(what, deadline, /*drain=*/false));
  SPARSYNC_RETURN_IF_ERROR(
      Enqueue(what, api_->CopyDeviceToHost(staging->host, device, chunk * size_)));
  return Await(what, deadline, /*drain=*/true);
}

// Variable sizes: a size exchange (an allgather of one uint64 per node) and then one ncclAllGather
// padded to the largest size. Chosen over grouped send/recv because it is one collective that
// uses NCCL's ring/NVLS allgather (send/recv would open P-1 peer channels per node and send each
// payload P-1 times from its owner), and sparse payloads of one merge group differ little in
// size, so the padding is small. The padding is derived from the *exchanged* sizes, which are the
// same on every node, so every node issues the identical ncclAllGather even when a caller's
// recv_bytes is wrong: that caller gets kMismatch and the nodes stay in step.
// Equal sizes everywhere (fixed-k payloads, size records) skip the exchange: one allgather.
Status NcclTransport::AllGatherV(const void* send, size_t send_bytes, void* recv,
                                 std::span<const size_t> recv_bytes, uint32_t tag) {
  const std::string what = Describe("allgatherv", tag, send_bytes);
  CallScope call(this);
  SPARSYNC_RETURN_IF_ERROR(call.status());
  if (recv_bytes.size() != static_cast<size_t>(size_) || recv_bytes[rank_] != send_bytes) {
    return Internal(what + ": receive sizes do not match the node count or the send size");
  }
  const auto deadline = Clock::now() + options_.timeout;
  std::vector<size_t> sent(recv_bytes.begin(), recv_bytes.end());  // what each node sends
  const bool uniform =
      std::all_of(sent.begin(), sent.end(), [&](size_t b) { return b == send_bytes; });
  if (!uniform) {
    SPARSYNC_RETURN_IF_ERROR(Reserve(&control_, sizeof(uint64_t) * size_, what));
    const uint64_t mine = send_bytes;
    std::memcpy(control_.host + sizeof(uint64_t) * rank_, &mine, sizeof(mine));
    SPARSYNC_RETURN_IF_ERROR(
        GatherChunks(what, deadline, &control_, sizeof(uint64_t), sizeof(uint64_t)));
    for (int r = 0; r < size_; ++r) {
      uint64_t theirs = 0;
      std::memcpy(&theirs, control_.host + sizeof(uint64_t) * r, sizeof(theirs));
      sent[r] = theirs;
    }
  }
  const size_t chunk = *std::max_element(sent.begin(), sent.end());
  if (chunk > 0) {
    SPARSYNC_RETURN_IF_ERROR(Reserve(&data_, chunk * size_, what));
    if (send_bytes > 0) std::memcpy(data_.host + chunk * rank_, send, send_bytes);
    SPARSYNC_RETURN_IF_ERROR(GatherChunks(what, deadline, &data_, chunk, send_bytes));
  }
  for (int r = 0; r < size_; ++r) {
    if (sent[r] != recv_bytes[r]) {
      return Mismatch(what + ": node " + std::to_string(r) + " sent " + std::to_string(sent[r]) +
                      " bytes but this node expected " + std::to_string(recv_bytes[r]) +
                      " (the nodes disagree about the payload sizes)");
    }
  }
  char* out = static_cast<char*>(recv);
  for (int r = 0; r < size_; ++r) {
    if (sent[r] > 0) std::memcpy(out, data_.host + chunk * r, sent[r]);
    out += sent[r];
  }
  return Status::Ok();
}

Status NcclTransport::Broadcast(void* data, size_t bytes, int root, uint32_t tag) {
  const std::string what = Describe("broadcast", tag, bytes);
  CallScope call(this);
  SPARSYNC_RETURN_IF_ERROR(call.status());
  if (root < 0 || root >= size_) {
    return InvalidArgument(what + ": root node " + std::to_string(root) + " does not exist");
  }
  if (bytes == 0) return Status::Ok();
  const auto deadline = Clock::now() + options_.timeout;
  const bool is_root = rank_ == root;
  SPARSYNC_RETURN_IF_ERROR(Reserve(&data_, bytes, what));
  if (is_root) {
    std::memcpy(data_.host, data, bytes);
    SPARSYNC_RETURN_IF_ERROR(
        Enqueue(what, api_->CopyHostToDevice(data_.device, data_.host, bytes)));
  }
  SPARSYNC_RETURN_IF_ERROR(Enqueue(what, api_->Broadcast(data_.device, data_.device, bytes, root)));
  SPARSYNC_RETURN_IF_ERROR(Await(what, deadline, /*drain=*/false));
  if (!is_root) {
    SPARSYNC_RETURN_IF_ERROR(
        Enqueue(what, api_->CopyDeviceToHost(data_.host, data_.device, bytes)));
  }
  SPARSYNC_RETURN_IF_ERROR(Await(what, deadline, /*drain=*/true));
  if (!is_root) std::memcpy(data, data_.host, bytes);
  return Status::Ok();
}

Status NcclTransport::ExchangeWithPeer(const std::string& what, Clock::time_point deadline,
                                       int peer, const void* send, size_t send_bytes, void* recv,
                                       size_t recv_bytes) {
  Status st = api_->GroupStart();
  if (st.ok()) {
    if (send_bytes > 0) st = api_->Send(send, send_bytes, peer);
    if (st.ok() && recv_bytes > 0) st = api_->Recv(recv, recv_bytes, peer);
    // Closed even after a failure, so NCCL's per-thread group depth stays balanced.
    Status end = api_->GroupEnd();
    if (st.ok()) st = end;
  }
  SPARSYNC_RETURN_IF_ERROR(Enqueue(what, st));
  return Await(what, deadline, /*drain=*/false);
}

Status NcclTransport::SendRecv(int peer, const void* send, size_t send_bytes, void* recv,
                               size_t recv_capacity, size_t* recv_bytes, uint32_t tag) {
  *recv_bytes = 0;
  const std::string what =
      Describe(("sendrecv with node " + std::to_string(peer)).c_str(), tag, send_bytes);
  CallScope call(this);
  SPARSYNC_RETURN_IF_ERROR(call.status());
  if (peer < 0 || peer >= size_) {
    return InvalidArgument("sendrecv: peer " + std::to_string(peer) + " is not a node of " +
                           std::to_string(size_));
  }
  auto size_error = [&](uint64_t peer_bytes, uint64_t peer_capacity) {
    return Mismatch("sendrecv " + std::to_string(tag) + " between nodes " + std::to_string(rank_) +
                    " and " + std::to_string(peer) + ": node " + std::to_string(rank_) + " sends " +
                    std::to_string(send_bytes) + " bytes into a capacity of " +
                    std::to_string(peer_capacity) + ", node " + std::to_string(peer) + " sends " +
                    std::to_string(peer_bytes) + " bytes into a capacity of " +
                    std::to_string(recv_capacity));
  };
  if (peer == rank_) {
    if (send_bytes > recv_capacity) return size_error(send_bytes, recv_capacity);
    if (send_bytes > 0) std::memmove(recv, send, send_bytes);
    *recv_bytes = send_bytes;
    return Status::Ok();
  }
  const auto deadline = Clock::now() + options_.timeout;

  // Header first (byte count, capacity): both sides learn both, so a size error fails both sides
  // before any payload moves and the pair stays in step.
  constexpr size_t kHeader = 2 * sizeof(uint64_t);
  SPARSYNC_RETURN_IF_ERROR(Reserve(&control_, 2 * kHeader, what));
  char* control = static_cast<char*>(control_.device);
  const uint64_t mine[2] = {send_bytes, recv_capacity};
  std::memcpy(control_.host, mine, kHeader);
  SPARSYNC_RETURN_IF_ERROR(Enqueue(what, api_->CopyHostToDevice(control, control_.host, kHeader)));
  SPARSYNC_RETURN_IF_ERROR(
      ExchangeWithPeer(what, deadline, peer, control, kHeader, control + kHeader, kHeader));
  SPARSYNC_RETURN_IF_ERROR(
      Enqueue(what, api_->CopyDeviceToHost(control_.host + kHeader, control + kHeader, kHeader)));
  SPARSYNC_RETURN_IF_ERROR(Await(what, deadline, /*drain=*/true));
  uint64_t theirs[2] = {0, 0};
  std::memcpy(theirs, control_.host + kHeader, kHeader);
  if (theirs[0] > recv_capacity || send_bytes > theirs[1]) {
    return size_error(theirs[0], theirs[1]);
  }
  const size_t incoming = theirs[0];
  if (send_bytes == 0 && incoming == 0) return Status::Ok();

  // Payload: [what we send | what we receive] in one staging buffer.
  SPARSYNC_RETURN_IF_ERROR(Reserve(&data_, send_bytes + incoming, what));
  char* device = static_cast<char*>(data_.device);
  if (send_bytes > 0) {
    std::memcpy(data_.host, send, send_bytes);
    SPARSYNC_RETURN_IF_ERROR(Enqueue(what, api_->CopyHostToDevice(device, data_.host, send_bytes)));
  }
  SPARSYNC_RETURN_IF_ERROR(
      ExchangeWithPeer(what, deadline, peer, device, send_bytes, device + send_bytes, incoming));
  if (incoming > 0) {
    SPARSYNC_RETURN_IF_ERROR(Enqueue(
        what, api_->CopyDeviceToHost(data_.host + send_bytes, device + send_bytes, incoming)));
  }
  SPARSYNC_RETURN_IF_ERROR(Await(what, deadline, /*drain=*/true));
  if (incoming > 0) std::memcpy(recv, data_.host + send_bytes, incoming);
  *recv_bytes = incoming;
  return Status::Ok();
}

}  // namespace sparsync::transport
