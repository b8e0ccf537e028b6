// SparseReducer: the sparse exchange of one merge group (DESIGN.md §1.6-1.7, ALGORITHMS.md §1-3).
// Per group: add the residual (error feedback), check for non-finite values, select with the
// configured kernels/ sparsifier, pack (sparse_payload.h), exchange every node's payload with an
// allgatherv (sizes first: k differs between nodes), decode and add them in node order, average.
// Every node ends with bit-identical results. Random-k with a shared seed picks the same indices
// on every node, so its values go through a dense allreduce of k numbers instead; gTop-k
// (gtopk.h) merges and reselects pairwise in log2 P rounds (power-of-two P; otherwise it falls back
// to the allgather exchange of local top-k).
//
// Not thread-safe: the executor's thread owns it.
#pragma once

#include <map>
#include <memory>
#include <span>
#include <vector>

#include "daemon/common/config.h"
#include "daemon/pipeline/sparse_payload.h"
#include "daemon/pipeline/tensor_state.h"
#include "daemon/transport/transport.h"
#include "kernels/dgc_state.h"
#include "kernels/sparsifier.h"

namespace sparsync::pipeline {

class SparseReducer {
 public:
  // REQUIRES: config.compressor != kNone.
  static Result<std::unique_ptr<SparseReducer>> Create(const Config& config, int node_rank,
                                                       int num_nodes,
                                                       transport::Transport* transport);

  // `group` holds this node's local sum of the group's tensors (slices give each tensor's part);
  // on return it holds the decompressed sum over all nodes divided by `divisor`. `step` and
  // `group_id` are the same on every node (they seed the random compressors). `*tag` is the
  // transport tag counter shared with the executor.
  Status Reduce(std::span<const GroupSlice> slices, std::span<float> group, uint64_t step,
                uint32_t group_id, double divisor, uint32_t* tag);

  const TensorState& state() const { return state_; }
  // Bytes this node sent in payloads so far (for the benchmarks and logs).
  uint64_t payload_bytes_sent() const { return payload_bytes_sent_; }

 private:
  SparseReducer(const Config& config, int node_rank, int num_nodes,
                transport::Transport* transport, std::unique_ptr<kernels::Sparsifier> sparsifier);
  Status Select(std::span<const float> work, uint64_t step, uint32_t group_id);
  Status ExchangeAllGather(std::span<const GroupSlice> slices, std::span<float> group,
                           bool locally_finite, uint32_t* tag, bool* skip);
  Status ExchangeGlobalTopK(std::span<const GroupSlice> slices, std::span<float> group,
                            bool locally_finite, uint32_t* tag, bool* skip);
  Status ExchangeSharedIndices(std::span<const GroupSlice> slices, std::span<float> group,
                               bool locally_finite, uint32_t* tag, bool* skip);
  void KeepResidual(std::span<const GroupSlice> slices, std::span<float> work,
                    std::span<const float> sent_values);

  const Config config_;
  const int node_rank_;
  const int num_nodes_;
  transport::Transport* const transport_;
  std::unique_ptr<kernels::Sparsifier> sparsifier_;
  const IndexCoding index_coding_;
  const ValueCoding value_coding_;
  int64_t prepared_ = -1;
  TensorState state_;
  kernels::DgcState dgc_;
  std::vector<float> work_;       // the group plus its residual: what is compressed
  std::vector<int32_t> indices_;  // the selection
  std::vector<float> values_;
  std::vector<uint8_t> payload_;  // this node's encoded payload
  std::vector<uint8_t> gathered_; // every node's payload
  uint64_t payload_bytes_sent_ = 0;
};

// The sparse reducers of a node, one per (compressor, density) in use, created on first use from
// the daemon's configuration: a gradient tensor may choose its own compressor at registration.
class SparseReducers {
 public:
  SparseReducers(Config base, int node_rank, int num_nodes, transport::Transport* transport);
  // The reducer for a tensor registered with `wire_compressor` (sparsync_compressor) and
  // `density` (0: the configured one); null when that resolves to no compression.
  Result<SparseReducer*> For(uint32_t wire_compressor, float density);
  uint64_t min_compress_bytes() const { return base_.min_compress_bytes; }

 private:
  const Config base_;
  const int node_rank_;
  const int num_nodes_;
  transport::Transport* const transport_;
  std::map<std::pair<Compressor, double>, std::unique_ptr<SparseReducer>> reducers_;
};

}  // namespace sparsync::pipeline
