#include "daemon/pipeline/calibration.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <string>

#include "daemon/pipeline/sparse_reducer.h"

namespace sparsync::pipeline {
namespace {

using Samples = std::vector<std::pair<double, double>>;  // (elements, seconds)

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::vector<uint64_t> Sizes(const CalibrationOptions& options, uint64_t cap) {
  std::vector<uint64_t> sizes = options.sizes;
  if (sizes.empty()) {
    for (int e = 12; e <= 22; e += 2) sizes.push_back(uint64_t{1} << e);
  }
  for (uint64_t& x : sizes) x = std::clamp<uint64_t>(x, 1, std::max<uint64_t>(cap, 1));
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  return sizes;
}

// The state of one calibration run on one node: the clock, the tag counter, the agreed budget.
class CalibrationRun {
 public:
  CalibrationRun(transport::Transport* transport, const CalibrationOptions& options)
      : transport_(transport), options_(options), tag_(options.first_tag) {
    if (!options_.clock) {
      options_.clock = [] {
        return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
            .count();
      };
    }
    start_ = budget_start_ = Now();
  }

  double Now() const { return options_.clock(); }
  uint32_t* tag() { return &tag_; }
  int reps() const { return std::max(1, options_.reps); }
  int total_reps() const { return std::max(0, options_.warmup) + reps(); }
  bool timed(int rep) const { return rep >= std::max(0, options_.warmup); }

  // Every node leaves at about the same time, so the next timed collective measures itself.
  Status Barrier() {
    float zero = 0.0f;
    return transport_->AllReduceSum(&zero, 1, transport::ElementType::kFloat32, tag_++)
        .WithContext("calibration barrier");
  }

  // Whether to measure another size, as node 0 sees its budget (the same answer on every node,
  // so that every node makes the same calls). At least two sizes, for a line.
  Result<bool> Continue(size_t measured) {
    double go = measured < 2 || Now() - budget_start_ <= options_.budget_s ? 1.0 : 0.0;
    SPARSYNC_RETURN_IF_ERROR(transport_->Broadcast(&go, sizeof(go), 0, tag_++));
    return go != 0.0;
  }

  double elapsed() const { return Now() - start_; }
  // Starts the budget over: each line gets a budget of its own.
  void RestartBudget() { budget_start_ = Now(); }

 private:
  transport::Transport* const transport_;
  CalibrationOptions options_;
  uint32_t tag_;
  double start_ = 0;
  double budget_start_ = 0;
};

std::vector<float> SyntheticGradient(uint64_t count, uint64_t seed, int node_rank) {
  std::mt19937_64 rng(seed ^ (0x9e3779b97f4a7c15ull * static_cast<uint64_t>(node_rank + 1)));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> data(count);
  for (float& x : data) x = normal(rng);
  return data;
}

// t_s and t_c of the configured sparse compressor, through a scratch reducer.
Status MeasureSparse(const Config& config, World world, transport::Transport* transport,
                     const std::vector<uint64_t>& sizes, const std::vector<float>& data,
                     CalibrationRun* run, Samples* sparsify, Samples* exchange) {
  auto reducer = SparseReducer::Create(config, world.node_rank, world.num_nodes, transport);
  if (!reducer.ok()) return reducer.status();
  PreparedGroup prepared;
  std::vector<float> result;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const uint64_t x = sizes[i];
    // One synthetic tensor per size, so its residual has the right shape.
    const std::string name = "calibration." + std::to_string(x);
    const GroupSlice slice{&name, 0, static_cast<size_t>(x)};
    const std::span<const float> group(data.data(), static_cast<size_t>(x));
    std::vector<double> ts, tc;
    for (int rep = 0; rep < run->total_reps(); ++rep) {
      const double t0 = run->Now();
      SPARSYNC_RETURN_IF_ERROR((*reducer)->Prepare({&slice, 1}, group, static_cast<uint64_t>(rep),
                                                   static_cast<uint32_t>(i), &prepared));
      const double t1 = run->Now();
      SPARSYNC_RETURN_IF_ERROR(run->Barrier());
      result.resize(static_cast<size_t>(x));
      const double t2 = run->Now();
      SPARSYNC_RETURN_IF_ERROR(
          (*reducer)->Exchange({&slice, 1}, prepared, result, world.num_nodes, run->tag()));
      const double t3 = run->Now();
      if (run->timed(rep)) {
        ts.push_back(t1 - t0);
        tc.push_back(t3 - t2);
      }
    }
    sparsify->emplace_back(static_cast<double>(x), Median(ts));
    exchange->emplace_back(static_cast<double>(x), Median(tc));
    if (i + 1 < sizes.size()) {
      SPARSYNC_ASSIGN_OR_RETURN(bool more, run->Continue(i + 1));
      if (!more) break;
    }
  }
  return Status::Ok();
}

// t_c of compressor=none: the dense allreduce the executor uses.
Status MeasureDense(transport::Transport* transport, const std::vector<uint64_t>& sizes,
                    const std::vector<float>& data, CalibrationRun* run, Samples* exchange) {
  std::vector<float> buffer;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const uint64_t x = sizes[i];
    std::vector<double> tc;
    for (int rep = 0; rep < run->total_reps(); ++rep) {
      buffer.assign(data.begin(), data.begin() + static_cast<std::ptrdiff_t>(x));
      SPARSYNC_RETURN_IF_ERROR(run->Barrier());
      const double t0 = run->Now();
      SPARSYNC_RETURN_IF_ERROR(transport->AllReduceSum(buffer.data(), static_cast<size_t>(x),
                                                       transport::ElementType::kFloat32,
                                                       (*run->tag())++));
      const double t1 = run->Now();
      if (run->timed(rep)) tc.push_back(t1 - t0);
    }
    exchange->emplace_back(static_cast<double>(x), Median(tc));
    if (i + 1 < sizes.size()) {
      SPARSYNC_ASSIGN_OR_RETURN(bool more, run->Continue(i + 1));
      if (!more) break;
    }
  }
  return Status::Ok();
}

}  // namespace

Result<planning::CostModel> CalibrateCostModel(const Config& config, World world,
                                               transport::Transport* transport,
                                               const CalibrationOptions& options) {
  if (world.num_nodes != transport->size() || world.node_rank != transport->rank()) {
    return Internal("calibration: node " + std::to_string(world.node_rank) + " of " +
                    std::to_string(world.num_nodes) + " on a transport of rank " +
                    std::to_string(transport->rank()) + " of " + std::to_string(transport->size()));
  }
  const bool dense = config.compressor == Compressor::kNone;
  const std::vector<uint64_t> sizes =
      Sizes(options, dense ? options.max_dense_elements : options.max_elements);
  const std::vector<float> data = SyntheticGradient(sizes.back(), options.seed, world.node_rank);
  CalibrationRun run(transport, options);
  Samples sparsify, exchange, dense_exchange;
  if (dense) {
    SPARSYNC_RETURN_IF_ERROR(MeasureDense(transport, sizes, data, &run, &exchange));
  } else {
    SPARSYNC_RETURN_IF_ERROR(
        MeasureSparse(config, world, transport, sizes, data, &run, &sparsify, &exchange));
    if (options.dense_too) {
      // A budget of its own: on a slow network the sparse sizes can spend all of it, and the
      // smallest dense sizes alone measure latency, not bandwidth.
      run.RestartBudget();
      const std::vector<uint64_t> dense_sizes = Sizes(options, options.max_dense_elements);
      SPARSYNC_RETURN_IF_ERROR(MeasureDense(transport, dense_sizes, data, &run, &dense_exchange));
    }
  }

  // Node 0's fit for everyone.
  planning::CostModel model;
  // A CPU top-k is a linear-time pass; a sort-based one (a GPU's, or the emulated GPU of
  // SPARSYNC_EMULATE_SELECT_COST) grows as x log x, and a line through sizes up to 4 M elements
  // underprices a whole-model group sixteen times larger.
  model.sparsify = planning::LinearCost::FitBetterShape(sparsify);
  model.exchange = planning::LinearCost::Fit(exchange);
  model.dense_exchange = planning::LinearCost::Fit(dense_exchange);
  if (options.dense_too && model.dense_exchange.per_element_s <= 0) {
    // A dense allreduce that did not grow with its size was timed at sizes too small to see the
    // network's bandwidth; planned with, it would send every group dense, whatever its size. Not
    // known, then: groups stay sparse until the executor has measured dense ones.
    if (world.node_rank == 0 && !dense_exchange.empty()) {
      spdlog::info("calibration: the dense allreduce took {:.3g} ms at {} elements and did not grow "
                   "with size; groups are sent sparse until dense costs are measured",
                   1e3 * dense_exchange.back().second,
                   static_cast<uint64_t>(dense_exchange.back().first));
    }
    model.dense_exchange = {};
  }
  double coefficients[7] = {model.sparsify.fixed_s,       model.sparsify.per_element_s,
                            model.exchange.fixed_s,       model.exchange.per_element_s,
                            model.dense_exchange.fixed_s, model.dense_exchange.per_element_s,
                            model.sparsify.x_log_x ? 1.0 : 0.0};
  SPARSYNC_RETURN_IF_ERROR(
      transport->Broadcast(coefficients, sizeof(coefficients), 0, (*run.tag())++)
          .WithContext("broadcasting the calibrated cost model"));
  model.sparsify = {coefficients[0], coefficients[1], coefficients[6] != 0};
  model.exchange = {coefficients[2], coefficients[3]};
  model.dense_exchange = {coefficients[4], coefficients[5]};
  spdlog::info("calibrated {} on {} node(s), {} size(s) from {} to {} elements in {:.2f} s: {}",
               CompressorName(config.compressor), world.num_nodes, exchange.size(), sizes.front(),
               static_cast<uint64_t>(exchange.back().first), run.elapsed(), model.ToString());
  return model;
}

}  // namespace sparsync::pipeline
