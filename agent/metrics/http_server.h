// The agent's operator endpoints over HTTP (cpp-httplib): /healthz and /readyz for the probes,
// /config for `sluicectl config`, /metrics for Prometheus. GET only; each route is a function
// that renders a reply. The listening address is the operator's choice (the health server
// defaults to loopback; metrics are off unless given an address).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/metrics/health.h"
#include "agent/metrics/registry.h"

namespace httplib {
class Server;
}

namespace sluice::metrics {

struct HttpReply {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};
using Route = std::pair<std::string, std::function<HttpReply()>>;

class HttpServer {
 public:
  // `address`: HOST:PORT (PORT 0: any free port, see port()). Serves until destroyed.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const std::string& address,
                                                                         std::vector<Route> routes);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;
  int port() const { return port_; }

 private:
  HttpServer() = default;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  std::atomic<bool> done_{false};  // listen_after_bind returned
  int port_ = 0;
};

// Splits "HOST:PORT" ("[::1]:9879" too; ":PORT" is every IPv4 address); InvalidArgument names
// `flag`.
[[nodiscard]] absl::StatusOr<std::pair<std::string, int>> ParseHostPort(const std::string& address,
                                                                        const std::string& flag);

// The standard routes: /healthz (200 "ok ..." or 503 naming the wedged loop), /readyz (200 or
// 503 naming each unmet condition), /metrics (text format 0.0.4).
Route HealthzRoute(const Heartbeats& beats);
Route ReadyzRoute(const Readiness& readiness);
Route MetricsRoute(const Registry& registry);

}  // namespace sluice::metrics
