// Exposition: the Prometheus text format, version 0.0.4 (what every Prometheus server scrapes;
// https://prometheus.io/docs/instrumenting/exposition_formats/). No Prometheus C++ client is
// packaged in Debian, so the daemon writes the format itself: a family's "# HELP" and "# TYPE"
// lines, then its samples, with the format's escaping (a backslash and a newline in HELP text; a
// backslash, a double quote and a newline in label values) and its spelling of the special
// values (+Inf, -Inf, NaN).
//
// Not thread-safe; one per rendering.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sparsync::observe {

using Labels = std::vector<std::pair<std::string, std::string>>;  // name, value

// A histogram's state: cumulative bucket counts are formed when it is written.
class Histogram {
 public:
  // `bounds` ascending; a +Inf bucket is implied.
  explicit Histogram(std::vector<double> bounds);
  void Observe(double value);
  const std::vector<double>& bounds() const { return bounds_; }
  const std::vector<uint64_t>& counts() const { return counts_; }  // per bucket, not cumulative
  uint64_t count() const { return count_; }
  double sum() const { return sum_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // bounds_.size() + 1 (the last: above every bound)
  uint64_t count_ = 0;
  double sum_ = 0;
};

// Seconds from 100 µs to 10 s.
std::vector<double> SecondsBuckets();

class Exposition {
 public:
  enum class Type { kCounter, kGauge, kHistogram };
  // Starts a family. REQUIRES: `name` matches [a-zA-Z_:][a-zA-Z0-9_:]*, each family once.
  void Family(std::string_view name, Type type, std::string_view help);
  // One sample of the current family (counters' names end in _total, by convention).
  void Sample(std::string_view name, const Labels& labels, double value);
  // A histogram's _bucket, _sum and _count samples.
  void Write(std::string_view name, const Labels& labels, const Histogram& histogram);
  const std::string& text() const { return out_; }

  static std::string EscapeHelp(std::string_view text);
  static std::string EscapeLabelValue(std::string_view text);
  static std::string FormatValue(double value);

 private:
  std::string out_;
};

}  // namespace sparsync::observe
