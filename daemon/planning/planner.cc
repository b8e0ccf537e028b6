#include "daemon/planning/planner.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "daemon/planning/fusion.h"

namespace sparsync::planning {
namespace {

uint64_t ClassOf(const PlanInput& in, size_t layer) {
  return in.merge_class.empty() ? 0 : in.merge_class[layer];
}

// Where the schedule's two serial resources stand after some groups. `compute` is the time the
// next group's sparsification may start once its layers are ready: the backward clock when
// sparsification blocks backward, otherwise the time the sparsifier becomes free.
struct Resources {
  double compute = 0;  // blocking: backward + sparsify clock; else: sparsifier free
  double network = 0;  // the network becomes free
};

struct GroupTimes {
  double sparsify_end = 0;
  double exchange_start = 0;
  double exchange_end = 0;
};

// Appends group [begin, end) to `r`. `ready_end` is the time layer end-1 is ready when
// sparsification does not block backward (prefix sum of backward times).
class Stepper {
 public:
  explicit Stepper(const PlanInput& in) : in_(in), ready_(in.layers.size() + 1, 0.0),
                                          elements_(in.layers.size() + 1, 0) {
    for (size_t l = 0; l < in.layers.size(); ++l) {
      ready_[l + 1] = ready_[l] + std::max(0.0, in.layers[l].backward_s);
      elements_[l + 1] = elements_[l] + in.layers[l].elements;
    }
  }

  uint64_t Elements(size_t begin, size_t end) const { return elements_[end] - elements_[begin]; }
  double Backward(size_t begin, size_t end) const { return ready_[end] - ready_[begin]; }

  // `dense`: the group is sent dense (the dense lines' costs).
  GroupTimes Add(const Resources& r, size_t begin, size_t end, Resources* out,
                 bool dense = false) const {
    uint64_t x = Elements(begin, end);
    GroupTimes t;
    double start = in_.sparsify_blocks_backward ? r.compute + Backward(begin, end)
                                                : std::max(ready_[end], r.compute);
    t.sparsify_end = start + (dense ? in_.cost.DensePrepareTime(x) : in_.cost.SparsifyTime(x));
    t.exchange_start = std::max(t.sparsify_end, r.network);
    t.exchange_end =
        t.exchange_start + (dense ? in_.cost.DenseExchangeTime(x) : in_.cost.ExchangeTime(x));
    // The executor holds one prepared group while stage B works (pipeline/executor.h, depth 1):
    // stage A takes the next group only once B has taken this one. On a GPU that sparsifies on
    // backward's stream, the stream itself is free once the selection ends.
    out->compute = in_.sparsify_blocks_backward ? t.sparsify_end : t.exchange_start;
    out->network = t.exchange_end;
    return t;
  }

 private:
  const PlanInput& in_;
  std::vector<double> ready_;
  std::vector<uint64_t> elements_;
};

// The modes a group may be sent in.
std::vector<bool> Modes(const PlanInput& in) {
  if (in.choose_dense && in.cost.knows_dense()) return {false, true};
  return {false};
}

// A search state: where the two resources stand, and how it was reached.
struct State {
  Resources r;
  size_t from = 0;  // the prefix (or group) this state extends
  size_t from_state = 0;
  bool dense = false;  // the last group is sent dense
};

// The Pareto set of `candidates` over (compute, network) free times, sorted by compute ascending
// with network strictly descending. Of equal states the sparse one is kept.
std::vector<State> ParetoFront(std::vector<State> candidates) {
  std::sort(candidates.begin(), candidates.end(), [](const State& a, const State& b) {
    if (a.r.compute != b.r.compute) return a.r.compute < b.r.compute;
    if (a.r.network != b.r.network) return a.r.network < b.r.network;
    return a.dense < b.dense;
  });
  std::vector<State> front;
  double best_network = std::numeric_limits<double>::infinity();
  for (const State& c : candidates) {
    if (c.r.network < best_network) {
      front.push_back(c);
      best_network = c.r.network;
    }
  }
  return front;
}

// The state of `front` with the earliest network finish (the first of equals).
size_t EarliestFinish(const std::vector<State>& front) {
  size_t best = 0;
  for (size_t s = 1; s < front.size(); ++s) {
    if (front[s].r.network < front[best].r.network) best = s;
  }
  return best;
}

Plan Finish(PlannerKind kind, const PlanInput& in, std::vector<size_t> starts) {
  Plan plan;
  plan.planner = kind;
  plan.starts = std::move(starts);
  plan.dense = ChooseDense(in, plan.starts);
  if (std::none_of(plan.dense.begin(), plan.dense.end(), [](bool d) { return d; })) {
    plan.dense.clear();
  }
  plan.predicted_s = Simulate(in, plan.starts, plan.dense).iteration_s;
  return plan;
}

// Shared walk of the greedy rules: decides, layer by layer, whether layer i joins the open group
// [open, i). `merge(times of the open group alone, resources before it, open, i)` decides.
template <typename Rule>
Plan Greedy(PlannerKind kind, const PlanInput& in, Rule merge) {
  Stepper step(in);
  std::vector<size_t> starts{0};
  Resources before;  // resources before the open group
  for (size_t i = 1; i < in.layers.size(); ++i) {
    size_t open = starts.back();
    bool join = ClassOf(in, i) == ClassOf(in, open) && merge(step, before, open, i);
    if (!join) {
      Resources after;
      step.Add(before, open, i, &after);
      before = after;
      starts.push_back(i);
    }
  }
  return Finish(kind, in, std::move(starts));
}

}  // namespace

const char* PlannerName(PlannerKind kind) {
  switch (kind) {
    case PlannerKind::kOmgs: return "omgs";
    case PlannerKind::kOptimal: return "optimal";
    case PlannerKind::kLayerwise: return "layerwise";
    case PlannerKind::kSingle: return "single";
    case PlannerKind::kFixed: return "fixed";
    case PlannerKind::kMgWfbp: return "mgwfbp";
  }
  return "?";
}

std::optional<PlannerKind> ParsePlannerName(const std::string& name) {
  for (PlannerKind k : {PlannerKind::kOmgs, PlannerKind::kOptimal, PlannerKind::kLayerwise,
                        PlannerKind::kSingle, PlannerKind::kMgWfbp}) {
    if (name == PlannerName(k)) return k;
  }
  return std::nullopt;
}

std::vector<size_t> Plan::GroupSizes(size_t num_layers) const {
  std::vector<size_t> sizes;
  for (size_t g = 0; g < starts.size(); ++g) {
    size_t end = g + 1 < starts.size() ? starts[g + 1] : num_layers;
    sizes.push_back(end - starts[g]);
  }
  return sizes;
}

std::string Plan::Describe(size_t num_layers) const {
  std::ostringstream o;
  o << starts.size() << (starts.size() == 1 ? " group:" : " groups:");
  for (size_t g = 0; g < starts.size(); ++g) {
    size_t end = g + 1 < starts.size() ? starts[g + 1] : num_layers;
    o << " [" << starts[g];
    if (end - starts[g] > 1) o << ".." << end - 1;
    o << (IsDense(g) ? " dense]" : "]");
  }
  return o.str();
}

Timeline Simulate(const PlanInput& in, const std::vector<size_t>& starts,
                  const std::vector<bool>& dense) {
  Stepper step(in);
  Timeline t;
  Resources r;
  for (size_t g = 0; g < starts.size(); ++g) {
    size_t end = g + 1 < starts.size() ? starts[g + 1] : in.layers.size();
    Resources next;
    GroupTimes times = step.Add(r, starts[g], end, &next, g < dense.size() && dense[g]);
    r = next;
    t.sparsify_end.push_back(times.sparsify_end);
    t.exchange_start.push_back(times.exchange_start);
    t.exchange_end.push_back(times.exchange_end);
  }
  t.iteration_s = r.network;
  return t;
}

std::vector<bool> ChooseDense(const PlanInput& in, const std::vector<size_t>& starts) {
  const std::vector<bool> modes = Modes(in);
  if (modes.size() == 1 || starts.empty()) return std::vector<bool>(starts.size(), false);
  Stepper step(in);
  // fronts[g]: the Pareto set after groups [0, g), each state's `from_state` in fronts[g-1].
  std::vector<std::vector<State>> fronts(starts.size() + 1);
  fronts[0].push_back({});
  for (size_t g = 0; g < starts.size(); ++g) {
    size_t end = g + 1 < starts.size() ? starts[g + 1] : in.layers.size();
    std::vector<State> candidates;
    for (size_t s = 0; s < fronts[g].size(); ++s) {
      for (bool dense : modes) {
        State next;
        step.Add(fronts[g][s].r, starts[g], end, &next.r, dense);
        next.from_state = s;
        next.dense = dense;
        candidates.push_back(next);
      }
    }
    fronts[g + 1] = ParetoFront(std::move(candidates));
  }
  std::vector<bool> dense(starts.size(), false);
  const size_t best = EarliestFinish(fronts.back());
  // Compress only where it pays: when compressing every group ends as early, every group stays
  // compressed.
  if (Simulate(in, starts).iteration_s <= fronts.back()[best].r.network) return dense;
  for (size_t g = starts.size(), s = best; g > 0; --g) {
    dense[g - 1] = fronts[g][s].dense;
    s = fronts[g][s].from_state;
  }
  return dense;
}

Plan PlanOmgs(const PlanInput& in) {
  // Merge layer i into the open group G iff t_w < t_save (docs/algorithms.md §4.1):
  //   t_w    = how much later G's sparsification ends when it also waits for layer i, plus the
  //            extra selection cost of the bigger group, minus the time G would have queued for
  //            the network anyway;
  //   t_save = t_c(G) + t_c(i) - t_c(G + i), the start-up cost saved.
  return Greedy(PlannerKind::kOmgs, in,
                [&in](const Stepper& step, const Resources& before, size_t open, size_t i) {
                  Resources unused;
                  GroupTimes alone = step.Add(before, open, i, &unused);
                  GroupTimes merged = step.Add(before, open, i + 1, &unused);
                  uint64_t g = step.Elements(open, i), l = step.Elements(i, i + 1);
                  double extra_select = in.cost.SparsifyTime(g + l) - in.cost.SparsifyTime(g) -
                                        in.cost.SparsifyTime(l);
                  double delay = merged.sparsify_end - in.cost.SparsifyTime(g + l) -
                                 (alone.sparsify_end - in.cost.SparsifyTime(g));
                  double queued = alone.exchange_start - alone.sparsify_end;
                  double t_w = delay + extra_select - queued;
                  double t_save = in.cost.ExchangeTime(g) + in.cost.ExchangeTime(l) -
                                  in.cost.ExchangeTime(g + l);
                  return t_w < t_save;
                });
}

Plan PlanMgWfbp(const PlanInput& in) {
  // Merge layer i into G when i is ready before G's exchange would end, and either G's exchange
  // could not have started before i was ready anyway or the extra wait is below one start-up.
  return Greedy(PlannerKind::kMgWfbp, in,
                [&in](const Stepper& step, const Resources& before, size_t open, size_t i) {
                  Resources unused;
                  GroupTimes alone = step.Add(before, open, i, &unused);
                  GroupTimes merged = step.Add(before, open, i + 1, &unused);
                  double i_ready = merged.sparsify_end - in.cost.SparsifyTime(step.Elements(open, i + 1));
                  if (i_ready >= alone.exchange_end) return false;
                  return i_ready <= alone.exchange_start ||
                         i_ready - alone.exchange_start < in.cost.exchange.fixed_s;
                });
}

Plan PlanOptimal(const PlanInput& in) {
  const size_t n = in.layers.size();
  const std::vector<bool> modes = Modes(in);
  Stepper step(in);
  // front[i]: Pareto set over (compute, network) of the groupings of layers [0, i), each group
  // in either mode.
  std::vector<std::vector<State>> front(n + 1);
  front[0].push_back({});
  for (size_t j = 1; j <= n; ++j) {
    std::vector<State> candidates;
    for (size_t i = j; i-- > 0;) {
      if (ClassOf(in, i) != ClassOf(in, j - 1)) break;  // groups never span two classes
      for (size_t s = 0; s < front[i].size(); ++s) {
        for (bool dense : modes) {
          State next;
          step.Add(front[i][s].r, i, j, &next.r, dense);
          next.from = i;
          next.from_state = s;
          next.dense = dense;
          candidates.push_back(next);
        }
      }
    }
    front[j] = ParetoFront(std::move(candidates));
  }
  // The end state with the earliest network finish; walk the back pointers. Finish chooses the
  // modes of this grouping again, which gives the same optimum.
  std::vector<size_t> starts;
  for (size_t j = n, s = EarliestFinish(front[n]); j > 0;) {
    const State& st = front[j][s];
    starts.push_back(st.from);
    j = st.from;
    s = st.from_state;
  }
  std::reverse(starts.begin(), starts.end());
  return Finish(PlannerKind::kOptimal, in, std::move(starts));
}

Plan PlanLayerwise(const PlanInput& in) {
  std::vector<size_t> starts(in.layers.size());
  for (size_t i = 0; i < starts.size(); ++i) starts[i] = i;
  return Finish(PlannerKind::kLayerwise, in, std::move(starts));
}

Plan PlanSingle(const PlanInput& in) {
  std::vector<size_t> starts{0};
  for (size_t i = 1; i < in.layers.size(); ++i) {
    if (ClassOf(in, i) != ClassOf(in, i - 1)) starts.push_back(i);
  }
  return Finish(PlannerKind::kSingle, in, std::move(starts));
}

Plan PlanFixed(const PlanInput& in, uint64_t bucket_bytes) {
  std::vector<FusionCandidate> candidates;
  for (size_t i = 0; i < in.layers.size(); ++i) {
    candidates.push_back({in.layers[i].elements * in.bytes_per_element, ClassOf(in, i)});
  }
  std::vector<size_t> starts;
  for (const auto& bucket : FixedBuckets(candidates, bucket_bytes)) starts.push_back(bucket.front());
  return Finish(PlannerKind::kFixed, in, std::move(starts));
}

Result<Plan> MakePlan(PlannerKind kind, const PlanInput& input, uint64_t fixed_bytes) {
  if (input.layers.empty()) return InvalidArgument("nothing to plan: no gradient tensors");
  if (!input.merge_class.empty() && input.merge_class.size() != input.layers.size()) {
    return InvalidArgument("merge_class must have one entry per layer");
  }
  switch (kind) {
    case PlannerKind::kOmgs: return PlanOmgs(input);
    case PlannerKind::kOptimal: return PlanOptimal(input);
    case PlannerKind::kLayerwise: return PlanLayerwise(input);
    case PlannerKind::kSingle: return PlanSingle(input);
    case PlannerKind::kFixed:
      if (fixed_bytes == 0) return InvalidArgument("fixed merging needs a bucket size");
      return PlanFixed(input, fixed_bytes);
    case PlannerKind::kMgWfbp: return PlanMgWfbp(input);
  }
  return InvalidArgument("unknown planner");
}

}  // namespace sparsync::planning
