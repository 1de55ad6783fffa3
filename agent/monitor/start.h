// The flow monitor as the agent runs it: datapath events named from the stores, the observe
// socket `sluicectl observe` reads (and its relay), and the service map page.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "agent/endpoint/endpoint_store.h"
#include "agent/metrics/agent_endpoints.h"
#include "agent/monitor/monitor.h"
#include "agent/monitor/names.h"
#include "agent/monitor/observe_server.h"
#include "agent/monitor/ui.h"
#include "agent/start/pieces.h"

namespace sluice::monitor {

struct MonitorStartOptions {
  bool enabled = true;
  std::string events = "all";        // --monitor_events
  std::string idle_events = "none";  // --monitor_idle_events
  uint32_t rate = 5000, burst = 10000, sample = 1, history = 4096;
  std::string observe_socket = kDefaultObserveSocket;
  std::string relay_address;     // "" = no relay
  std::string relay_token_file;  // the relay's token: its first line, at least 16 characters
  std::string ui_address;        // "" = no service map page; needs `enabled`
};

struct RunningMonitor {
  std::unique_ptr<FlowNames> names;
  std::unique_ptr<FlowMonitor> monitor;    // names flows with names: declared after it
  std::unique_ptr<ObserveServer> observe;  // null when its socket could not be served
  std::unique_ptr<FlowUi> ui;              // observes monitor: declared after it
  std::optional<metrics::ScopedCollector> monitor_metrics;  // reads monitor: declared after it

  // Stops serving observers (the agent is stopping); the monitor runs until destroyed.
  void StopServing() {
    if (observe) observe->Stop();
  }
};

// The datapath emits events only while someone observes (and `idle_events` otherwise). Not
// `enabled`: switches a previous agent's events off and returns null. The observe socket is not
// something the datapath depends on: when it cannot be served the agent runs on, unobserved.
[[nodiscard]] absl::StatusOr<std::unique_ptr<RunningMonitor>> StartMonitor(
    const agent::StartPieces& pieces, const agent::EndpointStore& endpoints,
    const MonitorStartOptions& options);

}  // namespace sluice::monitor
