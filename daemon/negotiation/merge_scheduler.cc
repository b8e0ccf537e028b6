#include "daemon/negotiation/merge_scheduler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

#include "daemon/planning/planner.h"

namespace sparsync::negotiation {
namespace {

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string Ms(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f ms", seconds * 1e3);
  return buf;
}

std::optional<planning::PlannerKind> KindOf(const std::string& name) {
  if (name == "fixed") return planning::PlannerKind::kFixed;
  return planning::ParsePlannerName(name);
}

}  // namespace

MergeScheduler::MergeScheduler(MergeOptions options, int num_nodes)
    : options_(std::move(options)), num_nodes_(num_nodes) {
  if (options_.warmup_steps <= 1) skip_next_sample_ = false;
}

bool MergeScheduler::Ready(const ReadyGradient& g, Clock::time_point now) {
  layers_[g.slot] = {g.name, g.elements, g.merge_class, g.dense};
  if (in_step_.count(g.slot)) CloseStep(/*regular=*/false);
  if (in_step_.empty()) step_first_ready_ = now;
  in_step_.insert(g.slot);
  current_.order.push_back(g.slot);
  current_.node_ready.push_back(g.node_ready_ns);
  current_.node_ready.back().resize(num_nodes_, 0);
  current_.span_s = Seconds(now - step_first_ready_);

  bool taken = false;
  if (plan_) {
    auto it = group_of_.find(g.slot);
    if (it == group_of_.end()) {
      DropPlan("gradient '" + g.name + "' is not in it");
    } else {
      GroupState& group = groups_[it->second];
      size_t pos = static_cast<size_t>(
          std::find(group.slots.begin(), group.slots.end(), g.slot) - group.slots.begin());
      if (!group.is_ready[pos]) {
        if (group.ready == 0) group.first_ready = now;
        group.is_ready[pos] = true;
        ++group.ready;
      }
      if (group.ready == group.slots.size()) {
        out_.push_back({nullptr, group.slots, plan_->version,
                        static_cast<uint32_t>(it->second)});
        group.ready = 0;
        std::fill(group.is_ready.begin(), group.is_ready.end(), false);
      }
      taken = true;
    }
  }
  if (!expected_.empty() && in_step_ == expected_) CloseStep(/*regular=*/true);
  return taken;
}

void MergeScheduler::CloseStep(bool regular) {
  StepSample sample = std::move(current_);
  current_ = {};
  std::set<uint32_t> seen = std::move(in_step_);
  in_step_.clear();
  ++step_;
  bool same = seen == expected_;
  bool first = expected_.empty();
  expected_ = std::move(seen);
  if (plan_) {
    if (!regular) {
      DropPlan("step " + std::to_string(step_ - 1) + " changed its set of gradients");
    } else {
      ++steps_under_plan_;
    }
  }
  if (!first && (!regular || !same)) samples_.clear();
  if (skip_next_sample_) {
    skip_next_sample_ = false;
  } else {
    samples_.push_back(std::move(sample));
    while (samples_.size() > static_cast<size_t>(std::max(1, options_.warmup_steps))) {
      samples_.pop_front();
    }
  }
  MaybePlan();
}

// The mean over nodes of the time from the step's first gradient to its last.
static double SampleSpan(const std::vector<std::vector<int64_t>>& node_ready, int num_nodes) {
  double total = 0;
  int counted = 0;
  for (int n = 0; n < num_nodes; ++n) {
    int64_t lo = 0, hi = 0;
    bool any = false;
    for (const auto& t : node_ready) {
      if (t[n] == 0) continue;
      lo = any ? std::min(lo, t[n]) : t[n];
      hi = any ? std::max(hi, t[n]) : t[n];
      any = true;
    }
    if (!any) continue;
    total += static_cast<double>(hi - lo) * 1e-9;
    ++counted;
  }
  return counted ? total / counted : 0.0;
}

void MergeScheduler::MaybePlan() {
  size_t needed = static_cast<size_t>(std::max(1, options_.warmup_steps));
  if (samples_.size() < needed) return;
  if (!plan_) {
    MakePlan("after " + std::to_string(needed) + " measured step(s)");
    return;
  }
  if (options_.replan_steps > 0 &&
      steps_under_plan_ >= static_cast<uint64_t>(options_.replan_steps)) {
    MakePlan("every " + std::to_string(options_.replan_steps) + " steps (SPARSYNC_REPLAN_STEPS)");
    return;
  }
  // Judge drift only on steps measured under this plan.
  if (steps_under_plan_ < needed) return;
  double span = MeasuredSpan();
  double drift = std::abs(span - plan_span_s_) / std::max(plan_span_s_, 1e-6);
  if (drift > options_.replan_drift && std::abs(span - plan_span_s_) > 1e-3) {
    MakePlan("backward time moved from " + Ms(plan_span_s_) + " to " + Ms(span));
    return;
  }
  std::string why;
  if (CostsDrifted(&why)) MakePlan(why);
}

double MergeScheduler::MeasuredSpan() const {
  double span = 0;
  for (const StepSample& s : samples_) {
    span += SampleSpan(s.node_ready, num_nodes_) / samples_.size();
  }
  return span;
}

void MergeScheduler::SetCostModel(const planning::CostModel& cost) {
  costs_.SetBase(cost);
  planning::CostModel dense;
  dense.sparsify = cost.dense_prepare;
  dense.exchange = cost.dense_exchange;
  dense_costs_.SetBase(dense);
}

planning::CostModel MergeScheduler::cost_model() const {
  planning::CostModel m = costs_.Current();
  if (!options_.dense_by_default) {
    const planning::CostModel dense = dense_costs_.Current();
    m.dense_prepare = dense.sparsify;
    m.dense_exchange = dense.exchange;
  }
  return m;
}

void MergeScheduler::RecordGroupCost(uint64_t elements, bool sparse, double sparsify_s,
                                     double exchange_s) {
  if (sparse != options_.dense_by_default) {
    costs_.Add(elements, sparsify_s, exchange_s);
  } else if (sparse == false) {
    dense_costs_.Add(elements, sparsify_s, exchange_s);  // a compressing job's dense group
  }
  // A sparse group of a dense job (an explicit compressor) is not planned for.
}

// The current plan under the measured costs, against what it was predicted to take.
bool MergeScheduler::CostsDrifted(std::string* why) const {
  if (!plan_ || plan_starts_.empty() || reference_s_ <= 0) return false;
  planning::PlanInput in = plan_input_;
  in.cost = cost_model();
  if (in.cost == plan_input_.cost) return false;
  double now = planning::Simulate(in, plan_starts_, plan_dense_).iteration_s;
  double moved = std::abs(now - reference_s_);
  if (moved <= options_.replan_drift * reference_s_ || moved <= 1e-3) return false;
  *why = "measured costs moved this plan's prediction from " + Ms(reference_s_) + " to " + Ms(now);
  return true;
}

std::vector<double> MergeScheduler::BackwardTimes(const std::vector<uint32_t>& order,
                                                  const StepSample* only) const {
  std::vector<double> sum(order.size(), 0.0);
  std::vector<int> count(order.size(), 0);
  for (const StepSample& s : samples_) {
    if (only && &s != only) continue;
    std::unordered_map<uint32_t, size_t> pos;
    for (size_t i = 0; i < s.order.size(); ++i) pos[s.order[i]] = i;
    for (size_t i = 1; i < order.size(); ++i) {
      auto a = pos.find(order[i - 1]), b = pos.find(order[i]);
      if (a == pos.end() || b == pos.end()) continue;
      for (int n = 0; n < num_nodes_; ++n) {
        int64_t ta = s.node_ready[a->second][n], tb = s.node_ready[b->second][n];
        if (ta == 0 || tb == 0) continue;
        sum[i] += std::max<double>(0.0, static_cast<double>(tb - ta) * 1e-9);
        ++count[i];
      }
    }
  }
  for (size_t i = 0; i < sum.size(); ++i) {
    if (count[i]) sum[i] /= count[i];
  }
  return sum;
}

void MergeScheduler::MakePlan(const std::string& why) {
  const std::vector<uint32_t>& order = samples_.back().order;
  std::vector<double> backward = BackwardTimes(order);
  planning::PlanInput in;
  in.cost = cost_model();
  in.sparsify_blocks_backward = options_.sparsify_blocks_backward;
  bool dense = true;
  for (size_t i = 0; i < order.size(); ++i) {
    const Layer& l = layers_.at(order[i]);
    in.layers.push_back({l.elements, backward[i]});
    in.merge_class.push_back(l.merge_class);
    dense = dense && l.dense;
  }
  std::string name = options_.planners[plans_made_ % options_.planners.size()];
  auto kind = KindOf(name);
  if (!kind) {
    log_.push_back("unknown planner '" + name + "'; staying with fixed buckets");
    return;
  }
  if (*kind == planning::PlannerKind::kOmgs && dense) kind = planning::PlannerKind::kMgWfbp;
  in.choose_dense = options_.choose_dense && !dense;
  auto plan = planning::MakePlan(*kind, in, options_.bucket_bytes);
  if (!plan.ok()) {
    log_.push_back("planning failed: " + plan.status().message());
    return;
  }
  // What the other planners predict, to see how far the chosen one is from the optimum (made
  // only for a plan that is announced, or that fewer groups may replace). A dense job under
  // `omgs` follows MG-WFBP's rule, so that is the plan compared there.
  const auto compared = {planning::PlannerKind::kOptimal,
                         dense ? planning::PlannerKind::kMgWfbp : planning::PlannerKind::kOmgs,
                         planning::PlannerKind::kLayerwise, planning::PlannerKind::kSingle};
  std::vector<std::pair<planning::PlannerKind, planning::Plan>> others;
  auto make_others = [&] {
    for (auto other : compared) {
      if (other == *kind) continue;
      auto p = planning::MakePlan(other, in);
      if (p.ok()) others.emplace_back(other, *std::move(p));
    }
  };
  const double chosen_s = plan->predicted_s;  // before fewer groups, for the log
  std::string fewer;
  if (*kind == planning::PlannerKind::kOptimal && dense) {
    make_others();
    fewer = PreferFewerGroups(in, others, &*plan);
  }
  if (plan_ && !Improves(in, *plan, planning::PlannerName(*kind))) {
    // The plan in force stays: nothing announced, nothing logged.
    ++plans_held_;
    SetReference(in, planning::Simulate(in, plan_starts_, plan_dense_).iteration_s);
    return;
  }
  if (others.empty()) make_others();
  std::ostringstream summary;
  summary << in.cost.ToString() << "; backward " << Ms(SampleSpan(samples_.back().node_ready, num_nodes_))
          << "; predicted:";
  for (auto other : compared) {
    double predicted_s = -1;
    if (other == *kind) predicted_s = chosen_s;
    for (const auto& [k, p] : others) {
      if (k == other) predicted_s = p.predicted_s;
    }
    if (predicted_s >= 0) summary << " " << planning::PlannerName(other) << " " << Ms(predicted_s);
  }
  summary << fewer;

  PlanInfo info;
  info.version = ++plans_made_;
  info.effective_step = step_;
  info.planner = planning::PlannerName(*kind);
  info.predicted_s = plan->predicted_s;
  info.summary = summary.str();
  info.dense = plan->dense;
  groups_.clear();
  group_of_.clear();
  for (size_t g = 0; g < plan->starts.size(); ++g) {
    size_t end = g + 1 < plan->starts.size() ? plan->starts[g + 1] : order.size();
    GroupState state;
    state.slots.assign(order.begin() + static_cast<std::ptrdiff_t>(plan->starts[g]),
                       order.begin() + static_cast<std::ptrdiff_t>(end));
    state.is_ready.assign(state.slots.size(), false);
    for (uint32_t slot : state.slots) group_of_[slot] = g;
    info.groups.push_back(state.slots);
    groups_.push_back(std::move(state));
  }
  plan_starts_ = plan->starts;
  plan_dense_ = plan->dense;
  SetReference(in, plan->predicted_s);
  log_.push_back("plan v" + std::to_string(info.version) + " (" + info.planner + ") from step " +
                 std::to_string(info.effective_step) + ": " + plan->Describe(order.size()) +
                 ", predicted " + Ms(info.predicted_s) + " (" + info.summary + "); " + why);
  plan_ = info;
  MergeOutput announce;
  announce.plan = std::make_shared<const PlanInfo>(std::move(info));
  out_.push_back(std::move(announce));
}

std::vector<planning::PlanInput> MergeScheduler::AdverseInputs(
    planning::PlanInput in, std::initializer_list<double> directions) const {
  // Each line's start-up moves by its own tracker's spread: a compressing job's dense groups are
  // priced on the dense lines (cost_model()); a dense job's one tracker holds them all.
  const double relative = costs_.RelativeError();
  const double dense_relative =
      options_.dense_by_default ? relative : dense_costs_.RelativeError();
  // The backward times: `in`'s mean, then each measured step's own.
  std::vector<std::vector<planning::LayerProfile>> layers{in.layers};
  const std::vector<uint32_t>& order = samples_.back().order;
  for (const StepSample& s : samples_) {
    if (s.order.size() != order.size()) continue;  // a step that did not see every gradient
    std::vector<double> backward = BackwardTimes(order, &s);
    layers.push_back(in.layers);
    for (size_t i = 0; i < layers.back().size() && i < backward.size(); ++i) {
      layers.back()[i].backward_s = backward[i];
    }
  }
  const planning::CostModel base = in.cost;
  std::vector<planning::PlanInput> inputs;
  for (double direction : directions) {
    in.cost = base;
    in.cost.sparsify.fixed_s *= 1 + direction * relative;
    in.cost.exchange.fixed_s *= 1 + direction * relative;
    in.cost.dense_prepare.fixed_s *= 1 + direction * dense_relative;
    in.cost.dense_exchange.fixed_s *= 1 + direction * dense_relative;
    for (const auto& times : layers) {
      in.layers = times;
      inputs.push_back(in);
    }
  }
  return inputs;
}

std::vector<double> MergeScheduler::PriceUnder(const std::vector<planning::PlanInput>& cases,
                                               const planning::Plan& plan) {
  std::vector<double> seconds;
  for (const planning::PlanInput& c : cases) {
    seconds.push_back(planning::Simulate(c, plan.starts, plan.dense).iteration_s);
  }
  return seconds;
}

double MergeScheduler::LeastGain(const std::vector<planning::PlanInput>& cases,
                                 const std::vector<double>& faster_s,
                                 const planning::Plan& slower) {
  double gain_s = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < cases.size(); ++i) {
    gain_s = std::min(gain_s,
                      planning::Simulate(cases[i], slower.starts, slower.dense).iteration_s -
                          faster_s[i]);
  }
  return gain_s;
}

std::string MergeScheduler::PreferFewerGroups(
    const planning::PlanInput& in,
    const std::vector<std::pair<planning::PlannerKind, planning::Plan>>& others,
    planning::Plan* plan) const {
  // Every compared plan has fewer groups than the optimum: dearer start-ups are what is adverse
  // to the optimum.
  const std::vector<planning::PlanInput> adverse = AdverseInputs(in, {+1});
  const std::vector<double> optimum_s = PriceUnder(adverse, *plan);
  const planning::Plan* pick = nullptr;
  planning::PlannerKind pick_kind{};
  double pick_gain_s = 0;
  for (const auto& [kind, other] : others) {
    if (other.num_groups() >= (pick ? pick->num_groups() : plan->num_groups())) continue;
    const double gain_s = LeastGain(adverse, optimum_s, other);  // the optimum's
    if (gain_s > 0.01 * plan->predicted_s) continue;
    pick = &other;
    pick_kind = kind;
    pick_gain_s = gain_s;
  }
  if (!pick) return "";
  std::ostringstream why;
  why << "; fewer groups: " << pick->num_groups() << " (" << planning::PlannerName(pick_kind)
      << "'s plan) predicted " << Ms(pick->predicted_s) << ", the optimum's "
      << plan->num_groups() << " gain " << Ms(pick_gain_s)
      << " over it at worst, under 1 % of its " << Ms(plan->predicted_s);
  const planning::PlannerKind kind = plan->planner;
  *plan = *pick;
  plan->planner = kind;
  return why.str();
}

bool MergeScheduler::Improves(const planning::PlanInput& in, const planning::Plan& next,
                              const std::string& name) const {
  if (name != plan_->planner) return true;  // another planner of the list was asked for
  if (next.starts == plan_starts_ && next.dense == plan_dense_) return false;
  // Start-ups dearer are adverse to the plan with more groups, cheaper to the one with fewer;
  // with as many groups, either may be.
  planning::Plan now;
  now.starts = plan_starts_;
  now.dense = plan_dense_;
  const size_t next_groups = next.num_groups(), now_groups = now.num_groups();
  const std::vector<planning::PlanInput> adverse =
      next_groups > now_groups   ? AdverseInputs(in, {+1})
      : next_groups < now_groups ? AdverseInputs(in, {-1})
                                 : AdverseInputs(in, {+1, -1});
  const double now_s = planning::Simulate(in, now.starts, now.dense).iteration_s;
  return LeastGain(adverse, PriceUnder(adverse, next), now) > 0.01 * now_s;
}

void MergeScheduler::SetReference(const planning::PlanInput& in, double predicted_s) {
  double longest = 0;
  for (const StepSample& s : samples_) longest = std::max(longest, s.span_s);
  plan_span_s_ = MeasuredSpan();
  group_wait_ = std::max<Clock::duration>(
      options_.min_group_wait,
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(4 * longest)));
  steps_under_plan_ = 0;
  plan_input_ = in;
  reference_s_ = predicted_s;
}

void MergeScheduler::DropPlan(const std::string& why) {
  if (!plan_) return;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const GroupState& group = groups_[g];
    if (group.ready == 0) continue;
    MergeOutput partial;
    for (size_t i = 0; i < group.slots.size(); ++i) {
      if (group.is_ready[i]) partial.group.push_back(group.slots[i]);
    }
    out_.push_back(std::move(partial));
  }
  log_.push_back("plan v" + std::to_string(plan_->version) + " dropped at step " +
                 std::to_string(step_) + ": " + why + "; measuring again with fixed buckets");
  plan_.reset();
  groups_.clear();
  group_of_.clear();
  samples_.clear();
}

void MergeScheduler::Tick(Clock::time_point now) {
  if (!plan_) return;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const GroupState& group = groups_[g];
    if (group.ready == 0 || now - group.first_ready < group_wait_) continue;
    std::string missing;
    for (size_t i = 0; i < group.slots.size(); ++i) {
      if (group.is_ready[i]) continue;
      if (!missing.empty()) missing += ", ";
      missing += "'" + layers_.at(group.slots[i]).name + "'";
    }
    DropPlan("group " + std::to_string(g) + " waited " +
             std::to_string(static_cast<int>(Seconds(now - group.first_ready) * 1e3)) +
             " ms for " + missing);
    return;
  }
}

std::optional<Clock::time_point> MergeScheduler::NextDeadline() const {
  std::optional<Clock::time_point> next;
  if (!plan_) return next;
  for (const GroupState& group : groups_) {
    if (group.ready == 0) continue;
    Clock::time_point t = group.first_ready + group_wait_;
    if (!next || t < *next) next = t;
  }
  return next;
}

std::vector<MergeOutput> MergeScheduler::Take() {
  std::vector<MergeOutput> out;
  out.swap(out_);
  return out;
}

std::vector<std::string> MergeScheduler::TakeLog() {
  std::vector<std::string> out;
  out.swap(log_);
  return out;
}

void MergeScheduler::Reset() {
  in_step_.clear();
  current_ = {};
  expected_.clear();
  samples_.clear();
  plan_.reset();
  groups_.clear();
  group_of_.clear();
  out_.clear();
}

}  // namespace sparsync::negotiation
