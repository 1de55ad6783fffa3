#include "agent/metrics/registry.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "agent/base/version.h"

namespace sluice::metrics {
namespace {

std::string EscapeHelp(const std::string& h) {
  std::string out;
  for (char c : h) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string LabelText(const Labels& labels, const std::pair<std::string, std::string>* extra) {
  if (labels.empty() && extra == nullptr) return "";
  std::string out = "{";
  bool first = true;
  auto add = [&](const std::string& k, const std::string& v) {
    if (!first) out += ",";
    first = false;
    absl::StrAppend(&out, k, "=\"", EscapeLabelValue(v), "\"");
  };
  for (const auto& [k, v] : labels) add(k, v);
  if (extra != nullptr) add(extra->first, extra->second);
  out += "}";
  return out;
}

void Header(std::string* out, const std::string& name, const std::string& help, const char* type) {
  absl::StrAppend(out, "# HELP ", name, " ", EscapeHelp(help), "\n# TYPE ", name, " ", type, "\n");
}

}  // namespace

std::string EscapeLabelValue(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return absl::StrCat(static_cast<int64_t>(v));
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), buckets_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double v) {
  size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  absl::MutexLock l(&mu_);
  ++buckets_[i];
  sum_ += v;
  ++count_;
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot s;
  s.bounds = bounds_;
  absl::MutexLock l(&mu_);
  uint64_t acc = 0;
  for (uint64_t b : buckets_) s.cumulative.push_back(acc += b);
  s.sum = sum_;
  s.count = count_;
  return s;
}

const std::vector<double>& LatencyBuckets() {
  static const std::vector<double> kBuckets = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                               0.25,   0.5,   1,      2.5,   5,    10,    30};
  return kBuckets;
}

void ScrapeSink::Add(const std::string& name, const std::string& help, const char* type,
                     const Labels& labels, double v) {
  Family& f = families_[name];
  if (f.type.empty()) {
    f.help = help;
    f.type = type;
  }
  f.samples.emplace_back(labels, v);
}

void ScrapeSink::Counter(const std::string& name, const std::string& help, const Labels& labels,
                         double v) {
  Add(name, help, "counter", labels, v);
}

void ScrapeSink::Gauge(const std::string& name, const std::string& help, const Labels& labels,
                       double v) {
  Add(name, help, "gauge", labels, v);
}

Counter& Registry::GetCounter(const std::string& name, const std::string& help,
                              const Labels& labels) {
  absl::MutexLock l(&mu_);
  auto& f = counters_[name];
  if (f.help.empty()) f.help = help;
  auto& c = f.children[labels];
  if (!c) c = std::make_unique<metrics::Counter>();
  return *c;
}

Gauge& Registry::GetGauge(const std::string& name, const std::string& help, const Labels& labels) {
  absl::MutexLock l(&mu_);
  auto& f = gauges_[name];
  if (f.help.empty()) f.help = help;
  auto& g = f.children[labels];
  if (!g) g = std::make_unique<metrics::Gauge>();
  return *g;
}

Histogram& Registry::GetHistogram(const std::string& name, const std::string& help,
                                  const Labels& labels, const std::vector<double>& bounds) {
  absl::MutexLock l(&mu_);
  auto& f = histograms_[name];
  if (f.help.empty()) f.help = help;
  auto& h = f.children[labels];
  if (!h) h = std::make_unique<Histogram>(bounds);
  return *h;
}

int Registry::AddCollector(Collector c) {
  absl::MutexLock l(&mu_);
  int id = next_collector_++;
  collectors_[id] = std::make_shared<Collector>(std::move(c));
  return id;
}

void Registry::RemoveCollector(int id) {
  absl::MutexLock l(&mu_);
  collectors_.erase(id);
}

std::string Registry::Expose() const {
  // Families by name, each rendered once; collectors run outside the lock (they read maps).
  std::map<std::string, std::string> text;
  std::vector<std::shared_ptr<Collector>> collectors;
  {
    absl::MutexLock l(&mu_);
    for (const auto& [name, f] : counters_) {
      std::string& t = text[name];
      Header(&t, name, f.help, "counter");
      for (const auto& [labels, c] : f.children) {
        absl::StrAppend(&t, name, LabelText(labels, nullptr), " ", c->value(), "\n");
      }
    }
    for (const auto& [name, f] : gauges_) {
      std::string& t = text[name];
      Header(&t, name, f.help, "gauge");
      for (const auto& [labels, g] : f.children) {
        absl::StrAppend(&t, name, LabelText(labels, nullptr), " ", FormatValue(g->value()), "\n");
      }
    }
    for (const auto& [name, f] : histograms_) {
      std::string& t = text[name];
      Header(&t, name, f.help, "histogram");
      for (const auto& [labels, h] : f.children) {
        Histogram::Snapshot s = h->snapshot();
        for (size_t i = 0; i <= s.bounds.size(); ++i) {
          std::pair<std::string, std::string> le{
              "le", i < s.bounds.size() ? FormatValue(s.bounds[i]) : "+Inf"};
          absl::StrAppend(&t, name, "_bucket", LabelText(labels, &le), " ", s.cumulative[i], "\n");
        }
        absl::StrAppend(&t, name, "_sum", LabelText(labels, nullptr), " ", FormatValue(s.sum), "\n",
                        name, "_count", LabelText(labels, nullptr), " ", s.count, "\n");
      }
    }
    for (const auto& [id, c] : collectors_) collectors.push_back(c);
  }
  ScrapeSink sink;
  for (const auto& c : collectors) (*c)(sink);
  for (const auto& [name, f] : sink.families_) {
    if (text.contains(name)) continue;  // a registered metric of that name wins
    std::string& t = text[name];
    Header(&t, name, f.help, f.type.c_str());
    for (const auto& [labels, v] : f.samples) {
      absl::StrAppend(&t, name, LabelText(labels, nullptr), " ", FormatValue(v), "\n");
    }
  }
  std::string out;
  for (const auto& [name, t] : text) out += t;
  return out;
}

Registry& Default() {
  static Registry* r = [] {
    auto* r = new Registry();  // never destroyed: threads may record until exit
    r->GetGauge("sluice_version", "The running build's version, as a label (always 1)",
                {{"version", SLUICE_VERSION_STRING}})
        .Set(1);
    return r;
  }();
  return *r;
}

}  // namespace sluice::metrics
