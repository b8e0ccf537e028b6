#include "daemon/observe/timeline.h"

#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <iterator>
#include <nlohmann/json.hpp>

#include "daemon/common/thread_name.h"

namespace sparsync::observe {
namespace {

constexpr uint32_t kIncidentRow = 1;
constexpr uint32_t kStageARow = 2;
constexpr uint32_t kStageBRow = 3;
constexpr uint32_t kFirstTensorRow = 100;
constexpr size_t kFlushRecords = 4096;
constexpr auto kFlushEvery = std::chrono::seconds(1);

// A JSON string literal, quotes included; invalid UTF-8 (a tensor name is the worker's) is
// replaced rather than thrown on.
std::string Quoted(std::string_view text) {
  return nlohmann::json(std::string(text)).dump(-1, ' ', false,
                                                nlohmann::json::error_handler_t::replace);
}

int64_t SteadyNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

// What a GroupView holds, copied (the view is only valid during the call).
struct Timeline::GroupRecord {
  uint64_t seq, step, elements;
  uint32_t plan_version;
  CollectiveOp op;
  bool sparse, ok;
  std::string path;
  uint32_t first_tensor, tensors;  // TensorRecords [first_tensor, first_tensor + tensors)
  uint32_t first_step, steps;      // Batch::steps [first_step, first_step + steps)
  int64_t received_ns, prepare_begin_ns, prepare_end_ns, exchange_begin_ns, exchange_end_ns,
      deliver_end_ns;
};

struct Timeline::TensorRecord {
  uint32_t row;
  int64_t ready_ns;
};

struct Timeline::InstantRecord {
  std::string name;
  int64_t ts_ns;
  std::string args;  // a JSON object's members, already formatted
};

struct Timeline::Batch {
  std::vector<GroupRecord> groups;
  std::vector<TensorRecord> tensors;
  std::vector<StepView> steps;  // the names are string literals
  std::vector<InstantRecord> instants;
  std::vector<std::pair<uint32_t, std::string>> new_rows;  // row, tensor name
  size_t size() const { return groups.size() + tensors.size() + instants.size(); }
};

Timeline::Timeline(int node_rank, int num_nodes)
    : node_rank_(node_rank), num_nodes_(num_nodes), batch_(std::make_unique<Batch>()) {}

Timeline::~Timeline() { Stop(); }

std::string Timeline::Resolve(const std::string& path_template) const {
  const std::string key = "{node}";
  std::string path = path_template;
  bool per_node = false;
  for (size_t at = path.find(key); at != std::string::npos; at = path.find(key, at)) {
    path.replace(at, key.size(), std::to_string(node_rank_));
    per_node = true;
  }
  if (!per_node && node_rank_ != 0 && num_nodes_ > 1) return "";
  return path;
}

std::string Timeline::path() const {
  std::lock_guard lock(mu_);
  return path_;
}

Status Timeline::Start(const std::string& path_template) {
  std::lock_guard control(control_mu_);
  if (path_template.empty()) return InvalidArgument("the timeline needs a file name");
  const std::string path = Resolve(path_template);
  if (path.empty()) {
    spdlog::debug("timeline: '{}' has no {{node}}, so node 0 alone records it", path_template);
    return Status::Ok();
  }
  if (active_ && this->path() == path) return Status::Ok();
  StopLocked();
  SPARSYNC_ASSIGN_OR_RETURN(file_, TraceFile::Create(path));
  std::string meta = fmt::format(
      "{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{0},\"args\":{{\"name\":\"sparsyncd node "
      "{0}\"}}}},\n{{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":{0},\"args\":{{\"sort_"
      "index\":{0}}}}}",
      node_rank_);
  for (auto [row, name] : {std::pair{kIncidentRow, "plans and incidents"},
                           std::pair{kStageARow, "stage A: prepare"},
                           std::pair{kStageBRow, "stage B: exchange, deliver"}}) {
    fmt::format_to(std::back_inserter(meta),
                   ",\n{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{0},\"tid\":{1},\"args\":{{"
                   "\"name\":\"{2}\"}}}},\n{{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":"
                   "{0},\"tid\":{1},\"args\":{{\"sort_index\":{1}}}}}",
                   node_rank_, row, name);
  }
  Status written = file_->Append(meta);
  if (!written.ok()) {
    file_.reset();
    return written;
  }
  {
    std::lock_guard lock(mu_);
    batch_ = std::make_unique<Batch>();
    rows_.clear();
    stop_ = false;
    path_ = path;
    steady0_ns_ = SteadyNs();
    wall0_us_ = std::chrono::duration_cast<std::chrono::microseconds>(
                    std::chrono::system_clock::now().time_since_epoch())
                    .count();
  }
  active_ = true;
  writer_ = std::thread([this] {
    NameThisThread("ssd-timeline");
    WriterLoop();
  });
  spdlog::info("timeline: recording into {}", path);
  return Status::Ok();
}

void Timeline::Stop() {
  std::lock_guard control(control_mu_);
  StopLocked();
}

void Timeline::StopLocked() {
  if (!writer_.joinable()) return;
  active_ = false;
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  writer_.join();
  spdlog::info("timeline: {} written", file_->path());
  file_.reset();
  std::lock_guard lock(mu_);
  path_.clear();
}

uint32_t Timeline::RowOf(const std::string& name) {
  auto [it, added] = rows_.try_emplace(name, kFirstTensorRow + static_cast<uint32_t>(rows_.size()));
  if (added) batch_->new_rows.emplace_back(it->second, name);
  return it->second;
}

void Timeline::OnGroup(const GroupView& g) {
  if (!active_.load(std::memory_order_relaxed)) return;
  bool wake;
  {
    std::lock_guard lock(mu_);
    Batch& b = *batch_;
    GroupRecord r{g.seq, g.step, g.elements, g.plan_version, g.op, g.sparse, g.ok, g.path,
                  static_cast<uint32_t>(b.tensors.size()), static_cast<uint32_t>(g.tensors.size()),
                  static_cast<uint32_t>(b.steps.size()), static_cast<uint32_t>(g.steps.size()),
                  g.received_ns, g.prepare_begin_ns, g.prepare_end_ns, g.exchange_begin_ns,
                  g.exchange_end_ns, g.deliver_end_ns};
    for (const TensorView& t : g.tensors) b.tensors.push_back({RowOf(*t.name), t.ready_ns});
    b.steps.insert(b.steps.end(), g.steps.begin(), g.steps.end());
    b.groups.push_back(std::move(r));
    wake = b.size() >= kFlushRecords;
  }
  if (wake) wake_.notify_all();
}

void Timeline::Push(InstantRecord record) {
  if (!active_.load(std::memory_order_relaxed)) return;
  std::lock_guard lock(mu_);
  batch_->instants.push_back(std::move(record));
}

void Timeline::OnPlan(const PlanView& p) {
  if (!active_.load(std::memory_order_relaxed)) return;
  Push({fmt::format("plan v{} ({})", p.version, p.planner), SteadyNs(),
        fmt::format("\"version\":{},\"planner\":{},\"effective_step\":{},\"groups\":{},"
                    "\"predicted_ms\":{:.3f},\"summary\":{}",
                    p.version, Quoted(p.planner), p.effective_step, p.groups, p.predicted_s * 1e3,
                    Quoted(p.summary))});
}

void Timeline::OnIncident(Incident incident, std::string_view detail) {
  if (!active_.load(std::memory_order_relaxed)) return;
  Push({IncidentName(incident), SteadyNs(), "\"detail\":" + Quoted(detail)});
}

void Timeline::WriterLoop() {
  while (true) {
    std::unique_ptr<Batch> batch = std::make_unique<Batch>();
    bool stop;
    {
      std::unique_lock lock(mu_);
      wake_.wait_for(lock, kFlushEvery, [&] { return stop_ || batch_->size() >= kFlushRecords; });
      batch.swap(batch_);
      stop = stop_;
    }
    std::string out;
    Format(*batch, &out);
    Status st = file_->Append(out);
    if (!st.ok()) {
      spdlog::warn("timeline: {}; recording stops", st.message());
      active_ = false;
      return;
    }
    if (stop) return;
  }
}

void Timeline::Format(const Batch& b, std::string* out) const {
  auto sep = [&] {
    if (!out->empty()) out->append(",\n");
  };
  // Steady nanoseconds -> wall-clock microseconds, exactly, as "<us>.<ns>".
  auto ts = [&](int64_t ns) {
    const int64_t d = ns - steady0_ns_;
    const int64_t us = wall0_us_ + d / 1000;
    const int64_t frac = d % 1000;
    return frac >= 0 ? fmt::format("{}.{:03}", us, frac) : fmt::format("{}.{:03}", us - 1, 1000 + frac);
  };
  auto span = [&](uint32_t row, const char* name, int64_t begin, int64_t end,
                  const std::string& args) {
    if (begin <= 0 || end <= 0) return;
    const int64_t dur = std::max<int64_t>(0, end - begin);
    sep();
    fmt::format_to(std::back_inserter(*out),
                   "{{\"name\":\"{}\",\"ph\":\"X\",\"pid\":{},\"tid\":{},\"ts\":{},\"dur\":{}.{:03},"
                   "\"args\":{{{}}}}}",
                   name, node_rank_, row, ts(begin), dur / 1000, dur % 1000, args);
  };
  for (const auto& [row, name] : b.new_rows) {
    sep();
    fmt::format_to(std::back_inserter(*out),
                   "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{0},\"tid\":{1},\"args\":{{"
                   "\"name\":{2}}}}},\n{{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":{0},"
                   "\"tid\":{1},\"args\":{{\"sort_index\":{1}}}}}",
                   node_rank_, row, Quoted("tensor " + name));
  }
  for (const GroupRecord& g : b.groups) {
    const std::string seq = fmt::format("\"seq\":{}", g.seq);
    for (uint32_t i = g.first_tensor; i < g.first_tensor + g.tensors; ++i) {
      const TensorRecord& t = b.tensors[i];
      span(t.row, "negotiate", t.ready_ns, std::max(t.ready_ns, g.received_ns), seq);
      span(t.row, "queue", g.received_ns, std::max(g.received_ns, g.prepare_begin_ns), seq);
    }
    const std::string args = fmt::format(
        "{},\"op\":\"{}\",\"path\":{},\"step\":{},\"plan\":{},\"tensors\":{},\"elements\":{},"
        "\"sparse\":{},\"ok\":{}",
        seq, OpName(g.op), Quoted(g.path), g.step, g.plan_version, g.tensors, g.elements,
        g.sparse, g.ok);
    span(kStageARow, "prepare", g.prepare_begin_ns, g.prepare_end_ns, args);
    span(kStageBRow, "exchange", g.exchange_begin_ns, g.exchange_end_ns, seq);
    span(kStageBRow, "deliver", g.exchange_end_ns, g.deliver_end_ns, seq);
    // The reduce path's sub-steps, nested in their stage's span: each begins where the previous
    // one (or its stage) began.
    int64_t at = g.prepare_begin_ns;
    bool stage_b = false;
    for (uint32_t i = g.first_step; i < g.first_step + g.steps; ++i) {
      const StepView& s = b.steps[i];
      if (!stage_b && g.exchange_begin_ns > 0 && s.end_ns > g.prepare_end_ns) {
        stage_b = true;
        at = g.exchange_begin_ns;
      }
      span(stage_b ? kStageBRow : kStageARow, s.name, at, s.end_ns, seq);
      at = std::max(at, s.end_ns);
    }
  }
  for (const InstantRecord& r : b.instants) {
    sep();
    fmt::format_to(std::back_inserter(*out),
                   "{{\"name\":{},\"ph\":\"i\",\"s\":\"p\",\"pid\":{},\"tid\":{},\"ts\":{},"
                   "\"args\":{{{}}}}}",
                   Quoted(r.name), node_rank_, kIncidentRow, ts(r.ts_ns), r.args);
  }
}

}  // namespace sparsync::observe
