// What a tensor is, in the daemon's own types: its element type, the collective it takes part in,
// how it is reduced and compressed, and TensorMeta, which identifies it across nodes.
//
// The numbers of these enums on the wire (proto/intake/wire.h, reused by coordinator.proto) are
// converted here and only at the two edges that receive them: the intake codec (a worker's
// REGISTER) and the gRPC conversion (another node's report). Everything behind those edges uses
// the enums; an unknown number never gets past them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "daemon/common/status.h"

namespace sparsync {

enum class DType : uint8_t { kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kUInt8 };
size_t DTypeSize(DType dtype);
const char* DTypeName(DType dtype);

enum class CollectiveOp : uint8_t {
  kAllReduce,  // explicit allreduce: always exact
  kAllGather,  // concatenation along dim 0 in global rank order
  kBroadcast,  // from one global rank
  kGradient,   // gradient reduction: the daemon may compress it
};
const char* OpName(CollectiveOp op);
// Whether `op` sums the workers' tensors (allreduce and gradient).
inline bool Reduces(CollectiveOp op) {
  return op == CollectiveOp::kAllReduce || op == CollectiveOp::kGradient;
}

enum class ReduceOp : uint8_t { kAverage, kSum };

// Gradient compressors (docs/algorithms.md §7). kNone: the exact dense path.
enum class Compressor { kNone, kTopK, kRandomK, kThreshold, kGaussianK, kWangni, kDgc, kGTopK };
inline constexpr int kCompressorCount = 8;
const char* CompressorName(Compressor c);

// Where a worker's tensor lives.
enum class Memory : uint8_t { kHost, kCuda };

// Wire numbers (sparsync_dtype, sparsync_op, ...) to and from the enums. The From* functions
// fail with kInvalidArgument naming the field for a number the protocol does not define.
Result<DType> DTypeFromWire(uint32_t wire);
Result<CollectiveOp> OpFromWire(uint32_t wire);
Result<ReduceOp> ReduceOpFromWire(uint32_t wire);
// SPARSYNC_COMPRESSOR_DEFAULT is std::nullopt: the daemon's configured compressor.
Result<std::optional<Compressor>> CompressorFromWire(uint32_t wire);
Result<Memory> MemoryFromWire(uint32_t wire);
uint32_t ToWire(DType dtype);
uint32_t ToWire(CollectiveOp op);
uint32_t ToWire(ReduceOp op);
uint32_t ToWire(std::optional<Compressor> compressor);

// "[0,2,5]": a process set's ranks, for messages.
std::string RanksText(const std::vector<int32_t>& ranks);

// What identifies a tensor across nodes (see TensorMeta in coordinator.proto).
struct TensorMeta {
  std::string name;
  CollectiveOp op = CollectiveOp::kAllReduce;
  DType dtype = DType::kFloat32;
  ReduceOp reduce_op = ReduceOp::kAverage;
  int32_t root_rank = 0;  // BROADCAST: the global rank it comes from
  std::vector<int64_t> shape;
  std::optional<Compressor> compressor;  // GRADIENT only; nullopt: the daemon's
  float density = 0;                     // GRADIENT only; 0: the daemon's
  // The process set: ascending global ranks, the only workers that take part. Empty: every rank.
  std::vector<int32_t> members;
  // A grouped collective: one of `group_size` tensors of key `group`, scheduled as one. 0: none.
  uint64_t group = 0;
  uint32_t group_size = 0;

  // Whether global rank `rank` takes part (every rank when `members` is empty).
  bool HasMember(int rank) const;
  // How many workers take part in a job of `world_size` workers.
  int Participants(int world_size) const {
    return members.empty() ? world_size : static_cast<int>(members.size());
  }

  // Equal keys <=> same tensor on every node. ALLGATHER ignores the first dimension.
  std::string SignatureKey() const;
  // "op allreduce, dtype float32, shape [512,784]" for error messages.
  std::string Describe() const;
  int64_t NumElements() const;
  size_t Bytes() const { return static_cast<size_t>(NumElements()) * DTypeSize(dtype); }
  bool operator==(const TensorMeta&) const = default;
};

}  // namespace sparsync
