#include "agent/monitor/start.h"

#include <net/if.h>

#include <utility>

#include "agent/base/files.h"
#include "agent/k8s/watches.h"
#include "loader/datapath.h"
#include "spdlog/spdlog.h"

namespace sluice::monitor {

namespace {

// The relay's token: the first line of `path`, at least 16 characters.
absl::StatusOr<std::string> ReadRelayToken(const std::string& path) {
  auto token = agent::ReadSmallFile(path);
  if (path.empty() || !token.ok()) {
    return agent::StartError(
        token.ok() ? absl::InvalidArgumentError("the relay needs a token") : token.status(),
        "--relay_address without a readable --relay_token_file");
  }
  std::string t = token->substr(0, token->find_first_of("\r\n"));
  if (t.size() < 16) {
    return agent::StartError(absl::InvalidArgumentError("a relay token has at least 16 characters"),
                             "--relay_token_file");
  }
  return t;
}

}  // namespace

absl::StatusOr<std::unique_ptr<RunningMonitor>> StartMonitor(const agent::StartPieces& pieces,
                                                             const agent::EndpointStore& endpoints,
                                                             const MonitorStartOptions& options) {
  loader::Datapath& dp = *pieces.datapath;
  if (!options.enabled && !options.ui_address.empty()) {
    return agent::StartError(
        absl::InvalidArgumentError("the service map page draws the flow monitor's flows"),
        "--ui_address with --monitor=false");
  }
  if (!options.enabled) {
    // Nobody will read: make sure a previous agent's setting does not keep events coming.
    if (auto st = dp.monitor_config().Update(0, sluice_monitor_config{}); !st.ok()) {
      return agent::StartError(st, "switch the flow monitor off");
    }
    return nullptr;
  }
  auto running = std::make_unique<RunningMonitor>();
  NameSources names;
  if (pieces.k8s != nullptr) {
    names.pods = &pieces.k8s->pods();
    names.services = &pieces.k8s->services();
  }
  names.endpoints = &endpoints;
  names.clock = pieces.clock;
  maps::Lb4RevNatMap* rnat = &dp.lb4_revnat();
  names.rev_nat = [rnat](uint32_t id) -> std::optional<sluice_lb4_revnat> {
    auto v = rnat->Lookup(id);
    if (!v.ok()) return std::nullopt;
    return *v;
  };
  names.interface_name = [](uint32_t ifindex) {
    char buf[IF_NAMESIZE] = {};
    return std::string(if_indextoname(ifindex, buf) ? buf : "");
  };
  running->names = std::make_unique<FlowNames>(std::move(names));
  MonitorOptions mon;
  mon.node_name = pieces.node_name;
  auto events = ParseEventTypes(options.events);
  if (!events.ok()) return agent::StartError(events.status(), "--monitor_events");
  auto idle = ParseEventTypes(options.idle_events);
  if (!idle.ok()) return agent::StartError(idle.status(), "--monitor_idle_events");
  mon.events = *events;
  mon.idle_events = *idle;
  mon.rate = options.rate;
  mon.burst = options.burst;
  mon.sample = options.sample;
  mon.history = options.history;
  auto started = FlowMonitor::Start(dp.events_fd(), dp.monitor_config(), dp.monitor_cpu(),
                                    running->names.get(), mon);
  if (!started.ok()) return agent::StartError(started.status(), "start the flow monitor");
  running->monitor = std::move(*started);
  running->monitor_metrics.emplace(
      *pieces.registry,
      pieces.registry->AddCollector([m = running->monitor.get()](metrics::ScrapeSink& out) {
        out.Counter("sluice_flow_events_lost_total",
                    "Flow monitor events lost: not emitted by the datapath (rate limit, full "
                    "ring buffer) or dropped for an observer that fell behind",
                    {}, static_cast<double>(m->EventsLost()));
      }));
  ObserveServerOptions observe;
  observe.socket_path = options.observe_socket;
  observe.relay_address = options.relay_address;
  observe.clock = pieces.clock;
  if (!observe.relay_address.empty()) {
    auto token = ReadRelayToken(options.relay_token_file);
    if (!token.ok()) return token.status();
    observe.relay_token = *token;
  }
  running->observe = std::make_unique<ObserveServer>(*running->monitor, observe);
  // The datapath does not depend on it: without the socket the agent runs on, unobserved.
  if (auto st = running->observe->Start(); !st.ok()) {
    spdlog::error("--observe_socket: {}; `sluicectl observe` cannot reach this agent",
                  st.ToString());
    running->observe.reset();
  }
  if (!options.ui_address.empty()) {
    auto ui = FlowUi::Start(options.ui_address, running->monitor.get(), mon.node_name,
                            /*flows=*/1000, pieces.clock);
    if (!ui.ok()) return agent::StartError(ui.status(), "--ui_address");
    running->ui = std::move(*ui);
  }
  return running;
}

}  // namespace sluice::monitor
