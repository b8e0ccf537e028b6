#include "daemon/intake/codec.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace sparsync::intake {
namespace {

sparsync_register_msg ValidRegister() {
  sparsync_register_msg r{};
  FillHeader(&r.header, SPARSYNC_MSG_REGISTER, sizeof(r));
  r.tensor_id = 7;
  r.op = SPARSYNC_OP_GRADIENT;
  r.dtype = SPARSYNC_FLOAT32;
  r.reduce_op = SPARSYNC_REDUCE_AVERAGE;
  r.ndim = 2;
  r.shape[0] = 512;
  r.shape[1] = 784;
  std::memcpy(r.name, "fc1.weight", 10);
  r.name_len = 10;
  return r;
}

// A valid REGISTER of a CUDA tensor (the handles' contents are opaque to the codec).
sparsync_register_msg ValidCudaRegister() {
  sparsync_register_msg r = ValidRegister();
  r.memory = SPARSYNC_MEMORY_CUDA;
  r.cuda_device = 3;
  r.cuda_offset = 4096;
  r.cuda_memory[0] = 0x11;
  r.cuda_ready_event[63] = 0x22;
  return r;
}

template <typename T>
Result<Message> DecodeStruct(const T& msg, int fds = 0) {
  return Decode(&msg, sizeof(msg), fds);
}

TEST(CodecTest, DecodesEveryValidMessage) {
  sparsync_hello hello{};
  FillHeader(&hello.header, SPARSYNC_MSG_HELLO, sizeof(hello));
  hello.token_len = 3;
  ASSERT_TRUE(DecodeStruct(hello).ok());

  auto reg = DecodeStruct(ValidRegister());
  ASSERT_TRUE(reg.ok()) << reg.status().ToString();
  EXPECT_EQ(std::get<sparsync_register_msg>(*reg).shape[1], 784);

  sparsync_ready ready{};
  FillHeader(&ready.header, SPARSYNC_MSG_READY, sizeof(ready));
  ready.round = 1;
  ASSERT_TRUE(DecodeStruct(ready).ok());

  sparsync_unregister_msg un{};
  FillHeader(&un.header, SPARSYNC_MSG_UNREGISTER, sizeof(un));
  ASSERT_TRUE(DecodeStruct(un).ok());

  sparsync_goodbye bye{};
  FillHeader(&bye.header, SPARSYNC_MSG_GOODBYE, sizeof(bye));
  ASSERT_TRUE(DecodeStruct(bye).ok());

  sparsync_join_msg join{};
  FillHeader(&join.header, SPARSYNC_MSG_JOIN, sizeof(join));
  auto joined = DecodeStruct(join);
  ASSERT_TRUE(joined.ok());
  EXPECT_TRUE(std::holds_alternative<sparsync_join_msg>(*joined));
}

// One malformed message and a phrase the error must contain.
struct Malformed {
  std::string what;
  std::function<std::vector<char>()> make;
  std::string phrase;
  int fds = 0;
};

template <typename T>
std::vector<char> Bytes(const T& v) {
  std::vector<char> b(sizeof(T));
  std::memcpy(b.data(), &v, sizeof(T));
  return b;
}

std::vector<char> RegisterWith(const std::function<void(sparsync_register_msg&)>& edit) {
  sparsync_register_msg r = ValidRegister();
  edit(r);
  return Bytes(r);
}

std::vector<char> CudaRegisterWith(const std::function<void(sparsync_register_msg&)>& edit) {
  sparsync_register_msg r = ValidCudaRegister();
  edit(r);
  return Bytes(r);
}

std::vector<Malformed> Corpus() {
  return {
      {"empty", [] { return std::vector<char>{}; }, "shorter than a header"},
      {"short", [] { return std::vector<char>(7, 0); }, "shorter than a header"},
      {"bad magic", [] { return RegisterWith([](auto& r) { r.header.magic = 1; }); }, "magic"},
      {"old version", [] { return RegisterWith([](auto& r) { r.header.version = 0; }); }, "version"},
      {"size lies", [] { return RegisterWith([](auto& r) { r.header.size += 4; }); }, "header says"},
      {"reserved", [] { return RegisterWith([](auto& r) { r.header.reserved = 1; }); }, "reserved"},
      {"reply type", [] { return RegisterWith([](auto& r) { r.header.type = SPARSYNC_MSG_DONE; }); },
       "not one a worker may send"},
      {"join reply from a worker",
       [] { return RegisterWith([](auto& r) { r.header.type = SPARSYNC_MSG_JOIN_REPLY; }); },
       "not one a worker may send"},
      {"unknown type", [] { return RegisterWith([](auto& r) { r.header.type = 99; }); },
       "not one a worker may send"},
      {"truncated register",
       [] {
         auto b = RegisterWith([](auto&) {});
         b.resize(100);
         sparsync_msg_header h;
         std::memcpy(&h, b.data(), sizeof(h));
         h.size = 100;
         std::memcpy(b.data(), &h, sizeof(h));
         return b;
       },
       "expected 592"},
      {"tensor id too big", [] { return RegisterWith([](auto& r) { r.tensor_id = 1u << 30; }); }, "tensor id"},
      {"unknown op", [] { return RegisterWith([](auto& r) { r.op = 9; }); }, "unknown op"},
      {"unknown dtype", [] { return RegisterWith([](auto& r) { r.dtype = 42; }); }, "unknown dtype"},
      {"unknown reduce", [] { return RegisterWith([](auto& r) { r.reduce_op = 5; }); }, "reduce op"},
      {"too many dims", [] { return RegisterWith([](auto& r) { r.ndim = 9; }); }, "ndim"},
      {"empty name", [] { return RegisterWith([](auto& r) { r.name_len = 0; }); }, "name length"},
      {"long name", [] { return RegisterWith([](auto& r) { r.name_len = 201; }); }, "name length"},
      {"NUL in name", [] { return RegisterWith([](auto& r) { r.name[3] = '\0'; }); }, "NUL"},
      {"negative dim", [] { return RegisterWith([](auto& r) { r.shape[1] = -1; }); }, "negative"},
      {"dims past ndim", [] { return RegisterWith([](auto& r) { r.shape[5] = 3; }); }, "past ndim"},
      {"overflowing shape",
       [] {
         return RegisterWith([](auto& r) {
           r.ndim = 4;
           for (int i = 0; i < 4; ++i) r.shape[i] = int64_t{1} << 20;
         });
       },
       "1 TiB"},
      {"int average", [] { return RegisterWith([](auto& r) { r.op = SPARSYNC_OP_ALLREDUCE; r.dtype = SPARSYNC_INT32; }); },
       "floating-point"},
      {"int gradient",
       [] { return RegisterWith([](auto& r) { r.dtype = SPARSYNC_INT64; r.reduce_op = SPARSYNC_REDUCE_SUM; }); },
       "floating-point"},
      {"uint8 reduce",
       [] { return RegisterWith([](auto& r) { r.op = SPARSYNC_OP_ALLREDUCE; r.dtype = SPARSYNC_UINT8; }); },
       "uint8"},
      {"scalar allgather",
       [] { return RegisterWith([](auto& r) { r.op = SPARSYNC_OP_ALLGATHER; r.ndim = 0; r.shape[0] = r.shape[1] = 0; }); },
       "at least one dimension"},
      {"gradient in a process set", [] { return RegisterWith([](auto& r) { r.members[0] = 0b101; }); },
       "explicit collectives only"},
      {"CUDA tensor in a process set",
       [] { return CudaRegisterWith([](auto& r) { r.op = SPARSYNC_OP_ALLREDUCE; r.members[3] = 1; }); },
       "host tensors only"},
      {"group of one", [] { return RegisterWith([](auto& r) { r.op = SPARSYNC_OP_ALLREDUCE; r.group = 9; r.group_size = 1; }); },
       "a group has"},
      {"group without a key", [] { return RegisterWith([](auto& r) { r.op = SPARSYNC_OP_ALLREDUCE; r.group_size = 3; }); },
       "a group has"},
      {"group of gradients", [] { return RegisterWith([](auto& r) { r.group = 9; r.group_size = 3; }); },
       "grouped by the daemon's planner"},
      {"reserved3", [] { return RegisterWith([](auto& r) { r.reserved3 = 1; }); }, "reserved3"},
      {"negative root",
       [] { return RegisterWith([](auto& r) { r.op = SPARSYNC_OP_BROADCAST; r.root_rank = -2; }); },
       "root"},
      {"unknown compressor", [] { return RegisterWith([](auto& r) { r.compressor = 9; }); }, "unknown compressor"},
      {"density above 1", [] { return RegisterWith([](auto& r) { r.density = 1.5f; }); }, "density"},
      {"density NaN", [] { return RegisterWith([](auto& r) { r.density = NAN; }); }, "density"},
      {"compressed explicit allreduce",
       [] {
         return RegisterWith([](auto& r) {
           r.op = SPARSYNC_OP_ALLREDUCE;
           r.compressor = SPARSYNC_COMPRESSOR_TOPK;
         });
       },
       "always exact"},
      {"fds attached", [] { return RegisterWith([](auto&) {}); }, "file descriptors", 1},
      {"unknown memory kind", [] { return RegisterWith([](auto& r) { r.memory = 2; }); },
       "unknown memory kind 2"},
      {"reserved after memory", [] { return RegisterWith([](auto& r) { r.reserved[1] = 1; }); },
       "reserved"},
      {"reserved2", [] { return CudaRegisterWith([](auto& r) { r.reserved2 = 1; }); }, "reserved"},
      {"host tensor with a device", [] { return RegisterWith([](auto& r) { r.cuda_device = 1; }); },
       "host tensor must leave the CUDA fields 0"},
      {"host tensor with a handle",
       [] { return RegisterWith([](auto& r) { r.cuda_memory[5] = 1; }); },
       "host tensor must leave the CUDA fields 0"},
      {"host tensor with an offset",
       [] { return RegisterWith([](auto& r) { r.cuda_offset = 8; }); },
       "host tensor must leave the CUDA fields 0"},
      {"negative CUDA device", [] { return CudaRegisterWith([](auto& r) { r.cuda_device = -1; }); },
       "CUDA device -1 is not in [0, 1024)"},
      {"CUDA device too large",
       [] { return CudaRegisterWith([](auto& r) { r.cuda_device = 1024; }); }, "CUDA device 1024"},
      {"CUDA allgather",
       [] { return CudaRegisterWith([](auto& r) { r.op = SPARSYNC_OP_ALLGATHER; }); },
       "allgather of a CUDA tensor is not supported"},
      {"empty CUDA memory handle",
       [] { return CudaRegisterWith([](auto& r) { r.cuda_memory[0] = 0; }); },
       "CUDA memory handle is empty"},
      {"empty ready event",
       [] { return CudaRegisterWith([](auto& r) { r.cuda_ready_event[63] = 0; }); },
       "ready-event handle is empty"},
      {"CUDA offset beyond 1 TiB",
       [] { return CudaRegisterWith([](auto& r) { r.cuda_offset = (1ull << 40) + 1; }); },
       "CUDA offset"},
      {"ready round 0",
       [] {
         sparsync_ready m{};
         FillHeader(&m.header, SPARSYNC_MSG_READY, sizeof(m));
         return Bytes(m);
       },
       "round 0"},
      {"long token",
       [] {
         sparsync_hello m{};
         FillHeader(&m.header, SPARSYNC_MSG_HELLO, sizeof(m));
         m.token_len = 65;
         return Bytes(m);
       },
       "token"},
      {"reserved hello field",
       [] {
         sparsync_hello m{};
         FillHeader(&m.header, SPARSYNC_MSG_HELLO, sizeof(m));
         m.reserved = 3;
         return Bytes(m);
       },
       "reserved HELLO field"},
  };
}

// What a refused datagram claims to be decides the reply the worker gets (issue 16, D12).
TEST(CodecTest, ClaimsNameTheRepliesARefusalGets) {
  sparsync_hello hello{};
  FillHeader(&hello.header, SPARSYNC_MSG_HELLO, sizeof(hello));
  hello.header.version = 1;  // another version's HELLO is still answered
  EXPECT_EQ(ClaimOf(&hello, sizeof(hello)).type, SPARSYNC_MSG_HELLO);
  EXPECT_EQ(ClaimOf(&hello, 20).type, SPARSYNC_MSG_HELLO);
  sparsync_register_msg r = ValidRegister();
  r.dtype = 77;
  Claim claim = ClaimOf(&r, sizeof(r));
  EXPECT_EQ(claim.type, SPARSYNC_MSG_REGISTER);
  EXPECT_EQ(claim.tensor_id, 7u);
  EXPECT_EQ(ClaimOf(&r, sizeof(r) - 8).type, 0) << "a truncated REGISTER has no framing to trust";
  r.header.magic = 5;
  EXPECT_EQ(ClaimOf(&r, sizeof(r)).type, 0);
  EXPECT_EQ(ClaimOf("abc", 3).type, 0);
}

// Explicit allreduce, gradients and broadcast take CUDA tensors; the fields arrive unchanged.
TEST(CodecTest, AcceptsCudaTensorsOfInPlaceOps) {
  for (uint8_t op : {SPARSYNC_OP_GRADIENT, SPARSYNC_OP_ALLREDUCE, SPARSYNC_OP_BROADCAST}) {
    sparsync_register_msg r = ValidCudaRegister();
    r.op = op;
    auto decoded = DecodeStruct(r);
    ASSERT_TRUE(decoded.ok()) << "op " << int{op} << ": " << decoded.status().ToString();
    const auto& got = std::get<sparsync_register_msg>(*decoded);
    EXPECT_EQ(got.memory, SPARSYNC_MEMORY_CUDA);
    EXPECT_EQ(got.cuda_device, 3);
    EXPECT_EQ(got.cuda_offset, 4096u);
    EXPECT_EQ(std::memcmp(got.cuda_memory, r.cuda_memory, sizeof(r.cuda_memory)), 0);
    EXPECT_EQ(std::memcmp(got.cuda_ready_event, r.cuda_ready_event, sizeof(r.cuda_ready_event)), 0);
  }
}

// A process set's ranks arrive as a bitmask and leave MetaOf ascending; no bit is every rank.
TEST(CodecTest, ProcessSetRanksComeOutAscending) {
  sparsync_register_msg r = ValidRegister();
  r.op = SPARSYNC_OP_ALLREDUCE;
  auto meta = MetaOf(r);
  ASSERT_TRUE(meta.ok());
  EXPECT_TRUE(meta->members.empty());
  EXPECT_TRUE(meta->HasMember(5));
  r.members[0] = (uint64_t{1} << 63) | 0b100;  // ranks 2 and 63
  r.members[15] = uint64_t{1} << 63;             // rank 1023, the last a set may name
  ASSERT_TRUE(DecodeStruct(r).ok());
  meta = MetaOf(r);
  ASSERT_TRUE(meta.ok());
  EXPECT_EQ(meta->members, (std::vector<int32_t>{2, 63, 1023}));
  EXPECT_TRUE(meta->HasMember(63));
  EXPECT_FALSE(meta->HasMember(3));
  EXPECT_EQ(meta->Participants(2048), 3);
  EXPECT_NE(meta->Describe().find("process set [2,63,1023]"), std::string::npos);
  TensorMeta global = *meta;
  global.members.clear();
  EXPECT_NE(global.SignatureKey(), meta->SignatureKey()) << "the set is part of the signature";
}

// TIMELINE: a start names a path (no NUL, within the limit), a stop names none.
TEST(CodecTest, TimelineStartsWithAPathAndStopsWithout) {
  sparsync_timeline_msg t{};
  FillHeader(&t.header, SPARSYNC_MSG_TIMELINE, sizeof(t));
  t.start = 1;
  const std::string path = "/var/log/sparsync/t-{node}.json";
  t.path_len = static_cast<uint32_t>(path.size());
  std::memcpy(t.path, path.data(), path.size());
  auto ok = DecodeStruct(t);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(TimelinePath(std::get<sparsync_timeline_msg>(*ok)), path);
  sparsync_timeline_msg stop{};
  FillHeader(&stop.header, SPARSYNC_MSG_TIMELINE, sizeof(stop));
  auto stopped = DecodeStruct(stop);
  ASSERT_TRUE(stopped.ok());
  EXPECT_EQ(TimelinePath(std::get<sparsync_timeline_msg>(*stopped)), "");
  struct Bad {
    uint32_t start, len;
    bool nul;
    const char* phrase;
  };
  for (const Bad& b : {Bad{1, 0, false, "path length"}, Bad{1, SPARSYNC_MAX_PATH_BYTES + 1, false,
                                                            "path length"},
                       Bad{1, 8, true, "NUL"}, Bad{0, 3, false, "no path"},
                       Bad{2, 3, false, "0 or 1"}}) {
    sparsync_timeline_msg m = t;
    m.start = b.start;
    m.path_len = b.len;
    if (b.nul) m.path[3] = '\0';
    auto decoded = DecodeStruct(m);
    ASSERT_FALSE(decoded.ok()) << b.phrase;
    EXPECT_NE(decoded.status().message().find(b.phrase), std::string::npos)
        << decoded.status().message();
  }
}

TEST(CodecTest, RejectsEveryMalformedMessageWithAReason) {
  for (const Malformed& m : Corpus()) {
    std::vector<char> bytes = m.make();
    auto decoded = Decode(bytes.data(), bytes.size(), m.fds);
    ASSERT_FALSE(decoded.ok()) << m.what;
    EXPECT_NE(decoded.status().message().find(m.phrase), std::string::npos)
        << m.what << ": " << decoded.status().message();
  }
}

// Random mutations of valid messages: Decode must never crash or read out of bounds (run under
// AddressSanitizer with -DSPARSYNC_SANITIZE=ON), and whatever it accepts satisfies the invariants
// the rest of the daemon relies on.
TEST(CodecTest, FuzzedMessagesNeverBreakTheInvariants) {
  std::mt19937_64 rng(1234);
  std::vector<std::vector<char>> seeds = {Bytes(ValidRegister()), Bytes(ValidCudaRegister())};
  sparsync_ready ready{};
  FillHeader(&ready.header, SPARSYNC_MSG_READY, sizeof(ready));
  ready.round = 3;
  seeds.push_back(Bytes(ready));
  int accepted = 0;
  for (int iter = 0; iter < 200000; ++iter) {
    std::vector<char> b = seeds[iter % seeds.size()];
    int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) b[rng() % b.size()] = static_cast<char>(rng());
    if (rng() % 8 == 0) b.resize(rng() % (b.size() + 1));
    auto decoded = Decode(b.data(), b.size(), 0);
    if (!decoded.ok()) continue;
    ++accepted;
    if (auto* r = std::get_if<sparsync_register_msg>(&*decoded)) {
      ASSERT_LE(r->ndim, SPARSYNC_MAX_DIMS);
      ASSERT_GE(r->name_len, 1u);
      ASSERT_LE(r->name_len, SPARSYNC_MAX_NAME_BYTES);
      ASSERT_LT(r->dtype, SPARSYNC_DTYPE_COUNT);
      ASSERT_LT(r->op, SPARSYNC_OP_COUNT);
      ASSERT_LT(r->memory, SPARSYNC_MEMORY_COUNT);
      if (r->memory == SPARSYNC_MEMORY_CUDA) {
        ASSERT_GE(r->cuda_device, 0);
        ASSERT_NE(r->op, SPARSYNC_OP_ALLGATHER);
      }
      for (uint32_t i = 0; i < r->ndim; ++i) {
        ASSERT_GE(r->shape[i], 0);
      }
    }
    if (auto* rd = std::get_if<sparsync_ready>(&*decoded)) {
      ASSERT_GT(rd->round, 0u);
    }
  }
  // Mutations that only touch payload fields are still valid messages.
  EXPECT_GT(accepted, 0);
}

}  // namespace
}  // namespace sparsync::intake
