#include "agent/metrics/agent_endpoints.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "agent/base/cli.h"
#include "agent/base/files.h"
#include "agent/base/version.h"
#include "agent/k8s/watches.h"
#include "agent/metrics/drop_window.h"
#include "nlohmann/json.hpp"

namespace sluice::metrics {

AgentReadiness::AgentReadiness(bool with_kubernetes) {
  readiness_.Require("datapath", [this] {
    return datapath_loaded.reached() ? "" : "programs and maps not loaded yet";
  });
  if (with_kubernetes) {
    readiness_.Require("kubernetes", [this] {
      const agent::KubernetesState* kube = k8s_.load();
      if (kube == nullptr) return std::string("client not started");
      std::string unsynced;
      for (const auto& w : kube->watch_states()) {
        if (!w.synced) unsynced += (unsynced.empty() ? "" : ", ") + w.kind;
      }
      return unsynced.empty() ? "" : "not listed yet: " + unsynced;
    });
  }
  readiness_.Require("cni", [this] {
    return cni_installed.reached() ? "" : "endpoint API or CNI configuration not in place yet";
  });
}

void AgentReadiness::RequireWritableStateDir(const std::string& state_dir) {
  readiness_.Require("state", [this, state_dir] {
    absl::MutexLock l(&probe_mu_);
    absl::Status st = agent::ProbeWritable(state_dir);
    return st.ok() ? std::string()
                   : absl::StrCat("cannot write ", state_dir,
                                  " (every CNI ADD would fail): ", st.message());
  });
}

std::string RunningConfigJson() {
  nlohmann::json flags = nlohmann::json::object();
  for (const auto& [name, value] : cli::OwnFlagValues()) flags[name] = value;
  nlohmann::json out = {{"version", SLUICE_VERSION_STRING}, {"flags", flags}};
  return out.dump(2);
}

absl::StatusOr<std::unique_ptr<AgentEndpoints>> AgentEndpoints::Start(
    const AgentEndpointOptions& options, const Readiness& readiness, const Heartbeats& beats,
    const Registry& registry) {
  auto e = std::make_unique<AgentEndpoints>();
  Route config = {"/config", [render = options.config_json] {
                    return HttpReply{.content_type = "application/json",
                                     .body = render ? render() : "{}"};
                  }};
  // One listener when both name the same fixed address (port 0 means two free ports).
  const bool shared = !options.metrics_address.empty() &&
                      options.metrics_address == options.health_address &&
                      !absl::EndsWith(options.health_address, ":0");
  if (!options.health_address.empty()) {
    std::vector<Route> routes = {HealthzRoute(beats), ReadyzRoute(readiness), config};
    if (shared) routes.push_back(MetricsRoute(registry));
    if (DropWindow* drops = options.recent_drops) {
      routes.push_back({"/v1/drops", [drops] {
                          drops->SampleNow();  // up to this moment
                          return HttpReply{.content_type = "application/json",
                                           .body = drops->Json()};
                        }});
    }
    for (const Route& r : options.extra_routes) routes.push_back(r);
    auto s = HttpServer::Start(options.health_address, std::move(routes));
    if (!s.ok())
      return absl::Status(s.status().code(),
                          absl::StrCat("--health_address: ", s.status().message()));
    e->health_ = std::move(*s);
    e->shared_ = shared;
  }
  if (!options.metrics_address.empty() && !shared) {
    auto s = HttpServer::Start(options.metrics_address, {MetricsRoute(registry)});
    if (!s.ok())
      return absl::Status(s.status().code(),
                          absl::StrCat("--metrics_address: ", s.status().message()));
    e->metrics_ = std::move(*s);
  }
  return e;
}

int AgentEndpoints::metrics_port() const {
  if (metrics_) return metrics_->port();
  return shared_ ? health_port() : 0;
}

}  // namespace sluice::metrics
