// The agent's metrics: counters, gauges and fixed-bucket histograms, plus collectors that read
// state (BPF maps, stores) at scrape time, exposed in the Prometheus text format 0.0.4. Small on
// purpose (Debian ships no prometheus-cpp): names are given by the caller and follow Prometheus
// conventions (`sluice_` prefix, `_total` counters, base units); docs/metrics.md lists them all.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace sluice::metrics {

// Label name -> value, in the order given (exposition sorts nothing within a sample).
using Labels = std::vector<std::pair<std::string, std::string>>;

class Counter {
 public:
  void Inc(uint64_t n = 1) { v_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> v_{0};
};

class Gauge {
 public:
  void Set(double v) { v_.store(v, std::memory_order_relaxed); }
  double value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> v_{0};
};

class Histogram {
 public:
  // `bounds`: the upper bounds of the buckets, ascending; +Inf is implied.
  explicit Histogram(std::vector<double> bounds);
  void Observe(double v);

  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative;  // one per bound, then +Inf (= count)
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot snapshot() const;

 private:
  const std::vector<double> bounds_;
  mutable absl::Mutex mu_;
  std::vector<uint64_t> buckets_ ABSL_GUARDED_BY(mu_);  // per bucket, not cumulative; +Inf last
  double sum_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t count_ ABSL_GUARDED_BY(mu_) = 0;
};

// Latency buckets in seconds shared by the agent's histograms: 0.5 ms to 30 s.
const std::vector<double>& LatencyBuckets();

// What a collector writes at scrape time: one family per metric name.
class ScrapeSink {
 public:
  void Counter(const std::string& name, const std::string& help, const Labels& labels, double v);
  void Gauge(const std::string& name, const std::string& help, const Labels& labels, double v);

 private:
  friend class Registry;
  struct Family {
    std::string help, type;
    std::vector<std::pair<Labels, double>> samples;
  };
  void Add(const std::string& name, const std::string& help, const char* type, const Labels& labels,
           double v);
  std::map<std::string, Family> families_;
};

class Registry {
 public:
  // The same name and labels always give the same metric; the first help and buckets win.
  // The returned reference lives as long as the registry.
  Counter& GetCounter(const std::string& name, const std::string& help, const Labels& labels = {});
  Gauge& GetGauge(const std::string& name, const std::string& help, const Labels& labels = {});
  Histogram& GetHistogram(const std::string& name, const std::string& help, const Labels& labels,
                          const std::vector<double>& bounds = LatencyBuckets());

  // Runs at every scrape, without the registry's lock. Returns an id for RemoveCollector.
  using Collector = std::function<void(ScrapeSink&)>;
  int AddCollector(Collector c);
  void RemoveCollector(int id);

  // The text exposition format 0.0.4: families sorted by name, each with HELP and TYPE.
  std::string Expose() const;

 private:
  template <typename T>
  struct Family {
    std::string help;
    std::map<Labels, std::unique_ptr<T>> children;
  };
  mutable absl::Mutex mu_;
  std::map<std::string, Family<metrics::Counter>> counters_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Family<metrics::Gauge>> gauges_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Family<Histogram>> histograms_ ABSL_GUARDED_BY(mu_);
  std::map<int, std::shared_ptr<Collector>> collectors_ ABSL_GUARDED_BY(mu_);
  int next_collector_ ABSL_GUARDED_BY(mu_) = 0;
};

// The process's registry: what the agent's /metrics serves. Parts of the agent that have no
// owner to hand them a registry (the controller loop, the CNI handler) record here.
Registry& Default();

// Prometheus text escaping of a label value (backslash, double quote, newline) and of a double
// ("+Inf", integers without a fraction).
std::string EscapeLabelValue(const std::string& v);
std::string FormatValue(double v);

}  // namespace sluice::metrics
