#include "daemon/observe/counting_transport.h"

namespace sparsync::observe {

void CountingTransport::Count(uint64_t sent, uint64_t received) {
  sent_.fetch_add(sent, std::memory_order_relaxed);
  received_.fetch_add(received, std::memory_order_relaxed);
}

Status CountingTransport::AllReduceSum(void* data, size_t count, transport::ElementType type,
                                       uint32_t tag) {
  SPARSYNC_RETURN_IF_ERROR(inner_->AllReduceSum(data, count, type, tag));
  const uint64_t bytes = count * transport::ElementSize(type);
  Count(bytes, bytes);
  return Status::Ok();
}

Status CountingTransport::AllReduceSumOnDevice(void* device_data, size_t count,
                                               transport::ElementType type, uint32_t tag) {
  SPARSYNC_RETURN_IF_ERROR(inner_->AllReduceSumOnDevice(device_data, count, type, tag));
  const uint64_t bytes = count * transport::ElementSize(type);
  Count(bytes, bytes);
  return Status::Ok();
}

Status CountingTransport::AllGatherV(const void* send, size_t send_bytes, void* recv,
                                     std::span<const size_t> recv_bytes, uint32_t tag) {
  SPARSYNC_RETURN_IF_ERROR(inner_->AllGatherV(send, send_bytes, recv, recv_bytes, tag));
  uint64_t others = 0;
  for (size_t n = 0; n < recv_bytes.size(); ++n) {
    if (static_cast<int>(n) != rank()) others += recv_bytes[n];
  }
  Count(send_bytes, others);
  return Status::Ok();
}

Status CountingTransport::Broadcast(void* data, size_t bytes, int root, uint32_t tag) {
  SPARSYNC_RETURN_IF_ERROR(inner_->Broadcast(data, bytes, root, tag));
  if (size() > 1) Count(root == rank() ? bytes : 0, root == rank() ? 0 : bytes);
  return Status::Ok();
}

Status CountingTransport::SendRecv(int peer, const void* send, size_t send_bytes, void* recv,
                                   size_t recv_capacity, size_t* recv_bytes, uint32_t tag) {
  SPARSYNC_RETURN_IF_ERROR(
      inner_->SendRecv(peer, send, send_bytes, recv, recv_capacity, recv_bytes, tag));
  if (peer != rank()) Count(send_bytes, *recv_bytes);
  return Status::Ok();
}

}  // namespace sparsync::observe
