#include "daemon/common/tensor_meta.h"

#include <algorithm>
#include <iterator>
#include <sstream>

#include "proto/intake/wire.h"

namespace sparsync {

namespace {

struct DTypeInfo {
  const char* name;
  size_t size;
};
// By DType, in its order.
constexpr DTypeInfo kDTypes[] = {{"float32", 4}, {"float64", 8}, {"float16", 2}, {"bfloat16", 2},
                                 {"int32", 4},   {"int64", 8},   {"uint8", 1}};
static_assert(std::size(kDTypes) == static_cast<size_t>(DType::kUInt8) + 1);

}  // namespace

size_t DTypeSize(DType dtype) { return kDTypes[static_cast<size_t>(dtype)].size; }

const char* DTypeName(DType dtype) { return kDTypes[static_cast<size_t>(dtype)].name; }

const char* OpName(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kAllReduce: return "allreduce";
    case CollectiveOp::kAllGather: return "allgather";
    case CollectiveOp::kBroadcast: return "broadcast";
    case CollectiveOp::kGradient: return "gradient";
  }
  return "?";
}

const char* CompressorName(Compressor c) {
  switch (c) {
    case Compressor::kNone: return "none";
    case Compressor::kTopK: return "topk";
    case Compressor::kRandomK: return "randomk";
    case Compressor::kThreshold: return "threshold";
    case Compressor::kGaussianK: return "gaussiank";
    case Compressor::kWangni: return "wangni";
    case Compressor::kDgc: return "dgc";
    case Compressor::kGTopK: return "gtopk";
  }
  return "?";
}

// ---- Wire numbers ----
// The enums are declared in the wire's order, so a conversion is a range check; the
// static_asserts keep the two in step.

static_assert(static_cast<int>(DType::kUInt8) == SPARSYNC_UINT8 &&
              static_cast<int>(DType::kBFloat16) == SPARSYNC_BFLOAT16 &&
              SPARSYNC_DTYPE_COUNT == 7);
static_assert(static_cast<int>(CollectiveOp::kGradient) == SPARSYNC_OP_GRADIENT &&
              static_cast<int>(CollectiveOp::kBroadcast) == SPARSYNC_OP_BROADCAST &&
              SPARSYNC_OP_COUNT == 4);
static_assert(static_cast<int>(ReduceOp::kSum) == SPARSYNC_REDUCE_SUM && SPARSYNC_REDUCE_COUNT == 2);
static_assert(static_cast<int>(Compressor::kGTopK) + 1 == SPARSYNC_COMPRESSOR_GTOPK &&
              static_cast<int>(Compressor::kNone) + 1 == SPARSYNC_COMPRESSOR_NONE &&
              kCompressorCount + 1 == SPARSYNC_COMPRESSOR_COUNT);
static_assert(static_cast<int>(Memory::kCuda) == SPARSYNC_MEMORY_CUDA && SPARSYNC_MEMORY_COUNT == 2);

namespace {

template <typename E>
Result<E> InRange(uint32_t wire, uint32_t count, const char* field) {
  if (wire >= count) {
    return InvalidArgument(std::string("unknown ") + field + " " + std::to_string(wire));
  }
  return static_cast<E>(wire);
}

}  // namespace

Result<DType> DTypeFromWire(uint32_t wire) {
  return InRange<DType>(wire, SPARSYNC_DTYPE_COUNT, "dtype");
}
Result<CollectiveOp> OpFromWire(uint32_t wire) {
  return InRange<CollectiveOp>(wire, SPARSYNC_OP_COUNT, "op");
}
Result<ReduceOp> ReduceOpFromWire(uint32_t wire) {
  return InRange<ReduceOp>(wire, SPARSYNC_REDUCE_COUNT, "reduce op");
}
Result<Memory> MemoryFromWire(uint32_t wire) {
  return InRange<Memory>(wire, SPARSYNC_MEMORY_COUNT, "memory kind");
}
Result<std::optional<Compressor>> CompressorFromWire(uint32_t wire) {
  if (wire == SPARSYNC_COMPRESSOR_DEFAULT) return std::optional<Compressor>();
  SPARSYNC_ASSIGN_OR_RETURN(Compressor c,
                            InRange<Compressor>(wire - 1, kCompressorCount, "compressor"));
  return std::optional<Compressor>(c);
}

uint32_t ToWire(DType dtype) { return static_cast<uint32_t>(dtype); }
uint32_t ToWire(CollectiveOp op) { return static_cast<uint32_t>(op); }
uint32_t ToWire(ReduceOp op) { return static_cast<uint32_t>(op); }
uint32_t ToWire(std::optional<Compressor> compressor) {
  if (!compressor) return SPARSYNC_COMPRESSOR_DEFAULT;
  return static_cast<uint32_t>(*compressor) + 1;
}

// ---- TensorMeta ----

namespace {

std::string ShapeText(const std::vector<int64_t>& shape, bool skip_dim0) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) o << ",";
    if (i == 0 && skip_dim0) {
      o << "*";
    } else {
      o << shape[i];
    }
  }
  o << "]";
  return o.str();
}

}  // namespace

std::string RanksText(const std::vector<int32_t>& ranks) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < ranks.size(); ++i) o << (i ? "," : "") << ranks[i];
  o << "]";
  return o.str();
}

std::string TensorMeta::SignatureKey() const {
  std::ostringstream o;
  o << name << '\0' << ToWire(op) << ':' << ToWire(dtype) << ':' << ToWire(reduce_op) << ':'
    << root_rank << ':' << ShapeText(shape, op == CollectiveOp::kAllGather) << ':'
    << ToWire(compressor) << ':' << density << ':' << RanksText(members) << ':'
    << group << ':' << group_size;
  return o.str();
}

bool TensorMeta::HasMember(int rank) const {
  return members.empty() || std::binary_search(members.begin(), members.end(), rank);
}

std::string TensorMeta::Describe() const {
  std::ostringstream o;
  o << "op " << OpName(op) << ", dtype " << DTypeName(dtype) << ", shape "
    << ShapeText(shape, op == CollectiveOp::kAllGather);
  if (op == CollectiveOp::kBroadcast) o << ", root rank " << root_rank;
  if (compressor) o << ", compressor " << CompressorName(*compressor);
  if (density != 0) o << ", density " << density;
  if (Reduces(op)) o << ", reduce " << (reduce_op == ReduceOp::kSum ? "sum" : "average");
  if (!members.empty()) o << ", process set " << RanksText(members);
  if (group_size != 0) o << ", one of a group of " << group_size << " (key " << group << ")";
  return o.str();
}

int64_t TensorMeta::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace sparsync
