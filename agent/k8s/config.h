// Where the apiserver is and how to authenticate to it: in-cluster service account, kubeconfig, or
// an explicit address (k8sServiceHost/k8sServicePort) — a kube-proxy replacement cannot reach the
// `kubernetes` ClusterIP before its own datapath serves it. TLS verification is always on.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/base/clock.h"

namespace sluice::k8s {

inline constexpr char kServiceAccountDir[] = "/var/run/secrets/kubernetes.io/serviceaccount";

struct ClientConfig {
  std::string server;  // "https://host:port", IPv6 hosts bracketed
  // Trust anchor: a file or in-memory PEM (exactly one is set).
  std::string ca_file;
  std::string ca_pem;
  // Optional client certificate and key: files or in-memory PEM.
  std::string client_cert_file;
  std::string client_cert_pem;
  std::string client_key_file;
  std::string client_key_pem;
  // Bearer token: a static value and/or a file re-read every `token_refresh` and after a 401
  // (the file wins when both are set, as in client-go).
  std::string token;
  std::string token_file;
  absl::Duration token_refresh = absl::Minutes(1);
  std::string source;  // where this came from, for logs ("in-cluster", "kubeconfig /x (ctx)")
};

struct ConfigOptions {
  std::string kubeconfig;  // --kubeconfig; empty = not given
  std::string context;     // overrides current-context
  // Explicit apiserver address (Cilium's k8sServiceHost/k8sServicePort); overrides the server of
  // the kubeconfig or in-cluster configuration. Both or neither.
  std::string k8s_service_host;
  std::string k8s_service_port;
  std::string service_account_dir = kServiceAccountDir;
  // Environment lookup (tests inject one); default ::getenv.
  std::function<std::optional<std::string>(const std::string&)> getenv;
};

// Precedence: explicit address > --kubeconfig > in-cluster (env + service account files) >
// $KUBECONFIG (first entry). Credentials come from the kubeconfig when one is used, else from the
// service account directory.
absl::StatusOr<ClientConfig> LoadClientConfig(const ConfigOptions& opts);

// One kubeconfig file; `context` empty = current-context. Refuses insecure-skip-tls-verify and
// plain http.
absl::StatusOr<ClientConfig> LoadKubeconfig(const std::string& path, const std::string& context);

// KUBERNETES_SERVICE_HOST/PORT + token + ca.crt from `opts.service_account_dir`.
absl::StatusOr<ClientConfig> InClusterConfig(const ConfigOptions& opts);

// "host:port", bracketing IPv6 literals.
std::string JoinHostPort(const std::string& host, const std::string& port);

// The bearer token of a ClientConfig: cached, re-read from its file when older than the refresh
// period, and on demand after a 401. Thread-safe.
class TokenSource {
 public:
  TokenSource(std::string static_token, std::string token_file, absl::Duration refresh,
              const Clock* clock = RealClock::Get());
  static std::unique_ptr<TokenSource> FromConfig(const ClientConfig& cfg,
                                                 const Clock* clock = RealClock::Get());

  // The token to send ("" = none). A failed re-read keeps the last good token.
  std::string Token();
  // Forces a re-read at the next Token(); false when there is no file to re-read.
  bool Invalidate();
  uint64_t file_reads() const;

 private:
  const std::string static_token_;
  const std::string token_file_;
  const absl::Duration refresh_;
  const Clock* const clock_;
  mutable absl::Mutex mu_;
  std::string cached_ ABSL_GUARDED_BY(mu_);
  absl::Time read_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool have_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t reads_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace sluice::k8s
