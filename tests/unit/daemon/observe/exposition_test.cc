#include "daemon/observe/exposition.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace sparsync::observe {
namespace {

// The format's escaping: HELP text escapes a backslash and a newline; a label value also a
// double quote (https://prometheus.io/docs/instrumenting/exposition_formats/).
TEST(ExpositionTest, EscapesHelpAndLabelValues) {
  EXPECT_EQ(Exposition::EscapeHelp("a\\b\nc\"d"), "a\\\\b\\nc\"d");
  EXPECT_EQ(Exposition::EscapeLabelValue("a\\b\nc\"d"), "a\\\\b\\nc\\\"d");
  Exposition e;
  e.Family("x_total", Exposition::Type::kCounter, "Counts \"things\"\\n.\nSecond line.");
  e.Sample("x_total", {{"name", "fc1.\"w\"\\\n"}, {"op", "gradient"}}, 3);
  EXPECT_EQ(e.text(),
            "# HELP x_total Counts \"things\"\\\\n.\\nSecond line.\n"
            "# TYPE x_total counter\n"
            "x_total{name=\"fc1.\\\"w\\\"\\\\\\n\",op=\"gradient\"} 3\n");
}

TEST(ExpositionTest, SpecialValuesAreSpelledAsPrometheusParsesThem) {
  EXPECT_EQ(Exposition::FormatValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(Exposition::FormatValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(Exposition::FormatValue(std::nan("")), "NaN");
  EXPECT_EQ(Exposition::FormatValue(0.25), "0.25");
  EXPECT_EQ(Exposition::FormatValue(12345678901234.0), "12345678901234");
  EXPECT_EQ(std::stod(Exposition::FormatValue(1e-7)), 1e-7);
}

// Buckets are cumulative and "le" (a value on a bound counts in that bucket); +Inf holds all.
TEST(ExpositionTest, HistogramBucketsAreCumulative) {
  Histogram h({0.125, 1});
  for (double v : {0.0625, 0.125, 0.5, 1.0, 7.0}) h.Observe(v);
  Exposition e;
  e.Family("t_seconds", Exposition::Type::kHistogram, "Times.");
  e.Write("t_seconds", {{"encoding", "sparse"}}, h);
  EXPECT_EQ(e.text(),
            "# HELP t_seconds Times.\n"
            "# TYPE t_seconds histogram\n"
            "t_seconds_bucket{encoding=\"sparse\",le=\"0.125\"} 2\n"
            "t_seconds_bucket{encoding=\"sparse\",le=\"1\"} 4\n"
            "t_seconds_bucket{encoding=\"sparse\",le=\"+Inf\"} 5\n"
            "t_seconds_sum{encoding=\"sparse\"} 8.6875\n"
            "t_seconds_count{encoding=\"sparse\"} 5\n");
}

}  // namespace
}  // namespace sparsync::observe
