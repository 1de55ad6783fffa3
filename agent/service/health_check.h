// Health-check NodePorts of externalTrafficPolicy: Local Services, answered the way kube-proxy
// does: an HTTP listener per healthCheckNodePort on the node address; GET on any path returns 200
// while the node has local ready endpoints for the Service, 503 otherwise, with a JSON body
// {"service":{"namespace","name"},"localEndpoints":N,"serviceProxyHealthy":true}.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "agent/service/translator.h"

namespace httplib {
class Server;
}

namespace sluice::agent {

class HealthCheckServers {
 public:
  // Listeners bind `bind_address` (the node address).
  explicit HealthCheckServers(std::string bind_address);
  ~HealthCheckServers();
  HealthCheckServers(const HealthCheckServers&) = delete;
  HealthCheckServers& operator=(const HealthCheckServers&) = delete;

  // Makes `service`'s listener match `check` (nullopt: none). A port that cannot be bound is
  // retried at the Service's next update.
  void Update(const std::string& service, const std::optional<HealthCheck>& check);
  // Ports with a running listener.
  std::vector<uint16_t> ports() const;

 private:
  struct Listener {
    std::string service;
    uint16_t port = 0;
    std::unique_ptr<httplib::Server> server;
    std::thread thread;
  };
  struct State {
    std::string service;
    int local_endpoints = 0;
  };
  void Stop(std::unique_ptr<Listener> l);
  std::unique_ptr<Listener> Start(const std::string& service, uint16_t port);

  const std::string bind_address_;
  // Listeners are started and stopped by one caller at a time; handlers only read state_.
  absl::Mutex update_mu_;
  std::map<std::string, std::unique_ptr<Listener>> listeners_ ABSL_GUARDED_BY(update_mu_);
  mutable absl::Mutex mu_;
  std::map<uint16_t, State> state_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice::agent
