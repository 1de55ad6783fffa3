#include "agent/k8s/config.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "spdlog/spdlog.h"
#include "yaml-cpp/yaml.h"

namespace sluice::k8s {
namespace {

namespace fs = std::filesystem;

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("read ", path, ": ", std::strerror(errno)));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("read ", path, ": I/O error"));
  return ss.str();
}

std::optional<std::string> Env(const ConfigOptions& opts, const std::string& name) {
  if (opts.getenv) return opts.getenv(name);
  const char* v = std::getenv(name.c_str());
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

// A named entry of a kubeconfig list (clusters/users/contexts): its inner map, or null.
YAML::Node FindNamed(const YAML::Node& list, const std::string& name, const char* inner) {
  if (!list || !list.IsSequence()) return YAML::Node();
  for (const auto& entry : list) {
    if (entry["name"] && entry["name"].as<std::string>() == name) return entry[inner];
  }
  return YAML::Node();
}

std::string Scalar(const YAML::Node& n, const char* key) {
  if (!n || !n.IsMap() || !n[key] || n[key].IsNull()) return {};
  return n[key].as<std::string>();
}

std::string ResolvePath(const std::string& base_dir, const std::string& p) {
  if (p.empty() || fs::path(p).is_absolute()) return p;
  return (fs::path(base_dir) / p).string();
}

absl::StatusOr<std::string> DecodeData(const std::string& field, const std::string& b64) {
  std::string out;
  std::string compact;
  for (char c : b64) {
    if (!absl::ascii_isspace(static_cast<unsigned char>(c))) compact.push_back(c);
  }
  if (!absl::Base64Unescape(compact, &out)) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": not valid base64"));
  }
  return out;
}

absl::Status CheckServer(const std::string& server, const std::string& where) {
  if (server.empty()) return absl::InvalidArgumentError(absl::StrCat(where, ": no server"));
  if (server.rfind("https://", 0) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": server ", server,
        " is not https; the agent only talks to the apiserver over verified TLS"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ClientConfig> KubeconfigImpl(const std::string& path, const std::string& context) {
  YAML::Node root = YAML::LoadFile(path);
  const std::string dir = fs::path(path).parent_path().string();
  std::string ctx_name = context.empty() ? Scalar(root, "current-context") : context;
  if (ctx_name.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("kubeconfig ", path, ": no current-context"));
  }
  YAML::Node ctx = FindNamed(root["contexts"], ctx_name, "context");
  if (!ctx) {
    return absl::NotFoundError(
        absl::StrCat("kubeconfig ", path, ": context \"", ctx_name, "\" not found"));
  }
  const std::string cluster_name = Scalar(ctx, "cluster");
  const std::string user_name = Scalar(ctx, "user");
  YAML::Node cluster = FindNamed(root["clusters"], cluster_name, "cluster");
  if (!cluster) {
    return absl::NotFoundError(
        absl::StrCat("kubeconfig ", path, ": cluster \"", cluster_name, "\" not found"));
  }
  ClientConfig cfg;
  cfg.source = absl::StrCat("kubeconfig ", path, " (context ", ctx_name, ")");
  cfg.server = Scalar(cluster, "server");
  while (!cfg.server.empty() && cfg.server.back() == '/') cfg.server.pop_back();
  if (auto st = CheckServer(cfg.server, cfg.source); !st.ok()) return st;
  if (cluster["insecure-skip-tls-verify"] && cluster["insecure-skip-tls-verify"].as<bool>()) {
    return absl::InvalidArgumentError(absl::StrCat(
        cfg.source,
        ": insecure-skip-tls-verify is refused: the agent programs every node's Service and "
        "policy datapath from what this connection says, so an unauthenticated apiserver could "
        "redirect or open all traffic; give certificate-authority or certificate-authority-data"));
  }
  if (std::string data = Scalar(cluster, "certificate-authority-data"); !data.empty()) {
    auto pem = DecodeData("certificate-authority-data", data);
    if (!pem.ok()) return pem.status();
    cfg.ca_pem = *std::move(pem);
  } else if (std::string file = Scalar(cluster, "certificate-authority"); !file.empty()) {
    cfg.ca_file = ResolvePath(dir, file);
  }
  // Neither: libcurl's system trust store verifies the server (a publicly signed apiserver).

  if (!user_name.empty()) {
    YAML::Node user = FindNamed(root["users"], user_name, "user");
    if (!user) {
      return absl::NotFoundError(
          absl::StrCat("kubeconfig ", path, ": user \"", user_name, "\" not found"));
    }
    if (user.IsMap()) {
      for (const char* unsupported : {"exec", "auth-provider", "username", "password"}) {
        if (user[unsupported]) {
          return absl::UnimplementedError(absl::StrCat(
              cfg.source, ": user \"", user_name, "\" uses ", unsupported,
              ", which the agent does not support (use a token, tokenFile or client certificate)"));
        }
      }
    }
    cfg.token = Scalar(user, "token");
    cfg.token_file = ResolvePath(dir, Scalar(user, "tokenFile"));
    if (std::string data = Scalar(user, "client-certificate-data"); !data.empty()) {
      auto pem = DecodeData("client-certificate-data", data);
      if (!pem.ok()) return pem.status();
      cfg.client_cert_pem = *std::move(pem);
    } else {
      cfg.client_cert_file = ResolvePath(dir, Scalar(user, "client-certificate"));
    }
    if (std::string data = Scalar(user, "client-key-data"); !data.empty()) {
      auto pem = DecodeData("client-key-data", data);
      if (!pem.ok()) return pem.status();
      cfg.client_key_pem = *std::move(pem);
    } else {
      cfg.client_key_file = ResolvePath(dir, Scalar(user, "client-key"));
    }
    const bool have_cert = !cfg.client_cert_pem.empty() || !cfg.client_cert_file.empty();
    const bool have_key = !cfg.client_key_pem.empty() || !cfg.client_key_file.empty();
    if (have_cert != have_key) {
      return absl::InvalidArgumentError(
          absl::StrCat(cfg.source, ": client certificate and key must be given together"));
    }
  }
  return cfg;
}

// Token and CA of the service account directory (the server is filled by the caller).
absl::StatusOr<ClientConfig> ServiceAccountCredentials(const ConfigOptions& opts) {
  ClientConfig cfg;
  cfg.token_file = (fs::path(opts.service_account_dir) / "token").string();
  cfg.ca_file = (fs::path(opts.service_account_dir) / "ca.crt").string();
  std::error_code ec;
  if (!fs::exists(cfg.token_file, ec)) {
    return absl::NotFoundError(absl::StrCat("in-cluster: no token at ", cfg.token_file));
  }
  if (!fs::exists(cfg.ca_file, ec)) {
    return absl::NotFoundError(absl::StrCat("in-cluster: no CA at ", cfg.ca_file));
  }
  return cfg;
}

}  // namespace

std::string JoinHostPort(const std::string& host, const std::string& port) {
  if (host.find(':') != std::string::npos && host.front() != '[') {
    return absl::StrCat("[", host, "]:", port);
  }
  return absl::StrCat(host, ":", port);
}

absl::StatusOr<ClientConfig> LoadKubeconfig(const std::string& path, const std::string& context) {
  try {
    return KubeconfigImpl(path, context);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("kubeconfig ", path, ": ", e.what()));
  }
}

absl::StatusOr<ClientConfig> InClusterConfig(const ConfigOptions& opts) {
  std::optional<std::string> host = Env(opts, "KUBERNETES_SERVICE_HOST");
  std::optional<std::string> port = Env(opts, "KUBERNETES_SERVICE_PORT");
  if (!host || host->empty() || !port || port->empty()) {
    return absl::FailedPreconditionError(
        "in-cluster: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must both be set");
  }
  auto cfg = ServiceAccountCredentials(opts);
  if (!cfg.ok()) return cfg.status();
  cfg->server = absl::StrCat("https://", JoinHostPort(*host, *port));
  cfg->source = "in-cluster";
  return cfg;
}

absl::StatusOr<ClientConfig> LoadClientConfig(const ConfigOptions& opts) {
  const bool explicit_address = !opts.k8s_service_host.empty() || !opts.k8s_service_port.empty();
  if (explicit_address && (opts.k8s_service_host.empty() || opts.k8s_service_port.empty())) {
    return absl::InvalidArgumentError("k8sServiceHost and k8sServicePort must be given together");
  }
  absl::StatusOr<ClientConfig> cfg;
  if (!opts.kubeconfig.empty()) {
    cfg = LoadKubeconfig(opts.kubeconfig, opts.context);
  } else if (explicit_address) {
    // The agent's own pod: service account credentials, apiserver reached directly.
    cfg = ServiceAccountCredentials(opts);
    if (cfg.ok()) cfg->source = "in-cluster credentials";
  } else if (Env(opts, "KUBERNETES_SERVICE_HOST").has_value()) {
    cfg = InClusterConfig(opts);
  } else if (std::optional<std::string> env = Env(opts, "KUBECONFIG"); env && !env->empty()) {
    std::vector<std::string> paths = absl::StrSplit(*env, ':', absl::SkipEmpty());
    cfg = absl::NotFoundError(absl::StrCat("KUBECONFIG=", *env, ": no readable file"));
    for (const std::string& p : paths) {
      std::error_code ec;
      if (!fs::exists(p, ec)) continue;
      cfg = LoadKubeconfig(p, opts.context);
      break;
    }
  } else {
    return absl::FailedPreconditionError(
        "no apiserver configuration: not in a cluster (KUBERNETES_SERVICE_HOST unset), no "
        "--kubeconfig, no KUBECONFIG and no k8sServiceHost/k8sServicePort");
  }
  if (!cfg.ok()) return cfg.status();
  if (explicit_address) {
    cfg->server =
        absl::StrCat("https://", JoinHostPort(opts.k8s_service_host, opts.k8s_service_port));
    cfg->source = absl::StrCat(cfg->source, ", explicit apiserver ", cfg->server);
  }
  return cfg;
}

TokenSource::TokenSource(std::string static_token, std::string token_file, absl::Duration refresh,
                         const Clock* clock)
    : static_token_(std::move(static_token)),
      token_file_(std::move(token_file)),
      refresh_(refresh),
      clock_(clock) {}

std::unique_ptr<TokenSource> TokenSource::FromConfig(const ClientConfig& cfg, const Clock* clock) {
  return std::make_unique<TokenSource>(cfg.token, cfg.token_file, cfg.token_refresh, clock);
}

std::string TokenSource::Token() {
  if (token_file_.empty()) return static_token_;
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  if (have_ && now - read_at_ < refresh_) return cached_;
  auto content = ReadFile(token_file_);
  ++reads_;
  read_at_ = now;
  if (!content.ok()) {
    spdlog::warn("k8s: token file: {}", content.status().ToString());
    if (have_) return cached_;
    return static_token_;
  }
  cached_ = std::string(absl::StripAsciiWhitespace(*content));
  have_ = true;
  return cached_;
}

bool TokenSource::Invalidate() {
  if (token_file_.empty()) return false;
  absl::MutexLock lock(&mu_);
  read_at_ = absl::InfinitePast();
  return true;
}

uint64_t TokenSource::file_reads() const {
  absl::MutexLock lock(&mu_);
  return reads_;
}

}  // namespace sluice::k8s
