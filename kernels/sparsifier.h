#pragma once
// The Sparsifier interface: chooses which coordinates of a dense gradient to send.
//
// Selection only. Error feedback (residuals) lives in the daemon's pipeline; the one stateful
// compressor, DGC, keeps its momentum/accumulation in a caller-owned DgcState (dgc_state.h).
//
// Contract shared by every implementation:
//  * Output indices are strictly ascending (the wire format delta-codes them).
//  * out->values[j] is the value sent for coordinate out->indices[j], as float32: the input value
//    itself for top-k, threshold and Gaussian-k; for random-k the input value, or with
//    options.unbiased the input value times d/k (RandomKScale); g_i / p_i for Wangni; the
//    accumulated velocity v_i for DGC.
//  * Inputs of every dtype are first rounded to float32; selection is on the float32 values.
//  * A NaN or +-Inf anywhere in the input is an INVALID_ARGUMENT error naming the first offending
//    element; nothing is selected (out->k = 0) and DGC state is left untouched.
//  * k = 0 for numel = 0; otherwise a density rho means k = min(numel, max(1, floor(rho*numel))).
//  * Thread-safety: one Sparsifier instance is used by one thread at a time (it owns scratch
//    buffers). Distinct instances are independent.
//  * Allocation: the fast (cpu/) implementations allocate only in Prepare(); Sparsify() then uses
//    preallocated scratch and fails with FAILED_PRECONDITION if numel or dtype exceed what was
//    prepared. The reference implementations (reference/) are test oracles and allocate freely.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/status.h"

namespace sparsync::kernels {

struct DgcState;

// A dense tensor, flattened. Not owned.
struct DenseView {
  const void* data = nullptr;
  int64_t numel = 0;
  DType dtype = DType::kFloat32;
};

// Caller-owned output buffers with room for `capacity` pairs; Sparsify sets `k`.
struct SparseView {
  int32_t* indices = nullptr;
  float* values = nullptr;
  int64_t capacity = 0;
  int64_t k = 0;
};

// Per-call inputs that are not the gradient.
struct SparsifyContext {
  // Seed for this call's random draws. The caller derives it from (job seed, node, step, group),
  // so draws differ between nodes and steps but runs are reproducible.
  uint64_t seed = 0;
  // Seed identical on every node for this (job, step, group): used by random-k in shared-seed
  // mode so that all nodes pick the same indices.
  uint64_t shared_seed = 0;
  int64_t step = 0;
  int64_t epoch = 0;  // DGC's density warm-up is scheduled by epoch
  // REQUIRES for "dgc": non-null, initialised for this tensor's numel (DgcState::Reset).
  DgcState* dgc_state = nullptr;
};

struct SparsifierOptions {
  // Target fraction of coordinates to send, in (0, 1]. Used by topk, randomk, gaussiank, dgc
  // (final density), wangni (expected density kappa) and threshold in quantile mode.
  double density = 0.001;
  // If > 0, the exact number of coordinates to select (topk, randomk, dgc); overrides density.
  int64_t k = 0;
  // threshold: fixed tau, sends |x| > tau. If <= 0, the quantile mode of Aji & Heafield is used:
  // tau = the ceil(density*s)-th largest |x| of a seeded sample of s elements, sends |x| >= tau.
  double threshold = 0.0;
  // threshold (quantile mode): fraction of elements sampled, at least min_sample_size.
  double sample_fraction = 0.001;
  int64_t min_sample_size = 1000;
  // randomk: if true, indices depend only on (context.shared_seed, numel), never on data or node.
  bool shared_seed = false;
  // randomk: if true, each kept value is sent as x_i * d/k (RandomKScale): the unbiased estimator
  // of uniform sampling, E[Q(x)] = x (Stich et al.; the baseline Wangni et al. compare against),
  // for use without error feedback. If false, x_i itself, bit for bit: with error feedback the
  // residual keeps what was not sent, and scaling would inflate it.
  bool unbiased = false;
  // wangni: if > 0, use the closed form for the variance budget E||Q(g)||^2 <= (1+eps)||g||^2
  // instead of the greedy algorithm for expected density `density`.
  double variance_budget = 0.0;
  // wangni: cap on the greedy rescaling passes.
  int max_greedy_iterations = 64;
  // dgc
  double momentum = 0.9;
  double clip_norm = 0.0;      // if > 0, local gradient clipping to this L2 norm
  bool warmup = true;          // density 0.25, 0.0625, 0.0156, 0.004 for epochs 0..3
};

class Sparsifier {
 public:
  virtual ~Sparsifier() = default;

  // The spec name it was created from, e.g. "topk" or "reference:topk".
  virtual std::string_view name() const = 0;

  // Capacity the caller must provide in SparseView for a tensor of `numel` elements.
  virtual int64_t MaxSelected(int64_t numel) const = 0;

  // Allocates scratch for tensors of up to `max_numel` elements of `dtype`. May be called again
  // (e.g. with a larger size). REQUIRES: 0 <= max_numel <= INT32_MAX.
  virtual Status Prepare(int64_t max_numel, DType dtype) = 0;

  // Writes the chosen (index, value) pairs into *out (indices ascending) and sets out->k.
  // REQUIRES: out->capacity >= MaxSelected(grad.numel); Prepare() covered grad.
  virtual Status Sparsify(const DenseView& grad, SparseView* out,
                          const SparsifyContext& context) = 0;

  // Whether SparsifyPieces() is implemented (top-k; the others need the gradient in one buffer).
  virtual bool SparsifiesPieces() const { return false; }
  // Sparsify() of float32 pieces laid end to end (kernels/pieces.h) without joining them: the
  // same output as over the joined buffer, indices into the whole. REQUIRES: SparsifiesPieces();
  // out->capacity >= MaxSelected(the whole); Prepare() covered the whole.
  virtual Status SparsifyPieces(std::span<const std::span<const float>> pieces, SparseView* out,
                                const SparsifyContext& context);
};

// Creates a sparsifier by name. Accepted names: "topk", "randomk", "threshold", "gaussiank",
// "wangni", "dgc" (fast CPU implementations) and the same prefixed with "reference:" (the
// simple oracles). Unknown names and invalid options give an error that lists what is accepted.
Result<std::unique_ptr<Sparsifier>> MakeSparsifier(std::string_view spec_name,
                                                   const SparsifierOptions& options);

// All names MakeSparsifier accepts.
std::vector<std::string> SparsifierNames();

// k for a density (see the contract above). options.k > 0 overrides the density.
int64_t SelectedCount(int64_t numel, double density, int64_t fixed_k = 0);

// Random-k's inverse inclusion probability d/k (1 when k = 0). An unbiased random-k sends
// RandomKScaled(x_i, RandomKScale(d, k)): the product in double, rounded once to float32, so that
// every implementation (reference, CPU, CUDA) sends the same bits.
inline double RandomKScale(int64_t numel, int64_t k) {
  return k > 0 ? static_cast<double>(numel) / static_cast<double>(k) : 1.0;
}
inline float RandomKScaled(float x, double scale) {
  return static_cast<float>(static_cast<double>(x) * scale);
}

// Checks the arguments every Sparsify receives: view shapes, capacity, index range.
Status ValidateSparsifyArgs(const DenseView& grad, const SparseView* out, int64_t max_selected);

// The INVALID_ARGUMENT status for a non-finite element `index` with float32 value `value`.
Status NonFiniteError(int64_t index, float value);

}  // namespace sparsync::kernels
