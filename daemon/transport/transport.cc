#include "daemon/transport/transport.h"

#include <string>

namespace sparsync::transport {

size_t ElementSize(ElementType type) {
  switch (type) {
    case ElementType::kFloat32: case ElementType::kInt32: return 4;
    case ElementType::kFloat64: case ElementType::kInt64: return 8;
  }
  return 0;
}

Status Transport::AllReduceSumOnDevice(void*, size_t, ElementType, uint32_t tag) {
  return InvalidArgument("allreduce " + std::to_string(tag) +
                         ": this transport takes host memory only, not CUDA device memory");
}

}  // namespace sparsync::transport
