#include "daemon/transport/transport.h"

namespace sparsync::transport {

size_t ElementSize(ElementType type) {
  switch (type) {
    case ElementType::kFloat32: case ElementType::kInt32: return 4;
    case ElementType::kFloat64: case ElementType::kInt64: return 8;
  }
  return 0;
}

}  // namespace sparsync::transport
