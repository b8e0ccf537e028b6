// Global top-k (gTop-k): S. Shi, Q. Wang, K. Zhao, Z. Tang, Y. Wang, X. Huang, X. Chu, "A
// Distributed Synchronous SGD Algorithm with Global Top-k Sparsification for Low Bandwidth
// Networks", ICDCS 2019 (gTopKAllReduce). docs/algorithms.md §7.2: log2 P rounds of pairwise
// merge-and-reselect, O(k log P) traffic instead of the allgather's O(k P).
//
// Round i (i = 0 .. log2 P - 1): exchange the current sparse set with node rank XOR 2^i
// (Transport::SendRecv, raw int32 indices then float32 values), add the two at equal indices,
// keep the k entries of largest |value| (ties: smaller index; NaN counts as largest), sorted by
// index. Both peers compute the same bits (a + b == b + a), so after the last round every node
// holds the same index set.
//
// Exact values (a correction round, our addition to the paper): the reselection works on partial
// sums, and an index can be dropped from one half of the nodes in an early round yet enter the
// final set through the other half; its value would then miss the dropped contributions. So once
// the final index set is known, every node contributes its own input value at each final index
// (0 where it has none) to one AllReduceSum of |final| floats (cheap: at most k values, bandwidth
// 2k(P-1)/P, below the k log P of the rounds). Hence out_values[j] is the sum over nodes of their
// input values at out_indices[j], kept_mask is exactly "my index is in the final set", and mass is
// conserved up to float rounding of the sums:
//   sum over nodes of inputs = sum(out_values) + sum over nodes of inputs with kept_mask == 0.
//
// Node counts that are not a power of two are refused with kInvalidArgument (see
// GlobalTopKSupports) before any communication; callers fall back to the allgather top-k.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "daemon/common/status.h"
#include "daemon/transport/transport.h"

namespace sparsync::pipeline {

// Whether GlobalTopK runs on `num_nodes` nodes (a power of two, 1 included). The same answer on
// every node; when false use the allgather top-k exchange.
bool GlobalTopKSupports(int num_nodes);

// Every node calls GlobalTopK with the same numel, k and *tag, in the same order relative to its
// other transport calls. `indices` (strictly ascending, in [0, numel)) and `values` are this
// node's local top-k selection. On success every node holds the same bits in:
//   *out_indices  the global set, strictly ascending, min(k, |union of all inputs|) entries;
//   *out_values   for each, the SUM over nodes of their input values there (not averaged);
//   *kept_mask    one byte per input entry: 1 if its index is in the global set (its value was
//                 delivered), 0 if not (the caller puts it back into its residual).
// Uses the tags *tag .. *tag + log2(P) and advances *tag by log2(P) + 1 whenever P is a power of
// two (errors included), so every node's tag counter stays in step. Errors: kInvalidArgument for a
// node count that is not a power of two (every node, no communication) or for malformed input (this
// node only; its peers then fail with the transport's timeout); transport errors as returned;
// kMismatch if a peer's k differs. REQUIRES: indices.size() == values.size() <= k, numel <= 2^31.
Status GlobalTopK(transport::Transport* t, int64_t numel, int64_t k,
                  std::span<const int32_t> indices, std::span<const float> values,
                  std::vector<int32_t>* out_indices, std::vector<float>* out_values,
                  std::vector<uint8_t>* kept_mask, uint32_t* tag);

}  // namespace sparsync::pipeline
