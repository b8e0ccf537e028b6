// libFuzzer target: the coordinator's request handling through its state machine, with arbitrary
// sequences of requests from several nodes (daemon/negotiation/grpc_service.h CoordinatorHandlers
// over a CoordinatorCore, as the gRPC service calls them, without the server).
//
// The input is a sequence of records: [rpc][node][length low][length high][length bytes]. `rpc`
// picks Join, StoreSet, StoreGet, Report, Poll, Fail, Leave or a tick of the coordinator's timer;
// the bytes are parsed as that RPC's request message (protobuf accepts most bytes); `node` sets
// its node_rank (0..3 for a job of 3 nodes: 3 is out of range) and whether it carries the job's
// token. Nothing waits (every wait is 0 ms). After every record the schedule a node would receive
// must be ordered, end at most in one fatal entry, and name only slots the coordinator assigned.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <set>

#include "daemon/negotiation/grpc_service.h"

namespace {

using namespace std::chrono_literals;
using sparsync::negotiation::CoordinatorCore;
using sparsync::negotiation::CoordinatorHandlers;
namespace v1 = sparsync::v1;

constexpr char kToken[] = "fuzz-token";
constexpr int kNodes = 3;

void Require(bool condition) {
  if (!condition) std::abort();
}

template <typename Request>
bool Parse(const uint8_t* data, size_t size, uint8_t node, Request* req) {
  if (!req->ParseFromArray(data, static_cast<int>(size))) return false;
  if constexpr (requires { req->set_node_rank(0u); }) {  // the store's requests name no node
    req->set_node_rank(node % (kNodes + 1));
  }
  if ((node & 0x80) == 0) req->set_job_token(kToken);
  return true;
}

// The schedule as node 0 receives it from the start.
void CheckSchedule(CoordinatorHandlers& handlers, const std::set<uint32_t>& slots) {
  v1::PollRequest poll;
  poll.set_job_token(kToken);
  poll.set_node_rank(0);
  poll.set_after_seq(0);
  v1::PollResponse resp;
  if (!handlers.Poll(poll, &resp).ok()) return;
  uint64_t last = 0;
  bool fatal = false;
  for (const auto& e : resp.entries()) {
    Require(!fatal);  // nothing follows the fatal entry
    Require(e.seq() > last);
    last = e.seq();
    fatal = !e.fatal_error().empty();
    for (const auto& t : e.group()) Require(slots.count(t.slot()) == 1);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  sparsync::negotiation::CoordinatorOptions options;
  options.num_nodes = kNodes;
  options.cycle = 0ms;
  options.merge.warmup_steps = 2;  // plans are made (and their groups checked) early
  options.gone_grace = 0ms;        // a gone rank fails what needs it at once
  CoordinatorCore core(options, /*local_size=*/2, kToken);  // the timer runs only on ticks
  CoordinatorHandlers handlers(&core, 0ms);
  std::set<uint32_t> slots;
  size_t at = 0;
  while (at + 4 <= size) {
    const uint8_t rpc = data[at] % 8, node = data[at + 1];
    const size_t length = std::min<size_t>(data[at + 2] | (data[at + 3] << 8), size - at - 4);
    const uint8_t* body = data + at + 4;
    at += 4 + length;
    switch (rpc) {
      case 0: {
        v1::JoinRequest req;
        if (Parse(body, length, node, &req)) (void)handlers.Join(req, 0ms, "ipv4:10.0.0.9:1234");
        break;
      }
      case 1: {
        v1::StoreSetRequest req;
        if (Parse(body, length, node, &req)) (void)handlers.StoreSet(req);
        break;
      }
      case 2: {
        v1::StoreGetRequest req;
        v1::StoreGetResponse resp;
        if (Parse(body, length, node, &req)) (void)handlers.StoreGet(req, &resp);
        break;
      }
      case 3: {
        v1::ReportRequest req;
        v1::ReportResponse resp;
        if (!Parse(body, length, node, &req)) break;
        if (handlers.Report(req, &resp).ok()) {
          Require(resp.new_slots_size() == req.new_tensors_size());
          for (uint32_t s : resp.new_slots()) slots.insert(s);
        }
        break;
      }
      case 4: {
        v1::PollRequest req;
        v1::PollResponse resp;
        if (Parse(body, length, node, &req)) (void)handlers.Poll(req, &resp);
        break;
      }
      case 5: {
        v1::FailRequest req;
        if (Parse(body, length, node, &req)) (void)handlers.Fail(req);
        break;
      }
      case 6: {
        v1::LeaveRequest req;
        if (Parse(body, length, node, &req)) (void)handlers.Leave(req);
        break;
      }
      default:
        core.RunOnce();
        break;
    }
    CheckSchedule(handlers, slots);
  }
  return 0;
}
