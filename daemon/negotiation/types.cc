#include "daemon/negotiation/types.h"

#include <sstream>

#include "proto/intake/wire.h"

namespace sparsync::negotiation {

std::string DTypeName(uint32_t dtype) {
  switch (dtype) {
    case SPARSYNC_FLOAT32: return "float32";
    case SPARSYNC_FLOAT64: return "float64";
    case SPARSYNC_FLOAT16: return "float16";
    case SPARSYNC_BFLOAT16: return "bfloat16";
    case SPARSYNC_INT32: return "int32";
    case SPARSYNC_INT64: return "int64";
    case SPARSYNC_UINT8: return "uint8";
  }
  return "dtype#" + std::to_string(dtype);
}

size_t DTypeSize(uint32_t dtype) {
  return sparsync_dtype_size(dtype);
}

std::string OpName(uint32_t op) {
  switch (op) {
    case SPARSYNC_OP_ALLREDUCE: return "allreduce";
    case SPARSYNC_OP_ALLGATHER: return "allgather";
    case SPARSYNC_OP_BROADCAST: return "broadcast";
    case SPARSYNC_OP_GRADIENT: return "gradient";
  }
  return "op#" + std::to_string(op);
}

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

std::string TensorMeta::SignatureKey() const {
  std::ostringstream o;
  o << name << '\0' << op << ':' << dtype << ':' << reduce_op << ':' << root_rank << ':'
    << ShapeText(shape, op == SPARSYNC_OP_ALLGATHER) << ':' << compressor << ':' << density;
  return o.str();
}

std::string TensorMeta::Describe() const {
  std::ostringstream o;
  o << "op " << OpName(op) << ", dtype " << DTypeName(dtype) << ", shape "
    << ShapeText(shape, op == SPARSYNC_OP_ALLGATHER);
  if (op == SPARSYNC_OP_BROADCAST) o << ", root rank " << root_rank;
  if (compressor != SPARSYNC_COMPRESSOR_DEFAULT) o << ", compressor #" << compressor;
  if (density != 0) o << ", density " << density;
  if (op == SPARSYNC_OP_ALLREDUCE || op == SPARSYNC_OP_GRADIENT) {
    o << ", reduce " << (reduce_op == SPARSYNC_REDUCE_SUM ? "sum" : "average");
  }
  return o.str();
}

int64_t TensorMeta::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace sparsync::negotiation
