// HTTPS requests against the apiserver with libcurl (GETs for list/watch; PATCH, POST and PUT
// with a JSON body for the operator's writes): one easy handle (on its own multi handle, so it
// can be woken) per request, TLS verification always on, bearer token or client certificate,
// bodies streamed to a callback as they arrive, cancellable from another thread at once.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/k8s/config.h"

namespace sluice::k8s {

// Stops in-flight requests from another thread. One Canceller may cover many requests; once
// cancelled it stays cancelled.
class Canceller {
 public:
  void Cancel();
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }

 private:
  friend class HttpClient;
  bool Register(void* multi);
  void Unregister(void* multi);

  std::atomic<bool> cancelled_{false};
  absl::Mutex mu_;
  absl::flat_hash_set<void*> active_ ABSL_GUARDED_BY(mu_);
};

struct HttpRequest {
  std::string path;  // path and query, e.g. "/api/v1/services?limit=500"
  absl::Duration timeout = absl::ZeroDuration();       // whole request; zero = none (watches)
  absl::Duration idle_timeout = absl::ZeroDuration();  // abort after this long with no bytes
  bool accept_gzip = false;
  std::string method = "GET";                     // GET, POST, PUT, PATCH, DELETE
  std::string body;                               // sent when not empty
  std::string content_type = "application/json";  // of `body`
};

struct HttpResult {
  long status = 0;      // HTTP status; 0 when no response arrived
  int curl_code = 0;    // CURLcode; 0 = the transfer completed (a clean end of a stream)
  std::string error;    // libcurl's message when curl_code != 0
  std::string error_body;  // body of a non-2xx response (truncated at 1 MiB)
  std::optional<absl::Duration> retry_after;
  bool cancelled = false;         // the Canceller stopped it
  bool aborted_by_callback = false;  // the body callback returned false
  uint64_t body_bytes = 0;        // bytes handed to the body callback
  bool retried_unauthorized = false;  // a 401 made us re-read the token and retry once

  bool ok() const { return curl_code == 0 && status >= 200 && status < 300; }
  bool transport_error() const { return curl_code != 0 && !cancelled && !aborted_by_callback; }
  std::string Describe() const;
};

class HttpClient {
 public:
  // Called with each slice of a 2xx body as it arrives; return false to abort the transfer.
  using BodyFn = std::function<bool(std::string_view)>;

  struct Options {
    absl::Duration connect_timeout = absl::Seconds(10);
    std::string user_agent = "sluice-agent";
  };

  HttpClient(ClientConfig config, Options options, std::unique_ptr<TokenSource> tokens);
  explicit HttpClient(ClientConfig config);
  ~HttpClient();

  // Performs a GET; `on_body` sees only 2xx bodies. A 401 re-reads a file-backed token and retries
  // once (before any body bytes were delivered). Thread-safe: concurrent calls use separate
  // handles.
  HttpResult Get(const HttpRequest& req, const BodyFn& on_body, Canceller* cancel = nullptr);
  // The same for any method: req.method with req.body (a write's answer is a 2xx body; 409
  // Conflict and the like come back as status + error_body).
  HttpResult Send(const HttpRequest& req, const BodyFn& on_body, Canceller* cancel = nullptr) {
    return Get(req, on_body, cancel);
  }

  const ClientConfig& config() const { return config_; }
  TokenSource* tokens() { return tokens_.get(); }

 private:
  HttpResult GetOnce(const HttpRequest& req, const BodyFn& on_body, Canceller* cancel);

  const ClientConfig config_;
  const Options options_;
  std::unique_ptr<TokenSource> tokens_;
};

}  // namespace sluice::k8s
