// The service map page (Hubble UI's job, on one node): `--ui_address` serves a small web page
// that draws the flows this node's monitor sees as a graph — namespaces, pods and Services, with
// edges coloured by verdict and drop reasons on hover — and a flow table underneath. Off by
// default; loopback is the address to give it (it has no authentication).
//
// While a page polls (GET /flows.json, every 2 s), the UI holds one observer of the monitor, so
// the datapath emits events as for `sluicectl observe`; 30 s after the last poll it lets go and
// the datapath goes quiet again (docs/observe.md).
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/base/clock.h"
#include "agent/metrics/http_server.h"
#include "agent/monitor/monitor.h"

namespace sluice::monitor {

class FlowUi {
 public:
  // Serves on `address` (HOST:PORT) until destroyed; `monitor` must outlive it.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<FlowUi>> Start(
      const std::string& address, FlowMonitor* monitor, const std::string& node,
      size_t flows = 1000, const Clock* clock = RealClock::Get());
  ~FlowUi();
  FlowUi(const FlowUi&) = delete;
  FlowUi& operator=(const FlowUi&) = delete;
  int port() const { return http_->port(); }

  // How long after its last poll the page keeps the datapath's events on.
  static constexpr absl::Duration kLinger = absl::Seconds(30);

 private:
  FlowUi(FlowMonitor* monitor, std::string node, size_t flows, const Clock* clock)
      : monitor_(monitor), node_(std::move(node)), flows_(flows), clock_(clock) {}
  std::string FlowsJson();
  void Loop();  // holds the observer while a page polls, drains it

  FlowMonitor* monitor_;
  const std::string node_;
  const size_t flows_;
  const Clock* const clock_;
  std::atomic<int64_t> wanted_until_ns_{0};  // absl::ToUnixNanos of the last poll + kLinger
  std::atomic<bool> stopping_{false};
  absl::Mutex mu_;
  bool poked_ ABSL_GUARDED_BY(mu_) = false;  // a poll (or the stop) since the loop last looked
  std::thread loop_;
  std::unique_ptr<metrics::HttpServer> http_;
};

// The page itself (ui_page.cc).
extern const char kFlowUiPage[];

}  // namespace sluice::monitor
