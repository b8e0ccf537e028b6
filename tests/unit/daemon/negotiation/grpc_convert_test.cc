// The negotiation edge's conversions (grpc_convert.h), property style: random TensorMeta and
// ScheduleEntry values (seeded, so reproducible) go to protobuf, through the wire bytes and back,
// and every field survives; Status codes map to gRPC codes and back.
#include "daemon/negotiation/grpc_convert.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <random>
#include <set>

#include "tests/unit/daemon/negotiation/test_util.h"

namespace sparsync::negotiation {
namespace {

using testing::Contains;
using testing::Meta;

constexpr int kSamples = 300;

// Serialises and parses `in`, as a message crossing the network would.
template <typename Proto>
Proto ThroughTheWire(const Proto& in) {
  std::string bytes;
  EXPECT_TRUE(in.SerializeToString(&bytes));
  Proto out;
  EXPECT_TRUE(out.ParseFromString(bytes));
  return out;
}

class Random {
 public:
  explicit Random(uint64_t seed) : rng_(seed) {}
  uint64_t U64() { return rng_(); }
  uint32_t U32() { return static_cast<uint32_t>(rng_()); }
  int64_t I64() { return static_cast<int64_t>(rng_()); }
  bool Coin() { return rng_() & 1; }
  size_t Below(size_t n) { return static_cast<size_t>(rng_() % n); }
  // Tensor-name-like text, with multi-byte UTF-8 (proto3 strings must be UTF-8).
  std::string Text(size_t max_len) {
    static const char* const kPieces[] = {"a", "Z", "0",  ".",    "_", "/",
                                          " ", "é", "層", "🙂", ":"};
    std::string s;
    for (size_t n = Below(max_len + 1); n > 0; --n) s += kPieces[Below(std::size(kPieces))];
    return s;
  }
  float Float() {
    switch (Below(4)) {
      case 0:
        return 0.0f;
      case 1:
        return std::numeric_limits<float>::denorm_min() * static_cast<float>(Below(100));
      case 2:
        return static_cast<float>(Below(1000000)) / 1e6f;
      default: {
        uint32_t bits = U32() & 0x7f7fffffu;  // finite, positive or negative
        float f;
        std::memcpy(&f, &bits, sizeof(f));
        return Coin() ? -f : f;
      }
    }
  }
  double Double() { return std::ldexp(static_cast<double>(I64()), -static_cast<int>(Below(80))); }

 private:
  std::mt19937_64 rng_;
};

TensorMeta RandomMeta(Random& r) {
  TensorMeta m;
  m.name = r.Text(40);
  m.op = static_cast<CollectiveOp>(r.Below(4));
  m.dtype = static_cast<DType>(r.Below(7));
  m.reduce_op = static_cast<ReduceOp>(r.Below(2));
  m.root_rank = static_cast<int32_t>(r.U32());
  for (size_t d = r.Below(9); d > 0; --d) m.shape.push_back(r.Coin() ? r.Below(4096) : r.I64());
  if (r.Coin()) m.compressor = static_cast<Compressor>(r.Below(kCompressorCount));
  m.density = r.Float();
  if (r.Coin()) {  // a process set: ascending distinct ranks
    for (int32_t rank = static_cast<int32_t>(r.Below(3)); rank < 2000; rank += 1 + r.Below(400)) {
      m.members.push_back(rank);
    }
  }
  if (r.Coin()) {
    m.group = r.U64() | 1;
    m.group_size = 2 + static_cast<uint32_t>(r.Below(100));
  }
  return m;
}

ScheduleEntry RandomEntry(Random& r) {
  ScheduleEntry e;
  e.seq = r.U64();
  for (size_t i = r.Below(6); i > 0; --i) {
    GroupTensor t;
    t.slot = r.U32();
    for (size_t d = r.Below(5); d > 0; --d) t.worker_dim0.push_back(r.I64());
    if (r.Coin()) t.meta = std::make_shared<const TensorMeta>(RandomMeta(r));
    e.group.push_back(std::move(t));
  }
  if (r.Below(3) == 0) {
    // Every code but OK, with a non-empty message.
    e.fatal = Status(static_cast<StatusCode>(1 + r.Below(7)), "x" + r.Text(60));
  }
  if (r.Coin()) {
    PlanInfo p;
    p.version = r.U32();
    p.effective_step = r.U64();
    p.planner = r.Text(10);
    for (size_t g = r.Below(5); g > 0; --g) {
      std::vector<uint32_t> slots;
      for (size_t s = r.Below(5); s > 0; --s) slots.push_back(r.U32());
      p.groups.push_back(std::move(slots));  // empty groups included
    }
    p.predicted_s = r.Double();
    p.summary = r.Text(80);
    if (r.Coin()) {
      for (size_t g = 0; g < p.groups.size(); ++g) p.dense.push_back(r.Coin());
      // All sparse is kept, and travels, as an empty list.
      if (std::find(p.dense.begin(), p.dense.end(), true) == p.dense.end()) p.dense.clear();
    }
    e.plan = std::make_shared<const PlanInfo>(std::move(p));
  }
  e.plan_version = r.U32();
  e.group_index = r.U32();
  if (r.Below(4) == 0) e.join_last_rank = static_cast<int32_t>(r.Below(100000));
  return e;
}

void ExpectSameEntry(const ScheduleEntry& a, const ScheduleEntry& b) {
  EXPECT_EQ(a.seq, b.seq);
  ASSERT_EQ(a.group.size(), b.group.size());
  for (size_t i = 0; i < a.group.size(); ++i) {
    EXPECT_EQ(a.group[i].slot, b.group[i].slot);
    EXPECT_EQ(a.group[i].worker_dim0, b.group[i].worker_dim0);
    ASSERT_EQ(a.group[i].meta != nullptr, b.group[i].meta != nullptr);
    if (a.group[i].meta) {
      EXPECT_EQ(*a.group[i].meta, *b.group[i].meta);
    }
  }
  EXPECT_EQ(a.fatal.code(), b.fatal.code());
  EXPECT_EQ(a.fatal.message(), b.fatal.message());
  ASSERT_EQ(a.plan != nullptr, b.plan != nullptr);
  if (a.plan) {
    EXPECT_EQ(*a.plan, *b.plan);
  }
  EXPECT_EQ(a.plan_version, b.plan_version);
  EXPECT_EQ(a.group_index, b.group_index);
  EXPECT_EQ(a.join_last_rank, b.join_last_rank);
}

TEST(GrpcConvertTest, EveryTensorMetaFieldSurvivesTheWire) {
  Random r(20240613);
  for (int i = 0; i < kSamples; ++i) {
    const TensorMeta in = RandomMeta(r);
    v1::TensorMeta proto;
    ToProto(in, &proto);
    const Result<TensorMeta> decoded = FromProto(ThroughTheWire(proto));
    ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
    const TensorMeta& out = *decoded;
    ASSERT_EQ(out, in) << "sample " << i << ": " << proto.ShortDebugString();
    EXPECT_EQ(std::memcmp(&out.density, &in.density, sizeof(float)), 0) << "bit for bit";
    EXPECT_EQ(out.SignatureKey(), in.SignatureKey()) << "the same tensor on both sides";
  }
}

TEST(GrpcConvertTest, EveryScheduleEntryFieldSurvivesTheWire) {
  Random r(7);
  int fatal = 0, plans = 0;
  for (int i = 0; i < kSamples; ++i) {
    const ScheduleEntry in = RandomEntry(r);
    fatal += !in.fatal.ok();
    plans += in.plan != nullptr;
    v1::ScheduleEntry proto;
    ToProto(in, &proto);
    SCOPED_TRACE("sample " + std::to_string(i) + ": " + proto.ShortDebugString());
    ExpectSameEntry(FromProto(ThroughTheWire(proto)), in);
  }
  EXPECT_GT(fatal, kSamples / 5);  // the generator covers each kind
  EXPECT_GT(plans, kSamples / 3);
}

// A plain group entry stays plain: no fatal error and no plan appear on the way.
TEST(GrpcConvertTest, AGroupEntryGainsNothing) {
  ScheduleEntry in;
  in.seq = 3;
  in.group = {{4, {}, {}, nullptr}, {9, {2, 5}, {}, nullptr}};
  v1::ScheduleEntry proto;
  ToProto(in, &proto);
  const ScheduleEntry out = FromProto(ThroughTheWire(proto));
  EXPECT_TRUE(out.fatal.ok());
  EXPECT_EQ(out.plan, nullptr);
  ExpectSameEntry(out, in);
}

// Another node's process set must be one: ascending, distinct, non-negative ranks.
TEST(GrpcConvertTest, AProcessSetOutOfOrderIsRefused) {
  for (const std::vector<int32_t>& bad : std::vector<std::vector<int32_t>>{{3, 1}, {2, 2}, {-1, 4}}) {
    TensorMeta m;
    m.name = "ps1/x";
    m.members = bad;
    v1::TensorMeta proto;
    ToProto(m, &proto);
    EXPECT_FALSE(FromProto(ThroughTheWire(proto)).ok()) << proto.ShortDebugString();
  }
}

// A failure whose message is empty (e.g. a node's Fail(Status(code, ""))) is still fatal on the
// other nodes: its code marks it, not its message.
TEST(GrpcConvertTest, AFatalEntryWithAnEmptyMessageStaysFatal) {
  ScheduleEntry in;
  in.seq = 12;
  in.fatal = Status(StatusCode::kInternal, "");
  v1::ScheduleEntry proto;
  ToProto(in, &proto);
  const ScheduleEntry out = FromProto(ThroughTheWire(proto));
  EXPECT_FALSE(out.fatal.ok());
  EXPECT_EQ(out.fatal.code(), StatusCode::kInternal);
}

// The gRPC edge is where another node's numbers become the daemon's types: a number the protocol
// does not define (a daemon of another build, or not a daemon) is refused, naming the field.
TEST(GrpcConvertTest, AnUnknownWireNumberInATensorIsRefused) {
  v1::TensorMeta good;
  ToProto(Meta("fc.weight", {4, 4}), &good);
  ASSERT_TRUE(FromProto(good).ok());
  struct Case {
    const char* field;
    std::function<void(v1::TensorMeta*)> spoil;
  };
  for (const Case& c : {Case{"op", [](v1::TensorMeta* m) { m->set_op(4); }},
                        Case{"dtype", [](v1::TensorMeta* m) { m->set_dtype(7); }},
                        Case{"reduce op", [](v1::TensorMeta* m) { m->set_reduce_op(9); }},
                        Case{"compressor", [](v1::TensorMeta* m) { m->set_compressor(99); }}}) {
    v1::TensorMeta bad = good;
    c.spoil(&bad);
    const Result<TensorMeta> out = FromProto(bad);
    ASSERT_FALSE(out.ok()) << c.field;
    EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(Contains(out.status().message(), std::string("unknown ") + c.field))
        << out.status().message();
    EXPECT_TRUE(Contains(out.status().message(), "fc.weight")) << out.status().message();
  }
}

TEST(GrpcConvertTest, AnUnknownFatalCodeArrivesAsAborted) {
  v1::ScheduleEntry proto;
  proto.set_seq(1);
  proto.set_fatal_error("from a newer daemon");
  for (uint32_t code : {0u, 8u, 1000u}) {
    proto.set_fatal_code(code);
    const ScheduleEntry out = FromProto(proto);
    EXPECT_EQ(out.fatal.code(), StatusCode::kAborted) << code;
    EXPECT_EQ(out.fatal.message(), "from a newer daemon");
  }
}

// Each of the daemon's codes has its own gRPC code and comes back as itself, the message prefixed
// with what was being done; OK stays OK.
TEST(GrpcConvertTest, StatusCodesRoundTripThroughGrpc) {
  std::set<grpc::StatusCode> used;
  for (int c = 1; c <= 7; ++c) {
    const Status in(static_cast<StatusCode>(c), "message " + std::to_string(c));
    const grpc::Status wire = ToGrpc(in);
    EXPECT_FALSE(wire.ok());
    EXPECT_EQ(wire.error_message(), in.message());
    used.insert(wire.error_code());
    const Status out = FromGrpc(wire, "polling the coordinator");
    EXPECT_EQ(out.code(), in.code()) << in.ToString();
    EXPECT_EQ(out.message(), "polling the coordinator: " + in.message());
  }
  EXPECT_EQ(used.size(), 7u) << "two codes share a gRPC code";
  EXPECT_TRUE(ToGrpc(Status::Ok()).ok());
  EXPECT_TRUE(FromGrpc(grpc::Status::OK, "anything").ok());
  // gRPC's own codes that the daemon has no name for arrive as INTERNAL, message kept.
  const Status cancelled = FromGrpc(grpc::Status(grpc::StatusCode::CANCELLED, "gone"), "joining");
  EXPECT_EQ(cancelled.code(), StatusCode::kInternal);
  EXPECT_EQ(cancelled.message(), "joining: gone");
}

}  // namespace
}  // namespace sparsync::negotiation
