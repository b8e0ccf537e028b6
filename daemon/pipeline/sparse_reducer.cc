#include "daemon/pipeline/sparse_reducer.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include "daemon/pipeline/dense_math.h"
#include "daemon/pipeline/gtopk.h"
#include "kernels/pieces.h"

namespace sparsync::pipeline {
namespace {

void Mark(PreparedGroup* prepared, const char* step) {
  if (prepared->marks) prepared->marks->Add(step);
}

// SplitMix64 finaliser: a seed per (job, node, step, group) for the random compressors.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// gTop-k selects locally with the top-k kernel; the global selection is the exchange's.
const char* KernelName(Compressor c) {
  return c == Compressor::kGTopK ? "topk" : CompressorName(c);
}

// Index of the first non-finite element, or -1.
int64_t FirstNonFinite(std::span<const float> x) {
  bool all_finite = true;
  for (float v : x) all_finite &= std::isfinite(v);  // vectorisable; the search below is rare
  if (all_finite) return -1;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(x[i])) return static_cast<int64_t>(i);
  }
  return -1;
}

// Element j summed over the node's workers, added in worker order as SumInto adds them.
float WorkersSum(LocalBuffers in, size_t j) {
  float sum = in[0][j];
  for (size_t w = 1; w < in.size(); ++w) sum += in[w][j];
  return sum;
}

// The first element at which the sum of `in` (WorkersSum) is not finite, or -1; *value gets that
// sum.
int64_t FirstNonFiniteSum(LocalBuffers in, size_t count, float* value) {
  if (in.size() == 1) {
    const int64_t at = FirstNonFinite(in[0]);
    if (at >= 0) *value = in[0][static_cast<size_t>(at)];
    return at;
  }
  for (size_t j = 0; j < count; ++j) {
    const float sum = WorkersSum(in, j);
    if (!std::isfinite(sum)) {
      *value = sum;
      return static_cast<int64_t>(j);
    }
  }
  return -1;
}

// residual += the sum of `in` (a fresh residual becomes the sum): the same float additions as
// PrepareWork's `work = sum; work += residual`, signed zeros included.
void AddLocalSum(LocalBuffers in, bool fresh, std::span<float> residual) {
  float* r = residual.data();
  const size_t count = residual.size();
  if (in.size() == 1) {
    const float* g = in[0].data();
    if (fresh) {
      std::memcpy(r, g, count * sizeof(float));
    } else {
      for (size_t j = 0; j < count; ++j) r[j] += g[j];
    }
    return;
  }
  for (size_t j = 0; j < count; ++j) {
    const float sum = WorkersSum(in, j);
    r[j] = fresh ? sum : r[j] + sum;
  }
}

const std::string& SliceName(std::span<const GroupSlice> slices, int64_t element) {
  for (const GroupSlice& s : slices) {
    if (static_cast<size_t>(element) < s.offset + s.count) return *s.name;
  }
  return *slices.back().name;
}

Status NonFiniteStatus(std::span<const GroupSlice> slices, int64_t element, float value,
                       int node_rank) {
  return InvalidArgument("tensor '" + SliceName(slices, element) +
                         "' holds a non-finite gradient (" + std::to_string(value) + ") on node " +
                         std::to_string(node_rank) +
                         "; set SPARSYNC_NONFINITE=skip to drop such steps instead");
}

struct SizeRecord {
  uint64_t payload_bytes;
  uint64_t nonfinite;  // 1: this node's group held NaN/Inf (skip policy)
};

}  // namespace

Result<std::unique_ptr<SparseReducer>> SparseReducer::Create(const Config& config, int node_rank,
                                                             int num_nodes,
                                                             transport::Transport* transport,
                                                             TensorState* state) {
  kernels::SparsifierOptions options;
  options.density = config.density;
  options.threshold = config.threshold;
  options.shared_seed = config.compressor == Compressor::kRandomK;
  // Without error feedback random-k sends x_i * d/k, the unbiased estimator (docs/algorithms.md
  // §7.3); with it, x_i itself, and the residual keeps the rest.
  options.unbiased = config.compressor == Compressor::kRandomK && !config.ErrorFeedback();
  options.warmup = false;  // the daemon does not know epochs; see the note in README
  auto sparsifier = kernels::MakeSparsifier(KernelName(config.compressor), options);
  if (!sparsifier.ok()) {
    return InvalidArgument("SPARSYNC_COMPRESSOR=" + std::string(KernelName(config.compressor)) +
                           ": " + sparsifier.status().message());
  }
  if (config.compressor == Compressor::kGTopK && !GlobalTopKSupports(num_nodes)) {
    spdlog::warn(
        "gtopk needs a power-of-two node count, this job has {}: using the allgather "
        "top-k exchange instead",
        num_nodes);
  }
  std::unique_ptr<TensorState> own;
  if (state == nullptr) {
    own = std::make_unique<TensorState>();
    state = own.get();
  }
  std::unique_ptr<SparseReducer> reducer(
      new SparseReducer(config, node_rank, num_nodes, transport, std::move(*sparsifier), state));
  reducer->own_state_ = std::move(own);
  return reducer;
}

SparseReducer::SparseReducer(const Config& config, int node_rank, int num_nodes,
                             transport::Transport* transport,
                             std::unique_ptr<kernels::Sparsifier> sparsifier,
                             TensorState* state)
    : config_(config),
      node_rank_(node_rank),
      num_nodes_(num_nodes),
      transport_(transport),
      sparsifier_(std::move(sparsifier)),
      index_coding_(config.index_coding),
      value_coding_(config.compressor == Compressor::kWangni     ? ValueCoding::kSignScale
                    : config.value_dtype == ValueDType::kFloat16 ? ValueCoding::kFloat16
                                                                 : ValueCoding::kFloat32),
      state_(state) {}

bool SparseReducer::UsesGlobalTopK() const {
  return config_.compressor == Compressor::kGTopK && GlobalTopKSupports(num_nodes_);
}

bool SparseReducer::UsesAllGather() const {
  return config_.compressor != Compressor::kRandomK && !UsesGlobalTopK();
}

Status SparseReducer::Select(uint64_t step, uint32_t group_id, PreparedGroup* prepared) {
  const auto started = std::chrono::steady_clock::now();
  const std::vector<float>& work = prepared->work;
  const int64_t n = prepared->in_place ? kernels::TotalElements<const float>(prepared->pieces)
                                       : static_cast<int64_t>(work.size());
  if (n > prepared_) {
    auto st = sparsifier_->Prepare(n, kernels::DType::kFloat32);
    if (!st.ok()) return Internal("preparing the sparsifier: " + st.message());
    prepared_ = n;
  }
  const int64_t capacity = sparsifier_->MaxSelected(n);
  prepared->indices.resize(static_cast<size_t>(capacity));
  prepared->values.resize(static_cast<size_t>(capacity));
  kernels::SparseView out{prepared->indices.data(), prepared->values.data(), capacity, 0};
  kernels::SparsifyContext ctx;
  ctx.seed = Mix(Mix(Mix(config_.seed) ^ static_cast<uint64_t>(node_rank_)) ^ step) ^ group_id;
  ctx.shared_seed = Mix(Mix(config_.seed) ^ step) ^ group_id;
  ctx.step = static_cast<int64_t>(step);
  ctx.dgc_state = &prepared->dgc;
  auto st = prepared->in_place
                ? sparsifier_->SparsifyPieces(prepared->pieces, &out, ctx)
                : sparsifier_->Sparsify({work.data(), n, kernels::DType::kFloat32}, &out, ctx);
  if (!st.ok()) return Internal("sparsifying: " + st.message());
  prepared->indices.resize(static_cast<size_t>(out.k));
  prepared->values.resize(static_cast<size_t>(out.k));
  if (config_.emulated_select_cost > 0 && n > 1) {
    // SPARSYNC_EMULATE_SELECT_COST: the selection lasts as long as the modelled GPU's would
    // (e.g. OMGS-SGD's fit of a GPU top-k, 2.19e-10 * n * log2 n s); the CPU's own time counts.
    const double seconds =
        config_.emulated_select_cost * static_cast<double>(n) * std::log2(static_cast<double>(n));
    std::this_thread::sleep_until(started + std::chrono::duration<double>(seconds));
  }
  return Status::Ok();
}

Status SparseReducer::Pack(int64_t n, bool with_delivered, PreparedGroup* prepared) {
  prepared->payload.resize(MaxEncodedBytes(n, static_cast<int64_t>(prepared->indices.size()),
                                           index_coding_, value_coding_));
  auto written = Encode({n, prepared->indices, prepared->values}, index_coding_, value_coding_,
                        prepared->payload);
  if (!written.ok()) return written.status().WithContext("encoding a sparse payload");
  prepared->payload_bytes = *written;
  if (with_delivered && config_.ErrorFeedback()) {
    // What the peers decode from our payload, exactly (float16 rounding, Wangni's shared scale).
    auto ours = Decode(std::span<const uint8_t>(prepared->payload.data(), *written));
    if (!ours.ok()) return ours.status().WithContext("decoding our own payload");
    prepared->delivered = std::move(ours->values);
  }
  return Status::Ok();
}

Status SparseReducer::Prepare(std::span<const GroupSlice> slices, std::span<const float> group,
                              uint64_t step, uint32_t group_id, PreparedGroup* prepared) {
  prepared->work.assign(group.begin(), group.end());
  return PrepareWork(slices, step, group_id, prepared);
}

Status SparseReducer::StartPreparing(std::span<const GroupSlice> slices, int64_t bad,
                                     float bad_value, bool in_place, PreparedGroup* prepared) {
  if (bad >= 0 && config_.nonfinite == NonFinitePolicy::kError) {
    return NonFiniteStatus(slices, bad, bad_value, node_rank_);
  }
  prepared->finite = bad < 0;
  prepared->nonfinite_tensor = prepared->finite ? std::string() : SliceName(slices, bad);
  prepared->in_place = in_place;
  prepared->residuals.clear();
  prepared->pieces.clear();
  prepared->indices.clear();
  prepared->values.clear();
  prepared->delivered.clear();
  prepared->payload_bytes = 0;
  return Status::Ok();
}

bool SparseReducer::ReducesInPlace() const {
  return config_.ErrorFeedback() && UsesAllGather() && sparsifier_->SparsifiesPieces();
}

Status SparseReducer::PrepareInPlace(std::span<const GroupSlice> slices,
                                     std::span<const LocalBuffers> inputs, uint64_t step,
                                     uint32_t group_id, PreparedGroup* prepared) {
  // The non-finite check first, on the sums: no residual changes for a group that is not sent.
  int64_t bad = -1;
  float bad_value = 0.0f;
  for (size_t i = 0; i < slices.size() && bad < 0; ++i) {
    const int64_t at = FirstNonFiniteSum(inputs[i], slices[i].count, &bad_value);
    if (at >= 0) bad = static_cast<int64_t>(slices[i].offset) + at;
  }
  SPARSYNC_RETURN_IF_ERROR(StartPreparing(slices, bad, bad_value, /*in_place=*/true, prepared));
  prepared->work.clear();
  if (!prepared->finite) return Status::Ok();  // nothing is sent; see ExchangeInPlace()
  size_t n = 0;
  for (size_t i = 0; i < slices.size(); ++i) {
    bool fresh = false;
    Result<std::span<float>> r = state_->OpenResidual(*slices[i].name, slices[i].count, &fresh);
    if (!r.ok()) {
      CloseResiduals(slices.first(i));
      return r.status();
    }
    AddLocalSum(inputs[i], fresh, *r);
    prepared->residuals.push_back(*r);
    prepared->pieces.push_back(*r);
    n += slices[i].count;
  }
  Status st = Select(step, group_id, prepared);
  Mark(prepared, "sparsify");
  if (st.ok()) st = Pack(static_cast<int64_t>(n), /*with_delivered=*/true, prepared);
  Mark(prepared, "pack");
  if (!st.ok()) CloseResiduals(slices);  // the group goes no further
  return st;
}

void SparseReducer::CloseResiduals(std::span<const GroupSlice> slices) {
  for (const GroupSlice& s : slices) state_->CloseResidual(*s.name);
}

Status SparseReducer::ExchangeInPlace(std::span<const GroupSlice> slices, PreparedGroup& prepared,
                                      std::span<const LocalBuffers> inputs, double divisor,
                                      uint32_t* tag) {
  // Whatever happens below, the residuals are done with when this returns.
  struct Closer {
    SparseReducer* reducer;
    std::span<const GroupSlice> slices;
    bool open;
    ~Closer() {
      if (open) reducer->CloseResiduals(slices);
    }
  } closer{this, slices, prepared.finite};
  bool skip = false;
  std::vector<size_t> payload_bytes;
  SPARSYNC_RETURN_IF_ERROR(GatherPayloads(prepared, tag, &skip, &payload_bytes));
  Mark(&prepared, "transfer");
  // The result goes into each tensor's first buffer, then is copied to the others.
  std::vector<std::span<float>> firsts;
  for (const LocalBuffers& in : inputs) firsts.push_back(in[0]);
  if (skip) {
    // As in Exchange(); a finite node's residuals hold everything it would have sent already.
    for (const std::span<float>& s : firsts) std::fill(s.begin(), s.end(), 0.0f);
    if (!prepared.finite) WarnSkipped(prepared);
  } else {
    KeepState(slices, prepared, prepared.delivered);
    SPARSYNC_RETURN_IF_ERROR(DecodeAll(payload_bytes, firsts));
    Mark(&prepared, "unpack");
    for (const std::span<float>& s : firsts) {
      DivideInPlace(s.data(), s.size(), divisor, DType::kFloat32);
    }
  }
  for (const LocalBuffers& in : inputs) {
    for (size_t w = 1; w < in.size(); ++w) std::copy(in[0].begin(), in[0].end(), in[w].begin());
  }
  return Status::Ok();
}

Status SparseReducer::PrepareWork(std::span<const GroupSlice> slices, uint64_t step,
                                  uint32_t group_id, PreparedGroup* prepared) {
  std::span<const float> group = prepared->work;  // the local sum, before the residual
  const size_t n = group.size();
  const int64_t bad = FirstNonFinite(group);
  SPARSYNC_RETURN_IF_ERROR(
      StartPreparing(slices, bad, bad >= 0 ? group[bad] : 0.0f, /*in_place=*/false, prepared));
  if (!prepared->finite) return Status::Ok();  // nothing is sent; see Exchange()
  if (config_.ErrorFeedback()) {
    SPARSYNC_RETURN_IF_ERROR(state_->AddTo(TensorState::Kind::kResidual, slices, prepared->work));
  }
  if (config_.compressor == Compressor::kDgc) {
    prepared->dgc.momentum.resize(n);
    prepared->dgc.accumulation.resize(n);
    state_->Load(TensorState::Kind::kMomentum, slices, prepared->dgc.momentum);
    state_->Load(TensorState::Kind::kAccumulation, slices, prepared->dgc.accumulation);
  }
  SPARSYNC_RETURN_IF_ERROR(Select(step, group_id, prepared));
  Mark(prepared, "sparsify");  // the residual added and the selection made
  if (UsesAllGather()) {
    SPARSYNC_RETURN_IF_ERROR(Pack(static_cast<int64_t>(n), /*with_delivered=*/true, prepared));
    Mark(prepared, "pack");
  }
  return Status::Ok();
}

Status SparseReducer::Exchange(std::span<const GroupSlice> slices, PreparedGroup& prepared,
                               std::span<float> group, double divisor, uint32_t* tag) {
  bool skip = false;
  if (config_.compressor == Compressor::kRandomK) {
    SPARSYNC_RETURN_IF_ERROR(ExchangeSharedIndices(group, prepared, tag, &skip));
    Mark(&prepared, "transfer");
    if (!skip) KeepState(slices, prepared, prepared.values);  // float32: sent exactly
  } else if (UsesGlobalTopK()) {
    std::vector<float> delivered;
    SPARSYNC_RETURN_IF_ERROR(ExchangeGlobalTopK(group, prepared, tag, &skip, &delivered));
    Mark(&prepared, "transfer");
    if (!skip) KeepState(slices, prepared, delivered);
  } else {
    // The state first, then the decode: `group` may be prepared.work (DecodesIntoWork()).
    std::vector<size_t> payload_bytes;
    SPARSYNC_RETURN_IF_ERROR(GatherPayloads(prepared, tag, &skip, &payload_bytes));
    Mark(&prepared, "transfer");
    if (!skip) {
      KeepState(slices, prepared, prepared.delivered);
      SPARSYNC_RETURN_IF_ERROR(DecodeAll(payload_bytes, {&group, 1}));
      Mark(&prepared, "unpack");
    }
  }
  if (skip) {
    // Some node saw NaN/Inf: every node drops this group's update for the step. A finite node
    // keeps everything it would have sent in its residual, so nothing is lost (stored before
    // `group`, which may be the work buffer, is cleared).
    if (prepared.finite && config_.ErrorFeedback()) {
      state_->Store(TensorState::Kind::kResidual, slices, prepared.work);
    }
    std::fill(group.begin(), group.end(), 0.0f);
    if (!prepared.finite) WarnSkipped(prepared);
    return Status::Ok();
  }
  DivideInPlace(group.data(), group.size(), divisor, DType::kFloat32);
  return Status::Ok();
}

void SparseReducer::KeepState(std::span<const GroupSlice> slices, PreparedGroup& prepared,
                              const std::vector<float>& delivered) {
  if (config_.ErrorFeedback() && prepared.in_place) {
    // residual = what was to be sent minus what the other nodes decode, where it is kept.
    kernels::PieceWalker<float> residual(prepared.residuals);
    for (size_t j = 0; j < prepared.indices.size(); ++j) {
      residual[prepared.indices[j]] -= delivered[j];
    }
  } else if (config_.ErrorFeedback()) {
    std::vector<float>& work = prepared.work;
    for (size_t j = 0; j < prepared.indices.size(); ++j) {
      work[prepared.indices[j]] -= delivered[j];
    }
    state_->Store(TensorState::Kind::kResidual, slices, prepared.work);
  }
  if (config_.compressor == Compressor::kDgc) {
    state_->Store(TensorState::Kind::kMomentum, slices, prepared.dgc.momentum);
    state_->Store(TensorState::Kind::kAccumulation, slices, prepared.dgc.accumulation);
  }
}

bool SparseReducer::DecodesIntoWork() const { return UsesAllGather(); }

Status SparseReducer::Reduce(std::span<const GroupSlice> slices, std::span<float> group,
                             uint64_t step, uint32_t group_id, double divisor, uint32_t* tag) {
  SPARSYNC_RETURN_IF_ERROR(Prepare(slices, group, step, group_id, &scratch_));
  return Exchange(slices, scratch_, group, divisor, tag);
}

Status SparseReducer::GatherPayloads(PreparedGroup& prepared, uint32_t* tag, bool* skip,
                                     std::vector<size_t>* payload_bytes_out) {
  const size_t mine = prepared.payload_bytes;  // 0 when not finite
  std::vector<SizeRecord> sizes(num_nodes_);
  SizeRecord me{mine, prepared.finite ? 0u : 1u};
  std::vector<size_t> record_bytes(num_nodes_, sizeof(SizeRecord));
  SPARSYNC_RETURN_IF_ERROR(
      transport_->AllGatherV(&me, sizeof(me), sizes.data(), record_bytes, (*tag)++));
  std::vector<size_t> payload_bytes(num_nodes_);
  size_t total = 0;
  for (int r = 0; r < num_nodes_; ++r) {
    *skip = *skip || sizes[r].nonfinite != 0;
    payload_bytes[r] = sizes[r].payload_bytes;
    total += payload_bytes[r];
  }
  if (*skip) return Status::Ok();
  gathered_.resize(total);
  SPARSYNC_RETURN_IF_ERROR(transport_->AllGatherV(prepared.payload.data(), mine, gathered_.data(),
                                                  payload_bytes, (*tag)++));
  payload_bytes_sent_ += mine;
  *payload_bytes_out = std::move(payload_bytes);
  return Status::Ok();
}

Status SparseReducer::DecodeAll(const std::vector<size_t>& payload_bytes,
                                std::span<const std::span<float>> group) {
  const int64_t n = kernels::TotalElements(group);
  for (const std::span<float>& piece : group) std::fill(piece.begin(), piece.end(), 0.0f);
  size_t offset = 0;
  for (int r = 0; r < num_nodes_; ++r) {
    auto st = DecodeAddPieces(std::span<const uint8_t>(gathered_.data() + offset, payload_bytes[r]),
                              n, group);
    if (!st.ok()) return st.WithContext("payload of node " + std::to_string(r));
    offset += payload_bytes[r];
  }
  return Status::Ok();
}

void SparseReducer::WarnSkipped(const PreparedGroup& prepared) const {
  spdlog::warn(
      "tensor '{}' holds a non-finite gradient on node {}: the step's update of its merge group "
      "is dropped on every node (SPARSYNC_NONFINITE=skip)",
      prepared.nonfinite_tensor, node_rank_);
}

bool SelectsOnDevice(const Config& config) {
  return config.compressor == Compressor::kTopK && config.ErrorFeedback();
}

bool SparseReducer::SelectsOnDevice() const { return pipeline::SelectsOnDevice(config_); }

int64_t SparseReducer::SelectedCount(int64_t n) const {
  return kernels::SelectedCount(n, config_.density);
}

Status SparseReducer::PrepareSelected(std::span<const GroupSlice> slices, int64_t n,
                                      int64_t nonfinite_index, float nonfinite_value,
                                      PreparedGroup* prepared) {
  prepared->work.clear();
  prepared->delivered.clear();
  prepared->payload_bytes = 0;
  if (!prepared->finite) {
    if (config_.nonfinite == NonFinitePolicy::kError) {
      return NonFiniteStatus(slices, nonfinite_index, nonfinite_value, node_rank_);
    }
    prepared->nonfinite_tensor = SliceName(slices, nonfinite_index);
    prepared->indices.clear();
    prepared->values.clear();
    return Status::Ok();
  }
  prepared->nonfinite_tensor.clear();
  // The device keeps the residual, float16 rounding included: no need to decode our own payload.
  return Pack(n, /*with_delivered=*/false, prepared);
}

Status SparseReducer::ExchangeSelected(PreparedGroup& prepared, int64_t n, uint32_t* tag,
                                       bool* skip, std::vector<DecodedSparse>* payloads) {
  payloads->clear();
  std::vector<size_t> payload_bytes;
  SPARSYNC_RETURN_IF_ERROR(GatherPayloads(prepared, tag, skip, &payload_bytes));
  if (*skip) {
    if (!prepared.finite) WarnSkipped(prepared);
    return Status::Ok();
  }
  size_t offset = 0;
  for (int r = 0; r < num_nodes_; ++r) {
    auto decoded = Decode(std::span<const uint8_t>(gathered_.data() + offset, payload_bytes[r]));
    if (!decoded.ok()) return decoded.status().WithContext("payload of node " + std::to_string(r));
    if (decoded->numel != n) {
      return InvalidArgument("payload of node " + std::to_string(r) + " describes " +
                             std::to_string(decoded->numel) + " elements, expected " +
                             std::to_string(n));
    }
    payloads->push_back(std::move(*decoded));
    offset += payload_bytes[r];
  }
  return Status::Ok();
}

Status SparseReducer::ExchangeGlobalTopK(std::span<float> group, PreparedGroup& prepared,
                                         uint32_t* tag, bool* skip, std::vector<float>* delivered) {
  // Agree on the non-finite flag first: gTop-k's rounds carry no flags.
  float flags = prepared.finite ? 0.0f : 1.0f;
  SPARSYNC_RETURN_IF_ERROR(
      transport_->AllReduceSum(&flags, 1, transport::ElementType::kFloat32, (*tag)++));
  *skip = flags != 0.0f;
  if (*skip) return Status::Ok();
  const int64_t n = static_cast<int64_t>(group.size());
  const int64_t k = kernels::SelectedCount(n, config_.density);
  std::vector<int32_t> global_indices;
  std::vector<float> global_values;
  std::vector<uint8_t> kept;
  SPARSYNC_RETURN_IF_ERROR(GlobalTopK(transport_, n, k, prepared.indices, prepared.values,
                                      &global_indices, &global_values, &kept, tag));
  payload_bytes_sent_ += prepared.indices.size() * 8;
  // Delivered entries leave the residual; entries outside the global set stay in it.
  delivered->resize(prepared.values.size());
  for (size_t j = 0; j < prepared.values.size(); ++j) {
    (*delivered)[j] = kept[j] ? prepared.values[j] : 0.0f;
  }
  std::fill(group.begin(), group.end(), 0.0f);
  for (size_t j = 0; j < global_indices.size(); ++j) group[global_indices[j]] = global_values[j];
  return Status::Ok();
}

Status SparseReducer::ExchangeSharedIndices(std::span<float> group, PreparedGroup& prepared,
                                            uint32_t* tag, bool* skip) {
  // Every node selected the same indices (the seed is shared), so the k values are summed with a
  // dense allreduce. A first round agrees on k and on the non-finite flag.
  const uint64_t k = prepared.indices.size();
  uint64_t me[2] = {k, prepared.finite ? 0u : 1u};
  std::vector<uint64_t> all(2 * num_nodes_);
  std::vector<size_t> record_bytes(num_nodes_, sizeof(me));
  SPARSYNC_RETURN_IF_ERROR(
      transport_->AllGatherV(me, sizeof(me), all.data(), record_bytes, (*tag)++));
  for (int r = 0; r < num_nodes_; ++r) *skip = *skip || all[2 * r + 1] != 0;
  if (*skip) return Status::Ok();
  for (int r = 0; r < num_nodes_; ++r) {
    if (all[2 * r] != k) {
      return Internal("shared-seed random-k chose a different k on node " + std::to_string(r));
    }
  }
  std::vector<float> sums(prepared.values.begin(), prepared.values.end());
  SPARSYNC_RETURN_IF_ERROR(
      transport_->AllReduceSum(sums.data(), k, transport::ElementType::kFloat32, (*tag)++));
  payload_bytes_sent_ += k * sizeof(float);
  std::fill(group.begin(), group.end(), 0.0f);
  for (size_t j = 0; j < k; ++j) group[prepared.indices[j]] = sums[j];
  return Status::Ok();
}

SparseReducers::SparseReducers(Config base, int node_rank, int num_nodes,
                               transport::Transport* transport)
    : base_(std::move(base)), node_rank_(node_rank), num_nodes_(num_nodes), transport_(transport) {}

Config TensorConfig(const Config& base, std::optional<Compressor> compressor, float density) {
  Config config = base;
  if (compressor) config.compressor = *compressor;
  if (density > 0) config.density = density;
  return config;
}

Result<SparseReducer*> SparseReducers::For(std::optional<Compressor> compressor, float density,
                                           uint64_t step) {
  Config config = TensorConfig(base_, compressor, density);
  if (config.compressor == Compressor::kNone) return static_cast<SparseReducer*>(nullptr);
  config.density = kernels::WarmupDensity(config.density, static_cast<int64_t>(step),
                                          base_.density_warmup_steps);
  auto key = std::make_pair(config.compressor, config.density);
  auto it = reducers_.find(key);
  if (it == reducers_.end()) {
    auto created = SparseReducer::Create(config, node_rank_, num_nodes_, transport_, &state_);
    if (!created.ok()) return created.status();
    if (base_.density_warmup_steps > 0) {
      spdlog::info("{} at density {} from a tensor's step {} (SPARSYNC_DENSITY_WARMUP_STEPS={})",
                   CompressorName(config.compressor), config.density, step,
                   base_.density_warmup_steps);
    }
    it = reducers_.emplace(key, std::move(*created)).first;
  }
  return it->second.get();
}

}  // namespace sparsync::pipeline
