// SparseReducer: the sparse exchange of one merge group (docs/algorithms.md §6-7).
// Per group: add the residual (error feedback), check for non-finite values, select with the
// configured kernels/ sparsifier, pack (sparse_payload.h), exchange every node's payload with an
// allgatherv (sizes first: k differs between nodes), decode and add them in node order, average.
// Every node ends with bit-identical results. Random-k with a shared seed picks the same indices
// on every node, so its values go through a dense allreduce of k numbers instead; gTop-k
// (gtopk.h) merges and reselects pairwise in log2 P rounds (power-of-two P; otherwise it falls back
// to the allgather exchange of local top-k).
//
// The work is split in two so that the executor can pipeline groups (issue 4, item 4): Prepare()
// does everything local (residual, non-finite check, selection, packing) into a PreparedGroup the
// caller owns, Exchange() makes every transport call and finishes the group. Reduce() does both.
//
// What is kept per tensor between steps (residuals, DGC's state) is in the node's TensorState,
// shared with the device paths.
//
// Threads: at most one thread calls Prepare() and at most one (possibly another) calls Exchange()
// and Reduce(); they may run at the same time on different PreparedGroups of disjoint tensors.
// The TensorState is thread-safe; everything else is touched by one of the two sides only.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "daemon/common/config.h"
#include "daemon/pipeline/step_marks.h"
#include "daemon/pipeline/sparse_payload.h"
#include "daemon/pipeline/tensor_state.h"
#include "daemon/transport/transport.h"
#include "kernels/dgc_state.h"
#include "kernels/sparsifier.h"

namespace sparsync::pipeline {

// What Prepare() made of one group: everything Exchange() needs, owned by the caller so that
// preparing the next group cannot overwrite what is being exchanged. Reusable: vectors keep their
// capacity between groups.
struct PreparedGroup {
  bool finite = true;            // false: this node's group holds NaN/Inf (skip policy)
  std::string nonfinite_tensor;  // the first such tensor, for the warning
  std::vector<float> work;       // the group plus its residual: what was compressed
  // PrepareInPlace made it: each slice's residual holds its part of the group plus the residual
  // (what was compressed), in place of `work`.
  bool in_place = false;
  std::vector<std::span<float>> residuals;
  std::vector<std::span<const float>> pieces;  // the same, as the sparsifier reads them
  std::vector<int32_t> indices;  // the selection
  std::vector<float> values;
  std::vector<float> delivered;  // what the peers decode of our selection (allgather path)
  std::vector<uint8_t> payload;  // our encoded payload (allgather path)
  size_t payload_bytes = 0;
  kernels::DgcState dgc;  // DGC's momentum and accumulation after the selection
  StepMarks* marks = nullptr;  // where the reducer marks its sub-steps (null: nowhere)
};

// A tensor's float32 buffers on this node, for the in-place reduction: one per local worker.
using LocalBuffers = std::span<const std::span<float>>;

class SparseReducer {
 public:
  // REQUIRES: config.compressor != kNone. `state` (null: one of its own) outlives the reducer.
  static Result<std::unique_ptr<SparseReducer>> Create(const Config& config, int node_rank,
                                                       int num_nodes,
                                                       transport::Transport* transport,
                                                       TensorState* state = nullptr);

  // Stage A, no transport call. `group` holds this node's local sum of the group's tensors
  // (slices give each tensor's part). `step` and `group_id` are the same on every node (they seed
  // the random compressors). Errors here (a non-finite value under SPARSYNC_NONFINITE=error, a
  // sparsifier failure) are this node's; the caller must not start the exchange.
  Status Prepare(std::span<const GroupSlice> slices, std::span<const float> group, uint64_t step,
                 uint32_t group_id, PreparedGroup* prepared);
  // Prepare() for a group whose local sum the caller wrote into prepared->work itself (sized to
  // the group), saving the copy.
  Status PrepareWork(std::span<const GroupSlice> slices, uint64_t step, uint32_t group_id,
                     PreparedGroup* prepared);
  // Whether PrepareInPlace() and ExchangeInPlace() take this reducer's groups: top-k with error
  // feedback, exchanged by allgather (the sparsifier selects over pieces).
  bool ReducesInPlace() const;
  // Stage A without a group-sized buffer. `inputs[i]` holds slice i's float32 buffers on this
  // node (its local workers' regions, at least one): their sum, formed element by element in
  // the order SumInto forms it, is the node's part. They are read, not written. Each tensor's
  // residual takes its sum in place and the selection is made over the residuals. Otherwise as
  // Prepare(). REQUIRES: ReducesInPlace().
  Status PrepareInPlace(std::span<const GroupSlice> slices, std::span<const LocalBuffers> inputs,
                        uint64_t step, uint32_t group_id, PreparedGroup* prepared);
  // Stage B of a group from PrepareInPlace(): Exchange() with the result written into every one
  // of `inputs` (the same buffers): the decompressed sum over all nodes divided by `divisor`, bit
  // for bit what SumInto, Prepare() and Exchange() over the joined group give, with the same
  // residuals after.
  Status ExchangeInPlace(std::span<const GroupSlice> slices, PreparedGroup& prepared,
                         std::span<const LocalBuffers> inputs, double divisor, uint32_t* tag);
  // Stage B: every transport call of the group, in the same order on every node. On return
  // `group` holds the decompressed sum over all nodes divided by `divisor`; the residuals of
  // `slices` are updated. `*tag` is the transport tag counter shared with the executor.
  // REQUIRES: `prepared` came from Prepare() with the same slices and group size. `group` may be
  // prepared.work itself when DecodesIntoWork() (one group-sized buffer less).
  Status Exchange(std::span<const GroupSlice> slices, PreparedGroup& prepared,
                  std::span<float> group, double divisor, uint32_t* tag);
  // Whether Exchange() finishes with prepared.work before it writes `group` (the allgather
  // exchange), so that the two may be one buffer.
  bool DecodesIntoWork() const;
  // Prepare() then Exchange() on the calling thread, with a scratch PreparedGroup.
  Status Reduce(std::span<const GroupSlice> slices, std::span<float> group, uint64_t step,
                uint32_t group_id, double divisor, uint32_t* tag);

  // The device top-k path (device/device_topk_path.h) selects on the GPU and uses this reducer
  // for the rest: whether this one's groups may go there (SelectsOnDevice(config) below).
  bool SelectsOnDevice() const;
  // Whether the payload carries float16 values (SPARSYNC_VALUE_DTYPE=float16).
  bool SendsFloat16() const { return value_coding_ == ValueCoding::kFloat16; }
  // k for a group of n elements.
  int64_t SelectedCount(int64_t n) const;
  // Stage A after a selection made elsewhere: `prepared` holds finite, nonfinite_index and, when
  // finite, indices and values of a group of `n` elements. Applies the non-finite policy (the
  // error names the tensor) and encodes the payload.
  Status PrepareSelected(std::span<const GroupSlice> slices, int64_t n, int64_t nonfinite_index,
                         float nonfinite_value, PreparedGroup* prepared);
  // Stage B of the device path: the transport calls of Exchange() for the allgather exchange,
  // leaving every node's decoded payload in node order in `payloads` (empty when `*skip`: some
  // node's group was not finite). Touches no residual.
  Status ExchangeSelected(PreparedGroup& prepared, int64_t n, uint32_t* tag, bool* skip,
                          std::vector<DecodedSparse>* payloads);

  // For tests and the conservation checks; call only while no Exchange() runs.
  const TensorState& state() const { return *state_; }
  // Bytes this node sent in payloads so far (for the benchmarks and logs).
  uint64_t payload_bytes_sent() const { return payload_bytes_sent_; }

 private:
  SparseReducer(const Config& config, int node_rank, int num_nodes, transport::Transport* transport,
                std::unique_ptr<kernels::Sparsifier> sparsifier, TensorState* state);
  // Applies the non-finite policy to `bad` (the first such element, -1: none) and resets
  // `prepared` for a new group.
  Status StartPreparing(std::span<const GroupSlice> slices, int64_t bad, float bad_value,
                        bool in_place, PreparedGroup* prepared);
  // TensorState::CloseResidual for each slice: the in-place group is done with its residuals.
  void CloseResiduals(std::span<const GroupSlice> slices);
  // Selects from prepared->work, or from the residuals of an in-place group.
  Status Select(uint64_t step, uint32_t group_id, PreparedGroup* prepared);
  // Encodes the selection; `with_delivered`: also what the peers decode of it (error feedback).
  Status Pack(int64_t n, bool with_delivered, PreparedGroup* prepared);
  // The allgather exchange's transport calls: sizes and flags, then the payloads into gathered_.
  Status GatherPayloads(PreparedGroup& prepared, uint32_t* tag, bool* skip,
                        std::vector<size_t>* payload_bytes);
  Status ExchangeGlobalTopK(std::span<float> group, PreparedGroup& prepared, uint32_t* tag,
                            bool* skip, std::vector<float>* delivered);
  Status ExchangeSharedIndices(std::span<float> group, PreparedGroup& prepared, uint32_t* tag,
                               bool* skip);
  // Every node's payload in gathered_ (sizes `payload_bytes`), decoded and added into `group`
  // (its pieces laid end to end, zeroed first) in node order.
  Status DecodeAll(const std::vector<size_t>& payload_bytes,
                   std::span<const std::span<float>> group);
  // After a finite exchange: the residuals (what was to be sent minus `delivered`, what the
  // peers decoded of this node's selection) and DGC's state, from prepared.work (or in place).
  void KeepState(std::span<const GroupSlice> slices, PreparedGroup& prepared,
                 const std::vector<float>& delivered);
  // The warning of a node whose group was not finite, when the step is skipped.
  void WarnSkipped(const PreparedGroup& prepared) const;
  bool UsesGlobalTopK() const;
  bool UsesAllGather() const;

  const Config config_;
  const int node_rank_;
  const int num_nodes_;
  transport::Transport* const transport_;
  // Stage A only.
  std::unique_ptr<kernels::Sparsifier> sparsifier_;
  const IndexCoding index_coding_;
  const ValueCoding value_coding_;
  int64_t prepared_ = -1;  // the sparsifier's prepared capacity
  PreparedGroup scratch_;  // Reduce()'s
  // Both stages: residuals are read when a group is prepared and written when it is exchanged.
  std::unique_ptr<TensorState> own_state_;  // when Create got none
  TensorState* const state_;
  // Stage B only.
  std::vector<uint8_t> gathered_;  // every node's payload
  std::atomic<uint64_t> payload_bytes_sent_{0};
};

// Whether groups under `config` may be selected on the GPU (DeviceTopKPath): top-k with error
// feedback, with float32 values or float16 ones (whose rounding the device puts back into the
// residual), so the residual the device keeps needs no correction from the host.
bool SelectsOnDevice(const Config& config);

// The configuration of a tensor registered with `compressor` (nullopt: the configured one) and
// `density` (0: the configured one): `base` with the tensor's own choices applied.
Config TensorConfig(const Config& base, std::optional<Compressor> compressor, float density);

// The sparse reducers of a node, one per (compressor, density) in use, created on first use from
// the daemon's configuration: a gradient tensor may choose its own compressor at registration.
// For() is called by the preparing side only (one thread).
class SparseReducers {
 public:
  SparseReducers(Config base, int node_rank, int num_nodes, transport::Transport* transport);
  // The reducer for a tensor registered with `compressor` (nullopt: the configured one) and
  // `density` (0: the configured one) at its step `step` (0-based: round - 1), whose density
  // follows SPARSYNC_DENSITY_WARMUP_STEPS' schedule; null when that resolves to no compression.
  // The reducers of one compressor share the per-tensor state, so residuals carry across the
  // warm-up's densities.
  Result<SparseReducer*> For(std::optional<Compressor> compressor, float density,
                             uint64_t step = 0);
  uint64_t min_compress_bytes() const { return base_.min_compress_bytes; }
  // The node's per-tensor state, shared by every reducer and the device paths.
  TensorState& state() { return state_; }
  // Drops everything kept for `name` (residual, DGC's momentum and accumulation, on the host or a
  // device): the tensor is gone, and a later one of that name starts afresh. REQUIRES: no group
  // of it in flight.
  void Forget(const std::string& name) { state_.Forget(name); }

 private:
  const Config base_;
  const int node_rank_;
  const int num_nodes_;
  transport::Transport* const transport_;
  TensorState state_;
  std::map<std::pair<Compressor, double>, std::unique_ptr<SparseReducer>> reducers_;
};

}  // namespace sparsync::pipeline
