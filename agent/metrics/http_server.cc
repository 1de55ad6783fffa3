#include "agent/metrics/http_server.h"

#include <sys/socket.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "httplib.h"

namespace sluice::metrics {

absl::StatusOr<std::pair<std::string, int>> ParseHostPort(const std::string& address,
                                                          const std::string& flag) {
  size_t colon = address.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(flag.empty() ? "" : flag + "=", address,
                                                   ": want HOST:PORT, e.g. 127.0.0.1:9879"));
  }
  // ":PORT" (Go's and Cilium's spelling, what the chart writes): every IPv4 address.
  std::string host = colon == 0 ? "0.0.0.0" : address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return std::make_pair(host, port);
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const std::string& address,
                                                              std::vector<Route> routes) {
  auto hp = ParseHostPort(address, "");
  if (!hp.ok()) return hp.status();
  std::unique_ptr<HttpServer> s(new HttpServer());
  s->server_ = std::make_unique<httplib::Server>();
  // SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, which would let a second agent share
  // the port and answer the first one's probes.
  s->server_->set_socket_options([](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  // Probes and scrapes are few: two workers, not httplib's one per core.
  s->server_->new_task_queue = [] { return new httplib::ThreadPool(2); };
  for (auto& [path, render] : routes) {
    s->server_->Get(path,
                    [render = std::move(render)](const httplib::Request&, httplib::Response& res) {
                      HttpReply r = render();
                      res.status = r.status;
                      res.set_content(r.body, r.content_type.c_str());
                    });
  }
  const auto& [host, port] = *hp;
  if (port == 0) {
    s->port_ = s->server_->bind_to_any_port(host);
    if (s->port_ <= 0) {
      return absl::UnavailableError(absl::StrCat("listen on ", address, ": cannot bind"));
    }
  } else {
    if (!s->server_->bind_to_port(host, port)) {
      return absl::UnavailableError(
          absl::StrCat("listen on ", address, ": cannot bind (in use, or no such address)"));
    }
    s->port_ = port;
  }
  httplib::Server* raw = s->server_.get();
  s->thread_ = std::thread([raw, done = &s->done_] {
    raw->listen_after_bind();
    done->store(true);
  });
  // stop() only acts on a running server: wait until it is, so destruction never hangs.
  while (!raw->is_running() && !s->done_.load()) std::this_thread::yield();
  return s;
}

HttpServer::~HttpServer() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

Route HealthzRoute(const Heartbeats& beats) {
  return {"/healthz", [&beats] {
            HealthVerdict v = beats.Check();
            return HttpReply{.status = v.ok ? 200 : 503, .body = v.text};
          }};
}

Route ReadyzRoute(const Readiness& readiness) {
  return {"/readyz", [&readiness] {
            HealthVerdict v = readiness.Check();
            return HttpReply{.status = v.ok ? 200 : 503, .body = v.text};
          }};
}

Route MetricsRoute(const Registry& registry) {
  return {"/metrics", [&registry] {
            return HttpReply{.content_type = "text/plain; version=0.0.4; charset=utf-8",
                             .body = registry.Expose()};
          }};
}

}  // namespace sluice::metrics
