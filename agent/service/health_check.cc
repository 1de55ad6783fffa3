#include "agent/service/health_check.h"

#include <httplib.h>

#include <chrono>
#include <utility>

#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace sluice::agent {

HealthCheckServers::HealthCheckServers(std::string bind_address)
    : bind_address_(std::move(bind_address)) {}

HealthCheckServers::~HealthCheckServers() {
  std::map<std::string, std::unique_ptr<Listener>> all;
  {
    absl::MutexLock l(&update_mu_);
    all.swap(listeners_);
  }
  for (auto& [s, listener] : all) Stop(std::move(listener));
}

std::unique_ptr<HealthCheckServers::Listener> HealthCheckServers::Start(const std::string& service,
                                                                        uint16_t port) {
  auto l = std::make_unique<Listener>();
  l->service = service;
  l->port = port;
  l->server = std::make_unique<httplib::Server>();
  l->server->Get(".*", [this, port](const httplib::Request&, httplib::Response& res) {
    State st;
    {
      absl::MutexLock lock(&mu_);
      auto it = state_.find(port);
      if (it != state_.end()) st = it->second;
    }
    std::string ns, name = st.service;
    if (auto slash = st.service.find('/'); slash != std::string::npos) {
      ns = st.service.substr(0, slash);
      name = st.service.substr(slash + 1);
    }
    nlohmann::json body = {{"service", {{"namespace", ns}, {"name", name}}},
                           {"localEndpoints", st.local_endpoints},
                           {"serviceProxyHealthy", true}};
    res.status = st.local_endpoints > 0 ? 200 : 503;
    res.set_header("X-Content-Type-Options", "nosniff");
    res.set_content(body.dump(), "application/json");
  });
  if (!l->server->bind_to_port(bind_address_, port)) {
    spdlog::warn("services: {}: cannot listen on health-check port {}:{}", service, bind_address_,
                 port);
    return nullptr;
  }
  httplib::Server* server = l->server.get();
  l->thread = std::thread([server] { server->listen_after_bind(); });
  // stop() is a no-op until the accept loop runs: wait for it so a quick Stop cannot hang.
  for (int i = 0; i < 5000 && !server->is_running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  spdlog::info("services: {}: health check listening on {}:{}", service, bind_address_, port);
  return l;
}

void HealthCheckServers::Stop(std::unique_ptr<Listener> l) {
  if (l == nullptr) return;
  l->server->stop();
  if (l->thread.joinable()) l->thread.join();
  {
    absl::MutexLock lock(&mu_);
    auto it = state_.find(l->port);
    if (it != state_.end() && it->second.service == l->service) state_.erase(it);
  }
  spdlog::info("services: {}: health check on port {} stopped", l->service, l->port);
}

void HealthCheckServers::Update(const std::string& service,
                                const std::optional<HealthCheck>& check) {
  absl::MutexLock ul(&update_mu_);
  auto it = listeners_.find(service);
  if (it != listeners_.end() && (!check || check->node_port != it->second->port)) {
    std::unique_ptr<Listener> old = std::move(it->second);
    listeners_.erase(it);
    Stop(std::move(old));
    it = listeners_.end();
  }
  if (!check || check->node_port == 0) return;
  {
    absl::MutexLock lock(&mu_);
    state_[check->node_port] = State{service, check->local_endpoints};
  }
  if (it != listeners_.end()) return;
  std::unique_ptr<Listener> l = Start(service, check->node_port);
  if (l == nullptr) {
    absl::MutexLock lock(&mu_);
    state_.erase(check->node_port);
    return;
  }
  listeners_[service] = std::move(l);
}

std::vector<uint16_t> HealthCheckServers::ports() const {
  absl::MutexLock l(&mu_);
  std::vector<uint16_t> out;
  for (const auto& [port, st] : state_) out.push_back(port);
  return out;
}

}  // namespace sluice::agent
