#include "daemon/observe/exposition.h"

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <cmath>

namespace sparsync::observe {

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double value) {
  // The first bucket whose upper bound is >= value (Prometheus buckets are "le").
  size_t i = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), value) -
                                 bounds_.begin());
  ++counts_[i];
  ++count_;
  sum_ += value;
}

std::vector<double> SecondsBuckets() {
  return {1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5,
          5, 10};
}

namespace {

// The text format's escapes: backslash and line feed, and in label values the double quote.
std::string Escape(std::string_view text, bool quote) {
  std::string out;
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && quote) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

std::string Exposition::EscapeHelp(std::string_view text) { return Escape(text, false); }

std::string Exposition::EscapeLabelValue(std::string_view text) { return Escape(text, true); }

std::string Exposition::FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", value);
}

void Exposition::Family(std::string_view name, Type type, std::string_view help) {
  const char* type_name = type == Type::kCounter ? "counter"
                          : type == Type::kGauge ? "gauge"
                                                 : "histogram";
  fmt::format_to(std::back_inserter(out_), "# HELP {} {}\n# TYPE {} {}\n", name,
                 EscapeHelp(help), name, type_name);
}

void Exposition::Sample(std::string_view name, const Labels& labels, double value) {
  out_.append(name);
  if (!labels.empty()) {
    out_ += '{';
    for (size_t i = 0; i < labels.size(); ++i) {
      fmt::format_to(std::back_inserter(out_), "{}{}=\"{}\"", i ? "," : "", labels[i].first,
                     EscapeLabelValue(labels[i].second));
    }
    out_ += '}';
  }
  out_ += ' ';
  out_ += FormatValue(value);
  out_ += '\n';
}

void Exposition::Write(std::string_view name, const Labels& labels, const Histogram& h) {
  const std::string bucket = std::string(name) + "_bucket";
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= h.bounds().size(); ++i) {
    cumulative += h.counts()[i];
    Labels with_le = labels;
    with_le.emplace_back("le", i < h.bounds().size() ? FormatValue(h.bounds()[i]) : "+Inf");
    Sample(bucket, with_le, static_cast<double>(cumulative));
  }
  Sample(std::string(name) + "_sum", labels, h.sum());
  Sample(std::string(name) + "_count", labels, static_cast<double>(h.count()));
}

}  // namespace sparsync::observe
