// The registry's text exposition: exact lines for counters, gauges, histograms and collectors,
// escaping, and a whole exposition accepted by the reference parser (python3-prometheus-client).
#include "agent/metrics/registry.h"

#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "agent/metrics/agent_metrics.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "support/temp_dir.h"

namespace sluice::metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Runs tests/support/prom_check.py on `text`; returns its exit code, output in *out.
int PromCheck(const std::string& text, std::string* out) {
  sluice::testing::TempDir dir("prom-check");
  std::string in = dir / "in.txt";
  std::ofstream(in) << text;
  std::string cmd = absl::StrCat("/usr/bin/python3 ", SLUICE_SOURCE_DIR,
                                 "/tests/support/prom_check.py < ", in, " 2>&1");
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), p)) out->append(buf, n);
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

TEST(RegistryTest, CounterAndGaugeLinesCarryHelpTypeAndLabels) {
  Registry r;
  r.GetCounter("sluice_x_total", "things done", {{"kind", "a"}}).Inc(3);
  r.GetGauge("sluice_level", "how full").Set(0.25);
  std::string text = r.Expose();
  EXPECT_THAT(text, HasSubstr("# HELP sluice_level how full\n# TYPE sluice_level gauge\n"
                              "sluice_level 0.25\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE sluice_x_total counter\nsluice_x_total{kind=\"a\"} 3\n"));
}

TEST(RegistryTest, SameNameAndLabelsGiveTheSameMetric) {
  Registry r;
  r.GetCounter("sluice_x_total", "h", {{"k", "v"}}).Inc();
  r.GetCounter("sluice_x_total", "h", {{"k", "v"}}).Inc();
  EXPECT_EQ(r.GetCounter("sluice_x_total", "h", {{"k", "v"}}).value(), 2u);
  EXPECT_EQ(r.GetCounter("sluice_x_total", "h", {{"k", "w"}}).value(), 0u);
}

TEST(RegistryTest, HistogramBucketsAreCumulativeWithInfSumAndCount) {
  Registry r;
  Histogram& h = r.GetHistogram("sluice_t_seconds", "time", {{"s", "x"}}, {0.1, 1});
  h.Observe(0.05);
  h.Observe(0.1);  // upper bounds are inclusive
  h.Observe(0.5);
  h.Observe(7);
  std::string text = r.Expose();
  EXPECT_THAT(text, HasSubstr("sluice_t_seconds_bucket{s=\"x\",le=\"0.1\"} 2\n"
                              "sluice_t_seconds_bucket{s=\"x\",le=\"1\"} 3\n"
                              "sluice_t_seconds_bucket{s=\"x\",le=\"+Inf\"} 4\n"
                              "sluice_t_seconds_sum{s=\"x\"} 7.65\n"
                              "sluice_t_seconds_count{s=\"x\"} 4\n"))
      << text;
}

TEST(RegistryTest, LabelValuesAndHelpAreEscaped) {
  Registry r;
  r.GetCounter("sluice_x_total", "line one\nback\\slash", {{"v", "a\"b\\c\nd"}}).Inc();
  std::string text = r.Expose();
  EXPECT_THAT(text, HasSubstr("# HELP sluice_x_total line one\\nback\\\\slash\n"));
  EXPECT_THAT(text, HasSubstr("sluice_x_total{v=\"a\\\"b\\\\c\\nd\"} 1\n"));
  std::string out;
  EXPECT_EQ(PromCheck(text, &out), 0) << out;
}

TEST(RegistryTest, CollectorsRunAtEveryScrapeAndCanBeRemoved) {
  Registry r;
  int calls = 0;
  int id = r.AddCollector([&](ScrapeSink& s) {
    ++calls;
    s.Gauge("sluice_seen", "scrapes so far", {}, calls);
    s.Counter("sluice_c_total", "c", {{"a", "1"}}, 5);
    s.Counter("sluice_c_total", "c", {{"a", "2"}}, 6);
  });
  EXPECT_THAT(r.Expose(), HasSubstr("sluice_seen 1\n"));
  std::string text = r.Expose();
  EXPECT_THAT(text, HasSubstr("sluice_seen 2\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE sluice_c_total counter\nsluice_c_total{a=\"1\"} 5\n"
                              "sluice_c_total{a=\"2\"} 6\n"));
  r.RemoveCollector(id);
  EXPECT_THAT(r.Expose(), Not(HasSubstr("sluice_seen")));
}

TEST(RegistryTest, TheReferenceParserRejectsWhatIsNotTheFormat) {
  // The check must be able to fail: a counter without _total, an unterminated label.
  std::string out;
  EXPECT_NE(PromCheck("# TYPE sluice_x counter\nsluice_x 1\n", &out), 0);
  EXPECT_NE(PromCheck("sluice_x_total{a=\"b} 1\n", &out), 0);
}

TEST(RegistryTest, AgentMetricsExpositionParses) {
  Registry r;
  ObserveReconcile("services", absl::Milliseconds(3), true, r);
  ObserveReconcile("services", absl::Milliseconds(30), false, r);
  EndpointHandler h = InstrumentEndpointApi(
      [](const cni::EndpointRequest& req, int) {
        return req.command == "ADD" ? cni::SuccessReply()
                                    : cni::FailureReply(absl::InternalError("refused"));
      },
      r);
  for (const char* command : {"ADD", "DEL", "bogus\"label"}) {
    cni::EndpointRequest req;
    req.command = command;
    (void)h(req, -1);
  }
  std::string text = r.Expose();
  EXPECT_THAT(text, HasSubstr("sluice_reconcile_errors_total{subsystem=\"services\"} 1\n"));
  EXPECT_THAT(text,
              HasSubstr("sluice_reconcile_duration_seconds_count{subsystem=\"services\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("sluice_cni_request_errors_total{command=\"ADD\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("sluice_cni_request_errors_total{command=\"DEL\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("sluice_cni_request_errors_total{command=\"unknown\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("sluice_cni_request_duration_seconds_count{command=\"ADD\"} 1\n"));
  std::string out;
  EXPECT_EQ(PromCheck(text, &out), 0) << out << "\n" << text;
}

}  // namespace
}  // namespace sluice::metrics
